#pragma once
/// \file
/// One trace of a kiln::function (detail::concrete_state): the signature it was made
/// for, its graph, and how it is optimized and run, or inlined into a trace in
/// progress. Part of kiln/trace/runtime_tier.hpp.

#include <any>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/exec/executor.hpp"
#include "kiln/exec/workspace.hpp"
#include "kiln/passes/optimize.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/signature.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {
namespace detail {

struct differentiable_call;  // kiln/autodiff/tape.hpp

/// One trace (`concrete_state`, the one specialization): the signature it was made
/// for (its inputs named after their placeholders), its graph and how to run it. A
/// template on nothing, as basic_function_state is, for its members that reach the
/// optimizer and the executor.
template <class Unused>
struct basic_concrete_state : trace_signature {
  std::vector<call_signature::value_leaf> bound;  ///< non-tensor leaves, fixed at trace time
  std::vector<std::uint64_t> structure;           ///< the call_signature::structure it was traced for
  kiln::graph graph;      ///< as traced
  kiln::graph optimized;  ///< as run, when the optimizer changed the traced graph (empty otherwise: that runs)
  std::unique_ptr<graph_executor> executor;
  std::any traced_result;  ///< the callable's return value, symbolic
  bool returns_void = false;
  jit_switch jit_compile;  ///< function_options::jit_compile
  /// Where the executor's runs take their workspaces: the function's pool, shared by
  /// its traces (null: the executor's own).
  std::shared_ptr<exec::workspace_pool> workspaces;
  /// The backward pass, described on the first call under a gradient tape
  /// (kiln/autodiff/function_gradient.hpp).
  mutable std::once_flag backward_once;
  mutable std::shared_ptr<const differentiable_call> backward;

  /// Checks a call's flattened arguments against this trace's signature.
  void check_call(const call_signature& sig) const;

  basic_concrete_state() = default;
  basic_concrete_state(const basic_concrete_state&) = delete;
  basic_concrete_state& operator=(const basic_concrete_state&) = delete;

  /// Optimizes the traced graph and plans how to run it (after tracing).
  void compile();

  /// Runs the trace on eager tensors, or inlines it into the trace in progress when
  /// some are symbolic (a function called while tracing another); the outputs go to `out`.
  void run(const call_signature& sig, std::vector<tensor>& out) const;
};

// The optimizer and the executor are reached only through these, so that a program
// compiled with KILN_SEPARATE_COMPILATION compiles them once, and a header-only file
// only where it calls a function with tensors (they are templates on nothing).
#if KILN_DEFINE_LIBRARY
template <class Unused>
void basic_concrete_state<Unused>::compile() {
  std::optional<kiln::graph> changed = optimize_if_changed(graph);
  if (changed) optimized = std::move(*changed);
  executor = std::make_unique<graph_executor>(changed ? optimized : graph, jit_compile, workspaces);
}

template <class Unused>
void basic_concrete_state<Unused>::run(const call_signature& sig, std::vector<tensor>& out) const {
  // Called while another function is being traced, with symbolic inputs or not, the
  // trace's ops join the outer graph, so that they run with every call of it.
  trace_context* outer = trace_context::current();
  out.clear();
  if (outer) {
    // A tape recording in the outer trace sees the ops one by one.
    if (tapes_recording()) {
      std::vector<tensor> args;
      for (const tensor* t : sig.tensors) args.push_back(*t);
      out = hooks().replay.load(std::memory_order_relaxed)(graph, args);
      return;
    }
    std::vector<int> args;
    for (const tensor* t : sig.tensors) args.push_back(outer->node_of(*t));
    for (int id : outer->inline_graph(graph, args)) out.push_back(outer->symbolic(id));
    return;
  }
  small_vector<tensor, 4> args;
  args.reserve(sig.tensors.size());
  for (const tensor* t : sig.tensors) {
    if (t->is_symbolic()) throw type_error(name + ": a symbolic tensor was used outside the trace that made it");
    args.emplace_back(*t);
  }
  const std::span<const tensor> inputs(args.begin(), args.size());
  if (tapes_recording() && graph.has_effects()) {
    // Under a gradient tape, a function with effects runs op by op, recorded as eager
    // code is: its backward pass cannot run it again.
    out = hooks().replay.load(std::memory_order_relaxed)(graph, inputs);
    return;
  }
  try {
    executor->run(inputs, out);
  } catch (const error&) {
    rethrow_with_prefix("in " + name + ": ");
  }
  // Under a gradient tape, a function without effects is one differentiable op.
  if (tapes_recording()) hooks().call.load(std::memory_order_relaxed)(*this, inputs, out);
}
#endif

}  // namespace detail
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
void basic_concrete_state<Unused>::check_call(const call_signature& sig) const {
  for (const auto& v : sig.values) {
    const call_signature::value_leaf* traced = nullptr;
    for (const auto& b : bound)
      if (b.arg == v.arg) traced = &b;
    std::string arg = v.arg < int(arg_names.size()) ? arg_names[std::size_t(v.arg)] : std::to_string(v.arg);
    if (!traced)
      throw type_error("ConcreteFunction " + header() + " takes a tensor in " + arg + ", but was called with " +
                       v.kind + " value " + v.text);
    if (traced->key != v.key)
      throw type_error("ConcreteFunction " + header() + " was constructed with " + traced->kind + " value " +
                       traced->text + " in " + arg + ", but was called with " + v.kind + " value " + v.text + ".");
  }
  if (sig.tensors.size() != inputs.size())
    throw invalid_argument_error(header() + ": expected " + std::to_string(inputs.size()) + " tensor inputs, got " +
                                 std::to_string(sig.tensors.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const tensor& t = *sig.tensors[i];
    if (t.dtype() != inputs[i].dtype)
      throw invalid_argument_error("cannot compute " + name + " as input #" + std::to_string(i) +
                                   "(zero-based) was expected to be a " + std::string(kiln::name(inputs[i].dtype)) +
                                   " tensor but is a " + std::string(kiln::name(t.dtype())) + " tensor");
    if (!inputs[i].shape.accepts(t.shape()))
      throw invalid_argument_error("cannot compute " + name + " as input #" + std::to_string(i) +
                                   "(zero-based) was expected to have shape " + inputs[i].shape.str() +
                                   " but has shape " + t.shape().str());
  }
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

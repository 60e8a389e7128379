#pragma once
/// \file
/// The subgraph tracing that kiln::cond and kiln::while_loop share: a branch, condition
/// or body traced into a subgraph of its own, the outer tensors it captures, the specs
/// that control flow's errors show, and the tracer that both compile once
/// (detail::basic_control_flow_tracer, whose members kiln/trace/cond.hpp and
/// kiln/trace/while_loop.hpp define). Part of kiln/trace/control_flow.hpp.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/spec.hpp"
#include "kiln/core/symbol.hpp"
#include "kiln/trace/outputs.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {

struct loop_options;  // kiln/trace/loop_state.hpp

namespace detail {

using value_spec = std::pair<dtype, shape>;

/// "float32 (2,)", as the errors of control flow show a value.
template <class = void>
std::string spec_text(const value_spec& s) { return std::string(name(s.first)) + " " + s.second.str(); }
/// "(int32 (), float32 (2,))": several specs as a message shows them.
template <class = void>
std::string specs_text(std::span<const value_spec> specs) {
  std::string s = "(";
  for (std::size_t k = 0; k < specs.size(); ++k) s += (k ? ", " : "") + spec_text(specs[k]);
  return s + ")";
}

/// The leaves of a structure of tensors, in order.
template <class S>
std::vector<tensor> leaves_of(const S& s) {
  std::vector<tensor> out;
  for_each_output(s, [&](const tensor& t) { out.push_back(t); });
  return out;
}
template <class = void>
std::vector<value_spec> specs_of(std::span<const tensor> leaves) {
  std::vector<value_spec> out;
  for (const tensor& t : leaves) out.emplace_back(t.dtype(), t.shape());
  return out;
}

/// A branch, condition or body as traced: its graph, the outer tensors it captured
/// (its placeholders after the parameters) and the specs of its outputs.
struct traced_subgraph {
  graph g;
  std::vector<tensor> captures;
  std::vector<value_spec> outputs;
};

/// Traces `fn(parameters)` into a subgraph whose first placeholders have the specs
/// and names of `params`; returns what `fn` returned (symbolic, for its structure).
template <class Fn>
auto trace_subgraph(Fn&& fn, std::span<const tensor_spec> params, traced_subgraph& out) {
  trace_context context(trace_context::subgraph);
  std::vector<tensor> placeholders;
  for (const tensor_spec& p : params) placeholders.push_back(context.placeholder(p.name, p.dtype, p.shape));
  auto result = fn(std::span<const tensor>(placeholders));
  for_each_output(result, [&](const tensor& t) {
    const node& n = context.add_output(t);
    out.outputs.emplace_back(n.dtype(), n.shape());
  });
  out.g = std::move(context.graph());
  out.captures = context.captures();
  return result;
}
/// The name of the subgraph parameter that stands for `p`: its node's, or `loop_var`.
template <class = void>
std::string parameter_name(const tensor& p) { return p.is_symbolic() ? node_name(*p.symbol()) : "loop_var"; }
/// trace_subgraph with parameters standing for the tensors `params`, with `specs` (a
/// loop variable's may be less specific than its value).
template <class Fn>
auto trace_subgraph(Fn&& fn, std::span<const tensor> params, std::span<const value_spec> specs, traced_subgraph& out) {
  std::vector<tensor_spec> parameters;
  for (std::size_t k = 0; k < params.size(); ++k)
    parameters.emplace_back(specs[k].second, specs[k].first, parameter_name(params[k]));
  return trace_subgraph(std::forward<Fn>(fn), std::span<const tensor_spec>(parameters), out);
}

/// Index of `t` (a capture, by the graph value it stands for) in `all`, appended if new.
template <class = void>
int capture_index(std::vector<tensor>& all, const tensor& t) {
  for (std::size_t k = 0; k < all.size(); ++k)
    if (same_value(*all[k].symbol(), *t.symbol())) return int(k);
  all.push_back(t);
  return int(all.size()) - 1;
}

/// `v` as loop state holds it: C++ numbers become tensors, structures stay.
template <class V>
output_t<V> as_output(const V& v) {
  std::vector<tensor> leaves = leaves_of(v);
  const tensor* next = leaves.data();
  return rebuild_output(v, next);
}

struct loop_calls;

/// What tracing `cond` and `while_loop` does that does not depend on the branches' or
/// the loop's C++ types (`control_flow_tracer`, the one specialization), so that a
/// program compiles it once, not once per cond or loop. A template on nothing: not at
/// all when it traces none, and once in a compiled kiln, by one explicit instantiation
/// (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_control_flow_tracer {
  /// A `cond` node recorded into `trace` from its two traced branches; gives its results.
  static std::vector<tensor> record_cond(trace_context& trace, const tensor& pred, traced_subgraph& then_graph,
                                         traced_subgraph& else_graph);
  /// A while loop traced on the leaves of its state: its condition and body traced into
  /// subgraphs, and a `while` node recorded; gives the leaves of its results. The first
  /// `hidden` leaves are kiln's own; `arrays` holds each leaf's tensor_array, or null.
  static std::vector<tensor> trace_while_loop(trace_context& trace, std::size_t hidden, const loop_options& options,
                                              std::vector<tensor> leaves, std::vector<const tensor_array*> arrays,
                                              std::vector<value_spec> specs,
                                              std::vector<std::optional<shape>> invariants, bool breaks,
                                              loop_calls& calls);
};
using control_flow_tracer = basic_control_flow_tracer<void>;

}  // namespace detail
}  // namespace kiln

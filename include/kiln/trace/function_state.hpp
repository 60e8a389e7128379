#pragma once
/// \file
/// A kiln::function's traces in the runtime tier: the runtime members of
/// detail::basic_function_state that check a call against the input signature, find
/// the trace a call runs (or trace a new one, relaxed under reduce_retracing), and warn
/// of retracing. Part of kiln/trace/runtime_tier.hpp.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/print.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/exec/workspace.hpp"
#include "kiln/trace/concrete_state.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/signature.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {
namespace detail {

// ---- function_state: the runtime tier's members ------------------------------------

#if KILN_DEFINE_LIBRARY
template <class Unused>
void basic_function_state<Unused>::check_input_signature(call_signature& sig,
                                           const std::vector<tensor_spec>& expected) const {
  bool ok = sig.values.empty() && sig.specs.size() == expected.size();
  for (std::size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i].accepts(sig.specs[i].dtype, sig.specs[i].shape);
  if (!ok) throw_input_signature_mismatch(sig, expected);
  // Every call then has the input signature's specs, so it reuses the one trace.
  for (std::size_t i = 0; i < expected.size(); ++i) sig.specs[i].shape = expected[i].shape;
}

template <class Unused>
[[noreturn]] void basic_function_state<Unused>::throw_input_signature_mismatch(const call_signature& sig,
                                                                  const std::vector<tensor_spec>& expected) {
  {
    std::ostringstream os;
    os << "C++ inputs incompatible with input_signature:\n  inputs: (\n";
    for (std::size_t i = 0; i < sig.tensors.size(); ++i) {
      os << "    ";
      if (sig.tensors[i]) os << *sig.tensors[i]; else os << sig.specs[i];
      os << (i + 1 < sig.tensors.size() ? ",\n" : ")\n");
    }
    for (const auto& v : sig.values) os << "    " << v.kind << " value " << v.text << "\n";
    os << "  input_signature: (\n";
    for (std::size_t i = 0; i < expected.size(); ++i) os << "    " << expected[i] << (i + 1 < expected.size() ? ",\n" : ").");
    throw value_error(os.str());
  }
}

/// A function's traces in the runtime tier (function_state::runtime).
struct runtime_traces {
  struct key_hash {
    std::size_t operator()(const std::vector<std::uint64_t>& k) const {
      std::size_t h = k.size();
      for (std::uint64_t w : k) h = (h ^ std::size_t(w)) * 0x100000001b3ull;
      return h;
    }
  };
  using trace_map = std::unordered_map<std::vector<std::uint64_t>, std::shared_ptr<concrete_state>, key_hash>;

  std::vector<std::shared_ptr<concrete_state>> traces;
  /// The workspaces every trace's executor runs in (exec::workspace_pool).
  std::shared_ptr<exec::workspace_pool> workspaces = std::make_shared<exec::workspace_pool>();
  trace_map by_key;      // each trace under the key it was traced for
  trace_map dispatched;  // calls served by a more general trace; forgotten at each new trace
  std::vector<std::vector<std::uint64_t>> tracing_keys;  // signatures being traced right now
};

template <class Unused>
std::shared_ptr<const concrete_state> basic_function_state<Unused>::find_or_trace(
    call_signature& sig, std::shared_ptr<concrete_state> (*trace_now)(void*, const call_signature&), void* context) {
  {
    std::lock_guard lock(mutex);
    if (!runtime) runtime = {new runtime_traces, [](runtime_traces* r) { delete r; }};
    if (auto known = known_trace(sig)) return known;
  }
  std::lock_guard one_trace_at_a_time(tracing);
  {
    std::lock_guard lock(mutex);
    if (auto known = known_trace(sig)) return known;  // traced by another thread meanwhile
    for (const auto& k : runtime->tracing_keys)
      if (k == sig.key)
        throw value_error(options.name +
                          " calls itself with the same signature while tracing, which would recurse forever; a "
                          "recursive kiln::function must change a C++ argument on every call");
    if (auto general = most_specific_trace_accepting(sig)) {
      runtime->dispatched.emplace(sig.key, general);
      return general;
    }
    if (options.reduce_retracing) relax(sig);
    if (auto it = runtime->by_key.find(sig.key); it != runtime->by_key.end()) return it->second;
    runtime->tracing_keys.push_back(sig.key);
  }
  std::shared_ptr<concrete_state> traced;
  try {
    traced = trace_now(context, sig);
  } catch (...) {
    std::lock_guard lock(mutex);
    runtime->tracing_keys.pop_back();
    throw;
  }
  std::lock_guard lock(mutex);
  runtime->tracing_keys.pop_back();
  runtime->traces.push_back(traced);
  signatures.push_back({traced});
  runtime->by_key.emplace(sig.key, traced);
  runtime->dispatched.clear();  // the new trace may be more specific for some of them
  if (runtime->traces.size() == retracing_warning_traces) warn_retracing();
  return traced;
}

template <class Unused>
void basic_function_state<Unused>::warn_retracing() const {
  std::ostream* os = config::warning_stream();
  if (!os) return;
  std::ostringstream text;
  text << "WARNING: kiln::function " << options.name << " has traced " << retracing_warning_traces
       << " times. Tracing is expensive and the excessive number of tracings could be due to (1) passing tensors "
          "with different shapes, (2) passing C++ values that change, which are part of the signature. For (1), "
          "function_options::reduce_retracing = true or an input_signature avoids retracing. For (2), pass tensors "
          "instead.\n";
  *os << text.str() << std::flush;
}

template <class Unused>
std::shared_ptr<concrete_state> basic_function_state<Unused>::start_trace(
    const call_signature& sig, argument_texts texts, trace_context& context, std::vector<tensor>& placeholders) const {
  auto c = std::make_shared<concrete_state>();
  c->name = options.name;
  c->jit_compile = options.jit_compile;
  {
    std::lock_guard lock(mutex);
    c->workspaces = runtime->workspaces;
  }
  for (std::size_t i = 0; i < texts.bound.size(); ++i) c->arg_names.push_back(arg_name(i));
  c->bound = sig.values;
  c->bound_text = std::move(texts.bound);
  c->arg_structure = std::move(texts.structure);
  c->input_text = std::move(texts.inputs);
  const std::span<const std::uint64_t> structure = sig.structure();
  c->structure.assign(structure.begin(), structure.end());
  c->input_arg = sig.tensor_arg;
  for (std::size_t i = 0; i < sig.specs.size(); ++i) {
    placeholders.push_back(context.placeholder(c->arg_names[std::size_t(sig.tensor_arg[i])], sig.specs[i].dtype,
                                               sig.specs[i].shape));
    c->inputs.emplace_back(sig.specs[i].shape, sig.specs[i].dtype, context.graph().nodes().back().name());
  }
  return c;
}

template <class Unused>
void basic_function_state<Unused>::add_output(concrete_state& c, trace_context& context, const tensor& t) {
  const node& n = context.add_output(t);
  c.outputs.emplace_back(n.shape(), n.dtype(), n.name() + ":0");
}

template <class Unused>
void basic_function_state<Unused>::finish_trace(concrete_state& c, trace_context& context) {
  c.graph = std::move(context.graph());
  // Constant folding runs ops on constants, which must compute, not be recorded.
  kiln::init_scope outside_every_trace;
  c.compile();
}

template <class Unused>
bool basic_function_state<Unused>::asks_for_specs(const call_signature& sig) {
  return std::ranges::count(sig.tensors, nullptr) > 0;
}

template <class Unused>
std::shared_ptr<concrete_state> basic_function_state<Unused>::known_trace(const call_signature& sig) const {
  if (auto it = runtime->by_key.find(sig.key); it != runtime->by_key.end()) return it->second;
  if (asks_for_specs(sig)) return nullptr;
  auto it = runtime->dispatched.find(sig.key);
  return it != runtime->dispatched.end() ? it->second : nullptr;
}

template <class Unused>
bool basic_function_state<Unused>::same_structure_and_dtypes(const concrete_state& t, const call_signature& sig) {
  if (!std::ranges::equal(t.structure, sig.structure()) || t.inputs.size() != sig.specs.size()) return false;
  for (std::size_t i = 0; i < sig.specs.size(); ++i)
    if (t.inputs[i].dtype != sig.specs[i].dtype) return false;
  return true;
}

template <class Unused>
std::shared_ptr<concrete_state> basic_function_state<Unused>::most_specific_trace_accepting(const call_signature& sig) const {
  std::shared_ptr<concrete_state> best;
  if (asks_for_specs(sig)) return best;
  int best_unknowns = 0;
  for (const auto& t : runtime->traces) {
    if (!same_structure_and_dtypes(*t, sig)) continue;
    int unknowns = 0;
    bool accepts = true;
    for (std::size_t i = 0; accepts && i < sig.specs.size(); ++i) {
      const shape& traced = t->inputs[i].shape;
      accepts = traced.accepts(sig.specs[i].shape);
      unknowns += traced.has_known_rank() ? int(std::ranges::count(traced.dims(), none)) : max_rank + 1;
    }
    if (accepts && (!best || unknowns < best_unknowns)) {
      best = t;
      best_unknowns = unknowns;
    }
  }
  return best;
}

template <class Unused>
void basic_function_state<Unused>::relax(call_signature& sig) {
  for (auto t = runtime->traces.rbegin(); t != runtime->traces.rend(); ++t) {
    if (!same_structure_and_dtypes(**t, sig)) continue;
    for (std::size_t i = 0; i < sig.specs.size(); ++i) {
      const shape& traced = (*t)->inputs[i].shape;
      shape& s = sig.specs[i].shape;
      if (!traced.has_known_rank() || traced.rank() != s.rank()) {
        s = unknown_rank;
        continue;
      }
      for (int d = 0; d < s.rank(); ++d)
        if (traced[d] != s[d]) s[d] = none;
    }
    sig.seal();
    return;
  }
}

template <class Unused>
void basic_function_state<Unused>::check_created_variables(const trace_context& context) const {
  const auto& created = context.created_variables();
  if (created.empty()) return;
  bool first;
  {
    std::lock_guard lock(mutex);
    first = runtime->traces.empty();
  }
  const bool dropped = std::ranges::any_of(created, [](const auto& v) { return v.expired(); });
  if (!first || dropped)
    throw value_error("kiln::function only supports singleton variables created on the first call; " +
                      std::string(dropped ? "a variable created while tracing was dropped at the end of the trace"
                                          : "a variable was created while tracing a new signature") +
                      ". Create variables once, outside the function or in state it keeps across calls");
}
#endif

}  // namespace detail
}  // namespace kiln

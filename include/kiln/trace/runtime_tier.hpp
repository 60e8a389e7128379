#pragma once
/// \file
/// kiln::function's runtime tier: calls with kiln::tensor
/// arguments traced into a graph once per input signature, and
/// `kiln::concrete_function`, one such trace.

#include <algorithm>
#include <any>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/core/print.hpp"
#include "kiln/core/results.hpp"
#include "kiln/exec/executor.hpp"
#include "kiln/ops/tensor_array.hpp"
#include "kiln/passes/optimize.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/signature.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {

namespace config {
namespace detail {
inline std::atomic<bool>& eager_functions() {
  static std::atomic<bool> flag{false};
  return flag;
}
}  // namespace detail
/// When on, every kiln::function calls its callable directly on eager tensors
/// (for debugging: C++ side effects then happen at every call).
/// \code kiln::config::run_functions_eagerly(true); \endcode
inline void run_functions_eagerly(bool on) { detail::eager_functions() = on; }
/// Whether kiln::function calls run their callables eagerly.
inline bool functions_run_eagerly() { return detail::eager_functions(); }
}  // namespace config

namespace detail {

/// Writes and reads saved functions; defined by kiln/saved_function.hpp.
template <class = void>
struct saved_function_io;

/// A leaf of what a traced callable returned, as the function gives it back: a tensor,
/// or a C++ number that becomes one; a tensor_array stays one (its leaf is the tensor
/// of its elements). Tuples, pairs, arrays and vectors keep their structure (output_of).
template <class R>
struct runtime_output_leaf {
  using type = tensor;
};
template <>
struct runtime_output_leaf<tensor_array> {
  using type = tensor_array;
};
template <class R>
using output_t = typename output_of<runtime_output_leaf, std::remove_cvref_t<R>>::type;

template <class T>
tensor scalar_constant(const T& v) {
  static_assert(has_dtype<T> || std::is_same_v<T, int> || std::is_same_v<T, long long>,
                "a kiln::function may return tensors, C++ numbers of the element types, and tuples, pairs, arrays "
                "and vectors of those");
  using E = std::conditional_t<has_dtype<T>, T, std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>>;
  tensor t(dtype_of<E>, shape{});
  *t.view().template as<E>() = E(v);
  return t;
}

/// Calls `f(leaf)` for every leaf of a returned value, in order.
template <class R, class F>
void for_each_output(const R& r, F&& f) {
  using U = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<U, tensor>) {
    f(r);
  } else if constexpr (std::is_same_v<U, tensor_array>) {
    f(r.elements());
  } else if constexpr (is_tuple_like<U>::value || is_vector<U>::value) {
    for_each_element(r, [&](const auto& e) { for_each_output(e, f); });
  } else {
    f(scalar_constant(r));
  }
}

/// Writes the structure of a returned value's tensors to `s`, as for_each_output walks them.
template <class R>
void describe_outputs(const R& r, structure_text& s) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_tuple_like<U>::value || is_vector<U>::value) {
    constexpr bool list = is_vector<U>::value || is_std_array<U>::value;
    s.open(list);
    std::size_t count = 0;
    for_each_element(r, [&](const auto& e) {
      if (count++) s.next();
      describe_outputs(e, s);
    });
    s.close(list, count);
  } else {
    s.leaf();
  }
}
/// The structure of a returned value as a signature shows it; empty for one tensor.
template <class R>
std::string output_structure_text(const R& r) {
  if constexpr (is_tuple_like<std::remove_cvref_t<R>>::value || is_vector<std::remove_cvref_t<R>>::value) {
    structure_text s;
    describe_outputs(r, s);
    return s.text;
  } else {
    return {};
  }
}

/// The returned structure `traced` with its leaves taken, in order, from `next`.
template <class R>
output_t<R> rebuild_output(const R& traced, const tensor*& next) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_tuple_like<U>::value) {
    return std::apply([&](const auto&... e) { return output_t<R>{rebuild_output(e, next)...}; }, traced);
  } else if constexpr (is_vector<U>::value) {
    output_t<R> out;
    for (const auto& e : traced) out.push_back(rebuild_output(e, next));
    return out;
  } else if constexpr (std::is_same_v<U, tensor_array>) {
    return traced.with_elements(*next++);
  } else {
    return *next++;
  }
}

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
  kiln::graph optimized;  ///< as run
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
  void check_call(const call_signature& sig) const {
    for (const auto& v : sig.values) {
      const call_signature::value_leaf* traced = nullptr;
      for (const auto& b : bound)
        if (b.arg == v.arg) traced = &b;
      std::string arg = v.arg < int(arg_names.size()) ? arg_names[std::size_t(v.arg)] : std::to_string(v.arg);
      if (!traced)
        throw type_error("ConcreteFunction " + header() + " takes a tensor in " + arg + ", but was called with " + v.kind +
                         " value " + v.text);
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
  optimized = optimize(graph);
  executor = std::make_unique<graph_executor>(optimized, jit_compile, workspaces);
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

/// Re-raises a kiln error from tracing or running a function with its name in front.
[[noreturn]] inline void rethrow_with_function_name(const std::string& fn) { rethrow_with_prefix("in " + fn + ": "); }

}  // namespace detail

/// One trace of a kiln::function: a graph for one input signature. Call it with
/// tensors (and, optionally, the C++ values it was traced with).
/// \code
/// kiln::function pow([](const kiln::tensor& x, int n) { return kiln::pow(x, float(n)); });
/// auto square = pow.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::float32), 2);
/// square(kiln::constant(10.f));  // 100
/// \endcode
class concrete_function {
 public:
  explicit concrete_function(std::shared_ptr<const detail::concrete_state> s) : state_(std::move(s)) {}

  /// Runs the graph; a function with one output returns it, use call_flat for several.
  /// A callable that returns nothing gives an empty (undefined) tensor.
  template <class... Args>
  tensor operator()(const Args&... args) const {
    std::vector<tensor> out = call(args...);
    if (state_->returns_void) return tensor();
    if (out.size() != 1)
      throw value_error(state_->header() + " returns " + std::to_string(out.size()) + " tensors: use call_flat");
    return out[0];
  }
  /// Runs the graph and returns every output tensor, in order.
  template <class... Args>
  std::vector<tensor> call_flat(const Args&... args) const {
    return call(args...);
  }

  /// The traced graph.
  const kiln::graph& graph() const { return state_->graph; }
  /// One spec per tensor input, named after its argument.
  const std::vector<tensor_spec>& structured_input_signature() const { return state_->inputs; }
  /// One spec per output, named after the graph value (`Identity:0`).
  std::vector<tensor_spec> structured_outputs() const { return state_->outputs; }

  friend std::ostream& operator<<(std::ostream& os, const concrete_function& f) {
    return os << "ConcreteFunction " << f.state_->signature_text();
  }
  /// The signature in TensorFlow's format, without a newline at the end, as
  /// TensorFlow's `pretty_printed_signature()`: `double(a)`, then its Args and Returns.
  /// \code
  /// kiln::function dbl([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}});
  /// std::cout << dbl.get_concrete_function(kiln::constant(1)).pretty_printed_signature();
  /// \endcode
  std::string pretty_printed_signature() const {
    std::string text = state_->signature_text();
    text.pop_back();
    return text;
  }

  /// Writes this trace, its constants and its variables' values to `path`, for
  /// kiln::load in another program; needs `#include <kiln/saved_function.hpp>`.
  /// \code
  /// kiln::function f([](const kiln::tensor& x) { return x * 2; });
  /// f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)).save("f.kiln");
  /// \endcode
  template <class Io = detail::saved_function_io<>>
  void save(const std::string& path) const {
    if constexpr (requires { Io::save(*this, path); })
      Io::save(*this, path);
    else
      static_assert(sizeof(Io*) == 0, "concrete_function::save needs #include <kiln/saved_function.hpp>");
  }

 private:
  // The saved-function format (kiln/saved_function.hpp) writes the trace itself.
  template <class>
  friend struct detail::saved_function_io;
  template <class... Args>
  std::vector<tensor> call(const Args&... args) const {
    detail::pooled_call_frame frame;
    int arg = 0;
    (detail::flatten(args, frame->signature, arg++), ...);
    state_->check_call(frame->signature);
    std::vector<tensor> out;
    state_->run(frame->signature, out);
    return out;
  }
  std::shared_ptr<const detail::concrete_state> state_;
};

namespace detail {

/// kiln::function's calls with kiln::tensor arguments (and C++ values): each new
/// signature is traced into a graph, which later calls with that signature run.
template <class F>
struct runtime_tier {
  template <class... Args>
  static auto call(function<F>& f, Args&&... args) {
    if constexpr ((typed::fixed_value<Args> || ...)) {
      // `fixed` beside runtime arguments: the runtime tier, with the values as tensors.
      return call(f, runtime_argument(std::forward<Args>(args))...);
    } else if constexpr (takes_objects_by_reference<F, Args...>) {
      return call(f, reference_if_object(std::forward<Args>(args))...);
    } else if constexpr (!takes_traced_arguments<F, Args...>) {
      callable_does_not_accept<Args...>();
    } else {
      using R = result_t<Args...>;
      if (config::functions_run_eagerly()) return run_eagerly<R>(f, std::forward<Args>(args)...);
      pooled_call_frame frame;
      call_signature& sig = frame->signature;
      signature_of(sig, f, args...);
      auto concrete = find_or_trace<R>(f, sig, std::forward<Args>(args)...);
      concrete->run(sig, frame->outputs);
      if constexpr (std::is_void_v<R>) {
        return;
      } else {
        const tensor* next = frame->outputs.data();
        return rebuild_output(std::any_cast<const std::remove_cvref_t<R>&>(concrete->traced_result), next);
      }
    }
  }

  template <class... Args>
  static auto get_concrete_function(function<F>& f, Args&&... args) {
    if constexpr (takes_objects_by_reference<F, Args...>) {
      return get_concrete_function(f, reference_if_object(std::forward<Args>(args))...);
    } else if constexpr (!takes_traced_arguments<F, Args...>) {
      callable_does_not_accept<Args...>();
    } else {
      call_signature sig;
      signature_of(sig, f, args...);
      return kiln::concrete_function(find_or_trace<result_t<Args...>>(f, sig, std::forward<Args>(args)...));
    }
  }

 private:
  template <class A>
  static decltype(auto) runtime_argument(A&& a) {
    if constexpr (typed::fixed_value<A>)
      return tensor(a);
    else
      return std::forward<A>(a);
  }

  // What the callable returns when traced with `Args`.
  template <class... Args>
  using result_t = std::invoke_result_t<F&, decltype(traced_argument(std::declval<Args>(), std::declval<const tensor*&>()))...>;

  template <class... Args>
  static void signature_of(call_signature& sig, const function<F>& f, const Args&... args) {
    int arg = 0;
    (flatten(args, sig, arg++), ...);
    if (const auto& expected = f.state_->options.input_signature) f.state_->check_input_signature(sig, *expected);
    sig.seal();
  }

  template <class R, class... Args>
  static auto run_eagerly(function<F>& f, Args&&... args) {
    if constexpr (std::is_void_v<R>) {
      f.fn_(referenced(std::forward<Args>(args))...);
    } else {
      auto r = f.fn_(referenced(std::forward<Args>(args))...);
      std::vector<tensor> leaves;
      for_each_output(r, [&](const tensor& t) { leaves.push_back(t); });
      const tensor* next = leaves.data();
      return rebuild_output(r, next);
    }
  }

  template <class R, class... Args>
  static std::shared_ptr<const concrete_state> find_or_trace(function<F>& f, call_signature& sig, Args&&... args) {
    auto trace_it = [&](const call_signature& s) { return trace<R>(f, s, std::forward<Args>(args)...); };
    return f.state_->find_or_trace(
        sig, [](void* it, const call_signature& s) { return (*static_cast<decltype(trace_it)*>(it))(s); }, &trace_it);
  }

  template <class R, class... Args>
  static std::shared_ptr<concrete_state> trace(function<F>& f, const call_signature& sig, Args&&... args) {
    function_state& state = *f.state_;
    trace_context context(state.options.name);
    std::vector<tensor> placeholders;
    std::shared_ptr<concrete_state> c = state.start_trace(sig, texts_of(args...), context, placeholders);
    try {
      const tensor* next = placeholders.data();
      auto call = [&]<std::size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
        // Each argument takes its placeholders from its own position, whatever
        // order the compiler evaluates the arguments in.
        std::array<const tensor*, sizeof...(Args)> starts{};
        for (std::size_t a = 0, k = 0; a != sizeof...(Args); ++a) {  // `<` warns for none (-Wtype-limits)
          starts[a] = next + k;
          while (k < sig.tensor_arg.size() && sig.tensor_arg[k] == int(a)) ++k;
        }
        return f.fn_(traced_argument(std::forward<Args>(args), starts[I])...);
      };
      if constexpr (std::is_void_v<R>) {
        call(std::index_sequence_for<Args...>{});
        c->returns_void = true;
      } else {
        std::remove_cvref_t<R> result = call(std::index_sequence_for<Args...>{});
        for_each_output(result, [&](const tensor& t) { function_state::add_output(*c, context, t); });
        c->output_structure = output_structure_text(result);
        c->traced_result = std::move(result);
      }
      state.check_created_variables(context);
    } catch (const error&) {
      rethrow_with_function_name(state.options.name);
    }
    state.finish_trace(*c, context);
    return c;
  }
};

}  // namespace detail

}  // namespace kiln

#pragma once
/// \file
/// kiln::function: its options and its state. Its calls are the tiers': with `fixed`
/// arguments the compile-time tier's (kiln/typed/function_calls.hpp, which kiln/fixed.hpp
/// and kiln/kiln.hpp include), with kiln::tensor arguments the runtime tier's
/// (kiln/trace/runtime_tier.hpp, which kiln/kiln.hpp includes and kiln/fixed.hpp does not).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/exec/jit_switch.hpp"

namespace kiln {

namespace typed {
struct recorded_signature;
class trace_table;
}  // namespace typed

/// Options of a kiln::function.
/// \code kiln::function f([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}}); \endcode
struct function_options {
  /// Shown in signatures and errors.
  std::string name = "function";
  /// Names of the arguments; `x0`, `x1`, ... where not given.
  std::vector<std::string> arg_names = {};
  /// When set, the function traces at most once, for these specs, and rejects other inputs.
  std::optional<std::vector<tensor_spec>> input_signature = std::nullopt;
  /// Compile each fused elementwise cluster to one native loop with the system C++
  /// compiler (see kiln/exec/jit.hpp): intermediates stay in registers. The first
  /// call of a signature then costs a compile (about a second), unless an earlier
  /// process left the loop in the cache on disk.
  detail::jit_switch jit_compile = {};
  /// After a retrace, dims that changed become `None`, so further sizes reuse the trace.
  bool reduce_retracing = false;
};

namespace detail {

/// Fails to compile with the error for a kiln::function called with arguments its
/// callable does not take: the line above the error, "In instantiation of ... [with
/// Args = {...}]", names their types, and nothing after it reaches the callable.
template <class... Args>
inline constexpr bool accepted_by_callable = false;
template <class... Args>
void callable_does_not_accept() {
  static_assert(accepted_by_callable<Args...>, "kiln::function: the callable does not accept arguments of these types "
                                               "(Args, on the line above)");
}

struct argument_texts;
struct call_signature;
template <class>
struct basic_concrete_state;
using concrete_state = basic_concrete_state<void>;
struct runtime_traces;
class trace_context;

/// kiln::function's calls with kiln::tensor arguments, defined in
/// kiln/trace/runtime_tier.hpp. A program that includes kiln/fixed.hpp alone has the
/// compile-time tier only; calling a function with tensors there fails to compile
/// here: include <kiln/kiln.hpp> for the runtime tier.
template <class F>
struct runtime_tier;

/// Whether the runtime tier is there: kiln/kiln.hpp has been included.
template <class F>
concept has_runtime_tier = requires { sizeof(runtime_tier<F>); };

/// kiln::function's calls with `fixed` arguments, defined in
/// kiln/typed/function_calls.hpp (the compile-time tier), which kiln/fixed.hpp and
/// kiln/kiln.hpp include.
template <class F>
struct typed_tier;

/// Whether a call with `Args` is the compile-time tier's (`fixed` arguments).
template <class F, class... Args>
concept typed_call_of = requires { sizeof(typed_tier<F>); } && typed_tier<F>::template calls<Args...>;
/// Whether a get_concrete_function with `Args` asks for a typed trace.
template <class F, class... Args>
concept typed_request_of = requires { sizeof(typed_tier<F>); } && typed_tier<F>::template requests<Args...>;

/// What a kiln::function and its copies share: its options and traces
/// (`function_state`, the one specialization). Not a template on the callable, so that
/// what does not depend on it is compiled once per program, not once per function. The
/// members that trace and dispatch calls with tensor arguments are defined with the
/// runtime tier (kiln/trace/runtime_tier.hpp); a template on nothing, so that a file
/// compiles them (and the tracing, optimizer and executor behind them) only where it
/// calls a function with tensors, and a compiled kiln compiles them all with one
/// explicit instantiation (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_function_state {
  explicit basic_function_state(function_options o) : options(std::move(o)) {}

  function_options options;
  mutable std::mutex mutex;        // guards signatures and runtime
  /// A trace's signature: the runtime tier's, or else a typed trace's (it lives in
  /// `typed`), with how the compile-time tier writes it.
  struct signature_record {
    std::shared_ptr<const trace_signature> runtime;
    const typed::recorded_signature* typed = nullptr;
    trace_signature (*written)(const basic_function_state&, const typed::recorded_signature&) = nullptr;
  };
  std::vector<signature_record> signatures;  // of every trace, in either tier, in the order they were made
  std::recursive_mutex tracing;    // one trace at a time; a nested trace (recursion) re-enters
  /// The runtime tier's traces, made by its first call, with a deleter it sets: a file
  /// whose functions make typed traces only does not compile them.
  std::unique_ptr<runtime_traces, void (*)(runtime_traces*)> runtime{nullptr, nullptr};
  /// The traces of calls with `fixed` arguments, made by the first such call
  /// (kiln/typed/function_calls.hpp), with a deleter it sets; `typed_owner` owns them,
  /// `typed` is what calls read.
  std::atomic<typed::trace_table*> typed{nullptr};
  std::unique_ptr<typed::trace_table, void (*)(typed::trace_table*)> typed_owner{nullptr, nullptr};

  /// Adds a new typed trace's signature, which `written` writes out.
  void add_signature(const typed::recorded_signature& s,
                     trace_signature (*written)(const basic_function_state&, const typed::recorded_signature&));

  void check_input_signature(call_signature& sig, const std::vector<tensor_spec>& expected) const;

  /// The kiln::value_error for a call that `expected` does not accept (out of line: it
  /// formats tensors).
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_input_signature_mismatch(
      const call_signature& sig, const std::vector<tensor_spec>& expected);

  /// The trace that serves `sig`: a known one, or the one `trace_now(context, sig)`
  /// makes, registered under sig's key (one trace at a time; a recursion with the same
  /// signature is an error).
  std::shared_ptr<const concrete_state> find_or_trace(call_signature& sig,
                                                      std::shared_ptr<concrete_state> (*trace_now)(void*, const call_signature&),
                                                      void* context);

  /// The name of argument `i`: as the options give it, else x0, x1, ...
  std::string arg_name(std::size_t i) const;

  /// A new trace for `sig`, its arguments shown as `texts` says: its names and
  /// signature, and a placeholder in `context` per tensor leaf.
  std::shared_ptr<concrete_state> start_trace(const call_signature& sig, argument_texts texts, trace_context& context,
                                              std::vector<tensor>& placeholders) const;

  /// Makes `t` an output of trace `c`.
  static void add_output(concrete_state& c, trace_context& context, const tensor& t);

  /// Ends trace `c`: its graph, optimized and planned.
  static void finish_trace(concrete_state& c, trace_context& context);

  // Whether `sig` has a tensor_spec leaf (a get_concrete_function that asks for a
  // trace of those specs) rather than tensors only (a call).
  static bool asks_for_specs(const call_signature& sig);

  // The trace that serves `sig` when one is known: the one traced for its key, or for
  // a call, the more general trace it was dispatched to before.
  std::shared_ptr<concrete_state> known_trace(const call_signature& sig) const;

  // Whether trace `t` was made for the structure (nesting, C++ values) and dtypes of `sig`.
  static bool same_structure_and_dtypes(const concrete_state& t, const call_signature& sig);

  // A trace more general than the call (None dims, unknown ranks; made by
  // get_concrete_function or reduce_retracing) serves it, as TensorFlow dispatches to
  // the most specific trace that accepts a call: the one with the fewest unknowns.
  // get_concrete_function with tensor_specs asks for a trace of those specs instead.
  std::shared_ptr<concrete_state> most_specific_trace_accepting(const call_signature& sig) const;

  // reduce_retracing: the call is keyed by the most specific specs that accept both it
  // and the latest trace of its structure and dtypes, as TensorFlow's common
  // supertype: a dim that differs becomes None, a rank that differs unknown.
  void relax(call_signature& sig);

  /// After how many runtime-tier traces a function warns that it retraces often, as
  /// TensorFlow does after 5 (to config::warning_stream(), once per function).
  static constexpr std::size_t retracing_warning_traces = 5;
  void warn_retracing() const;

  // Variables may be created by the first trace only, and must outlive it: a
  // later trace would create another variable at each retrace, and a variable that
  // dies with the trace would be created anew at every call in eager code.
  void check_created_variables(const trace_context& context) const;
};
using function_state = basic_function_state<void>;

}  // namespace detail

/// TensorFlow's tf.function: traces `fn` once per input signature and runs the trace
/// on later calls with that signature. Called with kiln::tensor arguments, the trace
/// is a graph (the runtime tier); called with kiln::fixed arguments, a typed trace
/// made at compile time (the compile-time tier).
/// \code
/// kiln::function dbl([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}});
/// dbl(kiln::constant(1));    // traces, then runs: tensor(2, shape=(), dtype=int32)
/// dbl(kiln::constant(2));    // runs the same graph
/// \endcode
template <class F>
class function {
 public:
  explicit function(F fn, function_options options = {})
      : fn_(std::move(fn)), state_(std::make_shared<detail::function_state>(std::move(options))) {}

  /// Calls the function: traces on a new signature, then runs the trace. An object the
  /// callable takes by non-const reference (`[](auto& model, auto x)`) is keyed by
  /// address and passed as itself.
  template <class... Args>
  auto operator()(Args&&... args) {
    if constexpr (detail::typed_call_of<F, Args...>) {
      return detail::typed_tier<F>::call(*this, args...);
    } else if constexpr (!detail::has_runtime_tier<F>) {
      static_assert(detail::has_runtime_tier<F>, "kiln::function: a call with kiln::tensor arguments needs the runtime "
                                                 "tier; include <kiln/kiln.hpp> (kiln/fixed.hpp has the compile-time tier only)");
    } else {
      return detail::runtime_tier<F>::call(*this, std::forward<Args>(args)...);
    }
  }

  /// Traces for these arguments (values, tensor_specs or C++ values) without running.
  /// With `fixed` values or kiln::spec<T, Dims...> the trace is a typed one, and the
  /// result a typed::concrete_function taking the `fixed` arguments.
  template <class... Args>
  auto get_concrete_function(Args&&... args) {
    if constexpr (detail::typed_request_of<F, Args...>) {
      return detail::typed_tier<F>::get_concrete_function(*this, args...);
    } else if constexpr (!detail::has_runtime_tier<F>) {
      static_assert(detail::has_runtime_tier<F>, "kiln::function: a trace for kiln::tensor arguments needs the runtime "
                                                 "tier; include <kiln/kiln.hpp> (kiln/fixed.hpp has the compile-time tier only)");
    } else {
      return detail::runtime_tier<F>::get_concrete_function(*this, std::forward<Args>(args)...);
    }
  }

  /// Every trace's signature, in TensorFlow's format, in the order they were made,
  /// separated by blank lines, with no newline at the end (as TensorFlow's string).
  std::string pretty_printed_concrete_signatures() const {
    std::lock_guard lock(state_->mutex);
    std::string s;
    for (const auto& [runtime, typed, written] : state_->signatures) {
      if (!s.empty()) s += "\n\n";
      const std::string text = (runtime ? *runtime : written(*state_, *typed)).signature_text();
      s.append(text, 0, text.size() - 1);  // without its closing newline
    }
    return s;
  }
  /// How many times the callable has been traced, in either tier.
  int tracing_count() const {
    std::lock_guard lock(state_->mutex);
    return int(state_->signatures.size());
  }

 private:
  friend struct detail::runtime_tier<F>;
  friend struct detail::typed_tier<F>;

  F fn_;
  std::shared_ptr<detail::function_state> state_;
};

template <class F>
function(F) -> function<F>;
template <class F>
function(F, function_options) -> function<F>;

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
void basic_function_state<Unused>::add_signature(const typed::recorded_signature& s,
                                                 trace_signature (*written)(const basic_function_state&,
                                                                            const typed::recorded_signature&)) {
  std::lock_guard lock(mutex);
  signatures.push_back({nullptr, &s, written});
}

template <class Unused>
std::string basic_function_state<Unused>::arg_name(std::size_t i) const {
  if (i < options.arg_names.size()) return options.arg_names[i];
  std::string name = "x";  // appended, not `"x" + ...`: GCC 12 warns of the latter here
  name += std::to_string(i);
  return name;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// kiln::function: its options, its state, and its calls in the compile-time tier
/// (`fixed` arguments, kiln/typed/trace.hpp). Calls with kiln::tensor arguments are
/// the runtime tier's, defined by kiln/trace/runtime_tier.hpp, which kiln/kiln.hpp
/// includes and kiln/fixed.hpp does not.

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
#include "kiln/exec/jit_switch.hpp"
#include "kiln/trace/spec.hpp"
#include "kiln/typed/trace.hpp"

namespace kiln {

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
  /// A trace's signature: the runtime tier's, or else a typed trace's (it lives in `typed`).
  struct signature_record {
    std::shared_ptr<const trace_signature> runtime;
    const typed::recorded_signature* typed = nullptr;
  };
  std::vector<signature_record> signatures;  // of every trace, in either tier, in the order they were made
  std::recursive_mutex tracing;    // one trace at a time; a nested trace (recursion) re-enters
  /// The runtime tier's traces, made by its first call, with a deleter it sets: a file
  /// whose functions make typed traces only does not compile them.
  std::unique_ptr<runtime_traces, void (*)(runtime_traces*)> runtime{nullptr, nullptr};
  typed::trace_table typed;  // traces of calls with `fixed` arguments

  /// Adds a new typed trace's signature.
  void add_signature(const typed::recorded_signature& s) {
    std::lock_guard lock(mutex);
    signatures.push_back({nullptr, &s});
  }

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
  std::string arg_name(std::size_t i) const {
    if (i < options.arg_names.size()) return options.arg_names[i];
    std::string name = "x";  // appended, not `"x" + ...`: GCC 12 warns of the latter here
    name += std::to_string(i);
    return name;
  }

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

template <class>
detail::trace_signature typed::written(const detail::function_state& state, const recorded_signature& s) {
  detail::trace_signature w;
  w.name = state.options.name;
  w.bound_text = s.bound_text;
  for (const signature_leaf& a : s.type->arguments) {
    w.arg_names.push_back(state.arg_name(w.arg_names.size()));
    if (!a.typed) continue;
    w.inputs.emplace_back(a.shape, a.type, w.arg_names.back());
    w.input_arg.push_back(int(w.arg_names.size() - 1));
  }
  for (const signature_leaf& out : s.type->outputs) w.outputs.emplace_back(out.shape, out.type);
  w.output_structure = s.type->output_structure();
  return w;
}

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
    if constexpr (typed::typed_call<Args...>) {
      if constexpr (std::is_invocable_v<F&, typed::traced_t<Args>&...>) return typed_call(args...);
      else detail::callable_does_not_accept<Args...>();
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
    if constexpr (typed::typed_request<Args...>) {
      if constexpr (!std::is_invocable_v<F&, typed::traced_t<Args>&...>) {
        detail::callable_does_not_accept<Args...>();
      } else {
        using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
        using concrete = typename typed::concrete_for<R, Args...>::type;
        return concrete(typed_trace_for(args...), state_);
      }
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
    for (const auto& [runtime, typed] : state_->signatures) {
      if (!s.empty()) s += "\n\n";
      const std::string text = (runtime ? *runtime : typed::written(*state_, *typed)).signature_text();
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

  // A call in the compile-time tier (kiln/typed/trace.hpp).
  template <class... Args>
  auto typed_call(const Args&... args) {
    const auto* t = typed_trace_for(args...);
    if constexpr (std::is_void_v<std::invoke_result_t<F&, typed::traced_t<Args>&...>>)
      t->run(typed_data(args...));
    else
      return t->run(typed_data(args...));
  }

  // The typed trace of these arguments (`fixed` values or specs, and C++ values): the
  // slot of their signature type, found by its index, then the trace of these C++
  // values in it, traced now if there is none.
  template <class... Args>
  auto typed_trace_for(const Args&... args) {
    using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
    using entry = typed::signature_traces<R, typed::values_of<Args...>>;
    entry& e = state_->typed.template entry<std::tuple<typename typed::fixed_of<std::remove_cvref_t<Args>>::type...>, entry>();
    const typed::trace<R>* t = nullptr;
    if constexpr (std::tuple_size_v<typed::values_of<Args...>> == 0) {
      t = e.only.load(std::memory_order_acquire);
      if (!t) {
        std::lock_guard tracing(state_->typed.tracing);
        if (!(t = e.only.load(std::memory_order_acquire))) {
          e.only_owner = trace_typed<R>(args...);
          e.only.store(t = e.only_owner.get(), std::memory_order_release);
        }
      }
    } else {
      const auto key = typed::values(args...);
      std::lock_guard tracing(state_->typed.tracing);
      std::lock_guard lock(e.mutex);
      for (const auto& [k, known] : e.by_value)
        if (k == key) t = known.get();
      if (!t) t = e.by_value.emplace_back(key, trace_typed<R>(args...)).second.get();
    }
    return t;
  }

  // The data of a typed call's `fixed` arguments, in order.
  template <class... Args>
  static auto typed_data(const Args&... args) {
    std::array<void*, (std::size_t(typed::typed_argument<Args>) + ... + 0)> data{};
    std::size_t i = 0;
    (
        [&](const auto& a) {
          if constexpr (typed::fixed_value<decltype(a)>) data[i++] = const_cast<void*>(static_cast<const void*>(a.data()));
        }(args),
        ...);
    return data;
  }

  template <class R, class... Args>
  std::unique_ptr<typed::trace<R>> trace_typed(const Args&... args) {
    // The typed arguments' names, for the trace; the C++ values' text, for its signature.
    std::vector<std::string> typed_names, bound_text;
    std::size_t position = 0;
    (
        [&](const auto& a) {
          if constexpr (typed::typed_argument<decltype(a)>) {
            typed_names.push_back(state_->arg_name(position));
          } else {
            std::ostringstream os;
            os << a;
            bound_text.resize(sizeof...(Args));
            bound_text[position] = os.str();
          }
          ++position;
        }(args),
        ...);
    auto t = typed::trace_now<R>(fn_, std::move(typed_names), args...);
    t->signature = {&typed::signature_type_of<R, Args...>, std::move(bound_text)};
    state_->add_signature(t->signature);
    return t;
  }

  F fn_;
  std::shared_ptr<detail::function_state> state_;
};

template <class F>
function(F) -> function<F>;
template <class F>
function(F, function_options) -> function<F>;

}  // namespace kiln

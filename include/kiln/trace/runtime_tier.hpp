#pragma once
/// \file
/// kiln::function's runtime tier: calls with kiln::tensor
/// arguments traced into a graph once per input signature, and
/// `kiln::concrete_function`, one such trace.
///
/// Its parts, one concern each: kiln/trace/outputs.hpp (what a callable returns),
/// kiln/trace/concrete_state.hpp (one trace), kiln/trace/function_state.hpp (a
/// function's traces: dispatch and retracing) and kiln/trace/concrete_function.hpp; this
/// file holds the call path.

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/trace/concrete_function.hpp"
#include "kiln/trace/concrete_state.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/function_state.hpp"
#include "kiln/trace/outputs.hpp"
#include "kiln/trace/signature.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {

namespace config {
namespace detail {
KILN_LIBRARY_INLINE std::atomic<bool>& eager_functions();
}  // namespace detail
/// When on, every kiln::function calls its callable directly on eager tensors
/// (for debugging: C++ side effects then happen at every call).
/// \code kiln::config::run_functions_eagerly(true); \endcode
KILN_LIBRARY_INLINE void run_functions_eagerly(bool on);
/// Whether kiln::function calls run their callables eagerly.
KILN_LIBRARY_INLINE bool functions_run_eagerly();
}  // namespace config

namespace detail {

/// Re-raises a kiln error from tracing or running a function with its name in front.
[[noreturn]] inline void rethrow_with_function_name(const std::string& fn) { rethrow_with_prefix("in " + fn + ": "); }

}  // namespace detail

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

#if KILN_DEFINE_LIBRARY
namespace kiln::config::detail {

KILN_LIBRARY_INLINE std::atomic<bool>& eager_functions() {
  static std::atomic<bool> flag{false};
  return flag;
}

}  // namespace kiln::config::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void run_functions_eagerly(bool on) { detail::eager_functions() = on; }

KILN_LIBRARY_INLINE bool functions_run_eagerly() { return detail::eager_functions(); }

}  // namespace kiln::config
#endif  // KILN_DEFINE_LIBRARY

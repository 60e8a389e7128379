#pragma once
/// \file
/// kiln::function's calls in the compile-time tier: with `fixed` arguments (and C++
/// values), each signature type traced once into a typed trace (kiln/typed/trace.hpp),
/// run at every later call. kiln::function (kiln/trace/function.hpp) hands such calls
/// here; kiln/fixed.hpp and kiln/kiln.hpp include this header.

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/spec.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/typed/trace.hpp"

namespace kiln {

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

namespace detail {

template <class F>
struct typed_tier {
  /// Whether a call with `Args` is this tier's.
  template <class... Args>
  static constexpr bool calls = typed::typed_call<Args...>;
  /// Whether a get_concrete_function with `Args` asks for a typed trace.
  template <class... Args>
  static constexpr bool requests = typed::typed_request<Args...>;

  /// A call with `fixed` arguments (and C++ values): traced at its first call with
  /// these C++ values, then the trace runs.
  template <class... Args>
  static auto call(function<F>& f, const Args&... args) {
    if constexpr (!std::is_invocable_v<F&, typed::traced_t<Args>&...>) {
      callable_does_not_accept<Args...>();
    } else {
      const auto* t = trace_for(f, args...);
      if constexpr (std::is_void_v<std::invoke_result_t<F&, typed::traced_t<Args>&...>>)
        t->run(data(args...));
      else
        return t->run(data(args...));
    }
  }

  /// The typed::concrete_function of these arguments (`fixed` values or
  /// kiln::spec<T, Dims...>, and C++ values), traced now if it is not yet.
  template <class... Args>
  static auto get_concrete_function(function<F>& f, const Args&... args) {
    if constexpr (!std::is_invocable_v<F&, typed::traced_t<Args>&...>) {
      callable_does_not_accept<Args...>();
    } else {
      using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
      using concrete = typename typed::concrete_for<R, Args...>::type;
      return concrete(trace_for(f, args...), f.state_);
    }
  }

 private:
  // The function's typed traces, made by its first typed call.
  static typed::trace_table& traces(function_state& state) {
    if (typed::trace_table* t = state.typed.load(std::memory_order_acquire)) return *t;
    std::lock_guard lock(state.mutex);
    if (!state.typed_owner) {
      state.typed_owner = {new typed::trace_table, [](typed::trace_table* t) { delete t; }};
      state.typed.store(state.typed_owner.get(), std::memory_order_release);
    }
    return *state.typed_owner;
  }

  // The typed trace of these arguments (`fixed` values or specs, and C++ values): the
  // slot of their signature type, found by its index, then the trace of these C++
  // values in it, traced now if there is none.
  template <class... Args>
  static auto trace_for(function<F>& f, const Args&... args) {
    using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
    using entry = typed::signature_traces<R, typed::values_of<Args...>>;
    typed::trace_table& table = traces(*f.state_);
    entry& e = table.template entry<std::tuple<typename typed::fixed_of<std::remove_cvref_t<Args>>::type...>, entry>();
    const typed::trace<R>* t = nullptr;
    if constexpr (std::tuple_size_v<typed::values_of<Args...>> == 0) {
      t = e.only.load(std::memory_order_acquire);
      if (!t) {
        std::lock_guard tracing(table.tracing);
        if (!(t = e.only.load(std::memory_order_acquire))) {
          e.only_owner = trace<R>(f, args...);
          e.only.store(t = e.only_owner.get(), std::memory_order_release);
        }
      }
    } else {
      const auto key = typed::values(args...);
      std::lock_guard tracing(table.tracing);
      std::lock_guard lock(e.mutex);
      for (const auto& [k, known] : e.by_value)
        if (k == key) t = known.get();
      if (!t) t = e.by_value.emplace_back(key, trace<R>(f, args...)).second.get();
    }
    return t;
  }

  // The data of a typed call's `fixed` arguments, in order.
  template <class... Args>
  static auto data(const Args&... args) {
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
  static std::unique_ptr<typed::trace<R>> trace(function<F>& f, const Args&... args) {
    // The typed arguments' names, for the trace; the C++ values' text, for its signature.
    std::vector<std::string> typed_names, bound_text;
    std::size_t position = 0;
    (
        [&](const auto& a) {
          if constexpr (typed::typed_argument<decltype(a)>) {
            typed_names.push_back(f.state_->arg_name(position));
          } else {
            std::ostringstream os;
            os << a;
            bound_text.resize(sizeof...(Args));
            bound_text[position] = os.str();
          }
          ++position;
        }(args),
        ...);
    auto t = typed::trace_now<R>(f.fn_, std::move(typed_names), args...);
    t->signature = {&typed::signature_type_of<R, Args...>, std::move(bound_text)};
    f.state_->add_signature(t->signature, &typed::written<>);
    return t;
  }
};

}  // namespace detail

}  // namespace kiln

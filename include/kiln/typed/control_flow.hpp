#pragma once
/// \file
/// kiln::cond, kiln::while_loop and kiln::for_range on typed values. In a typed trace a
/// branch, a loop's condition and its body are each traced once, into step lists of
/// their own that one step of the trace runs: the branch the condition picks, or the
/// body while the condition holds. Loop variables are slots of the frame; the body's
/// next values are written to slots of their own and then copied into the loop
/// variables, so that each is computed from the values the iteration started with.
/// That both branches, or the body, keep every value's element type and dims is
/// checked at compile time. On `fixed` values (outside a function) they run at once,
/// as C++ control flow.

#include <array>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/results.hpp"
#include "kiln/ops/control_flow.hpp"
#include "kiln/typed/unfused_ops.hpp"
#include "kiln/typed/trace.hpp"

namespace kiln {
namespace typed {

/// The `fixed` type of a typed operand's value.
template <class X>
using value_of = fixed_t<typename std::remove_cvref_t<X>::value_type, typename std::remove_cvref_t<X>::dims_type>;

template <class R>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

/// A branch's or body's result as a tuple: one value, or a std::tuple of them.
template <class R>
auto as_tuple(R&& r) {
  if constexpr (is_tuple<std::remove_cvref_t<R>>::value)
    return std::forward<R>(r);
  else
    return std::tuple<std::remove_cvref_t<R>>(std::forward<R>(r));
}

/// A tuple of one value as the value, of several as the tuple.
template <class Tuple>
auto unwrap(Tuple&& t) {
  if constexpr (std::tuple_size_v<std::remove_cvref_t<Tuple>> == 1)
    return std::get<0>(std::forward<Tuple>(t));
  else
    return std::forward<Tuple>(t);
}

/// Whether the values of tuple types `A` and `B` have the same element types and dims.
template <class A, class B>
struct same_values : std::false_type {};
template <class... A, class... B>
  requires(sizeof...(A) == sizeof...(B))
struct same_values<std::tuple<A...>, std::tuple<B...>>
    : std::bool_constant<(std::is_same_v<value_of<A>, value_of<B>> && ...)> {};

/// Whether a tuple type holds a symbolic value or expression.
template <class Tuple>
struct holds_lazy : std::false_type {};
template <class... T>
struct holds_lazy<std::tuple<T...>> : std::bool_constant<(lazy<T> || ...)> {};

/// Whether typed operand `P` is a bool scalar.
template <class P>
inline constexpr bool bool_scalar =
    std::is_same_v<typename std::remove_cvref_t<P>::value_type, bool> && std::remove_cvref_t<P>::dims_type::size == 1;

/// Whether a typed loop body's result stops early (kiln::break_if on a typed condition:
/// kiln/core/results.hpp's break_result).
template <class R>
struct is_break : std::false_type {};
template <class Tuple, class P>
struct is_break<break_result<Tuple, P>> : std::bool_constant<operand<P>> {};
/// Whether a body's result stops on a symbolic condition.
template <class R>
inline constexpr bool stops_lazily = false;
template <class Tuple, class P>
inline constexpr bool stops_lazily<break_result<Tuple, P>> = lazy<P>;

/// A loop body's next values as a tuple, with or without kiln::break_if.
template <class R>
auto next_values(R&& r) {
  if constexpr (is_break<std::remove_cvref_t<R>>::value)
    return as_tuple(std::forward<R>(r).next);
  else
    return as_tuple(std::forward<R>(r));
}

KILN_LIBRARY_INLINE void run_steps(const std::vector<step>& steps, frame f);

/// Traces `fn()` with the steps it records going to `steps`.
template <class Fn>
decltype(auto) trace_into(std::vector<step>& steps, Fn&& fn) {
  recorder& r = current_recorder();
  struct restore {
    recorder& r;
    std::vector<step>* previous;
    ~restore() { r.target = previous; }
  } guard{r, std::exchange(r.target, &steps)};
  return fn();
}

/// A symbol of its own slot holding the value of typed operand `x` (a copy).
template <class X>
symbol_for<value_of<X>> fresh_symbol(const X& x) {
  return symbol_for<value_of<X>>(record(expression_of<void, false>(x)));
}

/// A `cond` step: the steps of the branch that slot `pred` picks, which write the
/// slots `results`.
struct cond_step {
  int pred;
  std::vector<step> then_steps, else_steps;
  std::vector<int> results;
  KILN_LIBRARY_INLINE static void run(const void* data, frame f);
  KILN_LIBRARY_INLINE static void describe(const void* data, description_sink& sink);
};

/// A loop step: the condition's steps, then while slot `pred` holds the body's, each
/// iteration ending with the copies of next values into the loop variables, unless
/// slot `stop` (kiln::break_if's condition, when the body has one) holds.
struct loop_step {
  struct copy {
    int from, to;
    std::size_t bytes;
  };
  std::vector<step> cond_steps, body_steps;
  int pred = -1, stop = -1;
  std::vector<copy> copies;
  KILN_LIBRARY_INLINE static void run(const void* data, frame f);
  KILN_LIBRARY_INLINE static void describe(const void* data, description_sink& sink);
};

/// Writes the values of `values` to slots `slots`, in the steps being recorded.
template <class Tuple, std::size_t N>
void record_values(const Tuple& values, const std::array<int, N>& slots) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (record_into(expression_of<void, false>(std::get<I>(values)), slots[I]), ...);
  }(std::make_index_sequence<N>());
}

/// while_loop and for_range on typed values; `ForRange` picks the messages.
template <bool ForRange, class Cond, class Body, class... Vars>
auto loop(Cond& cond_fn, Body& body_fn, const Vars&... vars) {
  using var_values = std::tuple<value_of<Vars>...>;
  using pred_t = std::invoke_result_t<Cond&, const value_of<Vars>&...>;
  using body_t = std::invoke_result_t<Body&, const value_of<Vars>&...>;
  using next_t = decltype(next_values(std::declval<body_t>()));
  constexpr bool breaks = is_break<body_t>::value;
  static_assert(bool_scalar<pred_t>, "kiln::while_loop: the condition must give a bool scalar");
  if constexpr (ForRange)
    static_assert(same_values<var_values, next_t>::value,
                  "kiln::for_range: the body must give each loop variable its element type and dims");
  else
    static_assert(same_values<var_values, next_t>::value,
                  "kiln::while_loop: the body must give each loop variable its element type and dims");
  if constexpr (!bool_scalar<pred_t> || !same_values<var_values, next_t>::value) {
    return rule_error{};
  } else if constexpr (eager<Vars...> && !lazy<pred_t> && !holds_lazy<next_t>::value && !stops_lazily<body_t>) {
    // `fixed` values, and a condition and body that read no symbolic value: now.
    var_values v{vars...};
    while (std::apply(cond_fn, v).data()[0]) {
      auto r = std::apply(body_fn, v);
      if constexpr (breaks) {
        if (r.stop.data()[0]) break;
      }
      v = var_values(next_values(std::move(r)));
    }
    return unwrap(std::move(v));
  } else {
    std::tuple<symbol_for<value_of<Vars>>...> loop_vars{fresh_symbol(vars)...};
    auto data = std::make_unique<loop_step>();
    trace_into(data->cond_steps, [&] { data->pred = slot_of(std::apply(cond_fn, loop_vars)); });
    trace_into(data->body_steps, [&] {
      auto r = std::apply(body_fn, loop_vars);
      if constexpr (breaks) data->stop = slot_of(r.stop);
      const auto next = next_values(std::move(r));
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (data->copies.push_back({fresh_symbol(std::get<I>(next)).slot(), std::get<I>(loop_vars).slot(),
                                 bytes_of<value_of<Vars>>}),
         ...);
      }(std::index_sequence_for<Vars...>());
    });
    current_recorder().push(step_of(std::move(data)));
    return unwrap(std::move(loop_vars));
  }
}

}  // namespace typed

/// kiln::cond on a typed bool scalar: on a `fixed` value it runs the branch it picks;
/// in a typed trace both branches are traced, must give values of the same element
/// types and dims (checked at compile time), and the one the condition picks runs.
/// \code
/// kiln::function f([](const auto& x) { return kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x; }, [&] { return -x; }); });
/// f(kiln::fixed<float, 3>::ones());  // [1 1 1]
/// \endcode
template <typed::operand P, class Then, class Else>
auto cond(const P& pred, Then then_fn, Else else_fn) {
  using then_t = decltype(typed::as_tuple(then_fn()));
  using else_t = decltype(typed::as_tuple(else_fn()));
  static_assert(typed::bool_scalar<P>, "kiln::cond: the condition must be a bool scalar");
  static_assert(typed::same_values<then_t, else_t>::value,
                "kiln::cond: both branches must give values of the same element types and dims");
  if constexpr (!typed::bool_scalar<P> || !typed::same_values<then_t, else_t>::value) {
    return typed::rule_error{};
  } else if constexpr (typed::eager<P> && !typed::holds_lazy<then_t>::value && !typed::holds_lazy<else_t>::value) {
    using result = decltype(typed::unwrap(std::declval<then_t>()));
    return pred.data()[0] ? result(typed::unwrap(typed::as_tuple(then_fn()))) : result(typed::unwrap(typed::as_tuple(else_fn())));
  } else {
    typed::recorder& r = typed::current_recorder();
    auto data = std::make_unique<typed::cond_step>();
    data->pred = typed::slot_of(pred);
    std::array<int, std::tuple_size_v<then_t>> slots{};
    auto results = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{typed::symbol_for<typed::value_of<std::tuple_element_t<I, then_t>>>(
          slots[I] = r.add_slot(typed::bytes_of<typed::value_of<std::tuple_element_t<I, then_t>>>))...};
    }(std::make_index_sequence<std::tuple_size_v<then_t>>());
    typed::trace_into(data->then_steps, [&] { typed::record_values(typed::as_tuple(then_fn()), slots); });
    typed::trace_into(data->else_steps, [&] { typed::record_values(typed::as_tuple(else_fn()), slots); });
    data->results.assign(slots.begin(), slots.end());
    r.push(typed::step_of(std::move(data)));
    return typed::unwrap(std::move(results));
  }
}

/// kiln::break_if on a typed bool scalar, ending the body of a typed while_loop or
/// for_range: when `pred` holds the loop stops, keeping the values this iteration
/// started with; otherwise it goes on with `next...`.
/// \code auto i = kiln::while_loop([](const auto& i) { return i < 10; }, [](const auto& i) { return kiln::break_if(i == 3, i + 1); }, kiln::fixed<int>(0)); \endcode
template <typed::operand P, class... Next>
auto break_if(const P& pred, const Next&... next) {
  static_assert(typed::bool_scalar<P>, "kiln::break_if: the condition must be a bool scalar");
  return break_result<std::tuple<Next...>, P>{pred, std::tuple<Next...>(next...)};
}

/// kiln::while_loop on typed loop variables: on `fixed` values a C++ loop; in a typed
/// trace the condition and the body are traced once, and the body must give each
/// variable its element type and dims (checked at compile time).
/// \code
/// kiln::function f([](const auto& x0) {
///   return kiln::while_loop([](const auto& x) { return kiln::reduce_sum(x) > 1.f; }, [](const auto& x) { return kiln::tanh(x); }, x0);
/// });
/// f(kiln::fixed<float, 3>::ones());
/// \endcode
template <class Cond, class Body, class... Vars>
  requires detail::plain_loop_variables<Vars...> && (sizeof...(Vars) > 0) && (typed::operand<Vars> && ...)
auto while_loop(Cond cond_fn, Body body_fn, const Vars&... vars) {
  return typed::loop<false>(cond_fn, body_fn, vars...);
}

/// kiln::for_range on typed loop variables, `i` an int32 scalar of the same tier.
/// \code auto total = kiln::for_range(10, [](const auto& i, const auto& t) { return t + kiln::cast<float>(i); }, kiln::fixed<float>(0.f)); \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body> && detail::plain_loop_variables<Vars...> &&
           (sizeof...(Vars) > 0) && (typed::operand<Vars> && ...)
auto for_range(const Limit& limit, Body body_fn, const Vars&... vars) {
  static_assert(std::is_integral_v<Limit>, "kiln::for_range: on typed loop variables the limit is a C++ integer");
  const std::int32_t n = std::int32_t(limit);
  auto cond_fn = [n](const auto& i, const auto&...) { return i < n; };
  auto body = [&body_fn](const auto& i, const auto&... v) {
    auto r = body_fn(i, v...);
    auto next = std::tuple_cat(std::tuple(i + 1), typed::next_values(std::move(r)));
    if constexpr (typed::is_break<decltype(r)>::value)
      return break_result<decltype(next), decltype(r.stop)>{r.stop, std::move(next)};
    else
      return next;
  };
  auto out = typed::as_tuple(typed::loop<true>(cond_fn, body, fixed<std::int32_t>(0), vars...));
  return typed::unwrap(std::apply([](auto&&, auto&&... rest) { return std::tuple{std::move(rest)...}; }, std::move(out)));
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE void run_steps(const std::vector<step>& steps, frame f) {
  for (const step& s : steps) s.run(s.data.get(), f);
}

KILN_LIBRARY_INLINE void cond_step::run(const void* data, frame f) {
  const auto& c = *static_cast<const cond_step*>(data);
  run_steps(*static_cast<const bool*>(f[c.pred]) ? c.then_steps : c.else_steps, f);
}

KILN_LIBRARY_INLINE void cond_step::describe(const void* data, description_sink& sink) {
  sink.control_flow(*static_cast<const cond_step*>(data));
}

KILN_LIBRARY_INLINE void loop_step::run(const void* data, frame f) {
  const auto& l = *static_cast<const loop_step*>(data);
  for (;;) {
    run_steps(l.cond_steps, f);
    if (!*static_cast<const bool*>(f[l.pred])) return;
    run_steps(l.body_steps, f);
    if (l.stop >= 0 && *static_cast<const bool*>(f[l.stop])) return;
    for (const copy& c : l.copies) std::memcpy(f[c.to], f[c.from], c.bytes);
  }
}

KILN_LIBRARY_INLINE void loop_step::describe(const void* data, description_sink& sink) {
  sink.control_flow(*static_cast<const loop_step*>(data));
}

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY

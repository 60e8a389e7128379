#pragma once
/// \file
/// kiln::for_range: `for i in range(start, limit, delta)` as a kiln::while_loop over a
/// counter of kiln's own. Part of kiln/trace/control_flow.hpp.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kiln/core/results.hpp"
#include "kiln/ops/control_flow.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/trace/loop_state.hpp"
#include "kiln/trace/while_loop.hpp"

namespace kiln {
namespace detail {

/// The results of a loop whose first variable was a counter of kiln's own, without it.
template <std::size_t UserVars, class Out>
auto without_counter(Out&& out) {
  if constexpr (UserVars == 0) {
    return;
  } else if constexpr (UserVars == 1) {
    return std::get<1>(std::forward<Out>(out));
  } else {
    return std::apply([](auto&&, auto&&... rest) { return std::tuple{std::move(rest)...}; }, std::forward<Out>(out));
  }
}

/// `body_fn`'s result `r` (one value, a tuple or a break_result) with `counter` in front.
template <class R>
auto with_counter(const tensor& counter, R&& r) {
  if constexpr (is_break_result<std::remove_cvref_t<R>>::value) {
    auto next = std::tuple_cat(std::tuple{counter}, std::move(r.next));
    return break_result<decltype(next)>{r.stop, std::move(next)};
  } else {
    return std::tuple_cat(std::tuple{counter}, std::tuple<std::remove_cvref_t<R>>(std::forward<R>(r)));
  }
}

inline tensor index_tensor(const tensor& t) { return t; }
template <std::integral T>
tensor index_tensor(T v) {
  return kiln::constant(std::int32_t(v));
}

/// kiln::for_range as a while loop over a counter `k < n` with `i = start + k * delta`.
template <class Body, class... Vars>
auto counted_loop(const tensor& start, const tensor& limit, const tensor& delta, Body& body_fn, const loop_options& options,
                  const Vars&... vars) {
  // Python's range length: ceil((limit - start) / delta), at least 0.
  const tensor trips = counter_op<ops::maximum>(
      apply_bookkeeping(ops::negate{}, counter_op<ops::floordiv>(start - limit, delta)), 0);
  auto cond_fn = [&](const tensor& k, const auto&...) { return k < trips; };
  auto body = [&](const tensor& k, const auto&... v) {
    const tensor i = start + k * delta;
    using R = std::invoke_result_t<Body&, const tensor&, decltype(v)...>;
    if constexpr (std::is_void_v<R>) {
      body_fn(i, v...);
      return k + 1;
    } else {
      return with_counter(k + 1, body_fn(i, v...));
    }
  };
  return without_counter<sizeof...(Vars)>(
      detail::while_loop(std::size_t(1), options, cond_fn, body, kiln::constant(std::int32_t(0)), vars...));
}

}  // namespace detail

/// kiln::for_range with `options`: shape invariants let loop variables change shape.
/// \code
/// kiln::tensor x = kiln::for_range(
///     5, [](const kiln::tensor&, const kiln::tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));  // (5, 10)
/// \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body>
auto for_range(const Limit& limit, Body body_fn, const loop_options& options, const Vars&... vars) {
  return detail::counted_loop(kiln::constant(std::int32_t(0)), detail::index_tensor(limit), kiln::constant(std::int32_t(1)),
                              body_fn, options, vars...);
}
/// A loop over `i = 0, 1, ..., limit - 1` (an int32 scalar tensor): a `while` node
/// in a graph whatever `limit` is (a plain C++ loop in the callable unrolls at trace
/// time instead). `body_fn(i, vars...)` gives the next values; with no loop
/// variables it returns nothing.
/// \code
/// kiln::for_range(3, [](const kiln::tensor& i) { kiln::print(i); });  // 0, 1, 2
/// kiln::tensor total = kiln::for_range(4, [](auto i, auto t) { return t + i; }, kiln::constant(0));  // 6
/// \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body> && detail::plain_loop_variables<Vars...>
auto for_range(const Limit& limit, Body body_fn, const Vars&... vars) {
  return for_range(limit, std::move(body_fn), loop_options{}, vars...);
}
/// `for i in range(start, limit, delta)` with `options` (see kiln::loop_options).
/// \code
/// kiln::tensor evens = kiln::for_range(0, 10, 2, [](const kiln::tensor& i, const kiln::tensor& x) {
///   return kiln::concat({x, kiln::reshape(i, {1})}, 0);
/// }, kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none}}}, kiln::zeros({0}, kiln::int32));  // [0 2 4 6 8]
/// \endcode
template <class Start, class Limit, class Delta, class Body, class... Vars>
  requires detail::loop_index<Start> && detail::loop_index<Limit> && detail::loop_index<Delta>
auto for_range(const Start& start, const Limit& limit, const Delta& delta, Body body_fn, const loop_options& options,
               const Vars&... vars) {
  return detail::counted_loop(detail::index_tensor(start), detail::index_tensor(limit), detail::index_tensor(delta), body_fn,
                              options, vars...);
}

/// `for i in range(start, limit, delta)` as a graph loop; a zero `delta` raises
/// kiln::invalid_argument_error.
/// \code kiln::for_range(10, 0, -2, [](const kiln::tensor& i) { kiln::print(i); });  // 10 8 6 4 2 \endcode
template <class Start, class Limit, class Delta, class Body, class... Vars>
  requires detail::loop_index<Start> && detail::loop_index<Limit> && detail::loop_index<Delta> &&
           detail::plain_loop_variables<Vars...>
auto for_range(const Start& start, const Limit& limit, const Delta& delta, Body body_fn, const Vars&... vars) {
  return for_range(start, limit, delta, std::move(body_fn), loop_options{}, vars...);
}

}  // namespace kiln

#pragma once
/// \file
/// The state of a kiln::while_loop or kiln::for_range: kiln::break_if, kiln::loop_options,
/// and the helpers that hold loop variables as tensors, give them their shape invariants
/// and specs, check what a body returns against them, settle the element shape of a
/// tensor_array first written in a body, and build the next state. Part of
/// kiln/trace/control_flow.hpp.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/results.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/ops/tensor_array.hpp"
#include "kiln/trace/outputs.hpp"
#include "kiln/trace/subgraph.hpp"

namespace kiln {

/// Ends a loop body: when `pred` holds, the loop stops and keeps the values this
/// iteration started with (an `if (pred) break;` at the top of the body); otherwise
/// it goes on with `next...`.
/// \code
/// kiln::while_loop([](auto i) { return i < 10; },
///                  [](auto i) { return kiln::break_if(i == 3, i + 1); }, kiln::constant(0));  // 3
/// \endcode
template <class P, class... Next>
  requires(std::convertible_to<const P&, tensor> && !typed::operand<P>)  // typed conditions: typed/control_flow.hpp
break_result<std::tuple<std::decay_t<Next>...>> break_if(const P& pred, Next&&... next) {
  return {tensor(pred), std::tuple<std::decay_t<Next>...>(std::forward<Next>(next)...)};
}

/// Options of kiln::while_loop and kiln::for_range, given just before the loop
/// variables.
/// \code
/// // Rows appended to x: its first dim grows, so the loop gives x a shape invariant.
/// kiln::tensor x = kiln::for_range(
///     5, [](const kiln::tensor&, const kiln::tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));  // (5, 10)
/// \endcode
struct loop_options {
  /// The shapes the loop variables may take from one iteration to the next
  /// (TensorFlow's shape_invariants): one entry per tensor of the loop variables, in
  /// order (a tuple or vector variable has one per tensor in it); entries left out
  /// at the end, and std::nullopt, keep a variable's shape exact. A `kiln::none`
  /// dim, or kiln::unknown_rank, may change. An invariant must accept the value its
  /// variable enters with and every value the body gives it, else kiln::value_error;
  /// the loop's results have the invariant's shape. A tensor_array takes none: with
  /// dynamic_size, the loop lets its size change by itself.
  std::vector<std::optional<shape>> shape_invariants = {};
  /// At most this many iterations run (TensorFlow's maximum_iterations): the loop
  /// stops when its condition fails or the count is reached, whichever comes first.
  /// A bound on a loop that might not end; negative counts raise kiln::value_error.
  std::optional<std::int64_t> maximum_iterations = std::nullopt;
};

namespace detail {

template <class T>
struct is_break_result : std::false_type {};
template <class T>
struct is_break_result<break_result<T>> : std::true_type {};

/// Loop variables `vars` as one value: the value itself for one, a tuple for several.
template <class... Vars>
auto loop_result(std::tuple<Vars...>&& vars) {
  if constexpr (sizeof...(Vars) == 1)
    return std::move(std::get<0>(vars));
  else
    return std::move(vars);
}

/// Appends, per leaf of `s`, the tensor_array whose elements it holds, or nullptr.
template <class S>
void array_leaves(const S& s, std::vector<const tensor_array*>& out) {
  using U = std::remove_cvref_t<S>;
  if constexpr (std::is_same_v<U, tensor_array>)
    out.push_back(&s);
  else if constexpr (is_tuple_like<U>::value || is_vector<U>::value)
    for_each_element(s, [&](const auto& e) { array_leaves(e, out); });
  else
    out.push_back(nullptr);
}
template <class S>
std::vector<const tensor_array*> array_leaves(const S& s) {
  std::vector<const tensor_array*> out;
  array_leaves(s, out);
  return out;
}

/// `s` with its first dim `kiln::none`: the elements of an array that may grow.
template <class = void>
shape any_rows(shape s) {
  s[0] = none;
  return s;
}

/// The shape invariant of each leaf of a loop state whose leaves hold `arrays` (a
/// tensor_array or null each) and whose first `hidden` leaves are kiln's own: those
/// `options` gives, and for a written tensor_array with dynamic_size its elements
/// with any number of rows. Raises kiln::value_error for more invariants than
/// variables, and for an invariant given to a tensor_array.
template <class = void>
std::vector<std::optional<shape>> loop_invariants(std::span<const tensor_array* const> arrays,
                                                  const loop_options& options, std::size_t hidden) {
  const auto& given = options.shape_invariants;
  if (given.size() > arrays.size() - hidden)
    throw value_error("while_loop: " + std::to_string(given.size()) + " shape invariants for " +
                      std::to_string(arrays.size() - hidden) + " loop variables");
  std::vector<std::optional<shape>> out(arrays.size());
  for (std::size_t k = hidden; k < arrays.size(); ++k) {
    const tensor_array* array = arrays[k];
    if (k - hidden < given.size() && given[k - hidden]) {
      if (array)
        throw value_error("while_loop: loop variable " + std::to_string(k - hidden) +
                          " is a tensor_array, which takes no shape invariant (with dynamic_size its size may change)");
      out[k] = given[k - hidden];
    } else if (array && array->dynamic_size() && !array->unwritten()) {
      out[k] = any_rows(array->elements().shape());
    }
  }
  return out;
}

/// The specs loop variables keep: the specs of the values they enter with, whose
/// shapes `invariants` relax. Raises kiln::value_error for an invariant that does
/// not accept the value its variable enters with.
template <class = void>
std::vector<value_spec> loop_specs(std::span<const tensor> entering, std::span<const std::optional<shape>> invariants,
                                   std::size_t hidden) {
  std::vector<value_spec> specs = specs_of(entering);
  for (std::size_t k = 0; k < specs.size(); ++k) {
    if (!invariants[k]) continue;
    if (!invariants[k]->accepts(specs[k].second))
      throw value_error("while_loop: loop variable " + std::to_string(k - hidden) + " enters the loop as " +
                        spec_text(specs[k]) + ", which its shape invariant " + invariants[k]->str() + " does not accept");
    specs[k].second = *invariants[k];
  }
  return specs;
}

/// Raises kiln::value_error unless a body's results `got` fit the loop variables'
/// specs: the same dtype, and a shape that the spec, exact or relaxed by the
/// variable's shape invariant, accepts. The first `hidden` loop variables are kiln's
/// own (for_range's counter): messages number the caller's variables from 0.
template <class = void>
void check_loop_specs(std::span<const value_spec> got, std::span<const value_spec> expected,
                      std::span<const std::optional<shape>> invariants, std::size_t hidden,
                      std::string_view loop = "while_loop") {
  if (got.size() != expected.size())
    throw value_error(std::string(loop) + ": the body returns " + std::to_string(got.size() - hidden) + " tensors for " +
                      std::to_string(expected.size() - hidden) + " loop variables");
  for (std::size_t k = 0; k < expected.size(); ++k) {
    if (got[k].first == expected[k].first && expected[k].second.accepts(got[k].second)) continue;
    const std::string variable = std::string(loop) + ": loop variable " + std::to_string(k - hidden);
    if (got[k].first == expected[k].first && k < invariants.size() && invariants[k])
      throw value_error(variable + " has the shape invariant " + invariants[k]->str() + " but is " + spec_text(got[k]) +
                        " after one iteration");
    std::string message = variable + " enters the loop as " + spec_text(expected[k]) + " but is " + spec_text(got[k]) +
                          " after one iteration; a loop variable must keep its dtype and shape";
    if (got[k].first == expected[k].first)
      message += "; to let its shape change, give the loop a shape invariant with kiln::none dims "
                 "(kiln::loop_options{.shape_invariants = ...})";
    throw value_error(message);
  }
}

/// Takes the spec a body gave the unwritten tensor arrays `arrays` (their first
/// write) as their spec from now on, with any number of rows for one with
/// dynamic_size; returns the leaves that changed.
template <class = void>
std::vector<std::size_t> settle_arrays(std::span<const tensor_array* const> arrays,
                                       std::vector<value_spec>& specs, std::span<const value_spec> got) {
  std::vector<std::size_t> settled;
  for (std::size_t k = 0; k < arrays.size() && k < got.size(); ++k) {
    const tensor_array* array = arrays[k];
    if (!array || !array->unwritten() || got[k].first != specs[k].first || got[k] == specs[k]) continue;
    specs[k] = {got[k].first, array->dynamic_size() ? any_rows(got[k].second) : got[k].second};
    settled.push_back(k);
  }
  return settled;
}

/// The next loop state: `current`'s structure with the leaves of what a body returned.
template <class State>
State next_state(const State& current, std::span<const tensor> returned, std::vector<value_spec>& expected,
                 std::span<const std::optional<shape>> invariants, std::size_t hidden,
                 std::string_view loop = "while_loop") {
  const std::vector<value_spec> got = specs_of(returned);
  settle_arrays(array_leaves(current), expected, got);
  check_loop_specs(got, expected, invariants, hidden, loop);
  const tensor* next = returned.data();
  return rebuild_output(current, next);
}

}  // namespace detail
}  // namespace kiln

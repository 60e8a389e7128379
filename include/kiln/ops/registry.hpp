#pragma once
/// \file
/// The op registry: every op type, one row each, in one list. Graphs store an op as
/// a `std::variant` over this list, and the cross-backend suite walks it; the count
/// `static_assert` makes adding an op without its row (or the reverse) a compile error.

#include <cstddef>
#include <string_view>
#include <variant>

#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/ops/reduction.hpp"

namespace kiln::ops {

template <class... Ops>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ops);
};

template <class... Lists>
struct concat_lists;
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};

using elementwise_ops =
    type_list<negate, abs, exp, log, sqrt, square, tanh, sigmoid, relu, logical_not, cast,                    //
              add, subtract, multiply, divide, floordiv, floormod, pow, maximum, minimum,                      //
              less, less_equal, greater, greater_equal, equal, not_equal, logical_and, logical_or, where>;
static_assert(elementwise_ops::size == 29, "an elementwise op was added or removed: update the list and the tests");

using shape_ops = type_list<reshape, transpose, concat, stack, gather, index, slice, shape_of>;
static_assert(shape_ops::size == 8, "a shape op was added or removed: update the list and the tests");

using reduction_ops = type_list<reduce_sum, reduce_mean, reduce_max, reduce_min, argmax>;
static_assert(reduction_ops::size == 5, "a reduction op was added or removed: update the list and the tests");

using linalg_ops = type_list<matmul, conv2d>;
static_assert(linalg_ops::size == 2, "a linalg op was added or removed: update the list and the tests");

/// Every op kiln defines.
using all_ops = typename concat_lists<elementwise_ops, shape_ops, reduction_ops, linalg_ops>::type;

}  // namespace kiln::ops

#pragma once
/// \file
/// The op registry: every op type, one row each, in one Boost.Mp11 list per family.
/// Graphs store an op as an `ops::any_op` over these lists, and the cross-backend suite
/// walks them; calling an op without its row stops at `ops::registered`'s `static_assert`.

#include <boost/mp11/list.hpp>

#include <string_view>
#include <type_traits>

#include "kiln/ops/activations.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/pooling.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/ops/reduction.hpp"

namespace kiln::ops {

// The op lists are X-macros, `F(op)` once per op type of kiln::ops, so that code
// which must name every op (kiln/separate_compilation.hpp declares and instantiates each op's
// kernels) expands them instead of repeating them.

/// The elementwise ops with one input (`cast` included).
#define KILN_UNARY_OPS(F) \
  F(negate) F(abs) F(exp) F(log) F(sqrt) F(square) F(tanh) F(sigmoid) F(relu) F(logical_not) F(cast) \
  F(erf) F(gelu) F(softplus) F(silu) F(elu) F(leaky_relu)
/// The elementwise ops with two or three inputs.
#define KILN_BINARY_OPS(F)                                                                                       \
  F(add) F(subtract) F(multiply) F(divide) F(floordiv) F(floormod) F(pow) F(maximum) F(minimum) F(less)        \
  F(less_equal) F(greater) F(greater_equal) F(equal) F(not_equal) F(logical_and) F(logical_or) F(where) \
  F(relu_grad)
#define KILN_SHAPE_OPS(F)                                                                                        \
  F(reshape) F(transpose) F(concat) F(stack) F(gather) F(unsorted_segment_sum) F(index) F(slice) F(shape_of)     \
  F(set_item) F(pad_rows) F(crop_or_pad)
#define KILN_REDUCTION_OPS(F) F(reduce_sum) F(reduce_mean) F(reduce_max) F(reduce_min) F(argmax)
/// Linear algebra and NN ops: products, convolution, pooling and the ops pooling's
/// gradients run.
#define KILN_LINALG_OPS(F) \
  F(matmul) F(conv2d) F(max_pool) F(avg_pool) F(max_pool_grad) F(max_pool_grad_grad) F(avg_pool_grad)
/// Every op kiln defines.
#define KILN_ALL_OPS(F) KILN_UNARY_OPS(F) KILN_BINARY_OPS(F) KILN_SHAPE_OPS(F) KILN_REDUCTION_OPS(F) KILN_LINALG_OPS(F)

/// The C++ name of op type `Op`, as generated source spells it (kiln/exec/jit.hpp).
/// \code static_assert(kiln::ops::qualified_name<kiln::ops::tanh> == "kiln::ops::tanh"); \endcode
template <class Op>
inline constexpr std::string_view qualified_name{};
#define KILN_DETAIL_QUALIFIED_NAME(op) \
  template <>                          \
  inline constexpr std::string_view qualified_name<op> = "kiln::ops::" #op;
KILN_ALL_OPS(KILN_DETAIL_QUALIFIED_NAME)
#undef KILN_DETAIL_QUALIFIED_NAME

#define KILN_DETAIL_LIST_ITEM(op) , op
// mp_list<void, a, b, ...> without the void: the X-macros put a comma before each op.
#define KILN_DETAIL_TYPE_LIST(LIST) boost::mp11::mp_pop_front<boost::mp11::mp_list<void LIST(KILN_DETAIL_LIST_ITEM)>>

using elementwise_ops = boost::mp11::mp_append<KILN_DETAIL_TYPE_LIST(KILN_UNARY_OPS), KILN_DETAIL_TYPE_LIST(KILN_BINARY_OPS)>;
using shape_ops = KILN_DETAIL_TYPE_LIST(KILN_SHAPE_OPS);
using reduction_ops = KILN_DETAIL_TYPE_LIST(KILN_REDUCTION_OPS);
using linalg_ops = KILN_DETAIL_TYPE_LIST(KILN_LINALG_OPS);
#undef KILN_DETAIL_TYPE_LIST
#undef KILN_DETAIL_LIST_ITEM

/// Every op kiln defines.
using all_ops = boost::mp11::mp_append<elementwise_ops, shape_ops, reduction_ops, linalg_ops>;

/// Whether op type `Op` has its row in the registry, which graphs need to hold it.
/// \code static_assert(kiln::ops::registered<kiln::ops::tanh>); \endcode
template <class Op, class List = all_ops>
inline constexpr bool registered = false;
template <class Op, class... Ops>
inline constexpr bool registered<Op, boost::mp11::mp_list<Ops...>> = (std::is_same_v<Op, Ops> || ...);

}  // namespace kiln::ops

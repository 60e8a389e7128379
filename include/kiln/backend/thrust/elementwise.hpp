#pragma once
/// \file
/// Thrust elementwise kernel: one `thrust::transform` per op over the output's flat
/// indices. Its functor calls the op's own functor (the one the other backends use)
/// on operands located through broadcast strides; dims that every operand walks
/// alike are merged first, so operands of equal shape (the common case) cost one
/// multiply per element and no division.

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "kiln/ops/elementwise.hpp"  // first: backend.hpp names ops::cast without including it
#include "kiln/backend/backend.hpp"
#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/backend/thrust/strided.hpp"

namespace kiln::backend {
namespace thrust_kernels {

/// Computes output element `i` of elementwise op `Op` reading `In` and writing `Out`.
template <class Op, class In, class Out>
struct elementwise_element {
  static constexpr int arity = Op::arity;
  Op op;
  const void* operand[arity];  // a leading condition (`where`) points to bools
  strided_offsets<arity> index;

  KILN_HOST_DEVICE Out operator()(std::int64_t i) const {
    const offsets<arity> o = index(i);
    return math::convert<Out>(ops::invoke_elementwise(
        op, [&](int k) -> const In& { return static_cast<const In*>(operand[k])[o.at[k]]; },
        [&](int k) { return static_cast<const bool*>(operand[k])[o.at[k]]; }));
  }
};

template <class Op, class In, class Out>
void run_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  constexpr int arity = Op::arity;
  const cpu::loop_nest<arity> nest(in, out.shape);
  elementwise_element<Op, In, Out> element{op, {}, {}};
  element.index.rank = nest.rank;
  for (int d = 0; d < nest.rank; ++d) {
    element.index.size[d] = nest.size[d];
    for (int k = 0; k < arity; ++k) element.index.stride[k][d] = nest.stride[k][d];
  }
  for (int k = 0; k < arity; ++k) element.operand[k] = in[k].data;
  fill_elements<Out>(out, element);
}

}  // namespace thrust_kernels

template <ops::elementwise Op>
void compute(thrust_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  visit_elementwise_types(op, in[ops::value_operand<Op>].dtype, out.dtype, [&]<class In, class Out>() {
    if constexpr (std::is_same_v<In, std::string> || std::is_same_v<Out, std::string>)
      throw internal_error(std::string(Op::name) + ": string tensors cannot be on the gpu");
    else
      thrust_kernels::run_elementwise<Op, In, Out>(op, in, out);
  });
}

}  // namespace kiln::backend

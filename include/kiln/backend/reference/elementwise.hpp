#pragma once
/// \file
/// Reference elementwise kernel: one output element at a time, each input index
/// computed from scratch. Slow and obviously right.

#include <span>

#include "kiln/backend/backend.hpp"
#include "kiln/ops/elementwise.hpp"

namespace kiln::backend {

template <ops::elementwise Op>
void compute(reference_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  std::array<std::array<std::int64_t, max_rank>, 3> strides{};
  for (int k = 0; k < Op::arity; ++k) strides[k] = broadcast_strides(in[k].shape, os);
  auto offset = [&](int k, std::int64_t flat) {
    std::int64_t off = 0;
    for (int d = os.rank() - 1; d >= 0; --d) {
      off += (flat % os[d]) * strides[k][d];
      flat /= os[d];
    }
    return off;
  };
  visit_elementwise_types(op, in[ops::value_operand<Op>].dtype, out.dtype, [&]<class In, class Out>() {
    Out* o = out.as<Out>();
    for (std::int64_t i = 0, n = os.num_elements(); i < n; ++i)
      o[i] = math::convert<Out>(ops::invoke_elementwise(
          op, [&](int k) -> const In& { return in[k].as<In>()[offset(k, i)]; },
          [&](int k) { return in[k].as<bool>()[offset(k, i)]; }));
  });
}

}  // namespace kiln::backend

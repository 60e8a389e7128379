#pragma once
/// \file
/// CPU matmul and conv2d: the op-library side of the packed GEMM and convolution
/// kernels in gemm.hpp and conv2d.hpp.

#include <span>

#include "kiln/backend/backend.hpp"
#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/backend/reference/linalg.hpp"
#include "kiln/ops/linalg.hpp"

namespace kiln::backend {

template <class = void>
void compute(cpu_backend, const ops::matmul&, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::matmul_geometry g(in[0].shape, in[1].shape, out.shape);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    for (std::int64_t bi = 0; bi < g.batches; ++bi) {
      auto [oa, ob] = g.operand_offsets(bi);
      cpu::gemm<T>(g.m, g.n, g.k, in[0].as<T>() + oa, g.k, in[1].as<T>() + ob, g.n, out.as<T>() + bi * g.m * g.n, g.n);
    }
  });
}

template <class = void>
void compute(cpu_backend, const ops::conv2d& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &fs = in[1].shape, &os = out.shape;
  const std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], op.stride_h, op.pad).pad_before;
  const std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], op.stride_w, op.pad).pad_before;
  ops::visit_numeric(out.dtype, [&]<class T>() {
    cpu::conv2d<T>(in[0].as<T>(), xs[0], xs[1], xs[2], xs[3], in[1].as<T>(), fs[0], fs[1], fs[3], op.stride_h, op.stride_w,
                   pad_h, pad_w, out.as<T>(), os[1], os[2]);
  });
}

}  // namespace kiln::backend

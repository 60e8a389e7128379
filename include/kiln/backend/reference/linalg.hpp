#pragma once
/// \file
/// Reference matmul and conv2d: the textbook loops.

#include <span>

#include "kiln/backend/backend.hpp"
#include "kiln/ops/linalg.hpp"

namespace kiln::backend {

template <class = void>
void compute(reference_backend, const ops::matmul&, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::matmul_geometry g(in[0].shape, in[1].shape, out.shape);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    for (std::int64_t bi = 0; bi < g.batches; ++bi) {
      auto [oa, ob] = g.operand_offsets(bi);
      const T* a = in[0].as<T>() + oa;
      const T* b = in[1].as<T>() + ob;
      T* c = out.as<T>() + bi * g.m * g.n;
      for (std::int64_t i = 0; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j) {
          T acc = T(0);
          for (std::int64_t p = 0; p < g.k; ++p) acc = math::add(acc, math::mul(a[i * g.k + p], b[p * g.n + j]));
          c[i * g.n + j] = acc;
        }
    }
  });
}

template <class = void>
void compute(reference_backend, const ops::conv2d& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &fs = in[1].shape, &os = out.shape;
  const std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], op.stride_h, op.pad).pad_before;
  const std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], op.stride_w, op.pad).pad_before;
  ops::visit_numeric(out.dtype, [&]<class T>() {
    const T* x = in[0].as<T>();
    const T* f = in[1].as<T>();
    T* o = out.as<T>();
    for (std::int64_t b = 0; b < os[0]; ++b)
      for (std::int64_t oy = 0; oy < os[1]; ++oy)
        for (std::int64_t ox = 0; ox < os[2]; ++ox)
          for (std::int64_t co = 0; co < os[3]; ++co) {
            T acc = T(0);
            for (std::int64_t fy = 0; fy < fs[0]; ++fy)
              for (std::int64_t fx = 0; fx < fs[1]; ++fx) {
                std::int64_t iy = oy * op.stride_h + fy - pad_h, ix = ox * op.stride_w + fx - pad_w;
                if (iy < 0 || iy >= xs[1] || ix < 0 || ix >= xs[2]) continue;  // zero padding
                for (std::int64_t ci = 0; ci < xs[3]; ++ci)
                  acc = math::add(acc, math::mul(x[((b * xs[1] + iy) * xs[2] + ix) * xs[3] + ci],
                                                 f[((fy * fs[1] + fx) * fs[2] + ci) * fs[3] + co]));
              }
            o[((b * os[1] + oy) * os[2] + ox) * os[3] + co] = acc;
          }
  });
}

}  // namespace kiln::backend

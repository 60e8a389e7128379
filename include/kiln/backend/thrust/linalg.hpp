#pragma once
/// \file
/// Thrust matmul and conv2d: one `thrust::transform` over the output's elements,
/// each thread computing one dot product in the same order as the reference.
/// Neighbouring threads compute neighbouring output columns, so their reads of the
/// right operand (or of the filters) are neighbouring too. Correct and simple;
/// tiled shared-memory kernels or cuBLAS are the way to GPU peak.

#include <cstdint>
#include <span>
#include <type_traits>

#include "kiln/backend/backend.hpp"
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"

namespace kiln::backend {
namespace thrust_kernels {

/// Element `i` of a (batched) matrix product.
template <class T>
struct matmul_element {
  const T* a;
  const T* b;
  ops::matmul_geometry geometry;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t m = geometry.m, n = geometry.n, k = geometry.k;
    const std::int64_t batch = i / (m * n), row = i / n % m, column = i % n;
    const auto [a_offset, b_offset] = geometry.operand_offsets(batch);
    const T* a_row = a + a_offset + row * k;
    const T* b_column = b + b_offset + column;
    T acc = T(0);
    for (std::int64_t p = 0; p < k; ++p) acc = math::add(acc, math::mul(a_row[p], b_column[p * n]));
    return acc;
  }
};

/// Element `i` of an NHWC convolution with HWIO filters; taps outside the input
/// are the zero padding and are skipped.
template <class T>
struct conv2d_element {
  const T* x;
  const T* filters;
  std::int64_t height, width, channels;              // input
  std::int64_t filter_height, filter_width;          // filters
  std::int64_t out_height, out_width, out_channels;  // output
  std::int64_t stride_h, stride_w, pad_h, pad_w;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t co = i % out_channels, ox = i / out_channels % out_width;
    const std::int64_t oy = i / (out_channels * out_width) % out_height, b = i / (out_channels * out_width * out_height);
    T acc = T(0);
    for (std::int64_t fy = 0; fy < filter_height; ++fy) {
      const std::int64_t iy = oy * stride_h + fy - pad_h;
      if (iy < 0 || iy >= height) continue;
      for (std::int64_t fx = 0; fx < filter_width; ++fx) {
        const std::int64_t ix = ox * stride_w + fx - pad_w;
        if (ix < 0 || ix >= width) continue;
        const T* pixel = x + ((b * height + iy) * width + ix) * channels;
        const T* taps = filters + (fy * filter_width + fx) * channels * out_channels + co;
        for (std::int64_t ci = 0; ci < channels; ++ci) acc = math::add(acc, math::mul(pixel[ci], taps[ci * out_channels]));
      }
    }
    return acc;
  }
};

}  // namespace thrust_kernels

template <class = void>
void compute(thrust_backend, const ops::matmul&, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::matmul_geometry geometry(in[0].shape, in[1].shape, out.shape);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::matmul_element<T>{in[0].as<const T>(), in[1].as<const T>(), geometry});
  });
}

template <class = void>
void compute(thrust_backend, const ops::conv2d& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &fs = in[1].shape, &os = out.shape;
  const std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], op.stride_h, op.pad).pad_before;
  const std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], op.stride_w, op.pad).pad_before;
  ops::visit_numeric(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::conv2d_element<T>{in[0].as<const T>(), in[1].as<const T>(),
                                                                            xs[1], xs[2], xs[3], fs[0], fs[1], os[1], os[2],
                                                                            os[3], op.stride_h, op.stride_w, pad_h, pad_w});
  });
}

}  // namespace kiln::backend

#pragma once
/// \file
/// Thrust pooling: one `thrust::transform` over the output's elements, each computed
/// from the definitions in kiln/ops/pooling.hpp as the reference backend does (the
/// gradients gather what reaches each input element, so no two threads write one).

#include <cstdint>
#include <span>

#include "kiln/backend/backend.hpp"
#include "kiln/backend/reference/pooling.hpp"
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/ops/pooling.hpp"

namespace kiln::backend {
namespace thrust_kernels {

/// The (b, y, x, c) of element `i` of an NHWC tensor of dims (*, h, w, c).
struct nhwc_index {
  std::int64_t b, y, x, c;
  KILN_HOST_DEVICE nhwc_index(std::int64_t i, std::int64_t h, std::int64_t w, std::int64_t channels)
      : b(i / (channels * w * h)), y(i / (channels * w) % h), x(i / channels % w), c(i % channels) {}
};

/// Element `i` of max_pool (`Average` false) or avg_pool.
template <class T, bool Average>
struct pool_element {
  const T* x;
  ops::pool_geometry g;
  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const nhwc_index o(i, g.out_h, g.out_w, g.channels);
    if constexpr (!Average) {
      return x[g.argmax(x, o.b, o.y, o.x, o.c)];
    } else {
      T sum = T(0);
      for (std::int64_t iy = g.row_begin(o.y); iy < g.row_end(o.y); ++iy)
        for (std::int64_t ix = g.column_begin(o.x); ix < g.column_end(o.x); ++ix) sum += x[g.input_offset(o.b, iy, ix, o.c)];
      return sum / T(g.window_count(o.y, o.x));
    }
  }
};

/// Element `i` of max_pool_grad (`Average` false) or avg_pool_grad: what the windows
/// holding input element i give it.
template <class T, bool Average>
struct pool_gradient_element {
  const T* x;
  const T* dy;
  ops::pool_geometry g;
  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const nhwc_index e(i, g.in_h, g.in_w, g.channels);
    T sum = T(0);
    for (std::int64_t oy = g.first_row_holding(e.y); oy < g.rows_holding_end(e.y); ++oy)
      for (std::int64_t ox = g.first_column_holding(e.x); ox < g.columns_holding_end(e.x); ++ox) {
        const T d = dy[g.output_offset(e.b, oy, ox, e.c)];
        if constexpr (Average)
          sum += d / T(g.window_count(oy, ox));
        else if (g.argmax(x, e.b, oy, ox, e.c) == i)
          sum += d;
      }
    return sum;
  }
};

/// Element `i` of max_pool_grad_grad: `d` at its window's first maximum of `x`.
template <class T>
struct pool_pick_element {
  const T* x;
  const T* d;
  ops::pool_geometry g;
  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const nhwc_index o(i, g.out_h, g.out_w, g.channels);
    return d[g.argmax(x, o.b, o.y, o.x, o.c)];
  }
};

}  // namespace thrust_kernels

template <class = void>
void compute(thrust_backend, const ops::max_pool& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::pool_element<T, false>{in[0].as<const T>(), ops::pool_geometry(op, in[0].shape)});
  });
}
template <class = void>
void compute(thrust_backend, const ops::avg_pool& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::pool_element<T, true>{in[0].as<const T>(), ops::pool_geometry(op, in[0].shape)});
  });
}
template <class = void>
void compute(thrust_backend, const ops::max_pool_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::pool_gradient_element<T, false>{
                                              in[0].as<const T>(), in[1].as<const T>(), ops::pool_geometry(op, in[0].shape)});
  });
}
template <class = void>
void compute(thrust_backend, const ops::max_pool_grad_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::pool_pick_element<T>{in[0].as<const T>(), in[1].as<const T>(),
                                                                              ops::pool_geometry(op, in[0].shape)});
  });
}
template <class = void>
void compute(thrust_backend, const ops::avg_pool_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::pool_gradient_element<T, true>{
                                              nullptr, in[1].as<const T>(), ops::pool_geometry(op, in[0].shape)});
  });
}

}  // namespace kiln::backend

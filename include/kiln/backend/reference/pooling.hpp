#pragma once
/// \file
/// Reference pooling: every output element computed on its own from the definitions
/// in kiln/ops/pooling.hpp (the gradients gather what reaches each input element).

#include <span>

#include "kiln/backend/backend.hpp"
#include "kiln/ops/pooling.hpp"

namespace kiln::backend {
namespace reference {

/// Calls `f.template operator()<T>()` with float or double, the dtypes pooling takes.
template <class F>
void visit_pooled(dtype t, F&& f) {
  if (t == float64)
    f.template operator()<double>();
  else
    f.template operator()<float>();
}

/// Calls `fn(b, y, x, c)` for every element of an NHWC tensor of dims `s`, in order.
template <class F>
void for_each_nhwc(const shape& s, F&& fn) {
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t y = 0; y < s[1]; ++y)
      for (std::int64_t x = 0; x < s[2]; ++x)
        for (std::int64_t c = 0; c < s[3]; ++c) fn(b, y, x, c);
}

}  // namespace reference

template <class = void>
void compute(reference_backend, const ops::max_pool& op, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::pool_geometry g(op, in[0].shape);
  reference::visit_pooled(out.dtype, [&]<class T>() {
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    reference::for_each_nhwc(out.shape, [&](std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) {
      y[g.output_offset(b, oy, ox, c)] = x[g.argmax(x, b, oy, ox, c)];
    });
  });
}

template <class = void>
void compute(reference_backend, const ops::avg_pool& op, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::pool_geometry g(op, in[0].shape);
  reference::visit_pooled(out.dtype, [&]<class T>() {
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    reference::for_each_nhwc(out.shape, [&](std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) {
      T sum = T(0);
      for (std::int64_t iy = g.row_begin(oy); iy < g.row_end(oy); ++iy)
        for (std::int64_t ix = g.column_begin(ox); ix < g.column_end(ox); ++ix) sum += x[g.input_offset(b, iy, ix, c)];
      y[g.output_offset(b, oy, ox, c)] = sum / T(g.window_count(oy, ox));
    });
  });
}

template <class = void>
void compute(reference_backend, const ops::max_pool_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::pool_geometry g(op, in[0].shape);
  reference::visit_pooled(out.dtype, [&]<class T>() {
    const T* x = in[0].as<T>();
    const T* dy = in[1].as<T>();
    T* dx = out.as<T>();
    reference::for_each_nhwc(out.shape, [&](std::int64_t b, std::int64_t iy, std::int64_t ix, std::int64_t c) {
      const std::int64_t here = g.input_offset(b, iy, ix, c);
      T sum = T(0);
      for (std::int64_t oy = g.first_row_holding(iy); oy < g.rows_holding_end(iy); ++oy)
        for (std::int64_t ox = g.first_column_holding(ix); ox < g.columns_holding_end(ix); ++ox)
          if (g.argmax(x, b, oy, ox, c) == here) sum += dy[g.output_offset(b, oy, ox, c)];
      dx[here] = sum;
    });
  });
}

template <class = void>
void compute(reference_backend, const ops::max_pool_grad_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::pool_geometry g(op, in[0].shape);
  reference::visit_pooled(out.dtype, [&]<class T>() {
    const T* x = in[0].as<T>();
    const T* d = in[1].as<T>();
    T* y = out.as<T>();
    reference::for_each_nhwc(out.shape, [&](std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) {
      y[g.output_offset(b, oy, ox, c)] = d[g.argmax(x, b, oy, ox, c)];
    });
  });
}

template <class = void>
void compute(reference_backend, const ops::avg_pool_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::pool_geometry g(op, in[0].shape);
  reference::visit_pooled(out.dtype, [&]<class T>() {
    const T* dy = in[1].as<T>();
    T* dx = out.as<T>();
    reference::for_each_nhwc(out.shape, [&](std::int64_t b, std::int64_t iy, std::int64_t ix, std::int64_t c) {
      T sum = T(0);
      for (std::int64_t oy = g.first_row_holding(iy); oy < g.rows_holding_end(iy); ++oy)
        for (std::int64_t ox = g.first_column_holding(ix); ox < g.columns_holding_end(ix); ++ox)
          sum += dy[g.output_offset(b, oy, ox, c)] / T(g.window_count(oy, ox));
      dx[g.input_offset(b, iy, ix, c)] = sum;
    });
  });
}

}  // namespace kiln::backend

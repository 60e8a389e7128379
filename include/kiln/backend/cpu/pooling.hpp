#pragma once
/// \file
/// CPU pooling over NHWC images: channels are innermost, so each window position is
/// a run of channels that SIMD batches cover (a scalar loop takes the channels past
/// the last whole batch). The gradients follow TensorFlow's: max pooling's goes to
/// the first largest element of each window, found per lane by comparing the
/// window's elements with its maximum in row-major order. Where the windows tile the
/// input (strides equal to the window, no padding, no rows or columns left over, as
/// in Keras' default), every input element is in one window, so a gradient is
/// written once rather than zeroed and then added to. Rows of windows run in
/// parallel when their inputs do not overlap, images otherwise.

#include <algorithm>
#include <cstdint>
#include <span>

#include "kiln/core/simd.hpp"

#include "kiln/backend/backend.hpp"
#include "kiln/backend/cpu/streaming.hpp"
#include "kiln/backend/reference/pooling.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/pooling.hpp"

namespace kiln::backend::cpu {
namespace pooling {

// One lane type's operations, for SIMD batches and for the scalar tail of channels.
template <class T>
KILN_ALWAYS_INLINE T load(const T* p, T) {
  return *p;
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> load(const T* p, const xsimd::batch<T, A>&) {
  return xsimd::batch<T, A>::load_unaligned(p);
}
template <class T>
KILN_ALWAYS_INLINE void store(T v, T* p) {
  *p = v;
}
template <class T, class A>
KILN_ALWAYS_INLINE void store(const xsimd::batch<T, A>& v, T* p) {
  v.store_unaligned(p);
}
/// Whether `x` is the window's maximum `top` (a NaN maximum is any NaN).
template <class T>
KILN_ALWAYS_INLINE bool is_top(T x, T top) {
  return x == top || (x != x && top != top);
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch_bool<T, A> is_top(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& top) {
  return (x == top) || (xsimd::isnan(x) && xsimd::isnan(top));
}
template <class T>
KILN_ALWAYS_INLINE T pick(bool c, T a) {
  return c ? a : T(0);
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> pick(const xsimd::batch_bool<T, A>& c, const xsimd::batch<T, A>& a) {
  return xsimd::select(c, a, xsimd::batch<T, A>(T(0)));
}
template <class V>
KILN_ALWAYS_INLINE auto none_taken() {
  if constexpr (std::is_arithmetic_v<V>)
    return false;
  else
    return typename V::batch_bool_type(false);
}

/// Calls `fn(V(), c)` for each run of channels: SIMD batches `V` from channel 0, then
/// the channels left over one at a time.
template <class T, class F>
KILN_ALWAYS_INLINE void for_channels(std::int64_t channels, F&& fn) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = std::int64_t(B::size);
  std::int64_t c = 0;
  for (; c + w <= channels; c += w) fn(B(), c);
  for (; c < channels; ++c) fn(T(), c);
}

/// Runs `fn(b, oy)` for every row of windows, in parallel where rows of windows read
/// and write rows of their own (`rows_apart`), by image otherwise.
template <class F>
void for_window_rows(const ops::pool_geometry& g, bool rows_apart, F&& fn) {
  const std::int64_t row_work = std::max<std::int64_t>(1, g.out_w * g.window_h * g.window_w * g.channels);
  if (rows_apart) {
    kiln::detail::parallel_for(g.batch * g.out_h, std::max<std::int64_t>(1, 32768 / row_work), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) fn(r / g.out_h, r % g.out_h);
    });
  } else {
    kiln::detail::parallel_for(g.batch, std::max<std::int64_t>(1, 32768 / (row_work * std::max<std::int64_t>(1, g.out_h))),
                               [&](std::int64_t lo, std::int64_t hi) {
                                 for (std::int64_t b = lo; b < hi; ++b)
                                   for (std::int64_t oy = 0; oy < g.out_h; ++oy) fn(b, oy);
                               });
  }
}

/// The maximum of window (b, oy, ox) over lanes `V` from channel c, starting at the
/// window's first element.
template <class V, class T>
KILN_ALWAYS_INLINE V window_max(const T* x, const ops::pool_geometry& g, std::int64_t b, std::int64_t oy, std::int64_t ox,
                                std::int64_t c) {
  const std::int64_t r0 = g.row_begin(oy), r1 = g.row_end(oy), c0 = g.column_begin(ox), c1 = g.column_end(ox);
  V top = load(x + g.input_offset(b, r0, c0, c), V());
  for (std::int64_t iy = r0; iy < r1; ++iy)
    for (std::int64_t ix = iy == r0 ? c0 + 1 : c0; ix < c1; ++ix) top = math::max(top, load(x + g.input_offset(b, iy, ix, c), V()));
  return top;
}

template <class T>
void max_pool(const T* x, T* y, const ops::pool_geometry& g) {
  for_window_rows(g, true, [&](std::int64_t b, std::int64_t oy) {
    for (std::int64_t ox = 0; ox < g.out_w; ++ox)
      for_channels<T>(g.channels, [&]<class V>(V, std::int64_t c) {
        store(window_max<V>(x, g, b, oy, ox, c), y + g.output_offset(b, oy, ox, c));
      });
  });
}

template <class T>
void avg_pool(const T* x, T* y, const ops::pool_geometry& g) {
  for_window_rows(g, true, [&](std::int64_t b, std::int64_t oy) {
    for (std::int64_t ox = 0; ox < g.out_w; ++ox) {
      const T count = T(g.window_count(oy, ox));
      for_channels<T>(g.channels, [&]<class V>(V, std::int64_t c) {
        V sum(T(0));
        for (std::int64_t iy = g.row_begin(oy); iy < g.row_end(oy); ++iy)
          for (std::int64_t ix = g.column_begin(ox); ix < g.column_end(ox); ++ix) sum = sum + load(x + g.input_offset(b, iy, ix, c), V());
        store(sum / V(count), y + g.output_offset(b, oy, ox, c));
      });
    }
  });
}

/// Zeros `out` (n elements) in parallel, for gradients that windows add to.
template <class T>
void zero(T* out, std::int64_t n) {
  kiln::detail::parallel_for(n, 1 << 16, [&](std::int64_t lo, std::int64_t hi) { std::fill(out + lo, out + hi, T(0)); });
}

/// max_pool_grad (`Pull` false: dy of the windows to x's shape) and
/// max_pool_grad_grad (`Pull` true: d at each window's first maximum).
template <bool Pull, class T>
void max_pool_backward(const T* x, const T* d, T* out, const ops::pool_geometry& g) {
  const bool once = g.tiles();
  if (!Pull && !once) zero(out, g.batch * g.in_h * g.in_w * g.channels);
  for_window_rows(g, Pull || g.stride_h >= g.window_h, [&](std::int64_t b, std::int64_t oy) {
    const std::int64_t r0 = g.row_begin(oy), r1 = g.row_end(oy);
    for (std::int64_t ox = 0; ox < g.out_w; ++ox) {
      const std::int64_t c0 = g.column_begin(ox), c1 = g.column_end(ox);
      for_channels<T>(g.channels, [&]<class V>(V, std::int64_t c) {
        const V top = window_max<V>(x, g, b, oy, ox, c);
        const std::int64_t at = g.output_offset(b, oy, ox, c);
        const V dy = Pull ? V(T(0)) : load(d + at, V());
        auto taken = none_taken<V>();
        V picked(T(0));
        for (std::int64_t iy = r0; iy < r1; ++iy)
          for (std::int64_t ix = c0; ix < c1; ++ix) {
            const std::int64_t in = g.input_offset(b, iy, ix, c);
            const auto first = is_top(load(x + in, V()), top) && !taken;
            taken = taken || first;
            if constexpr (Pull)
              picked = picked + pick(first, load(d + in, V()));
            else if (once)
              store(pick(first, dy), out + in);
            else
              store(load(out + in, V()) + pick(first, dy), out + in);
          }
        if constexpr (Pull) store(picked, out + at);
      });
    }
  });
}

template <class T>
void avg_pool_grad(const T* dy, T* dx, const ops::pool_geometry& g) {
  const bool once = g.tiles();
  if (!once) zero(dx, g.batch * g.in_h * g.in_w * g.channels);
  for_window_rows(g, g.stride_h >= g.window_h, [&](std::int64_t b, std::int64_t oy) {
    for (std::int64_t ox = 0; ox < g.out_w; ++ox) {
      const T count = T(g.window_count(oy, ox));
      for_channels<T>(g.channels, [&]<class V>(V, std::int64_t c) {
        const V share = load(dy + g.output_offset(b, oy, ox, c), V()) / V(count);
        for (std::int64_t iy = g.row_begin(oy); iy < g.row_end(oy); ++iy)
          for (std::int64_t ix = g.column_begin(ox); ix < g.column_end(ox); ++ix) {
            T* p = dx + g.input_offset(b, iy, ix, c);
            store(once ? share : load(p, V()) + share, p);
          }
      });
    }
  });
}

}  // namespace pooling
}  // namespace kiln::backend::cpu

namespace kiln::backend {

template <class = void>
void compute(cpu_backend, const ops::max_pool& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() { cpu::pooling::max_pool(in[0].as<T>(), out.as<T>(), ops::pool_geometry(op, in[0].shape)); });
}
template <class = void>
void compute(cpu_backend, const ops::avg_pool& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() { cpu::pooling::avg_pool(in[0].as<T>(), out.as<T>(), ops::pool_geometry(op, in[0].shape)); });
}
template <class = void>
void compute(cpu_backend, const ops::max_pool_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    cpu::pooling::max_pool_backward<false>(in[0].as<T>(), in[1].as<T>(), out.as<T>(), ops::pool_geometry(op, in[0].shape));
  });
}
template <class = void>
void compute(cpu_backend, const ops::max_pool_grad_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    cpu::pooling::max_pool_backward<true>(in[0].as<T>(), in[1].as<T>(), out.as<T>(), ops::pool_geometry(op, in[0].shape));
  });
}
template <class = void>
void compute(cpu_backend, const ops::avg_pool_grad& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::visit_pooled(out.dtype, [&]<class T>() {
    cpu::pooling::avg_pool_grad(in[1].as<T>(), out.as<T>(), ops::pool_geometry(op, in[0].shape));
  });
}

}  // namespace kiln::backend

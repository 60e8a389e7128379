#pragma once
/// \file
/// CPU kernels of the data-movement ops. Every kernel copies contiguous runs of
/// elements: trivially copyable dtypes move as raw bytes with memcpy (dispatched on
/// the element size alone, so int32 and float32 share one instantiation), strings by
/// assignment. Dims that both sides walk contiguously are merged first, so a run is
/// as long as it can be. A transpose that moves the innermost dim cannot copy runs;
/// it goes tile by tile, so that reads and writes both stay in cache. Large outputs
/// are split over the thread pool. (reshape, `x[i]`, shape_of and set_item need no kernel.)

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kiln/backend/backend.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::backend {
namespace cpu {

/// Bytes a parallel task copies at least: below this, waking threads costs more than it saves.
inline constexpr std::int64_t copy_grain_bytes = std::int64_t(1) << 18;

/// Side of the square tiles of a transpose: a 32x32 tile of float64 is 8 KiB read
/// and 8 KiB written, well within L1.
inline constexpr std::int64_t transpose_tile_side = 32;

// Movers copy elements between buffers, offsets counted in elements. Their loops
// take everything as value parameters: the compiler must assume a byte store may
// alias any memory, so a loop bound read through a reference would be reloaded on
// every element.

/// Moves trivially copyable elements of `Size` bytes.
template <std::size_t Size>
struct byte_mover {
  static constexpr std::int64_t size = Size;
  static constexpr std::int64_t grain = std::max<std::int64_t>(1, copy_grain_bytes / size);

  static const unsigned char* at(const void* p, std::int64_t i) { return static_cast<const unsigned char*>(p) + i * size; }
  static unsigned char* at(void* p, std::int64_t i) { return static_cast<unsigned char*>(p) + i * size; }
  /// dst[to + i] = src[from + i] for i < count.
  static void copy(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t count) {
    if (count == 1)  // runs of one element are common (stack along the last axis); skip the call
      std::memcpy(at(dst, to), at(src, from), Size);
    else
      std::memcpy(at(dst, to), at(src, from), std::size_t(count) * Size);
  }
  /// dst[to + i] = src[from + i * step] for i < count.
  static void copy_strided(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t step,
                           std::int64_t count) {
    unsigned char* d = at(dst, to);
    const unsigned char* s = at(src, from);
    for (std::int64_t i = 0; i < count; ++i) std::memcpy(d + i * size, s + i * step * size, Size);
  }
  /// dst[to + i] = src[from + indices[i]] for i < count.
  template <class I>
  static void copy_indexed(void* dst, std::int64_t to, const void* src, std::int64_t from, const I* indices,
                           std::int64_t count) {
    unsigned char* d = at(dst, to);
    const unsigned char* s = at(src, from);
    for (std::int64_t i = 0; i < count; ++i) std::memcpy(d + i * size, s + std::int64_t(indices[i]) * size, Size);
  }
};

/// Moves std::string elements by assignment (the output's strings already exist).
struct string_mover {
  static constexpr std::int64_t grain = copy_grain_bytes / std::int64_t(sizeof(std::string));

  static const std::string* at(const void* p, std::int64_t i) { return static_cast<const std::string*>(p) + i; }
  static std::string* at(void* p, std::int64_t i) { return static_cast<std::string*>(p) + i; }
  static void copy(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t count) {
    std::copy_n(at(src, from), count, at(dst, to));
  }
  static void copy_strided(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t step,
                           std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) *at(dst, to + i) = *at(src, from + i * step);
  }
  template <class I>
  static void copy_indexed(void* dst, std::int64_t to, const void* src, std::int64_t from, const I* indices,
                           std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) *at(dst, to + i) = *at(src, from + std::int64_t(indices[i]));
  }
};

/// Calls `f.template operator()<Mover>()` with the mover for dtype `t`.
template <class F>
void visit_mover(dtype t, F&& f) {
  switch (t) {
    case bool_: return f.template operator()<byte_mover<sizeof(bool)>>();
    case int32:
    case float32: return f.template operator()<byte_mover<4>>();
    case int64:
    case float64: return f.template operator()<byte_mover<8>>();
    case string: return f.template operator()<string_mover>();
  }
  kiln::detail::throw_invalid_dtype("visit_mover", t);
}

/// An output walked in row-major order whose element at multi-index `idx` comes from
/// input element `base + sum(idx[d] * stride[d])`.
struct strided_walk {
  int rank = 0;
  std::array<std::int64_t, max_rank> dims{}, stride{};
  std::int64_t base = 0;

  /// The walk over `out` with input `stride`s, minus size-1 dims, with neighbours
  /// merged where the input side chains too (the output side always does).
  strided_walk(const shape& out, const std::array<std::int64_t, max_rank>& in_stride, std::int64_t in_base)
      : base(in_base) {
    for (int d = 0; d < out.rank(); ++d) {
      if (out[d] == 1) continue;
      if (rank > 0 && stride[rank - 1] == in_stride[d] * out[d]) {
        dims[rank - 1] *= out[d];
        stride[rank - 1] = in_stride[d];
      } else {
        dims[rank] = out[d];
        stride[rank] = in_stride[d];
        ++rank;
      }
    }
    if (rank == 0) {  // one element
      rank = 1;
      dims[0] = stride[0] = 1;
    }
  }

  std::int64_t size() const {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= dims[d];
    return n;
  }
};

/// Copies a walk whose last dim is contiguous in the output, run by run: one memcpy
/// per run when the input side is contiguous too.
template <class Mover>
void copy_walk(const strided_walk& w, const void* src, void* dst) {
  const int r = w.rank;
  const std::int64_t run = w.dims[r - 1], step = w.stride[r - 1];
  kiln::detail::parallel_for(w.size(), Mover::grain, [&](std::int64_t lo, std::int64_t hi) {
    std::array<std::int64_t, max_rank> idx{};
    std::int64_t from = w.base;
    for (std::int64_t rest = lo, d = r - 1; d >= 0; --d) {
      idx[d] = rest % w.dims[d];
      rest /= w.dims[d];
      from += idx[d] * w.stride[d];
    }
    for (std::int64_t to = lo; to < hi;) {
      const std::int64_t len = std::min(run - idx[r - 1], hi - to);
      if (step == 1)
        Mover::copy(dst, to, src, from, len);
      else
        Mover::copy_strided(dst, to, src, from, step, len);
      to += len;
      from += len * step;
      idx[r - 1] += len;
      for (int d = r - 1; d > 0 && idx[d] == w.dims[d]; --d) {
        from += w.stride[d - 1] - w.dims[d] * w.stride[d];
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

/// transpose_tile through a buffer in L1 (see there), for trivially copyable elements.
template <class Mover>
void transpose_buffered(const void* src, std::int64_t src_stride, void* dst, std::int64_t dst_stride, std::int64_t rows,
                        std::int64_t cols) {
  constexpr std::int64_t t = transpose_tile_side;
  alignas(buffer_alignment) unsigned char buffer[t * t * Mover::size];  // buffer[j][i] = src[i + j * src_stride]
  for (std::int64_t j = 0; j < cols; ++j) Mover::copy(buffer, j * t, src, j * src_stride, rows);
  for (std::int64_t i = 0; i < rows; ++i) Mover::copy_strided(dst, i * dst_stride, buffer, i, t, cols);
}

#if defined(__AVX512F__)
/// `dst[i * dst_stride + j] = src[i + j * src_stride]` for a 16 x 16 block of 4-byte
/// elements (moved as floats, bits unchanged): sixteen rows in registers, interleaved
/// in pairs, then in fours, then as 128-bit lanes twice.
inline void transpose_16x16(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride) {
  __m512 r[16], t[16];
  for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(src + k * src_stride);
  for (int k = 0; k < 16; k += 2) {
    t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 16; k += 4) {
    r[k] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)
    for (int k = 0; k < 4; ++k) {
      t[h + k] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0x88);
      t[h + k + 4] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0xdd);
    }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * dst_stride, r[k]);
}
#endif

/// Copies a `rows` x `cols` tile that a transpose turns around:
/// `dst[i * dst_stride + j] = src[i + j * src_stride]`. Trivially copyable elements
/// go through a buffer in L1, read and written a whole row at a time: rows far apart
/// in memory often share cache sets, so reading them a column at a time would evict
/// them before they are used up.
template <class Mover>
void transpose_tile(const void* src, std::int64_t src_stride, void* dst, std::int64_t dst_stride, std::int64_t rows,
                    std::int64_t cols) {
  if constexpr (std::is_same_v<Mover, string_mover>) {  // a string copy costs more than any cache miss
    for (std::int64_t i = 0; i < rows; ++i) Mover::copy_strided(dst, i * dst_stride, src, i, src_stride, cols);
  } else {
#if defined(__AVX512F__)
    if constexpr (Mover::size == 4) {
      // 16 x 16 blocks turn around in registers; what is left of the tile goes through
      // the buffer below.
      constexpr std::int64_t b = 16;
      const std::int64_t full_rows = rows / b * b, full_cols = cols / b * b;
      for (std::int64_t j = 0; j < full_cols; j += b)
        for (std::int64_t i = 0; i < full_rows; i += b)
          transpose_16x16(static_cast<const float*>(src) + i + j * src_stride, src_stride,
                          static_cast<float*>(dst) + i * dst_stride + j, dst_stride);
      if (full_rows < rows)
        transpose_buffered<Mover>(Mover::at(src, full_rows), src_stride, Mover::at(dst, full_rows * dst_stride), dst_stride,
                                  rows - full_rows, cols);
      if (full_cols < cols && full_rows > 0)
        transpose_buffered<Mover>(Mover::at(src, full_cols * src_stride), src_stride, Mover::at(dst, full_cols), dst_stride,
                                  full_rows, cols - full_cols);
      return;
    }
#endif
    transpose_buffered<Mover>(src, src_stride, dst, dst_stride, rows, cols);
  }
}

/// Copies a walk whose input-contiguous dim `q` is not the last one (a transpose
/// that moves the innermost dim) in square tiles over dims `q` and `last`.
template <class Mover>
void copy_walk_tiled(const strided_walk& w, int q, const void* src, void* dst) {
  const int last = w.rank - 1;
  std::array<std::int64_t, max_rank> out_stride{};
  for (std::int64_t d = last, acc = 1; d >= 0; --d) {
    out_stride[d] = acc;
    acc *= w.dims[d];
  }
  constexpr std::int64_t t = transpose_tile_side;
  const std::int64_t tiles_q = (w.dims[q] + t - 1) / t, tiles_last = (w.dims[last] + t - 1) / t;
  const std::int64_t tasks = w.size() / (w.dims[q] * w.dims[last]) * tiles_q * tiles_last;
  kiln::detail::parallel_for(tasks, std::max<std::int64_t>(1, Mover::grain / (t * t)), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t task = lo; task < hi; ++task) {
      std::int64_t rest = task;
      const std::int64_t l0 = rest % tiles_last * t;
      rest /= tiles_last;
      const std::int64_t q0 = rest % tiles_q * t;
      rest /= tiles_q;
      std::int64_t from = w.base + q0 + l0 * w.stride[last], to = q0 * out_stride[q] + l0;
      for (int d = last - 1; d >= 0; --d) {
        if (d == q) continue;
        from += rest % w.dims[d] * w.stride[d];
        to += rest % w.dims[d] * out_stride[d];
        rest /= w.dims[d];
      }
      transpose_tile<Mover>(Mover::at(src, from), w.stride[last], Mover::at(dst, to), out_stride[q],
                            std::min(t, w.dims[q] - q0), std::min(t, w.dims[last] - l0));
    }
  });
}

/// Concatenation along a dim: the output is `outer` rows, each made of one run of
/// `run(k)` elements from every input k in turn.
template <class Mover, class Run>
void join(std::span<const buffer_view> in, std::int64_t outer, Run run, const buffer_view& out) {
  const std::int64_t row = out.size() / outer;
  kiln::detail::parallel_for(out.size(), Mover::grain, [&](std::int64_t lo, std::int64_t hi) {
    const std::size_t inputs = in.size();
    std::int64_t o = lo / row, p = lo % row, start = 0;  // row o, position p in it, input k starts at `start`
    std::size_t k = 0;
    while (p >= start + run(k)) start += run(k++);
    for (std::int64_t to = lo; to < hi;) {
      const std::int64_t r = run(k), len = std::min(r - (p - start), hi - to);
      if (len > 0) Mover::copy(out.data, to, in[k].data, o * r + (p - start), len);
      to += len;
      p += len;
      if (p - start == r) {
        start += r;
        if (++k == inputs) {
          k = 0;
          start = p = 0;
          ++o;
        }
      }
    }
  });
}

/// Gather as `outer x m` rows of `inner` elements: row (o, j) of the output is row
/// (o, indices[j]) of the input, viewed as `outer x n x inner`. The indices were
/// checked by ops::check_values.
template <class Mover, class I>
void gather_rows(const buffer_view& x, const I* indices, std::int64_t m, int axis, const buffer_view& out) {
  const std::int64_t n = x.shape[axis], inner = elements_between(x.shape, axis + 1, x.shape.rank());
  kiln::detail::parallel_for(out.size(), Mover::grain, [&](std::int64_t lo, std::int64_t hi) {
    std::int64_t col = lo % inner, j = lo / inner % m, row_base = lo / inner / m * n;  // row_base: o * n
    for (std::int64_t to = lo; to < hi;) {
      if (inner == 1) {  // one element per index: copy the elements of a run of indices
        const std::int64_t len = std::min(m - j, hi - to);
        Mover::copy_indexed(out.data, to, x.data, row_base, indices + j, len);
        to += len;
        j += len;
      } else {
        const std::int64_t len = std::min(inner - col, hi - to);
        Mover::copy(out.data, to, x.data, (row_base + std::int64_t(indices[j])) * inner + col, len);
        to += len;
        col = 0;
        ++j;
      }
      if (j == m) {
        j = 0;
        row_base += n;
      }
    }
  });
}

/// unsorted_segment_sum as `outer` blocks: row j of block b of `data` (m rows of
/// `inner` elements) is added to row ids[j] of block b of `out` (`segments` rows).
/// Threads split the (block, column) pairs, so each output element is one thread's
/// sum of its rows in the order of j, whatever the split.
template <class T, class I>
void segment_sum_rows(const T* data, const I* ids, std::int64_t m, std::int64_t segments, std::int64_t outer,
                      std::int64_t inner, T* out) {
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t(1) << 15) / std::max<std::int64_t>(m + segments, 1));
  kiln::detail::parallel_for(outer * inner, grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t at = lo; at < hi;) {
      const std::int64_t b = at / inner, first = at % inner, last = std::min(inner, first + (hi - at));
      T* block = out + b * segments * inner;
      for (std::int64_t s = 0; s < segments; ++s) std::fill(block + s * inner + first, block + s * inner + last, T(0));
      for (std::int64_t j = 0; j < m; ++j) {
        if (ids[j] < 0) continue;  // dropped, as TensorFlow drops negative ids
        T* sum = block + std::int64_t(ids[j]) * inner;
        const T* row = data + (b * m + j) * inner;
        for (std::int64_t c = first; c < last; ++c) sum[c] = math::add(sum[c], row[c]);
      }
      at += last - first;
    }
  });
}

}  // namespace cpu

template <class = void>
void compute(cpu_backend, const ops::unsorted_segment_sum& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& ds = in[0].shape;
  const int a = int(op.axis), ids_end = a + in[1].shape.rank();
  const std::int64_t outer = elements_between(ds, 0, a), inner = elements_between(ds, ids_end, ds.rank()), m = in[1].size();
  ops::visit_numeric(out.dtype, [&]<class T>() {
    if (in[1].dtype == int64)
      cpu::segment_sum_rows(in[0].as<const T>(), in[1].as<const std::int64_t>(), m, op.num_segments, outer, inner, out.as<T>());
    else
      cpu::segment_sum_rows(in[0].as<const T>(), in[1].as<const std::int32_t>(), m, op.num_segments, outer, inner, out.as<T>());
  });
}

template <class = void>
void compute(cpu_backend, const ops::transpose& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int_list perm = op.permutation(xs.rank());
  const std::array<std::int64_t, max_rank> x_stride = row_major_strides(xs);
  std::array<std::int64_t, max_rank> stride{};
  for (int d = 0; d < xs.rank(); ++d) stride[d] = x_stride[perm[d]];
  const cpu::strided_walk w(out.shape, stride, 0);
  int q = 0;  // the walk dim that is contiguous in the input
  while (w.stride[q] != 1) ++q;
  cpu::visit_mover(out.dtype, [&]<class Mover>() {
    if (q == w.rank - 1)
      cpu::copy_walk<Mover>(w, in[0].data, out.data);
    else
      cpu::copy_walk_tiled<Mover>(w, q, in[0].data, out.data);
  });
}

template <class = void>
void compute(cpu_backend, const ops::slice& op, std::span<const buffer_view> in, const buffer_view& out) {
  const std::array<std::int64_t, max_rank> stride = row_major_strides(in[0].shape);
  std::int64_t base = 0;
  for (int d = 0; d < out.shape.rank(); ++d) base += op.begin[d] * stride[d];
  const cpu::strided_walk w(out.shape, stride, base);
  cpu::visit_mover(out.dtype, [&]<class Mover>() { cpu::copy_walk<Mover>(w, in[0].data, out.data); });
}

template <class = void>
void compute(cpu_backend, const ops::concat& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  const int a = ops::normalize_axis(op.axis, os.rank());
  const std::int64_t outer = elements_between(os, 0, a), inner = elements_between(os, a + 1, os.rank());
  auto run = [&](std::size_t k) { return in[k].shape[a] * inner; };
  cpu::visit_mover(out.dtype, [&]<class Mover>() { cpu::join<Mover>(in, outer, run, out); });
}

template <class = void>
void compute(cpu_backend, const ops::stack& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  const int a = ops::normalize_axis(op.axis, os.rank());
  const std::int64_t outer = elements_between(os, 0, a), inner = elements_between(os, a + 1, os.rank());
  auto run = [inner](std::size_t) { return inner; };
  cpu::visit_mover(out.dtype, [&]<class Mover>() { cpu::join<Mover>(in, outer, run, out); });
}

template <class = void>
void compute(cpu_backend, const ops::gather& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int axis = ops::normalize_axis(op.axis, in[0].shape.rank());
  const std::int64_t m = in[1].size();
  cpu::visit_mover(out.dtype, [&]<class Mover>() {
    if (in[1].dtype == int64)
      cpu::gather_rows<Mover>(in[0], in[1].as<const std::int64_t>(), m, axis, out);
    else
      cpu::gather_rows<Mover>(in[0], in[1].as<const std::int32_t>(), m, axis, out);
  });
}

}  // namespace kiln::backend

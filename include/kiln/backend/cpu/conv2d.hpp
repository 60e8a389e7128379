#pragma once
/// \file
/// 2-D convolution (cross-correlation, as TensorFlow's conv2d) on the CPU for NHWC
/// images and HWIO filters, as an implicit GEMM: output pixels are the rows of A, the
/// filter is B (k = kh, kw, in_c in that order, exactly HWIO's layout) and the
/// micro-kernels of gemm.hpp read each pixel's window straight from the image, with no
/// im2col buffer. For one kh the window row (fw pixels x in_c channels) is contiguous
/// in NHWC, so a pixel needs fh pointers; only windows that cross the border are copied
/// (zero-padded) to a small per-thread buffer.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "kiln/core/simd.hpp"

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/config.hpp"
#include "kiln/core/parallel.hpp"

namespace kiln::backend::cpu {
namespace detail {

/// Calls `fn(std::integral_constant<int, n>{})` for the runtime `n` in [1, Max], so
/// that each channel panel runs a kernel compiled for its exact width.
template <int Max, class F>
KILN_ALWAYS_INLINE void with_constant(std::int64_t n, F&& fn) {
  if constexpr (Max > 1) {
    if (n < Max) return with_constant<Max - 1>(n, std::forward<F>(fn));
  }
  fn(std::integral_constant<int, Max>{});
}

/// The geometry of one conv2d call (see kiln::backend::cpu::conv2d for the meaning).
struct conv2d_shape {
  std::int64_t batch, in_h, in_w, in_c;
  std::int64_t fh, fw, out_c;
  std::int64_t stride_h, stride_w, pad_top, pad_left;
  std::int64_t out_h, out_w;
};

/// Below this many multiply-adds a convolution runs on the calling thread alone.
inline constexpr double conv2d_parallel_work = 1 << 21;
/// Bytes of input windows that one block of tiles reads (a part of L2).
inline constexpr std::int64_t conv2d_block_bytes = 512 * 1024;

/// Register tile of the convolution for compute type `V`: `rows` output pixels by up
/// to `vectors` SIMD vectors of output channels. Output channels are cut into panels
/// of at most `vectors` vectors, as evenly as possible: with few channels (100 floats
/// are 7 vectors: 4 + 3) this wastes less than fixed-width panels, whose last panel
/// would hold one mostly empty vector.
template <class V>
struct conv2d_tiling {
  static constexpr int rows = 6;
  static constexpr int vectors = gemm_blocking<V>::wide_registers ? 4 : 2;
};

/// Fills `rows[kh * Rows + r]`, for every filter row kh, with a pointer to the fw x in_c
/// window row of output pixel `first + r` (pixels past `pixels` repeat the last one).
/// Windows inside the image point into it; the others are assembled in `edge`
/// (fh * Rows window rows) from the image and `zeros` (one window row of zeros).
template <int Rows, class V>
void gather_window_rows(const V* input, const conv2d_shape& s, std::int64_t first, std::int64_t pixels,
                        const V* zeros, V* edge, const V** rows) {
  const std::int64_t segment = s.fw * s.in_c;
  for (int r = 0; r < Rows; ++r) {
    const std::int64_t q = std::min(first + r, pixels - 1);
    const std::int64_t ow = q % s.out_w, oh = q / s.out_w % s.out_h, image = q / (s.out_w * s.out_h);
    const std::int64_t iw0 = ow * s.stride_w - s.pad_left;
    const bool inside_w = iw0 >= 0 && iw0 + s.fw <= s.in_w;
    for (std::int64_t kh = 0; kh < s.fh; ++kh) {
      const std::int64_t ih = oh * s.stride_h + kh - s.pad_top;
      const V*& row = rows[kh * Rows + r];
      if (ih < 0 || ih >= s.in_h) {
        row = zeros;
        continue;
      }
      const V* image_row = input + (image * s.in_h + ih) * s.in_w * s.in_c;
      if (inside_w) {
        row = image_row + iw0 * s.in_c;
      } else {
        V* dst = edge + (kh * Rows + r) * segment;
        for (std::int64_t kw = 0; kw < s.fw; ++kw) {
          const std::int64_t iw = iw0 + kw;
          V* pixel = dst + kw * s.in_c;
          if (iw < 0 || iw >= s.in_w)
            std::fill(pixel, pixel + s.in_c, V(0));
          else
            std::copy(image_row + iw * s.in_c, image_row + (iw + 1) * s.in_c, pixel);
        }
        row = dst;
      }
    }
  }
}

/// conv2d on compute types (see gemm_compute_t).
template <class V>
void conv2d_compute(const V* input, const V* filters, V* output, const conv2d_shape& s) {
  constexpr int rows = conv2d_tiling<V>::rows, max_vectors = conv2d_tiling<V>::vectors;
  constexpr int width = gemm_blocking<V>::width;
  const std::int64_t pixels = s.batch * s.out_h * s.out_w;
  if (pixels <= 0 || s.out_c <= 0) return;
  const std::int64_t segment = s.fw * s.in_c, depth = s.fh * segment;
  if (depth <= 0) {
    std::fill(output, output + pixels * s.out_c, V(0));
    return;
  }
  // Output channels go in panels of at most max_vectors vectors, as even as possible;
  // `fn(first_channel, std::integral_constant<int, panel_vectors>)` visits them.
  const std::int64_t vectors = (s.out_c + width - 1) / width;
  const std::int64_t panels = (vectors + max_vectors - 1) / max_vectors;
  auto for_each_panel = [&](auto&& fn) {
    for (std::int64_t p = 0; p < panels; ++p) {
      const std::int64_t first = vectors * p / panels, count = vectors * (p + 1) / panels - first;
      with_constant<max_vectors>(count, [&](auto panel_vectors) { fn(first * width, panel_vectors); });
    }
  };
  V* packed_filters = thread_scratch_as<V>(scratch_slot::conv_filter, vectors * width * depth);
  for_each_panel([&](std::int64_t j, auto panel_vectors) {
    constexpr int panel_cols = decltype(panel_vectors)::value * width;
    pack_b_panel<panel_cols>(filters + j, s.out_c, depth, std::min<std::int64_t>(panel_cols, s.out_c - j),
                             packed_filters + j * depth);
  });

  // Tiles go in blocks whose windows fill about conv2d_block_bytes, so that each filter
  // panel, streamed from L2 (or L3 when the filter is large), serves a whole block.
  const std::int64_t tiles = (pixels + rows - 1) / rows;
  const std::int64_t tile_bytes = rows * depth * std::int64_t(sizeof(V));
  const std::int64_t block = std::clamp<std::int64_t>(conv2d_block_bytes / tile_bytes, 1, 16);
  const std::int64_t blocks = (tiles + block - 1) / block;
  // Many more chunks than threads: on a busy machine a descheduled thread then holds
  // up only a small piece of the work.
  std::shared_ptr<kiln::detail::thread_pool> pool;
  if (double(pixels) * double(depth) * double(s.out_c) >= conv2d_parallel_work) pool = kiln::detail::current_pool();
  const std::int64_t chunks = pool && pool->size() > 1 ? std::min<std::int64_t>(blocks, 8 * pool->size()) : 1;
  run_tasks(chunks > 1 ? pool.get() : nullptr, chunks, [&](std::int64_t chunk) {
    const std::int64_t first_block = blocks * chunk / chunks, last_block = blocks * (chunk + 1) / chunks;
    const std::int64_t window_count = block * s.fh * rows;
    const V** window_rows = thread_scratch_as<const V*>(scratch_slot::conv_pointers, window_count);
    // One window row of zeros, then room for the window rows of a block.
    V* zeros = thread_scratch_as<V>(scratch_slot::conv_rows, (1 + window_count) * segment);
    std::fill(zeros, zeros + segment, V(0));
    for (std::int64_t b = first_block; b < last_block; ++b) {
      const std::int64_t first_tile = b * block, last_tile = std::min(tiles, first_tile + block);
      for (std::int64_t tile = first_tile; tile < last_tile; ++tile) {
        const std::int64_t slot = (tile - first_tile) * s.fh * rows;
        gather_window_rows<rows>(input, s, tile * rows, pixels, zeros, zeros + (1 + slot) * segment,
                                 window_rows + slot);
      }
      for_each_panel([&](std::int64_t j, auto panel_vectors) {
        constexpr int nv = decltype(panel_vectors)::value, panel_cols = nv * width;
        const V* b_panel = packed_filters + j * depth;
        for (std::int64_t tile = first_tile; tile < last_tile; ++tile) {
          const V* const* tile_rows = window_rows + (tile - first_tile) * s.fh * rows;
          xsimd::batch<V> acc[rows][nv];
          clear_tile(acc);
          for (std::int64_t kh = 0; kh < s.fh; ++kh)
            multiply_tile<rows, nv>(segment, pointer_rows<V>{tile_rows + kh * rows},
                                    b_panel + kh * segment * panel_cols, panel_cols, acc);
          const std::int64_t first = tile * rows;
          store_tile(acc, output + first * s.out_c + j, s.out_c, std::min<std::int64_t>(rows, pixels - first),
                     std::min<std::int64_t>(panel_cols, s.out_c - j), false);
        }
      });
    }
  });
}

}  // namespace detail

/// 2-D convolution (cross-correlation, as TensorFlow's conv2d): NHWC `input`
/// [batch, in_h, in_w, in_c] and HWIO `filters` [fh, fw, in_c, out_c] give NHWC
/// `output` [batch, out_h, out_w, out_c], overwritten (it must not overlap the inputs).
/// Output pixel (oh, ow) reads input pixels (oh * stride_h + kh - pad_top,
/// ow * stride_w + kw - pad_left); those outside the image count as zero. The caller
/// picks out_h, out_w and the padding offsets (0 for VALID; TensorFlow's SAME rule
/// gives pad_top = max(0, (out_h - 1) * stride_h + fh - in_h) / 2). T is float,
/// double, int32_t or int64_t; integer sums wrap modulo 2^bits. Large convolutions
/// use kiln's thread pool.
/// \code
/// // 1x5x5x1 image, 3x3x1x1 filter, stride 1, VALID: 1x3x3x1 output
/// std::vector<float> in(25, 1.f), k(9, 1.f), out(9);
/// kiln::backend::cpu::conv2d<float>(in.data(), 1, 5, 5, 1, k.data(), 3, 3, 1, 1, 1, 0, 0, out.data(), 3, 3);  // 9s
/// \endcode
template <class T>
void conv2d(const T* input, std::int64_t batch, std::int64_t in_h, std::int64_t in_w, std::int64_t in_c,
            const T* filters, std::int64_t fh, std::int64_t fw, std::int64_t out_c, std::int64_t stride_h,
            std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left, T* output, std::int64_t out_h,
            std::int64_t out_w) {
  static_assert(detail::is_kernel_element_v<T>,
                "kiln::backend::cpu::conv2d: T must be float, double, int32_t or int64_t");
  using V = detail::gemm_compute_t<T>;
  const detail::conv2d_shape shape{batch, in_h, in_w, in_c, fh, fw, out_c, stride_h, stride_w, pad_top, pad_left,
                                   out_h, out_w};
  detail::conv2d_compute<V>(reinterpret_cast<const V*>(input), reinterpret_cast<const V*>(filters),
                            reinterpret_cast<V*>(output), shape);
}

}  // namespace kiln::backend::cpu

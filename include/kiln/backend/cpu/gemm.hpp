#pragma once
/// \file
/// Dense matrix product on the CPU, C = A * B, for row-major float, double, int32 and
/// int64 matrices. Large products are split into cache-sized blocks that are packed
/// and multiplied by register-tiled xsimd micro-kernels on kiln's thread pool; small
/// ones read their operands in place so that a 10x10 product costs well under a
/// microsecond. Integer products wrap modulo 2^bits (they are computed in the unsigned
/// twin type), so overflow is never undefined behaviour.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "kiln/config.hpp"
#include "kiln/core/parallel.hpp"

namespace kiln::backend::cpu {
namespace detail {

/// The type a product of `T`s is computed in: `T` itself for floating point, the
/// unsigned twin for integers so that overflow wraps. Both share size and
/// representation, and a signed object may be accessed through its unsigned twin.
template <class T>
using gemm_compute_t =
    typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::type_identity<T>>::type;

/// Register tile and cache blocks of the micro-kernels for compute type `V`.
/// A tile is `rows` rows of C by `vectors` SIMD vectors of columns; its accumulators
/// (`rows * vectors` registers) must fit the register file with room for the B row
/// and the broadcast A value. `depth` (KC) keeps a packed B panel of `depth x cols`
/// in L1, `row_block` (MC) keeps a packed `row_block x depth` block of A in L2, and
/// `col_block` (NC) bounds the packed block of B that all threads share.
template <class V>
struct gemm_blocking {
  using batch = xsimd::batch<V>;
  static constexpr int width = int(batch::size);
  static constexpr bool wide_registers = sizeof(batch) >= 64;  // AVX-512: 32 registers
  static constexpr int vectors = 2;
  static constexpr int rows = wide_registers ? 12 : 6;
  static constexpr int cols = vectors * width;
  static constexpr std::int64_t depth = 512;
  static constexpr std::int64_t row_block = 48;
  static constexpr std::int64_t col_block = 3072;
};

/// Below this many multiply-adds (m * n * k) a product reads A and B in place
/// instead of packing them.
inline constexpr std::int64_t gemm_small_work = 32 * 32 * 32;
/// Below this many multiply-adds a product runs on the calling thread alone: waking
/// the pool costs more than it saves.
inline constexpr std::int64_t gemm_parallel_work = 128 * 128 * 128;

/// Buffers of `thread_scratch` that can be live at the same time on one thread.
enum class scratch_slot : int { gemm_a, gemm_b, gemm_edge, conv_filter, conv_pointers, conv_rows, count };

/// A reusable block of at least `bytes` bytes, aligned to `kiln::buffer_alignment`,
/// owned by the calling thread: it grows when asked for more and is freed when the
/// thread ends, so steady-state calls allocate nothing.
/// \code float* panel = static_cast<float*>(thread_scratch(scratch_slot::gemm_a, 4096)); \endcode
inline void* thread_scratch(scratch_slot slot, std::size_t bytes) {
  struct block {
    void* data = nullptr;
    std::size_t bytes = 0;
    block() = default;
    block(const block&) = delete;
    block& operator=(const block&) = delete;
    ~block() { ::operator delete(data, std::align_val_t{buffer_alignment}); }
  };
  thread_local block blocks[int(scratch_slot::count)];
  block& b = blocks[int(slot)];
  if (b.bytes < bytes) {
    std::size_t grown = std::max(bytes, b.bytes + b.bytes / 2);
    grown = (grown + 4095) / 4096 * 4096;
    ::operator delete(b.data, std::align_val_t{buffer_alignment});
    b.data = nullptr;
    b.bytes = 0;
    b.data = ::operator new(grown, std::align_val_t{buffer_alignment});
    b.bytes = grown;
  }
  return b.data;
}

/// `scratch_slot` storage typed as `count` elements of `V`.
template <class V>
V* thread_scratch_as(scratch_slot slot, std::int64_t count) {
  return static_cast<V*>(thread_scratch(slot, std::size_t(std::max<std::int64_t>(count, 1)) * sizeof(V)));
}

/// x * y + z in one rounding where the hardware has it. xsimd 8.1 spells fma on
/// 512-bit registers as a multiply and an add, which only fuse under contraction
/// flags the user may have turned off, so the intrinsic is called directly.
template <class V, class A>
KILN_ALWAYS_INLINE xsimd::batch<V, A> multiply_add(const xsimd::batch<V, A>& x, const xsimd::batch<V, A>& y,
                                                   const xsimd::batch<V, A>& z) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<V, float> && sizeof(x) == 64) {
    return _mm512_fmadd_ps(x, y, z);
  } else if constexpr (std::is_same_v<V, double> && sizeof(x) == 64) {
    return _mm512_fmadd_pd(x, y, z);
  } else {
    return xsimd::fma(x, y, z);
  }
#else
  return xsimd::fma(x, y, z);
#endif
}

/// Reads a packed panel of A: `rows` values per k, k after k.
template <class V, int Rows>
struct packed_rows {
  const V* data;
  KILN_ALWAYS_INLINE V at(int r) const { return data[r]; }
  KILN_ALWAYS_INLINE void advance() { data += Rows; }
};

/// Reads rows of A in place: row r starts `stride` elements after row r - 1.
template <class V>
struct strided_rows {
  const V* data;
  std::int64_t stride;
  KILN_ALWAYS_INLINE V at(int r) const { return data[r * stride]; }
  KILN_ALWAYS_INLINE void advance() { ++data; }
};

/// Asks the cache for the line `bytes` past `p`. The address is formed as an integer
/// because it may lie past the end of the array, where pointer arithmetic is undefined;
/// a prefetch never faults.
KILN_ALWAYS_INLINE void prefetch_ahead(const void* p, std::ptrdiff_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + std::uintptr_t(bytes)));
}

/// How many rows of B ahead the micro-kernel prefetches: the hardware streamer alone
/// leaves the FMA units waiting on L2.
inline constexpr std::ptrdiff_t gemm_prefetch_rows = 32;

/// Adds A[Rows x kc] * B[kc x Vectors*width] to the accumulators `acc`. A is read
/// through `a` (see packed_rows, strided_rows), B row p starts at `b + p * ldb`.
template <int Rows, int Vectors, class V, class ARows>
KILN_ALWAYS_INLINE void multiply_tile(std::int64_t kc, ARows a, const V* KILN_RESTRICT b, std::int64_t ldb,
                                      xsimd::batch<V> (&acc)[Rows][Vectors]) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  for (std::int64_t p = 0; p < kc; ++p, b += ldb, a.advance()) {
    batch b_row[Vectors];
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) b_row[v] = batch::load_unaligned(b + v * width);
#pragma GCC unroll 8
    for (std::ptrdiff_t line = 0; line < std::ptrdiff_t(sizeof(b_row)); line += 64)
      prefetch_ahead(b, gemm_prefetch_rows * ldb * std::ptrdiff_t(sizeof(V)) + line);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const batch a_value(a.at(r));
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) acc[r][v] = multiply_add(a_value, b_row[v], acc[r][v]);
    }
  }
}

/// Zeroes a tile of accumulators.
template <int Rows, int Vectors, class V>
KILN_ALWAYS_INLINE void clear_tile(xsimd::batch<V> (&acc)[Rows][Vectors]) {
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) acc[r][v] = xsimd::batch<V>(V(0));
}

/// Writes the top-left `rows x cols` of a tile to C (row stride `ldc`), adding to what
/// is there when `accumulate`. Full tiles go straight from registers; edge tiles go
/// through a buffer so nothing outside C is touched.
template <int Rows, int Vectors, class V>
KILN_ALWAYS_INLINE void store_tile(const xsimd::batch<V> (&acc)[Rows][Vectors], V* c, std::int64_t ldc,
                                   std::int64_t rows, std::int64_t cols, bool accumulate) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  constexpr int tile_cols = Vectors * width;
  if (rows == Rows && cols == tile_cols) {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) {
        V* dst = c + r * ldc + v * width;
        batch x = acc[r][v];
        if (accumulate) x += batch::load_unaligned(dst);
        x.store_unaligned(dst);
      }
    return;
  }
  alignas(64) V tile[Rows * tile_cols];
  for (int r = 0; r < Rows; ++r)
    for (int v = 0; v < Vectors; ++v) acc[r][v].store_aligned(tile + r * tile_cols + v * width);
  for (std::int64_t r = 0; r < rows; ++r) {
    V* dst = c + r * ldc;
    const V* src = tile + r * tile_cols;
    if (accumulate)
      for (std::int64_t j = 0; j < cols; ++j) dst[j] += src[j];
    else
      std::copy(src, src + cols, dst);
  }
}

/// Calls `fn(std::integral_constant<int, n>{})` for the runtime `n` in [1, Max], so
/// that edge tiles run a kernel compiled for their exact size.
template <int Max, class F>
KILN_ALWAYS_INLINE void with_constant(std::int64_t n, F&& fn) {
  if constexpr (Max > 1) {
    if (n < Max) return with_constant<Max - 1>(n, std::forward<F>(fn));
  }
  fn(std::integral_constant<int, Max>{});
}

/// Copies columns [j0, j0 + cols) of a `kc`-row slice of B into `dst` as `kc x Cols`
/// rows, zero-filling the columns past `cols`.
template <int Cols, class V>
KILN_ALWAYS_INLINE void pack_b_panel(const V* b, std::int64_t ldb, std::int64_t kc, std::int64_t cols, V* dst) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  if (cols == Cols) {
    // Whole vectors: std::copy of a runtime-sized row would call memmove per row.
    for (std::int64_t p = 0; p < kc; ++p, b += ldb, dst += Cols)
#pragma GCC unroll 8
      for (int v = 0; v < Cols / width; ++v) batch::load_unaligned(b + v * width).store_aligned(dst + v * width);
    return;
  }
  for (std::int64_t p = 0; p < kc; ++p, b += ldb, dst += Cols) {
    std::copy(b, b + cols, dst);
    std::fill(dst + cols, dst + Cols, V(0));
  }
}

/// Packs a `kc x nc` block of B into panels of `gemm_blocking<V>::cols` columns,
/// panels [first, last) only (threads pack disjoint ranges of one shared block).
template <class V>
void pack_b(const V* b, std::int64_t ldb, std::int64_t kc, std::int64_t nc, std::int64_t first, std::int64_t last,
            V* dst) {
  constexpr int cols = gemm_blocking<V>::cols;
  for (std::int64_t panel = first; panel < last; ++panel) {
    const std::int64_t j = panel * cols;
    pack_b_panel<cols>(b + j, ldb, kc, std::min<std::int64_t>(cols, nc - j), dst + panel * cols * kc);
  }
}

/// Packs an `mc x kc` block of A into panels of `gemm_blocking<V>::rows` rows stored k
/// after k; rows past `mc` are zero.
template <class V>
void pack_a(const V* a, std::int64_t lda, std::int64_t mc, std::int64_t kc, V* dst) {
  constexpr int rows = gemm_blocking<V>::rows;
  for (std::int64_t i = 0; i < mc; i += rows, dst += rows * kc) {
    const std::int64_t height = std::min<std::int64_t>(rows, mc - i);
    const V* src = a + i * lda;
    if (height == rows) {
      for (std::int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 16
        for (int r = 0; r < rows; ++r) dst[p * rows + r] = src[r * lda + p];
    } else {
      for (std::int64_t p = 0; p < kc; ++p)
        for (int r = 0; r < rows; ++r) dst[p * rows + r] = r < height ? src[r * lda + p] : V(0);
    }
  }
}

/// C[mc x nc] (+)= packed A block * packed B block, tile by tile: each B panel stays
/// in L1 while the A panels stream past it.
template <class V>
void multiply_packed(std::int64_t mc, std::int64_t nc, std::int64_t kc, const V* ap, const V* bp, V* c,
                     std::int64_t ldc, bool accumulate) {
  using blocking = gemm_blocking<V>;
  constexpr int rows = blocking::rows, vectors = blocking::vectors, cols = blocking::cols;
  for (std::int64_t j = 0; j < nc; j += cols) {
    const V* b_panel = bp + j * kc;
    for (std::int64_t i = 0; i < mc; i += rows) {
      V* c_tile = c + i * ldc + j;
      // C is far away in memory: start fetching it now, it is needed after the k loop.
      for (std::int64_t r = 0, height = std::min<std::int64_t>(rows, mc - i); r < height; ++r) {
        __builtin_prefetch(c_tile + r * ldc, 1);
        __builtin_prefetch(c_tile + r * ldc + std::min<std::int64_t>(cols, nc - j) - 1, 1);
      }
      xsimd::batch<V> acc[rows][vectors];
      clear_tile(acc);
      multiply_tile<rows, vectors>(kc, packed_rows<V, rows>{ap + i * kc}, b_panel, cols, acc);
      store_tile(acc, c_tile, ldc, std::min<std::int64_t>(rows, mc - i), std::min<std::int64_t>(cols, nc - j), accumulate);
    }
  }
}

/// Splits `total` into `parts` near-equal pieces, each a multiple of `quantum`
/// except the last; returns the piece size.
inline std::int64_t even_split(std::int64_t total, std::int64_t parts, std::int64_t quantum) {
  const std::int64_t piece = (total + parts - 1) / parts;
  return (piece + quantum - 1) / quantum * quantum;
}

/// Runs `fn(i)` for i in [0, tasks) on `pool`, or inline when there is none.
template <class F>
void run_tasks(kiln::detail::thread_pool* pool, std::int64_t tasks, F&& fn) {
  if (pool == nullptr || tasks <= 1) {
    for (std::int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  pool->run(tasks, fn);
}

/// The blocked, packed product for large matrices (see gemm_blocking). Every thread
/// packs its own blocks of A; the block of B is packed once and shared.
template <class V>
void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                 std::int64_t ldb, V* c, std::int64_t ldc, kiln::detail::thread_pool* pool) {
  using blocking = gemm_blocking<V>;
  const std::int64_t threads = pool ? pool->size() : 1;
  const std::int64_t nc_max = even_split(n, (n + blocking::col_block - 1) / blocking::col_block, blocking::cols);
  const std::int64_t kc_max = even_split(k, (k + blocking::depth - 1) / blocking::depth, 8);
  // Row blocks come in multiples of the thread count so that threads finish together;
  // when there are too few rows, threads also split the columns.
  std::int64_t row_tasks = (m + blocking::row_block - 1) / blocking::row_block;
  row_tasks = std::min((row_tasks + threads - 1) / threads * threads, (m + blocking::rows - 1) / blocking::rows);
  const std::int64_t mc_max = even_split(m, row_tasks, blocking::rows);
  row_tasks = (m + mc_max - 1) / mc_max;
  const std::int64_t col_groups = row_tasks >= threads ? 1 : (threads + row_tasks - 1) / row_tasks;

  V* bp = thread_scratch_as<V>(scratch_slot::gemm_b, nc_max * kc_max + blocking::cols * kc_max);
  for (std::int64_t jc = 0; jc < n; jc += nc_max) {
    const std::int64_t nc = std::min(nc_max, n - jc);
    const std::int64_t panels = (nc + blocking::cols - 1) / blocking::cols;
    const std::int64_t panels_per_group = (panels + col_groups - 1) / col_groups;
    for (std::int64_t pc = 0; pc < k; pc += kc_max) {
      const std::int64_t kc = std::min(kc_max, k - pc);
      const std::int64_t pack_tasks = std::min(threads, panels);
      run_tasks(pool, pack_tasks, [&](std::int64_t t) {
        pack_b(b + pc * ldb + jc, ldb, kc, nc, panels * t / pack_tasks, panels * (t + 1) / pack_tasks, bp);
      });
      run_tasks(pool, row_tasks * col_groups, [&](std::int64_t t) {
        const std::int64_t ic = (t / col_groups) * mc_max, mc = std::min(mc_max, m - ic);
        const std::int64_t first = (t % col_groups) * panels_per_group * blocking::cols;
        if (first >= nc) return;
        const std::int64_t width = std::min(panels_per_group * blocking::cols, nc - first);
        V* ap = thread_scratch_as<V>(scratch_slot::gemm_a, (mc_max + blocking::rows) * kc_max);
        pack_a(a + ic * lda + pc, lda, mc, kc, ap);
        multiply_packed(mc, width, kc, ap, bp + first * kc, c + ic * ldc + jc + first, ldc, pc != 0);
      });
    }
  }
}

/// The product for small matrices: A is read in place, B too except for its last
/// columns when they do not fill a SIMD vector, which are copied zero-padded.
template <class V>
void gemm_small(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                std::int64_t ldb, V* c, std::int64_t ldc) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  constexpr int tile_rows = 4;
  auto columns = [&](auto vectors, const V* b_cols, std::int64_t b_stride, std::int64_t j, std::int64_t cols) {
    constexpr int nv = decltype(vectors)::value;
    for (std::int64_t i = 0; i < m; i += tile_rows) {
      with_constant<tile_rows>(std::min<std::int64_t>(tile_rows, m - i), [&](auto height) {
        constexpr int mr = decltype(height)::value;
        batch acc[mr][nv];
        clear_tile(acc);
        multiply_tile<mr, nv>(k, strided_rows<V>{a + i * lda, lda}, b_cols, b_stride, acc);
        store_tile(acc, c + i * ldc + j, ldc, mr, cols, false);
      });
    }
  };
  const std::int64_t full = n / width * width;
  std::int64_t j = 0;
  for (; j + 2 * width <= full; j += 2 * width) columns(std::integral_constant<int, 2>{}, b + j, ldb, j, 2 * width);
  if (j < full) {
    columns(std::integral_constant<int, 1>{}, b + j, ldb, j, width);
    j += width;
  }
  if (j < n) {
    V* tail = thread_scratch_as<V>(scratch_slot::gemm_edge, k * width);
    pack_b_panel<width>(b + j, ldb, k, n - j, tail);
    columns(std::integral_constant<int, 1>{}, tail, width, j, n - j);
  }
}

/// gemm on compute types (see gemm_compute_t).
template <class V>
void gemm_compute(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                  std::int64_t ldb, V* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, V(0));
    return;
  }
  const std::int64_t work = m * n * k;
  if (work <= gemm_small_work) return gemm_small(m, n, k, a, lda, b, ldb, c, ldc);
  if (work < gemm_parallel_work) return gemm_packed(m, n, k, a, lda, b, ldb, c, ldc, nullptr);
  auto pool = kiln::detail::current_pool();
  gemm_packed(m, n, k, a, lda, b, ldb, c, ldc, pool->size() > 1 ? pool.get() : nullptr);
}

}  // namespace detail

/// C[m x n] = A[m x k] * B[k x n] for row-major matrices with leading dimensions
/// (row strides, in elements) lda >= k, ldb >= n, ldc >= n; C is overwritten and must
/// not overlap A or B. T is float, double, int32_t or int64_t; integer products wrap
/// modulo 2^bits. k == 0 gives C = 0. Large products use kiln's thread pool
/// (kiln::config::num_threads()).
/// \code
/// std::vector<float> a(2 * 3, 1.f), b(3 * 4, 2.f), c(2 * 4);
/// kiln::backend::cpu::gemm<float>(2, 4, 3, a.data(), 3, b.data(), 4, c.data(), 4);  // every c == 6
/// \endcode
template <class T>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
          T* c, std::int64_t ldc) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "kiln::backend::cpu::gemm: T must be a number");
  using V = detail::gemm_compute_t<T>;
  detail::gemm_compute<V>(m, n, k, reinterpret_cast<const V*>(a), lda, reinterpret_cast<const V*>(b), ldb,
                          reinterpret_cast<V*>(c), ldc);
}

}  // namespace kiln::backend::cpu

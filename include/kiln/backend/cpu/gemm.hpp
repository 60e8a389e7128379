#pragma once
/// \file
/// Dense matrix product on the CPU, C = A * B, for row-major float, double, int32 and
/// int64 matrices. Register-tiled xsimd micro-kernels (12 rows x 2 vectors of columns
/// on AVX-512) read A in place; large products pack cache-sized blocks of B, shared by
/// kiln's thread pool, while small ones read B in place too, so that a 10x10 product
/// takes about 100 ns. Integer products wrap modulo 2^bits (they are computed in the
/// unsigned twin type), so overflow is never undefined behaviour.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "kiln/core/simd.hpp"

#include "kiln/backend/cpu/streaming.hpp"
#include "kiln/config.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/ops/math.hpp"

namespace kiln::backend::cpu {
namespace detail {

/// The type a product of `T`s is computed in: `T` itself for floating point, the
/// unsigned twin for integers so that overflow wraps. Both share size and
/// representation, and a signed object may be accessed through its unsigned twin.
template <class T>
using gemm_compute_t =
    typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::type_identity<T>>::type;

/// Whether the GEMM and convolution kernels take elements of type `T`: float, double
/// and 32- or 64-bit integers (narrower ones would promote to int and could overflow).
template <class T>
inline constexpr bool is_kernel_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (std::is_integral_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8));

/// Register tile and cache blocks of the micro-kernels for compute type `V`.
/// A tile is `rows` rows of C by `vectors` SIMD vectors of columns; its accumulators
/// (`rows * vectors` registers) must fit the register file with room for the B row
/// and the broadcast A value. A packed B panel (`depth x cols`, KC x NR) is reused by
/// the row tiles of a `row_block x depth` block of A (MC x KC, read in place) that
/// stays in L2; `col_block` (NC) bounds the packed block of B that all threads share.
/// The sizes were tuned against OpenBLAS on AVX-512.
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
  static constexpr std::int64_t col_block = 1024;
};

/// Up to this many multiply-adds (m * n * k) a product reads B in place instead of
/// packing it.
inline constexpr double gemm_direct_work = 256.0 * 256 * 256;
/// Below this many multiply-adds a product runs on the calling thread alone: waking
/// the pool costs more than it saves.
inline constexpr double gemm_parallel_work = 128.0 * 128 * 128;

/// Buffers of `thread_scratch` that can be live at the same time on one thread.
enum class scratch_slot : int { gemm_b, gemm_edge, conv_filter, conv_pointers, conv_rows, count };

/// A reusable block of at least `bytes` bytes, aligned to `kiln::buffer_alignment`,
/// owned by the calling thread: it grows when asked for more and is freed when the
/// thread ends, so steady-state calls allocate nothing.
/// \code
/// using namespace kiln::backend::cpu::detail;
/// float* panel = static_cast<float*>(thread_scratch(scratch_slot::gemm_b, 4096));
/// \endcode
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

/// Reads rows of A in place through one pointer per row (rows of a tile need not be
/// evenly spaced: edge tiles repeat their last row, convolutions point into images).
template <class V>
struct pointer_rows {
  const V* const* row;
  std::int64_t p = 0;
  KILN_ALWAYS_INLINE V at(int r) const { return row[r][p]; }
  KILN_ALWAYS_INLINE void advance() { ++p; }
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
/// through `a` (`a.at(r)` is row r at the current k, `a.advance()` moves to the next
/// k; see pointer_rows), B row p starts at `b + p * ldb`.
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
      for (int v = 0; v < Vectors; ++v) acc[r][v] = math::multiply_add(a_value, b_row[v], acc[r][v]);
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
/// is there when `accumulate`. Edge tiles use partial stores, so nothing outside C is
/// touched.
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
  // Indexing `acc` with a runtime row would make clang keep the whole tile in memory,
  // inside the k loop too; a copy indexed by constants avoids that.
  batch tile[Rows][Vectors];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) tile[r][v] = acc[r][v];
  for (std::int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < Vectors; ++v) {
      const std::int64_t count = std::min<std::int64_t>(width, cols - v * width);
      if (count <= 0) break;
      V* dst = c + r * ldc + v * width;
      batch x = tile[r][v];
      if (accumulate) x += load_partial(dst, count);
      store_partial(x, dst, count);
    }
}

/// Copies columns [j0, j0 + cols) of a `kc`-row slice of B into `dst` as `kc x Cols`
/// rows, zero-filling the columns past `cols`.
template <int Cols, class V>
KILN_ALWAYS_INLINE void pack_b_panel(const V* b, std::int64_t ldb, std::int64_t kc, std::int64_t cols, V* dst) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  if (cols == Cols) {
    for (std::int64_t p = 0; p < kc; ++p, b += ldb, dst += Cols)
#pragma GCC unroll 8
      for (int v = 0; v < Cols / width; ++v) batch::load_unaligned(b + v * width).store_aligned(dst + v * width);
    return;
  }
  for (std::int64_t p = 0; p < kc; ++p, b += ldb, dst += Cols)
#pragma GCC unroll 8
    for (int v = 0; v < Cols / width; ++v)
      load_partial(b + v * width, std::clamp<std::int64_t>(cols - v * width, 0, width)).store_aligned(dst + v * width);
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

/// Calls `fn(std::integral_constant<int, c>{})` with the smallest c in
/// {1, 2, 4, 8, ..., Max} that is at least `n` (1 <= n <= Max): edge tiles get a
/// kernel close to their size without compiling one for every size.
template <int Max, class F>
KILN_ALWAYS_INLINE void with_size_class(std::int64_t n, F&& fn) {
  if constexpr (Max > 1) {
    constexpr int smaller = int(std::bit_floor(unsigned(Max - 1)));
    if (n <= smaller) return with_size_class<smaller>(n, std::forward<F>(fn));
  }
  fn(std::integral_constant<int, Max>{});
}

/// C[m x cols] (+)= A[m x kc] * B[kc x cols] for one panel of at most `Vectors`
/// vectors of columns, in tiles of at most `Rows` rows: A is read in place (row
/// stride lda), B rows start at b + p * ldb and must be readable for Vectors whole
/// vectors. Each B panel stays in cache while the row tiles pass over it.
template <int Vectors, int Rows, class V>
void multiply_panel(std::int64_t m, std::int64_t cols, std::int64_t kc, const V* a, std::int64_t lda, const V* b,
                    std::int64_t ldb, V* c, std::int64_t ldc, bool accumulate) {
  for (std::int64_t i = 0; i < m; i += Rows) {
    const std::int64_t height = std::min<std::int64_t>(Rows, m - i);
    V* c_tile = c + i * ldc;
    // C is far away in memory: start fetching it now, it is needed after the k loop.
    for (std::int64_t r = 0; r < height; ++r) {
      __builtin_prefetch(c_tile + r * ldc, 1);
      __builtin_prefetch(c_tile + r * ldc + cols - 1, 1);
    }
    with_size_class<Rows>(height, [&](auto tile_height) {
      constexpr int h = decltype(tile_height)::value;
      const V* row[h];
      for (int r = 0; r < h; ++r) row[r] = a + (i + std::min<std::int64_t>(r, height - 1)) * lda;
      xsimd::batch<V> acc[h][Vectors];
      clear_tile(acc);
      multiply_tile<h, Vectors>(kc, pointer_rows<V>{row}, b, ldb, acc);
      store_tile(acc, c_tile, ldc, height, cols, accumulate);
    });
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

/// The blocked product for large matrices (see gemm_blocking): blocks of B are packed
/// once and shared by the threads, which split the rows of C (and its columns when
/// there are too few rows) and read A in place.
template <class V>
void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                 std::int64_t ldb, V* c, std::int64_t ldc, kiln::detail::thread_pool* pool) {
  using blocking = gemm_blocking<V>;
  const std::int64_t threads = pool ? pool->size() : 1;
  const std::int64_t nc_max = even_split(n, (n + blocking::col_block - 1) / blocking::col_block, blocking::cols);
  const std::int64_t kc_max = even_split(k, (k + blocking::depth - 1) / blocking::depth, 8);
  // Row blocks come in multiples of the thread count so that threads finish together.
  std::int64_t row_tasks = (m + blocking::row_block - 1) / blocking::row_block;
  row_tasks = std::min((row_tasks + threads - 1) / threads * threads, (m + blocking::rows - 1) / blocking::rows);
  const std::int64_t mc_max = even_split(m, row_tasks, blocking::rows);
  row_tasks = (m + mc_max - 1) / mc_max;
  const std::int64_t col_groups = row_tasks >= threads ? 1 : (threads + row_tasks - 1) / row_tasks;

  V* bp = thread_scratch_as<V>(scratch_slot::gemm_b, (nc_max + blocking::cols) * kc_max);
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
        const std::int64_t first = (t % col_groups) * panels_per_group, last = std::min(panels, first + panels_per_group);
        for (std::int64_t panel = first; panel < last; ++panel) {
          const std::int64_t j = panel * blocking::cols, cols = std::min<std::int64_t>(blocking::cols, nc - j);
          // The last panel skips its vectors that hold only zero padding.
          with_size_class<blocking::vectors>((cols + blocking::width - 1) / blocking::width, [&](auto vectors) {
            multiply_panel<decltype(vectors)::value, blocking::rows>(mc, cols, kc, a + ic * lda + pc, lda, bp + j * kc, blocking::cols,
                                                     c + ic * ldc + jc + j, ldc, pc != 0);
          });
        }
      });
    }
  }
}

/// The product without packing, for small matrices and few rows: A and B are read in
/// place, except the last columns of B when they do not fill a panel, which are copied
/// zero-padded. Tiles are at most `Rows` x `Vectors` vectors; threads split rows and
/// panels.
template <int Rows, int Vectors, class V>
void gemm_direct(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                 std::int64_t ldb, V* c, std::int64_t ldc, kiln::detail::thread_pool* pool) {
  constexpr int width = gemm_blocking<V>::width, cols = Vectors * width;
  const std::int64_t full_panels = n / cols, tail = n - full_panels * cols;
  const std::int64_t tail_vectors = (tail + width - 1) / width;
  const std::int64_t panels = full_panels + (tail > 0);
  V* tail_panel = nullptr;
  if (tail > 0) {
    tail_panel = thread_scratch_as<V>(scratch_slot::gemm_edge, k * cols);
    with_size_class<Vectors>(tail_vectors, [&](auto vectors) {
      pack_b_panel<decltype(vectors)::value * width>(b + full_panels * cols, ldb, k, tail, tail_panel);
    });
  }
  const std::int64_t threads = pool ? pool->size() : 1;
  const std::int64_t row_tasks = std::min((m + Rows - 1) / Rows, (2 * threads + panels - 1) / panels);
  const std::int64_t mc = even_split(m, row_tasks, Rows);
  run_tasks(pool, row_tasks * panels, [&](std::int64_t t) {
    const std::int64_t i = (t / panels) * mc, panel = t % panels, j = panel * cols;
    if (i >= m) return;
    const std::int64_t rows = std::min(mc, m - i);
    if (panel < full_panels) {
      multiply_panel<Vectors, Rows>(rows, cols, k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, false);
      return;
    }
    with_size_class<Vectors>(tail_vectors, [&](auto vectors) {
      constexpr int nv = decltype(vectors)::value;
      multiply_panel<nv, Rows>(rows, tail, k, a + i * lda, lda, tail_panel, nv * width, c + i * ldc + j, ldc, false);
    });
  });
}

/// C[m x 1] = A * b for a single column: one dot product per row, vectorized along k.
template <class V>
void gemm_column(std::int64_t m, std::int64_t k, const V* a, std::int64_t lda, const V* b, std::int64_t ldb, V* c,
                 std::int64_t ldc, kiln::detail::thread_pool* pool) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  V* column = thread_scratch_as<V>(scratch_slot::gemm_edge, k);
  for (std::int64_t p = 0; p < k; ++p) column[p] = b[p * ldb];
  const std::int64_t row_tasks = pool ? std::min<std::int64_t>(m, 4 * pool->size()) : 1;
  run_tasks(pool, row_tasks, [&](std::int64_t t) {
    for (std::int64_t i = m * t / row_tasks, end = m * (t + 1) / row_tasks; i < end; ++i) {
      const V* row = a + i * lda;
      batch sums[4] = {batch(V(0)), batch(V(0)), batch(V(0)), batch(V(0))};
      std::int64_t p = 0;
      for (; p + 4 * width <= k; p += 4 * width)
        for (int u = 0; u < 4; ++u)
          sums[u] = math::multiply_add(batch::load_unaligned(row + p + u * width), batch::load_aligned(column + p + u * width),
                                 sums[u]);
      for (; p + width <= k; p += width)
        sums[0] = math::multiply_add(batch::load_unaligned(row + p), batch::load_unaligned(column + p), sums[0]);
      // Summed by hand: xsimd::hadd on AVX-512 trips GCC 12's -Wmaybe-uninitialized.
      alignas(64) V lanes[width];
      ((sums[0] + sums[1]) + (sums[2] + sums[3])).store_aligned(lanes);
      V sum = V(0);
      for (V lane : lanes) sum += lane;
      for (; p < k; ++p) sum += row[p] * column[p];
      c[i * ldc] = sum;
    }
  });
}

/// Whether gemm computes an m x n x k product without packing B (gemm_direct): each
/// element is then one fused multiply-add chain over k, from zero and in order.
template <class V>
constexpr bool gemm_unpacked(std::int64_t m, std::int64_t n, std::int64_t k) {
  const double work = double(m) * double(n) * double(k);  // m * n * k may not fit 64 bits
  // One or two rows stream B once; packing B pays off only when many rows reuse it.
  return n != 1 && k > 0 && (m <= 2 || work <= gemm_direct_work || m <= 2 * gemm_blocking<V>::rows);
}

/// gemm on compute types (see gemm_compute_t).
template <class V>
void gemm_compute(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                  std::int64_t ldb, V* c, std::int64_t ldc) {
  using blocking = gemm_blocking<V>;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, V(0));
    return;
  }
  const double work = double(m) * double(n) * double(k);  // m * n * k may not fit 64 bits
  kiln::detail::thread_pool* pool = nullptr;
  std::shared_ptr<kiln::detail::thread_pool> held;
  if (work >= gemm_parallel_work) {
    held = kiln::detail::current_pool();
    if (held->size() > 1) pool = held.get();
  }
  if (n == 1) return gemm_column(m, k, a, lda, b, ldb, c, ldc, pool);
  if constexpr (std::is_integral_v<V>) {
    // Integer products are rare and small (the guides' power): one kernel serves them
    // all, rather than packing and wide panels compiling two more sets of tiles for
    // each integer type in every program that calls matmul.
    return gemm_direct<blocking::rows, blocking::vectors>(m, n, k, a, lda, b, ldb, c, ldc, pool);
  }
  if (!gemm_unpacked<V>(m, n, k)) return gemm_packed(m, n, k, a, lda, b, ldb, c, ldc, pool);
  // One or two rows: wide panels read long contiguous runs of B's rows.
  if (m <= 2) return gemm_direct<2, 4 * blocking::vectors>(m, n, k, a, lda, b, ldb, c, ldc, pool);
  gemm_direct<blocking::rows, blocking::vectors>(m, n, k, a, lda, b, ldb, c, ldc, pool);
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
  static_assert(detail::is_kernel_element_v<T>, "kiln::backend::cpu::gemm: T must be float, double, int32_t or int64_t");
  using V = detail::gemm_compute_t<T>;
  detail::gemm_compute<V>(m, n, k, reinterpret_cast<const V*>(a), lda, reinterpret_cast<const V*>(b), ldb,
                          reinterpret_cast<V*>(c), ldc);
}

}  // namespace kiln::backend::cpu

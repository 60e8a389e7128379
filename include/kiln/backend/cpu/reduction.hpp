#pragma once
/// \file
/// CPU reduction kernels. Size-1 dims are dropped and neighbouring dims with the
/// same role merged, so most reductions become rows (the reduced elements are
/// contiguous: SIMD with several accumulators) or columns (a kept contiguous dim
/// follows the reduced one: SIMD across the kept columns); interleaved axes lists
/// take a strided path. Every output is a pairwise tree over fixed-size leaves whose
/// shape depends only on the input's shape: float sums stay accurate, and results
/// are the same whatever the thread count, because threads only choose who
/// evaluates which subtree.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/core/simd.hpp"

#include "kiln/backend/backend.hpp"
#include "kiln/core/allocator.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"

namespace kiln::backend {
namespace cpu {

/// Elements per leaf when the reduced elements are contiguous (or strided): a
/// float sum adds at most leaf / (SIMD lanes x accumulators) values in sequence.
inline constexpr std::int64_t reduction_leaf = 4096;
/// Rows per leaf when reducing columns; argmax counts rows within a leaf in the
/// element type, which is exact for this many.
inline constexpr std::int64_t column_leaf_rows = 64;
/// Elements per parallel task: below this, threads cost more than they save.
inline constexpr std::int64_t reduction_grain = std::int64_t(1) << 15;

// ---- what a reduction combines ---------------------------------------------------
// A reducer combines partial results (scalars for sum/max/min, value and index for
// argmax); value reducers also combine xsimd batches lane by lane.

/// NaN test for scalars and batches. (On AVX-512, xsimd's `!=` is an ordered
/// compare, so `v != v` is false for NaN there.)
template <class V>
auto is_nan(const V& v) {
  if constexpr (std::is_arithmetic_v<V>)
    return v != v;
  else
    return xsimd::isnan(v);
}

template <class T>
struct sum_reducer {
  using value_type = T;
  using partial = T;
  static constexpr bool indexed = false;
  static constexpr T identity() { return T(0); }
  template <class V>
  static V combine(const V& a, const V& b) {
    return math::add(a, b);
  }
  static T horizontal(const xsimd::batch<T>& b) { return xsimd::hadd(b); }
};

template <class T, bool Largest>
struct extremum_reducer {
  using value_type = T;
  using partial = T;
  static constexpr bool indexed = false;
  static constexpr T identity() {
    using limits = std::numeric_limits<T>;
    if constexpr (std::is_floating_point_v<T>)
      return Largest ? -limits::infinity() : limits::infinity();
    else
      return Largest ? limits::lowest() : limits::max();
  }
  /// The larger (smaller) of `a` and `b`, NaN if either is, as TensorFlow.
  template <class V>
  static V combine(const V& a, const V& b) {
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (Largest)
        return math::select((a > b) | is_nan(a), a, b);
      else
        return math::select((a < b) | is_nan(a), a, b);
    } else if constexpr (Largest) {
      return math::max(a, b);
    } else {
      return math::min(a, b);
    }
  }
  /// The lanes folded in halves. NaN is settled first, so that the fold can use
  /// plain comparisons, which compile to branch-free min/max instructions.
  static T horizontal(const xsimd::batch<T>& b) {
    if constexpr (std::is_floating_point_v<T>)
      if (xsimd::any(is_nan(b))) return std::numeric_limits<T>::quiet_NaN();
    std::array<T, xsimd::batch<T>::size> lanes;
    b.store_unaligned(lanes.data());
    for (std::size_t half = lanes.size() / 2; half > 0; half /= 2)
      for (std::size_t i = 0; i < half; ++i)
        lanes[i] = (Largest ? lanes[i + half] > lanes[i] : lanes[i + half] < lanes[i]) ? lanes[i + half] : lanes[i];
    return lanes[0];
  }
};

/// argmax's partial result: the best value of a range and where it is.
template <class T>
struct indexed_value {
  T value;
  std::int64_t index;
};

template <class T>
struct argmax_reducer {
  using value_type = T;
  using partial = indexed_value<T>;
  static constexpr bool indexed = true;
  /// Where `a` beats `b`: it is larger, or the first NaN. Scalars or batches.
  template <class V>
  static auto beats(const V& a, const V& b) {
    if constexpr (std::is_floating_point_v<T>)
      return (a > b) | (is_nan(a) & !is_nan(b));
    else
      return a > b;
  }
  /// `left` covers smaller indices, so it wins ties.
  static partial combine(const partial& left, const partial& right) {
    return beats(right.value, left.value) ? right : left;
  }
};

template <ops::reduction_kind K, class T>
using reducer_for = std::conditional_t<
    K == ops::reduction_kind::argmax, argmax_reducer<T>,
    std::conditional_t<K == ops::reduction_kind::max, extremum_reducer<T, true>,
                       std::conditional_t<K == ops::reduction_kind::min, extremum_reducer<T, false>, sum_reducer<T>>>>;

/// What a reduction writes for a partial result: the value, or argmax's index.
template <class R>
auto finish(const typename R::partial& p) {
  if constexpr (R::indexed)
    return p.index;
  else
    return p;
}

// ---- the pairwise tree -----------------------------------------------------------
// The tree's recursion and its parallel split are compiled once for every
// reduction: they see partial results as `size` bytes and reach the leaves and
// the combine through function pointers, one indirect call per leaf of thousands
// of elements.

/// How a tree makes and combines partial results of `size` bytes.
struct tree_steps {
  const void* context;
  void (*leaf)(const void* context, std::int64_t index, std::byte* out);
  void (*combine)(const void* context, std::byte* left, const std::byte* right);  ///< left = left (+) right
  std::size_t size;
};

/// Combines leaves [lo, hi) into `out` as a binary tree split at the middle, so its
/// shape depends only on the number of leaves. `scratch` holds a partial per level.
inline void pairwise(const tree_steps& s, std::int64_t lo, std::int64_t hi, std::byte* out, std::byte* scratch) {
  if (hi - lo == 1) return s.leaf(s.context, lo, out);
  const std::int64_t mid = lo + (hi - lo) / 2;
  pairwise(s, lo, mid, out, scratch);
  pairwise(s, mid, hi, scratch, scratch + s.size);
  s.combine(s.context, out, scratch);
}

/// Room for partial results, from the host's caching allocator (a thread's recently
/// freed blocks), so that a reduction in steady state allocates nothing.
class tree_buffer {
 public:
  explicit tree_buffer(std::size_t bytes)
      : bytes_(bytes), data_(static_cast<std::byte*>(kiln::detail::host_allocator().allocate(bytes))) {}
  ~tree_buffer() { kiln::detail::host_allocator().deallocate(data_, bytes_); }
  tree_buffer(const tree_buffer&) = delete;
  tree_buffer& operator=(const tree_buffer&) = delete;
  std::byte* data() { return data_; }

 private:
  std::size_t bytes_;
  std::byte* data_;
};

/// The bytes of one partial per level of a tree of `leaves` leaves.
inline std::size_t tree_scratch_bytes(const tree_steps& s, std::int64_t leaves) {
  return std::size_t(std::bit_width(std::uint64_t(leaves)) + 1) * s.size;
}

/// The same tree as `pairwise(s, 0, leaves, ...)`, with its subtrees a few levels
/// down evaluated in parallel and combined above in the same order.
inline void pairwise_parallel(const tree_steps& s, std::int64_t leaves, std::byte* out) {
  constexpr int split_depth = 5;
  constexpr std::size_t most_subtrees = std::size_t(1) << split_depth;  // enough to balance a pool
  struct range {
    std::int64_t lo, hi;
  };
  std::array<range, most_subtrees> subtrees;
  std::size_t count = 0;
  auto collect = [&](auto& self, std::int64_t lo, std::int64_t hi, int depth) -> void {
    if (depth == split_depth || hi - lo == 1) {
      subtrees[count++] = {lo, hi};
      return;
    }
    const std::int64_t mid = lo + (hi - lo) / 2;
    self(self, lo, mid, depth + 1);
    self(self, mid, hi, depth + 1);
  };
  collect(collect, 0, leaves, 0);

  tree_buffer values(count * s.size);
  kiln::detail::parallel_for(std::int64_t(count), 1, [&](std::int64_t lo, std::int64_t hi) {
    tree_buffer scratch(tree_scratch_bytes(s, leaves));
    for (std::int64_t i = lo; i < hi; ++i)
      pairwise(s, subtrees[std::size_t(i)].lo, subtrees[std::size_t(i)].hi, values.data() + i * s.size, scratch.data());
  });

  tree_buffer scratch(tree_scratch_bytes(s, leaves));
  std::size_t next = 0;
  auto fold = [&](auto& self, std::int64_t lo, std::int64_t hi, int depth, std::byte* into, std::byte* below) -> void {
    if (depth == split_depth || hi - lo == 1) {
      std::memcpy(into, values.data() + next++ * s.size, s.size);
      return;
    }
    const std::int64_t mid = lo + (hi - lo) / 2;
    self(self, lo, mid, depth + 1, into, below);
    self(self, mid, hi, depth + 1, below, below + s.size);
    s.combine(s.context, into, below);
  };
  fold(fold, 0, leaves, 0, out, scratch.data());
}

/// The partial result of `leaves` leaves: `leaf(i)` makes leaf i's, `combine(a, b)`
/// joins neighbours. `P` is trivially copyable. With `OneLeaf` the caller knows at
/// compile time that there is one leaf, and no tree is compiled.
template <class P, bool OneLeaf = false, class Leaf, class Combine>
P tree(std::int64_t leaves, bool parallel, const Leaf& leaf, const Combine& combine) {
  static_assert(std::is_trivially_copyable_v<P>);
  if constexpr (OneLeaf) {
    return leaf(0);
  } else {
    if (leaves == 1) return leaf(0);  // the common case of short rows and columns, inlined
    struct steps_context {
      const Leaf& leaf;
      const Combine& combine;
    } context{leaf, combine};
    const tree_steps s{
        &context,
        [](const void* c, std::int64_t i, std::byte* out) { ::new (out) P(static_cast<const steps_context*>(c)->leaf(i)); },
        [](const void* c, std::byte* left, const std::byte* right) {
          P& l = *std::launder(reinterpret_cast<P*>(left));
          l = static_cast<const steps_context*>(c)->combine(l, *std::launder(reinterpret_cast<const P*>(right)));
        },
        sizeof(P)};
    P result;
    if (parallel) {
      pairwise_parallel(s, leaves, reinterpret_cast<std::byte*>(&result));
    } else {
      tree_buffer scratch(tree_scratch_bytes(s, leaves));
      pairwise(s, 0, leaves, reinterpret_cast<std::byte*>(&result), scratch.data());
    }
    return result;
  }
}

/// Runs `task(unit, parallel_inside)` for units [0, units) of `work` elements each:
/// many units are spread over the threads, a few large ones are split inside. With
/// `Serial`, all on the calling thread.
template <bool Serial = false, class F>
void for_each_unit(std::int64_t units, std::int64_t work, F&& task) {
  if constexpr (Serial) {
    for (std::int64_t u = 0; u < units; ++u) task(u, false);
  } else if (units < 4 * std::int64_t(config::num_threads()) && work >= 2 * reduction_grain) {
    for (std::int64_t u = 0; u < units; ++u) task(u, true);
  } else {
    kiln::detail::parallel_for(units, std::max<std::int64_t>(1, reduction_grain / std::max<std::int64_t>(work, 1)),
                               [&](std::int64_t lo, std::int64_t hi) {
                                 for (std::int64_t u = lo; u < hi; ++u) task(u, false);
                               });
  }
}

// ---- SIMD helpers shared by scalar and batch code ----------------------------------
// Column code is written once for `V` = an xsimd batch or the element type itself.

/// Elements in a `V`: a batch's lanes, or 1.
template <class V>
inline constexpr int lanes_of = 1;
template <class T, class A>
inline constexpr int lanes_of<xsimd::batch<T, A>> = int(xsimd::batch<T, A>::size);

/// Reads a `V` at `p`.
template <class V, class T>
V load(const T* p) {
  if constexpr (std::is_same_v<V, T>)
    return *p;
  else
    return V::load_unaligned(p);
}

/// Writes `v` at `p`.
template <class V, class T>
void store(const V& v, T* p) {
  if constexpr (std::is_same_v<V, T>)
    *p = v;
  else
    v.store_unaligned(p);
}

// ---- rows: the reduced elements are contiguous ------------------------------------

/// Reduces `n` contiguous elements with several independent SIMD accumulators (to
/// hide the latency of each combine), folded pairwise at the end.
template <class R, class T>
T row_leaf(const T* p, std::int64_t n) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = B::size;
  constexpr int accumulators = 8;
  T result = R::identity();
  std::int64_t i = 0;
  if (n >= w) {
    B total(R::identity());
    if (n >= accumulators * w) {
      std::array<B, accumulators> acc;
      acc.fill(B(R::identity()));
      for (; i + accumulators * w <= n; i += accumulators * w)
        for (int k = 0; k < accumulators; ++k) acc[k] = R::combine(acc[k], B::load_unaligned(p + i + k * w));
      for (int half = accumulators / 2; half > 0; half /= 2)
        for (int k = 0; k < half; ++k) acc[k] = R::combine(acc[k], acc[k + half]);
      total = acc[0];
    }
    for (; i + w <= n; i += w) total = R::combine(total, B::load_unaligned(p + i));
    result = R::horizontal(total);
  }
  for (; i < n; ++i) result = R::combine(result, p[i]);
  return result;
}

/// argmax of `n` contiguous elements whose first has index `first`: the SIMD max,
/// then a search for its first occurrence while the elements are still in cache.
template <class T>
indexed_value<T> row_argmax_leaf(const T* p, std::int64_t n, std::int64_t first) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = B::size;
  const T best = row_leaf<extremum_reducer<T, true>>(p, n);
  const bool nan = is_nan(best);  // the max is NaN only when there is one
  std::int64_t i = 0;
  for (; i + w <= n; i += w) {
    B v = B::load_unaligned(p + i);
    if (xsimd::any(nan ? is_nan(v) : v == B(best))) break;
  }
  while (i + 1 < n && !(nan ? is_nan(p[i]) : p[i] == best)) ++i;
  return {best, first + i};
}

/// The partial result of `n` elements `stride` apart, the first with index `first`,
/// combined one at a time in order.
template <class R, class T>
typename R::partial scalar_leaf(const T* p, std::int64_t n, std::int64_t stride, std::int64_t first) {
  if constexpr (R::indexed) {
    typename R::partial acc{p[0], first};
    for (std::int64_t i = 1; i < n; ++i)
      if (R::beats(p[i * stride], acc.value)) acc = {p[i * stride], first + i};
    return acc;
  } else {
    T acc = R::identity();
    for (std::int64_t i = 0; i < n; ++i) acc = R::combine(acc, p[i * stride]);
    return acc;
  }
}

/// The partial result of `n` contiguous elements whose first has index `first`.
template <class R, class T>
typename R::partial contiguous_leaf(const T* p, std::int64_t n, std::int64_t first) {
  if constexpr (R::indexed)
    return row_argmax_leaf(p, n, first);
  else
    return row_leaf<R>(p, n);
}

template <class R, bool Small = false, class T, class Out>
void reduce_rows(const T* x, Out* out, std::int64_t rows, std::int64_t n) {
  using P = typename R::partial;
  const std::int64_t leaves = (n + reduction_leaf - 1) / reduction_leaf;
  auto combine = [](const P& a, const P& b) { return R::combine(a, b); };
  for_each_unit<Small>(rows, n, [&](std::int64_t row, bool parallel) {
    const T* p = x + row * n;
    auto leaf = [&](std::int64_t b) {
      const std::int64_t lo = b * reduction_leaf;
      return contiguous_leaf<R>(p + lo, std::min(reduction_leaf, n - lo), lo);
    };
    out[row] = finish<R>(tree<P, Small>(leaves, parallel, leaf, combine));
  });
}

// ---- columns: SIMD across the contiguous kept dim ---------------------------------

/// Vectors of columns one register chunk reduces at once, and chunks per tile: a
/// tile's leaf reads 2-4 KiB of each row, chunk after chunk, so the hardware
/// prefetchers see each row's page read forward (one chunk alone, a few hundred
/// bytes per page, runs at half the bandwidth).
inline constexpr int column_chunk = 8;
inline constexpr int column_chunks = 4;

/// Reduces rows [r0, r1) (`stride` elements apart) of `active` (at most `NB`)
/// vectors of columns starting at `p` into `out`. `V` is an xsimd batch, or the
/// element type itself for a few single columns.
template <class R, class V, int NB, class T>
void column_chunk_leaf(const T* p, std::int64_t stride, std::int64_t r0, std::int64_t r1, int active,
                       typename R::partial* out) {
  constexpr int w = lanes_of<V>;
  if constexpr (R::indexed) {
    std::array<V, NB> best, where;  // `where`: the row within the leaf, exact in T
    for (int k = 0; k < active; ++k) {
      best[k] = load<V>(p + r0 * stride + k * w);
      where[k] = V(T(0));
    }
    for (std::int64_t r = r0 + 1; r < r1; ++r) {
      const V row = V(T(r - r0));
      for (int k = 0; k < active; ++k) {
        const V v = load<V>(p + r * stride + k * w);
        const auto better = R::beats(v, best[k]);
        best[k] = math::select(better, v, best[k]);
        where[k] = math::select(better, row, where[k]);
      }
    }
    std::array<T, NB * w> values, rows;
    for (int k = 0; k < active; ++k) {
      store(best[k], values.data() + k * w);
      store(where[k], rows.data() + k * w);
    }
    for (int j = 0; j < active * w; ++j) out[j] = {values[j], r0 + std::int64_t(rows[j])};
  } else {
    std::array<V, NB> acc;
    acc.fill(V(R::identity()));
    for (std::int64_t r = r0; r < r1; ++r)
      for (int k = 0; k < active; ++k) acc[k] = R::combine(acc[k], load<V>(p + r * stride + k * w));
    for (int k = 0; k < active; ++k) store(acc[k], out + k * w);
  }
}

/// Reduces `rows` rows (`stride` elements apart) of `vectors` (at most NB x Chunks)
/// vectors of columns starting at `p`, and writes their results to `out`: a
/// pairwise tree over leaves of rows, each leaf a chunk of registers at a time.
template <class R, class V, int NB, int Chunks, bool Small, class T, class Out>
void reduce_tile(const T* p, std::int64_t stride, std::int64_t rows, int vectors, bool parallel, Out* out) {
  using P = std::array<typename R::partial, NB * Chunks * lanes_of<V>>;
  const int used = vectors * lanes_of<V>;
  auto leaf = [&](std::int64_t b) {
    const std::int64_t r0 = b * column_leaf_rows, r1 = std::min(rows, r0 + column_leaf_rows);
    P result{};
    for (int first = 0; first < vectors; first += NB)
      column_chunk_leaf<R, V, NB>(p + first * lanes_of<V>, stride, r0, r1, std::min(NB, vectors - first),
                                  result.data() + first * lanes_of<V>);
    return result;
  };
  auto combine = [used](const P& a, const P& b) {
    P c{};
    for (int j = 0; j < used; ++j) c[j] = R::combine(a[j], b[j]);
    return c;
  };
  const P result = tree<P, Small>((rows + column_leaf_rows - 1) / column_leaf_rows, parallel, leaf, combine);
  for (int j = 0; j < used; ++j) out[j] = finish<R>(result[j]);
}

/// Reduces the middle dim of an (outer, rows, inner) input into (outer, inner):
/// tiles of batches of columns, then one tile of the last few columns one by one.
template <class R, bool Small = false, class T, class Out>
void reduce_columns(const T* x, Out* out, std::int64_t outer, std::int64_t rows, std::int64_t inner) {
  using B = xsimd::batch<T>;
  constexpr int w = int(B::size), tile = column_chunk * column_chunks;
  const std::int64_t batches = inner / w, batch_tiles = (batches + tile - 1) / tile;
  const int rest = int(inner % w);
  const std::int64_t tiles = batch_tiles + (rest > 0);
  for_each_unit<Small>(outer * tiles, rows * tile * w, [&](std::int64_t unit, bool parallel) {
    const std::int64_t o = unit / tiles, t = unit % tiles, column = t < batch_tiles ? t * tile * w : batches * w;
    const T* p = x + o * rows * inner + column;
    Out* dst = out + o * inner + column;
    if (t < batch_tiles)
      reduce_tile<R, B, column_chunk, column_chunks, Small>(p, inner, rows,
                                                            int(std::min<std::int64_t>(tile, batches - t * tile)), parallel, dst);
    else
      reduce_tile<R, T, w, 1, Small>(p, inner, rows, rest, parallel, dst);
  });
}

/// Reduces rows shorter than a batch one element at a time: a row is too short for
/// SIMD to pay, and neighbouring rows' independent chains keep the core busy.
template <class R, bool Small = false, class T, class Out>
void reduce_short_rows(const T* x, Out* out, std::int64_t rows, std::int64_t n) {
  kiln::detail::ranges_for<Small>(rows, std::max<std::int64_t>(1, reduction_grain / n), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) out[r] = finish<R>(scalar_leaf<R>(x + r * n, n, 1, 0));
  });
}

// ---- anything else: strided ---------------------------------------------------------

/// Dims (sizes and input strides) walked in row-major order.
struct strided_dims {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{}, stride{};

  /// The input offset of the `flat`-th position, with its multi-index in `idx`.
  std::int64_t offset(std::int64_t flat, std::array<std::int64_t, max_rank>& idx) const {
    std::int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = flat % size[d];
      flat /= size[d];
      off += idx[d] * stride[d];
    }
    return off;
  }
};

/// Reduces the positions [k0, k1) of the reduced dims `walk` from `base`, a run of
/// the innermost reduced dim at a time (contiguous runs take the row kernels).
template <class R, class T>
typename R::partial strided_leaf(const T* base, const strided_dims& walk, std::int64_t k0, std::int64_t k1) {
  const int last = walk.rank - 1;
  const std::int64_t run_size = walk.size[last], run_stride = walk.stride[last];
  std::array<std::int64_t, max_rank> idx{};
  std::int64_t off = walk.offset(k0, idx);
  std::optional<typename R::partial> acc;
  for (std::int64_t k = k0; k < k1;) {
    const std::int64_t len = std::min(run_size - idx[last], k1 - k);
    const typename R::partial part =
        run_stride == 1 ? contiguous_leaf<R>(base + off, len, k) : scalar_leaf<R>(base + off, len, run_stride, k);
    acc = acc ? R::combine(*acc, part) : part;
    k += len;
    off += len * run_stride;
    idx[last] += len;
    for (int d = last; d > 0 && idx[d] == walk.size[d]; --d) {  // carry into the outer reduced dims
      off += walk.stride[d - 1] - walk.size[d] * walk.stride[d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
  return *acc;
}

/// The input's dims without size-1 dims, neighbours of the same role merged.
struct reduction_layout {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{};
  std::array<bool, max_rank> reduced{};

  constexpr reduction_layout(const shape& s, const std::array<bool, max_rank>& reduced_dims) {
    for (int d = 0; d < s.rank(); ++d) {
      if (s[d] == 1) continue;
      if (rank > 0 && reduced[rank - 1] == reduced_dims[d]) {
        size[rank - 1] *= s[d];
      } else {
        size[rank] = s[d];
        reduced[rank] = reduced_dims[d];
        ++rank;
      }
    }
  }
  /// The kept dims (`role` false) or the reduced dims (`role` true) with their strides.
  constexpr strided_dims dims(bool role) const {
    strided_dims out;
    std::int64_t stride = 1;
    std::array<std::int64_t, max_rank> strides{};
    for (int d = rank - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= size[d];
    }
    for (int d = 0; d < rank; ++d) {
      if (reduced[d] == role) {
        out.size[out.rank] = size[d];
        out.stride[out.rank++] = strides[d];
      }
    }
    return out;
  }
};

template <class R, bool Small = false, class T, class Out>
void reduce_strided(const T* x, Out* out, const reduction_layout& layout, std::int64_t outputs, std::int64_t count) {
  using P = typename R::partial;
  const strided_dims kept = layout.dims(false), walk = layout.dims(true);
  const std::int64_t leaves = (count + reduction_leaf - 1) / reduction_leaf;
  auto combine = [](const P& a, const P& b) { return R::combine(a, b); };
  for_each_unit<Small>(outputs, count, [&](std::int64_t o, bool parallel) {
    std::array<std::int64_t, max_rank> idx{};
    const T* base = x + kept.offset(o, idx);
    auto leaf = [&](std::int64_t b) {
      const std::int64_t k0 = b * reduction_leaf;
      return strided_leaf<R>(base, walk, k0, std::min(count, k0 + reduction_leaf));
    };
    out[o] = finish<R>(tree<P, Small>(leaves, parallel, leaf, combine));
  });
}

/// Which kernel reduces a layout: every output is one element (or none), the reduced
/// dims are interleaved with kept ones (strided), a kept contiguous dim follows the
/// reduced one (columns), or the reduced elements are contiguous: rows shorter than a
/// batch, or rows. `outer` and `inner` are the kept sizes before and after the
/// reduced run.
struct reduction_plan {
  enum kind_t { identity, strided, columns, short_rows, rows } kind = identity;
  std::int64_t outer = 1, inner = 1;
};

/// The plan for `count` elements per output of `layout`, with `lanes` per SIMD batch.
constexpr reduction_plan plan_reduction(const reduction_layout& layout, std::int64_t count, std::int64_t lanes) {
  if (count <= 1) return {reduction_plan::identity};
  int runs = 0, run = 0;
  for (int d = 0; d < layout.rank; ++d) {
    if (layout.reduced[d]) {
      ++runs;
      run = d;
    }
  }
  if (runs > 1) return {reduction_plan::strided};
  reduction_plan plan;
  for (int d = 0; d < run; ++d) plan.outer *= layout.size[d];
  for (int d = run + 1; d < layout.rank; ++d) plan.inner *= layout.size[d];
  plan.kind = plan.inner > 1 ? reduction_plan::columns : count < lanes ? reduction_plan::short_rows : reduction_plan::rows;
  return plan;
}

/// Whether a reduction of `elements` elements in all, `count` per output, planned as
/// `plan`, is below the parallel grain with one leaf per output: it then runs on the
/// calling thread without a tree, as the general path would run it.
constexpr bool one_small_task(const reduction_plan& plan, std::int64_t elements, std::int64_t count) {
  return elements <= reduction_grain && count <= (plan.kind == reduction_plan::columns ? column_leaf_rows : reduction_leaf);
}

/// Runs plan `plan`, of kind `K`: the compile-time tier, which knows its plan at
/// compile time, instantiates one kernel, and with `Small` (one_small_task) neither
/// the tree nor the thread pool; `reduce` dispatches at run time.
template <reduction_plan::kind_t K, class R, bool Small = false, class T, class Out>
void reduce_planned(const T* x, Out* out, const reduction_layout& layout, const reduction_plan& plan, std::int64_t outputs,
                    std::int64_t count) {
  if constexpr (K == reduction_plan::identity) {  // nothing to combine: the identity, or each element itself
    kiln::detail::ranges_for<Small>(outputs, reduction_grain, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        if constexpr (R::indexed)
          out[i] = 0;
        else
          out[i] = count == 0 ? R::identity() : x[i];
      }
    });
  } else if constexpr (K == reduction_plan::strided) {
    reduce_strided<R, Small>(x, out, layout, outputs, count);
  } else if constexpr (K == reduction_plan::columns) {
    reduce_columns<R, Small>(x, out, plan.outer, count, plan.inner);
  } else if constexpr (K == reduction_plan::short_rows) {
    reduce_short_rows<R, Small>(x, out, plan.outer, count);
  } else {
    reduce_rows<R, Small>(x, out, plan.outer, count);
  }
}

/// Reduces `x` (laid out as `layout`) into `outputs` values of `count` elements each.
template <class R, class T, class Out>
void reduce(const T* x, Out* out, const reduction_layout& layout, std::int64_t outputs, std::int64_t count) {
  const reduction_plan plan = plan_reduction(layout, count, std::int64_t(xsimd::batch<T>::size));
  switch (plan.kind) {
    case reduction_plan::identity: return reduce_planned<reduction_plan::identity, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::strided: return reduce_planned<reduction_plan::strided, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::columns: return reduce_planned<reduction_plan::columns, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::short_rows:
      return reduce_planned<reduction_plan::short_rows, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::rows: return reduce_planned<reduction_plan::rows, R>(x, out, layout, plan, outputs, count);
  }
}

/// Turns `outputs` sums of `count` elements each, at `out`, into means.
template <bool Small = false, class T>
void sums_to_means(T* out, std::int64_t outputs, std::int64_t count) {
  kiln::detail::ranges_for<Small>(outputs, reduction_grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) out[i] = ops::mean_of<T>(out[i], count);
  });
}

}  // namespace cpu

template <ops::reduction Op>
void compute(cpu_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  using kind = ops::reduction_kind;
  const shape& s = in[0].shape;
  const cpu::reduction_layout layout(s, ops::reduced_dims(op.axis, s.rank()));
  const std::int64_t outputs = out.size(), count = ops::reduced_count(s, op.axis);
  ops::visit_numeric(in[0].dtype, [&]<class T>() {
    using R = cpu::reducer_for<Op::kind, T>;
    using Out = std::conditional_t<R::indexed, std::int64_t, T>;
    cpu::reduce<R>(in[0].as<T>(), out.as<Out>(), layout, outputs, count);
    if constexpr (Op::kind == kind::mean) cpu::sums_to_means(out.as<T>(), outputs, count);
  });
}

}  // namespace kiln::backend

#pragma once
/// \file
/// CPU elementwise kernel. Broadcast dims are collapsed so the loop nest is as
/// short as possible; the innermost run is an xsimd loop specialised on which
/// operands are contiguous and which are broadcast; large outputs are split over
/// the thread pool.

#include <span>
#include <string>
#include <type_traits>

#include "kiln/core/simd.hpp"

#include "kiln/backend/backend.hpp"
#include "kiln/backend/cpu/streaming.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/ops/elementwise.hpp"

namespace kiln::backend {
namespace cpu {

/// Elements per parallel task: below this, threads cost more than they save (the
/// pool's workers spin between jobs, so a job starts in well under a microsecond).
inline constexpr std::int64_t elementwise_grain = std::int64_t(1) << 14;

/// The loop nest of an elementwise op after merging dims that every operand
/// walks contiguously (or every operand broadcasts).
template <int Arity>
struct loop_nest {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{};
  std::array<std::array<std::int64_t, max_rank>, Arity> stride{};

  loop_nest(std::span<const buffer_view> in, const shape& out) {
    std::array<std::array<std::int64_t, max_rank>, Arity> full{};
    for (int k = 0; k < Arity; ++k) full[k] = broadcast_strides(in[k].shape, out);
    for (int d = 0; d < out.rank(); ++d) {
      if (out[d] == 1) continue;  // size-1 dims contribute nothing
      bool merge = rank > 0;
      for (int k = 0; k < Arity && merge; ++k) merge = stride[k][rank - 1] == full[k][d] * out[d];
      if (merge) {
        size[rank - 1] *= out[d];
        for (int k = 0; k < Arity; ++k) stride[k][rank - 1] = full[k][d];
      } else {
        size[rank] = out[d];
        for (int k = 0; k < Arity; ++k) stride[k][rank] = full[k][d];
        ++rank;
      }
    }
    if (rank == 0) {  // a scalar, or all dims of size 1
      rank = 1;
      size[0] = 1;
    }
  }
};

template <class T>
inline constexpr bool simd_type =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

/// Whether an op's functor runs on xsimd batches for these dtypes: its kernel has a
/// SIMD loop, can stream its output, and can join a native loop (kiln/exec/jit.hpp).
template <class Op, class In, class Out>
inline constexpr bool simd_kernel = std::is_same_v<In, Out> && simd_type<In> && Op::simd.contains(dtype_of<In>) && Op::arity <= 2;

/// Outputs [from, len) one element at a time; operand k's element for output i is
/// at offset `offset(k, i)`. For `where`, operand 0 is the bool condition.
template <class In, class Out, int Arity, class Op, class Offset>
void element_loop(const Op& op, Out* o, const void* const* p, std::int64_t from, std::int64_t len,
                  Offset offset) {
  for (std::int64_t i = from; i < len; ++i)
    o[i] = math::convert<Out>(ops::invoke_elementwise(
        op, [&](int k) -> const In& { return static_cast<const In*>(p[k])[offset(k, i)]; },
        [&](int k) { return static_cast<const bool*>(p[k])[offset(k, i)]; }));
}

/// One run of `len` outputs of an op with a SIMD kernel. Bit k of `contig` says
/// operand k advances by one element per output; otherwise it is broadcast (stride 0).
/// With `stream`, full batches go to memory with non-temporal stores, and `o` must be
/// aligned to a batch. Both are run-time flags, not template parameters, so that the
/// functor is inlined into one loop, not one per combination (see batch_source); a
/// branch per batch on `stream` costs nothing beside a store that misses every cache.
template <class Op, class T, int Arity>
KILN_FLATTEN void simd_run(unsigned contig, const Op& op, T* KILN_RESTRICT o, const void* const* p,
                           std::int64_t len, bool stream = false) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = B::size;
  const auto in = [&]<int... K>(std::integer_sequence<int, K...>) {
    return std::array<batch_source<T>, Arity>{batch_source<T>(static_cast<const T*>(p[K]), (contig >> K) & 1u)...};
  }(std::make_integer_sequence<int, Arity>{});
  std::int64_t i = 0;
  for (; i + w <= len; i += w) {
    B batch;
    if constexpr (Arity == 1)
      batch = op(in[0][i]);
    else
      batch = op(in[0][i], in[1][i]);
    if (stream)
      store_streaming(batch, o + i);
    else
      batch.store_unaligned(o + i);
  }
  // Fewer than a batch of elements (the tail, or a run shorter than a batch) run as
  // one batch of copies padded with the last of them, so every element goes through
  // the same SIMD functor: results do not depend on an element's position, and a
  // fused cluster, which pads the same way, computes the same bits.
  if (const std::int64_t rest = len - i; rest > 0) {
    if constexpr (Arity == 1)
      store_partial(op(in[0].padded(i, rest)), o + i, rest);
    else
      store_partial(op(in[0].padded(i, rest), in[1].padded(i, rest)), o + i, rest);
  }
}

/// One run of `len` outputs of an op without a SIMD kernel for these dtypes, one
/// element at a time; bit k of `Contig` as `contig` in kiln::backend::cpu::simd_run.
/// For `where`, operand 0 is the bool condition.
template <unsigned Contig, class Op, class In, class Out, int Arity>
void scalar_run(const Op& op, Out* KILN_RESTRICT o, const void* const* p, std::int64_t len) {
  std::int64_t i = 0;
  if constexpr (Op::leading_condition && std::is_same_v<In, Out> && simd_type<In>) {
    // `where`: the bool condition widened to a mask, then a blend of the branches
    // (a select copies bits, so the scalar tail gives the same results).
    using B = xsimd::batch<In>;
    constexpr std::int64_t w = B::size;
    const bool* condition = static_cast<const bool*>(p[0]);
    auto load = [&](int k, std::int64_t j) {
      const In* q = static_cast<const In*>(p[k]);
      return (Contig >> k) & 1u ? B::load_unaligned(q + j) : B(q[0]);
    };
    for (; i + w <= len; i += w) {
      alignas(sizeof(B)) In flags[w];
      for (std::int64_t k = 0; k < w; ++k) flags[k] = In(condition[(Contig & 1u) ? i + k : 0]);
      xsimd::select(B::load_aligned(flags) != B(In(0)), load(1, i), load(2, i)).store_unaligned(o + i);
    }
  }
  element_loop<In, Out, Arity>(op, o, p, i, len, [](int k, std::int64_t j) { return (Contig >> k) & 1u ? j : 0; });
}

/// A run of elements that are objects (strings): never vectorized, so one loop reads
/// each operand's contiguity at run time instead of a loop per combination.
template <class Op, class In, class Out, int Arity>
void object_run(unsigned contig, const Op& op, Out* o, const void* const* p, std::int64_t len) {
  element_loop<In, Out, Arity>(op, o, p, 0, len,
                               [contig](int k, std::int64_t j) { return (contig >> k) & 1u ? j : std::int64_t(0); });
}

/// A run in which every operand is broadcast: one value, computed as a full run
/// computes it (on one element) and copied.
template <class Op, class In, class Out, int Arity>
void broadcast_run(const Op& op, Out* o, const void* const* p, std::int64_t len) {
  constexpr unsigned all = (1u << Arity) - 1;
  if constexpr (simd_kernel<Op, In, Out>)
    simd_run<Op, In, Arity>(all, op, o, p, 1);
  else
    scalar_run<all, Op, In, Out, Arity>(op, o, p, 1);
  std::fill_n(o + 1, len - 1, o[0]);
}

/// Runs `len` outputs of operand contiguity `contig` (bit k: operand k advances by one
/// element per output); `stream` as for kiln::backend::cpu::simd_run.
template <class Op, class In, class Out, int Arity, unsigned Contig = 1>
void dispatch_run(unsigned contig, const Op& op, Out* o, const void* const* p, std::int64_t len,
                  bool stream = false) {
  if constexpr (std::is_same_v<In, std::string>) {
    object_run<Op, In, Out, Arity>(contig, op, o, p, len);
  } else if (contig == 0) {
    // Rare (every operand broadcast along the innermost dim): one value, copied.
    broadcast_run<Op, In, Out, Arity>(op, o, p, len);
  } else if constexpr (simd_kernel<Op, In, Out>) {
    simd_run<Op, In, Arity>(contig, op, o, p, len, stream);
  } else if constexpr (Contig == (1u << Arity)) {
    (void)stream;
  } else if (contig == Contig) {
    scalar_run<Contig, Op, In, Out, Arity>(op, o, p, len);
  } else {
    dispatch_run<Op, In, Out, Arity, Contig + 1>(contig, op, o, p, len);
  }
}

/// One run of an elementwise kernel, its types erased: `len` outputs at `out` from the
/// operands at `p`, of contiguity `contig` (as for dispatch_run), streamed when
/// `stream` (as for simd_run).
using run_fn = void (*)(const void* op, unsigned contig, void* out, const void* const* p, std::int64_t len, bool stream);

template <class Op, class In, class Out>
void erased_run(const void* op, unsigned contig, void* out, const void* const* p, std::int64_t len, bool stream) {
  dispatch_run<Op, In, Out, Op::arity>(contig, *static_cast<const Op*>(op), static_cast<Out*>(out), p, len, stream);
}

/// An elementwise kernel as the loops around its runs see it.
struct erased_kernel {
  run_fn run;
  const void* op;
  std::array<std::size_t, 3> operand_bytes;  ///< the element size of each operand
  std::size_t out_bytes;                     ///< the element size of the output
  std::size_t stream_batch_bytes;            ///< a batch's size where the kernel can stream; 0 otherwise
};

/// The loops of an elementwise kernel around its runs: the broadcast loop nest, split
/// over the thread pool. Compiled once per arity, not once per op and dtypes: all that
/// differs between kernels is `kernel.run`, called once per run.
template <int Arity>
void run_loops(const erased_kernel& kernel, std::span<const buffer_view> in, const buffer_view& out) {
  const std::int64_t n = out.size();
  if (n == 0) return;
  const loop_nest<Arity> nest(in, out.shape);
  const int r = nest.rank;
  const std::int64_t inner = nest.size[r - 1];
  unsigned contig = 0;
  for (int k = 0; k < Arity; ++k)
    if (nest.stride[k][r - 1] == 1) contig |= 1u << k;
  const std::int64_t out_bytes = std::int64_t(kernel.out_bytes);
  const bool stream = kernel.stream_batch_bytes > 0 && std::size_t(n) * kernel.out_bytes >= streaming_bytes;
  kiln::detail::parallel_for(n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
    std::array<std::int64_t, max_rank> idx{};
    for (std::int64_t rest = lo, d = r - 1; d >= 0; --d) {
      idx[d] = rest % nest.size[d];
      rest /= nest.size[d];
    }
    while (lo < hi) {
      std::int64_t len = std::min(inner - idx[r - 1], hi - lo);
      std::array<const void*, Arity> p{};
      for (int k = 0; k < Arity; ++k) {
        std::int64_t off = 0;
        for (int d = 0; d < r; ++d) off += idx[d] * nest.stride[k][d];
        p[k] = static_cast<const char*>(in[k].data) + off * std::int64_t(kernel.operand_bytes[k]);
      }
      char* o = static_cast<char*>(out.data) + lo * out_bytes;
      std::int64_t count = len;
      if (stream) {
        // Non-temporal stores need aligned addresses: the outputs before the first
        // aligned one are stored as usual.
        const auto batch_bytes = std::int64_t(kernel.stream_batch_bytes);
        const auto skew = std::int64_t(reinterpret_cast<std::uintptr_t>(o) % std::uintptr_t(batch_bytes));
        if (const std::int64_t head = skew ? std::min(len, (batch_bytes - skew) / out_bytes) : 0; head > 0) {
          kernel.run(kernel.op, contig, o, p.data(), head, false);
          for (int k = 0; k < Arity; ++k)
            if ((contig >> k) & 1u) p[k] = static_cast<const char*>(p[k]) + head * std::int64_t(kernel.operand_bytes[k]);
          o += head * out_bytes;
          count -= head;
        }
      }
      if (count > 0) kernel.run(kernel.op, contig, o, p.data(), count, stream);
      lo += len;
      idx[r - 1] += len;
      for (int d = r - 1; d > 0 && idx[d] == nest.size[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
    if (stream) streaming_fence();
  });
}

template <class Op, class In, class Out>
void run_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  erased_kernel kernel{&erased_run<Op, In, Out>, &op, {}, sizeof(Out), 0};
  // A leading condition is read as bool and the values as In.
  for (int k = 0; k < Op::arity; ++k)
    kernel.operand_bytes[std::size_t(k)] = k < ops::value_operand<Op> ? sizeof(bool) : sizeof(In);
  if constexpr (simd_kernel<Op, In, Out>) kernel.stream_batch_bytes = sizeof(xsimd::batch<Out>);
  run_loops<Op::arity>(kernel, in, out);
}

}  // namespace cpu

template <dtype_set Only, ops::elementwise Op>
void compute_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  visit_elementwise_types<Only>(op, in[ops::value_operand<Op>].dtype, out.dtype,
                                [&]<class In, class Out>() { cpu::run_elementwise<Op, In, Out>(op, in, out); });
}

template <ops::elementwise Op>
void compute(cpu_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  compute_elementwise<dtypes::all>(op, in, out);
}

}  // namespace kiln::backend

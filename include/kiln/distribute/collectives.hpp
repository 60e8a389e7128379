#pragma once
/// \file
/// Collectives across ranks: `kiln::all_reduce`, `all_gather`, `broadcast` and
/// `reduce_scatter` (TensorFlow's CollectiveReduceV2 and its kin). Eagerly they run at
/// once; while a kiln::function traces they record a collective node
/// (kiln/exec/collective_op.hpp) that runs at every call, in program order. This file
/// also holds what runs the node (the engine over MPI) and the collectives' gradients.
///
/// Every collective starts with the ranks' agreement (kiln/distribute/runtime.hpp): a
/// rank whose collective, dtype or shapes differ from the others' makes every rank raise
/// kiln::invalid_argument_error naming the collective and what each rank gave.
///
/// The order of a floating-point sum is fixed and the same on every rank: element i of
/// an all_reduce (or reduce_scatter) is `((x_0 + x_1) + x_2) + ... + x_{n-1}` over the
/// ranks' values in rank order, then divided by n for a mean. The sum runs as a
/// reduce-scatter (an MPI_Alltoallv: rank j receives the j-th block of every rank's
/// tensor and sums it in rank order) followed by an MPI_Allgatherv of the blocks, which
/// moves the bytes a ring all-reduce moves. Integer sums, max and min are exact in any
/// order and go through MPI_Allreduce.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/simd.hpp"
#include "kiln/distribute/communicator.hpp"
#include "kiln/distribute/nccl.hpp"
#include "kiln/distribute/runtime.hpp"
#include "kiln/exec/collective_op.hpp"
#include "kiln/graph/special_gradients.hpp"
#include "kiln/kiln.hpp"

namespace kiln::distribute::detail {

using kiln::detail::collective_failure;
using kiln::detail::collective_kind;
using kiln::detail::collective_op;
using kiln::detail::collective_spec;

/// The MPI datatype of a kiln dtype's elements (bool as bytes; strings travel as
/// lengths and characters).
inline MPI_Datatype mpi_type(dtype t) {
  switch (t) {
    case int32: return MPI_INT32_T;
    case int64: return MPI_INT64_T;
    case float32: return MPI_FLOAT;
    case float64: return MPI_DOUBLE;
    default: return MPI_BYTE;
  }
}

/// `all_reduce(sum) of float32 (2, 3)`, `all_reduce(mean) of 6 float32 tensors (269322
/// elements)`: what a rank's descriptor says, for messages.
inline std::string describe(const collective_descriptor& d) {
  static constexpr std::string_view kinds[] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter", "reduce"};
  std::string text = d.kind < 5 ? std::string(kinds[d.kind]) : std::string("barrier");
  if (d.kind == 255) return text;
  const auto k = collective_kind(d.kind);
  if (k == collective_kind::all_reduce || k == collective_kind::reduce_scatter || k == collective_kind::reduce)
    text += "(" + std::string(name(reduce_op(d.op))) + ")";
  if (k == collective_kind::broadcast || k == collective_kind::reduce) text += " from root " + std::to_string(d.root);
  const std::string type(d.type < dtype_count ? name(dtype(d.type)) : std::string_view("?"));
  if (d.tensors == 1) {
    shape s;
    for (int i = 0; i < d.rank && i < max_rank; ++i) s.push_back(d.dims[i]);
    text += " of " + type + " " + s.str();
  } else {
    text += " of " + std::to_string(d.tensors) + " " + type + " tensors (" + std::to_string(d.elements) + " elements)";
  }
  if (d.device) text += " on the gpu";
  if (d.line) text += " at line " + std::to_string(d.line);
  return text;
}

/// What this rank is about to do, for the agreement.
inline collective_descriptor descriptor_of(const collective_spec& s, std::uint64_t sequence,
                                           std::span<const tensor* const> in) {
  collective_descriptor d;
  d.sequence = sequence;
  d.kind = std::uint8_t(s.kind);
  d.op = std::uint8_t(s.op);
  d.root = s.root;
  d.site = s.site;
  d.line = s.line;
  d.tensors = std::int64_t(in.size());
  d.type = std::uint8_t(in[0]->dtype());
  d.rank = std::uint8_t(in[0]->rank());
  d.device = in[0]->device() == device::cpu ? 0 : 1;
  for (int i = 0; i < in[0]->rank(); ++i) d.dims[i] = in[0]->shape()[i];
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a over each input's dtype, rank and dims
  auto mix = [&](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) hash = (hash ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  for (const tensor* t : in) {
    d.elements += t->size();
    mix(std::uint64_t(t->dtype()));
    mix(std::uint64_t(t->rank()));
    for (std::int64_t dim : t->shape().dims()) mix(std::uint64_t(dim));
    if (t->dtype() == string)
      for (std::int64_t i = 0; i < t->size(); ++i) d.string_bytes += std::int64_t(t->data<std::string>()[i].size());
  }
  d.shapes_hash = hash;
  return d;
}

/// Raises kiln::invalid_argument_error, on every rank alike, unless every rank is about
/// to run the same collective, called from the same place of the program, on tensors of
/// the same dtypes and shapes (and devices).
inline void check_agreement(const group_state& g, std::span<const collective_descriptor> all, std::string_view what) {
  auto same = [](const collective_descriptor& a, const collective_descriptor& b) {
    return a.kind == b.kind && a.op == b.op && a.root == b.root && a.site == b.site && a.type == b.type && a.rank == b.rank &&
           a.tensors == b.tensors && a.elements == b.elements && a.shapes_hash == b.shapes_hash &&
           a.device == b.device && std::equal(std::begin(a.dims), std::end(a.dims), std::begin(b.dims));
  };
  if (std::all_of(all.begin(), all.end(), [&](const collective_descriptor& d) { return same(d, all[0]); })) return;
  // Ranks that gave the same, as `ranks 0, 2 give X; rank 1 gives Y`.
  std::vector<std::vector<int>> classes;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) { return same(all[std::size_t(c[0])], all[r]); });
    if (it == classes.end())
      classes.push_back({int(r)});
    else
      it->push_back(int(r));
  }
  std::string text;
  for (const auto& c : classes) {
    text += text.empty() ? "" : "; ";
    text += c.size() == 1 ? "rank " : "ranks ";
    for (std::size_t k = 0; k < c.size(); ++k) text += (k ? ", " : "") + std::to_string(c[k]);
    text += (c.size() == 1 ? " gives " : " give ") + describe(all[std::size_t(c[0])]);
  }
  throw invalid_argument_error(std::string(what) + ": the ranks of " + runtime::group_name(g) +
                               " disagree at collective #" + std::to_string(all[0].sequence) + ": " + text);
}

/// Raises the error of `f`: kiln::type_error for a dtype, and for a shape
/// kiln::value_error while tracing or kiln::invalid_argument_error when it runs.
[[noreturn]] inline void throw_failure(const collective_failure& f, bool tracing) {
  if (f.kind == collective_failure::wrong_dtype) throw type_error(f.message);
  if (tracing) throw value_error(f.message);
  throw invalid_argument_error(f.message);
}

/// A count MPI can take (an int), or kiln::invalid_argument_error naming the collective.
inline int mpi_count(std::int64_t count, std::string_view what) {
  if (count > std::int64_t(INT32_MAX))
    throw invalid_argument_error(std::string(what) + ": " + std::to_string(count) +
                                 " elements per rank in one block are more than MPI counts (2^31 - 1)");
  return int(count);
}

/// Scratch memory of a group, kept between collectives (held under the runtime's lock),
/// so that a training step in steady state does not allocate it again.
inline void* scratch(group_state& g, std::size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  (void)g;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

/// out[e] = ((x_0[e] + x_1[e]) + x_2[e]) + ... in rank order (x_me is `own`, x_r for
/// another rank r is `received + r * stride`), divided by the count for a mean: one pass,
/// in SIMD batches (each lane adds and divides as a scalar would, so the bits are the
/// same whatever the element's place).
template <class T>
void sum_in_rank_order(T* out, const T* own, const T* received, std::int64_t count, std::int64_t stride, int me, int size,
                       bool mean) {
  auto block = [&](int r) { return r == me ? own : received + std::int64_t(r) * stride; };
  using batch = xsimd::batch<T>;
  constexpr std::int64_t lanes = std::int64_t(batch::size);
  const batch divisor = batch(T(size));
  std::int64_t e = 0;
  for (; e + lanes <= count; e += lanes) {
    batch sum = batch::load_unaligned(block(0) + e) + batch::load_unaligned(block(1) + e);
    for (int r = 2; r < size; ++r) sum += batch::load_unaligned(block(r) + e);
    if (mean) sum = sum / divisor;
    sum.store_unaligned(out + e);
  }
  for (; e < count; ++e) {
    T sum = block(0)[e] + block(1)[e];
    for (int r = 2; r < size; ++r) sum += block(r)[e];
    out[e] = mean ? sum / T(size) : sum;
  }
}

/// The tensors of a bucket read as one row of elements, without copying them.
template <class T>
struct element_row {
  std::vector<const T*> parts;
  std::vector<std::int64_t> starts;  ///< where each part starts in the row, then the row's length

  explicit element_row(std::span<const tensor* const> tensors) {
    std::int64_t at = 0;
    for (const tensor* t : tensors) {
      if (t->size() == 0) continue;
      parts.push_back(static_cast<const T*>(t->raw_data()));
      starts.push_back(at);
      at += t->size();
    }
    starts.push_back(at);
  }
  /// f(pointer, count, offset from `begin`) for each part's share of [begin, end).
  template <class F>
  void each(std::int64_t begin, std::int64_t end, F&& f) const {
    std::size_t k = std::size_t(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin());
    for (k = k == 0 ? 0 : k - 1; k < parts.size() && starts[k] < end; ++k) {
      const std::int64_t from = std::max(begin, starts[k]), to = std::min(end, starts[k + 1]);
      if (from < to) f(parts[k] + (from - starts[k]), to - from, from - begin);
    }
  }
};

/// The all-reduce (sum or mean) of a row of floats in rank order, as the file comment
/// says: in segments of at most 2^27 elements, rank j receives block j of the segment
/// from every rank (sends and receives straight from and into the tensors, split where
/// they end, rather than an MPI_Alltoallv of a packed copy), sums the blocks in rank
/// order, and an MPI_Allgatherv gives every rank every block.
template <class T>
void ordered_all_reduce(group_state& g, const element_row<T>& in, T* out, bool mean) {
  const int n = g.size, me = g.rank;
  const std::int64_t count = in.starts.back();
  constexpr std::int64_t segment = std::int64_t(1) << 27;
  const auto ranks = static_cast<std::size_t>(n);
  std::vector<int> counts(ranks), displs(ranks);
  std::vector<MPI_Request> requests;
  for (std::int64_t start = 0; start < count; start += segment) {
    const std::int64_t length = std::min(segment, count - start);
    for (int j = 0, offset = 0; j < n; ++j) {
      counts[std::size_t(j)] = int(length / n + (j < length % n));
      displs[std::size_t(j)] = offset;
      offset += counts[std::size_t(j)];
    }
    const int mine = counts[std::size_t(me)];
    const std::int64_t my_begin = start + displs[std::size_t(me)];
    // Slot j of `received` holds rank j's block `me` (slot `me` is unused).
    T* received = static_cast<T*>(scratch(g, ranks * std::size_t(mine) * sizeof(T) + sizeof(T)));
    requests.clear();
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      in.each(my_begin, my_begin + mine, [&](const T*, std::int64_t c, std::int64_t at) {
        requests.emplace_back();
        runtime::check(MPI_Irecv(received + std::int64_t(j) * mine + at, int(c), mpi_type(dtype_of<T>), j, 0, g.comm,
                                 &requests.back()),
                       "MPI_Irecv");
      });
    }
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const std::int64_t begin = start + displs[std::size_t(j)];
      in.each(begin, begin + counts[std::size_t(j)], [&](const T* p, std::int64_t c, std::int64_t) {
        requests.emplace_back();
        runtime::check(MPI_Isend(p, int(c), mpi_type(dtype_of<T>), j, 0, g.comm, &requests.back()), "MPI_Isend");
      });
    }
    runtime::check(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    // Summed part by part of this rank's own block, which may span several tensors.
    in.each(my_begin, my_begin + mine, [&](const T* own, std::int64_t c, std::int64_t at) {
      sum_in_rank_order(out + my_begin + at, own, received + at, c, mine, me, n, mean);
    });
    runtime::check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out + start, counts.data(), displs.data(),
                                  mpi_type(dtype_of<T>), g.comm),
                   "MPI_Allgatherv");
  }
}

inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

/// An exact reduction (integers, or max and min), through MPI_Allreduce in segments;
/// an integer mean truncates toward zero, as reduce_mean's.
template <class T>
void exact_all_reduce(group_state& g, const T* in, T* out, std::int64_t count, reduce_op op) {
  constexpr std::int64_t segment = std::int64_t(1) << 30;
  for (std::int64_t start = 0; start < count; start += segment)
    runtime::check(MPI_Allreduce(in + start, out + start, int(std::min(segment, count - start)), mpi_type(dtype_of<T>),
                                 mpi_op(op), g.comm),
                   "MPI_Allreduce");
  if (op == reduce_op::mean)
    for (std::int64_t e = 0; e < count; ++e) out[e] = ops::mean_of<T>(out[e], g.size);
}

/// A string tensor's characters and their lengths, packed for MPI.
struct packed_strings {
  std::vector<std::int64_t> lengths;
  std::vector<char> bytes;
};
inline packed_strings pack(const tensor& t) {
  packed_strings p;
  const std::string* s = t.data<std::string>();
  for (std::int64_t i = 0; i < t.size(); ++i) {
    p.lengths.push_back(std::int64_t(s[i].size()));
    p.bytes.insert(p.bytes.end(), s[i].begin(), s[i].end());
  }
  return p;
}
inline void unpack(tensor& out, std::int64_t first, const std::int64_t* lengths, std::int64_t count, const char* bytes) {
  auto* s = static_cast<std::string*>(out.raw_data());
  for (std::int64_t i = 0; i < count; ++i) {
    s[first + i].assign(bytes, std::size_t(lengths[i]));
    bytes += lengths[i];
  }
}

/// The group collective `s` runs over.
inline std::shared_ptr<group_state> group_for(const collective_spec& s) {
  if (s.group) return std::static_pointer_cast<group_state>(s.group);
  return runtime::get().group_of(s.members);
}

/// The number of ranks of group `members` (of a loaded graph).
inline int group_size_of(const std::vector<int>& members) { return runtime::get().group_of(members)->size; }

/// The spec of a collective called at `where`.
inline collective_spec spec_at(collective_kind kind, reduce_op op, int root, const communicator& group,
                               const std::source_location& where) {
  return {kind, op, root, group.members(), group.state(), kiln::detail::collective_site(where.file_name(), where.line(), where.column()),
          where.line()};
}

/// The collectives' runtime (`collective_runs`, the one specialization): running them
/// eagerly, recording their nodes and their gradients. A template on nothing, compiled
/// only where a program includes kiln/distribute.
template <class Unused>
struct basic_collective_runs {
  /// Runs collective `op` on eager tensors (the engine's entry point, and what the node
  /// runs): the agreement, the checks, then the transfer. Tensors on the gpu travel
  /// through host memory.
  static void run_collective(const collective_op& op, std::span<const tensor* const> given, std::span<tensor> results);

  /// The backward pass of a collective, from its spec, the inputs and the gradients of its
  /// (floating-point) results: the collectives TensorFlow differentiates them with. The
  /// gradient of an all-sum is an all-sum and of an all-mean an all-mean (as
  /// tf.distribute's ReplicaContext.all_reduce); of an all-gather, the reduce-scatter
  /// (sum) of the gradients, each rank's own block of their sum; of a broadcast, their sum
  /// on the root (NCCL's Reduce, as NcclBroadcast's gradient) and zeros elsewhere; of a
  /// reduce-scatter, the all-gather of the gradients. Max and min have none, as in
  /// TensorFlow: differentiating through them raises kiln::unavailable_error.
  static std::vector<tensor> collective_backward(const void* self, std::span<const tensor>, std::span<const tensor> dys);

  /// Records a collective on the gradient tapes recording on this thread.
  static void record_on_tapes(const collective_spec& spec, std::span<const tensor> inputs, std::span<const tensor> outputs);

  /// What a replayed trace's collective nodes hand to the tapes (their entries of
  /// kiln::detail::special_gradients).
  static void record_collective_on_tapes(const special_op& op, std::span<const tensor> inputs,
                                         std::span<const tensor> outputs);

  /// Runs collective `spec` on `inputs` eagerly, or records its node while a function
  /// traces; the gradient tapes recording see it as one differentiable op.
  static std::vector<tensor> collective(const collective_spec& spec, std::span<const tensor> inputs);
};
using collective_runs = basic_collective_runs<void>;

template <class Unused>
void basic_collective_runs<Unused>::run_collective(const collective_op& op, std::span<const tensor* const> given,
                                                   std::span<tensor> results) {
  const collective_spec& s = op.spec();
  const std::string what(kiln::detail::collective_api_name(s.kind));
  runtime& rt = runtime::get();
  const std::shared_ptr<group_state> group = group_for(s);
  group_state& g = *group;
  if (g.rank < 0)
    throw invalid_argument_error(what + ": this process (world rank " + std::to_string(rt.world_rank()) +
                                 ") is not a rank of " + runtime::group_name(g));
  for (const tensor* t : given) t->require_value(what);
  const device place = given[0]->device();
  for (const tensor* t : given)
    if (t->device() != place)
      throw invalid_argument_error(what + ": the tensors of one collective are on one device, got " +
                                   std::string(name(place)) + " and " + std::string(name(t->device())));

  std::lock_guard lock(rt.mutex());
  if (!g.broken.empty())
    throw unavailable_error(what + ": " + runtime::group_name(g) + " cannot run collectives any more: " + g.broken);
  const std::uint64_t sequence = g.sequence++;
  std::vector<collective_descriptor> all;
  if (g.size > 1) {
    all = rt.agree(g, descriptor_of(s, sequence, given), what, &describe);
    check_agreement(g, all, what);
  }
  std::vector<std::pair<dtype, shape>> specs;
  for (const tensor* t : given) specs.emplace_back(t->dtype(), t->shape());
  std::vector<std::pair<dtype, shape>> out_specs;
  if (collective_failure f = kiln::detail::check_collective(s, specs, g.size, &out_specs)) throw_failure(f, false);

  if (g.size == 1) {  // every kind is the identity on one rank
    for (std::size_t k = 0; k < given.size(); ++k) results[k] = *given[k];
    return;
  }
#if KILN_HAS_NCCL && KILN_THRUST_CUDA
  if (place == device::gpu && nccl_takes(s, given[0]->dtype())) return run_on_nccl(g, s, given, results, out_specs);
#endif
  // Elsewhere device tensors travel through host memory.
  std::vector<tensor> host;
  std::vector<const tensor*> in(given.begin(), given.end());
  if (place != device::cpu) {
    for (const tensor* x : given) host.push_back(x->to(device::cpu));
    for (std::size_t k = 0; k < in.size(); ++k) in[k] = &host[k];
  }
  const dtype t = in[0]->dtype();
  const auto element = size_of(t);
  switch (s.kind) {
    case collective_kind::all_reduce:
    case collective_kind::reduce: {
      std::int64_t total = 0;
      for (const tensor* x : in) total += x->size();
      tensor reduced = kiln::detail::allocate_result(what, t, shape{total});
      ops::visit_numeric(t, [&]<class T>() {
        if constexpr (std::is_floating_point_v<T>) {
          if (s.op == reduce_op::sum || s.op == reduce_op::mean) {
            ordered_all_reduce(g, element_row<T>(in), static_cast<T*>(reduced.raw_data()), s.op == reduce_op::mean);
            return;
          }
        }
        // Exact reductions go through MPI_Allreduce, of one buffer: a bucket is packed.
        const void* source = in[0]->raw_data();
        tensor packed;
        if (in.size() > 1) {
          packed = kiln::detail::allocate_result(what, t, shape{total});
          std::int64_t at = 0;
          for (const tensor* x : in) {
            if (x->size() > 0)
              std::memcpy(static_cast<char*>(packed.raw_data()) + at * std::int64_t(element), x->raw_data(),
                          std::size_t(x->size()) * element);
            at += x->size();
          }
          source = packed.raw_data();
        }
        exact_all_reduce(g, static_cast<const T*>(source), static_cast<T*>(reduced.raw_data()), total, s.op);
      });
      if (s.kind == collective_kind::reduce && g.rank != s.root && total > 0)
        std::memset(reduced.raw_data(), 0, std::size_t(total) * element);  // (floats: all-zero bytes are 0.0)
      std::int64_t at = 0;
      for (std::size_t k = 0; k < in.size(); ++k) {
        results[k] = reduced.share(in[k]->shape(), at);
        at += in[k]->size();
      }
      break;
    }
    case collective_kind::all_gather: {
      const shape& result_shape = out_specs[0].second;
      tensor out = kiln::detail::allocate_result(what, t, result_shape);
      const std::int64_t count = in[0]->size();
      if (t == string) {
        const packed_strings mine = pack(*in[0]);
        std::vector<std::int64_t> lengths(std::size_t(count * g.size) + 1);
        runtime::check(MPI_Allgather(mine.lengths.data(), mpi_count(count, what), MPI_INT64_T, lengths.data(),
                                     mpi_count(count, what), MPI_INT64_T, g.comm),
                       "MPI_Allgather");
        std::vector<int> byte_counts(static_cast<std::size_t>(g.size)), byte_displs(static_cast<std::size_t>(g.size));
        std::int64_t bytes = 0;
        for (int r = 0; r < g.size; ++r) {
          byte_counts[std::size_t(r)] = mpi_count(all[std::size_t(r)].string_bytes, what);
          byte_displs[std::size_t(r)] = mpi_count(bytes, what);
          bytes += all[std::size_t(r)].string_bytes;
        }
        std::vector<char> characters(std::size_t(bytes) + 1);
        runtime::check(MPI_Allgatherv(mine.bytes.data(), mpi_count(std::int64_t(mine.bytes.size()), what), MPI_CHAR,
                                      characters.data(), byte_counts.data(), byte_displs.data(), MPI_CHAR, g.comm),
                       "MPI_Allgatherv");
        for (int r = 0; r < g.size; ++r)
          unpack(out, count * r, lengths.data() + count * r, count, characters.data() + byte_displs[std::size_t(r)]);
      } else {
        const int n = mpi_count(count * std::int64_t(element), what);
        runtime::check(MPI_Allgather(in[0]->raw_data(), n, MPI_BYTE, out.raw_data(), n, MPI_BYTE, g.comm), "MPI_Allgather");
      }
      results[0] = out;
      break;
    }
    case collective_kind::broadcast: {
      tensor out = kiln::detail::allocate_result(what, t, in[0]->shape());
      const std::int64_t count = in[0]->size();
      const bool root = g.rank == s.root;
      if (t == string) {
        packed_strings p;
        if (root) p = pack(*in[0]);
        p.lengths.resize(std::size_t(count));
        p.bytes.resize(std::size_t(all[std::size_t(s.root)].string_bytes));
        runtime::check(MPI_Bcast(p.lengths.data(), mpi_count(count, what), MPI_INT64_T, s.root, g.comm), "MPI_Bcast");
        runtime::check(MPI_Bcast(p.bytes.data(), mpi_count(std::int64_t(p.bytes.size()), what), MPI_CHAR, s.root, g.comm),
                       "MPI_Bcast");
        unpack(out, 0, p.lengths.data(), count, p.bytes.data());
      } else {
        const std::int64_t bytes = count * std::int64_t(element);
        if (root && bytes > 0) std::memcpy(out.raw_data(), in[0]->raw_data(), std::size_t(bytes));
        constexpr std::int64_t segment = std::int64_t(1) << 30;
        for (std::int64_t start = 0; start < bytes; start += segment)
          runtime::check(MPI_Bcast(static_cast<char*>(out.raw_data()) + start, int(std::min(segment, bytes - start)),
                                   MPI_BYTE, s.root, g.comm),
                         "MPI_Bcast");
      }
      results[0] = out;
      break;
    }
    case collective_kind::reduce_scatter: {
      tensor out = kiln::detail::allocate_result(what, t, out_specs[0].second);
      const std::int64_t block = out.size();
      const int b = mpi_count(block, what);
      ops::visit_numeric(t, [&]<class T>() {
        const T* source = static_cast<const T*>(in[0]->raw_data());
        T* target = static_cast<T*>(out.raw_data());
        if constexpr (std::is_floating_point_v<T>) {
          if (s.op == reduce_op::sum || s.op == reduce_op::mean) {
            // Rank j receives block j of every rank (its own included) and sums them in rank order.
            T* received = static_cast<T*>(scratch(g, std::size_t(g.size) * std::size_t(block) * sizeof(T) + sizeof(T)));
            runtime::check(MPI_Alltoall(source, b, mpi_type(t), received, b, mpi_type(t), g.comm), "MPI_Alltoall");
            sum_in_rank_order(target, received + std::int64_t(g.rank) * block, received, block, block, g.rank, g.size,
                              s.op == reduce_op::mean);
            return;
          }
        }
        runtime::check(MPI_Reduce_scatter_block(source, target, b, mpi_type(t), mpi_op(s.op), g.comm),
                       "MPI_Reduce_scatter_block");
        if (s.op == reduce_op::mean)
          for (std::int64_t e = 0; e < block; ++e) target[e] = ops::mean_of<T>(target[e], g.size);
      });
      results[0] = out;
      break;
    }
  }
  if (place != device::cpu)
    for (tensor& r : results) r = r.to(place);
}

template <class Unused>
std::vector<tensor> basic_collective_runs<Unused>::collective_backward(const void* self, std::span<const tensor>,
                                                                       std::span<const tensor> dys) {
  const collective_spec& s = *static_cast<const collective_spec*>(self);
  const std::string what(kiln::detail::collective_api_name(s.kind));
  auto with = [&](collective_kind kind, reduce_op op) {
    const std::source_location here = std::source_location::current();
    return collective_spec{kind, op, s.root, s.members, s.group,
                           kiln::detail::collective_site(here.file_name(), here.line(), std::uint32_t(kind)), here.line()};
  };
  const bool differentiable = s.op == reduce_op::sum || s.op == reduce_op::mean;
  if (!differentiable && (s.kind == collective_kind::all_reduce || s.kind == collective_kind::reduce_scatter))
    throw unavailable_error(what + ": reduce_op::" + std::string(name(s.op)) +
                            " has no gradient (TensorFlow differentiates the sum and the mean of a collective only)");
  switch (s.kind) {
    case collective_kind::all_reduce: return collective(with(collective_kind::all_reduce, s.op), dys);
    case collective_kind::all_gather: return collective(with(collective_kind::reduce_scatter, reduce_op::sum), dys);
    case collective_kind::broadcast: return collective(with(collective_kind::reduce, reduce_op::sum), dys);
    case collective_kind::reduce: return collective(with(collective_kind::broadcast, reduce_op::sum), dys);
    case collective_kind::reduce_scatter: {
      std::vector<tensor> g = collective(with(collective_kind::all_gather, reduce_op::sum), dys);
      if (s.op == reduce_op::mean) g[0] = g[0] / kiln::constant(double(group_for(s)->size), g[0].dtype());
      return g;
    }
  }
  return {};
}

template <class Unused>
void basic_collective_runs<Unused>::record_on_tapes(const collective_spec& spec, std::span<const tensor> inputs,
                                                    std::span<const tensor> outputs) {
  if (!is_floating(inputs[0].dtype())) return;
  auto call = std::make_shared<kiln::detail::differentiable_call>();
  call->self = std::make_shared<const collective_spec>(spec);
  call->backward = &collective_backward;
  kiln::detail::tape_runtime::record_call_on_active_tapes(call, inputs, outputs);
}

template <class Unused>
void basic_collective_runs<Unused>::record_collective_on_tapes(const special_op& op, std::span<const tensor> inputs,
                                                               std::span<const tensor> outputs) {
  const auto* c = op.as<collective_op>();
  if (!c || inputs.empty()) return;
  // On one rank a collective gives its inputs themselves, which the tapes already know.
  if (!outputs[0].is_symbolic() && group_for(c->spec())->size == 1) return;
  record_on_tapes(c->spec(), inputs, outputs);
}

template <class Unused>
std::vector<tensor> basic_collective_runs<Unused>::collective(const collective_spec& spec,
                                                              std::span<const tensor> inputs) {
  const std::string what(kiln::detail::collective_api_name(spec.kind));
  if (inputs.empty()) throw invalid_argument_error(what + ": no tensors given");
  for (const tensor& t : inputs)
    if (!t.defined()) throw invalid_argument_error(what + ": an empty tensor was given");
  const int size = group_for(spec)->size;
  std::vector<tensor> outputs;
  if (kiln::detail::trace_context* trace = kiln::detail::trace_context::current()) {
    std::vector<std::pair<dtype, shape>> specs, results;
    for (const tensor& t : inputs) specs.emplace_back(t.dtype(), t.shape());
    if (collective_failure f = kiln::detail::check_collective(spec, specs, size, &results)) throw_failure(f, true);
    outputs = trace->record_special(std::make_shared<collective_op>(spec), inputs, results);
  } else {
    std::vector<const tensor*> pointers;
    for (const tensor& t : inputs) pointers.push_back(&t);
    outputs.resize(inputs.size());
    run_collective(collective_op(spec), pointers, outputs);
    if (size == 1) return outputs;  // its inputs themselves: nothing for a tape to record
  }
  if (kiln::detail::recording_tapes() > 0) record_on_tapes(spec, inputs, outputs);
  return outputs;
}

/// What kiln::distribute installs when a program includes it: the engine that runs
/// collective nodes, and how replayed ones reach the gradient tapes (their entries of
/// kiln::detail::special_gradients).
inline const kiln::detail::collective_engine engine{&collective_runs::run_collective, &group_size_of};
inline const bool engine_installed = [] {
  kiln::detail::collective_engine_slot().store(&engine, std::memory_order_release);
  constexpr auto record = &collective_runs::record_collective_on_tapes;
  static kiln::detail::special_gradient gradients[] = {
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::all_reduce), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::all_gather), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::broadcast), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::reduce_scatter), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::reduce), record}};
  for (kiln::detail::special_gradient& g : gradients) kiln::detail::register_special_gradient(g);
  return true;
}();

}  // namespace kiln::distribute::detail

namespace kiln {

/// Combines `x` across the ranks of `group` (every rank by default): each rank gets
/// the sum, mean, max or min of every rank's `x` (TensorFlow's
/// `tf.distribute.ReplicaContext.all_reduce`, CollectiveReduceV2). Every rank of the
/// group must call it, in the same order as its other collectives and from the same
/// place of the program (`where`: ranks that reach one collective from different lines
/// pass one std::source_location), with the same dtype (int32, int64, float32 or
/// float64; another raises kiln::type_error) and shape; ranks that disagree raise
/// kiln::invalid_argument_error naming what each gave.
/// A float sum is taken in rank order, the same bits on every rank
/// (kiln/distribute/collectives.hpp); an integer mean truncates toward zero. Eagerly it
/// runs at once; in a kiln::function it is a node that runs at every call. The
/// gradient of a sum is the all-reduce sum of the gradients, of a mean their mean;
/// max and min have none.
/// \code
/// const auto& world = kiln::distribute::communicator::world();
/// kiln::tensor total = kiln::all_reduce(kiln::constant(float(world.rank() + 1)));  // 1 + 2 + ... + size
/// kiln::tensor top = kiln::all_reduce(kiln::constant(world.rank()), kiln::reduce_op::max);
/// \endcode
template <class Unused = void>
tensor all_reduce(const tensor& x, reduce_op op = reduce_op::sum,
                  const distribute::communicator& group = distribute::communicator::world(),
                  std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::all_reduce, op, 0, group, where), in)[0];
}

/// The all-reduce of several tensors of one dtype in one transfer (a *bucket*, as
/// Horovod fuses tensors): each result is the all_reduce of its tensor.
/// \code
/// std::vector<kiln::tensor> grads{kiln::ones({2, 3}), kiln::zeros({4})};
/// std::vector<kiln::tensor> means = kiln::all_reduce(grads, kiln::reduce_op::mean);
/// \endcode
template <class Unused = void>
std::vector<tensor> all_reduce(const std::vector<tensor>& xs, reduce_op op = reduce_op::sum,
                               const distribute::communicator& group = distribute::communicator::world(),
                               std::source_location where = std::source_location::current()) {
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::all_reduce, op, 0, group, where), xs);
}

/// Every rank's `x`, stacked along axis 0 in rank order (CollectiveGatherV2): shape
/// `(size * d0, d1, ...)` for `x` of shape `(d0, d1, ...)`, the same on every rank. Any
/// dtype, strings included; `x` must have rank 1 or more and the same shape on every
/// rank. Its gradient is each rank's own block of the sum of the gradients.
/// \code kiln::tensor ranks = kiln::all_gather(kiln::constant({kiln::distribute::communicator::world().rank()})); \endcode
template <class Unused = void>
tensor all_gather(const tensor& x, const distribute::communicator& group = distribute::communicator::world(),
                  std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::all_gather, reduce_op::sum, 0, group, where), in)[0];
}

/// Rank `root`'s `x`, on every rank (CollectiveBcastSend/RecvV2 in one op): the other
/// ranks' `x` gives the dtype and shape, which must be the root's. Any dtype, strings
/// included. Its gradient is the sum of the gradients on the root, zeros elsewhere.
/// \code kiln::tensor seed = kiln::broadcast(kiln::constant(std::int64_t(42)), 0); \endcode
template <class Unused = void>
tensor broadcast(const tensor& x, int root = 0, const distribute::communicator& group = distribute::communicator::world(),
                 std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::broadcast, reduce_op::sum, root, group, where), in)[0];
}

/// The all-reduce of `x` cut along axis 0 into one block per rank, rank r keeping block
/// r (CollectiveReduceScatterV2): for `x` of shape `(d0, ...)` with d0 a multiple of the
/// group's size, shape `(d0 / size, ...)`. Numeric dtypes; a float sum in rank order as
/// all_reduce's. Its gradient (sum, mean) is the all-gather of the gradients.
/// \code
/// const int size = kiln::distribute::communicator::world().size();
/// kiln::tensor mine = kiln::reduce_scatter(kiln::ones({2 * size}));  // 2 elements, each `size`
/// \endcode
template <class Unused = void>
tensor reduce_scatter(const tensor& x, reduce_op op = reduce_op::sum,
                      const distribute::communicator& group = distribute::communicator::world(),
                      std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::reduce_scatter, op, 0, group, where), in)[0];
}

}  // namespace kiln

namespace kiln::distribute {

inline void communicator::barrier() const {
  detail::runtime& rt = detail::runtime::get();
  if (size() == 1) return;
  std::lock_guard lock(rt.mutex());
  if (!state_->broken.empty())
    throw unavailable_error("communicator::barrier: " + detail::runtime::group_name(*state_) +
                            " cannot run collectives any more: " + state_->broken);
  detail::collective_descriptor d;
  d.sequence = state_->sequence++;
  d.kind = 255;
  const auto all = rt.agree(*state_, d, "communicator::barrier", &detail::describe);
  detail::check_agreement(*state_, all, "communicator::barrier");
}

}  // namespace kiln::distribute

#pragma once
/// \file
/// Execution plans. A plan is what a graph does for one set of concrete argument
/// dtypes, shapes and devices: every node's concrete dtype and shape (inferred with
/// the ops' own rules), a schedule of only the nodes the outputs need, elementwise
/// nodes of one shape fused into clusters that run tile by tile, the entry point of
/// every op resolved to a function pointer, and a home for every value (reused
/// workspace memory, or a fresh buffer for what leaves the call). A plan is
/// immutable once built; several threads run it at once, each in its own workspace.
/// kiln/exec/planner.hpp builds one; this file holds what a plan is made of.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/exec/node_map.hpp"
#include "kiln/exec/tile.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail::exec {

/// Where a value lives while a plan runs.
enum class value_home : std::uint8_t {
  unused,     ///< not needed by any output, or kept in a cluster's tile scratch only
  argument,   ///< the caller's tensor
  constant,   ///< the graph's captured tensor
  slot,       ///< workspace memory reused across calls
  fresh,      ///< a new buffer each call (outputs, strings, values an output may alias)
  evaluated,  ///< assigned by the op itself (detail::evaluated)
};

/// What a plan knows of one node's value.
struct value_info {
  value_home home = value_home::unused;
  dtype type = float32;
  shape dims;
  /// For a value in a slot: its index among the slots of its dtype.
  int slot = -1;
};

/// One elementwise node of a cluster, with the scalar arithmetic folded into its pass
/// (the nodes of that arithmetic get no instruction of their own): operands, result
/// and fold operands are indices into the cluster's per-tile pointer table.
struct instruction {
  backend::cpu::run_fn fn = nullptr;
  compound_fn compound = nullptr;  ///< set, and run instead of `fn`, when `fold` is not empty
  const void* op = nullptr;
  unsigned contig = 0;
  int arity = 0;
  int out = 0;
  std::array<int, 3> in{};
  dtype type = float32;             ///< of the result
  std::string_view native_name{};  ///< op_entry::native_name
  folded_arithmetic fold;
  int folded_ops = 0;  ///< nodes folded into this one
};

/// A cluster compiled to one native loop (kiln/exec/jit.hpp): runs `len` elements,
/// a multiple of padded_elements, of the tile whose pointer table is `table`.
using native_fn = void (*)(void* const* table, std::int64_t len);

/// A value a cluster reads or writes in memory, with the table entry it fills.
struct cluster_operand {
  int value = 0;
  int entry = 0;
  std::size_t element_bytes = 0;
  bool written = false;  ///< a result of the cluster (else an input)
};

/// A value read by a cluster in the shape of another (a row or column vector):
/// gathered per tile into a buffer of the tile scratch.
struct gathered_operand {
  int value = 0;
  int entry = 0;
  broadcast_read read;
};

/// A value check to run before a cluster.
struct cluster_check {
  check_fn fn = nullptr;
  const void* op = nullptr;
  std::vector<int> inputs;
  int node = -1;  ///< the node it checks, which its error names
};

/// Instructions always run on a multiple of this many elements, so that their SIMD
/// loops never end in a scalar remainder (a scalar tanh costs as much as a batch).
/// The last elements of a cluster that are not a multiple run in staging buffers,
/// padded with copies of the last element, so padded lanes see only valid values
/// (no integer division by garbage zero).
inline constexpr std::int64_t padded_elements = 64 / sizeof(float);
/// Bytes of one staging buffer: `padded_elements` of the widest dtype.
inline constexpr std::size_t staging_bytes = padded_elements * sizeof(double);

/// Elementwise nodes of one result shape evaluated together, tile by tile.
/// The pointer table of a tile holds, in order: `buffers` tile buffers (scratch of
/// the cluster's intermediates, then gathered operands), then one entry per
/// operand in memory. A chunk's scratch holds the tile buffers, then one staging
/// buffer per streamed operand.
struct fused_cluster {
  std::vector<int> nodes;  ///< the graph nodes fused, in order
  shape dims;
  std::int64_t size = 0;
  std::int64_t tile = 0;         ///< elements per tile
  std::size_t buffer_bytes = 0;  ///< bytes per tile buffer (a multiple of 64)
  int buffers = 0;               ///< scratch buffers, gathered buffers included
  int table_size = 0;
  std::vector<instruction> code;
  std::vector<cluster_operand> streamed;   ///< arguments or results of the cluster's shape: advance per tile
  std::vector<cluster_operand> broadcast;  ///< one-element operands: read with stride 0
  std::vector<gathered_operand> gathered;
  std::vector<int> allocated;  ///< results with a fresh buffer, created before the cluster runs
  std::vector<cluster_check> checks;
  native_fn native = nullptr;  ///< set when the cluster was compiled (function_options::jit_compile)

  /// Whether one pass over memory runs the whole cluster (a native loop, or one
  /// instruction): its streams are then regular enough for the hardware prefetcher.
  bool single_pass() const { return native || code.size() == 1; }
  /// Entries between the pointer tables of two chunks: whole cache lines.
  int table_stride() const { return (table_size + 7) & ~7; }
  std::size_t chunk_bytes() const { return std::size_t(buffers) * buffer_bytes + streamed.size() * staging_bytes; }
};

/// A step that runs one op through its op_fn.
struct op_step {
  int value = -1;  ///< the op's node
  op_fn run = nullptr;
  const void* op = nullptr;
  bool allocate = false;  ///< the op's result is fresh and has a kernel: allocate it first
  std::vector<int> inputs;
  /// An op that may write its result into its first input's buffer (set_item), whose
  /// first input no later step reads: how it does so, else null.
  in_place_fn in_place = nullptr;
  /// That input's position among the graph's arguments, when it is one (-1 else): an
  /// argument is the caller's unless the run was given it to consume.
  int argument = -1;
};

/// A step that runs a special op (a variable access, a print, a conditional, a loop):
/// its results are values `value`, `value + 1`, ...
struct special_step {
  int value = -1;
  std::vector<int> inputs;
};

/// A step that runs fused cluster `cluster` of execution_plan::clusters.
struct cluster_step {
  int cluster = -1;
};

/// One step of a schedule, and the fresh values whose last reader it is.
struct plan_step {
  std::variant<op_step, special_step, cluster_step> action;
  std::vector<int> release;
};

/// Dtype, device and shape of one argument, as a plan's key holds them.
struct argument_key {
  dtype type = float32;
  device place = device::cpu;
  shape dims;
  /// Whether the plan holds for any dims of this rank: a growing tensor_array that a
  /// loop body pads and writes, an argument nothing reads (typed_nodes::any_dims), or
  /// every argument of a plan that interprets because a shape depends on values.
  bool any_dims = false;
  bool operator==(const argument_key&) const = default;
};

/// What a graph does for one set of argument dtypes, devices and shapes.
struct execution_plan {
  /// Distinguishes plans for the workspaces bound to them (never reused).
  std::uint64_t id = next_id();
  std::vector<argument_key> key;
  /// Run node by node through detail::execute: some tensor is not on the CPU, or a
  /// rule fails for these shapes (execution then raises the eager error in order).
  bool interpreted = false;
  node_map<value_info> values;
  std::vector<plan_step> steps;
  std::vector<fused_cluster> clusters;
  std::vector<int> outputs;  ///< the value of each output
  std::vector<int> fresh;    ///< values created during a call, cleared after it
  std::vector<int> bound;    ///< values in slots: bound once per workspace
  std::array<std::vector<std::int64_t>, dtype_count> slot_elements;  ///< per dtype, per slot
  std::size_t max_inputs = 0;
  int max_table = 0;
  /// Interpreted plans for arguments on a GPU: the graph's CPU constants, copied
  /// there once, since a trace records no device (`x + 1` on a GPU tensor traces a
  /// CPU scalar 1).
  std::vector<std::pair<int, tensor>> moved_constants;

  /// True when the arguments have this plan's dtypes, devices and shapes (any dims of
  /// the key's rank where the key says any_dims).
  bool accepts(std::span<const tensor> args) const {
    if (args.size() != key.size()) return false;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const argument_key& k = key[i];
      const shape& s = args[i].shape();
      if (args[i].dtype() != k.type || args[i].device() != k.place) return false;
      if (k.any_dims ? s.rank() != k.dims.rank() : s != k.dims) return false;
    }
    return true;
  }

 private:
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }
};

/// True for the nodes a schedule runs: registry ops, special ops and their results.
template <class = void>
bool computed(const node& n) {
  return n.kind() == node_kind::op || n.kind() == node_kind::special || n.kind() == node_kind::result;
}

/// The part of planning that does not depend on shapes: which nodes the outputs and
/// the effects need (non-strict execution), and where each output comes from.
struct graph_outline {
  // Two passes over the nodes, where each pass reads every node of a large graph
  // from memory: back from the outputs and the effects (graph::needed_nodes), then
  // forward over what runs.
  template <class = void>
  explicit graph_outline(const graph& g) : needed(g.needed_nodes()) {
    const int n = needed.size();
    for (int out : g.outputs()) {
      int source = out;
      while (g.node_at(source).kind() == node_kind::identity) source = g.node_at(source).input_ids()[0];
      outputs.push_back(source);
    }
    last_reader = node_map<int>(g.nodes().size(), -1);
    node_map<bool> runs(g.nodes().size(), false);
    for (int i = 0; i < n; ++i) {
      if (!needed[i] || !computed(g.node_at(i))) continue;
      runs[i] = true;
      for (int in : g.node_at(i).input_ids()) last_reader[in] = int(ops.size());
      ops.push_back(i);
    }
    for (int out : outputs) last_reader[out] = -1;
    // The values each op releases, as one array (an op's run ends at the next's start).
    release_start_.assign(ops.size() + 1, 0);
    for (int i = 0; i < n; ++i)
      if (last_reader[i] >= 0 && runs[i]) ++release_start_[std::size_t(last_reader[i]) + 1];
    for (std::size_t k = 0; k < ops.size(); ++k) release_start_[k + 1] += release_start_[k];
    released_.resize(std::size_t(release_start_.back()));
    std::vector<int> filled(release_start_.begin(), release_start_.end() - 1);
    for (int i = 0; i < n; ++i)
      if (last_reader[i] >= 0 && runs[i]) released_[std::size_t(filled[std::size_t(last_reader[i])]++)] = i;
  }
  node_map<char> needed;     ///< per node, whether the outputs or the effects need it
  std::vector<int> ops;      ///< needed op nodes, in graph (topological) order
  std::vector<int> outputs;  ///< the value node of each output
  /// For node by node execution: the op values whose last reader is ops[k].
  std::span<const int> release(std::size_t k) const {
    return std::span<const int>(released_).subspan(std::size_t(release_start_[k]),
                                                   std::size_t(release_start_[k + 1] - release_start_[k]));
  }
  /// Per node: the position in `ops` of its last reader, -1 for none and for outputs.
  node_map<int> last_reader;

 private:
  std::vector<int> release_start_;  ///< where ops[k]'s values start in released_ (one more entry: the end)
  std::vector<int> released_;
};

/// Each op of an interpreted cluster passes over a whole tile before the next op
/// starts, so a tile's memory traffic overlaps its compute only when the pass is
/// short: at 256 elements (16 AVX-512 batches) the out-of-order core runs one op while
/// the loads of the next tile, prefetched, arrive. Tiles of 2048 measured 1.5x slower
/// on a chain of five ops over 16M floats.
inline constexpr std::int64_t interpreted_max_tile = 256;
/// A native loop (function_options::jit_compile), or a cluster of one instruction once
/// its arithmetic is folded, streams memory in one pass with its intermediates in
/// registers: long tiles spare it calls (256 measured 1.8x slower for a native loop).
inline constexpr std::int64_t single_pass_max_tile = 4096;

/// Sets the tile of cluster `c` (at most `max_tile` elements) and its buffers' size:
/// the tile scratch of a chunk stays within about 32 KiB, to stay in L1.
template <class = void>
void set_tile(fused_cluster& c, std::int64_t max_tile) {
  constexpr std::size_t budget_bytes = std::size_t(32) << 10;
  constexpr std::int64_t min_tile = 64;
  const std::int64_t budget = std::int64_t(budget_bytes / (sizeof(double) * std::size_t(std::max(c.buffers, 1))));
  std::int64_t tile = std::clamp(budget, min_tile, max_tile) & ~std::int64_t(63);
  // One tile for a small cluster, rounded up so every tile buffer stays 64-byte aligned.
  if (c.size < tile) tile = std::max<std::int64_t>((c.size + 63) & ~std::int64_t(63), min_tile);
  c.tile = tile;
  c.buffer_bytes = std::size_t(tile) * sizeof(double);
}

}  // namespace kiln::detail::exec

#pragma once
/// \file
/// Execution plans. A plan is what a graph does for one set of concrete argument
/// dtypes, shapes and devices: every node's concrete dtype and shape (inferred with
/// the ops' own rules), a schedule of only the nodes the outputs need, elementwise
/// nodes of one shape fused into clusters that run tile by tile, the entry point of
/// every op resolved to a function pointer, and a home for every value (reused
/// workspace memory, or a fresh buffer for what leaves the call). A plan is
/// immutable once built; several threads run it at once, each in its own workspace.
///
/// Fusion: a cluster grows along producer-to-consumer edges between elementwise
/// nodes of the same result shape, in graph order. Once anything outside a cluster
/// reads one of its values, the cluster is closed, so it can run as one step at
/// the place of its last node without reordering a reader before it. Values that
/// only the cluster reads live in per-tile scratch and never reach memory. An op
/// with a value check (integer floordiv, floormod, pow) joins a cluster only as a
/// node whose inputs come from outside it, so its check runs on real values before
/// the cluster starts, as eager execution would run it.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/exec/kernel_table.hpp"
#include "kiln/exec/tile.hpp"
#include "kiln/graph/graph.hpp"

namespace kiln::detail::exec {

/// Where a value lives while a plan runs.
enum class value_home : std::uint8_t {
  unused,     ///< not needed by any output, or kept in a cluster's tile scratch only
  argument,   ///< the caller's tensor
  constant,   ///< the graph's captured tensor
  slot,       ///< workspace memory reused across calls
  fresh,      ///< a new buffer each call (outputs, strings, values an output may alias)
  evaluated,  ///< assigned by the op itself (ops that re-describe a buffer)
};

struct value_info {
  value_home home = value_home::unused;
  dtype type = float32;
  shape dims;
  /// The argument index (argument), or the slot index among slots of this dtype (slot).
  int index = -1;
};

/// One elementwise node of a cluster, with the scalar arithmetic folded into its pass
/// (the nodes of that arithmetic get no instruction of their own): operands, result
/// and fold operands are indices into the cluster's per-tile pointer table.
struct instruction {
  tile_fn fn = nullptr;
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

/// One step of a schedule: a fused cluster, one op run through its `op_fn`, or a
/// special op (a variable access, a print, a conditional, a loop).
struct plan_step {
  int cluster = -1;  ///< index into execution_plan::clusters, or -1 for an op
  int value = -1;    ///< the op's node
  op_fn run = nullptr;
  const void* op = nullptr;
  const special_op* special = nullptr;  ///< its results are values `value`, `value + 1`, ...
  bool allocate = false;  ///< the op's result is fresh and has a kernel: allocate it first
  std::vector<int> inputs;
  std::vector<int> release;  ///< fresh values whose last reader is this step
};

/// Dtype, device and shape of one argument, as a plan's key holds them.
struct argument_key {
  dtype type = float32;
  device place = device::cpu;
  shape dims;
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
  std::vector<value_info> values;  ///< one per graph node
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

  /// True when the arguments have this plan's dtypes, devices and shapes.
  bool accepts(std::span<const tensor> args) const {
    if (args.size() != key.size()) return false;
    for (std::size_t i = 0; i < args.size(); ++i)
      if (args[i].dtype() != key[i].type || args[i].device() != key[i].place || args[i].shape() != key[i].dims) return false;
    return true;
  }

 private:
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }
};

/// True for the nodes a schedule runs: registry ops, special ops and their results.
inline bool computed(const node& n) {
  return n.kind() == node_kind::op || n.kind() == node_kind::special || n.kind() == node_kind::result;
}

/// The part of planning that does not depend on shapes: which nodes the outputs and
/// the effects need (non-strict execution), and where each output comes from.
struct graph_outline {
  explicit graph_outline(const graph& g) : needed(g.nodes().size(), false) {
    const auto& nodes = g.nodes();
    for (int out : g.outputs()) {
      int source = out;
      while (nodes[std::size_t(source)].kind() == node_kind::identity) source = nodes[std::size_t(source)].input_ids()[0];
      outputs.push_back(source);
      needed[std::size_t(source)] = true;
    }
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].kind() == node_kind::special && nodes[i].special().has_effects()) needed[i] = true;
    for (std::size_t i = nodes.size(); i-- > 0;)
      if (needed[i])
        for (int in : nodes[i].input_ids()) needed[std::size_t(in)] = true;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (needed[i] && computed(nodes[i])) ops.push_back(int(i));
    release.resize(ops.size());
    std::vector<int> last_reader(nodes.size(), -1);
    for (std::size_t k = 0; k < ops.size(); ++k)
      for (int in : nodes[std::size_t(ops[k])].input_ids()) last_reader[std::size_t(in)] = int(k);
    for (int out : outputs) last_reader[std::size_t(out)] = -1;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (last_reader[i] >= 0 && computed(nodes[i])) release[std::size_t(last_reader[i])].push_back(int(i));
  }
  std::vector<bool> needed;
  std::vector<int> ops;      ///< needed op nodes, in graph (topological) order
  std::vector<int> outputs;  ///< the value node of each output
  /// For node by node execution: the op values whose last reader is ops[k].
  std::vector<std::vector<int>> release;
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
inline void set_tile(fused_cluster& c, std::int64_t max_tile) {
  constexpr std::size_t budget_bytes = std::size_t(32) << 10;
  constexpr std::int64_t min_tile = 64;
  const std::int64_t budget = std::int64_t(budget_bytes / (sizeof(double) * std::size_t(std::max(c.buffers, 1))));
  std::int64_t tile = std::clamp(budget, min_tile, max_tile) & ~std::int64_t(63);
  // One tile for a small cluster, rounded up so every tile buffer stays 64-byte aligned.
  if (c.size < tile) tile = std::max<std::int64_t>((c.size + 63) & ~std::int64_t(63), min_tile);
  c.tile = tile;
  c.buffer_bytes = std::size_t(tile) * sizeof(double);
}

/// Builds the plan of graph `g` for `args`.
class plan_builder {
 public:
  plan_builder(const graph& g, const graph_outline& outline, std::span<const tensor> args)
      : g_(g), outline_(outline), args_(args), entries_(g.nodes().size()), cluster_of_(g.nodes().size(), -1) {}

  std::unique_ptr<execution_plan> build() {
    auto p = std::make_unique<execution_plan>();
    plan_ = p.get();
    for (const tensor& a : args_) p->key.push_back({a.dtype(), a.device(), a.shape()});
    p->values.resize(g_.nodes().size());
    p->outputs = outline_.outputs;
    if (!infer_values()) {
      p->interpreted = true;
      move_constants();
      return p;
    }
    form_clusters();
    schedule();
    place_values();
    for (std::size_t c = 0; c < groups_.size(); ++c)
      if (!groups_[c].members.empty()) lower_cluster(groups_[c]);
    return p;
  }

 private:
  const node& at(int id) const { return g_.nodes()[std::size_t(id)]; }
  value_info& value(int id) { return plan_->values[std::size_t(id)]; }
  const value_info& value(int id) const { return plan_->values[std::size_t(id)]; }

  // Concrete dtype and shape of every needed node, by the ops' own rules. False when
  // the plan must interpret: a tensor off the CPU, a rule that fails for these
  // shapes, or a shape the rules leave partly unknown.
  bool infer_values() {
    const auto& args = g_.arguments();
    if (args.size() != args_.size()) return false;
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args_[i].device() != device::cpu) return false;
      value_info& v = value(args[i]);
      v = {value_home::argument, args_[i].dtype(), args_[i].shape(), int(i)};
    }
    for (std::size_t i = 0; i < g_.nodes().size(); ++i) {
      const node& n = g_.nodes()[i];
      if (!outline_.needed[i] || n.kind() != node_kind::constant) continue;
      if (n.value().device() != device::cpu) return false;
      plan_->values[i] = {value_home::constant, n.value().dtype(), n.value().shape(), -1};
    }
    std::vector<dtype> dtypes;
    std::vector<shape> shapes;
    for (int id : outline_.ops) {
      const node& n = at(id);
      if (n.kind() != node_kind::op) {
        // A special op's results have the dtypes and shapes traced for them; it
        // makes its own tensors, which may be its inputs (evaluated, like reshape).
        if (!n.shape().is_fully_defined()) return false;
        value(id).type = n.dtype();
        value(id).dims = n.shape();
        entries_[std::size_t(id)].evaluates = true;
        continue;
      }
      dtypes.clear();
      shapes.clear();
      for (int in : n.input_ids()) {
        dtypes.push_back(value(in).type);
        shapes.push_back(value(in).dims);
      }
      bool ok = ops::visit(
          [&](const auto& op) {
            dtype_result dt = op.result_dtype(dtypes);
            shape_result sh = op.result_shape(shapes);
            if (!dt.ok() || !sh.ok() || !sh.value.is_fully_defined()) return false;
            value(id).type = dt.value;
            value(id).dims = sh.value;
            return true;
          },
          n.operation());
      if (!ok) return false;
      dtype in = dtypes.empty() ? value(id).type : dtypes[std::size_t(ops::value_operand_of(n.operation()))];
      bool text = value(id).type == string;
      for (dtype t : dtypes) text = text || t == string;
      entries_[std::size_t(id)] = entry_of(n.operation(), text ? string : in, value(id).type);
    }
    return true;
  }

  void move_constants() {
    if (args_.empty()) return;
    const device d = args_[0].device();
    for (const tensor& a : args_)
      if (a.device() != d) return;
    if (d == device::cpu) return;
    for (std::size_t i = 0; i < g_.nodes().size(); ++i) {
      const node& n = g_.nodes()[i];
      if (outline_.needed[i] && n.kind() == node_kind::constant && n.value().device() == device::cpu &&
          n.value().dtype() != string)
        plan_->moved_constants.emplace_back(int(i), n.value().to(d));
    }
  }

  struct group {
    shape dims;
    std::vector<int> members;
    bool open = true;
  };

  void close_reader_of(int input) {
    int c = cluster_of_[std::size_t(input)];
    if (c >= 0) groups_[std::size_t(c)].open = false;
  }

  void form_clusters() {
    for (int id : outline_.ops) {
      const node& n = at(id);
      const op_entry& e = entries_[std::size_t(id)];
      if (!e.tile) {
        for (int in : n.input_ids()) close_reader_of(in);
        continue;
      }
      // A checked op takes all its inputs from outside its cluster (see the file comment).
      std::vector<int> joined;
      for (int in : n.input_ids()) {
        int c = cluster_of_[std::size_t(in)];
        if (c < 0) continue;
        group& gr = groups_[std::size_t(c)];
        if (gr.open && !e.check && gr.dims == value(id).dims) {
          if (std::find(joined.begin(), joined.end(), c) == joined.end()) joined.push_back(c);
        } else {
          gr.open = false;
        }
      }
      int target;
      if (joined.empty()) {
        target = int(groups_.size());
        groups_.push_back({value(id).dims, {}, true});
      } else {
        target = joined[0];
        for (std::size_t k = 1; k < joined.size(); ++k) {
          group& from = groups_[std::size_t(joined[k])];
          for (int m : from.members) cluster_of_[std::size_t(m)] = target;
          auto& to = groups_[std::size_t(target)].members;
          to.insert(to.end(), from.members.begin(), from.members.end());
          from.members.clear();
        }
      }
      groups_[std::size_t(target)].members.push_back(id);
      cluster_of_[std::size_t(id)] = target;
    }
    for (group& gr : groups_) std::sort(gr.members.begin(), gr.members.end());
  }

  // Ops run at their own place in graph order, a cluster at the place of its last node.
  void schedule() {
    std::vector<std::pair<int, int>> order;  // (place, op node or -1 - cluster)
    for (int id : outline_.ops)
      if (cluster_of_[std::size_t(id)] < 0 && at(id).kind() != node_kind::result) order.emplace_back(id, id);
    for (std::size_t c = 0; c < groups_.size(); ++c)
      if (!groups_[c].members.empty()) order.emplace_back(groups_[c].members.back(), -1 - int(c));
    std::sort(order.begin(), order.end());
    step_of_.assign(g_.nodes().size(), -1);
    cluster_index_.assign(groups_.size(), -1);
    for (auto [place, what] : order) {
      plan_step s;
      if (what >= 0) {
        const op_entry& e = entries_[std::size_t(what)];
        s.value = what;
        s.run = e.run;
        s.op = e.op;
        s.inputs = at(what).input_ids();
        if (at(what).kind() == node_kind::special) {
          s.special = &at(what).special();
          for (int k = 0; k < at(what).result_count(); ++k) step_of_[std::size_t(what + k)] = int(plan_->steps.size());
        }
        plan_->max_inputs = std::max(plan_->max_inputs, s.inputs.size());
        step_of_[std::size_t(what)] = int(plan_->steps.size());
      } else {
        int c = -1 - what;
        cluster_index_[std::size_t(c)] = int(plan_->clusters.size());
        s.cluster = int(plan_->clusters.size());
        plan_->clusters.emplace_back();
        for (int m : groups_[std::size_t(c)].members) step_of_[std::size_t(m)] = int(plan_->steps.size());
      }
      plan_->steps.push_back(std::move(s));
    }
  }

  // The step that reads each value last (the end of the call for outputs), which
  // values a cluster must write to memory, and a home for every value.
  void place_values() {
    const int end = int(plan_->steps.size());
    const std::size_t n = g_.nodes().size();
    last_use_.assign(n, -1);
    materialized_.assign(n, false);
    for (int id : outline_.ops)
      for (int in : at(id).input_ids()) {
        last_use_[std::size_t(in)] = std::max(last_use_[std::size_t(in)], step_of_[std::size_t(id)]);
        int c = cluster_of_[std::size_t(in)];
        if (c >= 0 && c != cluster_of_[std::size_t(id)]) materialized_[std::size_t(in)] = true;
      }
    std::vector<bool> is_output(n, false);
    for (int out : outline_.outputs) {
      last_use_[std::size_t(out)] = end;
      materialized_[std::size_t(out)] = true;
      is_output[std::size_t(out)] = true;
    }

    // Values linked through ops that re-describe buffers (reshape) may share memory:
    // if one of them is an output, none of them may live in reused memory, and the
    // memory of one lives as long as any of them is read.
    std::vector<int> root(n);
    std::iota(root.begin(), root.end(), 0);
    auto find = [&](int v) {
      while (root[std::size_t(v)] != v) v = root[std::size_t(v)] = root[std::size_t(root[std::size_t(v)])];
      return v;
    };
    for (int id : outline_.ops)
      if (entries_[std::size_t(id)].evaluates)
        for (int in : at(id).input_ids()) root[std::size_t(find(in))] = find(id);
    std::vector<bool> escapes(n, false);
    std::vector<int> family_last_use(n, -1);
    for (int id : outline_.ops) {
      int r = find(id);
      // A special op may keep what it reads (a variable keeps what is assigned to it).
      escapes[std::size_t(r)] = escapes[std::size_t(r)] || is_output[std::size_t(id)] || at(id).kind() == node_kind::special;
      family_last_use[std::size_t(r)] = std::max(family_last_use[std::size_t(r)], last_use_[std::size_t(id)]);
    }

    for (int id : outline_.ops) {
      value_info& v = value(id);
      bool in_memory = cluster_of_[std::size_t(id)] < 0 || materialized_[std::size_t(id)];
      if (!in_memory)
        v.home = value_home::unused;
      else if (entries_[std::size_t(id)].evaluates)
        v.home = value_home::evaluated;
      else if (v.type == string || escapes[std::size_t(find(id))])
        v.home = value_home::fresh;
      else
        v.home = value_home::slot;
      if (v.home == value_home::fresh || v.home == value_home::evaluated) plan_->fresh.push_back(id);
      if (v.home == value_home::slot) plan_->bound.push_back(id);
    }

    // Fresh values are dropped after their last reader; outputs at the end of the call.
    for (int id : plan_->fresh)
      if (last_use_[std::size_t(id)] >= 0 && last_use_[std::size_t(id)] < end)
        plan_->steps[std::size_t(last_use_[std::size_t(id)])].release.push_back(id);
    for (plan_step& s : plan_->steps)
      if (s.cluster < 0) s.allocate = value(s.value).home == value_home::fresh;

    // Slots: a value takes a free slot of its dtype when its step runs and gives it
    // back after the last read of its family, so no step writes where it reads.
    struct live_slot {
      int index;
      int until;
    };
    std::array<std::vector<live_slot>, dtype_count> busy;
    std::array<std::vector<int>, dtype_count> idle;
    std::vector<std::vector<int>> defined(plan_->steps.size());
    for (int id : plan_->bound) defined[std::size_t(step_of_[std::size_t(id)])].push_back(id);
    for (std::size_t k = 0; k < plan_->steps.size(); ++k) {
      for (int id : defined[k]) {
        value_info& v = value(id);
        const int t = int(v.type);
        auto& sizes = plan_->slot_elements[std::size_t(t)];
        auto& free = idle[std::size_t(t)];
        const std::int64_t need = std::max<std::int64_t>(v.dims.num_elements(), 1);
        // The smallest idle slot that fits, else the largest (which then grows).
        auto best = free.end();
        for (auto it = free.begin(); it != free.end(); ++it)
          if (sizes[std::size_t(*it)] >= need && (best == free.end() || sizes[std::size_t(*it)] < sizes[std::size_t(*best)]))
            best = it;
        if (best == free.end())
          best = std::max_element(free.begin(), free.end(),
                                  [&](int a, int b) { return sizes[std::size_t(a)] < sizes[std::size_t(b)]; });
        if (best == free.end()) {
          v.index = int(sizes.size());
          sizes.push_back(need);
        } else {
          v.index = *best;
          free.erase(best);
          sizes[std::size_t(v.index)] = std::max(sizes[std::size_t(v.index)], need);
        }
        int until = std::max(family_last_use[std::size_t(find(id))], int(k));
        busy[std::size_t(t)].push_back({v.index, until});
      }
      for (int t = 0; t < dtype_count; ++t) {
        auto& live = busy[std::size_t(t)];
        for (std::size_t i = 0; i < live.size();) {
          if (live[i].until <= int(k)) {
            idle[std::size_t(t)].push_back(live[i].index);
            live[i] = live.back();
            live.pop_back();
          } else {
            ++i;
          }
        }
      }
    }
  }

  // Scalar arithmetic of a cluster folded into the passes of its other ops
  // (folded_arithmetic): by node, whether it was folded, and for an op that runs, the
  // value its pass reads instead of its input (pre), the value it defines (the last
  // of its post arithmetic) and the folded arithmetic, with node ids for entries.
  struct folds {
    std::vector<bool> folded;
    std::vector<int> input, result, count;
    std::vector<folded_arithmetic> arithmetic;
  };

  enum class arithmetic { none, add, subtract, multiply };

  // Which arithmetic node `id` is, if it may be folded into an op of dtype `t`.
  arithmetic arithmetic_of(int id, dtype t) const {
    if (value(id).type != t || !entries_[std::size_t(id)].compound) return arithmetic::none;
    for (int in : at(id).input_ids())
      if (value(in).type != t) return arithmetic::none;
    const ops::any_op& op = at(id).operation();
    if (std::holds_alternative<ops::add>(op)) return arithmetic::add;
    if (std::holds_alternative<ops::subtract>(op)) return arithmetic::subtract;
    if (std::holds_alternative<ops::multiply>(op)) return arithmetic::multiply;
    return arithmetic::none;
  }

  // Folds scalar arithmetic around the ops of a cluster whose members are `members`.
  // A node folds when its value is read once, by the op it folds into (or is
  // produced by it), and never reaches memory. Before a unary op: a product and a
  // sum with one-element operands. After any op: a product, then a sum, with
  // one-element operands, or after a unary op also with cluster-shaped operands
  // computed before it, since the folded pass runs at the op's place.
  folds fold_arithmetic(const std::vector<int>& members, auto inside) const {
    const std::size_t n = g_.nodes().size();
    folds f{std::vector<bool>(n, false), std::vector<int>(n, -1), std::vector<int>(n, -1), std::vector<int>(n, 0),
            std::vector<folded_arithmetic>(n)};
    if (!can_fold_arithmetic) return f;
    std::vector<int> reads(n, 0), reader(n, -1), place(n, -1);
    for (std::size_t k = 0; k < members.size(); ++k) {
      place[std::size_t(members[k])] = int(k);
      for (int in : at(members[k]).input_ids()) {
        ++reads[std::size_t(in)];
        reader[std::size_t(in)] = members[k];
      }
    }
    auto read_once = [&](int v) { return inside(v) && !materialized_[std::size_t(v)] && reads[std::size_t(v)] == 1; };
    auto one_element = [&](int v) { return !inside(v) && value(v).dims.num_elements() == 1; };

    // Pre: the sum, then the product, that make a unary op's input.
    for (int u : members) {
      if (!entries_[std::size_t(u)].compound || at(u).input_ids().size() != 1) continue;
      const dtype t = value(u).type;
      folded_arithmetic& a = f.arithmetic[std::size_t(u)];
      int x = at(u).input_ids()[0];
      for (bool shift_open = true; read_once(x) && !f.folded[std::size_t(x)];) {
        const arithmetic kind = arithmetic_of(x, t);
        if (kind == arithmetic::none || (kind != arithmetic::multiply && !shift_open)) break;
        const auto& in = at(x).input_ids();  // two operands: add, subtract and multiply are binary
        const int s = one_element(in[1]) ? 1 : one_element(in[0]) ? 0 : -1;
        if (s < 0) break;
        if (kind == arithmetic::multiply) {
          a.pre_scale.entry = in[std::size_t(s)];
        } else {
          a.pre_shift = {in[std::size_t(s)], false, kind == arithmetic::subtract && s == 1};
          a.pre_scale.negated = kind == arithmetic::subtract && s == 0;  // s - v is (-v) + s
          shift_open = false;
        }
        a.pre = true;
        f.folded[std::size_t(x)] = true;
        ++f.count[std::size_t(u)];
        x = in[std::size_t(1 - s)];
        if (kind == arithmetic::multiply) break;
      }
      if (a.pre) f.input[std::size_t(u)] = x;
    }

    // Post: the product, then the sum, that the op's result goes through.
    for (int h : members) {
      if (f.folded[std::size_t(h)] || !entries_[std::size_t(h)].compound) continue;
      const auto& hin = at(h).input_ids();
      const bool unary = hin.size() == 1;
      if (!unary && (hin.size() != 2 || (one_element(hin[0]) && one_element(hin[1])))) continue;
      const dtype t = value(h).type;
      folded_arithmetic& a = f.arithmetic[std::size_t(h)];
      int v = h;
      bool scaled = false, shifted = false;
      while (read_once(v) && !shifted) {
        const int r = reader[std::size_t(v)];
        const arithmetic kind = arithmetic_of(r, t);
        if (kind == arithmetic::none || f.folded[std::size_t(r)] || (kind == arithmetic::multiply && scaled)) break;
        const auto& in = at(r).input_ids();
        const int k = in[0] == v ? 1 : 0;  // the other operand
        const int o = in[std::size_t(k)];
        const bool contiguous = !one_element(o);
        if (contiguous && (!unary || (inside(o) && place[std::size_t(o)] >= place[std::size_t(h)]))) break;
        if (kind == arithmetic::multiply) {
          a.scale = {o, contiguous, a.scale.negated};
          scaled = true;
        } else {
          a.shift = {o, contiguous, kind == arithmetic::subtract && k == 1};
          if (kind == arithmetic::subtract && k == 0) a.scale.negated = !a.scale.negated;  // o - v is (-v) + o
          shifted = true;
        }
        f.folded[std::size_t(r)] = true;
        ++f.count[std::size_t(h)];
        place[std::size_t(r)] = place[std::size_t(h)];
        v = r;
      }
      if (v != h) f.result[std::size_t(h)] = v;
    }
    return f;
  }

  void lower_cluster(const group& gr) {
    fused_cluster& c = plan_->clusters[std::size_t(cluster_index_[std::size_t(&gr - groups_.data())])];
    c.nodes = gr.members;
    c.dims = gr.dims;
    c.size = gr.dims.num_elements();
    const std::vector<int>& members = gr.members;
    const int cluster_id = cluster_of_[std::size_t(members[0])];
    auto inside = [&](int v) { return cluster_of_[std::size_t(v)] == cluster_id; };
    const folds f = fold_arithmetic(members, inside);

    // The ops that run, each with the values it reads and the value it defines.
    struct lowered {
      int op;
      int result;
      std::vector<int> reads;  // the op's operands, then its fold operands
    };
    std::vector<lowered> code;
    for (int id : members) {
      if (f.folded[std::size_t(id)]) continue;
      lowered l{id, f.result[std::size_t(id)] >= 0 ? f.result[std::size_t(id)] : id, {}};
      if (f.input[std::size_t(id)] >= 0)
        l.reads.push_back(f.input[std::size_t(id)]);
      else
        for (int in : at(id).input_ids()) l.reads.push_back(in);
      const folded_arithmetic& a = f.arithmetic[std::size_t(id)];
      for (const fold_operand* o : {&a.pre_scale, &a.pre_shift, &a.scale, &a.shift})
        if (o->entry >= 0) l.reads.push_back(o->entry);
      code.push_back(std::move(l));
    }

    // Last instruction (within the cluster) that reads each scratch value.
    std::vector<int> last_read(g_.nodes().size(), -1);
    for (std::size_t k = 0; k < code.size(); ++k)
      for (int in : code[k].reads) last_read[std::size_t(in)] = int(k);

    // Scratch buffers first (their number is known only after allocating them), so
    // entries are assigned in two passes: scratch indices now, memory operands after.
    std::vector<int> scratch_of(g_.nodes().size(), -1);
    std::vector<int> free_scratch;
    int scratch = 0;
    for (std::size_t k = 0; k < code.size(); ++k) {
      const int id = code[k].result;
      if (!materialized_[std::size_t(id)]) {
        if (free_scratch.empty()) {
          scratch_of[std::size_t(id)] = scratch++;
        } else {
          scratch_of[std::size_t(id)] = free_scratch.back();
          free_scratch.pop_back();
        }
      }
      for (int in : code[k].reads)
        if (inside(in) && scratch_of[std::size_t(in)] >= 0 && last_read[std::size_t(in)] == int(k) &&
            std::find(free_scratch.begin(), free_scratch.end(), scratch_of[std::size_t(in)]) == free_scratch.end())
          free_scratch.push_back(scratch_of[std::size_t(in)]);
    }

    // Operands outside the cluster: streamed in place, broadcast, or gathered.
    std::vector<int> externals;
    for (const lowered& l : code)
      for (int in : l.reads)
        if (!inside(in) && std::find(externals.begin(), externals.end(), in) == externals.end()) externals.push_back(in);
    std::vector<int> gathered_values;
    for (int in : externals) {
      std::int64_t count = value(in).dims.num_elements();
      if (count != c.size && count != 1) gathered_values.push_back(in);
    }
    c.buffers = scratch + int(gathered_values.size());

    std::vector<int> entry_of_value(g_.nodes().size(), -1);
    for (std::size_t i = 0; i < gathered_values.size(); ++i) {
      int in = gathered_values[i];
      entry_of_value[std::size_t(in)] = scratch + int(i);
      c.gathered.push_back({in, scratch + int(i), broadcast_read(value(in).type, value(in).dims, c.dims)});
    }
    int next = c.buffers;
    for (int in : externals) {
      if (entry_of_value[std::size_t(in)] >= 0) continue;
      entry_of_value[std::size_t(in)] = next;
      cluster_operand op{in, next++, size_of(value(in).type)};
      (value(in).dims.num_elements() == c.size ? c.streamed : c.broadcast).push_back(op);
    }
    for (const lowered& l : code) {
      const int id = l.result;
      if (scratch_of[std::size_t(id)] >= 0) {
        entry_of_value[std::size_t(id)] = scratch_of[std::size_t(id)];
      } else {
        entry_of_value[std::size_t(id)] = next;
        c.streamed.push_back({id, next++, size_of(value(id).type), true});
        if (value(id).home == value_home::fresh) c.allocated.push_back(id);
      }
    }
    c.table_size = next;
    plan_->max_table = std::max(plan_->max_table, c.table_size);

    for (const lowered& l : code) {
      const op_entry& e = entries_[std::size_t(l.op)];
      instruction ins;
      ins.fn = e.tile;
      ins.op = e.op;
      ins.arity = int(at(l.op).input_ids().size());
      ins.out = entry_of_value[std::size_t(l.result)];
      ins.type = value(l.result).type;
      ins.native_name = e.native_name;
      for (int k = 0; k < ins.arity; ++k) {
        int in = l.reads[std::size_t(k)];
        ins.in[std::size_t(k)] = entry_of_value[std::size_t(in)];
        bool one_value = !inside(in) && value(in).dims.num_elements() == 1 && c.size != 1;
        if (!one_value) ins.contig |= 1u << k;
      }
      const folded_arithmetic& a = f.arithmetic[std::size_t(l.op)];
      ins.folded_ops = f.count[std::size_t(l.op)];
      if (a.pre || l.result != l.op) {
        ins.compound = e.compound;
        ins.fold = a;
        for (fold_operand* o : {&ins.fold.pre_scale, &ins.fold.pre_shift, &ins.fold.scale, &ins.fold.shift})
          if (o->entry >= 0) o->entry = entry_of_value[std::size_t(o->entry)];
      }
      c.code.push_back(ins);
    }
    set_tile(c, c.single_pass() ? single_pass_max_tile : interpreted_max_tile);
    for (int id : members) {
      const op_entry& e = entries_[std::size_t(id)];
      if (e.check) {
        c.checks.push_back({e.check, e.op, at(id).input_ids()});
        plan_->max_inputs = std::max(plan_->max_inputs, at(id).input_ids().size());
      }
    }
  }

  const graph& g_;
  const graph_outline& outline_;
  std::span<const tensor> args_;
  execution_plan* plan_ = nullptr;
  std::vector<op_entry> entries_;
  std::vector<int> cluster_of_;
  std::vector<group> groups_;
  std::vector<int> step_of_;
  std::vector<int> cluster_index_;
  std::vector<int> last_use_;
  std::vector<bool> materialized_;
};

}  // namespace kiln::detail::exec

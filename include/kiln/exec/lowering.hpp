#pragma once
/// \file
/// The planner's lowering stage: a cluster's nodes become a tile program, the
/// instructions of the ops that run (with arithmetic folded into them) over a table
/// of tile buffers and operands in memory.

#include <algorithm>
#include <array>
#include <span>
#include <utility>
#include <vector>

#include "kiln/exec/fold.hpp"
#include "kiln/exec/fusion.hpp"
#include "kiln/exec/memory_plan.hpp"
#include "kiln/exec/plan.hpp"

namespace kiln::detail::exec {

/// An op of a cluster that runs, with the values it reads (its operands, then its
/// fold operands) and the value it defines (the last of its folded arithmetic).
struct lowered_op {
  int op;
  int result;
  /// Its operands (a fused op has at most 3, as instruction::in) and fold operands (4
  /// at most), inline: a cluster of 10^5 ops allocated a vector for each.
  std::array<int, 7> read{};
  int read_count = 0;
  KILN_LIBRARY_INLINE std::span<const int> reads() const;
  KILN_LIBRARY_INLINE void add_read(int value);
};

/// Lowering, the planner's stage that makes tile programs: a class template on
/// nothing, as the planner's other stages, compiled where a plan is built.
template <class Unused = void>
struct basic_lowering {
  /// The ops of a cluster that run once its arithmetic is folded, in order.
  static std::vector<lowered_op> ops_that_run(const graph& g, const std::vector<int>& members, const folds& f);
  /// Tile buffers for a cluster's results that stay out of memory, and how many.
  static std::pair<local_map<int>, int> scratch_buffers(const std::vector<lowered_op>& code,
                                                        const node_map<bool>& in_memory, auto inside,
                                                        const local_ids& local);
  /// The tile program of one cluster.
  static fused_cluster lower_cluster(const graph& g, const node_map<op_entry>& entries, const clustering& clusters,
                                     int cluster, const node_map<value_info>& values, const memory_plan& memory,
                                     local_ids& local);
};
using lowering = basic_lowering<>;

/// The ops of cluster `members` that run once `f`'s arithmetic is folded, in order.
#if KILN_DEFINE_LIBRARY
template <class Unused>
std::vector<lowered_op> basic_lowering<Unused>::ops_that_run(const graph& g, const std::vector<int>& members,
                                                           const folds& f) {
  std::vector<lowered_op> code;
  code.reserve(members.size());
  for (int id : members) {
    if (f.folded[id]) continue;
    lowered_op& l = code.emplace_back();
    l.op = id;
    l.result = f.result[id] >= 0 ? f.result[id] : id;
    if (f.input[id] >= 0)
      l.add_read(f.input[id]);
    else
      for (int in : g.node_at(id).input_ids()) l.add_read(in);
    const folded_arithmetic& a = f.arithmetic[id];
    for (const fold_operand* o : {&a.pre_scale, &a.pre_shift, &a.scale, &a.shift})
      if (o->entry >= 0) l.add_read(o->entry);
  }
  return code;
}
#endif

/// Tile buffers for the results of `code` that stay out of memory, each reused once
/// its last reader in the cluster has run: a node's buffer (-1 for none), and how
/// many there are.
#if KILN_DEFINE_LIBRARY
template <class Unused>
std::pair<local_map<int>, int> basic_lowering<Unused>::scratch_buffers(const std::vector<lowered_op>& code,
                                                                       const node_map<bool>& in_memory, auto inside,
                                                                       const local_ids& local) {
  local_map<int> last_read(local, -1);
  for (std::size_t k = 0; k < code.size(); ++k)
    for (int in : code[k].reads()) last_read[in] = int(k);
  local_map<int> scratch_of(local, -1);
  std::vector<int> free_scratch;
  int count = 0;
  for (std::size_t k = 0; k < code.size(); ++k) {
    const int id = code[k].result;
    if (!in_memory[id]) {
      if (free_scratch.empty()) {
        scratch_of[id] = count++;
      } else {
        scratch_of[id] = free_scratch.back();
        free_scratch.pop_back();
      }
    }
    for (int in : code[k].reads())
      if (inside(in) && scratch_of[in] >= 0 && last_read[in] == int(k) &&
          std::find(free_scratch.begin(), free_scratch.end(), scratch_of[in]) == free_scratch.end())
        free_scratch.push_back(scratch_of[in]);
  }
  return {std::move(scratch_of), count};
}
#endif

/// The tile program of cluster `cluster` of `clusters`, whose values have their homes.
/// Its pointer table holds the scratch buffers, then gathered operands, then the
/// operands in memory (streamed, broadcast, and the results written). `local` is the
/// plan's local_ids, empty (it is cleared again on return).
#if KILN_DEFINE_LIBRARY
template <class Unused>
fused_cluster basic_lowering<Unused>::lower_cluster(const graph& g, const node_map<op_entry>& entries,
                                                    const clustering& clusters, int cluster,
                                                    const node_map<value_info>& values, const memory_plan& memory,
                                                    local_ids& local) {
  const std::vector<int>& members = clusters.members[std::size_t(cluster)];
  for (int id : members) {
    local.add(id);
    for (int in : g.node_at(id).input_ids()) local.add(in);
  }
  struct clear_on_return {
    local_ids& ids;
    ~clear_on_return() { ids.clear(); }
  } cleared{local};
  auto inside = [&](int v) { return clusters.cluster_of[v] == cluster; };
  fused_cluster c;
  c.nodes = members;
  c.dims = values[members[0]].dims;
  c.size = c.dims.num_elements();
  const folds f = fold_arithmetic(g, members, values, entries, memory.in_memory, inside, local);
  const std::vector<lowered_op> code = ops_that_run(g, members, f);
  const auto [scratch_of, scratch] = scratch_buffers(code, memory.in_memory, inside, local);

  // Operands outside the cluster: streamed in place, broadcast, or gathered.
  std::vector<int> externals;
  local_map<bool> external(local, false);
  for (const lowered_op& l : code)
    for (int in : l.reads())
      if (!inside(in) && !external[in]) {
        external[in] = true;
        externals.push_back(in);
      }
  std::vector<int> gathered_values;
  for (int in : externals) {
    const std::int64_t count = values[in].dims.num_elements();
    if (count != c.size && count != 1) gathered_values.push_back(in);
  }
  c.buffers = scratch + int(gathered_values.size());

  local_map<int> entry_of_value(local, -1);
  for (std::size_t i = 0; i < gathered_values.size(); ++i) {
    const int in = gathered_values[i];
    entry_of_value[in] = scratch + int(i);
    c.gathered.push_back({in, scratch + int(i), broadcast_read(values[in].type, values[in].dims, c.dims)});
  }
  int next = c.buffers;
  for (int in : externals) {
    if (entry_of_value[in] >= 0) continue;
    entry_of_value[in] = next;
    const cluster_operand op{in, next++, size_of(values[in].type)};
    (values[in].dims.num_elements() == c.size ? c.streamed : c.broadcast).push_back(op);
  }
  for (const lowered_op& l : code) {
    const int id = l.result;
    if (scratch_of[id] >= 0) {
      entry_of_value[id] = scratch_of[id];
    } else {
      entry_of_value[id] = next;
      c.streamed.push_back({id, next++, size_of(values[id].type), true});
      if (values[id].home == value_home::fresh) c.allocated.push_back(id);
    }
  }
  c.table_size = next;

  c.code.reserve(code.size());
  for (const lowered_op& l : code) {
    const op_entry& e = entries[l.op];
    instruction ins;
    ins.fn = e.tile;
    ins.op = e.op;
    ins.arity = int(g.node_at(l.op).input_ids().size());
    ins.out = entry_of_value[l.result];
    ins.type = values[l.result].type;
    ins.native_name = e.native_name;
    for (int k = 0; k < ins.arity; ++k) {
      const int in = l.read[std::size_t(k)];
      ins.in[std::size_t(k)] = entry_of_value[in];
      const bool one_value = !inside(in) && values[in].dims.num_elements() == 1 && c.size != 1;
      if (!one_value) ins.contig |= 1u << k;
    }
    const folded_arithmetic& a = f.arithmetic[l.op];
    ins.folded_ops = f.count[l.op];
    if (a.pre || l.result != l.op) {
      ins.compound = e.compound;
      ins.fold = a;
      for (fold_operand* o : {&ins.fold.pre_scale, &ins.fold.pre_shift, &ins.fold.scale, &ins.fold.shift})
        if (o->entry >= 0) o->entry = entry_of_value[o->entry];
    }
    c.code.push_back(ins);
  }
  set_tile(c, c.single_pass() ? single_pass_max_tile : interpreted_max_tile);
  for (int id : members)
    if (const op_entry& e = entries[id]; e.check) {
      const std::span<const int> in = g.node_at(id).input_ids();
      c.checks.push_back({e.check, e.op, {in.begin(), in.end()}, id});
    }
  return c;
}
#endif

}  // namespace kiln::detail::exec

#if KILN_DEFINE_LIBRARY
namespace kiln::detail::exec {

KILN_LIBRARY_INLINE std::span<const int> lowered_op::reads() const { return {read.data(), std::size_t(read_count)}; }

KILN_LIBRARY_INLINE void lowered_op::add_read(int value) {
  if (read_count == int(read.size())) throw internal_error("a fused op reads more than 7 values");
  read[std::size_t(read_count++)] = value;
}

}  // namespace kiln::detail::exec
#endif  // KILN_DEFINE_LIBRARY

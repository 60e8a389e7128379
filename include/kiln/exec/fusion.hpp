#pragma once
/// \file
/// The planner's fusion and scheduling stages.
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
#include <utility>
#include <vector>

#include "kiln/exec/infer_values.hpp"
#include "kiln/exec/plan.hpp"

namespace kiln::detail::exec {

/// Elementwise nodes grouped into clusters that run as one step each.
struct clustering {
  std::vector<std::vector<int>> members;  ///< per cluster, its nodes in graph order
  node_map<int> cluster_of;               ///< a node's cluster, -1 for none
};

/// The steps of a plan in order, and the step that defines each value.
struct schedule {
  std::vector<plan_step> steps;
  node_map<int> step_of;  ///< -1 for values no step defines
};

/// Fusion and scheduling, the planner's middle stages: a class template on nothing,
/// as the planner's other stages, compiled where a plan is built.
template <class Unused = void>
struct basic_fusion {
  /// The clusters of the needed nodes of `g`.
  static clustering form_clusters(const graph& g, const graph_outline& outline, const typed_nodes& typed);
  /// The steps of the plan in order.
  static schedule schedule_steps(const graph& g, const graph_outline& outline, const typed_nodes& typed,
                                 const clustering& clusters);
};
using fusion = basic_fusion<>;

/// The clusters of the needed nodes of `g` (see the file comment).
/// For example `x * 2 + 1` on one shape is one cluster of two nodes.
#if KILN_DEFINE_LIBRARY
template <class Unused>
clustering basic_fusion<Unused>::form_clusters(const graph& g, const graph_outline& outline, const typed_nodes& typed) {
  struct group {
    std::vector<int> members;
    bool open = true;
  };
  std::vector<group> groups;
  node_map<int> cluster_of(g.nodes().size(), -1);
  auto close_reader_of = [&](int input) {
    if (cluster_of[input] >= 0) groups[std::size_t(cluster_of[input])].open = false;
  };
  auto dims_of = [&](const group& gr) -> const shape& { return typed.values[gr.members[0]].dims; };
  std::vector<int> joined;
  for (int id : outline.ops) {
    const node& n = g.node_at(id);
    const op_entry& e = typed.entries[id];
    if (!e.tile) {
      for (int in : n.input_ids()) close_reader_of(in);
      continue;
    }
    // A checked op takes all its inputs from outside its cluster (see the file comment).
    joined.clear();
    for (int in : n.input_ids()) {
      const int c = cluster_of[in];
      if (c < 0) continue;
      group& gr = groups[std::size_t(c)];
      if (gr.open && !e.check && dims_of(gr) == typed.values[id].dims) {
        if (std::find(joined.begin(), joined.end(), c) == joined.end()) joined.push_back(c);
      } else {
        gr.open = false;
      }
    }
    int target;
    if (joined.empty()) {
      target = int(groups.size());
      groups.emplace_back();
    } else {
      target = joined[0];
      for (std::size_t k = 1; k < joined.size(); ++k) {
        group& from = groups[std::size_t(joined[k])];
        for (int m : from.members) cluster_of[m] = target;
        auto& to = groups[std::size_t(target)].members;
        to.insert(to.end(), from.members.begin(), from.members.end());
        from.members.clear();
      }
    }
    groups[std::size_t(target)].members.push_back(id);
    cluster_of[id] = target;
  }

  // Number the groups that were not merged into others.
  clustering result{{}, std::move(cluster_of)};
  std::vector<int> number(groups.size(), -1);
  for (std::size_t c = 0; c < groups.size(); ++c) {
    if (groups[c].members.empty()) continue;
    number[c] = int(result.members.size());
    std::sort(groups[c].members.begin(), groups[c].members.end());
    result.members.push_back(std::move(groups[c].members));
  }
  for (int id : outline.ops)
    if (result.cluster_of[id] >= 0) result.cluster_of[id] = number[std::size_t(result.cluster_of[id])];
  return result;
}
#endif


/// Ops run at their own place in graph order, a cluster at the place of its last node.
/// Cluster steps are numbered as `clusters` numbers them.
#if KILN_DEFINE_LIBRARY
template <class Unused>
schedule basic_fusion<Unused>::schedule_steps(const graph& g, const graph_outline& outline, const typed_nodes& typed,
                                              const clustering& clusters) {
  struct placed {
    int place;             // the node whose place in graph order the step takes
    int op = -1;           // the op node, or -1 for a cluster
    int cluster = -1;
    bool operator<(const placed& o) const { return place < o.place; }
  };
  std::vector<placed> order;
  for (int id : outline.ops)
    if (clusters.cluster_of[id] < 0 && g.node_at(id).kind() != node_kind::result) order.push_back({id, id, -1});
  for (std::size_t c = 0; c < clusters.members.size(); ++c) order.push_back({clusters.members[c].back(), -1, int(c)});
  std::sort(order.begin(), order.end());

  schedule s{{}, node_map<int>(g.nodes().size(), -1)};
  for (const placed& p : order) {
    const int step = int(s.steps.size());
    if (p.op < 0) {
      for (int m : clusters.members[std::size_t(p.cluster)]) s.step_of[m] = step;
      s.steps.push_back({cluster_step{p.cluster}, {}});
    } else if (g.node_at(p.op).kind() == node_kind::special) {
      // Its results are the nodes after it; one with none still defines its own node.
      for (int k = 0; k < std::max(g.node_at(p.op).result_count(), 1); ++k) s.step_of[p.op + k] = step;
      const std::span<const int> in = g.node_at(p.op).input_ids();
      s.steps.push_back({special_step{p.op, {in.begin(), in.end()}}, {}});
    } else {
      const op_entry& e = typed.entries[p.op];
      s.step_of[p.op] = step;
      const std::span<const int> in = g.node_at(p.op).input_ids();
      s.steps.push_back({op_step{p.op, e.run, e.op, false, {in.begin(), in.end()}}, {}});
    }
  }
  return s;
}
#endif

}  // namespace kiln::detail::exec

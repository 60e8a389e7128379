#pragma once
/// \file
/// `node_map<T>`: one value per node of a graph, indexed by node id. Graphs number
/// their nodes with `int`; planning code reads `cluster_of[id]` instead of
/// converting every id into a vector index.

#include <cstddef>
#include <utility>
#include <vector>

namespace kiln::detail::exec {

/// One `T` per node of a graph, indexed by node id.
/// For example `node_map<int> cluster_of(g.nodes().size(), -1); cluster_of[id] = 0;`.
template <class T>
class node_map {
 public:
  node_map() = default;
  explicit node_map(std::size_t nodes, const T& value = T()) : items_(nodes, value) {}
  /// The map holding `items`, one per node.
  explicit node_map(std::vector<T> items) : items_(std::move(items)) {}

  decltype(auto) operator[](int id) { return items_[std::size_t(id)]; }
  decltype(auto) operator[](int id) const { return items_[std::size_t(id)]; }
  /// The number of nodes.
  int size() const { return int(items_.size()); }

 private:
  std::vector<T> items_;
};

/// The nodes one cluster touches (its members and their inputs), numbered from 0, so
/// that the planner's maps for one cluster are as large as the cluster: a map the size
/// of the graph per cluster made planning a graph of many small clusters quadratic.
/// One per plan, cleared after each cluster.
/// For example `local_ids ids(g.nodes().size()); ids.add(7); local_map<int> m(ids, -1); m[7] = 0; ids.clear();`.
class local_ids {
 public:
  explicit local_ids(std::size_t nodes) : slot_(nodes, -1) {}
  local_ids(const local_ids&) = delete;
  local_ids& operator=(const local_ids&) = delete;

  /// Numbers node `id`, once.
  void add(int id) {
    if (slot_[id] >= 0) return;
    slot_[id] = int(ids_.size());
    ids_.push_back(id);
  }
  /// Forgets the nodes numbered, in the time of their count.
  void clear() {
    for (int id : ids_) slot_[id] = -1;
    ids_.clear();
  }
  /// The number of node `id` (which must have been added).
  std::size_t operator[](int id) const { return std::size_t(slot_[id]); }
  std::size_t size() const { return ids_.size(); }

 private:
  node_map<int> slot_;
  std::vector<int> ids_;
};

/// One `T` per node of a local_ids, indexed by node id: a node_map for one cluster.
template <class T>
class local_map {
 public:
  explicit local_map(const local_ids& ids, const T& value = T()) : ids_(&ids), items_(ids.size(), value) {}

  decltype(auto) operator[](int id) { return items_[(*ids_)[id]]; }
  decltype(auto) operator[](int id) const { return items_[(*ids_)[id]]; }

 private:
  const local_ids* ids_;
  std::vector<T> items_;
};

}  // namespace kiln::detail::exec

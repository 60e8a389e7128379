#pragma once
/// \file
/// `node_map<T>`: one value per node of a graph, indexed by node id. Graphs number
/// their nodes with `int`; planning code reads `cluster_of[id]` instead of
/// converting every id into a vector index.

#include <cstddef>
#include <vector>

namespace kiln::detail::exec {

/// One `T` per node of a graph, indexed by node id.
/// For example `node_map<int> cluster_of(g.nodes().size(), -1); cluster_of[id] = 0;`.
template <class T>
class node_map {
 public:
  node_map() = default;
  explicit node_map(std::size_t nodes, const T& value = T()) : items_(nodes, value) {}

  decltype(auto) operator[](int id) { return items_[std::size_t(id)]; }
  decltype(auto) operator[](int id) const { return items_[std::size_t(id)]; }
  /// The number of nodes.
  int size() const { return int(items_.size()); }

 private:
  std::vector<T> items_;
};

}  // namespace kiln::detail::exec

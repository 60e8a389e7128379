#pragma once
// Helpers shared by the kiln::function tests: graph listings in the seeds' format and
// a scope that runs functions eagerly and always switches that off again.

#include "../support/op_check.hpp"

#include <string>
#include <vector>

namespace kiln::testing {

/// The values of an int32 tensor.
inline std::vector<std::int32_t> ints(const kiln::tensor& t) { return t.to_vector<std::int32_t>(); }

/// One line per node, `['a', 'a'] -> add`, as the seeds print `graph.as_graph_def().node`.
inline std::vector<std::string> graph_listing(const kiln::graph& g) {
  std::vector<std::string> lines;
  for (const kiln::node& n : g.nodes()) {
    std::string line = "[";
    for (std::size_t i = 0; i < n.inputs().size(); ++i) line += (i ? ", '" : "'") + n.inputs()[i] + "'";
    lines.push_back(line + "] -> " + n.name());
  }
  return lines;
}

/// The `op()` of every node, in execution order.
inline std::vector<std::string> graph_ops(const kiln::graph& g) {
  std::vector<std::string> ops;
  for (const kiln::node& n : g.nodes()) ops.emplace_back(n.op());
  return ops;
}

/// How many nodes of `g` have op `op`.
inline int count_ops(const kiln::graph& g, std::string_view op) {
  int count = 0;
  for (const kiln::node& n : g.nodes()) count += n.op() == op;
  return count;
}

/// While alive, every kiln::function runs its callable eagerly; the destructor turns
/// that off even when a failed REQUIRE unwinds the test, so later tests trace again.
class functions_run_eagerly_scope {
 public:
  functions_run_eagerly_scope() { kiln::config::run_functions_eagerly(true); }
  ~functions_run_eagerly_scope() { kiln::config::run_functions_eagerly(false); }
  functions_run_eagerly_scope(const functions_run_eagerly_scope&) = delete;
  functions_run_eagerly_scope& operator=(const functions_run_eagerly_scope&) = delete;
};

}  // namespace kiln::testing

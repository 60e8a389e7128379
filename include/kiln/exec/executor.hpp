#pragma once
/// \file
/// Runs a graph on concrete tensors. The schedule is fixed once per graph: only the
/// nodes that an output needs run (non-strict execution), in graph order, and each
/// intermediate value is released right after its last use so its buffer is reused.

#include <span>
#include <variant>
#include <vector>

#include "kiln/core/small_vector.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/graph/graph.hpp"

namespace kiln::detail {

class graph_executor {
 public:
  explicit graph_executor(const graph& g) : graph_(&g) {
    const auto& nodes = g.nodes();
    std::vector<bool> needed(nodes.size(), false);
    for (int out : g.outputs()) needed[std::size_t(out)] = true;
    for (std::size_t i = nodes.size(); i-- > 0;)
      if (needed[i])
        for (int in : nodes[i].input_ids()) needed[std::size_t(in)] = true;
    std::vector<int> last_use(nodes.size(), -1);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (!needed[i] || nodes[i].kind() != node_kind::op) continue;
      step s{int(i), {}};
      for (int in : nodes[i].input_ids()) last_use[std::size_t(in)] = int(steps_.size());
      steps_.push_back(s);
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (needed[i] && nodes[i].kind() == node_kind::constant) constants_.push_back(int(i));
      // Arguments, constants and outputs' sources stay alive for the whole run.
      bool pinned = nodes[i].kind() != node_kind::op;
      for (int out : g.outputs()) pinned = pinned || nodes[std::size_t(out)].input_ids()[0] == int(i);
      if (!pinned && last_use[i] >= 0) steps_[std::size_t(last_use[i])].release.push_back(int(i));
    }
  }

  /// Runs the graph on `args` (one eager tensor per placeholder) and returns the outputs.
  std::vector<tensor> run(std::span<const tensor> args) const {
    const graph& g = *graph_;
    std::vector<tensor> values(g.nodes().size());
    for (std::size_t i = 0; i < args.size(); ++i) values[std::size_t(g.arguments()[i])] = args[i];
    for (int c : constants_) values[std::size_t(c)] = g.nodes()[std::size_t(c)].value();
    for (const step& s : steps_) {
      const node& n = g.nodes()[std::size_t(s.node)];
      small_vector<const tensor*, 4> inputs;
      inputs.reserve(n.input_ids().size());
      for (int in : n.input_ids()) inputs.emplace_back(&values[std::size_t(in)]);
      values[std::size_t(s.node)] = std::visit([&](const auto& op) { return execute(op, inputs); }, n.operation());
      for (int r : s.release) values[std::size_t(r)] = tensor();
    }
    std::vector<tensor> outputs;
    outputs.reserve(g.outputs().size());
    for (int out : g.outputs()) outputs.push_back(values[std::size_t(g.nodes()[std::size_t(out)].input_ids()[0])]);
    return outputs;
  }

 private:
  struct step {
    int node;
    std::vector<int> release;  // values whose last reader is this step
  };
  const graph* graph_;
  std::vector<step> steps_;
  std::vector<int> constants_;
};

}  // namespace kiln::detail

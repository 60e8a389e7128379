#pragma once
/// \file
/// The planner: builds the execution_plan of a graph for one set of arguments by
/// passing data through its stages, each a class template on nothing in a file of its own
/// (compiled where a plan is built: the executor's, in the library of a compiled kiln):
///
///     infer_values ─▶ form_clusters ─▶ schedule_steps ─▶ plan_memory ─▶ lower_cluster
///     (value_inference, (fusion,        (fusion)          (memory_planner, (lowering,
///      infer_values.hpp) fusion.hpp)                       memory_plan.hpp) lowering.hpp)

#include <algorithm>
#include <memory>
#include <span>
#include <variant>

#include "kiln/exec/fusion.hpp"
#include "kiln/exec/infer_values.hpp"
#include "kiln/exec/lowering.hpp"
#include "kiln/exec/memory_plan.hpp"
#include "kiln/exec/plan.hpp"

namespace kiln::detail::exec {

/// The planner's stages in order (a class template on nothing, as each stage).
template <class Unused = void>
struct basic_planner {
  /// The plan of graph `g` (outlined by `outline`) for `args`.
  /// For example `planner::build_plan(g, graph_outline(g), args)->steps.size()`.
  static std::unique_ptr<execution_plan> build_plan(const graph& g, const graph_outline& outline,
                                                    std::span<const tensor> args);
};
using planner = basic_planner<>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
std::unique_ptr<execution_plan> basic_planner<Unused>::build_plan(const graph& g, const graph_outline& outline,
                                                                  std::span<const tensor> args) {
  using inference = basic_value_inference<Unused>;
  using stages = basic_fusion<Unused>;
  auto p = std::make_unique<execution_plan>();
  for (const tensor& a : args) p->key.push_back({a.dtype(), a.device(), a.shape()});
  p->outputs = outline.outputs;
  uninferred why{};
  std::optional<typed_nodes> typed = inference::infer_values(g, outline, args, &why);
  if (!typed) {
    p->interpreted = true;
    // No shape of the arguments would give a plan (a write past the end of a growing
    // tensor_array): one interpreted plan serves them all, found at once each call.
    if (why == uninferred::value_dependent)
      for (argument_key& k : p->key) k.any_dims = true;
    p->moved_constants = inference::moved_constants(g, outline, args);
    return p;
  }
  for (std::size_t i = 0; i < args.size(); ++i) p->key[i].any_dims = typed->any_dims[i] != 0;
  const clustering clusters = stages::form_clusters(g, outline, *typed);
  schedule s = stages::schedule_steps(g, outline, *typed, clusters);
  p->values = std::move(typed->values);
  memory_plan memory = basic_memory_planner<Unused>::plan_memory(g, outline, typed->entries, clusters, s, p->values);

  p->steps = std::move(s.steps);
  for (std::size_t k = 0; k < p->steps.size(); ++k) {
    plan_step& step = p->steps[k];
    step.release = std::move(memory.release[k]);
    if (auto* op = std::get_if<op_step>(&step.action)) {
      op->allocate = p->values[op->value].home == value_home::fresh;
      p->max_inputs = std::max(p->max_inputs, op->inputs.size());
      // An op that can take its first input's buffer, when no later step reads it: an
      // argument, or a value made during the call (whether it has the buffer to itself
      // is seen when it runs, tensor::sole_owner).
      if (const op_entry& e = typed->entries[op->value]; e.in_place && !op->inputs.empty()) {
        const int x = op->inputs[0];
        const value_home home = p->values[x].home;
        if (memory.last_use[x] == int(k) && (home == value_home::argument || home == value_home::fresh ||
                                             home == value_home::evaluated)) {
          op->in_place = e.in_place;
          const auto& arguments = g.arguments();
          if (auto at = std::find(arguments.begin(), arguments.end(), x); at != arguments.end())
            op->argument = int(at - arguments.begin());
        }
      }
    } else if (auto* special = std::get_if<special_step>(&step.action)) {
      p->max_inputs = std::max(p->max_inputs, special->inputs.size());
    }
  }
  local_ids local(g.nodes().size());
  for (std::size_t c = 0; c < clusters.members.size(); ++c) {
    fused_cluster& cluster =
        p->clusters.emplace_back(basic_lowering<Unused>::lower_cluster(g, typed->entries, clusters, int(c), p->values,
                                                                      memory, local));
    p->max_table = std::max(p->max_table, cluster.table_size);
    for (const cluster_check& k : cluster.checks) p->max_inputs = std::max(p->max_inputs, k.inputs.size());
  }
  p->fresh = std::move(memory.fresh);
  p->bound = std::move(memory.bound);
  p->slot_elements = std::move(memory.slot_elements);
  return p;
}
#endif

}  // namespace kiln::detail::exec

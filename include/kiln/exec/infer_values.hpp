#pragma once
/// \file
/// The planner's first stage: the concrete dtype and dims of every node the outputs
/// need, for one set of arguments, by the ops' own rules, and each op's entry points.

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "kiln/exec/plan.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail::exec {

/// Every needed node's value (dtype and dims; arguments and constants also get their
/// home) and the entry points of its op.
struct typed_nodes {
  node_map<value_info> values;
  node_map<op_entry> entries;
  /// Per argument: whether the values hold for any dims of its rank (nothing reads it
  /// but ops that write it in place and make their own results, whose dims then stay
  /// unknown: a growing tensor_array's pad_rows and set_item).
  std::vector<char> any_dims;
};

/// Why value inference gives no typed nodes, so that the plan interprets.
enum class uninferred {
  off_cpu,          ///< an argument or constant is not on the CPU
  rule_failed,      ///< an op's rule rejects these dtypes or shapes (the run raises its error)
  value_dependent,  ///< some node's shape depends on values, whatever the arguments' shapes
};

/// Value inference, the planner's first stage: a class template on nothing, as the
/// planner's other stages, compiled where a plan is built.
template <class Unused = void>
struct basic_value_inference {
  /// The typed nodes of a graph for `args`, or nothing when the plan must interpret
  /// (then `why`, when given, says why).
  static std::optional<typed_nodes> infer_values(const graph& g, const graph_outline& outline,
                                                 std::span<const tensor> args, uninferred* why = nullptr);
  /// The typed nodes for `args`, the dims of those `any_dims` marks left unknown.
  static std::optional<typed_nodes> infer_with(const graph& g, const graph_outline& outline, std::span<const tensor> args,
                                               std::vector<char> any_dims, uninferred* why);
  /// For a plan that interprets arguments on one GPU: the needed CPU constants, copied there.
  static std::vector<std::pair<int, tensor>> moved_constants(const graph& g, const graph_outline& outline,
                                                             std::span<const tensor> args);
};
using value_inference = basic_value_inference<>;

/// The typed nodes of graph `g` for `args`, or nothing when the plan must interpret:
/// a tensor off the CPU, a rule that fails for these shapes, or a shape the rules
/// leave partly unknown (one that depends on values) read by an op that needs it.
/// Arguments read by nothing but ops that write them in place and make their own
/// results (a growing tensor_array's pad_rows and set_item) are tried first with
/// unknown dims, so that one plan serves every length of an array a loop grows.
/// For example `if (auto typed = value_inference::infer_values(g, outline, args)) fusion::form_clusters(g, outline, *typed);`.
#if KILN_DEFINE_LIBRARY
template <class Unused>
std::optional<typed_nodes> basic_value_inference<Unused>::infer_values(const graph& g, const graph_outline& outline,
                                                                       std::span<const tensor> args, uninferred* why) {
  const auto& arguments = g.arguments();
  if (arguments.size() != args.size()) {
    if (why) *why = uninferred::rule_failed;
    return std::nullopt;
  }
  std::vector<char> any_dims(args.size(), 0);
  for (std::size_t i = 0; i < args.size(); ++i) any_dims[i] = args[i].shape().rank() > 0;
  for (int id : outline.ops) {
    const node& n = g.node_at(id);
    for (int in : n.input_ids()) {
      if (g.node_at(in).kind() != node_kind::placeholder) continue;
      const auto at = std::find(arguments.begin(), arguments.end(), in);
      if (at == arguments.end()) continue;
      // Ops that write their first input in place (pad_rows, set_item) make their own
      // results; what else reads the argument may need its dims.
      if (n.kind() != node_kind::op || !in_place_of(n.operation())) any_dims[std::size_t(at - arguments.begin())] = 0;
    }
  }
  if (std::find(any_dims.begin(), any_dims.end(), char(1)) != any_dims.end())
    if (std::optional<typed_nodes> t = infer_with(g, outline, args, any_dims, why)) return t;
  return infer_with(g, outline, args, std::vector<char>(args.size(), 0), why);
}

template <class Unused>
std::optional<typed_nodes> basic_value_inference<Unused>::infer_with(const graph& g, const graph_outline& outline,
                                                                     std::span<const tensor> args,
                                                                     std::vector<char> any_dims, uninferred* why) {
  auto uninferable = [why](uninferred reason) {
    if (why) *why = reason;
    return std::nullopt;
  };
  const std::size_t n = g.nodes().size();
  typed_nodes t{node_map<value_info>(n), node_map<op_entry>(n), std::move(any_dims)};
  const auto& arguments = g.arguments();
  bool loose = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].device() != device::cpu) return uninferable(uninferred::off_cpu);
    shape dims = args[i].shape();
    if (t.any_dims[i]) {
      loose = true;
      for (int d = 0; d < dims.rank(); ++d) dims[d] = none;
    }
    t.values[arguments[i]] = {value_home::argument, args[i].dtype(), dims};
  }
  for (int i = 0; i < outline.needed.size(); ++i) {
    const node& c = g.node_at(i);
    if (!outline.needed[i] || c.kind() != node_kind::constant) continue;
    if (c.value().device() != device::cpu) return uninferable(uninferred::off_cpu);
    t.values[i] = {value_home::constant, c.value().dtype(), c.value().shape()};
  }
  // Arguments of the dtypes and shapes the placeholders were traced with: then each
  // op's result has the dtype and shape its trace inferred (fully defined, unless it
  // depends on values), and its rules need not run again.
  bool as_traced = !loose;
  for (std::size_t i = 0; i < args.size() && as_traced; ++i) {
    const node& p = g.node_at(arguments[i]);
    as_traced = p.dtype() == args[i].dtype() && p.shape().is_fully_defined() && p.shape() == args[i].shape();
  }
  std::vector<dtype> dtypes;
  std::vector<shape> shapes;
  for (int id : outline.ops) {
    const node& op_node = g.node_at(id);
    value_info& v = t.values[id];
    if (op_node.kind() != node_kind::op) {
      // A special op's results have the dtypes and shapes traced for them; it
      // makes its own tensors, which may be its inputs (evaluated, like reshape).
      if (!op_node.shape().is_fully_defined()) return uninferable(uninferred::value_dependent);
      v.type = op_node.dtype();
      v.dims = op_node.shape();
      t.entries[id].evaluates = true;
      continue;
    }
    dtypes.clear();
    bool known_inputs = true;
    for (int in : op_node.input_ids()) {
      dtypes.push_back(t.values[in].type);
      known_inputs = known_inputs && t.values[in].dims.is_fully_defined();
    }
    if (as_traced && op_node.shape().is_fully_defined()) {
      v.type = op_node.dtype();
      v.dims = op_node.shape();
    } else {
      shapes.clear();
      for (int in : op_node.input_ids()) shapes.push_back(t.values[in].dims);
      // Through the op's row rather than a visit of every op, so that a source file
      // compiles the rules of the ops it runs.
      const op_rules& rules = *kernels_of(op_node.operation()).rules.load(std::memory_order_acquire);
      const void* op = op_node.operation().address();
      const dtype_result dt = rules.result_dtype(op, dtypes);
      const shape_result sh = rules.result_shape(op, shapes);
      if (!dt.ok() || !sh.ok()) return uninferable(uninferred::rule_failed);
      v.type = dt.value;
      v.dims = sh.value;
    }
    const dtype in = dtypes.empty() ? v.type : dtypes[std::size_t(ops::value_operand_of(op_node.operation()))];
    bool text = v.type == string;
    for (dtype d : dtypes) text = text || d == string;
    t.entries[id] = entry_of(op_node.operation(), text ? string : in, v.type);
    // Dims that depend on values (or on an argument's, left unknown) reach only ops
    // that make their own results; any other needs them to plan its buffer or tiles.
    if ((!known_inputs || !v.dims.is_fully_defined()) && !t.entries[id].evaluates)
      return uninferable(uninferred::value_dependent);
  }
  return t;
}
#endif

/// For a plan that interprets arguments on one GPU: the graph's needed CPU constants,
/// copied there once (a trace records no device: `x + 1` on a GPU tensor traces a
/// CPU scalar 1).
#if KILN_DEFINE_LIBRARY
template <class Unused>
std::vector<std::pair<int, tensor>> basic_value_inference<Unused>::moved_constants(const graph& g,
                                                                                   const graph_outline& outline,
                                                                                   std::span<const tensor> args) {
  std::vector<std::pair<int, tensor>> moved;
  if (args.empty()) return moved;
  const device d = args[0].device();
  for (const tensor& a : args)
    if (a.device() != d) return moved;
  if (d == device::cpu) return moved;
  for (int i = 0; i < outline.needed.size(); ++i) {
    const node& c = g.node_at(i);
    if (outline.needed[i] && c.kind() == node_kind::constant && c.value().device() == device::cpu && c.value().dtype() != string)
      moved.emplace_back(i, c.value().to(d));
  }
  return moved;
}
#endif

}  // namespace kiln::detail::exec

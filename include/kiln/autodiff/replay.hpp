#pragma once
/// \file
/// Replaying a trace node by node, so that the gradient tapes recording see its ops:
/// how a kiln::function called while another is traced joins a tape of the outer
/// trace, how a function with effects runs under an eager tape (its writes and prints
/// happen once, in order, and its reads are the values of the moment), and how a
/// function's backward pass is traced (kiln/autodiff/function_gradient.hpp).

#include <span>
#include <vector>

#include "kiln/autodiff/tape.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/graph/special_gradients.hpp"
#include "kiln/ops/op_table.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln::detail {

/// The special ops that autodiff differentiates, as special_gradients() holds them: a
/// variable read is watched, and a `cond` or `while` node is recorded as kiln::cond and
/// kiln::while_loop record the nodes they make. (Cast by name: as<cond_op> would compile
/// the node's kernels in every program.)
template <class>
void register_autodiff_special_gradients() {
  static special_gradient read{"ReadVariableOp", [](const special_op& op, std::span<const tensor>,
                                                    std::span<const tensor> results) {
    tape_runtime::watch_on_active_tapes(static_cast<const read_variable_op&>(op).state().get(), results[0]);
  }};
  static special_gradient cond{"cond", [](const special_op& op, std::span<const tensor> inputs,
                                          std::span<const tensor> results) {
    const auto& c = static_cast<const cond_op&>(op);
    hooks().cond.load(std::memory_order_relaxed)(
        inputs[0], cond_branches{c.then_graph(), c.then_args(), c.else_graph(), c.else_args()}, inputs.subspan(1),
        results);
  }};
  static special_gradient loop{"while", [](const special_op& op, std::span<const tensor> inputs,
                                           std::span<const tensor> results) {
    hooks().loop.load(std::memory_order_relaxed)(static_cast<const while_op&>(op), inputs, results);
  }};
  for (special_gradient* entry : {&read, &cond, &loop}) register_special_gradient(*entry);
}

/// Hands special node `n` (its inputs and `count` results in `value`, the results from
/// `at`) to the tapes recording, as the op's entry of special_gradients() says; an op
/// without one has no gradient.
#if KILN_DEFINE_LIBRARY
template <class Unused>
void basic_tape_runtime<Unused>::record_special_on_tapes(const node& n, std::span<const tensor> value, std::size_t at,
                                                         std::size_t count) {
  static const bool registered = (register_autodiff_special_gradients<void>(), true);
  (void)registered;
  const special_op& op = n.special();
  const special_tape_recorder record = special_gradient_of(op.name());
  if (!record) return;
  std::vector<tensor> inputs;
  for (int id : n.input_ids()) inputs.push_back(value[std::size_t(id)]);
  record(op, inputs, value.subspan(at, count));
}
#endif

/// Runs graph `g` on `args` node by node and returns its outputs: into the trace in
/// progress when there is one, else eagerly. Ops run through the kernel table
/// (detail::run_registered), so the tapes recording there record them, and variable
/// reads are handed to those tapes as kiln::variable's own reads are. Special ops
/// (effects, control flow) are copied into the trace, or run, in program order.
#if KILN_DEFINE_LIBRARY
template <class Unused>
std::vector<tensor> basic_tape_runtime<Unused>::replay(const graph& g, std::span<const tensor> args) {
  trace_context* trace = trace_context::current();
  std::vector<tensor> value(g.nodes().size());
  for (std::size_t i = 0; i < g.arguments().size(); ++i) value[std::size_t(g.arguments()[i])] = args[i];
  std::vector<tensor> outputs;
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const node& n = g.nodes()[i];
    switch (n.kind()) {
      case node_kind::placeholder:
      case node_kind::result:  // set with its special node
        break;
      case node_kind::constant: value[i] = n.value(); break;
      case node_kind::identity: outputs.push_back(value[std::size_t(n.input_ids()[0])]); break;
      case node_kind::op: {
        std::vector<const tensor*> in;
        for (int id : n.input_ids()) in.push_back(&value[std::size_t(id)]);
        value[i] = run_registered(n.operation(), in);
        break;
      }
      case node_kind::special: {
        std::vector<tensor> results;
        if (trace) {
          std::vector<int> ins;
          for (int id : n.input_ids()) ins.push_back(trace->node_of(value[std::size_t(id)]));
          for (int id : trace->graph().add_special_like(g, int(i), ins))
            results.push_back(trace->symbolic(id));
        } else {
          std::vector<const tensor*> in;
          for (int id : n.input_ids()) in.push_back(&value[std::size_t(id)]);
          results.resize(std::size_t(n.result_count()));
          n.special().run(in, results);
        }
        for (std::size_t k = 0; k < results.size(); ++k) value[i + k] = std::move(results[k]);
        if (recording_tapes() > 0) record_special_on_tapes(n, value, i, results.size());
        break;
      }
    }
  }
  return outputs;
}
#endif

}  // namespace kiln::detail

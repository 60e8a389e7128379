#pragma once
/// \file
/// Replaying a trace into the trace in progress node by node, so that the gradient
/// tapes recording there see its ops: how a kiln::function called while another is
/// traced joins a tape of the outer trace, and how a function's backward pass is
/// traced (kiln/autodiff/function_gradient.hpp).

#include <span>
#include <vector>

#include "kiln/autodiff/tape.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/exec/kernel_table.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln::detail {

/// Adds graph `g`, its arguments bound to `args`, to the trace in progress and returns
/// its outputs. Ops run through the kernel table (detail::run_registered), so the
/// tapes of the trace record them, and variable reads are handed to those tapes as
/// kiln::variable's own reads are; special ops (effects, control flow) are copied.
template <class = void>
std::vector<tensor> replay(const graph& g, std::span<const tensor> args) {
  trace_context& trace = *trace_context::current();
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
        std::vector<int> ins;
        for (int id : n.input_ids()) ins.push_back(trace.node_of(value[std::size_t(id)]));
        const std::vector<int> ids = trace.graph().add_special_like(n, std::move(ins), std::span(g.nodes()).subspan(i + 1));
        for (std::size_t k = 0; k < ids.size(); ++k) value[i + k] = trace.symbolic(ids[k]);
        if (const auto* read = n.special().as<read_variable_op>(); read && recording_tapes() > 0)
          watch_on_active_tapes(read->state().get(), value[i]);
        break;
      }
    }
  }
  return outputs;
}

}  // namespace kiln::detail

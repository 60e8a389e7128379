#pragma once
/// \file
/// A kiln::function as a differentiable op. A call made while an eager gradient tape
/// records is recorded as one entry; its backward pass is a kiln::function of its own,
/// traced once per signature of the trace's inputs and output gradients and run as an
/// optimized graph: its body replays the forward trace under a tape and differentiates
/// the sum of each floating-point output times its gradient, which gives the inputs'
/// gradients and those of the variables the trace reads. (The forward values are
/// computed again in the backward graph rather than kept from the call.) A `cond` node
/// recorded under a tape in its trace is differentiated the same way, branch by branch.

#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "kiln/autodiff/replay.hpp"
#include "kiln/autodiff/tape.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/trace/control_flow.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/runtime_tier.hpp"

namespace kiln::detail {

/// Adds the floating-point variables graph `g` reads to `out`, each once, in order of
/// first read.
inline void add_variables_read(const graph& g, std::vector<std::tuple<const void*, dtype, shape>>& out) {
  for (const node& n : g.nodes()) {
    if (n.kind() != node_kind::special) continue;
    for (const auto& [name, branch] : n.special().subgraphs()) add_variables_read(*branch, out);  // cond, while
    const auto* read = n.special().as<read_variable_op>();
    if (!read || !is_floating(read->state()->type())) continue;
    const void* id = read->state().get();
    if (std::ranges::none_of(out, [&](const auto& v) { return std::get<0>(v) == id; }))
      out.emplace_back(id, read->state()->type(), read->state()->dims());
  }
}

/// The vector-Jacobian product of graph `g`, run on `args`: the gradients of the sum
/// of each floating-point output times its gradient in `output_grads`, with respect
/// to each of `sources` (tensors among `args`, or values they were made from), then
/// to each of `variables` (its reads in `g`); zeros where unconnected. It replays `g`
/// under a tape into the trace in progress: how backward passes are traced.
template <class>
std::vector<tensor> vector_jacobian_product(const graph& g, std::span<const tensor> args, const std::vector<tensor>& sources,
                                            std::span<const tensor> output_grads,
                                            const std::vector<std::tuple<const void*, dtype, shape>>& variables) {
  gradient_tape tape;
  for (const tensor& x : sources) tape.watch(x);
  tensor target;  // sum of output * its gradient, in float64 so that outputs of mixed dtypes add up
  std::size_t k = 0;
  for (const tensor& y : replay(g, args))
    if (is_floating(y.dtype())) target = sum_defined(target, kiln::cast(kiln::reduce_sum(y * output_grads[k++]), float64));
  std::vector<tensor> grads = tape.gradients_with_variables(target, sources, variables);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) continue;
    const bool input = i < sources.size();
    const dtype t = input ? sources[i].dtype() : std::get<1>(variables[i - sources.size()]);
    const shape& s = input ? sources[i].shape() : std::get<2>(variables[i - sources.size()]);
    require_fully_defined("gradient", s);
    grads[i] = zero_filled("gradient", s, t, kiln::device::cpu);
  }
  return grads;
}

/// The floating-point tensors of `values`.
inline std::vector<tensor> floating_only(std::span<const tensor> values) {
  std::vector<tensor> out;
  for (const tensor& x : values)
    if (is_floating(x.dtype())) out.push_back(x);
  return out;
}

/// The backward pass of one trace.
template <class>
struct call_backward {
  struct body {
    std::shared_ptr<const graph> forward;
    std::vector<std::tuple<const void*, dtype, shape>> variables;

    /// The gradients of the floating-point `inputs`, then of each variable read, given
    /// one gradient per floating-point output.
    std::vector<tensor> operator()(const std::vector<tensor>& inputs, const std::vector<tensor>& output_grads) const {
      return vector_jacobian_product(*forward, inputs, floating_only(inputs), output_grads, variables);
    }
  };
  mutable kiln::function<body> fn;  // a call traces on a new signature
};

/// Records a call of `c` on the tapes of this thread, describing `c`'s backward pass
/// on its first call under a tape.
template <class Lazy>
void record_function_call(const concrete_state& c, std::span<const tensor> inputs, std::span<const tensor> outputs) {
  using backward_t = call_backward<Lazy>;  // dependent, so that nothing here compiles before a tape is made
  std::call_once(c.backward_once, [&] {
    auto call = std::make_shared<differentiable_call>();
    add_variables_read(c.graph, call->variables);
    // The backward pass keeps a copy of the graph, so that it outlives the function.
    auto backward = std::make_shared<backward_t>(backward_t{kiln::function(
        typename backward_t::body{std::make_shared<const graph>(c.graph), call->variables},
        function_options{.name = c.name + "_grad"})});
    call->self = backward;
    call->backward = [](const void* self, std::span<const tensor> in, std::span<const tensor> dys) {
      return static_cast<const backward_t*>(self)->fn(std::vector<tensor>(in.begin(), in.end()),
                                                      std::vector<tensor>(dys.begin(), dys.end()));
    };
    c.backward = std::move(call);
  });
  record_call_on_active_tapes(c.backward, inputs, outputs);
}

/// A `cond` node recorded while a tape records in its trace: its backward pass is a
/// `cond` on the same predicate whose branches are the vector-Jacobian products of the
/// two branches, each with respect to every floating-point value the node captured
/// (zeros for those its branch does not read) and every variable the branches read.
struct cond_backward {
  tensor pred;
  cond_branches branches;
  std::vector<std::tuple<const void*, dtype, shape>> variables;
};

template <class Lazy>
void record_cond_on_tapes(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                          std::span<const tensor> outputs) {
  auto state = std::make_shared<cond_backward>(cond_backward{pred, std::move(branches), {}});
  add_variables_read(state->branches.then_graph, state->variables);
  add_variables_read(state->branches.else_graph, state->variables);
  auto call = std::make_shared<differentiable_call>();
  call->variables = state->variables;
  call->self = state;
  call->backward = [](const void* self, std::span<const tensor> captured, std::span<const tensor> dys) {
    const auto& c = *static_cast<const cond_backward*>(self);
    const std::vector<tensor> sources = floating_only(captured);
    auto branch = [&](const graph& g, const std::vector<int>& picks) {
      return [&] {
        std::vector<tensor> args;
        for (int k : picks) args.push_back(captured[std::size_t(k)]);
        return vector_jacobian_product<Lazy>(g, args, sources, dys, c.variables);
      };
    };
    return kiln::cond(c.pred, branch(c.branches.then_graph, c.branches.then_args),
                      branch(c.branches.else_graph, c.branches.else_args));
  };
  record_call_on_active_tapes(call, captures, outputs);
}

/// A `while` node recorded while a tape records in its trace. Its outputs depend on
/// what it reads, so a gradient that reaches them raises kiln::unavailable_error
/// rather than passing for unconnected: loops in graphs have no backward pass yet.
template <class>
void record_loop_on_tapes(std::span<const tensor> inputs, std::span<const tensor> outputs) {
  auto call = std::make_shared<differentiable_call>();
  call->backward = [](const void*, std::span<const tensor>, std::span<const tensor>) -> std::vector<tensor> {
    throw unavailable_error(
        "while_loop: no gradient through a loop in a graph yet (a while_loop or for_range traced in a "
        "kiln::function); differentiate the loop eagerly, where a tape records each iteration's ops");
  };
  record_call_on_active_tapes(call, inputs, outputs);
}

}  // namespace kiln::detail

#pragma once
/// \file
/// A kiln::function as a differentiable op. A call made while an eager gradient tape
/// records is recorded as one entry; its backward pass is a kiln::function of its own,
/// traced once per signature of the trace's inputs and output gradients and run as an
/// optimized graph: its body replays the forward trace under a tape and differentiates
/// the sum of each floating-point output times its gradient, which gives the inputs'
/// gradients and those of the variables the trace reads. (The forward values are
/// computed again in the backward graph rather than kept from the call.)

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
#include "kiln/trace/function.hpp"
#include "kiln/trace/runtime_tier.hpp"

namespace kiln::detail {

/// The floating-point variables graph `g` reads, each once, in order of first read.
inline std::vector<std::tuple<const void*, dtype, shape>> variables_read(const graph& g) {
  std::vector<std::tuple<const void*, dtype, shape>> out;
  for (const node& n : g.nodes()) {
    if (n.kind() != node_kind::special) continue;
    const auto* read = n.special().as<read_variable_op>();
    if (!read || !is_floating(read->state()->type())) continue;
    const void* id = read->state().get();
    if (std::ranges::none_of(out, [&](const auto& v) { return std::get<0>(v) == id; }))
      out.emplace_back(id, read->state()->type(), read->state()->dims());
  }
  return out;
}

/// The backward pass of one trace.
template <class>
struct call_backward {
  struct body {
    std::shared_ptr<const graph> forward;
    std::vector<std::tuple<const void*, dtype, shape>> variables;

    /// The gradients of the floating-point `inputs`, then of each variable read, given
    /// one gradient per floating-point output (zeros where unconnected).
    std::vector<tensor> operator()(const std::vector<tensor>& inputs, const std::vector<tensor>& output_grads) const {
      gradient_tape tape;
      std::vector<tensor> sources;
      for (const tensor& x : inputs)
        if (is_floating(x.dtype())) tape.watch(x), sources.push_back(x);
      tensor target;  // sum of output * its gradient, in float64 so that outputs of mixed dtypes add up
      std::size_t k = 0;
      for (const tensor& y : replay(*forward, inputs))
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
    call->variables = variables_read(c.graph);
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

}  // namespace kiln::detail

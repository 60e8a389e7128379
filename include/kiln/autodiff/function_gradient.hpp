#pragma once
/// \file
/// A kiln::function as a differentiable op. A call made while an eager gradient tape
/// records is recorded as one entry; its backward pass is a kiln::function of its own,
/// traced once per signature of the trace's inputs and output gradients and run as an
/// optimized graph: its body replays the forward trace under a tape and differentiates
/// the sum of each floating-point output times its gradient, which gives the inputs'
/// gradients and those of the variables the trace reads. (The forward values are
/// computed again in the backward graph rather than kept from the call.) A `cond` node
/// recorded under a tape in its trace is differentiated the same way, branch by branch,
/// and a `while` node by a loop that walks its iterations back.

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autodiff/replay.hpp"
#include "kiln/autodiff/tape.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/tensor_array.hpp"
#include "kiln/trace/control_flow.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/runtime_tier.hpp"

namespace kiln::detail {

/// Adds the floating-point variables graph `g` reads to `out`, each once, in order of
/// first read.
KILN_LIBRARY_INLINE void add_variables_read(const graph& g, std::vector<std::tuple<const void*, dtype, shape>>& out);

/// The vector-Jacobian product of graph `g`, run on `args`: the gradients of the sum
/// of each floating-point output times its gradient in `output_grads`, with respect
/// to each of `sources` (tensors among `args`, or values they were made from), then
/// to each of `variables` (its reads in `g`); zeros where unconnected, and `connected`,
/// if given, tells which were. It replays `g` under a tape into the trace in progress:
/// how backward passes are traced.
#if KILN_DEFINE_LIBRARY
template <class Unused>
std::vector<tensor> basic_tape_runtime<Unused>::vector_jacobian_product(
    const graph& g, std::span<const tensor> args, const std::vector<tensor>& sources,
    std::span<const tensor> output_grads, const std::vector<std::tuple<const void*, dtype, shape>>& variables,
    std::vector<bool>* connected) {
  gradient_tape tape;
  for (const tensor& x : sources) tape.watch(x);
  tensor target;  // sum of output * its gradient, in float64 so that outputs of mixed dtypes add up
  std::size_t k = 0;
  for (const tensor& y : replay(g, args))
    if (is_floating(y.dtype())) target = sum_defined(target, kiln::cast(kiln::reduce_sum(y * output_grads[k++]), float64));
  std::vector<tensor> grads = gradients_with_variables(tape, target, sources, variables);
  if (connected) {
    connected->clear();
    for (const tensor& grad : grads) connected->push_back(grad.defined());
  }
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) continue;
    if (i < sources.size()) {
      grads[i] = zeros_shaped_like(sources[i]);
    } else {
      const auto& [id, t, s] = variables[i - sources.size()];
      grads[i] = zero_filled("gradient", s, t, kiln::device::cpu);
    }
  }
  return grads;
}
#endif

/// The floating-point tensors of `values`.
KILN_LIBRARY_INLINE std::vector<tensor> floating_only(std::span<const tensor> values);

/// The backward pass of one trace.
template <class Lazy>
struct call_backward {
  struct body {
    std::shared_ptr<const graph> forward;
    std::vector<std::tuple<const void*, dtype, shape>> variables;
    // Which gradients the target reaches, as the trace of the backward pass found:
    // the others are given back undefined, as TensorFlow gives None for them.
    std::shared_ptr<std::vector<bool>> connected;

    /// The gradients of the floating-point `inputs`, then of each variable read, given
    /// one gradient per floating-point output.
    std::vector<tensor> operator()(const std::vector<tensor>& inputs, const std::vector<tensor>& output_grads) const {
      return basic_tape_runtime<Lazy>::vector_jacobian_product(*forward, inputs, floating_only(inputs), output_grads, variables, connected.get());
    }
  };
  mutable kiln::function<body> fn;  // a call traces on a new signature
  std::shared_ptr<std::vector<bool>> connected;

  /// The gradients of a call: undefined for the sources the target does not reach.
  std::vector<tensor> operator()(std::span<const tensor> in, std::span<const tensor> dys) const {
    std::vector<tensor> grads = fn(std::vector<tensor>(in.begin(), in.end()), std::vector<tensor>(dys.begin(), dys.end()));
    for (std::size_t i = 0; i < grads.size() && i < connected->size(); ++i)
      if (!(*connected)[i]) grads[i] = tensor();
    return grads;
  }
};

/// Records a call of `c` on the tapes of this thread, describing `c`'s backward pass
/// on its first call under a tape.
template <class Lazy>
void basic_tape_runtime<Lazy>::record_function_call(const concrete_state& c, std::span<const tensor> inputs, std::span<const tensor> outputs) {
  using backward_t = call_backward<Lazy>;  // dependent, so that nothing here compiles before a tape is made
  std::call_once(c.backward_once, [&] {
    auto call = std::make_shared<differentiable_call>();
    add_variables_read(c.graph, call->variables);
    // The backward pass keeps a copy of the graph, so that it outlives the function.
    auto connected = std::make_shared<std::vector<bool>>();
    auto backward = std::make_shared<backward_t>(backward_t{
        kiln::function(typename backward_t::body{std::make_shared<const graph>(c.graph), call->variables, connected},
                       function_options{.name = c.name + "_grad"}),
        connected});
    call->self = backward;
    call->backward = [](const void* self, std::span<const tensor> in, std::span<const tensor> dys) {
      return (*static_cast<const backward_t*>(self))(in, dys);
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
void basic_tape_runtime<Lazy>::record_cond_on_tapes(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                          std::span<const tensor> outputs) {
  auto state = std::make_shared<cond_backward>(cond_backward{pred, std::move(branches), {}});
  add_variables_read(state->branches.then_graph, state->variables);
  add_variables_read(state->branches.else_graph, state->variables);
  auto call = std::make_shared<differentiable_call>();
  call->variables = state->variables;
  call->self = state;
  // Its branches are traced here and the node recorded through the program's cond
  // recorder (detail::hooks().trace_cond), not through kiln::cond: a program that makes
  // tapes but traces no cond of its own compiles none of the cond machinery.
  call->backward = [](const void* self, std::span<const tensor> captured, std::span<const tensor> dys) {
    const auto& c = *static_cast<const cond_backward*>(self);
    const std::vector<tensor> sources = floating_only(captured);
    auto branch = [&](const graph& g, const std::vector<int>& picks) {
      return [&](std::span<const tensor>) {
        std::vector<tensor> args;
        for (int k : picks) args.push_back(captured[std::size_t(k)]);
        return vector_jacobian_product(g, args, sources, dys, c.variables);
      };
    };
    trace_context* trace = trace_context::current();
    if (!trace) {  // a node run eagerly (a call with effects under an eager tape)
      return truth_of(c.pred, "cond") ? branch(c.branches.then_graph, c.branches.then_args)({})
                                      : branch(c.branches.else_graph, c.branches.else_args)({});
    }
    const cond_tracer record = hooks().trace_cond.load(std::memory_order_relaxed);
    if (!record)  // a cond node comes from a traced cond, which sets the recorder
      throw internal_error("cond: the gradient of a cond node is traced where no cond was");
    traced_subgraph then_graph, else_graph;
    trace_subgraph(branch(c.branches.then_graph, c.branches.then_args), std::span<const tensor_spec>(), then_graph);
    trace_subgraph(branch(c.branches.else_graph, c.branches.else_args), std::span<const tensor_spec>(), else_graph);
    return record(*trace, c.pred, then_graph, else_graph);
  };
  record_call_on_active_tapes(call, captures, outputs);
}

/// A loop traced through the program's loop tracer (detail::hooks().trace_loop) on
/// `leaves`, whose first is a counter of kiln's own; `arrays` holds each leaf's
/// tensor_array, or null. `condition` and `body` take the leaves; `body` gives the next
/// ones (after the stop flag when `breaks`); `restart` takes the leaves the loop enters
/// with once a tensor_array first written in the body has settled its element shape.
/// Run eagerly where no trace is in progress. How the gradient of a `while` node
/// traces its loops without instantiating kiln::while_loop: a program that makes tapes
/// but traces no loop of its own compiles none of the loop machinery, and one that
/// traces loops but makes no tape compiles none of this.
template <class Condition, class Body, class Restart>
std::vector<tensor> trace_loop_on_leaves(const loop_options& options, std::vector<tensor> leaves,
                                         std::vector<const tensor_array*> arrays, bool breaks, Condition condition,
                                         Body body, Restart restart) {
  trace_context* trace = trace_context::current();
  if (!trace) {  // a node run eagerly (a call with effects under an eager tape): a C++ loop
    for (;;) {
      if (!truth_of(condition(leaves), "while_loop")) return leaves;
      std::vector<tensor> next = body(leaves);
      if (breaks) {
        if (truth_of(next.front(), "break_if")) return leaves;
        next.erase(next.begin());
      }
      leaves = std::move(next);
    }
  }
  struct calls_on_leaves : loop_calls {
    Condition& condition;
    Body& body;
    Restart& restart;
    calls_on_leaves(Condition& c, Body& b, Restart& r)
        : loop_calls{[](loop_calls& self, std::span<const tensor> l) { return of(self).condition(l); },
                     [](loop_calls& self, std::span<const tensor> l) { return of(self).body(l); },
                     [](loop_calls& self, std::span<const tensor> l) { of(self).restart(l); }},
          condition(c),
          body(b),
          restart(r) {}
    static calls_on_leaves& of(loop_calls& self) { return static_cast<calls_on_leaves&>(self); }
  } calls(condition, body, restart);
  const loop_tracer trace_loop = hooks().trace_loop.load(std::memory_order_relaxed);
  if (!trace_loop)  // a while node comes from a traced loop, which sets the tracer
    throw internal_error("while_loop: the gradient of a while node is traced where no loop was");
  std::vector<std::optional<shape>> invariants = loop_invariants(arrays, options, 1);
  std::vector<value_spec> specs = loop_specs(leaves, invariants, 1);
  return trace_loop(*trace, 1, options, std::move(leaves), std::move(arrays), std::move(specs), std::move(invariants),
                    breaks, calls);
}

/// A `while` node recorded while a tape records in its trace (TensorFlow's while_v2
/// gradient, with kiln's value-semantics tensor arrays as the accumulators): its
/// backward pass runs the loop again, stacking each iteration's loop variables in
/// tensor arrays and counting the iterations, then walks the iterations back in a
/// second loop, in which each step is the vector-Jacobian product of the body at the
/// stacked variables. That loop carries the gradients of the loop variables and sums
/// those of the body's captures and of the variables the body reads. The condition
/// gives a bool, so what only it captures gets zeros. A body that ends in break_if
/// stops the recomputed loop the same way. Only the variables a step reads are
/// stacked, as TensorFlow accumulates only the intermediates its gradient needs: a
/// step traced once on stand-ins shows which (none for a recurrence such as
/// `s * a + b`, whose gradient is a product of constants; then both loops are scalar
/// arithmetic, and run as scalar programs).
///
/// A loop variable whose shape changes from one iteration to the next (a shape
/// invariant, or a tensor_array with dynamic_size) cannot be stacked: a tensor array's
/// elements share one shape. The walk back then recomputes each iteration's variables
/// from the loop's initial ones, in a loop of its own with the original loop's shape
/// invariants: memory stays that of one iteration, time grows with the square of the
/// iteration count.
struct loop_backward {
  int vars = 0, cond_captures = 0;
  bool breaks = false;
  bool reshaped = false;  // some loop variable changes shape from one iteration to the next
  graph cond_graph, body_graph;
  std::vector<std::tuple<const void*, dtype, shape>> variables;

  template <class Lazy>
  std::vector<tensor> operator()(std::span<const tensor> inputs, std::span<const tensor> dys) const {
    const auto n = std::size_t(vars), body_start = n + std::size_t(cond_captures);
    const std::vector<tensor> initial(inputs.begin(), inputs.begin() + std::ptrdiff_t(n));
    const std::vector<tensor> cond_captured(inputs.begin() + std::ptrdiff_t(n), inputs.begin() + std::ptrdiff_t(body_start));
    const std::vector<tensor> captures(inputs.begin() + std::ptrdiff_t(body_start), inputs.end());
    auto with = [](std::vector<tensor> head, std::span<const tensor> tail) {
      head.insert(head.end(), tail.begin(), tail.end());
      return head;
    };
    // The shapes the body takes its loop variables in: the original loop's shape
    // invariants, which the recomputing loops keep when shapes change, and the walk
    // back for the gradients of the floating-point ones.
    loop_options relaxed, relaxed_gradients;
    if (reshaped) {
      for (std::size_t k = 0; k < n; ++k) {
        const shape& s = body_graph.node_at(body_graph.arguments()[k]).shape();
        relaxed.shape_invariants.emplace_back(s);
        if (is_floating(initial[k].dtype())) relaxed_gradients.shape_invariants.emplace_back(s);
      }
    }
    auto body_results = [&](std::span<const tensor> v) {
      return basic_tape_runtime<Lazy>::replay(body_graph, with(std::vector<tensor>(v.begin(), v.end()), captures));
    };
    auto never_restarts = [](std::span<const tensor>) {};
    // The forward loop again, counting its iterations and, when shapes stay, keeping
    // the loop variables of every iteration that went on: leaves [i, variables...,
    // stacks...]. A body that ends in break_if gives its condition first: the
    // iteration that breaks keeps the values it started with, so it is left out of the
    // walk back (its write to the stacks is dropped with the rest of its values).
    const std::vector<std::size_t> stacked = reshaped ? std::vector<std::size_t>() : read_by_steps<Lazy>(captures, dys);
    std::vector<tensor_array> stacks;
    for (std::size_t k : stacked)
      stacks.emplace_back(initial[k].dtype(), std::int64_t(0), tensor_array_options{.dynamic_size = true});
    std::vector<tensor> leaves = with({kiln::constant(std::int32_t(0))}, initial);
    std::vector<const tensor_array*> arrays(leaves.size(), nullptr);
    for (const tensor_array& s : stacks) {
      leaves.push_back(s.elements());
      arrays.push_back(&s);
    }
    const std::vector<tensor> recomputed = trace_loop_on_leaves(
        relaxed, std::move(leaves), std::move(arrays), breaks,
        [&](std::span<const tensor> l) {
          const std::span<const tensor> v = l.subspan(1, n);
          return basic_tape_runtime<Lazy>::replay(cond_graph, with(std::vector<tensor>(v.begin(), v.end()), cond_captured))[0];
        },
        [&](std::span<const tensor> l) {
          const tensor& i = l[0];
          const std::span<const tensor> v = l.subspan(1, n);
          std::vector<tensor> out = body_results(v);
          std::vector<tensor> next;
          if (breaks) {
            next.push_back(out.front());
            out.erase(out.begin());
          }
          next.push_back(i + 1);
          next.insert(next.end(), out.begin(), out.end());
          for (std::size_t k = 0; k < stacks.size(); ++k)
            next.push_back(stacks[k].with_elements(l[1 + n + k]).write(i, v[stacked[k]]).elements());
          return next;
        },
        [&](std::span<const tensor> l) {
          for (std::size_t k = 0; k < stacks.size(); ++k) stacks[k] = stacks[k].with_elements(l[1 + n + k]);
        });
    const tensor& count = recomputed[0];
    std::vector<tensor_array> states;
    for (std::size_t k = 0; k < stacks.size(); ++k) states.push_back(stacks[k].with_elements(recomputed[1 + n + k]));
    // The loop variables iteration `i` began with (the loop's initial values stand for
    // those its step does not read). Every iteration before the counted ones went on,
    // so the recomputing loop needs no condition but the count.
    auto state_at = [&](const tensor& i) {
      if (!reshaped) {
        std::vector<tensor> state = initial;
        for (std::size_t k = 0; k < states.size(); ++k) state[stacked[k]] = states[k].read(i);
        return state;
      }
      std::vector<tensor> out = trace_loop_on_leaves(
          relaxed, with({kiln::constant(std::int32_t(0))}, initial), std::vector<const tensor_array*>(n + 1), false,
          [&](std::span<const tensor> l) { return l[0] < i; },
          [&](std::span<const tensor> l) {
            std::vector<tensor> next = body_results(l.subspan(1));
            if (breaks) next.erase(next.begin());
            next.insert(next.begin(), l[0] + 1);
            return next;
          },
          never_restarts);
      out.erase(out.begin());
      return out;
    };
    // The iterations backwards: the gradient of each step's variables from the
    // next's. Leaves [j, gradients of the variables, of the captures, of the
    // variables read].
    std::vector<tensor> walk = {kiln::constant(std::int32_t(0))};
    walk.insert(walk.end(), dys.begin(), dys.end());
    const std::size_t captured_at = walk.size();
    for (const tensor& c : floating_only(captures)) walk.push_back(zeros_shaped_like(c));
    for (const auto& [id, t, s] : variables) walk.push_back(zero_filled("gradient", s, t, kiln::device::cpu));
    const std::size_t walk_leaves = walk.size();
    const std::vector<tensor> walked = trace_loop_on_leaves(
        relaxed_gradients, std::move(walk), std::vector<const tensor_array*>(walk_leaves), false,
        [&](std::span<const tensor> l) { return l[0] < count; },
        [&](std::span<const tensor> l) {
          const std::vector<tensor> args = with(state_at(count - 1 - l[0]), captures);
          const std::vector<tensor> g(l.begin() + 1, l.begin() + std::ptrdiff_t(captured_at));
          const std::vector<tensor> step = basic_tape_runtime<Lazy>::vector_jacobian_product(body_graph, args, floating_only(args), g, variables);
          std::vector<tensor> next{l[0] + 1};
          std::size_t k = 0;
          for (std::size_t m = 1; m < captured_at; ++m) next.push_back(step[k++]);
          for (std::size_t m = captured_at; m < l.size(); ++m) next.push_back(l[m] + step[k++]);
          return next;
        },
        never_restarts);
    // One gradient per floating-point input of the node, then per variable read.
    std::vector<tensor> out(walked.begin() + 1, walked.begin() + std::ptrdiff_t(captured_at));
    for (const tensor& c : cond_captured)
      if (is_floating(c.dtype())) out.push_back(zeros_shaped_like(c));
    out.insert(out.end(), walked.begin() + std::ptrdiff_t(captured_at), walked.end());
    return out;
  }

  // The loop variables (by index) that a step of the walk back reads: its
  // vector-Jacobian product traced into a scratch graph on placeholders for the
  // variables and the gradients, as the walk's body traces it. All of them outside a
  // trace, where a step runs as it goes.
  template <class Lazy>
  std::vector<std::size_t> read_by_steps(std::span<const tensor> captures, std::span<const tensor> dys) const {
    const auto n = std::size_t(vars);
    std::vector<std::size_t> read;
    if (!tracing()) {
      for (std::size_t k = 0; k < n; ++k) read.push_back(k);
      return read;
    }
    std::vector<tensor_spec> params;
    for (std::size_t k = 0; k < n; ++k) {
      const node& p = body_graph.node_at(body_graph.arguments()[k]);
      params.emplace_back(p.shape(), p.dtype(), "loop_var");
    }
    for (const tensor& dy : dys) params.emplace_back(dy.shape(), dy.dtype(), "gradient");
    traced_subgraph step;
    trace_subgraph(
        [&](std::span<const tensor> p) {
          std::vector<tensor> args(p.begin(), p.begin() + std::ptrdiff_t(n));
          args.insert(args.end(), captures.begin(), captures.end());
          return basic_tape_runtime<Lazy>::vector_jacobian_product(body_graph, args, floating_only(args), p.subspan(n),
                                                                   variables);
        },
        std::span<const tensor_spec>(params), step);
    const std::vector<char> needed = step.g.needed_nodes();
    for (std::size_t k = 0; k < n; ++k)
      if (needed[std::size_t(step.g.arguments()[k])]) read.push_back(k);
    return read;
  }
};

template <class Lazy>
void basic_tape_runtime<Lazy>::record_loop_on_tapes(const while_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs) {
  auto state = std::make_shared<loop_backward>(
      loop_backward{op.loop_variables(), op.cond_captures(), op.breaks(), false, op.cond_graph(), op.body_graph(), {}});
  for (std::size_t k = 0; k < outputs.size(); ++k) state->reshaped |= outputs[k].shape() != inputs[k].shape();
  add_variables_read(state->body_graph, state->variables);
  auto call = std::make_shared<differentiable_call>();
  call->variables = state->variables;
  call->self = state;
  call->backward = [](const void* self, std::span<const tensor> in, std::span<const tensor> dys) {
    return static_cast<const loop_backward*>(self)->template operator()<Lazy>(in, dys);
  };
  record_call_on_active_tapes(call, inputs, outputs);
}

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE void add_variables_read(const graph& g, std::vector<std::tuple<const void*, dtype, shape>>& out) {
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

KILN_LIBRARY_INLINE std::vector<tensor> floating_only(std::span<const tensor> values) {
  std::vector<tensor> out;
  for (const tensor& x : values)
    if (is_floating(x.dtype())) out.push_back(x);
  return out;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

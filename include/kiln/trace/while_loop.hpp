#pragma once
/// \file
/// kiln::while_loop: a C++ loop on eager tensors; while tracing, its condition and body
/// traced into a `while` node (detail::basic_control_flow_tracer::trace_while_loop), with
/// kiln's own counter in front for maximum_iterations. Part of kiln/trace/control_flow.hpp.

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/hooks.hpp"
#include "kiln/core/results.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/ops/control_flow.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/tensor_array.hpp"
#include "kiln/trace/loop_state.hpp"
#include "kiln/trace/outputs.hpp"
#include "kiln/trace/subgraph.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {
namespace detail {

/// Loop-counter arithmetic, `a op b`, through apply_bookkeeping: a program that
/// does not call the op itself compiles its kernels for integers and bools only.
/// For the ops most programs call anyway (`+`, `-`, `*`, `<`) the counters use the
/// plain op instead, whose kernels are then compiled once, not also in a bookkeeping
/// variant.
template <class Op>
tensor counter_op(const tensor& a, const tensor& b) {
  return apply_bookkeeping(Op{}, a, b);
}
template <class Op, std::integral S>
tensor counter_op(const tensor& a, S b) {
  return apply_bookkeeping(Op{}, a, make_scalar(a.dtype(), b, a.device()));
}

/// The typed part of a while loop, as the traced loop calls it: its condition and
/// body on the leaves of a state, and the state it enters with once a tensor_array
/// first written in the body has settled its element shape. Function pointers that
/// the typed loop's constructor sets, not virtual functions (see special_op).
struct loop_calls {
  tensor (*condition)(loop_calls& self, std::span<const tensor> leaves);
  /// The leaves of the next state, after the stop flag when the body ends in break_if.
  std::vector<tensor> (*body)(loop_calls& self, std::span<const tensor> leaves);
  void (*restart)(loop_calls& self, std::span<const tensor> leaves);
};

#if KILN_DEFINE_LIBRARY
template <class Unused>
std::vector<tensor> basic_control_flow_tracer<Unused>::trace_while_loop(
    trace_context& trace, std::size_t hidden, const loop_options& options, std::vector<tensor> leaves,
    std::vector<const tensor_array*> arrays, std::vector<value_spec> specs,
    std::vector<std::optional<shape>> invariants, bool breaks, loop_calls& calls) {
  hooks().trace_loop.store(&trace_while_loop, std::memory_order_relaxed);
  // maximum_iterations: a counter of kiln's own in front of the loop variables, and
  // the condition `counter < maximum && cond`.
  const std::size_t counted = options.maximum_iterations ? 1 : 0;
  tensor limit;
  if (counted) {
    limit = kiln::constant(*options.maximum_iterations);
    leaves.insert(leaves.begin(), kiln::constant(std::int64_t(0)));
    arrays.insert(arrays.begin(), nullptr);
    specs.insert(specs.begin(), value_spec{int64, shape{}});
    invariants.insert(invariants.begin(), std::nullopt);
    ++hidden;
  }
  auto user_leaves = [&](std::span<const tensor> p) { return p.subspan(counted); };
  traced_subgraph cond_graph, body_graph;
  auto trace_loop = [&] {
    cond_graph = {};
    body_graph = {};
    trace_subgraph(
        [&](std::span<const tensor> p) {
          if (!counted) return calls.condition(calls, p);
          const tensor below = p[0] < limit;
          return counter_op<ops::logical_and>(below, calls.condition(calls, user_leaves(p)));
        },
        leaves, specs, cond_graph);
    if (cond_graph.outputs[0] != value_spec{bool_, shape{}})
      throw value_error("while_loop: the condition must give a bool scalar, got " + spec_text(cond_graph.outputs[0]));
    trace_subgraph(
        [&](std::span<const tensor> p) {
          std::vector<tensor> next = calls.body(calls, user_leaves(p));
          if (counted) next.insert(next.begin() + (breaks ? 1 : 0), p[0] + std::int64_t(1));
          return next;
        },
        leaves, specs, body_graph);
    std::span<const value_spec> next_specs(body_graph.outputs);
    if (breaks) {
      if (body_graph.outputs[0] != value_spec{bool_, shape{}})
        throw value_error("break_if: the condition must be a bool scalar, got " + spec_text(body_graph.outputs[0]));
      next_specs = next_specs.subspan(1);
    }
    return next_specs;
  };
  std::span<const value_spec> next_specs = trace_loop();
  // A tensor_array first written in the body enters the loop holding zeros of the
  // shape that write gave it; the body is traced again for that input.
  if (const std::vector<std::size_t> settled = settle_arrays(arrays, specs, next_specs); !settled.empty()) {
    for (std::size_t k : settled)
      leaves[k] = arrays[k]->holding_zeros(shape(specs[k].second.dims().subspan(1)), leaves[k].device()).elements();
    calls.restart(calls, user_leaves(leaves));  // the arrays above belonged to the state it replaces
    next_specs = trace_loop();
  }
  check_loop_specs(next_specs, specs, invariants, hidden);

  std::vector<tensor> inputs = leaves;
  inputs.insert(inputs.end(), cond_graph.captures.begin(), cond_graph.captures.end());
  inputs.insert(inputs.end(), body_graph.captures.begin(), body_graph.captures.end());
  auto op = std::make_shared<while_op>(int(leaves.size()), std::move(cond_graph.g), int(cond_graph.captures.size()),
                                       std::move(body_graph.g), breaks);
  const while_op& node = *op;  // the graph keeps it
  std::vector<tensor> out = trace.record_special(std::move(op), inputs, specs);
  if (tapes_recording()) hooks().loop.load(std::memory_order_relaxed)(node, inputs, out);
  out.erase(out.begin(), out.begin() + std::ptrdiff_t(counted));
  return out;
}
#endif

/// kiln::while_loop, whose first `hidden` loop variables are kiln's own: eager, a C++
/// loop; traced, trace_while_loop on the leaves of the state.
template <class Cond, class Body, class... Vars>
auto while_loop(std::size_t hidden, const loop_options& options, Cond cond_fn, Body body_fn, const Vars&... vars) {
  if (options.maximum_iterations && *options.maximum_iterations < 0)
    throw value_error("while_loop: maximum_iterations must be >= 0, got " +
                      std::to_string(*options.maximum_iterations));
  using state = std::tuple<output_t<Vars>...>;
  state initial{as_output(vars)...};
  const std::vector<tensor> initial_leaves = leaves_of(initial);
  const std::vector<const tensor_array*> arrays = array_leaves(initial);
  const std::vector<std::optional<shape>> invariants = loop_invariants(arrays, options, hidden);
  std::vector<value_spec> specs = loop_specs(initial_leaves, invariants, hidden);
  using R = std::invoke_result_t<Body&, const output_t<Vars>&...>;
  constexpr bool breaks = is_break_result<std::remove_cvref_t<R>>::value;

  trace_context* trace = trace_context::current();
  if (!trace) {
    state current = std::move(initial);
    for (std::int64_t n = 0;; ++n) {
      // The condition runs at the last iteration too, as `n < maximum && cond` does.
      const bool go = truth_of(std::apply(cond_fn, current), "while_loop");
      if (!go || (options.maximum_iterations && n >= *options.maximum_iterations)) break;
      auto r = std::apply(body_fn, current);
      if constexpr (breaks) {
        if (truth_of(r.stop, "break_if")) break;
        current = next_state(current, leaves_of(r.next), specs, invariants, hidden);
      } else {
        current = next_state(current, leaves_of(r), specs, invariants, hidden);
      }
    }
    return loop_result(std::move(current));
  }
  struct typed_calls : loop_calls {
    Cond& cond_fn;
    Body& body_fn;
    state& initial;
    typed_calls(Cond& c, Body& b, state& s)
        : loop_calls{[](loop_calls& self, std::span<const tensor> leaves) {
                       auto& t = static_cast<typed_calls&>(self);
                       return tensor(std::apply(t.cond_fn, t.at(leaves)));
                     },
                     [](loop_calls& self, std::span<const tensor> leaves) {
                       auto& t = static_cast<typed_calls&>(self);
                       auto r = std::apply(t.body_fn, t.at(leaves));
                       if constexpr (is_break_result<decltype(r)>::value) {
                         std::vector<tensor> out = leaves_of(r.stop);
                         for_each_output(r.next, [&](const tensor& x) { out.push_back(x); });
                         return out;
                       } else {
                         return leaves_of(r);
                       }
                     },
                     [](loop_calls& self, std::span<const tensor> leaves) {
                       auto& t = static_cast<typed_calls&>(self);
                       t.initial = t.at(leaves);
                     }},
          cond_fn(c),
          body_fn(b),
          initial(s) {}
    state at(std::span<const tensor> leaves) const {
      const tensor* next = leaves.data();
      return rebuild_output(initial, next);
    }
  } calls(cond_fn, body_fn, initial);
  const std::vector<tensor> out = control_flow_tracer::trace_while_loop(*trace, hidden, options, initial_leaves, arrays,
                                                                        std::move(specs), invariants, breaks, calls);
  return loop_result(calls.at(out));
}

}  // namespace detail

/// kiln::while_loop with `options`: shape invariants let loop variables change shape.
/// \code
/// // Halves x's length until one element is left: the sum of its elements.
/// kiln::tensor sum = kiln::while_loop(
///     [](const kiln::tensor& x) { return kiln::shape_of(x)[0] > 1; },
///     [](const kiln::tensor& x) { return kiln::reduce_sum(kiln::reshape(x, {-1, 2}), 1); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none}}}, kiln::constant({1, 2, 3, 4}));  // [10]
/// \endcode
template <class Cond, class Body, class... Vars>
auto while_loop(Cond cond_fn, Body body_fn, const loop_options& options, const Vars&... vars) {
  static_assert(sizeof...(Vars) > 0, "kiln::while_loop: give at least one loop variable");
  return detail::while_loop(std::size_t(0), options, std::move(cond_fn), std::move(body_fn), vars...);
}

/// Runs `body_fn` while `cond_fn` holds: `cond_fn(vars...)` gives a bool scalar,
/// `body_fn(vars...)` the next values (one value, a std::tuple for several, or
/// kiln::break_if). Returns the final values in the same form. While tracing, the
/// condition and body are traced once into a `while` node; a loop variable whose
/// dtype or shape changes raises kiln::value_error naming it and both specs (a shape
/// may change where kiln::loop_options gives it a shape invariant).
/// \code
/// auto [i, total] = kiln::while_loop([](auto i, auto) { return i < 10; },
///                                    [](auto i, auto t) { return std::tuple{i + 1, t + i}; },
///                                    kiln::constant(0), kiln::constant(0));  // 10, 45
/// \endcode
template <class Cond, class Body, class... Vars>
  requires detail::plain_loop_variables<Vars...>
auto while_loop(Cond cond_fn, Body body_fn, const Vars&... vars) {
  return while_loop(std::move(cond_fn), std::move(body_fn), loop_options{}, vars...);
}

}  // namespace kiln

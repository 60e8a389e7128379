#pragma once
/// \file
/// kiln::cond: a C++ `if` on eager tensors; while tracing, both branches traced into a
/// `cond` node (detail::basic_control_flow_tracer::record_cond). Part of
/// kiln/trace/control_flow.hpp.

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/hooks.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/trace/outputs.hpp"
#include "kiln/trace/subgraph.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {
namespace detail {

#if KILN_DEFINE_LIBRARY
template <class Unused>
std::vector<tensor> basic_control_flow_tracer<Unused>::record_cond(trace_context& trace, const tensor& pred,
                                                                   traced_subgraph& then_graph,
                                                                   traced_subgraph& else_graph) {
  hooks().trace_cond.store(&record_cond, std::memory_order_relaxed);
  if (then_graph.outputs != else_graph.outputs) {
    throw value_error("cond: both branches must return the same structure, dtypes and shapes; the true branch returns " +
                      specs_text(then_graph.outputs) + " and the false branch " + specs_text(else_graph.outputs));
  }
  std::vector<tensor> inputs{pred};
  std::vector<int> then_args, else_args;
  std::vector<tensor> captures;
  for (const tensor& t : then_graph.captures) then_args.push_back(capture_index(captures, t));
  for (const tensor& t : else_graph.captures) else_args.push_back(capture_index(captures, t));
  inputs.insert(inputs.end(), captures.begin(), captures.end());
  const std::vector<value_spec> results = then_graph.outputs;
  // A gradient tape recording in this trace differentiates the node: it keeps the
  // branches (copied before they move into the node).
  std::optional<cond_branches> for_tapes;
  if (tapes_recording()) for_tapes = cond_branches{then_graph.g, then_args, else_graph.g, else_args};
  auto op = std::make_shared<cond_op>(std::move(then_graph.g), std::move(then_args), std::move(else_graph.g),
                                      std::move(else_args));
  std::vector<tensor> out = trace.record_special(std::move(op), inputs, results);
  if (for_tapes) hooks().cond.load(std::memory_order_relaxed)(pred, std::move(*for_tapes), captures, out);
  return out;
}
#endif

}  // namespace detail

/// Runs `then_fn()` if the bool scalar `pred` holds, else `else_fn()`. While tracing,
/// both branches are traced and the graph gets a `cond` node; the branches must then
/// return the same structure, dtypes and shapes (or both nothing), else
/// kiln::value_error. A C++ `if` on a C++ value instead picks a branch at trace time.
/// \code
/// kiln::tensor x = kiln::constant(-2.f);
/// kiln::tensor y = kiln::cond(x > 0, [&] { return x; }, [&] { return -x; });  // 2
/// \endcode
template <class Then, class Else>
auto cond(const tensor& pred, Then then_fn, Else else_fn) {
  using R = std::invoke_result_t<Then&>;
  static_assert(std::is_same_v<std::remove_cvref_t<R>, std::remove_cvref_t<std::invoke_result_t<Else&>>>,
                "kiln::cond: both branches must return the same type");
  detail::trace_context* trace = detail::trace_context::current();
  if (!trace) {
    const bool taken = detail::truth_of(pred, "cond");
    if constexpr (std::is_void_v<R>) {
      taken ? then_fn() : else_fn();
      return;
    } else {
      return detail::as_output(taken ? then_fn() : else_fn());
    }
  } else {
    if (pred.dtype() != bool_ || pred.rank() != 0)
      throw value_error("cond: the predicate must be a bool scalar, got " + std::string(name(pred.dtype())) + " " +
                        pred.shape().str());
    // A branch that returns nothing is traced as returning an empty tuple.
    auto branch = [](auto& fn) {
      return [&fn](std::span<const tensor>) {
        if constexpr (std::is_void_v<R>) {
          fn();
          return std::tuple<>{};
        } else {
          return fn();
        }
      };
    };
    detail::traced_subgraph then_graph, else_graph;
    auto traced = detail::trace_subgraph(branch(then_fn), std::span<const tensor_spec>(), then_graph);
    detail::trace_subgraph(branch(else_fn), std::span<const tensor_spec>(), else_graph);
    const std::vector<tensor> out = detail::control_flow_tracer::record_cond(*trace, pred, then_graph, else_graph);
    if constexpr (!std::is_void_v<R>) {
      const tensor* next = out.data();
      return detail::rebuild_output(traced, next);
    }
  }
}

}  // namespace kiln

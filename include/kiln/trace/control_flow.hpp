#pragma once
/// \file
/// Control flow: `kiln::cond`, `kiln::while_loop`,
/// `kiln::for_range` and `kiln::break_if`. Outside a trace they run as C++ control
/// flow on eager tensors; while tracing, branches, conditions and bodies are traced
/// once each into subgraphs of a `cond` or `while` node (kiln/exec/control_flow.hpp),
/// with the tensors they use from the enclosing trace passed in as captures.

#include <atomic>
#include <concepts>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/hooks.hpp"
#include "kiln/core/results.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/ops/control_flow.hpp"
#include "kiln/trace/runtime_tier.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {

/// Ends a loop body: when `pred` holds, the loop stops and keeps the values this
/// iteration started with (an `if (pred) break;` at the top of the body); otherwise
/// it goes on with `next...`.
/// \code
/// kiln::while_loop([](auto i) { return i < 10; },
///                  [](auto i) { return kiln::break_if(i == 3, i + 1); }, kiln::constant(0));  // 3
/// \endcode
template <class P, class... Next>
  requires(std::convertible_to<const P&, tensor> && !typed::operand<P>)  // typed conditions: typed/control_flow.hpp
break_result<std::tuple<std::decay_t<Next>...>> break_if(const P& pred, Next&&... next) {
  return {tensor(pred), std::tuple<std::decay_t<Next>...>(std::forward<Next>(next)...)};
}

/// Options of kiln::while_loop and kiln::for_range, given just before the loop
/// variables.
/// \code
/// // Rows appended to x: its first dim grows, so the loop gives x a shape invariant.
/// kiln::tensor x = kiln::for_range(
///     5, [](const kiln::tensor&, const kiln::tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));  // (5, 10)
/// \endcode
struct loop_options {
  /// The shapes the loop variables may take from one iteration to the next
  /// (TensorFlow's shape_invariants): one entry per tensor of the loop variables, in
  /// order (a tuple or vector variable has one per tensor in it); entries left out
  /// at the end, and std::nullopt, keep a variable's shape exact. A `kiln::none`
  /// dim, or kiln::unknown_rank, may change. An invariant must accept the value its
  /// variable enters with and every value the body gives it, else kiln::value_error;
  /// the loop's results have the invariant's shape. A tensor_array takes none: with
  /// dynamic_size, the loop lets its size change by itself.
  std::vector<std::optional<shape>> shape_invariants = {};
  /// At most this many iterations run (TensorFlow's maximum_iterations): the loop
  /// stops when its condition fails or the count is reached, whichever comes first.
  /// A bound on a loop that might not end; negative counts raise kiln::value_error.
  std::optional<std::int64_t> maximum_iterations = std::nullopt;
};

namespace detail {

template <class T>
struct is_break_result : std::false_type {};
template <class T>
struct is_break_result<break_result<T>> : std::true_type {};

using value_spec = std::pair<dtype, shape>;

/// "float32 (2,)", as the errors of control flow show a value.
template <class = void>
std::string spec_text(const value_spec& s) { return std::string(name(s.first)) + " " + s.second.str(); }
/// "(int32 (), float32 (2,))": several specs as a message shows them.
template <class = void>
std::string specs_text(std::span<const value_spec> specs) {
  std::string s = "(";
  for (std::size_t k = 0; k < specs.size(); ++k) s += (k ? ", " : "") + spec_text(specs[k]);
  return s + ")";
}

/// The leaves of a structure of tensors, in order.
template <class S>
std::vector<tensor> leaves_of(const S& s) {
  std::vector<tensor> out;
  for_each_output(s, [&](const tensor& t) { out.push_back(t); });
  return out;
}
template <class = void>
std::vector<value_spec> specs_of(std::span<const tensor> leaves) {
  std::vector<value_spec> out;
  for (const tensor& t : leaves) out.emplace_back(t.dtype(), t.shape());
  return out;
}

/// A branch, condition or body as traced: its graph, the outer tensors it captured
/// (its placeholders after the parameters) and the specs of its outputs.
struct traced_subgraph {
  graph g;
  std::vector<tensor> captures;
  std::vector<value_spec> outputs;
};

/// Traces `fn(parameters)` into a subgraph whose first placeholders have the specs
/// and names of `params`; returns what `fn` returned (symbolic, for its structure).
template <class Fn>
auto trace_subgraph(Fn&& fn, std::span<const tensor_spec> params, traced_subgraph& out) {
  trace_context context(trace_context::subgraph);
  std::vector<tensor> placeholders;
  for (const tensor_spec& p : params) placeholders.push_back(context.placeholder(p.name, p.dtype, p.shape));
  auto result = fn(std::span<const tensor>(placeholders));
  for_each_output(result, [&](const tensor& t) {
    const node& n = context.add_output(t);
    out.outputs.emplace_back(n.dtype(), n.shape());
  });
  out.g = std::move(context.graph());
  out.captures = context.captures();
  return result;
}
/// The name of the subgraph parameter that stands for `p`: its node's, or `loop_var`.
template <class = void>
std::string parameter_name(const tensor& p) { return p.is_symbolic() ? node_name(*p.symbol()) : "loop_var"; }
/// trace_subgraph with parameters standing for the tensors `params`, with `specs` (a
/// loop variable's may be less specific than its value).
template <class Fn>
auto trace_subgraph(Fn&& fn, std::span<const tensor> params, std::span<const value_spec> specs, traced_subgraph& out) {
  std::vector<tensor_spec> parameters;
  for (std::size_t k = 0; k < params.size(); ++k)
    parameters.emplace_back(specs[k].second, specs[k].first, parameter_name(params[k]));
  return trace_subgraph(std::forward<Fn>(fn), std::span<const tensor_spec>(parameters), out);
}

/// Index of `t` (a capture, by the graph value it stands for) in `all`, appended if new.
template <class = void>
int capture_index(std::vector<tensor>& all, const tensor& t) {
  for (std::size_t k = 0; k < all.size(); ++k)
    if (same_value(*all[k].symbol(), *t.symbol())) return int(k);
  all.push_back(t);
  return int(all.size()) - 1;
}

/// Loop variables `vars` as one value: the value itself for one, a tuple for several.
template <class... Vars>
auto loop_result(std::tuple<Vars...>&& vars) {
  if constexpr (sizeof...(Vars) == 1)
    return std::move(std::get<0>(vars));
  else
    return std::move(vars);
}

/// `v` as loop state holds it: C++ numbers become tensors, structures stay.
template <class V>
output_t<V> as_output(const V& v) {
  std::vector<tensor> leaves = leaves_of(v);
  const tensor* next = leaves.data();
  return rebuild_output(v, next);
}

/// Appends, per leaf of `s`, the tensor_array whose elements it holds, or nullptr.
template <class S>
void array_leaves(const S& s, std::vector<const tensor_array*>& out) {
  using U = std::remove_cvref_t<S>;
  if constexpr (std::is_same_v<U, tensor_array>)
    out.push_back(&s);
  else if constexpr (is_tuple_like<U>::value || is_vector<U>::value)
    for_each_element(s, [&](const auto& e) { array_leaves(e, out); });
  else
    out.push_back(nullptr);
}
template <class S>
std::vector<const tensor_array*> array_leaves(const S& s) {
  std::vector<const tensor_array*> out;
  array_leaves(s, out);
  return out;
}

/// `s` with its first dim `kiln::none`: the elements of an array that may grow.
template <class = void>
shape any_rows(shape s) {
  s[0] = none;
  return s;
}

/// The shape invariant of each leaf of a loop state whose leaves hold `arrays` (a
/// tensor_array or null each) and whose first `hidden` leaves are kiln's own: those
/// `options` gives, and for a written tensor_array with dynamic_size its elements
/// with any number of rows. Raises kiln::value_error for more invariants than
/// variables, and for an invariant given to a tensor_array.
template <class = void>
std::vector<std::optional<shape>> loop_invariants(std::span<const tensor_array* const> arrays,
                                                  const loop_options& options, std::size_t hidden) {
  const auto& given = options.shape_invariants;
  if (given.size() > arrays.size() - hidden)
    throw value_error("while_loop: " + std::to_string(given.size()) + " shape invariants for " +
                      std::to_string(arrays.size() - hidden) + " loop variables");
  std::vector<std::optional<shape>> out(arrays.size());
  for (std::size_t k = hidden; k < arrays.size(); ++k) {
    const tensor_array* array = arrays[k];
    if (k - hidden < given.size() && given[k - hidden]) {
      if (array)
        throw value_error("while_loop: loop variable " + std::to_string(k - hidden) +
                          " is a tensor_array, which takes no shape invariant (with dynamic_size its size may change)");
      out[k] = given[k - hidden];
    } else if (array && array->dynamic_size() && !array->unwritten()) {
      out[k] = any_rows(array->elements().shape());
    }
  }
  return out;
}

/// The specs loop variables keep: the specs of the values they enter with, whose
/// shapes `invariants` relax. Raises kiln::value_error for an invariant that does
/// not accept the value its variable enters with.
template <class = void>
std::vector<value_spec> loop_specs(std::span<const tensor> entering, std::span<const std::optional<shape>> invariants,
                                   std::size_t hidden) {
  std::vector<value_spec> specs = specs_of(entering);
  for (std::size_t k = 0; k < specs.size(); ++k) {
    if (!invariants[k]) continue;
    if (!invariants[k]->accepts(specs[k].second))
      throw value_error("while_loop: loop variable " + std::to_string(k - hidden) + " enters the loop as " +
                        spec_text(specs[k]) + ", which its shape invariant " + invariants[k]->str() + " does not accept");
    specs[k].second = *invariants[k];
  }
  return specs;
}

/// Raises kiln::value_error unless a body's results `got` fit the loop variables'
/// specs: the same dtype, and a shape that the spec, exact or relaxed by the
/// variable's shape invariant, accepts. The first `hidden` loop variables are kiln's
/// own (for_range's counter): messages number the caller's variables from 0.
template <class = void>
void check_loop_specs(std::span<const value_spec> got, std::span<const value_spec> expected,
                      std::span<const std::optional<shape>> invariants, std::size_t hidden,
                      std::string_view loop = "while_loop") {
  if (got.size() != expected.size())
    throw value_error(std::string(loop) + ": the body returns " + std::to_string(got.size() - hidden) + " tensors for " +
                      std::to_string(expected.size() - hidden) + " loop variables");
  for (std::size_t k = 0; k < expected.size(); ++k) {
    if (got[k].first == expected[k].first && expected[k].second.accepts(got[k].second)) continue;
    const std::string variable = std::string(loop) + ": loop variable " + std::to_string(k - hidden);
    if (got[k].first == expected[k].first && k < invariants.size() && invariants[k])
      throw value_error(variable + " has the shape invariant " + invariants[k]->str() + " but is " + spec_text(got[k]) +
                        " after one iteration");
    std::string message = variable + " enters the loop as " + spec_text(expected[k]) + " but is " + spec_text(got[k]) +
                          " after one iteration; a loop variable must keep its dtype and shape";
    if (got[k].first == expected[k].first)
      message += "; to let its shape change, give the loop a shape invariant with kiln::none dims "
                 "(kiln::loop_options{.shape_invariants = ...})";
    throw value_error(message);
  }
}

/// Takes the spec a body gave the unwritten tensor arrays `arrays` (their first
/// write) as their spec from now on, with any number of rows for one with
/// dynamic_size; returns the leaves that changed.
template <class = void>
std::vector<std::size_t> settle_arrays(std::span<const tensor_array* const> arrays,
                                       std::vector<value_spec>& specs, std::span<const value_spec> got) {
  std::vector<std::size_t> settled;
  for (std::size_t k = 0; k < arrays.size() && k < got.size(); ++k) {
    const tensor_array* array = arrays[k];
    if (!array || !array->unwritten() || got[k].first != specs[k].first || got[k] == specs[k]) continue;
    specs[k] = {got[k].first, array->dynamic_size() ? any_rows(got[k].second) : got[k].second};
    settled.push_back(k);
  }
  return settled;
}

/// The next loop state: `current`'s structure with the leaves of what a body returned.
template <class State>
State next_state(const State& current, std::span<const tensor> returned, std::vector<value_spec>& expected,
                 std::span<const std::optional<shape>> invariants, std::size_t hidden,
                 std::string_view loop = "while_loop") {
  const std::vector<value_spec> got = specs_of(returned);
  settle_arrays(array_leaves(current), expected, got);
  check_loop_specs(got, expected, invariants, hidden, loop);
  const tensor* next = returned.data();
  return rebuild_output(current, next);
}

struct loop_calls;

/// What tracing `cond` and `while_loop` does that does not depend on the branches' or
/// the loop's C++ types (`control_flow_tracer`, the one specialization), so that a
/// program compiles it once, not once per cond or loop. A template on nothing: not at
/// all when it traces none, and once in a compiled kiln, by one explicit instantiation
/// (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_control_flow_tracer {
  /// A `cond` node recorded into `trace` from its two traced branches; gives its results.
  static std::vector<tensor> record_cond(trace_context& trace, const tensor& pred, traced_subgraph& then_graph,
                                         traced_subgraph& else_graph);
  /// A while loop traced on the leaves of its state: its condition and body traced into
  /// subgraphs, and a `while` node recorded; gives the leaves of its results. The first
  /// `hidden` leaves are kiln's own; `arrays` holds each leaf's tensor_array, or null.
  static std::vector<tensor> trace_while_loop(trace_context& trace, std::size_t hidden, const loop_options& options,
                                              std::vector<tensor> leaves, std::vector<const tensor_array*> arrays,
                                              std::vector<value_spec> specs,
                                              std::vector<std::optional<shape>> invariants, bool breaks,
                                              loop_calls& calls);
};
using control_flow_tracer = basic_control_flow_tracer<void>;


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

namespace detail {
/// The results of a loop whose first variable was a counter of kiln's own, without it.
template <std::size_t UserVars, class Out>
auto without_counter(Out&& out) {
  if constexpr (UserVars == 0) {
    return;
  } else if constexpr (UserVars == 1) {
    return std::get<1>(std::forward<Out>(out));
  } else {
    return std::apply([](auto&&, auto&&... rest) { return std::tuple{std::move(rest)...}; }, std::forward<Out>(out));
  }
}

/// `body_fn`'s result `r` (one value, a tuple or a break_result) with `counter` in front.
template <class R>
auto with_counter(const tensor& counter, R&& r) {
  if constexpr (is_break_result<std::remove_cvref_t<R>>::value) {
    auto next = std::tuple_cat(std::tuple{counter}, std::move(r.next));
    return break_result<decltype(next)>{r.stop, std::move(next)};
  } else {
    return std::tuple_cat(std::tuple{counter}, std::tuple<std::remove_cvref_t<R>>(std::forward<R>(r)));
  }
}

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

namespace detail {
inline tensor index_tensor(const tensor& t) { return t; }
template <std::integral T>
tensor index_tensor(T v) {
  return kiln::constant(std::int32_t(v));
}

/// kiln::for_range as a while loop over a counter `k < n` with `i = start + k * delta`.
template <class Body, class... Vars>
auto counted_loop(const tensor& start, const tensor& limit, const tensor& delta, Body& body_fn, const loop_options& options,
                  const Vars&... vars) {
  // Python's range length: ceil((limit - start) / delta), at least 0.
  const tensor trips = counter_op<ops::maximum>(
      apply_bookkeeping(ops::negate{}, counter_op<ops::floordiv>(start - limit, delta)), 0);
  auto cond_fn = [&](const tensor& k, const auto&...) { return k < trips; };
  auto body = [&](const tensor& k, const auto&... v) {
    const tensor i = start + k * delta;
    using R = std::invoke_result_t<Body&, const tensor&, decltype(v)...>;
    if constexpr (std::is_void_v<R>) {
      body_fn(i, v...);
      return k + 1;
    } else {
      return with_counter(k + 1, body_fn(i, v...));
    }
  };
  return without_counter<sizeof...(Vars)>(
      detail::while_loop(std::size_t(1), options, cond_fn, body, kiln::constant(std::int32_t(0)), vars...));
}
}  // namespace detail

/// kiln::for_range with `options`: shape invariants let loop variables change shape.
/// \code
/// kiln::tensor x = kiln::for_range(
///     5, [](const kiln::tensor&, const kiln::tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));  // (5, 10)
/// \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body>
auto for_range(const Limit& limit, Body body_fn, const loop_options& options, const Vars&... vars) {
  return detail::counted_loop(kiln::constant(std::int32_t(0)), detail::index_tensor(limit), kiln::constant(std::int32_t(1)),
                              body_fn, options, vars...);
}
/// A loop over `i = 0, 1, ..., limit - 1` (an int32 scalar tensor): a `while` node
/// in a graph whatever `limit` is (a plain C++ loop in the callable unrolls at trace
/// time instead). `body_fn(i, vars...)` gives the next values; with no loop
/// variables it returns nothing.
/// \code
/// kiln::for_range(3, [](const kiln::tensor& i) { kiln::print(i); });  // 0, 1, 2
/// kiln::tensor total = kiln::for_range(4, [](auto i, auto t) { return t + i; }, kiln::constant(0));  // 6
/// \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body> && detail::plain_loop_variables<Vars...>
auto for_range(const Limit& limit, Body body_fn, const Vars&... vars) {
  return for_range(limit, std::move(body_fn), loop_options{}, vars...);
}
/// `for i in range(start, limit, delta)` with `options` (see kiln::loop_options).
/// \code
/// kiln::tensor evens = kiln::for_range(0, 10, 2, [](const kiln::tensor& i, const kiln::tensor& x) {
///   return kiln::concat({x, kiln::reshape(i, {1})}, 0);
/// }, kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none}}}, kiln::zeros({0}, kiln::int32));  // [0 2 4 6 8]
/// \endcode
template <class Start, class Limit, class Delta, class Body, class... Vars>
  requires detail::loop_index<Start> && detail::loop_index<Limit> && detail::loop_index<Delta>
auto for_range(const Start& start, const Limit& limit, const Delta& delta, Body body_fn, const loop_options& options,
               const Vars&... vars) {
  return detail::counted_loop(detail::index_tensor(start), detail::index_tensor(limit), detail::index_tensor(delta), body_fn,
                              options, vars...);
}

/// `for i in range(start, limit, delta)` as a graph loop; a zero `delta` raises
/// kiln::invalid_argument_error.
/// \code kiln::for_range(10, 0, -2, [](const kiln::tensor& i) { kiln::print(i); });  // 10 8 6 4 2 \endcode
template <class Start, class Limit, class Delta, class Body, class... Vars>
  requires detail::loop_index<Start> && detail::loop_index<Limit> && detail::loop_index<Delta> &&
           detail::plain_loop_variables<Vars...>
auto for_range(const Start& start, const Limit& limit, const Delta& delta, Body body_fn, const Vars&... vars) {
  return for_range(start, limit, delta, std::move(body_fn), loop_options{}, vars...);
}
}  // namespace kiln

#pragma once
/// \file
/// The special ops of control flow: a conditional that runs one of two traced
/// branches, and a loop that runs a traced condition and body until the condition
/// fails (or the body asks to stop). Each branch, condition and body is a graph of
/// its own, optimized once and run by its own executor, with its plans and
/// workspaces kept across calls like a function's.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/eager/check_numerics.hpp"
#include "kiln/exec/executor.hpp"
#include "kiln/exec/scalar_program.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/passes/optimize.hpp"

namespace kiln::detail {

/// A graph that a special op runs: the graph as traced (for listings and to_dot),
/// its optimized form and the executor of that. (Its members that optimize and run,
/// and those of the ops below, are templates, as the planner's functions are, so that
/// a program compiles the planner only where it runs a graph.)
class subgraph {
 public:
  template <class = void>
  explicit subgraph(graph traced)
      : traced_(std::move(traced)), optimized_(optimize_if_changed(traced_)), executor_(optimized()) {}
  subgraph(const subgraph&) = delete;
  subgraph& operator=(const subgraph&) = delete;

  const graph& traced() const { return traced_; }
  KILN_LIBRARY_INLINE const graph& optimized() const;
  template <class = void>
  std::vector<tensor> run(std::span<const tensor> args) const { return executor_.run(args); }
  /// The same, consuming the first `consumed` arguments, which the caller does not
  /// read afterwards (graph_executor::run): a loop's variables.
  template <class = void>
  std::vector<tensor> run_consuming(std::span<tensor> args, std::size_t consumed) const {
    std::vector<tensor> out;
    executor_.run(args, out, args.first(consumed));
    return out;
  }

 private:
  graph traced_;
  std::optional<graph> optimized_;  ///< nothing when the optimizer leaves traced_ as it is
  graph_executor executor_;
};

/// The value of a scalar bool_ condition computed by a graph.
KILN_LIBRARY_INLINE bool truth_of(const tensor& pred, std::string_view op);

/// The branches of a `cond` node and each one's arguments (indices into the node's
/// captures), as a tape keeps them to differentiate the node.
struct cond_branches {
  graph then_graph;
  std::vector<int> then_args;
  graph else_graph;
  std::vector<int> else_args;
};

/// `kiln::cond`: inputs are the predicate, then the values the branches captured;
/// each branch takes its own captures (`then_args`, `else_args` index the inputs
/// after the predicate).
class cond_op final : public special_op {
 public:
  template <class = void>
  cond_op(graph then_graph, std::vector<int> then_args, graph else_graph, std::vector<int> else_args)
      : special_op(std::type_identity<cond_op>()), then_(std::move(then_graph)), else_(std::move(else_graph)),
        then_args_(std::move(then_args)), else_args_(std::move(else_args)),
        effects_(then_.traced().has_effects() || else_.traced().has_effects()) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  bool has_effects() const { return effects_; }
  KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> subgraphs() const;
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const bool taken = truth_of(*in[0], "cond");
    const std::vector<int>& picks = taken ? then_args_ : else_args_;
    std::vector<tensor> args;
    args.reserve(picks.size());
    for (int k : picks) args.push_back(*in[std::size_t(k) + 1]);
    return (taken ? then_ : else_).run(args);
  }
  /// The branches as traced, and the captures (indices after the predicate) each takes.
  const graph& then_graph() const { return then_.traced(); }
  const graph& else_graph() const { return else_.traced(); }
  const std::vector<int>& then_args() const { return then_args_; }
  const std::vector<int>& else_args() const { return else_args_; }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 1> op_names();
  /// Saved as its branches' graphs and the captures each takes.
  template <class Out>
  void save(Out& out) const {
    out.set_graph("then", then_graph());
    out.set("then_args", then_args_);
    out.set_graph("else", else_graph());
    out.set("else_args", else_args_);
  }
  /// Rebuilt from its branches once each takes what the node's inputs give and gives
  /// the node's results.
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    const int count = in.input_count();
    if (count < 1 || in.input(0).dtype() != bool_) in.fail("a cond's first input is its bool predicate");
    auto branch = [&](std::string_view graph_key, std::string_view args_key) {
      graph sub = in.graph(graph_key);
      std::vector<int> picks = in.integers(args_key, 0, count - 2);
      if (picks.size() != sub.arguments().size()) in.fail("a branch's arguments do not match its graph");
      for (std::size_t k = 0; k < picks.size(); ++k) in.check_argument(sub, k, in.input(picks[k] + 1));
      in.expect_results(In::outputs_of(sub));
      return std::pair{std::move(sub), std::move(picks)};
    };
    auto [then_graph, then_args] = branch("then", "then_args");
    auto [else_graph, else_args] = branch("else", "else_args");
    return std::make_shared<cond_op>(std::move(then_graph), std::move(then_args), std::move(else_graph),
                                     std::move(else_args));
  }
  /// ONNX's `If`, each branch a graph whose arguments are the captures it takes.
  template <class Onnx, class Graph>
  std::vector<std::string> to_onnx(Onnx& onnx, Graph& g, const node& n, const graph&,
                                   const std::vector<std::string>& in) const {
    auto& if_node = onnx.add(g, "If", {in[0]}, n.name(), n.result_count());
    onnx.branch(onnx.graph_attribute(if_node, "then_branch"), then_graph(), then_args(), in);
    onnx.branch(onnx.graph_attribute(if_node, "else_branch"), else_graph(), else_args(), in);
    return {if_node.output().begin(), if_node.output().end()};
  }

 private:
  subgraph then_, else_;
  std::vector<int> then_args_, else_args_;
  bool effects_;
};

/// `kiln::while_loop`: inputs are the loop variables' initial values, then the values
/// the condition captured, then those the body captured. The condition graph takes
/// the loop variables and its captures and gives a bool scalar; the body graph takes
/// the loop variables and its captures and gives the next values, led by a stop
/// flag when it ends in kiln::break_if. A loop variable traced with `None` dims (a
/// shape invariant) may change shape from one iteration to the next: the executors
/// plan per argument shapes, and such graphs never compile to scalar programs, whose
/// values must be one element each.
class while_op final : public special_op {
 public:
  template <class = void>
  while_op(int loop_vars, graph cond_graph, int cond_captures, graph body_graph, bool body_breaks)
      : special_op(std::type_identity<while_op>()), vars_(loop_vars), cond_captures_(cond_captures), breaks_(body_breaks),
        cond_(std::move(cond_graph)), body_(std::move(body_graph)),
        effects_(cond_.traced().has_effects() || body_.traced().has_effects()),
        cond_program_(exec::scalar_program::compile(cond_.optimized())),
        body_program_(exec::scalar_program::compile(body_.optimized())) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  bool has_effects() const { return effects_; }
  KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> subgraphs() const;
  int loop_variables() const { return vars_; }
  int cond_captures() const { return cond_captures_; }
  bool breaks() const { return breaks_; }
  const graph& cond_graph() const { return cond_.traced(); }
  const graph& body_graph() const { return body_.traced(); }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 1> op_names();
  /// Saved as its condition's and body's graphs and how its inputs divide between them.
  template <class Out>
  void save(Out& out) const {
    out.set("loop_vars", vars_);
    out.set_graph("cond", cond_graph());
    out.set("cond_captures", cond_captures_);
    out.set_graph("body", body_graph());
    out.set("breaks", breaks_);
  }
  /// Rebuilt once its condition and body take what the node's inputs give, and the
  /// body gives back what it and the condition take next.
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    using results_t = std::vector<std::pair<dtype, shape>>;
    const int count = in.input_count();
    const int vars = in.integer("loop_vars", 0, count);
    const int captures = in.integer("cond_captures", 0, count - vars);
    const bool breaks = in.boolean("breaks");
    graph cond = in.graph("cond"), body = in.graph("body");
    if (int(cond.arguments().size()) != vars + captures || cond.outputs().size() != 1 ||
        cond.node_at(cond.outputs()[0]).dtype() != bool_)
      in.fail("a loop's condition does not match its loop variables");
    if (int(body.arguments().size()) != count - captures || int(body.outputs().size()) != vars + (breaks ? 1 : 0))
      in.fail("a loop's body does not match its loop variables");
    if (breaks && body.node_at(body.outputs()[0]).dtype() != bool_) in.fail("a loop body's break_if flag is not bool");
    for (int k = 0; k < vars + captures; ++k) in.check_argument(cond, std::size_t(k), in.input(k));
    for (int k = 0; k < count - captures; ++k) in.check_argument(body, std::size_t(k), in.input(k < vars ? k : k + captures));
    const results_t next = In::outputs_of(body, breaks ? 1 : 0);
    for (int k = 0; k < vars; ++k) {
      const node& p = body.node_at(body.arguments()[std::size_t(k)]);
      const node& c = cond.node_at(cond.arguments()[std::size_t(k)]);
      if (p.dtype() != next[std::size_t(k)].first || !p.shape().accepts(next[std::size_t(k)].second) ||
          !c.shape().accepts(next[std::size_t(k)].second))
        in.fail("loop variable " + std::to_string(k) + " changes from one iteration to the next");
    }
    results_t loop_vars;
    for (int k = 0; k < vars; ++k)
      loop_vars.emplace_back(body.node_at(body.arguments()[std::size_t(k)]).dtype(),
                             body.node_at(body.arguments()[std::size_t(k)]).shape());
    in.expect_results(loop_vars);
    return std::make_shared<while_op>(vars, std::move(cond), captures, std::move(body), breaks);
  }

  /// ONNX's `Loop`, which tests its condition after each body: the condition is
  /// computed once before the loop, and again at the end of the body on the next
  /// values. A body ending in kiln::break_if keeps the values it started with and
  /// stops when its flag is set.
  template <class Onnx, class Graph>
  std::vector<std::string> to_onnx(Onnx& onnx, Graph& g, const node& n, const graph& kg,
                                   const std::vector<std::string>& in) const {
    const int id = int(kg.nodes().index_of(n));
    const std::size_t vars = std::size_t(vars_), cond_captures = std::size_t(cond_captures_);
    const std::vector<std::string> captured_by_cond(in.begin() + std::ptrdiff_t(vars),
                                                    in.begin() + std::ptrdiff_t(vars + cond_captures));
    const auto condition = [&](Graph& into, const std::vector<std::string>& values) {
      std::vector<std::string> args = values;
      args.insert(args.end(), captured_by_cond.begin(), captured_by_cond.end());
      const std::string flag = onnx.emit(into, cond_graph(), args)[0];
      if (cond_graph().node_at(cond_graph().outputs()[0]).dtype() != bool_)
        onnx.unavailable(n, "has a condition that is not a bool");
      return flag;
    };
    const std::vector<std::string> initial(in.begin(), in.begin() + std::ptrdiff_t(vars));
    auto& loop_node = onnx.add(g, "Loop", {"", condition(g, initial)}, n.name(), int(vars));
    for (std::size_t k = 0; k < vars; ++k) loop_node.add_input(in[k]);

    Graph& body = onnx.graph_attribute(loop_node, "body");
    const auto add_value = [&](auto* list, const std::string& name, dtype t, const shape& s) {
      auto* v = list->Add();
      v->set_name(name);
      onnx.set_type(*v, t, s);
    };
    add_value(body.mutable_input(), onnx.fresh(n.name() + "/iteration"), int64, shape{});
    add_value(body.mutable_input(), onnx.fresh(n.name() + "/running"), bool_, shape{});
    std::vector<std::string> values;
    for (std::size_t k = 0; k < vars; ++k) {
      const node& v = kg.node_at(id + int(k));
      values.push_back(onnx.fresh(n.name() + "/var"));
      add_value(body.mutable_input(), values.back(), v.dtype(), v.shape());
    }
    std::vector<std::string> args = values;
    args.insert(args.end(), in.begin() + std::ptrdiff_t(vars + cond_captures), in.end());
    std::vector<std::string> next = onnx.emit(body, body_graph(), args);

    std::vector<std::string> outputs;
    if (!breaks_) {
      outputs.push_back(condition(body, next));
      outputs.insert(outputs.end(), next.begin(), next.end());
    } else {
      // If(flag): stop with the values this iteration began with; else go on with the next.
      auto& stop = onnx.add(body, "If", {next[0]}, n.name() + "/break", int(vars) + 1);
      Graph& then_branch = onnx.graph_attribute(stop, "then_branch");
      Graph& else_branch = onnx.graph_attribute(stop, "else_branch");
      // An initializer is no node's output: the branch returns the flag through Identity.
      std::vector<std::string> then_outputs = {
          onnx.value(then_branch, "Identity", {onnx.constant_bool(false, n.name() + "/stop")}, n.name() + "/stop")};
      std::vector<std::string> else_outputs = {
          condition(else_branch, std::vector<std::string>(next.begin() + 1, next.end()))};
      for (std::size_t k = 0; k < vars; ++k) {
        then_outputs.push_back(onnx.value(then_branch, "Identity", {values[k]}, n.name() + "/var"));
        else_outputs.push_back(onnx.value(else_branch, "Identity", {next[k + 1]}, n.name() + "/var"));
      }
      for (std::size_t k = 0; k <= vars; ++k) {
        const node* v = k == 0 ? nullptr : &kg.node_at(id + int(k) - 1);
        const dtype t = v ? v->dtype() : bool_;
        const shape s = v ? v->shape() : shape{};
        add_value(then_branch.mutable_output(), then_outputs[k], t, s);
        add_value(else_branch.mutable_output(), else_outputs[k], t, s);
      }
      outputs.assign(stop.output().begin(), stop.output().end());
    }
    add_value(body.mutable_output(), outputs[0], bool_, shape{});
    for (std::size_t k = 0; k < vars; ++k) {
      const node& v = kg.node_at(id + int(k));
      add_value(body.mutable_output(), outputs[k + 1], v.dtype(), v.shape());
    }
    return {loop_node.output().begin(), loop_node.output().end()};
  }
  /// Whether the condition and the body compiled to scalar programs, which run
  /// without an executor when the loop variables are one-element CPU values.
  bool runs_as_scalar_program() const { return cond_program_ && body_program_; }
  /// Whether the condition compiled to a scalar program, which runs without an
  /// executor when the values it reads are one-element CPU values (whatever the body).
  bool condition_runs_as_scalar_program() const { return cond_program_.has_value(); }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    if (scalar_loop(in)) return run_scalar(in);
    const std::size_t n = std::size_t(vars_);
    // The argument lists of the condition and the body: loop variables, then captures.
    std::vector<tensor> cond_args(n), body_args(n);
    for (std::size_t k = 0; k < n; ++k) cond_args[k] = *in[k];
    for (std::size_t k = n; k < n + std::size_t(cond_captures_); ++k) cond_args.push_back(*in[k]);
    for (std::size_t k = n + std::size_t(cond_captures_); k < in.size(); ++k) body_args.push_back(*in[k]);
    // A condition that compiled to a scalar program runs without an executor when
    // what it reads fits it (a counter, while the body grows arrays).
    std::vector<exec::scalar_value> cond_registers;
    if (cond_program_ && !cond_program_->writes_arguments() && !debugging::check_numerics_enabled())
      cond_registers = cond_program_->registers();
    auto goes_on = [&] {
      if (!cond_registers.empty() && accepts(*cond_program_, cond_args)) {
        const exec::scalar_program& cond = *cond_program_;
        for (std::size_t k = 0; k < cond_args.size(); ++k) cond.set_argument(k, cond_args[k], cond_registers);
        cond.run(cond_registers);
        return cond_registers[std::size_t(cond.output(0))].bytes[0] != 0;  // a bool_ is one byte, 0 or 1
      }
      return truth_of(cond_.run(cond_args)[0], "while_loop");
    };
    for (;;) {
      if (!goes_on()) break;
      for (std::size_t k = 0; k < n; ++k) body_args[k] = std::move(cond_args[k]);
      // The body consumes the loop variables (its ops may write them in place) unless
      // a break would keep them as the loop's results.
      std::vector<tensor> next = body_.run_consuming(body_args, breaks_ ? 0 : n);
      const std::size_t first = breaks_ ? 1 : 0;
      if (breaks_ && truth_of(next[0], "break_if")) {
        for (std::size_t k = 0; k < n; ++k) cond_args[k] = std::move(body_args[k]);
        break;
      }
      for (std::size_t k = 0; k < n; ++k) cond_args[k] = std::move(next[k + first]);
    }
    cond_args.resize(n);
    return cond_args;
  }

 private:
  // Whether the condition and body compiled to scalar programs and what they read
  // fits them: one-element tensors on the CPU, and vectors where they hold arrays (a
  // capture no program reads, such as a value a backward loop is given but does not
  // need, may be anything). The body may write in place only the arrays that are loop
  // variables, and only when it does not break: a break keeps the values its
  // iteration began with. check_numerics needs the executor, which names ops.
  bool scalar_loop(std::span<const tensor* const> in) const {
    if (!cond_program_ || !body_program_ || debugging::check_numerics_enabled()) return false;
    const exec::scalar_program &cond = *cond_program_, &body = *body_program_;
    if (cond.writes_arguments()) return false;
    const std::size_t n = std::size_t(vars_), cond_end = n + std::size_t(cond_captures_), first = breaks_ ? 1 : 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const tensor& t = *in[k];
      if (k < n) {
        const bool array = body.output_is_array(k + first);
        if (array ? breaks_ || !exec::scalar_program::holds_array(t) : !exec::scalar_program::holds_scalar(t))
          return false;
      }
      if (k < cond_end && !cond.accepts(k, t)) return false;
      if (k >= n && k < cond_end) continue;
      const std::size_t arg = k < n ? k : k - cond_end + n;
      if (!body.accepts(arg, t) || (k >= n && body.writes(arg))) return false;
    }
    return true;
  }

  // Whether program `p` can run on `args` (a loop keeps its variables' dtypes, so they
  // are those it was traced with).
  static bool accepts(const exec::scalar_program& p, std::span<const tensor> args) {
    for (std::size_t k = 0; k < args.size(); ++k)
      if (!p.accepts(k, args[k])) return false;
    return true;
  }

  // The loop on scalar programs: loop variables and captures live in registers, an
  // array as the address of a tensor the loop holds (the body writes its arrays in
  // place), and an iteration allocates nothing but the room a growing array doubles
  // into.
  template <class = void>
  std::vector<tensor> run_scalar(std::span<const tensor* const> in) const {
    const exec::scalar_program &cond = *cond_program_, &body = *body_program_;
    const std::size_t n = std::size_t(vars_), cond_end = n + std::size_t(cond_captures_), first = breaks_ ? 1 : 0;
    std::vector<exec::scalar_value> cond_registers = cond.registers(), body_registers = body.registers(), vars(n);
    // A loop variable that is an array lives in `arrays`, and its register holds the
    // tensor's address, which moves as the scalars' values do (8 bytes).
    std::vector<tensor> arrays(n);
    std::vector<std::size_t> array_vars, sizes(n);
    for (std::size_t k = 0; k < n; ++k) {
      if (body.output_is_array(k + first)) {
        array_vars.push_back(k);
        arrays[k] = *in[k];
        exec::scalar_program::set_address(vars[k], arrays[k]);
        sizes[k] = sizeof(tensor*);
      } else {
        std::memcpy(vars[k].bytes, in[k]->raw_data(), size_of(in[k]->dtype()));
        sizes[k] = size_of(in[k]->dtype());
      }
    }
    const bool has_arrays = !array_vars.empty();
    for (std::size_t k = n; k < cond_end; ++k) cond.set_argument(k, *in[k], cond_registers);
    for (std::size_t k = cond_end; k < in.size(); ++k) body.set_argument(k - cond_end + n, *in[k], body_registers);
    auto truth = [](const exec::scalar_value& r) { return r.bytes[0] != 0; };  // a bool_ is one byte, 0 or 1
    // Each variable moves in its dtype's size: an 8-byte load of a register an op just
    // wrote 4 bytes of waits for the store to retire (no store forwarding).
    auto move = [](exec::scalar_value& to, const exec::scalar_value& from, std::size_t bytes) {
      switch (bytes) {
        case 8: std::memcpy(to.bytes, from.bytes, 8); break;
        case 4: std::memcpy(to.bytes, from.bytes, 4); break;
        default: std::memcpy(to.bytes, from.bytes, 1); break;  // bool_
      }
    };
    for (;;) {
      for (std::size_t k = 0; k < n; ++k) move(cond_registers[std::size_t(cond.argument(k))], vars[k], sizes[k]);
      cond.run(cond_registers);
      if (!truth(cond_registers[std::size_t(cond.output(0))])) break;
      for (std::size_t k = 0; k < n; ++k) move(body_registers[std::size_t(body.argument(k))], vars[k], sizes[k]);
      body.run(body_registers);
      if (breaks_ && truth(body_registers[std::size_t(body.output(0))])) break;
      for (std::size_t k = 0; k < n; ++k) move(vars[k], body_registers[std::size_t(body.output(k + first))], sizes[k]);
      if (has_arrays) settle_arrays(array_vars, arrays, vars);
    }
    std::vector<tensor> out;
    out.reserve(n);
    for (std::size_t k = 0; k < n; ++k) {
      if (body.output_is_array(k + first)) {
        out.push_back(std::move(arrays[k]));
        continue;
      }
      tensor t(in[k]->dtype(), in[k]->shape());
      std::memcpy(t.raw_data(), vars[k].bytes, size_of(t.dtype()));
      out.push_back(std::move(t));
    }
    return out;
  }

  // After an iteration: an array the body wrote in place is its variable already; one
  // it gives from elsewhere (another variable, a capture) is shared (then copied when
  // written). Each array variable is set to the array its register now addresses, all
  // read before any is set (the body may give them swapped), and the register points
  // back at it. Out of line: a scalar loop with this check in its body ran 5 % slower.
  template <class = void>
  KILN_NOINLINE static void settle_arrays(const std::vector<std::size_t>& array_vars, std::vector<tensor>& arrays,
                                          std::vector<exec::scalar_value>& vars) {
    if (std::all_of(array_vars.begin(), array_vars.end(),
                    [&](std::size_t k) { return &exec::scalar_program::array_at(vars[k]) == &arrays[k]; }))
      return;
    std::vector<tensor> next;
    for (std::size_t k : array_vars) next.push_back(exec::scalar_program::array_at(vars[k]));
    for (std::size_t j = 0; j < array_vars.size(); ++j) {
      arrays[array_vars[j]] = std::move(next[j]);
      exec::scalar_program::set_address(vars[array_vars[j]], arrays[array_vars[j]]);
    }
  }

  int vars_;
  int cond_captures_;
  bool breaks_;
  subgraph cond_, body_;
  bool effects_;
  std::optional<exec::scalar_program> cond_program_, body_program_;
};

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE const graph& subgraph::optimized() const { return optimized_ ? *optimized_ : traced_; }

KILN_LIBRARY_INLINE bool truth_of(const tensor& pred, std::string_view op) {
  if (pred.dtype() != bool_ || pred.size() != 1)
    throw invalid_argument_error(std::string(op) + ": the condition must be a bool scalar, got " +
                                 std::string(name(pred.dtype())) + " " + pred.shape().str());
  return bool(pred);
}

KILN_LIBRARY_INLINE std::string_view cond_op::name() const { return "cond"; }

KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> cond_op::subgraphs() const {
  return {{"then", &then_.traced()}, {"else", &else_.traced()}};
}

KILN_LIBRARY_INLINE std::array<std::string_view, 1> cond_op::op_names() { return {"cond"}; }

KILN_LIBRARY_INLINE std::string_view while_op::name() const { return "while"; }

KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> while_op::subgraphs() const {
  return {{"cond", &cond_.traced()}, {"body", &body_.traced()}};
}

KILN_LIBRARY_INLINE std::array<std::string_view, 1> while_op::op_names() { return {"while"}; }

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// The special ops of control flow: a conditional that runs one of two traced
/// branches, and a loop that runs a traced condition and body until the condition
/// fails (or the body asks to stop). Each branch, condition and body is a graph of
/// its own, optimized once and run by its own executor, with its plans and
/// workspaces kept across calls like a function's.

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/exec/executor.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/passes/optimize.hpp"

namespace kiln::detail {

/// A graph that a special op runs: the graph as traced (for listings and to_dot),
/// its optimized form and the executor of that.
class subgraph {
 public:
  explicit subgraph(graph traced) : traced_(std::move(traced)), optimized_(optimize(traced_)), executor_(optimized_) {}
  subgraph(const subgraph&) = delete;
  subgraph& operator=(const subgraph&) = delete;

  const graph& traced() const { return traced_; }
  std::vector<tensor> run(std::span<const tensor> args) const { return executor_.run(args); }

 private:
  graph traced_;
  graph optimized_;
  graph_executor executor_;
};

/// The value of a scalar bool_ condition computed by a graph.
inline bool truth_of(const tensor& pred, std::string_view op) {
  if (pred.dtype() != bool_ || pred.size() != 1)
    throw invalid_argument_error(std::string(op) + ": the condition must be a bool scalar, got " +
                                 std::string(name(pred.dtype())) + " " + pred.shape().str());
  return bool(pred);
}

/// `kiln::cond`: inputs are the predicate, then the values the branches captured;
/// each branch takes its own captures (`then_args`, `else_args` index the inputs
/// after the predicate).
class cond_op final : public special_op {
 public:
  cond_op(graph then_graph, std::vector<int> then_args, graph else_graph, std::vector<int> else_args)
      : then_(std::move(then_graph)), else_(std::move(else_graph)), then_args_(std::move(then_args)),
        else_args_(std::move(else_args)),
        effects_(then_.traced().has_effects() || else_.traced().has_effects()) {}
  std::string_view name() const override { return "cond"; }
  bool has_effects() const override { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const override {
    return {{"then", &then_.traced()}, {"else", &else_.traced()}};
  }
  std::vector<tensor> run(std::span<const tensor* const> in) const override {
    const bool taken = truth_of(*in[0], "cond");
    const std::vector<int>& picks = taken ? then_args_ : else_args_;
    std::vector<tensor> args;
    args.reserve(picks.size());
    for (int k : picks) args.push_back(*in[std::size_t(k) + 1]);
    return (taken ? then_ : else_).run(args);
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
/// flag when it ends in kiln::break_if.
class while_op final : public special_op {
 public:
  while_op(int loop_vars, graph cond_graph, int cond_captures, graph body_graph, bool body_breaks)
      : vars_(loop_vars), cond_captures_(cond_captures), breaks_(body_breaks), cond_(std::move(cond_graph)),
        body_(std::move(body_graph)), effects_(cond_.traced().has_effects() || body_.traced().has_effects()) {}
  std::string_view name() const override { return "while"; }
  bool has_effects() const override { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const override {
    return {{"cond", &cond_.traced()}, {"body", &body_.traced()}};
  }
  std::vector<tensor> run(std::span<const tensor* const> in) const override {
    const std::size_t n = std::size_t(vars_);
    // The argument lists of the condition and the body: loop variables, then captures.
    std::vector<tensor> cond_args(n), body_args(n);
    for (std::size_t k = 0; k < n; ++k) cond_args[k] = *in[k];
    for (std::size_t k = n; k < n + std::size_t(cond_captures_); ++k) cond_args.push_back(*in[k]);
    for (std::size_t k = n + std::size_t(cond_captures_); k < in.size(); ++k) body_args.push_back(*in[k]);
    for (;;) {
      if (!truth_of(cond_.run(cond_args)[0], "while_loop")) break;
      for (std::size_t k = 0; k < n; ++k) body_args[k] = std::move(cond_args[k]);
      std::vector<tensor> next = body_.run(body_args);
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
  int vars_;
  int cond_captures_;
  bool breaks_;
  subgraph cond_, body_;
  bool effects_;
};

}  // namespace kiln::detail

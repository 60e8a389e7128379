#pragma once
/// \file
/// The graph of a typed trace (typed::concrete_function::graph()): the kiln::graph the
/// runtime tier traces from the same callable, built from the trace's steps, each of
/// which describes itself to a `typed::description_sink` (kiln/typed/expr.hpp). An
/// expression gives one op node per op (broadcasts are implicit, as in the runtime
/// tier), a kernel step the node of its op, a `cond` or loop step a `cond` or `while`
/// node whose branches or condition and body are graphs of their own (values they read
/// from outside are their placeholders and the node's inputs), and effects the runtime
/// tier's effect nodes. It comes with kiln/kiln.hpp: kiln/fixed.hpp has no kiln::graph.

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/typed/control_flow.hpp"
#include "kiln/typed/effects.hpp"
#include "kiln/typed/unfused_ops.hpp"

namespace kiln {
namespace typed {

/// A node of a typed trace's graph that stands for a step with effects or graphs of
/// its own: it has the runtime tier's name for it (`cond`, `while`, `PrintV2`, ...),
/// its branches or body as subgraphs and the name of the variable it reads or writes,
/// but runs only as part of its trace.
class described_op final : public special_op {
 public:
  using labelled_graphs = std::vector<std::pair<std::string, std::shared_ptr<const graph>>>;
  described_op(std::string name, bool effects, labelled_graphs subgraphs = {}, std::string variable = {})
      : special_op(std::type_identity<described_op>()), name_(std::move(name)), effects_(effects),
        subgraphs_(std::move(subgraphs)), variable_(std::move(variable)) {}
  std::string_view name() const { return name_; }
  bool has_effects() const { return effects_; }
  KILN_LIBRARY_INLINE std::vector<tensor> run(std::span<const tensor* const>) const;
  KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> subgraphs() const;

  /// None of its own: its nodes take the names of the runtime tier's ops, so consumers
  /// find it by its kind, and no file holds it to be loaded by name.
  KILN_LIBRARY_INLINE static std::array<std::string_view, 0> op_names();
  static constexpr std::string_view save_refusal =
      "stands for a step of a typed trace, which runs only inside that trace; save a trace of the function for "
      "kiln::tensor arguments";
  static constexpr std::string_view onnx_refusal =
      "stands for a step of a typed trace, which runs only inside that trace; export a trace of the function for "
      "kiln::tensor arguments";
  /// What TensorBoard's graph shows of it: the variable's name, as the runtime tier's
  /// variable ops show it.
  template <class Out>
  void describe(Out& out) const {
    if (!variable_.empty()) out.set_text("shared_name", variable_);
  }

 private:
  std::string name_;
  bool effects_;
  labelled_graphs subgraphs_;
  std::string variable_;  // the variable it reads or writes, or empty
};

/// Builds the graph of a typed trace, or of one of its branches or loop bodies (then
/// `outer` is the graph that runs it). A template only so that a program compiles it
/// where it asks for a typed trace's graph (its table of the registry's ops cost every
/// source file including kiln/kiln.hpp about 0.9 s); `graph_writer` names it.
template <class>
class basic_graph_writer final : public description_sink {
 public:
  explicit basic_graph_writer(basic_graph_writer* outer = nullptr) : outer_(outer) {}

  /// The graph of trace `t`, whose typed arguments are `fixed` values of types `Fixed`.
  template <class... Fixed, class R>
  static kiln::graph graph_of(const trace<R>& t) {
    basic_graph_writer w;
    int slot = 0;
    ((w.bind(slot, w.graph_.add_placeholder(t.argument_names[std::size_t(slot)], Fixed::dtype, Fixed::shape())), ++slot),
     ...);
    w.add_steps(t.steps);
    if constexpr (!std::is_void_v<R>) {
      // The results' nodes first, then their Identity nodes, as the runtime tier adds them.
      std::vector<int> results;
      w.add_results(*t.result, results);
      for (int id : results) w.graph_.add_output(id);
    }
    return std::move(w.graph_);
  }

  void add_steps(const std::vector<step>& steps) {
    for (const step& s : steps) s.describe(s.data.get(), *this);
  }

  // ---- description_sink ----------------------------------------------------------------

  int value(int slot, std::span<const std::int64_t> dims) override {
    const int id = value(slot);
    const kiln::node& n = graph_.node_at(id);
    if (std::ranges::equal(n.shape().dims(), dims)) return id;
    // A reshaped symbolic value is a view of its slot: its reshape node appears where
    // it is first read with the new dims.
    const kiln::shape s = kiln::shape(dims);
    const auto key = std::pair{slot, s.str()};
    if (auto it = views_.find(key); it != views_.end()) return it->second;
    const int reshaped[] = {id};
    return views_[key] = graph_.add_op(ops::reshape{s}, reshaped, n.dtype(), s);
  }
  void bind(int slot, int node_id) override { slots_[slot] = node_id; }
  int op(std::string_view name, const void* op, std::span<const int> inputs, kiln::dtype t,
         std::span<const std::int64_t> dims) override {
    return graph_.add_op(registry_op(name, op), inputs, t, kiln::shape(dims));
  }
  int constant(kiln::dtype t, std::span<const std::int64_t> dims, const void* data) override {
    tensor value(t, kiln::shape(dims));
    std::memcpy(value.view().data, data, std::size_t(value.shape().num_elements()) * size_of(t));
    return graph_.add_constant(value);
  }
  std::vector<int> effect(std::string_view name, std::string_view variable, bool writes, std::vector<int> inputs,
                          const std::vector<std::pair<kiln::dtype, kiln::shape>>& results) override {
    return add_special(std::string(name), writes, std::move(inputs), results, {}, std::string(variable));
  }

  void control_flow(const cond_step& c) override {
    basic_graph_writer then_branch(this), else_branch(this);
    for (auto [branch, steps] : {std::pair{&then_branch, &c.then_steps}, std::pair{&else_branch, &c.else_steps}}) {
      branch->add_steps(*steps);
      for (int slot : c.results) branch->graph_.add_output(branch->value(slot));
    }
    std::vector<int> inputs{value(c.pred)};
    inputs.insert(inputs.end(), then_branch.captures_.begin(), then_branch.captures_.end());
    inputs.insert(inputs.end(), else_branch.captures_.begin(), else_branch.captures_.end());
    const auto results = then_branch.output_specs();
    const bool effects = then_branch.graph_.has_effects() || else_branch.graph_.has_effects();
    bind_results(c.results, add_special("cond", effects, std::move(inputs), results,
                                        {{"then", then_branch.finish()}, {"else", else_branch.finish()}}));
  }

  void control_flow(const loop_step& l) override {
    basic_graph_writer cond(this), body(this);
    std::vector<int> inputs, variables;
    std::vector<std::pair<kiln::dtype, kiln::shape>> results;
    for (const loop_step::copy& c : l.copies) {
      const int initial = value(c.to);
      const kiln::node& n = graph_.node_at(initial);
      for (basic_graph_writer* w : {&cond, &body}) w->bind(c.to, w->graph_.add_placeholder(n.name(), n.dtype(), n.shape()));
      inputs.push_back(initial);
      variables.push_back(c.to);
      results.emplace_back(n.dtype(), n.shape());
    }
    cond.add_steps(l.cond_steps);
    cond.graph_.add_output(cond.value(l.pred));
    body.add_steps(l.body_steps);
    if (l.stop >= 0) body.graph_.add_output(body.value(l.stop));  // the stop flag leads, as in the runtime tier
    for (const loop_step::copy& c : l.copies) body.graph_.add_output(body.value(c.from));
    inputs.insert(inputs.end(), cond.captures_.begin(), cond.captures_.end());
    inputs.insert(inputs.end(), body.captures_.begin(), body.captures_.end());
    const bool effects = cond.graph_.has_effects() || body.graph_.has_effects();
    bind_results(variables, add_special("while", effects, std::move(inputs), results,
                                        {{"cond", cond.finish()}, {"body", body.finish()}}));
  }

 private:
  /// The node holding slot `slot`'s value here: a placeholder for a value of an
  /// enclosing graph, which becomes an input of the node that runs this one.
  int value(int slot) {
    if (auto it = slots_.find(slot); it != slots_.end()) return it->second;
    if (!outer_) throw internal_error("kiln: graph(): slot " + std::to_string(slot) + " of a typed trace is read before it is written");
    const int from = outer_->value(slot);
    const kiln::node& n = outer_->graph_.node_at(from);
    const int id = graph_.add_placeholder(n.name(), n.dtype(), n.shape());
    captures_.push_back(from);
    return slots_[slot] = id;
  }

  /// Adds the nodes of the trace's result `r` (C++ values as constants) to `ids`.
  template <class R>
  void add_results(const R& r, std::vector<int>& ids) {
    if constexpr (lazy<R>)
      ids.push_back(expression_of<void, false>(r).describe(*this));
    else if constexpr (fixed_value<R>)
      ids.push_back(constant(R::dtype, R::dims_type::values, r.data()));
    else if constexpr (requires { std::tuple_size<R>::value; } && !std::is_array_v<R>)
      std::apply([&](const auto&... e) { (add_results(e, ids), ...); }, r);
    else if constexpr (has_dtype<R>)
      ids.push_back(graph_.add_constant(kiln::constant(r)));
  }

  template <class Slots>
  void bind_results(const Slots& slots, const std::vector<int>& ids) {
    std::size_t k = 0;
    for (int slot : slots) bind(slot, ids[k++]);
  }

  /// The registry op named `name`, copied from `op`.
  static ops::any_op registry_op(std::string_view name, const void* op) {
    using copy = ops::any_op (*)(const void*);
    static constexpr auto table = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
      return std::array<std::pair<std::string_view, copy>, sizeof...(Ops)>{
          std::pair<std::string_view, copy>{Ops::name, [](const void* p) { return ops::any_op(*static_cast<const Ops*>(p)); }}...};
    }(static_cast<ops::all_ops*>(nullptr));
    for (const auto& [op_name, make] : table)
      if (op_name == name) return make(op);
    throw internal_error("kiln: graph(): no op named " + std::string(name) + " in the registry");
  }
  std::vector<int> add_special(std::string name, bool effects, std::vector<int> inputs,
                               const std::vector<std::pair<kiln::dtype, kiln::shape>>& results,
                               described_op::labelled_graphs subgraphs = {}, std::string variable = {}) {
    return graph_.add_special(
        std::make_shared<const described_op>(std::move(name), effects, std::move(subgraphs), std::move(variable)),
        inputs, results);
  }
  std::vector<std::pair<kiln::dtype, kiln::shape>> output_specs() const {
    std::vector<std::pair<kiln::dtype, kiln::shape>> specs;
    for (int id : graph_.outputs()) specs.emplace_back(graph_.node_at(id).dtype(), graph_.node_at(id).shape());
    return specs;
  }
  std::shared_ptr<const graph> finish() { return std::make_shared<const graph>(std::move(graph_)); }

  basic_graph_writer* outer_;
  kiln::graph graph_;
  std::map<int, int> slots_;   // slot -> node
  std::map<std::pair<int, std::string>, int> views_;  // (slot, dims) -> its reshape node
  std::vector<int> captures_;  // the outer nodes this graph's capture placeholders stand for
};

}  // namespace typed
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE std::vector<tensor> described_op::run(std::span<const tensor* const>) const {
  throw unavailable_error("kiln: node " + name_ +
                          " of a typed trace's graph describes a step of the trace; call the function to run it");
}

KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> described_op::subgraphs() const {
  std::vector<std::pair<std::string, const graph*>> out;
  for (const auto& [label, g] : subgraphs_) out.emplace_back(label, g.get());
  return out;
}

KILN_LIBRARY_INLINE std::array<std::string_view, 0> described_op::op_names() { return {}; }

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY

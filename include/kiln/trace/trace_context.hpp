#pragma once
/// \file
/// The trace context: while a kiln::function traces its callable, every op that
/// meets a symbolic tensor is recorded here, as a node of the graph being built.
/// Contexts nest (a function traced while tracing another) through a per-thread stack.
/// A subgraph context (a branch of kiln::cond, a loop's condition or body) captures
/// the symbolic tensors of the traces around it as extra placeholders.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/shared_blocks.hpp"
#include "kiln/core/small_vector.hpp"
#include "kiln/core/symbol.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/graph/node_index.hpp"

namespace kiln::detail {

class trace_context {
 public:
  /// Starts tracing function `function_name` on this thread.
  KILN_LIBRARY_INLINE explicit trace_context(std::string function_name);
  /// Marks a subgraph trace: traces a branch or loop body inside the trace in progress.
  struct subgraph_t {};
  static constexpr subgraph_t subgraph{};
  KILN_LIBRARY_INLINE explicit trace_context(subgraph_t);
  trace_context(const trace_context&) = delete;
  trace_context& operator=(const trace_context&) = delete;
  KILN_LIBRARY_INLINE ~trace_context();

  /// The innermost trace in progress on this thread, or null.
  static trace_context* current() { return current_slot(); }
  /// Makes `c` the innermost trace of this thread and returns the one it replaces:
  /// kiln::init_scope suspends tracing with it.
  static trace_context* exchange_current(trace_context* c) { return std::exchange(current_slot(), c); }

  const std::string& function_name() const { return function_name_; }
  /// What the symbolic tensors of this trace carry as their `trace_id`.
  std::uint64_t id() const { return id_; }
  kiln::graph& graph() { return graph_; }

  /// A new argument of the function, as the symbolic tensor the callable receives.
  KILN_LIBRARY_INLINE tensor placeholder(const std::string& name, dtype t, const shape& s);

  /// The symbolic tensor standing for node `id` of this trace's graph.
  tensor symbolic(int id) {
    const node& n = graph_.node_at(id);
    // A Result node is named `while:1` already; another node's value is its output 0.
    return tensor(n.dtype(), n.shape(), symbols_.make(symbol{id_, id, n.name(), n.kind() == node_kind::result ? -1 : 0}));
  }

  /// Records special op `op` on `inputs`; returns one symbolic tensor per result.
  KILN_LIBRARY_INLINE std::vector<tensor> record_special(std::shared_ptr<const special_op> op,
                                                         std::span<const tensor> inputs,
                                                         const std::vector<std::pair<dtype, shape>>& results);

  /// Makes `t` an output of the graph (an Identity node) and returns that node.
  KILN_LIBRARY_INLINE const node& add_output(const tensor& t);

  /// The outer tensors this subgraph captured, one per placeholder after the ones
  /// the subgraph was given (in the order the subgraph first used them).
  const std::vector<tensor>& captures() const { return captures_; }

  /// Remembers a variable created while tracing, for the function to check that it
  /// outlives the trace (kiln::function allows singleton variables only).
  KILN_LIBRARY_INLINE void note_created_variable(std::weak_ptr<const void> handle);
  const std::vector<std::weak_ptr<const void>>& created_variables() const { return created_; }

  /// The node of this trace that `t` stands for: its own node when `t` is one of this
  /// trace's symbolic tensors, a captured constant when `t` is eager.
  KILN_LIBRARY_INLINE int node_of(const tensor& t);

  /// Copies the nodes of `g` (another function's trace) into this trace, its
  /// placeholders bound to nodes `args`; returns the nodes of its outputs.
  template <class = void>
  std::vector<int> inline_graph(const kiln::graph& g, std::span<const int> args) {
    std::vector<int> mapped(g.nodes().size(), -1);
    for (std::size_t i = 0; i < g.arguments().size(); ++i) mapped[std::size_t(g.arguments()[i])] = args[i];
    std::vector<int> outputs;
    for (std::size_t i = 0; i < g.nodes().size(); ++i) {
      const node& n = g.nodes()[i];
      switch (n.kind()) {
        case node_kind::placeholder: break;
        case node_kind::constant: mapped[i] = node_of(n.value()); break;
        case node_kind::identity:
          mapped[i] = mapped[std::size_t(n.input_ids()[0])];
          outputs.push_back(mapped[i]);
          break;
        case node_kind::op: {
          std::vector<int> ins;
          for (int in : n.input_ids()) ins.push_back(mapped[std::size_t(in)]);
          mapped[i] = graph_.add_op(n.operation(), ins, n.dtype(), n.shape());
          break;
        }
        case node_kind::special: {
          std::vector<int> ins;
          for (int in : n.input_ids()) ins.push_back(mapped[std::size_t(in)]);
          std::vector<int> ids = graph_.add_special_like(g, int(i), ins);
          for (std::size_t k = 0; k < ids.size(); ++k) mapped[i + k] = ids[k];
          break;
        }
        case node_kind::result: break;  // copied with its special node
      }
    }
    return outputs;
  }

  /// Records `op` applied to `inputs`, its result `dt` `sh`, and returns that
  /// symbolic result. Through a pointer that the constructor sets: every op function
  /// reaches this, and a program that never traces then compiles none of the graph
  /// building behind it.
  tensor record(ops::any_op op, std::span<const tensor* const> inputs, dtype dt, const shape& sh) {
    return record_(*this, std::move(op), inputs, dt, sh);
  }

 private:
  static KILN_LIBRARY_INLINE tensor record_op(trace_context& c, ops::any_op op, std::span<const tensor* const> inputs,
                                              dtype dt, const shape& sh);

  // Whether trace `trace_id` is one this subgraph sits in (up to its function's trace).
  KILN_LIBRARY_INLINE bool encloses(std::uint64_t trace_id) const;
  KILN_LIBRARY_INLINE int capture(const tensor& t);
  KILN_LIBRARY_INLINE trace_context& function_trace();

  static trace_context*& current_slot() {
    thread_local trace_context* current = nullptr;
    return current;
  }
  KILN_LIBRARY_INLINE static std::uint64_t next_id();

  std::uint64_t id_;
  std::string function_name_;
  trace_context* previous_;
  tensor (*record_)(trace_context&, ops::any_op, std::span<const tensor* const>, dtype, const shape&);
  kiln::graph graph_;
  node_index captured_;  ///< by buffer address: its constant node
  bool capturing_ = false;
  std::vector<tensor> captures_;
  std::vector<int> capture_ids_;
  std::vector<std::weak_ptr<const void>> created_;
  shared_blocks<symbol, 64> symbols_;  ///< the symbols of symbolic()
};

// Compiled once in a compiled kiln (KILN_LIBRARY_INLINE, kiln/config.hpp): every
// program that traces builds graphs with them.
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::vector<tensor> trace_context::record_special(std::shared_ptr<const special_op> op,
                                                                      std::span<const tensor> inputs,
                                                                      const std::vector<std::pair<dtype, shape>>& results) {
  std::vector<int> ids;
  for (const tensor& t : inputs) ids.push_back(node_of(t));
  std::vector<tensor> out;
  for (int id : graph_.add_special(std::move(op), ids, results)) out.push_back(symbolic(id));
  return out;
}

KILN_LIBRARY_INLINE int trace_context::node_of(const tensor& t) {
  if (!t.defined()) throw invalid_argument_error(function_name_ + ": an empty tensor was used while tracing");
  if (t.is_symbolic()) {
    if (t.symbol()->trace_id != id_ && capturing_ && encloses(t.symbol()->trace_id)) return capture(t);
    if (t.symbol()->trace_id != id_)
      throw type_error(function_name_ + ": the symbolic tensor " + value_name(*t.symbol()) +
                       " belongs to another trace; a symbolic tensor cannot be used outside the trace that made it "
                       "(return it from the function instead)");
    return t.symbol()->node;
  }
  // The same buffer seen as the same dtype and shape is one constant; found by its
  // address, so that a trace of n captured values costs n lookups, not n^2 / 2.
  // (The constant node holds the buffer, so its address cannot be reused by another.)
  const auto key = std::size_t(reinterpret_cast<std::uintptr_t>(t.raw_data()));
  int found = -1;
  captured_.for_each(key, [&](int id) {
    const tensor& known = graph_.node_at(id).value();
    if (known.shape() != t.shape() || known.dtype() != t.dtype()) return false;  // (the key is the address)
    found = id;
    return true;
  });
  if (found >= 0) return found;
  int id = graph_.add_constant(t);
  captured_.insert(key, id);
  return id;
}

KILN_LIBRARY_INLINE tensor trace_context::record_op(trace_context& c, ops::any_op op,
                                                    std::span<const tensor* const> inputs, dtype dt, const shape& sh) {
  small_vector<int, 4> ids;
  ids.reserve(inputs.size());
  for (const tensor* t : inputs) ids.emplace_back(c.node_of(*t));
  return c.symbolic(c.graph_.add_op(std::move(op), ids, dt, sh));
}

KILN_LIBRARY_INLINE int trace_context::capture(const tensor& t) {
  for (std::size_t k = 0; k < captures_.size(); ++k)
    if (same_value(*captures_[k].symbol(), *t.symbol())) return capture_ids_[k];
  int id = graph_.add_placeholder(node_name(*t.symbol()), t.dtype(), t.shape());
  captures_.push_back(t);
  capture_ids_.push_back(id);
  return id;
}
#endif

inline bool tracing() { return trace_context::current() != nullptr; }

}  // namespace kiln::detail

namespace kiln {

/// Lifts what runs in its scope out of the function being traced, as tf.init_scope:
/// ops run at once on eager tensors and variables change now, once, while tracing,
/// instead of becoming part of the graph. Outside a trace it changes nothing.
/// \code
/// struct model {
///   kiln::variable v{kiln::constant(0)};
///   bool initialized = false;
/// } m;
/// kiln::function f([&](const kiln::tensor& x) {
///   if (!m.initialized) {
///     kiln::init_scope lift;
///     m.initialized = true;
///     m.v.assign_add(1);  // runs once, while tracing
///   }
///   return x + m.v.read_value();
/// });
/// \endcode
class init_scope {
 public:
  init_scope() : suspended_(detail::trace_context::exchange_current(nullptr)) {}
  init_scope(const init_scope&) = delete;
  init_scope& operator=(const init_scope&) = delete;
  ~init_scope() { detail::trace_context::exchange_current(suspended_); }

 private:
  detail::trace_context* suspended_;
};

}  // namespace kiln

namespace kiln::detail {

[[noreturn]] inline void throw_outside_trace(std::string_view op) {
  throw type_error(std::string(op) +
                   ": a symbolic tensor was used outside the trace that made it; return it from the function instead");
}

template <class Op>
tensor record_symbolic(const Op& op, std::span<const tensor* const> inputs) {
  trace_context* trace = trace_context::current();
  if (!trace) throw_outside_trace(Op::name);
  auto [dt, sh] = infer(op, inputs, rule_errors::trace);
  return trace->record(ops::any_op(std::in_place_type<Op>, op), inputs, dt, sh);
}

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE trace_context::trace_context(std::string function_name)
    : id_(next_id()), function_name_(std::move(function_name)), previous_(current_slot()), record_(&record_op) {
  current_slot() = this;
}

KILN_LIBRARY_INLINE trace_context::trace_context(subgraph_t)
    : trace_context(current_slot() ? current_slot()->function_name_ : std::string()) {
  capturing_ = previous_ != nullptr;
}

KILN_LIBRARY_INLINE trace_context::~trace_context() { current_slot() = previous_; }

KILN_LIBRARY_INLINE tensor trace_context::placeholder(const std::string& name, dtype t, const shape& s) {
  return symbolic(graph_.add_placeholder(name, t, s));
}

KILN_LIBRARY_INLINE const node& trace_context::add_output(const tensor& t) {
  return graph_.node_at(graph_.add_output(node_of(t)));
}

KILN_LIBRARY_INLINE void trace_context::note_created_variable(std::weak_ptr<const void> handle) {
  function_trace().created_.push_back(std::move(handle));
}

KILN_LIBRARY_INLINE bool trace_context::encloses(std::uint64_t trace_id) const {
  for (const trace_context* c = previous_; c; c = c->previous_) {
    if (c->id_ == trace_id) return true;
    if (!c->capturing_) return false;
  }
  return false;
}

KILN_LIBRARY_INLINE trace_context& trace_context::function_trace() {
  trace_context* c = this;
  while (c->capturing_) c = c->previous_;
  return *c;
}

KILN_LIBRARY_INLINE std::uint64_t trace_context::next_id() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// Graph optimizations, run once per trace before planning: constant folding,
/// algebraic simplification (`x * 1`, `x + 0`, `-(-x)`, casts and reshapes that
/// change nothing) and common-subexpression elimination. Pruning of what no output
/// needs happens when the graph is planned (kiln/exec/executor.hpp).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kiln/eager/apply.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/graph/node_index.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail {

/// True when every element of the eager tensor `t` equals `v`.
template <class = void>
bool filled_with(const tensor& t, double v) {
  if (t.device() != device::cpu) return false;
  return visit_dtype(t.dtype(), [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      const T* p = t.data<T>();
      for (std::int64_t i = 0, n = t.size(); i < n; ++i)
        if (double(p[i]) != v) return false;
      return true;
    }
    return false;
  });
}

template <class = void>
class optimizer {
 public:
  explicit optimizer(const graph& in);

  /// The optimized graph, or nothing when it would be `in` node for node. Until a node
  /// changes, every node maps to itself, so the output is built only from the first
  /// change on (its nodes before that copied then): most traces change nothing, and a
  /// copy of a graph of 10^5 nodes made its optimization cost as much as its trace.
  std::optional<graph> run_if_changed();

 private:
  // The graph that ids before node `i` of in_ refer to: in_ itself until a node changed.
  const graph& view() const;

  // Builds out_ as the copy of in_'s nodes before `i`, all mapped to themselves.
  void build_before(std::size_t i);

  // Special ops are copied as they are: effects must not be folded or merged.
  void copy_special(std::size_t i);

  int rewrite(const node& n, std::size_t i);

  // Nodes that may be one: the same op on the same inputs (same_op then compares attributes).
  static std::size_t cse_key(std::size_t op_index, std::span<const int> ins);

  const node& at(int id) const;
  bool constant_filled(int id, double v) const;
  // The input can stand for the node itself: same dtype and shape, so no broadcast is lost.
  bool passes_through(const node& n, int input) const;

  /// The node `n` reduces to, or -1. (A test per op that simplifies, not a visit of
  /// every op: each source file that optimizes a graph compiles this.)
  int simplify(const node& n, std::span<const int> ins) const;

  /// A constant holding `n`'s value when all its inputs are constants, or -1. An op
  /// whose evaluation fails is left in the graph: it raises only if it runs.
  int fold_constant(const node& n, std::span<const int> ins, std::size_t i);

  const graph& in_;
  graph out_;
  std::vector<int> map_;
  bool built_ = false;  ///< whether out_ holds the output (a node changed)
  node_index seen_;     ///< cse_key -> node of the output
};

/// The optimized form of `g`: same arguments and outputs, fewer nodes.
template <class = void>
graph optimize(const graph& g) {
  std::optional<graph> changed = optimizer<>(g).run_if_changed();
  return changed ? std::move(*changed) : g;
}

/// The optimized form of `g`, or nothing when it is `g` itself (then `g` runs as it is,
/// without a copy).
template <class = void>
std::optional<graph> optimize_if_changed(const graph& g) {
  return optimizer<>(g).run_if_changed();
}

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
optimizer<Unused>::optimizer(const graph& in) : in_(in), map_(in.nodes().size(), -1) {
  seen_.reserve(in.nodes().size());
}

template <class Unused>
auto optimizer<Unused>::run_if_changed() -> std::optional<graph> {
  for (std::size_t i = 0; i < in_.nodes().size(); ++i) {
    const node& n = in_.nodes()[i];
    switch (n.kind()) {
      case node_kind::placeholder:
        map_[i] = built_ ? out_.add_placeholder(n.name(), n.dtype(), n.shape()) : int(i);
        break;
      case node_kind::constant:
        map_[i] = built_ ? out_.add_constant(n) : int(i);
        break;
      case node_kind::identity:
        map_[i] = built_ ? out_.add_output(map_[std::size_t(n.input_ids()[0])]) : int(i);
        break;
      case node_kind::op:
        map_[i] = rewrite(n, i);
        break;
      case node_kind::special:
        copy_special(i);
        break;
      case node_kind::result:
        break;  // copied with its special node
    }
  }
  if (!built_) return std::nullopt;
  return std::move(out_);
}

template <class Unused>
auto optimizer<Unused>::view() const -> const graph& {
  return built_ ? out_ : in_;
}

template <class Unused>
void optimizer<Unused>::build_before(std::size_t i) {
  built_ = true;
  out_.reserve(in_.nodes().size());
  for (std::size_t k = 0; k < i; ++k) {
    const node& n = in_.nodes()[k];
    switch (n.kind()) {
      case node_kind::placeholder:
        out_.add_placeholder(n.name(), n.dtype(), n.shape());
        break;
      case node_kind::constant:
        out_.add_constant(n);
        break;
      case node_kind::identity:
        out_.add_output(n.input_ids()[0]);
        break;
      case node_kind::op:
        out_.add_op(n.operation(), n.input_ids(), n.dtype(), n.shape());
        break;
      case node_kind::special:
        out_.add_special_like(in_, int(k), n.input_ids());
        break;
      case node_kind::result:
        break;
    }
  }
}

template <class Unused>
void optimizer<Unused>::copy_special(std::size_t i) {
  const node& n = in_.nodes()[i];
  if (!built_) {
    for (int k = 0; k < n.result_count(); ++k) map_[i + std::size_t(k)] = int(i) + k;
    return;
  }
  std::vector<int> ins;
  ins.reserve(n.input_ids().size());
  for (int in : n.input_ids()) ins.push_back(map_[std::size_t(in)]);
  std::vector<int> ids = out_.add_special_like(in_, int(i), ins);
  for (std::size_t k = 0; k < ids.size(); ++k) map_[i + k] = ids[k];
}

template <class Unused>
int optimizer<Unused>::rewrite(const node& n, std::size_t i) {
  // Until the output is built, every input maps to itself: no vector of mapped ids.
  std::vector<int> mapped;
  if (built_) {
    mapped.reserve(n.input_ids().size());
    for (int in : n.input_ids()) mapped.push_back(map_[std::size_t(in)]);
  }
  const std::span<const int> ins = built_ ? std::span<const int>(mapped) : n.input_ids();
  if (int same = simplify(n, ins); same >= 0) {
    if (!built_) build_before(i);
    return same;
  }
  if (int folded = fold_constant(n, ins, i); folded >= 0) return folded;
  const std::size_t key = cse_key(n.operation().index(), ins);
  int found = -1;
  seen_.for_each(key, [&](int id) {
    const node& other = view().node_at(id);
    if (!std::ranges::equal(other.input_ids(), ins) || !same_op(other.operation(), n.operation())) return false;
    found = id;
    return true;
  });
  if (found >= 0) {
    if (!built_) build_before(i);
    return found;
  }
  // (Each path that builds the output returned above: built_ is what it was on entry.)
  const int id = built_ ? out_.add_op(n.operation(), mapped, n.dtype(), n.shape()) : int(i);
  seen_.insert(key, id);
  return id;
}

template <class Unused>
std::size_t optimizer<Unused>::cse_key(std::size_t op_index, std::span<const int> ins) {
  std::size_t h = op_index * 0x9e3779b97f4a7c15ull;
  for (int in : ins) h = (h ^ std::size_t(std::uint32_t(in))) * 0x100000001b3ull;
  return h;
}

template <class Unused>
auto optimizer<Unused>::at(int id) const -> const node& {
  return view().node_at(id);
}

template <class Unused>
bool optimizer<Unused>::constant_filled(int id, double v) const {
  return at(id).kind() == node_kind::constant && filled_with(at(id).value(), v);
}

template <class Unused>
bool optimizer<Unused>::passes_through(const node& n, int input) const {
  return at(input).dtype() == n.dtype() && at(input).shape() == n.shape();
}

template <class Unused>
int optimizer<Unused>::simplify(const node& n, std::span<const int> ins) const {
  const ops::any_op& op = n.operation();
  auto keep_if = [&](int id) { return passes_through(n, id) ? id : -1; };
  if (ops::holds_alternative<ops::multiply>(op)) {
    if (constant_filled(ins[1], 1)) return keep_if(ins[0]);
    if (constant_filled(ins[0], 1)) return keep_if(ins[1]);
  } else if (ops::holds_alternative<ops::add>(op)) {
    if (constant_filled(ins[1], 0)) return keep_if(ins[0]);
    if (constant_filled(ins[0], 0)) return keep_if(ins[1]);
  } else if (ops::holds_alternative<ops::subtract>(op)) {
    if (constant_filled(ins[1], 0)) return keep_if(ins[0]);
  } else if (ops::holds_alternative<ops::divide>(op)) {
    if (constant_filled(ins[1], 1)) return keep_if(ins[0]);
  } else if (ops::holds_alternative<ops::negate>(op)) {
    const node& inner = at(ins[0]);
    if (inner.kind() == node_kind::op && ops::holds_alternative<ops::negate>(inner.operation()))
      return keep_if(inner.input_ids()[0]);
  } else if (ops::holds_alternative<ops::cast>(op) || ops::holds_alternative<ops::reshape>(op)) {
    return keep_if(ins[0]);
  }
  return -1;
}

template <class Unused>
int optimizer<Unused>::fold_constant(const node& n, std::span<const int> ins, std::size_t i) {
  std::vector<const tensor*> values;
  for (int in : ins) {
    if (at(in).kind() != node_kind::constant) return -1;
    values.push_back(&at(in).value());
  }
  if (ins.empty()) return -1;
  try {
    tensor v = execute_any(n.operation(), values);
    if (!built_) build_before(i);
    return out_.add_constant(v);
  } catch (const error&) {
    return -1;
  }
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

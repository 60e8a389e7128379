#pragma once
/// \file
/// Expression templates of the compile-time tier. An elementwise op on typed values
/// builds a `node` whose type carries the op, the element type and the dims its
/// constexpr rules give (a rule that fails is a `static_assert` naming the op and
/// both shapes); `evaluate` runs a whole expression as one loop over the result, a
/// SIMD batch at a time through the op's own functor, so each element gets the bits
/// that the eager kiln::tensor kernels give it.
///
/// Operands read their elements at (row, col) of the result: `row` counts the
/// result's rows (all dims but the last), `col` runs along its last dim. Leaves are
/// data pointers (eager), slots of a trace's frame (traced arguments and results),
/// or values (constants); `broadcast` maps the result's (row, col) to an operand of
/// other dims.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/simd.hpp"

#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/typed/fixed.hpp"

namespace kiln {

namespace typed {
template <class>
inline constexpr bool always_false = false;
}  // namespace typed

/// Base of the compile-time tier's symbolic values and expressions: it puts namespace
/// kiln among their associated namespaces, where their operators are.
struct typed_expression {
  /// A symbolic value has no truth value while tracing.
  template <class U = void>
  explicit operator bool() const {
    static_assert(typed::always_false<U>,
                  "kiln: a symbolic typed value cannot be converted to bool while tracing; use kiln::cond or "
                  "kiln::while_loop for conditions on values, or a C++ `if` on C++ values");
    return false;
  }
};

namespace typed {

/// The data of a trace's values by slot: its arguments, then the results of its steps.
/// Eager evaluation has none.
using frame = void* const*;

struct cond_step;
struct loop_step;

/// Where the steps of a typed trace describe themselves, for
/// concrete_function::graph(): kiln/typed/graph.hpp implements it with a kiln::graph.
/// Every step can describe itself, in every program, so that a step type means the
/// same in each file of a program; what builds the graph comes with the runtime tier.
class description_sink {
 public:
  /// The node holding slot `slot`'s value, read with dims `dims` (in a branch or loop
  /// body, a placeholder for a value from outside, which becomes an input of the node
  /// that runs it; a reshape node where the slot is read with other dims).
  virtual int value(int slot, std::span<const std::int64_t> dims) = 0;
  /// Slot `slot` holds the value of node `node` from here on.
  virtual void bind(int slot, int node) = 0;
  /// A node of the registry op named `name`, at `op`, whose value has element type
  /// `t` and dims `dims`.
  virtual int op(std::string_view name, const void* op, std::span<const int> inputs, kiln::dtype t,
                 std::span<const std::int64_t> dims) = 0;
  /// A constant node holding a copy of the elements at `data`.
  virtual int constant(kiln::dtype t, std::span<const std::int64_t> dims, const void* data) = 0;
  /// A node with effects (a print, a callback, a variable's read or write); the nodes
  /// of its results. `variable` names the variable it reads or writes, if any.
  virtual std::vector<int> effect(std::string_view name, std::string_view variable, bool writes,
                                  std::vector<int> inputs,
                                  const std::vector<std::pair<kiln::dtype, kiln::shape>>& results) = 0;
  /// A conditional or a loop, with its branches or condition and body.
  virtual void control_flow(const cond_step& c) = 0;
  virtual void control_flow(const loop_step& l) = 0;

 protected:
  ~description_sink() = default;
};

/// Whether `T` has SIMD batches: the CPU kernels' rule, so that an expression runs on
/// batches exactly where the kernels do.
template <class T>
inline constexpr bool simd_type = backend::cpu::simd_type<T>;

template <class T>
using batch = xsimd::batch<T>;

// ---- leaves ------------------------------------------------------------------------

// Besides `load` and `partial`, every expression has `load_chained` and
// `partial_chained`, which read the value `prev` (of the batch or element type `P`)
// instead of slot `slot`'s, and `visit_slots`, which tells the slots it reads and
// whether through a broadcast. An evaluation chain (kiln/typed/trace.hpp) runs the
// assignments of a rebinding loop one batch at a time, each reading the one before
// from a register. A leaf that reads no slot reads as it always does:
#define KILN_TYPED_LEAF_WITHOUT_SLOTS                                                              \
  template <class V, class P>                                                                     \
  V load_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {              \
    return this->template load<V>(f, row, col);                                                   \
  }                                                                                               \
  template <class V, std::int64_t Count, class P>                                                 \
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {           \
    return this->template partial<V, Count>(f, row, col);                                         \
  }                                                                                               \
  template <class F>                                                                              \
  void visit_slots(F&&, bool) const {}

/// Elements at a data pointer, laid out as `D` (eager operands).
template <class T, class D>
struct data_leaf : typed_expression {
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;
  const T* p;

  template <class V>
  V load(frame, std::int64_t row, std::int64_t col) const {
    if constexpr (std::is_same_v<V, T>)
      return p[row * D::inner + col];
    else
      return V::load_unaligned(p + row * D::inner + col);
  }
  template <class V, std::int64_t Count>
  V partial(frame, std::int64_t row, std::int64_t col) const {
    // Every element goes through the batch functor, wherever it sits, as in the CPU
    // kernels. Floats pad with zeros, one masked load; integers with copies of the
    // last element, so that no padding lane divides by zero.
    if constexpr (std::is_floating_point_v<T>)
      return backend::cpu::load_partial(p + row * D::inner + col, Count);
    else
      return backend::cpu::load_padded(p + row * D::inner + col, Count);
  }
  int describe(description_sink& sink) const { return sink.constant(dtype_of<T>, D::values, p); }
  KILN_TYPED_LEAF_WITHOUT_SLOTS
};

/// Elements of slot `index` of the frame, laid out as `D` (traced values).
template <class T, class D>
struct slot_leaf : typed_expression {
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;
  int index;

  const T* at(frame f) const { return static_cast<const T*>(f[index]); }
  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, at(f)}.template load<V>(f, row, col);
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, at(f)}.template partial<V, Count>(f, row, col);
  }
  int describe(description_sink& sink) const { return sink.value(index, D::values); }
  template <class V, class P>
  V load_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    if constexpr (std::is_same_v<V, P>) {
      if (index == slot) return prev;
    }
    return load<V>(f, row, col);
  }
  template <class V, std::int64_t Count, class P>
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    if constexpr (std::is_same_v<V, P>) {
      if (index == slot) return prev;
    }
    return partial<V, Count>(f, row, col);
  }
  template <class F>
  void visit_slots(F&& visit, bool broadcast) const {
    visit(index, broadcast);
  }
};

/// A C++ scalar, converted to the other operand's element type.
template <class T>
struct scalar_leaf : typed_expression {
  using value_type = T;
  using dims_type = dims<>;
  static constexpr bool simd = simd_type<T>;
  T value;

  template <class V>
  V load(frame, std::int64_t, std::int64_t) const {
    return V(value);
  }
  template <class V, std::int64_t Count>
  V partial(frame, std::int64_t, std::int64_t) const {
    return V(value);
  }
  int describe(description_sink& sink) const { return sink.constant(dtype_of<T>, {}, &value); }
  KILN_TYPED_LEAF_WITHOUT_SLOTS
};

/// A `fixed` captured by a trace, kept by value (shared, so copies of the expression
/// that holds it are cheap).
template <class T, class D>
struct constant_leaf : typed_expression {
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;
  std::shared_ptr<const fixed_t<T, D>> value;

  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, value->data()}.template load<V>(f, row, col);
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, value->data()}.template partial<V, Count>(f, row, col);
  }
  int describe(description_sink& sink) const { return sink.constant(dtype_of<T>, D::values, value->data()); }
  KILN_TYPED_LEAF_WITHOUT_SLOTS
};

#undef KILN_TYPED_LEAF_WITHOUT_SLOTS

// ---- broadcasting ------------------------------------------------------------------

/// Operand `E` read as dims `Out` (NumPy broadcasting, dims aligned on the right).
template <class E, class Out>
struct broadcast : typed_expression {
  using value_type = typename E::value_type;
  using dims_type = Out;
  using in_dims = typename E::dims_type;
  static constexpr bool simd = E::simd;
  /// Whether `E` repeats one value along the result's last dim.
  static constexpr bool splat_cols = in_dims::inner == 1 && Out::inner > 1;
  E operand;

  /// `E`'s row for the result's `row`.
  static std::int64_t map_row(std::int64_t row) {
    constexpr int ro = Out::rank, re = in_dims::rank;
    if constexpr (re <= 1) {
      return 0;
    } else {
      std::int64_t in_row = 0, in_stride = 1;
      // Walk the result's row dims from the last (dim ro - 2) to the first.
      for (int d = ro - 2; d >= 0; --d) {
        const std::int64_t size = Out::values[std::size_t(d)], index = row % size;
        row /= size;
        const int e = d - (ro - re);
        if (e < 0) break;
        const std::int64_t in_size = in_dims::values[std::size_t(e)];
        if (in_size != 1) in_row += index * in_stride;
        in_stride *= in_size;
      }
      return in_row;
    }
  }
  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    if constexpr (splat_cols) {
      if constexpr (std::is_same_v<V, value_type>)
        return operand.template load<V>(f, map_row(row), 0);
      else
        return V(first_lane(operand.template partial<V, 1>(f, map_row(row), 0)));
    } else {
      return operand.template load<V>(f, map_row(row), col);
    }
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    if constexpr (splat_cols)
      return load<V>(f, row, col);
    else
      return operand.template partial<V, Count>(f, map_row(row), col);
  }
  /// Broadcasting is implicit in a graph, as in the runtime tier's.
  int describe(description_sink& sink) const { return operand.describe(sink); }
  /// A broadcast operand reads other elements than (row, col), so it never reads a
  /// chained value (an evaluation chain does not take an expression that would).
  template <class V, class P>
  V load_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {
    return load<V>(f, row, col);
  }
  template <class V, std::int64_t Count, class P>
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {
    return partial<V, Count>(f, row, col);
  }
  template <class F>
  void visit_slots(F&& visit, bool) const {
    operand.visit_slots(visit, true);
  }

 private:
  template <class V>
  static value_type first_lane(const V& v) {
    alignas(64) std::array<value_type, V::size> lanes;
    v.store_aligned(lanes.data());
    return lanes[0];
  }
};

/// `E` as an operand of a result of dims `Out`: itself, or broadcast.
template <class E, class Out>
using operand_as = std::conditional_t<std::is_same_v<typename E::dims_type, Out>, E, broadcast<E, Out>>;

template <class Out, class E>
operand_as<E, Out> broadcast_to(const E& e) {
  if constexpr (std::is_same_v<typename E::dims_type, Out>)
    return e;
  else
    return broadcast<E, Out>{{}, e};
}

// ---- the rules, at compile time ------------------------------------------------------

/// `Op`'s rules applied at compile time to operands of element types `T...` and
/// dims `D...` (each `X` a typed operand type): `op` is `Made::op`.
template <class Made, class... X>
struct op_rule {
  static constexpr dtype_result dtypes = Made::op.result_dtype(std::array<kiln::dtype, sizeof...(X)>{dtype_of<typename X::value_type>...});
  static constexpr shape_result shapes = Made::op.result_shape(std::array<kiln::shape, sizeof...(X)>{X::dims_type::shape()...});
  static constexpr kiln::shape value = shapes.value;
};

/// A default-constructed op, for op_rule.
template <class Op>
struct made {
  static constexpr Op op{};
};

/// What a typed op gives when its rules reject its operands, after the op's
/// `static_assert` has said why (naming the op), so that nothing else is reported.
struct rule_error {};

// ---- elementwise nodes ------------------------------------------------------------------

/// Elementwise `Op` on operands of dims `D` (already broadcast to it).
template <class Op, class D, class... E>
struct node : typed_expression {
  /// The operands' element type (for `where`, its branches').
  using input_type = typename std::tuple_element_t<ops::value_operand<Op>, std::tuple<E...>>::value_type;
  using value_type = element_t<op_rule<made<Op>, E...>::dtypes.value>;
  using dims_type = D;
  /// Batches throughout when the CPU kernel of this op would use them (one input
  /// type, the same output type, at most two operands) and every operand does.
  static constexpr bool simd = backend::cpu::simd_kernel<Op, input_type, value_type> && (E::simd && ...);
  Op op;
  std::tuple<E...> operands;

  /// An expression's type changes with each op, so a variable holding one cannot be
  /// rebound; a symbolic value can.
  template <class Other>
  node& operator=(const Other&) {
    static_assert(always_false<Other>,
                  "kiln: this variable holds an expression, whose type changes with every op, so it cannot be "
                  "reassigned; declare it with the argument's type (`decltype(x) y = x * 2.f;`) or start it from "
                  "a symbolic value (`auto y = x;`)");
    return *this;
  }

  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    if constexpr (std::is_same_v<V, value_type>)
      return std::apply([&](const auto&... e) { return apply_scalar(e.template load<typename std::remove_cvref_t<decltype(e)>::value_type>(f, row, col)...); }, operands);
    else
      return std::apply([&](const auto&... e) { return op(e.template load<V>(f, row, col)...); }, operands);
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    return std::apply([&](const auto&... e) { return op(e.template partial<V, Count>(f, row, col)...); }, operands);
  }
  template <class V, class P>
  V load_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    if constexpr (std::is_same_v<V, value_type>)
      return std::apply([&](const auto&... e) { return apply_scalar(e.template load_chained<typename std::remove_cvref_t<decltype(e)>::value_type>(f, row, col, slot, prev)...); }, operands);
    else
      return std::apply([&](const auto&... e) { return op(e.template load_chained<V>(f, row, col, slot, prev)...); }, operands);
  }
  template <class V, std::int64_t Count, class P>
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    return std::apply([&](const auto&... e) { return op(e.template partial_chained<V, Count>(f, row, col, slot, prev)...); }, operands);
  }
  template <class F>
  void visit_slots(F&& visit, bool broadcast) const {
    std::apply([&](const auto&... e) { (e.visit_slots(visit, broadcast), ...); }, operands);
  }
  /// Adds the operands' nodes, left to right, then this op's.
  int describe(description_sink& sink) const { return describe(sink, std::index_sequence_for<E...>()); }

 private:
  template <class... A>
  value_type apply_scalar(const A&... a) const {
    return math::convert<value_type>(op(a...));
  }
  template <std::size_t... I>
  int describe(description_sink& sink, std::index_sequence<I...>) const {
    const int inputs[] = {std::get<I>(operands).describe(sink)...};  // braces: left to right
    // A typed cast carries its target in its type; the registry knows it as ops::cast.
    using registry_op = std::conditional_t<std::is_base_of_v<ops::cast, Op>, ops::cast, Op>;
    return sink.op(registry_op::name, static_cast<const registry_op*>(&op), inputs, dtype_of<value_type>, D::values);
  }
};

/// Writes expression `e` (dims `D`) to `out`, reading slots from `f`. (`out` is
/// restrict: stores to it do not change the frame, so a loop reads each slot's
/// pointer once. Flattened: past a few dozen nodes GCC left the operands' calls out of
/// line, and a 50-op chain ran at half speed.)
template <class E>
KILN_FLATTEN void evaluate(const E& e, frame f, typename E::value_type* KILN_RESTRICT out) {
  using T = typename E::value_type;
  using D = typename E::dims_type;
  constexpr std::int64_t inner = D::inner, rows = D::size / inner;
  if constexpr (E::simd) {
    using B = batch<T>;
    constexpr std::int64_t w = B::size;
    for (std::int64_t row = 0; row < rows; ++row) {
      T* o = out + row * inner;
      std::int64_t col = 0;
      for (; col + w <= inner; col += w) e.template load<B>(f, row, col).store_unaligned(o + col);
      if constexpr (inner % w != 0) backend::cpu::store_partial(e.template partial<B, inner % w>(f, row, col), o + col, inner % w);
    }
  } else {
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < inner; ++col) out[row * inner + col] = e.template load<T>(f, row, col);
  }
}

/// One assignment of an evaluation chain: expression `expression` written to slot `out`.
template <class E>
struct chain_link {
  E expression;
  int out;
};

/// Evaluates `links` (at least one) as `evaluate` would one after the other, but one
/// batch position at a time: each link's value is stored to its slot and handed to the
/// next link in a register, in place of the slot the link before wrote. The links
/// write distinct slots that no earlier link reads, and none reads a slot the chain
/// writes through a broadcast (the recorder checks both), so every value a link reads
/// at a position is there already.
template <class E>
KILN_FLATTEN void evaluate_chain(std::span<const chain_link<E>> links, frame f) {
  using T = typename E::value_type;
  using D = typename E::dims_type;
  constexpr std::int64_t inner = D::inner, rows = D::size / inner;
  const std::size_t n = links.size();
  auto at = [&](std::size_t k, std::int64_t row, std::int64_t col) { return static_cast<T*>(f[links[k].out]) + row * inner + col; };
  if constexpr (E::simd) {
    using B = batch<T>;
    constexpr std::int64_t w = B::size;
    for (std::int64_t row = 0; row < rows; ++row) {
      std::int64_t col = 0;
      for (; col + w <= inner; col += w) {
        B v = links[0].expression.template load<B>(f, row, col);
        v.store_unaligned(at(0, row, col));
        for (std::size_t k = 1; k < n; ++k) {
          v = links[k].expression.template load_chained<B>(f, row, col, links[k - 1].out, v);
          v.store_unaligned(at(k, row, col));
        }
      }
      if constexpr (inner % w != 0) {
        constexpr std::int64_t tail = inner % w;
        B v = links[0].expression.template partial<B, tail>(f, row, col);
        backend::cpu::store_partial(v, at(0, row, col), tail);
        for (std::size_t k = 1; k < n; ++k) {
          v = links[k].expression.template partial_chained<B, tail>(f, row, col, links[k - 1].out, v);
          backend::cpu::store_partial(v, at(k, row, col), tail);
        }
      }
    }
  } else {
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < inner; ++col) {
        T v = links[0].expression.template load<T>(f, row, col);
        *at(0, row, col) = v;
        for (std::size_t k = 1; k < n; ++k) *at(k, row, col) = v = links[k].expression.template load_chained<T>(f, row, col, links[k - 1].out, v);
      }
  }
}

/// The `fixed` value of expression `e`, reading slots from `f` (none when eager).
template <class E>
fixed_t<typename E::value_type, typename E::dims_type> materialize(const E& e, frame f = nullptr) {
  fixed_t<typename E::value_type, typename E::dims_type> out(uninitialized);
  evaluate(e, f, out.data());
  return out;
}

/// The node of `op` on expressions `e...` (a `rule_error` when its rules reject them).
template <class Op, class... E>
auto make_node(const Op& op, const E&... e) {
  using rule = op_rule<made<Op>, E...>;
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return rule_error{};
  } else {
    using D = dims_from<rule>;
    return node<Op, D, operand_as<E, D>...>{{}, op, {broadcast_to<D>(e)...}};
  }
}

}  // namespace typed
}  // namespace kiln

#pragma once
/// \file
/// The elementwise ops on typed values, from the op library's definitions
/// (kiln/ops/elementwise.hpp): the same rules, the same functors. On `fixed` values
/// an op computes at once and gives a `fixed`; on a trace's symbolic values it gives
/// an expression, fused with its neighbours until something needs its value.

#include <concepts>
#include <memory>
#include <type_traits>

#include "kiln/ops/activations.hpp"
#include "kiln/ops/op_list.hpp"
#include "kiln/typed/expr.hpp"

namespace kiln {
namespace typed {

/// Whether an op on `X...` (typed operands and C++ scalars) computes at once.
template <class... X>
inline constexpr bool eager = ((!lazy<X>) && ...);

/// The element type of a typed operand.
template <class X>
struct element_of {
  using type = void;
};
template <operand X>
struct element_of<X> {
  using type = typename std::remove_cvref_t<X>::value_type;
};

/// The element type a C++ scalar among `X...` is converted to: the first typed
/// operand's (for `where`, the first branch's).
template <class... X>
struct promoted {
  using type = void;
};
template <class X, class... Rest>
struct promoted<X, Rest...> {
  using type = std::conditional_t<operand<X>, typename element_of<X>::type, typename promoted<Rest...>::type>;
};

/// Operand `x` of an op as an expression: a `fixed` is read where it is (eager) or
/// kept by value (captured by a trace), a C++ scalar becomes a `T`, an expression is
/// itself (a reference: the caller copies it where it keeps it).
template <class T, bool Eager, class X>
decltype(auto) expression_of(const X& x) {
  using V = std::remove_cvref_t<X>;
  if constexpr (fixed_value<V>) {
    using D = typename V::dims_type;
    if constexpr (Eager)
      return data_leaf<typename V::value_type, D>{{}, x.data()};
    else
      return constant_leaf<typename V::value_type, D>{{}, std::make_shared<const V>(x)};
  } else if constexpr (lazy<V>) {
    if constexpr (requires { x.expression(); })
      return x.expression();
    else
      return x;
  } else {
    return scalar_leaf<T>{{}, T(x)};
  }
}

/// ops::cast to `T`, with the target in its type, where the rules read it.
template <class T>
struct cast_to : ops::cast {
  constexpr cast_to() : ops::cast(dtype_of<T>) {}
};

/// `op` on typed operands and C++ scalars (converted to `T`): a `fixed` now, or an
/// expression.
template <class T, class Op, class... X>
auto apply_as(const Op& op, const X&... x) {
  constexpr bool now = eager<X...>;
  auto e = make_node(op, expression_of<T, now>(x)...);
  if constexpr (now && !std::is_same_v<decltype(e), rule_error>)
    return materialize(e);
  else
    return e;  // an expression, or the rule_error after the op's static_assert
}

template <class Op, class... X>
auto apply(const Op& op, const X&... x) {
  return apply_as<typename promoted<X...>::type>(op, x...);
}

/// The expression type of operand `X` (C++ scalars as `T`).
template <class T, class X>
using expression_t = std::remove_cvref_t<decltype(expression_of<T, true>(std::declval<const X&>()))>;

/// `Op`'s rules on operands `X...`, C++ scalars converted to `T`.
template <class T, class Op, class... X>
using rule_for = op_rule<made<Op>, expression_t<T, X>...>;

}  // namespace typed

// A typed op checks its operands with static_asserts whose messages name it (the
// first error line g++ prints); the operands' types, and so their dims, are in the
// "In instantiation of" lines just above.
#define KILN_TYPED_CHECKS(fn, rule, what)                                                          \
  static_assert(rule::dtypes.ok(), "kiln::" #fn ": the operands' element types are not ones this op takes"); \
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::" #fn ": " what)

namespace typed {

}  // namespace typed

/// Ops between a typed operand and a C++ scalar or another typed operand.
template <class X, class Y>
concept typed_operands = (typed::operand<X> && (typed::operand<Y> || std::is_arithmetic_v<Y>)) ||
                         (std::is_arithmetic_v<X> && typed::operand<Y>);

#define KILN_TYPED_UNARY(fn, op)                                                                     \
  template <typed::operand X>                                                                        \
  auto fn(const X& x) {                                                                              \
    using rule = typed::rule_for<void, ops::op, X>;                                                  \
    KILN_TYPED_CHECKS(fn, rule, "");                                                                 \
    return typed::apply(ops::op{}, x);                                                               \
  }
#define KILN_TYPED_BINARY(fn, op)                                                                    \
  template <class X, class Y>                                                                        \
    requires typed_operands<X, Y>                                                                    \
  auto fn(const X& x, const Y& y) {                                                                  \
    using rule = typed::rule_for<typename typed::promoted<X, Y>::type, ops::op, X, Y>;               \
    KILN_TYPED_CHECKS(fn, rule, "the operands' shapes do not broadcast");                            \
    return typed::apply(ops::op{}, x, y);                                                            \
  }

// The functions of the one op list (kiln/ops/op_list.hpp, where they are documented).
KILN_UNARY_FUNCTIONS(KILN_TYPED_UNARY)
KILN_BINARY_FUNCTIONS(KILN_TYPED_BINARY)
#undef KILN_TYPED_UNARY
#undef KILN_TYPED_BINARY
#undef KILN_TYPED_CHECKS

/// `kiln::gelu(x, approximate)` on a typed operand.
template <typed::operand X>
auto gelu(const X& x, bool approximate = false) {
  using rule = typed::rule_for<void, ops::gelu, X>;
  static_assert(rule::dtypes.ok(), "kiln::gelu: the operand's element type must be float or double");
  return typed::apply(ops::gelu(approximate), x);
}
/// `kiln::elu(x, alpha)` on a typed operand.
template <typed::operand X>
auto elu(const X& x, double alpha = 1.0) {
  using rule = typed::rule_for<void, ops::elu, X>;
  static_assert(rule::dtypes.ok(), "kiln::elu: the operand's element type must be float or double");
  return typed::apply(ops::elu(alpha), x);
}
/// `kiln::leaky_relu(x, alpha)` on a typed operand.
template <typed::operand X>
auto leaky_relu(const X& x, double alpha = 0.3) {
  using rule = typed::rule_for<void, ops::leaky_relu, X>;
  static_assert(rule::dtypes.ok(), "kiln::leaky_relu: the operand's element type must be float or double");
  return typed::apply(ops::leaky_relu(alpha), x);
}

/// `kiln::where(x > 0.f, x, 0.f)` on typed operands: `a` where `cond` holds, else `b`.
template <typed::operand C, class A, class B>
  requires(typed::operand<A> || typed::operand<B>)
auto where(const C& cond, const A& a, const B& b) {
  using T = typename typed::promoted<A, B>::type;
  using rule = typed::rule_for<T, ops::where, C, A, B>;
  static_assert(rule::dtypes.ok(), "kiln::where: the condition must hold bools and both branches one element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::where: the operands' shapes do not broadcast");
  return typed::apply_as<T>(ops::where{}, cond, a, b);
}

/// `kiln::cast<double>(x)`: a typed operand's elements converted to `T`.
template <class T, typed::operand X>
auto cast(const X& x) {
  static_assert(typed::element_type<T>, "kiln::cast: the target type must be bool, std::int32_t, std::int64_t, float or double");
  return typed::apply(typed::cast_to<T>{}, x);
}

template <typed::operand X>
auto operator-(const X& x) {
  return negative(x);
}

#define KILN_TYPED_OPERATOR(sym, fn)                                                   \
  template <class X, class Y>                                                          \
    requires typed_operands<X, Y>                                                      \
  auto operator sym(const X& x, const Y& y) {                                          \
    return fn(x, y);                                                                   \
  }
KILN_OPERATORS(KILN_TYPED_OPERATOR)
#undef KILN_TYPED_OPERATOR

}  // namespace kiln

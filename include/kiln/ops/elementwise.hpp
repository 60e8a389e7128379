#pragma once
/// \file
/// Elementwise ops: one functor each, written once in kiln::math so that it runs
/// on scalars, xsimd batches and in Thrust device code; NumPy broadcasting; C++
/// scalars promoted to the tensor operand's dtype.

#include <span>
#include <string>
#include <vector>

#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/op.hpp"
#include "kiln/ops/op_list.hpp"

namespace kiln::ops {

using dtypes::all;
using dtypes::floating;
using dtypes::numeric;
inline constexpr dtype_set numeric_and_string = numeric | dtype_set{string};
inline constexpr dtype_set logical{bool_};

// ---- unary ------------------------------------------------------------------
struct negate : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "neg";
  static constexpr std::string_view onnx_name = "Neg";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::neg(a); }
  template <class G> void gradient(G& g) const { g.give(0, -g.dy()); }
};
struct abs : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "abs";
  static constexpr std::string_view onnx_name = "Abs";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::abs(a); }
  /// dy * sign(x), 0 at 0 as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct exp : elementwise_op<1, floating> {
  static constexpr std::string_view name = "exp";
  static constexpr std::string_view onnx_name = "Exp";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::exp(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * g.y()); }
};
struct log : elementwise_op<1, floating> {
  static constexpr std::string_view name = "log";
  static constexpr std::string_view onnx_name = "Log";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::log(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() / g.x(0)); }
};
struct sqrt : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sqrt";
  static constexpr std::string_view onnx_name = "Sqrt";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::sqrt(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * 0.5 / g.y()); }
};
struct square : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "square";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::mul(a, a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (2.0 * g.x(0))); }
};
struct tanh : elementwise_op<1, floating> {
  static constexpr std::string_view name = "tanh";
  static constexpr std::string_view onnx_name = "Tanh";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::tanh(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (1.0 - g.y() * g.y())); }
};
struct sigmoid : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sigmoid";
  static constexpr std::string_view onnx_name = "Sigmoid";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return T(1) / (T(1) + math::exp(math::neg(a))); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (g.y() * (1.0 - g.y()))); }
};
struct relu : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu";
  static constexpr std::string_view onnx_name = "Relu";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::max(a, T(0)); }
  /// dy where the result is positive, as TensorFlow's ReluGrad.
  template <class G> void gradient(G& g) const;
};
struct logical_not : elementwise_op<1, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_not";
  static constexpr std::string_view onnx_name = "Not";
  KILN_HOST_DEVICE bool operator()(bool a) const { return !a; }
};
/// Converts to `to`; the kernels' element conversion (math::convert) does the work.
struct cast : elementwise_op<1, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "cast";
  static constexpr std::string_view onnx_name = "Cast";
  static constexpr bool converts = true;
  dtype to = float32;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"to", &cast::to}}; }
  constexpr cast() = default;
  constexpr explicit cast(dtype target) : to(target) {}
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if ((in[0] == string) != (to == string)) return {to, "cannot cast between string and other dtypes"};
    return {to};
  }
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return a; }
  constexpr bool operator==(const cast&) const = default;
  /// Between floating-point dtypes only: an integer path has no gradient.
  template <class G> void gradient(G& g) const {
    if (is_floating(g.x(0).t.dtype()) && is_floating(to)) g.give(0, G::run(cast(g.x(0).t.dtype()), g.dy()));
  }
};

// ---- binary -----------------------------------------------------------------
struct add : elementwise_op<2, numeric_and_string, result_rule::same, numeric> {
  static constexpr std::string_view name = "add";
  static constexpr std::string_view onnx_name = "Add";
  template <class T> KILN_HOST_DEVICE T operator()(const T& a, const T& b) const {
    if constexpr (std::is_same_v<T, std::string>)
      return a + b;
    else
      return math::add(a, b);
  }
  template <class G> void gradient(G& g) const { g.give(0, g.dy()), g.give(1, g.dy()); }
};
struct subtract : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "sub";
  static constexpr std::string_view onnx_name = "Sub";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::sub(a, b); }
  template <class G> void gradient(G& g) const {
    g.give(0, g.dy());
    if (g.needs(1)) g.give(1, -g.dy());
  }
};
struct multiply : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "mul";
  static constexpr std::string_view onnx_name = "Mul";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::mul(a, b); }
  template <class G> void gradient(G& g) const {
    if (g.needs(0)) g.give(0, g.dy() * g.x(1));
    if (g.needs(1)) g.give(1, g.x(0) * g.dy());
  }
};
/// True division: integers divide as float64, as TensorFlow's `/`.
struct divide : elementwise_op<2, numeric, result_rule::true_division> {
  static constexpr std::string_view name = "truediv";
  static constexpr std::string_view onnx_name = "Div";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return double(a) / double(b);
    else
      return a / b;
  }
  template <class G> void gradient(G& g) const {
    if (g.needs(0)) g.give(0, g.dy() / g.x(1));
    if (g.needs(1)) g.give(1, g.dy() * (-g.x(0) / g.x(1) / g.x(1)));
  }
};
struct floordiv : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "floordiv";
  static constexpr bool integer_divisor = true;  // an integer divisor of 0 is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::floordiv(a, b); }
};
struct floormod : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "floormod";
  static constexpr bool integer_divisor = true;
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::floormod(a, b); }
  /// As TensorFlow: dy for the dividend, -dy * floor(x / y) for the divisor.
  template <class G> void gradient(G& g) const;
};
struct pow : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "pow";
  static constexpr std::string_view onnx_name = "Pow";
  static constexpr bool integer_exponent = true;  // a negative integer exponent is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::pow(a, b); }
  /// As TensorFlow: the exponent's gradient is 0 where the base is not positive.
  template <class G> void gradient(G& g) const;
};
struct maximum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "maximum";
  static constexpr std::string_view onnx_name = "Max";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::max(a, b); }
  /// dy goes to the first operand where it is the larger or they tie (the one the
  /// result is), as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct minimum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "minimum";
  static constexpr std::string_view onnx_name = "Min";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::min(a, b); }
  template <class G> void gradient(G& g) const;
};
struct less : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less";
  static constexpr std::string_view onnx_name = "Less";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a < b; }
};
struct less_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less_equal";
  static constexpr std::string_view onnx_name = "LessOrEqual";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a <= b; }
};
struct greater : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater";
  static constexpr std::string_view onnx_name = "Greater";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a > b; }
};
struct greater_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater_equal";
  static constexpr std::string_view onnx_name = "GreaterOrEqual";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a >= b; }
};
struct equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "equal";
  static constexpr std::string_view onnx_name = "Equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a == b; }
};
struct not_equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "not_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a != b; }
};
/// relu's gradient (TensorFlow's ReluGrad): `dy` (operand 1) where relu's result `y`
/// (operand 0) is positive, else 0. One op, so that it runs SIMD where `where` on the
/// bool of `greater` would run element by element.
struct relu_grad : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu_grad";
  template <class T> KILN_HOST_DEVICE T operator()(T y, T dy) const { return math::select(y > T(0), dy, T(0)); }
  /// Linear in dy, with the same selection; y only selects.
  template <class G> void gradient(G& g) const { g.give(1, G::run(relu_grad{}, g.x(0), g.dy())); }
};
struct logical_and : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_and";
  static constexpr std::string_view onnx_name = "And";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
struct logical_or : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_or";
  static constexpr std::string_view onnx_name = "Or";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};

// ---- ternary ----------------------------------------------------------------
/// `where(cond, a, b)`: a bool condition choosing between two values of one dtype.
struct where : elementwise_op<3, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "select";
  static constexpr std::string_view onnx_name = "Where";
  static constexpr bool leading_condition = true;
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (in[0] != bool_) return {in[1], "the condition must be a bool tensor"};
    if (in[1] != in[2]) return {in[1], "both branches must have the same dtype"};
    return {in[1]};
  }
  template <class T> KILN_HOST_DEVICE T operator()(bool c, const T& a, const T& b) const { return c ? a : b; }
  template <class G> void gradient(G& g) const {
    const auto zero = g.dy().scalar(0);
    if (g.needs(1)) g.give(1, G::run(where{}, g.x(0), g.dy(), zero));
    if (g.needs(2)) g.give(2, G::run(where{}, g.x(0), zero, g.dy()));
  }
};

// ---- gradients of the ops above that use ops defined after them -------------

template <class G>
void abs::gradient(G& g) const {
  // `0 > x` rather than `x < 0` (and minimum's `y >= x`): formulas compare with the
  // two comparisons a tape registers (detail::tape_ops), not four.
  const auto zero = g.x(0).scalar(0), dy = g.dy();
  const auto negative = G::run(greater{}, zero, g.x(0));
  g.give(0, G::run(where{}, G::run(greater{}, g.x(0), zero), dy, G::run(where{}, negative, -dy, zero)));
}

template <class G>
void relu::gradient(G& g) const {
  g.give(0, G::run(relu_grad{}, g.y(), g.dy()));
}

template <class G>
void floormod::gradient(G& g) const {
  g.give(0, g.dy());
  if (g.needs(1)) g.give(1, -g.dy() * G::run(floordiv{}, g.x(0), g.x(1)));
}

template <class G>
void pow::gradient(G& g) const {
  const auto x = g.x(0), y = g.x(1), zero = x.scalar(0);
  if (g.needs(0)) g.give(0, g.dy() * y * G::run(pow{}, x, y - 1.0));
  if (!g.needs(1)) return;
  const auto positive = G::run(greater{}, x, zero);
  g.give(1, G::run(where{}, positive, g.dy() * g.y() * G::run(log{}, G::run(where{}, positive, x, x.scalar(1))), zero));
}

template <class G>
void maximum::gradient(G& g) const {
  const auto first = G::run(greater_equal{}, g.x(0), g.x(1)), zero = g.dy().scalar(0);
  if (g.needs(0)) g.give(0, G::run(where{}, first, g.dy(), zero));
  if (g.needs(1)) g.give(1, G::run(where{}, first, zero, g.dy()));
}

template <class G>
void minimum::gradient(G& g) const {
  const auto first = G::run(greater_equal{}, g.x(1), g.x(0)), zero = g.dy().scalar(0);
  if (g.needs(0)) g.give(0, G::run(where{}, first, g.dy(), zero));
  if (g.needs(1)) g.give(1, G::run(where{}, first, zero, g.dy()));
}

/// Whether an op's second integer operand may make it undefined: a divisor (zero is
/// refused) or an exponent (a negative one is).
template <class Op>
concept checks_integer_operand = requires { Op::integer_divisor; } || requires { Op::integer_exponent; };

/// Whether `y`, the second operand of `Op`, is an integer it refuses.
template <checks_integer_operand Op, class T>
constexpr bool refused_integer_operand(T y) {
  if constexpr (requires { Op::integer_divisor; }) return y == T(0);
  else return y < T(0);
}

/// The error of `Op` for a second integer operand it refuses.
template <checks_integer_operand Op>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_refused_integer_operand() {
  throw invalid_argument_error(std::string(Op::name) + (requires { Op::integer_divisor; }
                                                            ? ": integer division by zero"
                                                            : ": integers to negative integer powers are not allowed"));
}

/// Rejects integer division by zero and integers to negative powers before a kernel
/// runs, as TensorFlow does (and as C++ must: both are undefined behaviour).
template <elementwise Op>
  requires checks_integer_operand<Op>
void check_values(const Op&, std::span<const tensor* const> in) {
  const tensor& y = *in[1];
  if (!is_integer(y.dtype()) || y.size() == 0) return;
  bool bad = visit_dtype(y.dtype(), [&]<class T>() {
    if constexpr (math::is_signed_integer<T>) {
      std::vector<T> copied;
      const T* p = y.device() == device::cpu ? y.data<T>() : (copied = y.to_vector<T>()).data();
      for (std::int64_t i = 0, n = y.size(); i < n; ++i)
        if (refused_integer_operand<Op>(p[i])) return true;
    }
    return false;
  });
  if (bad) throw_refused_integer_operand<Op>();
}

}  // namespace kiln::ops

namespace kiln {

// The functions of the one op list (kiln/ops/op_list.hpp, where they are documented):
// each builds its op and hands it to detail::apply, and takes a C++ scalar on either
// side of a binary op, converted to the tensor operand's dtype. Every op function is a
// template, even where nothing is deduced, so that its body, and with it the op's
// kernels, is compiled only in programs that call it. (kiln/ops/activations.hpp
// expands the unary one for its ops.)
#define KILN_DETAIL_TENSOR_UNARY_FUNCTION(fn, op)                                    \
  template <class = void>                                                            \
  tensor fn(const tensor& x) { return detail::apply(ops::op{}, x); }
#define KILN_DETAIL_TENSOR_BINARY_FUNCTION(fn, op)                                   \
  template <class = void>                                                            \
  tensor fn(const tensor& x, const tensor& y) { return detail::apply(ops::op{}, x, y); } \
  template <promotable_scalar S>                                                     \
  tensor fn(const tensor& x, const S& y) {                                           \
    return detail::apply(ops::op{}, x, detail::make_scalar(x.dtype(), y, x.device())); \
  }                                                                                  \
  template <promotable_scalar S>                                                     \
  tensor fn(const S& x, const tensor& y) {                                           \
    return detail::apply(ops::op{}, detail::make_scalar(y.dtype(), x, y.device()), y); \
  }
KILN_MATH_UNARY_FUNCTIONS(KILN_DETAIL_TENSOR_UNARY_FUNCTION)
KILN_BINARY_FUNCTIONS(KILN_DETAIL_TENSOR_BINARY_FUNCTION)
#undef KILN_DETAIL_TENSOR_BINARY_FUNCTION

/// `kiln::cast(x, kiln::int32)`: converts elements (floats to integers truncate
/// toward zero and saturate; NaN becomes 0).
template <class = void>
tensor cast(const tensor& x, dtype to) { return detail::apply(ops::cast(to), x); }
/// `kiln::cast<double>(x)`: the same with the target as a C++ type, as the
/// compile-time tier spells it, so that one generic callable serves both tiers.
template <class T>
  requires has_dtype<T>
tensor cast(const tensor& x) { return cast(x, dtype_of<T>); }

/// `kiln::where(x > 0, x, 0.f)`: picks from `a` where `cond` holds, else from `b`.
template <class = void>
tensor where(const tensor& cond, const tensor& a, const tensor& b) { return detail::apply(ops::where{}, cond, a, b); }
template <promotable_scalar S>
tensor where(const tensor& cond, const tensor& a, const S& b) {
  return where(cond, a, detail::make_scalar(a.dtype(), b, a.device()));
}
template <promotable_scalar S>
tensor where(const tensor& cond, const S& a, const tensor& b) {
  return where(cond, detail::make_scalar(b.dtype(), a, b.device()), b);
}

template <class = void>
tensor operator-(const tensor& x) { return negative(x); }

#define KILN_DETAIL_TENSOR_OPERATOR(sym, fn)                                         \
  template <class = void>                                                            \
  tensor operator sym(const tensor& x, const tensor& y) { return fn(x, y); }        \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const tensor& x, const S& y) { return fn(x, y); }              \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const S& x, const tensor& y) { return fn(x, y); }
KILN_OPERATORS(KILN_DETAIL_TENSOR_OPERATOR)
#undef KILN_DETAIL_TENSOR_OPERATOR

}  // namespace kiln

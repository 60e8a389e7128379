#pragma once
/// \file
/// What every op definition provides, and the rules shared between op families.
///
/// An op is a type in kiln::ops holding its attributes, with
/// - `static constexpr std::string_view name`: the op's name in graphs and errors;
/// - `static constexpr std::string_view onnx_name`: the ONNX operator this op lowers to,
///   when it lowers to one; its attributes are the exporter's (kiln/onnx.hpp), and so is
///   any change of layout or dtype around it (conv2d's NHWC transposed for `Conv`). An
///   op that ONNX computes as a composition of operators (silu, square, not_equal,
///   floordiv, floormod, relu_grad, stack, set_item, pad_rows, crop_or_pad,
///   unsorted_segment_sum) has none: the exporter builds it;
/// - `static constexpr int arity`: how many inputs it takes (`ops::variadic`: one or more);
/// - `constexpr dtype_result result_dtype(std::span<const dtype>) const`;
/// - `constexpr shape_result result_shape(std::span<const shape>) const`.
/// Both rules are constexpr, so the compile-time tier turns a failure into a
/// `static_assert` and the runtime tier into a kiln::type_error / kiln::value_error.
/// Elementwise ops derive from `elementwise_op` and add a functor `operator()`.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"

namespace kiln {

/// Outcome of a dtype rule: the result dtype, or the reason there is none.
struct dtype_result {
  dtype value = float32;
  std::string_view failure{};
  constexpr bool ok() const { return failure.empty(); }
};

/// Outcome of a shape rule: the result shape, or the reason there is none.
struct shape_result {
  kiln::shape value{};
  std::string_view failure{};
  constexpr bool ok() const { return failure.empty(); }
};

/// A short constexpr list of integers (axes, permutations, strides), allowing negatives.
/// \code kiln::int_list perm{1, 0}; perm.size() == 2; \endcode
class int_list {
 public:
  constexpr int_list() = default;
  constexpr int_list(std::initializer_list<std::int64_t> v) {
    for (auto x : v) push_back(x);
  }
  constexpr explicit int_list(std::span<const std::int64_t> v) {
    for (auto x : v) push_back(x);
  }
  constexpr void push_back(std::int64_t x) {
    if (size_ >= max_rank) detail::throw_too_many_dims();
    items_[size_++] = x;
  }
  constexpr int size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr std::int64_t operator[](int i) const { return items_[i]; }
  constexpr const std::int64_t* begin() const { return items_.data(); }
  constexpr const std::int64_t* end() const { return items_.data() + size_; }
  constexpr bool operator==(const int_list& o) const {
    if (size_ != o.size_) return false;
    for (int i = 0; i < size_; ++i)
      if (items_[i] != o.items_[i]) return false;
    return true;
  }
  KILN_LIBRARY_INLINE std::string str() const;

 private:
  int size_ = 0;
  std::array<std::int64_t, max_rank> items_{};
};

namespace ops {

/// The arity of an op that takes one or more inputs (concat, stack).
inline constexpr int variadic = -1;

/// One attribute of an op, its name and its member. An op with attributes lists them
/// all in `static constexpr auto attribute_fields()`, which saved graphs write and read
/// (kiln/saved_function.hpp); an op without has none to list.
/// \code
/// struct scaled { std::int64_t axis = 0;
///   static constexpr auto attribute_fields() { return std::tuple{kiln::ops::attribute{"axis", &scaled::axis}}; } };
/// \endcode
template <class Op, class T>
struct attribute {
  std::string_view name;
  T Op::*member;
};
// Spelled out for compilers without C++20's deduction for aggregates (clang before 17).
template <class Op, class T>
attribute(std::string_view, T Op::*) -> attribute<Op, T>;

/// Normalizes a possibly negative axis against `rank`; -1 when out of range.
constexpr int normalize_axis(std::int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) return -1;
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

/// One dim of a broadcast: sizes must match or one must be 1; `none` (unknown)
/// takes the other side's size unless that is 1.
constexpr std::int64_t broadcast_dim(std::int64_t a, std::int64_t b, bool& ok) {
  if (a == b) return a;
  if (a == 1) return b;
  if (b == 1) return a;
  if (a == none) return b;
  if (b == none) return a;
  ok = false;
  return 0;
}

/// NumPy broadcasting of two shapes.
/// \code static_assert(kiln::ops::broadcast_shapes({2, 1}, {3}).value == kiln::shape{2, 3}); \endcode
constexpr shape_result broadcast_shapes(const shape& a, const shape& b) {
  if (!a.has_known_rank() || !b.has_known_rank()) return {shape(unknown_rank)};
  int rank = a.rank() > b.rank() ? a.rank() : b.rank();
  shape out;
  bool ok = true;
  for (int i = 0; i < rank; ++i) {
    int ia = i - (rank - a.rank()), ib = i - (rank - b.rank());
    std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    out.push_back(broadcast_dim(da, db, ok));
  }
  if (!ok) return {{}, "shapes are not broadcast-compatible"};
  return {out};
}

/// Broadcast of any number of shapes.
constexpr shape_result broadcast_all(std::span<const shape> in) {
  shape_result r{in.empty() ? shape{} : in[0]};
  for (std::size_t i = 1; i < in.size() && r.ok(); ++i) r = broadcast_shapes(r.value, in[i]);
  return r;
}

/// The error for a dtype without numbers reaching a kernel for numbers (visit_numeric):
/// out of line, since each visit reaches it from two dtypes.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_not_numeric(dtype t) {
  throw internal_error("a kernel for numbers reached dtype " + std::string(name(t)));
}

/// Calls `f.template operator()<T>()` with the C++ type of a numeric dtype; how the
/// kernels of ops that take numbers only (reductions, linalg) turn a runtime dtype
/// into code.
/// \code kiln::ops::visit_numeric(kiln::float32, [&]<class T>() { static_assert(sizeof(T) >= 4); }); \endcode
template <class F>
void visit_numeric(dtype t, F&& f) {
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      f.template operator()<T>();
    else
      throw_not_numeric(t);
  });
}

/// How an elementwise op's result dtype follows from its inputs'.
enum class result_rule {
  same,            ///< the input dtype
  boolean,         ///< bool (comparisons)
  true_division,   ///< the input dtype, but float64 for integers (TensorFlow's `/`)
};

/// Base of elementwise ops: `arity` inputs of one dtype from `accepts`, broadcast
/// together. `simd` lists the dtypes whose functor also runs on xsimd batches.
template <int Arity, dtype_set Accepts, result_rule Rule = result_rule::same, dtype_set Simd = dtypes::floating>
struct elementwise_op {
  static constexpr int arity = Arity;
  static constexpr dtype_set accepts = Accepts;
  static constexpr dtype_set simd = Simd;
  /// Operand roles. With a leading condition (`where`), operand 0 is a bool read as
  /// `bool` and the others are values of the kernels' element type; without, every
  /// operand is such a value.
  static constexpr bool leading_condition = false;
  /// True when the result's dtype is an attribute of the op (`cast`) rather than a
  /// function of the values' dtype: the kernels then take every output type.
  static constexpr bool converts = false;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    for (dtype t : in)
      if (t != in[0]) return {in[0], "operands must have the same dtype"};
    if (!accepts.contains(in[0])) return {in[0], "dtype not supported"};
    switch (Rule) {
      case result_rule::boolean: return {bool_};
      case result_rule::true_division: return {is_integer(in[0]) ? float64 : in[0]};
      default: return {in[0]};
    }
  }
  constexpr shape_result result_shape(std::span<const shape> in) const { return broadcast_all(in); }
  constexpr bool operator==(const elementwise_op&) const = default;
};

template <class Op>
concept elementwise = requires {
  Op::arity;
  Op::accepts;
  Op::simd;
};

/// The operand whose dtype selects an op's kernel (the element type `In` of
/// elementwise kernels): the first value operand.
template <class Op>
inline constexpr int value_operand = [] {
  if constexpr (elementwise<Op>)
    return Op::leading_condition ? 1 : 0;
  else
    return 0;
}();

/// Calls an elementwise op's functor on operands as the kernels read them:
/// `condition(0)` for a leading condition, `value(k)` for the values.
template <class Op, class Value, class Condition>
KILN_HOST_DEVICE decltype(auto) invoke_elementwise(const Op& op, const Value& value, const Condition& condition) {
  if constexpr (Op::leading_condition)
    return op(condition(0), value(1), value(2));
  else if constexpr (Op::arity == 1)
    return op(value(0));
  else
    return op(value(0), value(1));
}

}  // namespace ops
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE std::string int_list::str() const {
  std::string s = "[";
  for (int i = 0; i < size_; ++i) s += (i ? ", " : "") + std::to_string(items_[i]);
  return s + "]";
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// Reductions: `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min` and `argmax`
/// over all axes, one axis or a list of axes, with TensorFlow's semantics: the
/// result keeps the input's dtype (argmax gives int64), integer sums wrap, an empty
/// sum is 0, an empty float mean is NaN and an empty max is the lowest value.

#include <array>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/op.hpp"

namespace kiln {

/// The axes a reduction runs over: all of them (the default; also `{}` and
/// `std::nullopt`, TensorFlow's `axis=None`), one axis, or a list of axes. Negative
/// axes count from the end. An explicit empty `kiln::int_list` reduces nothing.
/// \code
/// kiln::tensor x = kiln::ones({2, 3, 4});
/// kiln::reduce_sum(x);                      // every axis
/// kiln::reduce_sum(x, -1);                  // the last axis
/// kiln::reduce_sum(x, {0, 1}, true);        // two axes, kept as size 1
/// kiln::reduce_max(x, std::nullopt, true);  // every axis, kept as size 1
/// \endcode
class reduction_axes {
 public:
  constexpr reduction_axes() = default;
  constexpr reduction_axes(std::nullopt_t) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  constexpr reduction_axes(I axis) : all_(false) {
    list_.push_back(static_cast<std::int64_t>(axis));
  }
  constexpr reduction_axes(std::initializer_list<std::int64_t> axes) : all_(false), list_(axes) {}
  constexpr reduction_axes(const int_list& axes) : all_(false), list_(axes) {}

  /// True when every axis is reduced.
  constexpr bool all() const { return all_; }
  /// The listed axes (empty when `all()`).
  constexpr const int_list& list() const { return list_; }
  constexpr bool operator==(const reduction_axes&) const = default;
  /// `None` or the list as `[0, -1]`.
  KILN_LIBRARY_INLINE std::string str() const;

 private:
  bool all_ = true;
  int_list list_;
};

namespace ops {

/// The first invalid entry of an axes list: its position (-1 when every axis is
/// valid) and whether it repeats an earlier axis rather than being out of range.
struct axes_check {
  int position = -1;
  bool repeated = false;
  constexpr bool ok() const { return position < 0; }
};

/// Checks `axes` against a tensor of rank `rank`.
/// \code static_assert(!kiln::ops::check_axes({0, 2}, 2).ok()); \endcode
constexpr axes_check check_axes(const reduction_axes& axes, int rank) {
  std::array<bool, max_rank> seen{};
  for (int i = 0; i < axes.list().size(); ++i) {
    int axis = normalize_axis(axes.list()[i], rank);
    if (axis < 0) return {i, false};
    if (seen[axis]) return {i, true};
    seen[axis] = true;
  }
  return {};
}

/// Which of the `rank` dims a reduction over (valid) `axes` reduces.
/// \code kiln::ops::reduced_dims(-1, 2) == std::array<bool, kiln::max_rank>{false, true} \endcode
constexpr std::array<bool, max_rank> reduced_dims(const reduction_axes& axes, int rank) {
  std::array<bool, max_rank> reduced{};
  for (int d = 0; d < rank; ++d) reduced[d] = axes.all();
  for (std::int64_t axis : axes.list()) reduced[normalize_axis(axis, rank)] = true;
  return reduced;
}

/// How many input elements meet in each output of a reduction of concrete shape `in`.
/// \code kiln::ops::reduced_count(kiln::shape{2, 3}, 1) == 3 \endcode
constexpr std::int64_t reduced_count(const shape& in, const reduction_axes& axes) {
  auto reduced = reduced_dims(axes, in.rank());
  std::int64_t count = 1;
  for (int d = 0; d < in.rank(); ++d)
    if (reduced[d]) count *= in[d];
  return count;
}

/// What a reduction computes; the kernels branch on it at compile time.
/// \code static_assert(kiln::ops::reduce_mean::kind == kiln::ops::reduction_kind::mean); \endcode
enum class reduction_kind { sum, mean, max, min, argmax };

/// Base of the reduction ops: one int32, int64, float32 or float64 input, the axes
/// to reduce and whether reduced dims stay in the result as size 1.
/// \code kiln::ops::reduce_sum op({0, -1}, true);  // axes [0, -1], keepdims \endcode
struct reduction_op {
  reduction_axes axis{};
  static constexpr int arity = 1;
  bool keepdims = false;
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"axis", &reduction_op::axis},
                      attribute{"keepdims", &reduction_op::keepdims}};
  }

  /// The gradient of the result, `g.dy()`, repeated along the reduced dims of the
  /// input (for the formulas of sum and mean).
  template <class G> auto spread(G& g) const { return G::reshape(g.dy(), kept_shape(g)) + g.zeros_like(0); }

  /// The input's shape with the reduced dims kept as size 1: the result's shape with
  /// keepdims, what dy is reshaped to before it is spread back.
  template <class G> shape kept_shape(G& g) const {
    const shape in = g.x(0).t.shape();
    const auto reduced = reduced_dims(axis, in.rank());
    shape kept;
    for (int d = 0; d < in.rank(); ++d) kept.push_back(reduced[std::size_t(d)] ? 1 : in[d]);
    return kept;
  }

  /// The gradient of max and min, as TensorFlow's: dy shared equally by the elements
  /// equal to the result.
  template <class G> auto extreme_gradient(G& g) const;

  constexpr reduction_op() = default;
  constexpr explicit reduction_op(reduction_axes axes, bool keep = false) : axis(axes), keepdims(keep) {}

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!dtypes::numeric.contains(in[0])) return {in[0], "dtype not supported (reductions take int32, int64, float32 or float64)"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const shape& s = in[0];
    if (!s.has_known_rank()) return {axis.all() && !keepdims ? shape{} : shape(unknown_rank)};
    axes_check check = check_axes(axis, s.rank());
    if (!check.ok()) return {{}, check.repeated ? "an axis is listed twice" : "axis out of range"};
    auto reduced = reduced_dims(axis, s.rank());
    shape out;
    for (int d = 0; d < s.rank(); ++d) {
      if (!reduced[d])
        out.push_back(s[d]);  // may be `none`
      else if (keepdims)
        out.push_back(1);
    }
    return {out};
  }
  constexpr bool operator==(const reduction_op&) const = default;
};

/// The ops of this family; their kernels are written once for all of them.
/// \code static_assert(kiln::ops::reduction<kiln::ops::argmax>); \endcode
template <class Op>
concept reduction = std::derived_from<Op, reduction_op> && requires {
  { Op::kind } -> std::convertible_to<reduction_kind>;
};

/// Sum; integers wrap.
struct reduce_sum : reduction_op {
  static constexpr std::string_view name = "reduce_sum";
  static constexpr std::string_view onnx_name = "ReduceSum";
  static constexpr reduction_kind kind = reduction_kind::sum;
  using reduction_op::reduction_op;
  /// dy, spread back over the reduced dims.
  template <class G> void gradient(G& g) const { g.give(0, spread(g)); }
};
/// Mean; integer means truncate toward zero (of the wrapped sum, as TensorFlow).
template <class G>
auto reduction_op::extreme_gradient(G& g) const {
  const shape kept = kept_shape(g);
  const auto chosen = G::run(cast(g.x(0).t.dtype()), G::run(equal{}, G::reshape(g.y(), kept), g.x(0)));
  const auto count = G::run(reduce_sum(axis, true), chosen);
  return chosen / count * G::reshape(g.dy(), kept);
}

struct reduce_mean : reduction_op {
  static constexpr std::string_view name = "reduce_mean";
  static constexpr std::string_view onnx_name = "ReduceMean";
  static constexpr reduction_kind kind = reduction_kind::mean;
  using reduction_op::reduction_op;
  /// dy / count, spread back over the reduced dims.
  template <class G> void gradient(G& g) const {
    g.give(0, spread(g) / double(reduced_count(g.x(0).t.shape(), axis)));
  }
};
/// Largest element; NaN wins over any number.
struct reduce_max : reduction_op {
  static constexpr std::string_view name = "reduce_max";
  static constexpr std::string_view onnx_name = "ReduceMax";
  static constexpr reduction_kind kind = reduction_kind::max;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Smallest element; NaN wins over any number.
struct reduce_min : reduction_op {
  static constexpr std::string_view name = "reduce_min";
  static constexpr std::string_view onnx_name = "ReduceMin";
  static constexpr reduction_kind kind = reduction_kind::min;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Index (int64) of the first largest element, counting the reduced positions in
/// row-major order; the first NaN counts as the largest, as reduce_max returns it.
struct argmax : reduction_op {
  static constexpr std::string_view name = "argmax";
  static constexpr std::string_view onnx_name = "ArgMax";
  static constexpr reduction_kind kind = reduction_kind::argmax;
  using reduction_op::reduction_op;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    dtype_result r = reduction_op::result_dtype(in);
    if (r.ok()) r.value = int64;
    return r;
  }
  /// Raises kiln::invalid_argument_error when input shape `in` has nothing to reduce:
  /// there is no largest element (TensorFlow raises too).
  /// \code kiln::ops::argmax(0).check_input(kiln::shape{0, 3});  // throws \endcode
  KILN_LIBRARY_INLINE void check_input(const shape& in) const;
};

/// Runs argmax's input check before any kernel (found by argument-dependent lookup).
/// \code kiln::argmax(kiln::zeros({0, 3}), 0);  // kiln::invalid_argument_error \endcode
template <class = void>
void check_values(const argmax& op, std::span<const tensor* const> in) { op.check_input(in[0]->shape()); }

/// The mean of `count` values that sum to `sum`, in the element type `T`: integer
/// means truncate toward zero (and are 0 for no values), float ones are NaN then.
/// \code kiln::ops::mean_of<int>(-7, 2) == -3 \endcode
template <class T, class S>
constexpr T mean_of(S sum, std::int64_t count) {
  if constexpr (std::is_floating_point_v<T>)
    return T(sum / S(count));
  else
    return count == 0 ? T(0) : T(std::int64_t(sum) / count);
}

}  // namespace ops

namespace detail {

/// Reduction `op`'s error for the axes `axes` that `check` refused on `x`, as an op
/// whose operands do not fit raises it in `mode`; out of line, shared by every reduction.
[[noreturn]] KILN_COLD KILN_LIBRARY_INLINE void throw_invalid_axes(std::string_view op, const reduction_axes& axes,
                                                                   ops::axes_check check, const tensor& x, rule_errors mode);
#if KILN_DEFINE_LIBRARY
[[noreturn]] KILN_COLD KILN_LIBRARY_INLINE void throw_invalid_axes(std::string_view op, const reduction_axes& axes,
                                                                   ops::axes_check check, const tensor& x, rule_errors mode) {
  std::string axis = std::to_string(axes.list()[check.position]);
  std::string got = "; got " + std::string(name(x.dtype())) + " " + x.shape().str();
  if (check.repeated)
    throw_operand_error<value_error>(mode, std::string(op) + ": axis " + axis + " is listed twice in " + axes.str() + got);
  std::string valid = x.rank() == 0 ? "a scalar has no axes"
                                    : "valid axes are " + std::to_string(-x.rank()) + " to " + std::to_string(x.rank() - 1);
  throw_operand_error<value_error>(mode, std::string(op) + ": axis " + axis + " is out of range for a tensor of rank " +
                                             std::to_string(x.rank()) + " (" + valid + ")" + got);
}
#endif

/// Runs reduction `op` on `x`. Invalid axes raise the operand error naming the axis
/// and the rank here, where both are known (the op's rule can only say which kind of
/// mistake it was).
template <ops::reduction Op>
tensor reduce(const Op& op, const tensor& x) {
  if (x.defined() && x.shape().has_known_rank())
    if (const ops::axes_check check = ops::check_axes(op.axis, x.rank()); !check.ok()) {
      const tensor* in[] = {&x};
      throw_invalid_axes(Op::name, op.axis, check, x, rule_errors_for(in));
    }
  return apply(op, x);
}

}  // namespace detail

/// Sum over `axis` (every axis by default); reduced dims are dropped unless `keepdims`.
/// Integer sums wrap; an empty sum is 0.
/// \code
/// auto x = kiln::constant({{1, 2, 3}, {4, 5, 6}});
/// kiln::reduce_sum(x);              // 21
/// kiln::reduce_sum(x, 0);           // [5 7 9]
/// kiln::reduce_sum(x, -1, true);    // [[6] [15]]
/// kiln::reduce_sum(x, {0, 1});      // 21
/// \endcode
template <class = void>
tensor reduce_sum(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_sum(axis, keepdims), x);
}

/// Mean over `axis` (every axis by default), in the input's dtype: integer means
/// truncate toward zero, an empty float mean is NaN and an empty integer mean 0.
/// \code kiln::reduce_mean(kiln::constant({1.f, 2.f})) // 1.5 \endcode
template <class = void>
tensor reduce_mean(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_mean(axis, keepdims), x);
}

/// Largest element over `axis` (every axis by default). NaN propagates; an empty
/// max is -inf for floats and the lowest value for integers.
/// \code kiln::reduce_max(kiln::constant({{1, 5}, {7, 2}}), 1) // [5 7] \endcode
template <class = void>
tensor reduce_max(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_max(axis, keepdims), x);
}

/// Smallest element over `axis` (every axis by default). NaN propagates; an empty
/// min is +inf for floats and the largest value for integers.
/// \code kiln::reduce_min(kiln::constant({{1, 5}, {7, 2}}), 0) // [1 2] \endcode
template <class = void>
tensor reduce_min(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_min(axis, keepdims), x);
}

/// Index (int64) of the first largest element along `axis`. With no axis it is the
/// row-major index into the whole tensor (NumPy's convention; TensorFlow's
/// `tf.math.argmax` defaults to axis 0, which is `kiln::argmax(x, 0)`); over a list
/// of axes it counts the reduced positions in row-major order. The first NaN counts
/// as the largest. Reducing an empty axis raises kiln::invalid_argument_error.
/// \code
/// auto x = kiln::constant({{1, 9, 9}, {8, 2, 3}});
/// kiln::argmax(x, 1);  // [1 0]
/// kiln::argmax(x, 0);  // [1 0 0]
/// kiln::argmax(x);     // 1
/// \endcode
template <class = void>
tensor argmax(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::argmax(axis, keepdims), x);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE std::string reduction_axes::str() const { return all_ ? "None" : list_.str(); }

}  // namespace kiln

namespace kiln::ops {

KILN_LIBRARY_INLINE void argmax::check_input(const shape& in) const {
  if (reduced_count(in, axis) == 0)
    throw invalid_argument_error(std::string(name) + ": the reduced axes " + axis.str() + " of shape " + in.str() +
                                 " are empty, so there is no largest element");
}

}  // namespace kiln::ops
#endif  // KILN_DEFINE_LIBRARY

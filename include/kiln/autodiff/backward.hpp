#pragma once
/// \file
/// How an op's gradient formula runs: `detail::gradient_builder`, the one argument of
/// every op's `gradient` member (written beside the op, in kiln/ops/), and
/// `detail::backward_of<Op>`, which kiln/ops/op_table.hpp puts in the op's row.
///
/// A formula calls ops through the kernel table (`run_registered`), never through
/// kiln's op functions: a program that calls tanh then compiles tanh's formula, not
/// the kernels of the ops the formula uses. A gradient tape registers those that the
/// formulas of several ops run when it is made (`detail::tape_ops`), so that only
/// programs with tapes compile them; an op that one formula alone runs (log, in pow's)
/// is registered by that formula, so that only programs that call its op compile it.

#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/op_table.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln::detail {

/// The ops a gradient tape registers when it is made (kiln/autodiff/tape.hpp): those
/// that the formulas of several ops or of common ones run (transpose, for matmul's),
/// and those the tape's own code runs (summing gradients, reducing them to an input's
/// shape, zeros_shaped_like). The formulas of pow (log, pow), floormod (floordiv) and
/// matmul (matmul) register what else they run.
using tape_ops = boost::mp11::mp_list<ops::add, ops::subtract, ops::multiply, ops::divide, ops::negate, ops::cast,
                                      ops::equal, ops::greater, ops::greater_equal, ops::where, ops::reshape,
                                      ops::transpose, ops::reduce_sum, ops::slice, ops::concat, ops::gather,
                                      ops::unsorted_segment_sum, ops::set_item, ops::stack, ops::crop_or_pad>;

/// Zeros of `x`'s dtype and shape, also where its dims are known only when the graph
/// runs (a tensor array's rows in a loop): then zeros selected over x's own shape
/// (`x == x` is false for NaN, but both branches are 0).
KILN_LIBRARY_INLINE tensor zeros_shaped_like(const tensor& x);

/// What an op's gradient formula reads (its inputs, its result, the gradient of the
/// result) and gives (the gradient of each input it is differentiable in).
/// \code
/// struct my_tanh {  // an op's member, as kiln::ops::tanh has it
///   template <class G> void gradient(G& g) const { g.give(0, g.dy() * (1.0 - g.y() * g.y())); }
/// };
/// \endcode
class gradient_builder {
 public:
  /// A tensor of the formula; its arithmetic runs through the kernel table.
  struct value {
    tensor t;

    // Templates, as op functions are, so that a program compiles the ops they run
    // only where a gradient formula runs.
    template <class = void>
    friend value operator+(const value& a, const value& b) { return run(ops::add{}, a, b); }
    template <class = void>
    friend value operator-(const value& a, const value& b) { return run(ops::subtract{}, a, b); }
    template <class = void>
    friend value operator*(const value& a, const value& b) { return run(ops::multiply{}, a, b); }
    template <class = void>
    friend value operator/(const value& a, const value& b) { return run(ops::divide{}, a, b); }
    template <class = void>
    friend value operator-(const value& a) { return run(ops::negate{}, a); }
    template <class = void>
    friend value operator+(const value& a, double s) { return a + a.scalar(s); }
    template <class = void>
    friend value operator-(const value& a, double s) { return a - a.scalar(s); }
    template <class = void>
    friend value operator*(const value& a, double s) { return a * a.scalar(s); }
    template <class = void>
    friend value operator/(const value& a, double s) { return a / a.scalar(s); }
    template <class = void>
    friend value operator+(double s, const value& a) { return a.scalar(s) + a; }
    template <class = void>
    friend value operator-(double s, const value& a) { return a.scalar(s) - a; }
    template <class = void>
    friend value operator*(double s, const value& a) { return a.scalar(s) * a; }
    /// `s` as a scalar of this value's dtype.
    KILN_LIBRARY_INLINE value scalar(double s) const;
  };

  /// `needed` marks (nonzero) the inputs whose gradients are wanted; empty: all.
  gradient_builder(std::span<const tensor> inputs, const tensor& output, const tensor& upstream,
                   std::span<const char> needed, std::span<tensor> grads)
      : inputs_(inputs), output_(output), upstream_(upstream), needed_(needed), grads_(grads) {}

  /// Input `i` of the op.
  KILN_LIBRARY_INLINE value x(int i) const;
  /// How many inputs the op has.
  std::size_t arity() const { return inputs_.size(); }
  /// The op's result.
  KILN_LIBRARY_INLINE value y() const;
  /// The gradient of the target with respect to the result.
  KILN_LIBRARY_INLINE value dy() const;
  /// Zeros of input `i`'s dtype and shape (what a gradient is broadcast onto).
  KILN_LIBRARY_INLINE value zeros_like(int i) const;
  /// Whether the gradient of input `i` is wanted: a formula that gives several skips
  /// the work of those that are not (a captured constant's, say), as PyTorch's
  /// `needs_input_grad`.
  KILN_LIBRARY_INLINE bool needs(int i) const;
  /// Gives `g`, of the result's shape or input `i`'s (the tape sums it back over
  /// broadcast dims), as the gradient of input `i`.
  KILN_LIBRARY_INLINE void give(int i, const value& g);

  /// Zeros of `like`'s dtype, on its device, in shape `s`.
  KILN_LIBRARY_INLINE static value zeros(const shape& s, const value& like);
  /// The int32 indices n - 1, ..., 1, 0 on `like`'s device: gathered with them, a dim
  /// of n elements comes out reversed.
  template <class = void>
  static value reversed_indices(std::int64_t n, const value& like) {
    std::vector<std::int32_t> indices(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) indices[static_cast<std::size_t>(i)] = std::int32_t(n - 1 - i);
    return {constant(indices, std::nullopt, like.t.device())};
  }
  template <class = void>
  static value reshape(const value& v, const shape& to) { return run(ops::reshape{to}, v); }
  template <class = void>
  static value transpose(const value& v, const int_list& perm) { return run(ops::transpose{perm}, v); }
  template <class = void>
  static value matmul(const value& a, const value& b) { return run(ops::matmul{}, a, b); }

  /// `op` on `operands`; registers `Op` at its first run unless a tape has.
  template <class Op, std::same_as<value>... V>
  KILN_COLD static value run(const Op& op, const V&... operands) {
    if constexpr (!ops::registered<Op, tape_ops>) register_kernels_on_use<Op>();  // Op is not in tape_ops
    const tensor* in[] = {&operands.t...};
    return {run_registered(ops::any_op(std::in_place_type<Op>, op), std::span<const tensor* const>(in))};
  }

 private:
  std::span<const tensor> inputs_;
  const tensor& output_;
  const tensor& upstream_;
  std::span<const char> needed_;
  std::span<tensor> grads_;
};

/// Whether `Op` has a gradient formula.
template <class Op>
inline constexpr bool differentiable = requires(const Op& op, gradient_builder& g) { op.gradient(g); };

/// Runs the formula of the `Op` that `op` holds: writes the gradient of each
/// differentiable input that `needed` marks to `grads` (left undefined for the others,
/// or possibly given when the formula computes them at no extra cost).
template <class Op>
KILN_COLD void backward_of(const ops::any_op& op, std::span<const tensor> inputs, const tensor& output, const tensor& upstream,
                 std::span<const char> needed, std::span<tensor> grads) {
  if constexpr (differentiable<Op>) {
    gradient_builder g(inputs, output, upstream, needed, grads);
    op.unchecked<Op>().gradient(g);
  }
}

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE tensor zeros_shaped_like(const tensor& x) {
  if (x.shape().is_fully_defined() || !x.is_symbolic())
    return zero_filled("gradient", x.shape(), x.dtype(), x.device());
  const tensor zero = make_scalar(x.dtype(), 0, x.device());
  const tensor* same_in[] = {&x, &x};
  const tensor same = run_registered(ops::equal{}, same_in);
  const tensor* in[] = {&same, &zero, &zero};
  return run_registered(ops::where{}, in);
}

KILN_LIBRARY_INLINE auto gradient_builder::value::scalar(double s) const -> value {
  return {make_scalar(t.dtype(), s, t.device())};
}

KILN_LIBRARY_INLINE auto gradient_builder::x(int i) const -> value { return {inputs_[std::size_t(i)]}; }

KILN_LIBRARY_INLINE auto gradient_builder::y() const -> value { return {output_}; }

KILN_LIBRARY_INLINE auto gradient_builder::dy() const -> value { return {upstream_}; }

KILN_LIBRARY_INLINE auto gradient_builder::zeros_like(int i) const -> value {
  return {zeros_shaped_like(inputs_[std::size_t(i)])};
}

KILN_LIBRARY_INLINE bool gradient_builder::needs(int i) const { return needed_.empty() || needed_[std::size_t(i)]; }

KILN_LIBRARY_INLINE void gradient_builder::give(int i, const value& g) { grads_[std::size_t(i)] = g.t; }

KILN_LIBRARY_INLINE auto gradient_builder::zeros(const shape& s, const value& like) -> value {
  return {zero_filled("gradient", s, like.t.dtype(), like.t.device())};
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

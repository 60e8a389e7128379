#pragma once
/// \file
/// Typed ops that end a fused expression: reductions (axes as template arguments),
/// matmul, transpose and reshape. Each runs the CPU backend's kernel for its one
/// element type, so its values are the eager kiln::tensor's bits, and its result's
/// type comes from the op's constexpr shape rule. On `fixed` values an op computes
/// at once; in a typed trace it is a step that reads its operands' slots (an
/// operand expression is evaluated into a slot first) and writes a new one.

#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/backend/cpu/reduction.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/typed/trace.hpp"

namespace kiln {
namespace typed {

/// A reduction op over `Axes` (all when none).
template <class Op, bool KeepDims, std::int64_t... Axes>
struct made_reduction {
  static constexpr Op op = sizeof...(Axes) == 0 ? Op(reduction_axes(), KeepDims) : Op(reduction_axes(int_list{Axes...}), KeepDims);
};

/// Dims `D` permuted by `Perm` (reversed when empty).
template <class D, std::int64_t... Perm>
struct transposed {
  static constexpr std::array<int, std::size_t(D::rank)> perm = [] {
    std::array<int, std::size_t(D::rank)> p{};
    if constexpr (sizeof...(Perm) == 0) {
      for (int d = 0; d < D::rank; ++d) p[std::size_t(d)] = D::rank - 1 - d;
    } else {
      int d = 0;
      ((p[std::size_t(d++)] = int(Perm)), ...);
    }
    return p;
  }();
  static constexpr kiln::shape value = [] {
    kiln::shape s;
    for (int d = 0; d < D::rank; ++d) s.push_back(D::values[std::size_t(perm[std::size_t(d)])]);
    return s;
  }();
};

/// The slot holding the value of operand `x` in the trace being recorded.
template <class X>
int slot_of(const X& x) {
  if constexpr (is_symbol<std::remove_cvref_t<X>>::value) {
    return x.slot();
  } else {
    using E = decltype(expression_of<void, false>(x));
    return symbol<typename E::value_type, typename E::dims_type>(expression_of<void, false>(x)).slot();
  }
}

/// A step running `Kernel` on the slots `in` into slot `out`.
template <class Kernel, class Out, class... In>
struct kernel_step {
  Kernel kernel;
  int out;
  std::array<int, sizeof...(In)> in;
  static void run(const void* data, frame f) {
    const auto& s = *static_cast<const kernel_step*>(data);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      s.kernel(static_cast<Out*>(f[s.out]), static_cast<const In*>(f[s.in[I]])...);
    }(std::index_sequence_for<In...>());
  }
};

/// `kernel(out, in...)` on the values of `x...`, giving a value of type `OutT`
/// and dims `OutD`: a `fixed` now, or a symbol written by a step of the trace.
template <class OutT, class OutD, class Kernel, class... X>
auto apply_kernel(Kernel kernel, const X&... x) {
  if constexpr (eager<X...>) {
    fixed_t<OutT, OutD> out(uninitialized);
    kernel(out.data(), x.data()...);
    return out;
  } else {
    recorder* r = recorder::current();
    if (!r) throw type_error("kiln: a symbolic typed value was used outside the trace that made it; return it from the function instead");
    using step_t = kernel_step<Kernel, OutT, typename element_of<X>::type...>;
    const std::array<int, sizeof...(X)> in{slot_of(x)...};
    const int out = r->add_slot(sizeof(OutT) * std::size_t(OutD::size));
    r->steps.push_back({&step_t::run, std::make_shared<const step_t>(step_t{kernel, out, in})});
    return symbol<OutT, OutD>(out);
  }
}

/// An integer product small enough for loops whose sizes the compiler knows: integer
/// sums wrap, so their order does not change them, and this gives gemm's values.
template <class T, std::int64_t M, std::int64_t N, std::int64_t K>
void small_integer_matmul(const T* KILN_RESTRICT a, const T* KILN_RESTRICT b, T* KILN_RESTRICT c) {
  using U = std::make_unsigned_t<T>;  // wraps
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      U sum = 0;
      for (std::int64_t k = 0; k < K; ++k) sum += U(a[i * K + k]) * U(b[k * N + j]);
      c[i * N + j] = T(sum);
    }
}

/// Reduction `Op` over `Axes` (all when none) of `x`.
template <class Op, bool KeepDims, std::int64_t... Axes, class X>
auto reduce(const X& x) {
  using V = std::remove_cvref_t<X>;
  using T = typename V::value_type;
  using D = typename V::dims_type;
  using made_op = made_reduction<Op, KeepDims, Axes...>;
  using rule = op_rule<made_op, V>;
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return rule_error{};
  } else {
    using Out = element_t<rule::dtypes.value>;
    using OutD = dims_from<rule>;
    return apply_kernel<Out, OutD>(
        [](Out* out, const T* in) {
          constexpr auto axis = made_op::op.axis;
          constexpr std::int64_t count = ops::reduced_count(D::shape(), axis);
          using R = backend::cpu::reducer_for<Op::kind, T>;
          backend::cpu::reduce<R>(in, out, backend::cpu::reduction_layout(D::shape(), ops::reduced_dims(axis, D::rank)),
                                  OutD::size, count);
          if constexpr (Op::kind == ops::reduction_kind::mean)
            for (std::int64_t i = 0; i < OutD::size; ++i) out[i] = ops::mean_of<T>(out[i], count);
        },
        x);
  }
}

}  // namespace typed

/// Tag: reduced dims stay in a typed reduction's result with size 1.
struct keep_dims_t {
  explicit constexpr keep_dims_t() = default;
};
inline constexpr keep_dims_t keep_dims{};

// The checks name the op in the first error line (see KILN_TYPED_CHECKS).
#define KILN_TYPED_REDUCTION(fn)                                                                 \
  template <std::int64_t... Axes, typed::operand X>                                              \
  auto fn(const X& x) {                                                                          \
    return fn<Axes...>(x, keep_dims_t(), std::false_type());                                     \
  }                                                                                              \
  template <std::int64_t... Axes, typed::operand X, class Keep = std::true_type>                 \
  auto fn(const X& x, keep_dims_t, Keep = {}) {                                                  \
    using rule = typed::op_rule<typed::made_reduction<ops::fn, Keep::value, Axes...>, std::remove_cvref_t<X>>; \
    static_assert(rule::dtypes.ok(), "kiln::" #fn ": reductions take int32, int64, float32 or float64 values"); \
    static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::" #fn ": an axis is out of range or listed twice"); \
    return typed::reduce<ops::fn, Keep::value, Axes...>(x);                                      \
  }                                                                                              \
  template <std::int64_t Axis, std::int64_t... More>                                             \
  tensor fn(const tensor& x) {                                                                   \
    return fn(x, reduction_axes(int_list{Axis, More...}));                                       \
  }
/// `kiln::reduce_sum<1>(x)`: typed reductions take their axes as template arguments
/// (all axes when none), and `kiln::keep_dims` to keep reduced dims; the same
/// spelling works on a kiln::tensor.
KILN_TYPED_REDUCTION(reduce_sum)
KILN_TYPED_REDUCTION(reduce_mean)
KILN_TYPED_REDUCTION(reduce_max)
KILN_TYPED_REDUCTION(reduce_min)
KILN_TYPED_REDUCTION(argmax)
#undef KILN_TYPED_REDUCTION

/// `kiln::matmul(a, b)` on typed operands: a (batched) matrix product whose inner
/// dims must agree at compile time.
template <typed::operand A, typed::operand B>
auto matmul(const A& a, const B& b) {
  using Va = std::remove_cvref_t<A>;
  using Vb = std::remove_cvref_t<B>;
  using T = typename Va::value_type;
  using Da = typename Va::dims_type;
  using Db = typename Vb::dims_type;
  using rule = typed::op_rule<typed::made<ops::matmul>, Va, Vb>;
  static_assert(rule::dtypes.ok(), "kiln::matmul: both operands must hold one of int32, int64, float32 or float64");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(),
                "kiln::matmul: the inner dimensions must match (and batch dimensions broadcast)");
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    return typed::apply_kernel<T, OutD>(
        [](T* out, const T* x, const T* y) {
          constexpr ops::matmul_geometry g(Da::shape(), Db::shape(), OutD::shape());
          for (std::int64_t bi = 0; bi < g.batches; ++bi) {
            const auto [oa, ob] = g.operand_offsets(bi);
            if constexpr (std::is_integral_v<T> && g.m * g.n * g.k <= 64 * 64 * 64)
              typed::small_integer_matmul<T, g.m, g.n, g.k>(x + oa, y + ob, out + bi * g.m * g.n);
            else
              backend::cpu::gemm<T>(g.m, g.n, g.k, x + oa, g.k, y + ob, g.n, out + bi * g.m * g.n, g.n);
          }
        },
        a, b);
  }
}

/// `kiln::transpose<1, 0>(x)` on a typed operand: dims permuted by `Perm` (reversed
/// when empty).
template <std::int64_t... Perm, typed::operand X>
auto transpose(const X& x) {
  using T = typename typed::element_of<X>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  static_assert(sizeof...(Perm) == 0 || sizeof...(Perm) == std::size_t(D::rank),
                "kiln::transpose: the permutation must list every dim once");
  using rule = typed::transposed<D, Perm...>;
  using OutD = typed::dims_from<rule>;
  return typed::apply_kernel<T, OutD>(
      [](T* out, const T* in) {
        constexpr auto in_strides = row_major_strides(D::shape());
        std::array<std::int64_t, max_rank> index{};  // the output's multi-index
        for (std::int64_t i = 0; i < OutD::size; ++i) {
          std::int64_t from = 0;
          for (int d = 0; d < D::rank; ++d) from += index[std::size_t(d)] * in_strides[std::size_t(rule::perm[std::size_t(d)])];
          out[i] = in[from];
          for (int d = D::rank - 1; d >= 0 && ++index[std::size_t(d)] == OutD::values[std::size_t(d)]; --d)
            index[std::size_t(d)] = 0;
        }
      },
      x);
}

/// The typed spellings on a kiln::tensor, so that one generic callable serves both
/// tiers: `kiln::transpose<1, 0>(t)`, `kiln::reshape<3, 2>(t)`.
template <std::int64_t P, std::int64_t... More>
tensor transpose(const tensor& x) {
  return transpose(x, int_list{P, More...});
}
template <std::int64_t D, std::int64_t... More>
tensor reshape(const tensor& x) {
  return reshape(x, shape{D, More...});
}

#define KILN_TYPED_LIKE(fn, factory)                                                            \
  template <typed::operand X>                                                                   \
  auto fn(const X& x) {                                                                         \
    using V = std::remove_cvref_t<X>;                                                           \
    using F = typed::fixed_t<typename V::value_type, typename V::dims_type>;                    \
    if constexpr (typed::eager<X>)                                                              \
      return F::factory();                                                                      \
    else                                                                                        \
      return typed::symbol<typename V::value_type, typename V::dims_type>(F::factory());         \
  }
/// `kiln::ones_like(x)` of a typed operand: its type, all ones; a symbolic value in
/// a trace, so that a loop can rebind it (`auto c = kiln::ones_like(a); c = c * a;`).
KILN_TYPED_LIKE(ones_like, ones)
/// `kiln::zeros_like(x)` of a typed operand: its type, all zeros.
KILN_TYPED_LIKE(zeros_like, zeros)
#undef KILN_TYPED_LIKE

/// `kiln::reshape<3, 2>(x)` on a typed operand: the same elements in row-major order
/// as new dims with as many elements.
template <std::int64_t... Dims, typed::operand X>
auto reshape(const X& x) {
  using T = typename typed::element_of<X>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  static_assert(typed::dims<Dims...>::size == D::size, "kiln::reshape: the new dims must hold as many elements as the old");
  using OutD = typed::dims<Dims...>;
  if constexpr (typed::is_symbol<std::remove_cvref_t<X>>::value)
    return typed::symbol<T, OutD>(x.slot());  // the same slot, read with other dims
  else
    return typed::apply_kernel<T, OutD>([](T* out, const T* in) { std::copy_n(in, D::size, out); }, x);
}

}  // namespace kiln

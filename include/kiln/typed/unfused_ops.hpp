#pragma once
/// \file
/// The typed ops that end a fused expression, unfused: reductions (axes as template
/// arguments), matmul, conv2d, transpose, reshape, slice, gather, concat and stack (the
/// elementwise ops, which fuse, are kiln/typed/ops.hpp). Each runs the CPU backend's kernel for its one
/// element type, so its values are the eager kiln::tensor's bits, and its result's
/// type comes from the op's constexpr shape rule. On `fixed` values an op computes
/// at once; in a typed trace it is a step that reads its operands' slots (an
/// operand expression is evaluated into a slot first) and writes a new one.

#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "kiln/backend/cpu/conv2d.hpp"
#include "kiln/backend/cpu/gemm.hpp"
#include "kiln/backend/cpu/reduction.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"
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
  static constexpr ops::transpose op{[] {
    int_list l;
    for (int p : perm) l.push_back(p);
    return l;
  }()};
};

/// `ops::reshape` to `Dims`.
template <std::int64_t... Dims>
struct made_reshape {
  static constexpr ops::reshape op{dims<Dims...>::shape()};
};

/// The slot holding the value of operand `x` in the trace being recorded.
template <class X>
int slot_of(const X& x) {
  if constexpr (is_symbol<std::remove_cvref_t<X>>::value) {
    return x.slot();
  } else {
    using E = std::remove_cvref_t<decltype(expression_of<void, false>(x))>;
    return symbol<typename E::value_type, typename E::dims_type>(expression_of<void, false>(x)).slot();
  }
}

/// A step running `Kernel`, which computes `Made::op` into a value of type `Out` and
/// dims `OutD`, on the slots `in` (values of `fixed` types `In`) into slot `out`.
template <class Made, class Kernel, class Out, class OutD, class... In>
struct kernel_step {
  Kernel kernel;
  int out;
  std::array<int, sizeof...(In)> in;
  static void run(const void* data, frame f) {
    const auto& s = *static_cast<const kernel_step*>(data);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      s.kernel(static_cast<Out*>(f[s.out]), static_cast<const typename In::value_type*>(f[s.in[I]])...);
    }(std::index_sequence_for<In...>());
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& s = *static_cast<const kernel_step*>(data);
    sink.bind(s.out, sink.op(decltype(Made::op)::name, &Made::op, slot_values<In...>(sink, s.in), dtype_of<Out>, OutD::values));
  }
};

/// `kernel(out, in...)`, computing `Made::op` on the values of `x...`, giving a value
/// of type `OutT` and dims `OutD`: a `fixed` now, or a symbol written by a step of the
/// trace.
template <class OutT, class OutD, class Made, class Kernel, class... X>
auto apply_kernel(Kernel kernel, const X&... x) {
  if constexpr (eager<X...>) {
    fixed_t<OutT, OutD> out(uninitialized);
    kernel(out.data(), x.data()...);
    return out;
  } else {
    recorder& r = current_recorder();
    using step_t = kernel_step<Made, Kernel, OutT, OutD, fixed_t<typename element_of<X>::type, typename std::remove_cvref_t<X>::dims_type>...>;
    const std::array<int, sizeof...(X)> in{slot_of(x)...};
    const int out = r.add_slot(bytes_of<fixed_t<OutT, OutD>>);
    r.push(step_of(std::make_unique<const step_t>(step_t{kernel, out, in})));
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

/// A float product that the CPU gemm computes without packing and on one thread: each
/// element is one fused multiply-add chain over k, from zero and in order, as in its
/// micro-kernel, so the values are gemm's; with the sizes known at compile time only
/// this loop is compiled. Tiles of rows keep their accumulators in registers.
template <class T, std::int64_t M, std::int64_t N, std::int64_t K>
void direct_matmul(const T* KILN_RESTRICT a, const T* KILN_RESTRICT b, T* KILN_RESTRICT c) {
  namespace cpu = backend::cpu::detail;
  using B = batch<T>;
  constexpr std::int64_t w = B::size, vectors = (N + w - 1) / w, tail = N - (vectors - 1) * w;
  constexpr std::int64_t rows = std::max<std::int64_t>(1, std::min<std::int64_t>(M, 16 / vectors));
  auto tile = [&]<std::int64_t H>(std::integral_constant<std::int64_t, H>, std::int64_t i0) {
    B acc[H][vectors];
    for (std::int64_t r = 0; r < H; ++r)
      for (std::int64_t v = 0; v < vectors; ++v) acc[r][v] = B(T(0));
    for (std::int64_t p = 0; p < K; ++p) {
      B b_row[vectors];
      for (std::int64_t v = 0; v < vectors; ++v)
        b_row[v] = v + 1 < vectors || tail == w ? B::load_unaligned(b + p * N + v * w) : backend::cpu::load_partial(b + p * N + v * w, tail);
      for (std::int64_t r = 0; r < H; ++r) {
        const B a_value(a[(i0 + r) * K + p]);
        for (std::int64_t v = 0; v < vectors; ++v) acc[r][v] = math::multiply_add(a_value, b_row[v], acc[r][v]);
      }
    }
    for (std::int64_t r = 0; r < H; ++r)
      for (std::int64_t v = 0; v < vectors; ++v) {
        T* dst = c + (i0 + r) * N + v * w;
        if (v + 1 < vectors || tail == w)
          acc[r][v].store_unaligned(dst);
        else
          backend::cpu::store_partial(acc[r][v], dst, tail);
      }
  };
  std::int64_t i0 = 0;
  for (; i0 + rows <= M; i0 += rows) tile(std::integral_constant<std::int64_t, rows>(), i0);
  if constexpr (M % rows != 0) tile(std::integral_constant<std::int64_t, M % rows>(), i0);
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
    return apply_kernel<Out, OutD, made_op>(
        [](Out* out, const T* in) {
          namespace cpu = backend::cpu;
          constexpr auto axis = made_op::op.axis;
          constexpr std::int64_t count = ops::reduced_count(D::shape(), axis);
          constexpr cpu::reduction_layout layout(D::shape(), ops::reduced_dims(axis, D::rank));
          constexpr cpu::reduction_plan plan = cpu::plan_reduction(layout, count, std::int64_t(batch<T>::size));
          constexpr bool small = cpu::one_small_task(plan, D::size, count);
          cpu::reduce_planned<plan.kind, cpu::reducer_for<Op::kind, T>, small>(in, out, layout, plan, OutD::size, count);
          if constexpr (Op::kind == ops::reduction_kind::mean) cpu::sums_to_means<small>(out, OutD::size, count);
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
    return typed::apply_kernel<T, OutD, typed::made<ops::matmul>>(
        [](T* out, const T* x, const T* y) {
          constexpr ops::matmul_geometry g(Da::shape(), Db::shape(), OutD::shape());
          for (std::int64_t bi = 0; bi < g.batches; ++bi) {
            const auto [oa, ob] = g.operand_offsets(bi);
            if constexpr (std::is_integral_v<T> && g.m * g.n * g.k <= 64 * 64 * 64)
              typed::small_integer_matmul<T, g.m, g.n, g.k>(x + oa, y + ob, out + bi * g.m * g.n);
            else if constexpr (std::is_floating_point_v<T> && backend::cpu::detail::gemm_unpacked<T>(g.m, g.n, g.k) &&
                               double(g.m) * double(g.n) * double(g.k) < backend::cpu::detail::gemm_parallel_work)
              typed::direct_matmul<T, g.m, g.n, g.k>(x + oa, y + ob, out + bi * g.m * g.n);
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
  return typed::apply_kernel<T, OutD, rule>(
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

namespace typed {

/// A list of integers given as a template argument (`std::array{1, 0}`) as an int_list.
template <auto List>
constexpr int_list int_list_of() {
  int_list l;
  for (auto v : List) l.push_back(std::int64_t(v));
  return l;
}

/// `Op` (concat, stack or gather) along `Axis`, for op_rule.
template <class Op, std::int64_t Axis>
struct made_along {
  static constexpr Op op{Axis};
};

/// `ops::slice` of `Begin` and `Size`, for op_rule.
template <auto Begin, auto Size>
struct made_slice {
  static constexpr ops::slice op{int_list_of<Begin>(), int_list_of<Size>()};
};

/// Copies the block of `OutD` that starts at row-major offset `base` of an input of
/// dims `D` (a slice).
template <class D, class OutD, std::int64_t Base, class T>
void copy_block(T* KILN_RESTRICT out, const T* KILN_RESTRICT in) {
  constexpr auto strides = row_major_strides(D::shape());
  constexpr std::int64_t row = OutD::rank == 0 ? 1 : OutD::values[std::size_t(OutD::rank - 1)];
  std::array<std::int64_t, max_rank> index{};  // the output's multi-index, but for its last dim
  for (std::int64_t i = 0; i < OutD::size; i += row) {
    std::int64_t from = Base;
    for (int d = 0; d + 1 < OutD::rank; ++d) from += index[std::size_t(d)] * strides[std::size_t(d)];
    std::copy_n(in + from, row, out + i);
    for (int d = OutD::rank - 2; d >= 0 && ++index[std::size_t(d)] == OutD::values[std::size_t(d)]; --d)
      index[std::size_t(d)] = 0;
  }
}

}  // namespace typed

/// `kiln::slice<std::array{1, 0}, std::array{2, -1}>(x)` on a typed operand: the block
/// of `Size[d]` elements from `Begin[d]` along every dim d (-1: to the end of it);
/// that it lies within `x` is checked at compile time.
template <auto Begin, auto Size, typed::operand X>
auto slice(const X& x) {
  using T = typename typed::element_of<X>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  using made = typed::made_slice<Begin, Size>;
  using rule = typed::op_rule<made, std::remove_cvref_t<X>>;
  static_assert(rule::shapes.ok(), "kiln::slice: begin and size must have one entry per dim");
  static_assert(!rule::shapes.ok() || made::op.first_unfit_dim(D::shape()) < 0,
                "kiln::slice: begin and size must lie within the operand's dims");
  if constexpr (!rule::shapes.ok() || made::op.first_unfit_dim(D::shape()) >= 0) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    constexpr std::int64_t base = [] {
      const auto strides = row_major_strides(D::shape());
      std::int64_t b = 0;
      for (int d = 0; d < D::rank; ++d) b += made::op.begin[d] * strides[std::size_t(d)];
      return b;
    }();
    return typed::apply_kernel<T, OutD, made>([](T* out, const T* in) { typed::copy_block<D, OutD, base>(out, in); }, x);
  }
}

/// `kiln::gather<Axis>(x, indices)` on typed operands: the slices of `x` along `Axis`
/// at `indices` (int32 or int64, any dims; their values are checked when it runs,
/// raising kiln::invalid_argument_error as the runtime tier does).
template <std::int64_t Axis = 0, typed::operand X, typed::operand I>
auto gather(const X& x, const I& indices) {
  using T = typename typed::element_of<X>::type;
  using Index = typename typed::element_of<I>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  using ID = typename std::remove_cvref_t<I>::dims_type;
  using rule = typed::op_rule<typed::made_along<ops::gather, Axis>, std::remove_cvref_t<X>, std::remove_cvref_t<I>>;
  static_assert(rule::dtypes.ok(), "kiln::gather: the indices must be int32 or int64");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::gather: the axis must be one of the operand's dims");
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    constexpr int axis = ops::normalize_axis(Axis, D::rank);
    constexpr std::int64_t outer = elements_between(D::shape(), 0, axis), n = D::values[std::size_t(axis)],
                           inner = elements_between(D::shape(), axis + 1, D::rank), m = ID::size;
    return typed::apply_kernel<T, OutD, typed::made_along<ops::gather, Axis>>(
        [](T* out, const T* in, const Index* index) {
          ops::check_gather_indices(index, ID::shape(), Axis, D::shape());
          for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t j = 0; j < m; ++j) out = std::copy_n(in + (o * n + std::int64_t(index[j])) * inner, inner, out);
        },
        x, indices);
  }
}

namespace typed {
/// `ops::conv2d` with its strides and padding, for op_rule.
template <ops::padding Pad, std::int64_t StrideH, std::int64_t StrideW>
struct made_conv2d {
  static constexpr ops::conv2d op{StrideH, StrideW, Pad};
};
}  // namespace typed

/// `kiln::conv2d<kiln::padding::same, 2>(x, filters)` on typed operands: the 2-D
/// convolution of an NHWC input with HWIO filters, strides `StrideH` and `StrideW`,
/// shapes checked at compile time. It runs the runtime tier's CPU kernel, so it
/// gives its values.
template <ops::padding Pad = ops::padding::valid, std::int64_t StrideH = 1, std::int64_t StrideW = StrideH,
          typed::operand X, typed::operand F>
auto conv2d(const X& x, const F& filters) {
  using rule = typed::op_rule<typed::made_conv2d<Pad, StrideH, StrideW>, std::remove_cvref_t<X>, std::remove_cvref_t<F>>;
  static_assert(rule::dtypes.ok(), "kiln::conv2d: the input and filters must have one numeric element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(),
                "kiln::conv2d: the input (NHWC) and filters (HWIO) do not fit (ranks, channels or VALID sizes)");
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using T = typename typed::element_of<X>::type;
    using XD = typename std::remove_cvref_t<X>::dims_type;
    using FD = typename std::remove_cvref_t<F>::dims_type;
    using OutD = typed::dims_from<rule>;
    return typed::apply_kernel<T, OutD, typed::made_conv2d<Pad, StrideH, StrideW>>(
        [](T* out, const T* in, const T* f) {
          constexpr auto& xs = XD::values;
          constexpr auto& fs = FD::values;
          constexpr std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], StrideH, Pad).pad_before;
          constexpr std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], StrideW, Pad).pad_before;
          backend::cpu::conv2d<T>(in, xs[0], xs[1], xs[2], xs[3], f, fs[0], fs[1], fs[3], StrideH, StrideW, pad_h, pad_w, out,
                                  OutD::values[1], OutD::values[2]);
        },
        x, filters);
  }
}

/// The typed spellings of slice, gather and conv2d on kiln::tensors, so that one
/// generic callable serves both tiers.
template <auto Begin, auto Size>
tensor slice(const tensor& x) {
  return slice(x, typed::int_list_of<Begin>(), typed::int_list_of<Size>());
}
template <std::int64_t Axis>
tensor gather(const tensor& x, const tensor& indices) {
  return gather(x, indices, Axis);
}
template <ops::padding Pad, std::int64_t StrideH = 1, std::int64_t StrideW = StrideH>
tensor conv2d(const tensor& x, const tensor& filters) {
  return conv2d(x, filters, int_list{StrideH, StrideW}, Pad == ops::padding::valid ? "VALID" : "SAME");
}

namespace typed {

/// Joins operands along a dim: for each of `outer` rows, `chunk[k]` elements from
/// operand k in turn (concat and stack differ only in their chunks).
template <std::int64_t Outer, std::int64_t... Chunk, class T, class... In>
void join(T* out, const In*... in) {
  for (std::int64_t o = 0; o < Outer; ++o) ((out = std::copy_n(in + o * Chunk, Chunk, out)), ...);
}

template <class Op, std::int64_t Axis, class... X>
auto join_along(const X&... x) {
  using T = typename typed::element_of<std::tuple_element_t<0, std::tuple<X...>>>::type;
  using rule = typed::op_rule<typed::made_along<Op, Axis>, std::remove_cvref_t<X>...>;
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    using first = typename std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>::dims_type;
    // Dims before the axis make the rows; concat's axis is one of its operands' dims,
    // stack's a new one.
    constexpr int axis = int(Axis < 0 ? Axis + OutD::rank : Axis);
    constexpr std::int64_t outer = elements_between(first::shape(), 0, axis);
    return apply_kernel<T, OutD, made_along<Op, Axis>>(
        [](T* out, const auto*... in) { join<outer, (std::remove_cvref_t<X>::dims_type::size / outer)...>(out, in...); },
        x...);
  }
}

}  // namespace typed

/// `kiln::concat<1>(a, b, ...)` on typed operands: joined along an existing dim, the
/// others equal (checked at compile time).
template <std::int64_t Axis = 0, typed::operand... X>
  requires(sizeof...(X) > 0)
auto concat(const X&... x) {
  using rule = typed::op_rule<typed::made_along<ops::concat, Axis>, std::remove_cvref_t<X>...>;
  static_assert(rule::dtypes.ok(), "kiln::concat: the operands must have one element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::concat: the operands' dims must be equal but along the axis");
  return typed::join_along<ops::concat, Axis>(x...);
}

/// `kiln::stack<0>(a, b, ...)` on typed operands of one type: joined along a new dim.
template <std::int64_t Axis = 0, typed::operand... X>
  requires(sizeof...(X) > 0)
auto stack(const X&... x) {
  using rule = typed::op_rule<typed::made_along<ops::stack, Axis>, std::remove_cvref_t<X>...>;
  static_assert(rule::dtypes.ok(), "kiln::stack: the operands must have one element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::stack: the operands must have the same dims");
  return typed::join_along<ops::stack, Axis>(x...);
}

/// `kiln::concat<Axis>(a, b)` and `kiln::stack<Axis>(a, b)` on kiln::tensors, so that
/// one generic callable serves both tiers.
template <std::int64_t Axis = 0, class... T>
  requires(sizeof...(T) > 0 && (std::same_as<T, tensor> && ...))
tensor concat(const T&... x) {
  return concat({x...}, Axis);
}
template <std::int64_t Axis = 0, class... T>
  requires(sizeof...(T) > 0 && (std::same_as<T, tensor> && ...))
tensor stack(const T&... x) {
  return stack({x...}, Axis);
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
  auto fn(const X&) {                                                                           \
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
    return typed::apply_kernel<T, OutD, typed::made_reshape<Dims...>>([](T* out, const T* in) { std::copy_n(in, D::size, out); }, x);
}

}  // namespace kiln

#pragma once
/// \file
/// The per-op entry points a plan calls, chosen once when the plan is built: one
/// function pointer per graph node, so running a plan never visits the op variant,
/// checks a rule or switches on a dtype.
///
/// - `backend::cpu::run_fn` runs an elementwise op on one tile of a fused cluster: the
///   run of eager execution's kernel;
/// - `compound_fn` runs one with the scalar arithmetic around it folded into its
///   pass (kiln/exec/fold.hpp);
/// - `gather_fn` copies the elements of a broadcast operand that one tile reads;
/// - `check_fn` is an op's value check (integer division by zero, ...), run before
///   the cluster that holds the op;
/// - `op_fn` runs a node that is not fused: its value check, then its kernel into a
///   preallocated output, or `evaluate` for ops that make their result themselves
///   (detail::evaluated).

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/exec/fold.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail::exec {

/// Runs an elementwise op on one element: `out` and `in[k]` point to single values.
/// It is called as `fn(&op, &result, operands)`.
using scalar_fn = void (*)(const void* op, void* out, const void* const* in);

/// Checks an op's input values before anything runs (throws kiln::invalid_argument_error).
using check_fn = void (*)(const void* op, std::span<const tensor* const> in);

/// Runs a non-fused op on eager inputs: `out` is preallocated with the op's dtype
/// and shape for ops with a kernel; ops with `evaluate` assign it.
using op_fn = void (*)(const void* op, std::span<const tensor* const> in, tensor& out);

/// How the elements of a broadcast operand follow the elements of a cluster: the
/// cluster's loop nest after merging dims, with this operand's strides (0 where
/// it is broadcast).
struct broadcast_read {
  int rank = 1;
  std::array<std::int64_t, max_rank> size{};
  std::array<std::int64_t, max_rank> stride{};
  std::size_t element_bytes = 0;
  /// Copies `len` elements, from cluster element `lo` on, of operand `src` to `dst`.
  void (*gather)(const broadcast_read& b, const void* src, void* dst, std::int64_t lo, std::int64_t len) = nullptr;

  // A template, as what it instantiates (a gather per dtype) is needed only where a
  // file runs a graph.
  template <class = void>
  broadcast_read(dtype t, const shape& operand, const shape& cluster);
};

template <class T>
void gather_tile(const broadcast_read& b, const void* src, void* dst, std::int64_t lo, std::int64_t len) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  const int r = b.rank;
  std::array<std::int64_t, max_rank> idx{};
  std::int64_t off = 0;
  for (std::int64_t rest = lo, k = r - 1; k >= 0; --k) {
    idx[std::size_t(k)] = rest % b.size[std::size_t(k)];
    rest /= b.size[std::size_t(k)];
    off += idx[std::size_t(k)] * b.stride[std::size_t(k)];
  }
  const std::int64_t inner = b.size[std::size_t(r - 1)], step = b.stride[std::size_t(r - 1)];
  while (len > 0) {
    std::int64_t run = std::min(inner - idx[std::size_t(r - 1)], len);
    if (step == 1)
      std::copy_n(s + off, run, d);
    else if (step == 0)
      std::fill_n(d, run, s[off]);
    else
      for (std::int64_t i = 0; i < run; ++i) d[i] = s[off + i * step];
    d += run;
    len -= run;
    off += run * step;
    idx[std::size_t(r - 1)] += run;
    for (int k = r - 1; k > 0 && idx[std::size_t(k)] == b.size[std::size_t(k)]; --k) {
      off += b.stride[std::size_t(k - 1)] - idx[std::size_t(k)] * b.stride[std::size_t(k)];
      idx[std::size_t(k)] = 0;
      ++idx[std::size_t(k - 1)];
    }
  }
}

template <class>
broadcast_read::broadcast_read(dtype t, const shape& operand, const shape& cluster) {
  const buffer_view view{nullptr, t, operand};
  const backend::cpu::loop_nest<1> nest(std::span<const buffer_view>(&view, 1), cluster);
  rank = nest.rank;
  size = nest.size;
  stride = nest.stride[0];
  element_bytes = size_of(t);
  visit_dtype(t, [&]<class T>() {
    if constexpr (!std::is_same_v<T, std::string>) gather = &gather_tile<T>;
  });
}

// An op with a SIMD kernel runs its batch functor on a broadcast batch, so that one
// element gets the bits it gets in a tile or eagerly (their kernels use the batch
// functor for every element, kiln/backend/cpu/elementwise.hpp).
// An op that refuses some integer operands (ops::checks_integer_operand) checks its
// one element here, so that a scalar program runs it without a check of tensors.
template <class Op, class In, class Out>
void run_scalar(const void* op, void* out, const void* const* in) {
  const Op& o = *static_cast<const Op*>(op);
  auto arg = [&](int k) { return *static_cast<const In*>(in[k]); };
  Out* result = static_cast<Out*>(out);
  if constexpr (ops::checks_integer_operand<Op> && math::is_signed_integer<In>)
    if (ops::refused_integer_operand<Op>(arg(1))) ops::throw_refused_integer_operand<Op>();
  if constexpr (backend::cpu::simd_kernel<Op, In, Out>) {
    using B = xsimd::batch<In>;
    if constexpr (Op::arity == 1)
      *result = o(B(arg(0))).get(0);
    else
      *result = o(B(arg(0)), B(arg(1))).get(0);
  } else {
    *result = kiln::math::convert<Out>(
        ops::invoke_elementwise(o, arg, [&](int k) { return *static_cast<const bool*>(in[k]); }));
  }
}

template <class Op>
void check_op(const void* op, std::span<const tensor* const> in) {
  check_values(*static_cast<const Op*>(op), in);
}

template <class Op, dtype_set Only = dtypes::all>
void run_op(const void* p, std::span<const tensor* const> in, tensor& out) {
  const Op& op = *static_cast<const Op*>(p);
  if constexpr (requires { check_values(op, in); }) check_values(op, in);
  if constexpr (evaluated<Op>) {
    out = op.evaluate(in);
  } else {
    run_kernel_into(in, out, &backend_kernel<backend::cpu_backend, Op, Only>, p);
  }
}

/// The entry points of one graph op, as a plan stores them.
struct op_entry {
  const void* op = nullptr;      ///< the op object inside the graph node
  op_fn run = nullptr;           ///< run unfused
  backend::cpu::run_fn tile = nullptr;  ///< run on a tile; null when the op cannot be fused
  /// Run on a tile with folded arithmetic; null unless the op has a SIMD kernel.
  compound_fn compound = nullptr;
  scalar_fn scalar = nullptr;    ///< run on one element; set with `tile`
  check_fn check = nullptr;      ///< value check; null when the op has none
  bool scalar_checks = false;    ///< `scalar` makes `check`'s check itself
  bool evaluates = false;        ///< the result may share an input's buffer (reshape, x[i])
  in_place_fn in_place = nullptr;  ///< writes the result into a sole first input (set_item)
  /// The op's C++ name when a native loop can call its functor on xsimd batches
  /// (a SIMD kernel for these dtypes and no attributes); empty otherwise.
  std::string_view native_name{};
};

/// The entry points of `op` for value operands of dtype `in` and a result of dtype
/// `out`. Elementwise ops on strings are not fused (their elements are objects).
/// One instantiation per op holds all of the op's CPU kernels as a plan uses them
/// (not `inline`, so that kiln/separate_compilation.hpp can compile it once per program); `Only`
/// limits them to some dtypes (detail::apply_bookkeeping).
template <class Op, dtype_set Only = dtypes::all>
op_entry entry_for(const Op& op, dtype in, dtype out) {
  op_entry e;
  e.op = &op;
  e.run = &run_op<Op, Only>;
  e.evaluates = evaluated<Op>;
  e.in_place = kernels_in_place<Op>;
  if constexpr (requires(std::span<const tensor* const> s) { check_values(op, s); }) e.check = &check_op<Op>;
  e.scalar_checks = ops::checks_integer_operand<Op>;
  if constexpr (ops::elementwise<Op>) {
    if (in != string && out != string)
      backend::visit_elementwise_types<Only>(op, in, out, [&]<class In, class Out>() {
        if constexpr (!std::is_same_v<In, std::string> && !std::is_same_v<Out, std::string>) {
          e.tile = &backend::cpu::erased_run<Op, In, Out>;
          e.scalar = &run_scalar<Op, In, Out>;
        }
        if constexpr (backend::cpu::simd_kernel<Op, In, Out>) {
          // Folding pays where chains of float arithmetic run; integer chains run
          // unfolded, which spares every program two dtypes' folded kernels.
          if constexpr (can_fold_arithmetic && std::is_floating_point_v<In>) e.compound = &run_compound<Op, In>;
          if constexpr (std::is_empty_v<Op>) e.native_name = ops::qualified_name<Op>;
        }
      });
  }
  return e;
}

}  // namespace kiln::detail::exec
namespace kiln::detail::exec {

/// The entry points of the op a graph node holds.
inline op_entry entry_of(const ops::any_op& op, dtype in, dtype out) {
  return kernels_of(op).entry.load(std::memory_order_acquire)(op, in, out);
}

}  // namespace kiln::detail::exec

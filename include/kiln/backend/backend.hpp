#pragma once
/// \file
/// Backends are tag types. A backend implements op `Op` by providing an overload
///   void compute(Tag, const Op&, std::span<const buffer_view> inputs, const buffer_view& output);
/// found by argument-dependent lookup; `supports<Tag, Op>` asks whether one exists.
/// The output is preallocated with the dtype and shape the op's rules gave.
/// An overload for one op is a template all the same (`template <class = void>`): a
/// plain inline function would compile its kernels, for every dtype, in every source
/// file that includes kiln, whether or not it calls the op.

#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/op.hpp"

namespace kiln::backend {

/// Plain scalar loops: the executable specification every other backend is tested against.
struct reference_backend {
  static constexpr std::string_view name = "reference";
};
/// SIMD (xsimd) and multi-threaded kernels for device::cpu.
struct cpu_backend {
  static constexpr std::string_view name = "cpu";
};
/// Thrust kernels for device::gpu (CUDA under nvcc, the host device system otherwise).
struct thrust_backend {
  static constexpr std::string_view name = "thrust";
};

/// True when backend `B` has a kernel for op `Op`.
/// \code static_assert(kiln::backend::supports<kiln::backend::cpu_backend, kiln::ops::add>); \endcode
template <class B, class Op>
concept supports = requires(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  compute(B{}, op, in, out);
};

/// Strides (in elements) of an input broadcast to `out`: 0 along broadcast dims.
/// Aligned to the output's rank.
constexpr std::array<std::int64_t, max_rank> broadcast_strides(const shape& in, const shape& out) {
  std::array<std::int64_t, max_rank> st{};
  std::int64_t acc = 1;
  int offset = out.rank() - in.rank();
  for (int i = in.rank() - 1; i >= 0; --i) {
    st[i + offset] = in[i] == 1 ? 0 : acc;
    acc *= in[i];
  }
  return st;
}

template <class Op, class In, bool Condition = Op::leading_condition,
          class Values = std::make_index_sequence<Op::arity - ops::value_operand<Op>>>
struct elementwise_result;
template <class Op, class In, std::size_t... I>
struct elementwise_result<Op, In, false, std::index_sequence<I...>> {
  using type = std::decay_t<decltype(std::declval<const Op&>()((void(I), std::declval<const In&>())...))>;
};
template <class Op, class In, std::size_t... I>
struct elementwise_result<Op, In, true, std::index_sequence<I...>> {
  using type = std::decay_t<decltype(std::declval<const Op&>()(true, (void(I), std::declval<const In&>())...))>;
};
/// The C++ type an elementwise op produces from operands of type `In`.
template <class Op, class In>
using elementwise_result_t = typename elementwise_result<Op, In>::type;

/// The error for an elementwise op's dtype that this program compiled no kernel for:
/// only kiln's own bookkeeping ran the op, with kernels for the dtypes `only`
/// (detail::apply_bookkeeping).
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_kernel_not_compiled(std::string_view op, dtype_set only, dtype in,
                                                                         dtype out) {
  std::vector<std::string_view> names;
  for (int t = 0; t < dtype_count; ++t)
    if (only.contains(dtype(t))) names.push_back(name(dtype(t)));
  std::string listed;
  for (std::size_t k = 0; k < names.size(); ++k)
    listed.append(k == 0 ? "" : k + 1 == names.size() ? " and " : ", ").append(names[k]);
  throw unavailable_error(std::string(op) + ": this program compiled its kernels for " + listed +
                          " only (for kiln's own bookkeeping), not for " + std::string(name(in)) + " -> " +
                          std::string(name(out)) + "; call the op once where the graph is run, or link kiln's "
                          "kernels (kiln_add_library, or KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS) in one source file)");
}

/// The error for a dtype pair that an op's rules should have refused before its
/// kernels: out of line, since each op's dtype visit reaches it once per dtype.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_unexpected_dtypes(std::string_view op, dtype in, dtype out) {
  throw internal_error(std::string(op) + ": dtypes " + std::string(name(in)) + " -> " + std::string(name(out)) +
                       " reached a kernel");
}

/// Calls `f.template operator()<In, Out>()` with the C++ types an elementwise op
/// reads and writes, instantiating only the dtypes the op accepts that are in `Only`
/// (for an op only kiln's bookkeeping runs, detail::bookkeeping_dtypes). `In` is the
/// dtype of the value operands (for `where`, the branches).
template <dtype_set Only = dtypes::all, ops::elementwise Op, class F>
void visit_elementwise_types([[maybe_unused]] const Op& op, dtype in, dtype out, F&& f) {
  visit_dtype(in, [&]<class In>() {
    if constexpr (!Op::accepts.contains(dtype_of<In>)) {
      throw_unexpected_dtypes(Op::name, in, out);
    } else if constexpr (!Only.contains(dtype_of<In>)) {
      throw_kernel_not_compiled(Op::name, Only, in, out);
    } else if constexpr (Op::converts) {
      visit_dtype(out, [&]<class Out>() {
        if constexpr (!Only.contains(dtype_of<Out>))
          throw_kernel_not_compiled(Op::name, Only, in, out);
        else if constexpr (std::is_same_v<In, std::string> == std::is_same_v<Out, std::string>)
          f.template operator()<In, Out>();
      });
    } else {
      using Out = elementwise_result_t<Op, In>;
      if (dtype_of<Out> != out) throw_unexpected_dtypes(Op::name, in, out);
      if constexpr (!Only.contains(dtype_of<Out>))
        throw_kernel_not_compiled(Op::name, Only, in, out);
      else
        f.template operator()<In, Out>();
    }
  });
}

/// An elementwise op's CPU kernels for the dtypes `Only` alone (defined in
/// kiln/backend/cpu/elementwise.hpp; see detail::apply_bookkeeping).
template <dtype_set Only, ops::elementwise Op>
void compute_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out);

/// `compute(B{}, op, in, out)`; on the CPU with the kernels of the dtypes `Only`
/// alone, unless `Only` is every dtype: how eager runs and plans reach an op's kernels.
template <dtype_set Only, class B, class Op>
void compute_with(B, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  if constexpr (Only != dtypes::all && std::is_same_v<B, cpu_backend>)
    compute_elementwise<Only>(op, in, out);
  else
    compute(B{}, op, in, out);
}

}  // namespace kiln::backend

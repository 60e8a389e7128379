#pragma once
/// \file
/// The single entry point through which every op function of the library runs:
/// `detail::apply(op, inputs...)`. It is declared here, below the op families, and
/// defined in kiln/eager/apply.hpp, which runs the op now on eager tensors or hands
/// it to the tracer (kiln/trace/) when an input is symbolic.

#include <array>
#include <concepts>
#include <span>
#include <string>
#include <type_traits>

#include "kiln/core/tensor.hpp"
#include "kiln/ops/math.hpp"

namespace kiln {
namespace detail {

/// The dtypes of kiln's own bookkeeping: loop counters and trip counts, bool
/// conditions, tensor_array sizes. An elementwise op that only this bookkeeping runs
/// compiles its kernels for these dtypes alone (apply_bookkeeping); under separate
/// compilation the library has every kernel already.
#if defined(KILN_SEPARATE_COMPILATION)
inline constexpr dtype_set bookkeeping_dtypes = dtypes::all;
#else
inline constexpr dtype_set bookkeeping_dtypes{bool_, int32, int64};
#endif

/// Runs (or records) `op` on `inputs` and returns its result. `Only` limits the
/// dtypes whose kernels an elementwise op compiles here (kiln/ops/op_table.hpp).
template <class Op, dtype_set Only = dtypes::all>
tensor apply_span(const Op& op, std::span<const tensor* const> inputs);

/// Records `op` on `inputs` into the trace in progress (defined by the tracer,
/// kiln/trace/trace_context.hpp).
template <class Op>
tensor record_symbolic(const Op& op, std::span<const tensor* const> inputs);

/// Whether a trace is in progress on this thread (defined by the tracer).
inline bool tracing();

/// Which errors an op whose operands do not fit raises, as TensorFlow 2.12 does in
/// each mode: when it runs (eagerly, or in a graph whose dims are known only then)
/// `invalid_argument_error`; while a function is traced `type_error` for dtypes and
/// `value_error` for shapes.
enum class rule_errors : bool { run, trace };

/// The mode of an op on `inputs`: recorded into a trace (one is in progress, or an
/// input is symbolic), or run. (A template on nothing: kiln/fixed.hpp alone has no
/// tracer to define tracing().)
template <class = void>
rule_errors rule_errors_for(std::span<const tensor* const> in) {
  bool symbolic = tracing();
  for (const tensor* t : in) symbolic = symbolic || t->is_symbolic();
  return symbolic ? rule_errors::trace : rule_errors::run;
}

/// Raises `E` with `text` while tracing, else invalid_argument_error.
template <class E>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_operand_error(rule_errors mode, const std::string& text) {
  if (mode == rule_errors::trace) throw E(text);
  throw invalid_argument_error(text);
}

/// Makes `Op`'s kernels reachable from graphs: instantiated by every call of the op,
/// so that a program compiles the kernels of the ops it calls (kiln/ops/op_table.hpp).
template <class Op, dtype_set Only = dtypes::all>
void register_kernels_on_use();

template <class Op, std::same_as<tensor>... Ts>
tensor apply(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return apply_span(op, std::span<const tensor* const>(ptrs));
}

/// `op` on `inputs` as kiln's own bookkeeping runs it (elementwise ops on
/// bookkeeping_dtypes): where the program does not call the op itself, it compiles
/// the op's kernels for those dtypes only.
/// \code kiln::detail::apply_bookkeeping(kiln::ops::less{}, kiln::constant(0), kiln::constant(3));  // true \endcode
template <class Op, std::same_as<tensor>... Ts>
tensor apply_bookkeeping(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return apply_span<Op, bookkeeping_dtypes>(op, std::span<const tensor* const>(ptrs));
}

/// Runs `op` now on eager `inputs` with the kernels of their device (defined in
/// kiln/eager/apply.hpp).
template <class Op, dtype_set Only = dtypes::all>
tensor execute(const Op& op, std::span<const tensor* const> inputs);

/// Runs `op` now on eager `inputs`, recording nothing even while a trace is in
/// progress: how an op's `evaluate` uses other ops, since it computes a value, also
/// when constant folding evaluates it during a trace.
template <class Op, std::same_as<tensor>... Ts>
tensor execute_now(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return execute(op, std::span<const tensor* const>(ptrs));
}

/// A scalar tensor holding `value` converted to dtype `t` on device `d`.
template <class S>
tensor make_scalar(kiln::dtype t, S value, kiln::device d) {
  tensor out(t, shape{}, kiln::device::cpu);
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string> || std::is_convertible_v<S, std::string>) {
      if constexpr (std::is_same_v<T, std::string> && std::is_convertible_v<S, std::string>)
        *out.view().template as<T>() = T(value);  // T, not std::string: dependent, so only checked where S converts
      else
        throw type_error("cannot combine a " + std::string(name(t)) + " tensor with a " +
                         (std::is_convertible_v<S, std::string> ? std::string("string") : std::string("numeric")) +
                         " C++ value");
    } else {
      *out.view().template as<T>() = math::convert<T>(value);
    }
  });
  return d == kiln::device::cpu ? out : out.to(d);
}

}  // namespace detail

/// A C++ value that kiln promotes to a tensor when it meets one in an op: numbers
/// take the other operand's dtype (`x + 1`), strings join string tensors (`s + "!"`).
template <class S>
concept promotable_scalar = std::is_arithmetic_v<S> || std::is_convertible_v<S, std::string>;

}  // namespace kiln

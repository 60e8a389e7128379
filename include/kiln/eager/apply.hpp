#pragma once
/// \file
/// Eager execution of one op: check the inputs against the op's dtype and shape
/// rules (raising the contract's errors with both sides in the message), allocate
/// the result on the inputs' device and run the device's backend kernel.

#include <atomic>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend/backend.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/core/small_vector.hpp"
#include "kiln/eager/check_numerics.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/op_table.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {
namespace detail {

/// "int32 (2, 3), float32 (3,)": the inputs as an error message shows them.
KILN_COLD KILN_LIBRARY_INLINE std::string describe_inputs(std::span<const tensor* const> in);

// The errors of the checks below, out of line: every file that runs an op eagerly
// compiles these checks, and an inline message costs a temporary and its cleanup per
// piece.

/// `E` saying "op: what; got <the inputs>".
template <class E>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_with_inputs(std::string_view op, std::string_view what,
                                                            std::span<const tensor* const> in) {
  std::string text(op);
  text += ": ";
  text += what;
  text += "; got ";
  text += describe_inputs(in);
  throw E(text);
}

[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_empty_input(std::string_view op, std::size_t i) {
  throw invalid_argument_error(std::string(op) + ": input " + std::to_string(i) + " is an empty tensor");
}

[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_no_kernel(std::string_view op, std::string_view where) {
  throw unavailable_error(std::string(op) + ": " + std::string(where));
}

[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_mixed_devices(std::string_view op, kiln::device a, kiln::device b) {
  throw invalid_argument_error(std::string(op) + ": inputs are on different devices (" + std::string(name(a)) + " and " +
                               std::string(name(b)) + ")");
}

/// The dtypes and shapes of an op's inputs, or the error for an empty input.
struct input_types {
  small_vector<dtype, 4> dtypes;
  small_vector<shape, 4> shapes;

  input_types(std::string_view op, std::span<const tensor* const> in) {
    dtypes.reserve(in.size());
    shapes.reserve(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!in[i]->defined()) throw_empty_input(op, i);
      dtypes.emplace_back(in[i]->dtype());
      shapes.emplace_back(in[i]->shape());
    }
  }
};

/// The error of op `op` (named `op_name`) whose rule rejected `in` for the reason
/// `what`, as `mode` says (`E` while tracing), naming the inputs and the op's attributes.
template <class E>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_rule_error(rule_errors mode, std::string_view op_name, std::string_view what,
                                                          std::span<const tensor* const> in, const void* op,
                                                          const op_rules& rules) {
  std::string text(op_name);
  text += ": ";
  text += what;
  text += "; got ";
  text += describe_inputs(in);
  if (rules.attributes) {
    const std::string attributes = rules.attributes(op);
    if (!attributes.empty()) text += " with " + attributes;
  }
  throw_operand_error<E>(mode, text);
}

/// What running or recording an op checks that does not depend on the op
/// (`rule_checks`, the one specialization): a template on nothing, compiled once in a
/// compiled kiln by one explicit instantiation (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_rule_checks {
  /// The dtype and shape the op `op` named `op_name` gives for `inputs` by `rules`, or
  /// the contract's error for `mode`.
  static std::pair<dtype, shape> infer_by_rules(std::string_view op_name, const void* op, const op_rules& rules,
                                                std::span<const tensor* const> in, rule_errors mode);
};
using rule_checks = basic_rule_checks<void>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
std::pair<dtype, shape> basic_rule_checks<Unused>::infer_by_rules(std::string_view op_name, const void* op,
                                                                  const op_rules& rules,
                                                                  std::span<const tensor* const> in, rule_errors mode) {
  const input_types types(op_name, in);
  const dtype_result dt = rules.result_dtype(op, types.dtypes);
  if (!dt.ok()) throw_rule_error<type_error>(mode, op_name, dt.failure, in, op, rules);
  const shape_result sh = [&] {
    try {
      return rules.result_shape(op, types.shapes);
    } catch (const value_error& e) {  // a result that kiln::shape refuses: too many elements
      throw_rule_error<value_error>(mode, op_name, e.what(), in, op, rules);
    }
  }();
  if (!sh.ok()) throw_rule_error<value_error>(mode, op_name, sh.failure, in, op, rules);
  if (!sh.value.count_fits())
    throw_rule_error<value_error>(mode, op_name, "the result shape " + sh.value.str() + " has more elements than an int64 can count",
                                  in, op, rules);
  return {dt.value, sh.value};
}
#endif

/// The dtype and shape `op` gives for `inputs`, or the contract's error for `mode`
/// (running it, or recording it into a trace).
template <class Op>
std::pair<dtype, shape> infer(const Op& op, std::span<const tensor* const> in, rule_errors mode = rule_errors::run) {
  return rule_checks::infer_by_rules(Op::name, &op, rules_of<Op>, in, mode);
}

/// The device all of an op's inputs are on (the CPU for none), or the error for
/// inputs that are symbolic or on different devices.
inline kiln::device input_device(std::string_view op, std::span<const tensor* const> in) {
  const kiln::device dev = in.empty() ? kiln::device::cpu : in[0]->device();
  for (const tensor* t : in) {
    t->require_value(op);
    if (t->device() != dev) throw_mixed_devices(op, dev, t->device());
  }
  return dev;
}

/// A backend kernel behind a function pointer: writes `op`'s result for `in` to `out`.
using kernel_call = void (*)(const void* op, std::span<const buffer_view> in, const buffer_view& out);

/// Backend `B`'s kernel of `Op` (on the CPU, of the dtypes `Only`) as a kernel_call:
/// the one function that eager runs and plans (kiln/exec/tile.hpp) both call.
template <class B, class Op, dtype_set Only = dtypes::all>
void backend_kernel(const void* op, std::span<const buffer_view> in, const buffer_view& out) {
  if constexpr (!KILN_DEVICE_PASS || !std::is_same_v<B, backend::cpu_backend>)
    backend::compute_with<Only>(B{}, *static_cast<const Op*>(op), in, out);
}

/// Runs `kernel` on `in` into `out`, already allocated, when `out` has elements.
inline void run_kernel_into(std::span<const tensor* const> in, tensor& out, kernel_call kernel, const void* op) {
  if (out.size() == 0) return;
  small_vector<buffer_view, 4> views;
  views.reserve(in.size());
  for (const tensor* t : in) views.emplace_back(t->view());
  kernel(op, std::span<const buffer_view>(views), out.view());
}

/// Allocates op `op_name`'s `dt` `sh` result on `dev` and runs `kernel` into it, so
/// that what every op does around its kernel is compiled once.
inline tensor run_kernel(std::string_view op_name, dtype dt, const shape& sh, kiln::device dev,
                         std::span<const tensor* const> in, kernel_call kernel, const void* op) {
  tensor out = allocate_result(op_name, dt, sh, dev);
  run_kernel_into(in, out, kernel, op);
  return out;
}

/// Whether `Op` makes its eager result itself instead of running a kernel: reshape and
/// x[i] re-describe their input's buffer, set_item, pad_rows and crop_or_pad run other ops.
template <class Op>
concept evaluated = requires(const Op& op, std::span<const tensor* const> in) { op.evaluate(in); };

/// Runs `op` on eager `inputs` with backend `B` (on the device the inputs are on),
/// with the CPU kernels of the dtypes `Only` (an elementwise op's; see
/// apply_bookkeeping). Not `inline`: kiln/separate_compilation.hpp can compile it once per program.
template <class B, class Op, dtype_set Only = dtypes::all>
tensor run_on(const Op& op, std::span<const tensor* const> in) {
  auto [dt, sh] = infer(op, in);
  const kiln::device dev = input_device(Op::name, in);
  // An op whose values can be wrong for its kernel (an index out of range, an
  // integer division by zero) provides `check_values`, found by argument-dependent lookup.
  if constexpr (requires { check_values(op, in); }) check_values(op, in);
  if constexpr (evaluated<Op>) {
    return op.evaluate(in);
  } else if constexpr (!backend::supports<B, Op>) {
    // Reached only through kiln/separate_compilation.hpp, which instantiates every op on every backend.
    throw_no_kernel(Op::name, "the " + std::string(B::name) + " backend has no kernel for it");
  } else {
    return run_kernel(Op::name, dt, sh, dev, in, &backend_kernel<B, Op, Only>, &op);
  }
}

/// Runs `op` on eager `inputs` with the backend of the device they are on.
template <class Op, dtype_set Only>
tensor execute(const Op& op, std::span<const tensor* const> in) {
  if (!in.empty() && in[0]->device() == kiln::device::gpu) {
#if KILN_HAS_THRUST
    if constexpr (backend::supports<backend::thrust_backend, Op> || evaluated<Op>)
      return run_on<backend::thrust_backend>(op, in);
#endif
    throw_no_kernel(Op::name, "no GPU kernel in this build");
  }
  return run_on<backend::cpu_backend, Op, Only>(op, in);
}

template <class Op, dtype_set Only>
tensor apply_span(const Op& op, std::span<const tensor* const> in) {
  // Checked first, and the rest left out for such an op, so that this is the error,
  // rather than pages from ops::any_op's constructor.
  static_assert(ops::registered<Op>,
                "kiln: this op has no row in the op registry: add F(<op>) to its family's list in kiln/ops/op_list.hpp");
  if constexpr (ops::registered<Op>) {
    register_kernels_on_use<Op, Only>();
    // Inside a trace every op is recorded, eager inputs or not, as TensorFlow records
    // ops on constants: folding them is the optimizer's pass, which leaves an op that
    // fails in the graph, to fail only if it runs (non-strict execution).
    const bool symbolic = records_symbolically(in);
    tensor out = symbolic ? record_symbolic(op, in) : execute<Op, Only>(op, in);
    if (!symbolic)
      if (const numerics_check check = hooks().check_numerics.load(std::memory_order_relaxed)) check(Op::name, out, {});
    // Tapes record symbolic ops too: a tape inside a kiln::function differentiates the
    // trace, its backward pass joining the same graph.
    if (tapes_recording()) record_on_tapes(op, in, out);
    return out;
  } else {
    return {};
  }
}

}  // namespace detail
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string describe_inputs(std::span<const tensor* const> in) {
  std::string s;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    s += name(in[i]->dtype());
    s += ' ';
    s += in[i]->shape().str();
  }
  return s;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

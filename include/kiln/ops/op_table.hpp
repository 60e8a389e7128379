#pragma once
/// \file
/// The op table: the kernels this program compiled, one row per op of the registry,
/// how graphs reach kernels without compiling every op of the library. Below every
/// layer that looks an op up in it (passes, plans, executors, eager, the tracer and
/// the tapes); a row holds function pointers to code of those layers, which the row's
/// registration (register_kernels) names by declaration only, each defined by its layer.
///
/// A graph can hold any op, so a plan or the optimizer that dispatched over every op
/// of the registry would compile the kernels of all of them, for every dtype and
/// backend, in each source file that runs a kiln::function. Instead an op's row is
/// filled when the program first runs the op (`detail::apply`, the one entry point of
/// every op function, eager or traced, registers it): a source file pays for the ops
/// it calls. A row that only kiln's own bookkeeping filled (loop counters:
/// detail::apply_bookkeeping) has the kernels of bools and integers alone until the
/// program calls the op itself. A graph that meets an op whose row is empty, or
/// lacks its dtype (one made by another program, or by ops inlined from a library),
/// raises kiln::unavailable_error naming the op. Separate compilation (kiln/separate_compilation.hpp)
/// registers every op it instantiates.

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/any_op.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/op.hpp"

namespace kiln::detail {

namespace exec {
struct op_entry;

/// Runs an op whose result may take its first input's buffer (ops::set_item): `x`
/// holds that input, which no later node reads, and `in[0]` points to `x`. After the
/// value checks, the op takes `x` (it is then empty, as `*in[0]` is) and may return
/// its buffer, written in place.
using in_place_fn = tensor (*)(const void* op, tensor& x, std::span<const tensor* const> in);

template <class Op>
tensor run_in_place(const void* p, tensor& x, std::span<const tensor* const> in) {
  const Op& op = *static_cast<const Op*>(p);
  if constexpr (requires { check_values(op, in); }) check_values(op, in);
  return op.evaluate_in_place(std::move(x), in);
}
/// `Op`'s in_place_fn, or null when it has no evaluate_in_place.
template <class Op>
inline constexpr in_place_fn kernels_in_place = [] {
  if constexpr (requires(const Op& op, tensor&& x, std::span<const tensor* const> in) { op.evaluate_in_place(std::move(x), in); })
    return &run_in_place<Op>;
  else
    return static_cast<in_place_fn>(nullptr);
}();

/// The entry points a plan calls for `op` (defined in kiln/exec/tile.hpp).
template <class Op, dtype_set Only>
op_entry entry_for(const Op& op, dtype in, dtype out);

}  // namespace exec

/// An op's dtype and shape rules behind pointers, so that what checks an op's inputs
/// around them (infer) is compiled once rather than once per op; and, for an op that
/// has attributes the inputs do not show (`perm=[1, 0]`), their text for its errors.
struct op_rules {
  dtype_result (*result_dtype)(const void* op, std::span<const dtype> in);
  shape_result (*result_shape)(const void* op, std::span<const shape> in);
  std::string (*attributes)(const void* op);  ///< null for an op without
};
template <class Op>
inline constexpr op_rules rules_of{
    [](const void* op, std::span<const dtype> in) { return static_cast<const Op*>(op)->result_dtype(in); },
    [](const void* op, std::span<const shape> in) { return static_cast<const Op*>(op)->result_shape(in); },
    [] {
      if constexpr (requires(const Op& o) { o.attributes(); })
        return +[](const void* op) { return static_cast<const Op*>(op)->attributes(); };
      else
        return static_cast<std::string (*)(const void*)>(nullptr);
    }()};

/// True when an op on `in` is recorded rather than run: while tracing, or when an
/// input is symbolic.
KILN_LIBRARY_INLINE bool records_symbolically(std::span<const tensor* const> in);

/// Runs the gradient formula of the `Op` that `op` holds for the inputs `needed` marks
/// (defined in kiln/autodiff/backward.hpp, which gives each op's row its backward: a
/// program that calls an op compiles its formula there, while the op table stays below
/// autodiff).
template <class Op>
void backward_of(const ops::any_op& op, std::span<const tensor> inputs, const tensor& output, const tensor& upstream,
                 std::span<const char> needed, std::span<tensor> grads);

/// The entry points of one op, type-erased over the graph's op variant. Atomic, as a
/// thread may register an op (again, after kiln/separate_compilation.hpp did) while another runs
/// a graph that holds it.
struct op_kernels {
  using execute_fn = tensor (*)(const ops::any_op&, std::span<const tensor* const>);
  using entry_fn = exec::op_entry (*)(const ops::any_op&, dtype, dtype);
  /// Runs the op now on eager inputs (kiln::detail::execute); null until registered.
  std::atomic<execute_fn> execute{nullptr};
  /// The entry points a plan calls (exec::entry_for); set before `execute`.
  std::atomic<entry_fn> entry{nullptr};
  /// The op's dtype and shape rules (exec::infer_values calls them on a plan's inputs
  /// with the op's `any_op::address`); set before `execute`.
  std::atomic<const op_rules*> rules{nullptr};
  using backward_fn = void (*)(const ops::any_op&, std::span<const tensor>, const tensor&, const tensor&,
                               std::span<const char>, std::span<tensor>);
  /// The op's gradient formula (detail::backward_of); set before `execute`.
  std::atomic<backward_fn> backward{nullptr};
  /// Records the op into the trace in progress (a gradient formula run while tracing,
  /// by a tape inside a kiln::function); set before `execute`.
  std::atomic<execute_fn> record{nullptr};
  using equal_fn = bool (*)(const ops::any_op&, const ops::any_op&);
  /// Whether two ops of this row have the same attributes; set before `execute`.
  std::atomic<equal_fn> equal{nullptr};
  /// Runs the op writing its first input in place (exec::in_place_fn), for ops that
  /// can (set_item, pad_rows), else null; set before `execute`.
  std::atomic<exec::in_place_fn> in_place{nullptr};
};

/// One row per op of the registry; a row is empty until its op registers.
KILN_LIBRARY_INLINE std::array<op_kernels, ops::any_op::size>& kernel_table();

/// Serializes registrations, so that a row registered for bookkeeping dtypes never
/// replaces a complete one.
KILN_LIBRARY_INLINE std::mutex& registration_mutex();

/// Fills `Op`'s row; with `Only` (detail::apply_bookkeeping), with kernels for those
/// dtypes alone and only if the row is empty: the op's first call by the program
/// itself fills it again, complete.
template <class Op, dtype_set Only = dtypes::all>
bool register_kernels() {
  op_kernels& row = kernel_table()[ops::any_op::position_of<Op>];
  std::lock_guard lock(registration_mutex());
  if constexpr (Only != dtypes::all)
    if (row.execute.load(std::memory_order_acquire)) return true;
  if constexpr (!KILN_DEVICE_PASS) {  // the CPU planner and its fused kernels (config.hpp)
    row.entry.store(
        [](const ops::any_op& op, dtype in, dtype out) { return exec::entry_for<Op, Only>(op.unchecked<Op>(), in, out); },
        std::memory_order_release);
    row.rules.store(&rules_of<Op>, std::memory_order_release);
  }
  row.backward.store(&backward_of<Op>, std::memory_order_release);
  row.record.store([](const ops::any_op& op, std::span<const tensor* const> in) {
    return record_symbolic(op.unchecked<Op>(), in);
  }, std::memory_order_release);
  row.equal.store([](const ops::any_op& a, const ops::any_op& b) { return a.unchecked<Op>() == b.unchecked<Op>(); },
                  std::memory_order_release);
  row.in_place.store(exec::kernels_in_place<Op>, std::memory_order_release);
  row.execute.store(
      [](const ops::any_op& op, std::span<const tensor* const> in) { return execute<Op, Only>(op.unchecked<Op>(), in); },
      std::memory_order_release);
  return true;
}

/// Fills `Op`'s row before main runs: how kiln/separate_compilation.hpp registers every op it
/// instantiates.
template <class Op>
inline const bool kernels_registered = register_kernels<Op>();

/// Fills `Op`'s row at its first call (before its first node can be recorded). At
/// run time rather than before main, so that an op function that a source file
/// compiles but never runs costs no machine code for its kernels.
template <class Op, dtype_set Only>
void register_kernels_on_use() {
  static const bool registered = register_kernels<Op, Only>();
  (void)registered;
}

/// The row of the op a graph node holds, or kiln::unavailable_error naming the op.
KILN_LIBRARY_INLINE const op_kernels& kernels_of(const ops::any_op& op);

/// Whether `a` and `b` are the same op with the same attributes. Through the kernel
/// table, so that comparing ops compiles the comparisons of the ops this program
/// calls, not of every op; false for an op whose row is empty.
KILN_LIBRARY_INLINE bool same_op(const ops::any_op& a, const ops::any_op& b);

/// Runs the op a graph node holds now, on eager inputs.
/// How `op` runs writing its first input in place, or null when it cannot (see
/// op_kernels::in_place).
KILN_LIBRARY_INLINE exec::in_place_fn in_place_of(const ops::any_op& op);

KILN_LIBRARY_INLINE tensor execute_any(const ops::any_op& op, std::span<const tensor* const> in);

KILN_LIBRARY_INLINE void record_any_on_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out);

template <class Op>
void record_on_tapes(const Op& op, std::span<const tensor* const> in, tensor& out) {
  record_any_on_tapes(ops::any_op(std::in_place_type<Op>, op), in, out);
}

/// Runs the op a graph node holds on `in`: now on eager inputs, or recorded into the
/// trace in progress (where a tape inside a kiln::function differentiates).
KILN_LIBRARY_INLINE tensor run_registered(const ops::any_op& op, std::span<const tensor* const> in);

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE bool records_symbolically(std::span<const tensor* const> in) {
  bool symbolic = tracing();
  for (const tensor* t : in) symbolic = symbolic || t->is_symbolic();
  return symbolic;
}

KILN_LIBRARY_INLINE std::array<op_kernels, ops::any_op::size>& kernel_table() {
  static std::array<op_kernels, ops::any_op::size> table{};
  return table;
}

KILN_LIBRARY_INLINE std::mutex& registration_mutex() {
  static std::mutex m;
  return m;
}

KILN_LIBRARY_INLINE const op_kernels& kernels_of(const ops::any_op& op) {
  if (op.index() == ops::any_op::size) throw internal_error("kernels_of: a node that holds no op");
  const op_kernels& row = kernel_table()[op.index()];
  if (!row.execute.load(std::memory_order_acquire)) {
    throw unavailable_error(std::string(ops::name_of(op)) +
                            ": this program compiled no kernel for this op, since it never calls the op itself; call "
                            "it once where the graph is run, or link kiln's kernels (kiln_add_library, or "
                            "KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS) in one source file)");
  }
  return row;
}

KILN_LIBRARY_INLINE bool same_op(const ops::any_op& a, const ops::any_op& b) {
  if (a.index() != b.index() || a.index() == ops::any_op::size) return false;
  const auto equal = kernel_table()[a.index()].equal.load(std::memory_order_acquire);
  return equal && equal(a, b);
}

KILN_LIBRARY_INLINE exec::in_place_fn in_place_of(const ops::any_op& op) {
  return kernels_of(op).in_place.load(std::memory_order_acquire);
}

KILN_LIBRARY_INLINE tensor execute_any(const ops::any_op& op, std::span<const tensor* const> in) {
  return kernels_of(op).execute.load(std::memory_order_acquire)(op, in);
}

KILN_LIBRARY_INLINE void record_any_on_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out) {
  hooks().tape.load(std::memory_order_relaxed)(op, in, out);
}

KILN_LIBRARY_INLINE tensor run_registered(const ops::any_op& op, std::span<const tensor* const> in) {
  tensor out =
      records_symbolically(in) ? kernels_of(op).record.load(std::memory_order_acquire)(op, in) : execute_any(op, in);
  if (tapes_recording()) record_any_on_tapes(op, in, out);
  return out;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// Separate compilation: kiln's kernels and heavy runtime functions compiled once per
/// program rather than once per source file.
///
/// Header-only, every source file that runs ops compiles the kernels of every op it
/// can reach, for every dtype and backend: running a kiln::function reaches them all,
/// about 3 MB of machine code and minutes of -O3 per source file. A program of many
/// source files can compile them in one place instead: define
/// `KILN_SEPARATE_COMPILATION` in every source file, so that kiln only declares them,
/// and compile them in one source file that also defines `KILN_LIBRARY_SOURCE` and
/// instantiates the kernels with `KILN_INSTANTIATE_KERNELS(list)`, where `list` is one
/// of the op lists of kiln/ops/registry.hpp (several source files may share the lists).
/// Such a file, compiled with the same flags as the rest of the program, is three
/// lines: `#define KILN_LIBRARY_SOURCE`, `#include <kiln/kiln.hpp>` and
/// `KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS)`. The CMake function
/// `kiln_add_library(<target>)` (cmake/kiln_library.cmake) writes and builds such a
/// library, one source file per op family so that they compile side by side,
/// and defines `KILN_SEPARATE_COMPILATION` for whatever links it. Results are the same
/// either way: the same code is compiled, in fewer places.

#include <span>

#include "kiln/autodiff/function_gradient.hpp"
#include "kiln/config.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/exec/executor.hpp"
#include "kiln/exec/tile.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/op_table.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/trace/control_flow.hpp"
#include "kiln/trace/effects.hpp"
#include "kiln/trace/random.hpp"
#include "kiln/trace/runtime_tier.hpp"
#include "kiln/train/optimizers.hpp"

namespace kiln::detail {
/// Registers `Op`'s kernels (kernels_registered): a function, so that the object file
/// of a compiled kiln that instantiates it can be referenced by name.
template <class Op>
bool kernels_linked();
/// In a compiled kiln, the kernels_linked of every op (defined by the source file
/// that defines KILN_LIBRARY_SOURCE). Every source file compiled against it refers to
/// this table, so that a static linker takes every op's object file from the library
/// and a program runs graphs of ops it never calls (a loaded saved function).
using kernels_link_function = bool (*)();
extern const kernels_link_function every_op_kernels[];
}  // namespace kiln::detail

template <class Op>
bool kiln::detail::kernels_linked() {
  return kernels_registered<Op>;
}

// An op's kernels are reached through two templates: eager execution on one backend
// (kiln::detail::execute picks it from the inputs' device) and the entry points a
// graph plan calls; its gradient formula through a third.
#define KILN_DETAIL_RUN_ON(prefix, tag, op)                                                                \
  prefix template ::kiln::tensor kiln::detail::run_on<::kiln::backend::tag, ::kiln::ops::op>(              \
      const ::kiln::ops::op&, std::span<const ::kiln::tensor* const>);
#if KILN_HAS_THRUST
#define KILN_DETAIL_RUN_ON_THRUST(prefix, op) KILN_DETAIL_RUN_ON(prefix, thrust_backend, op)
#else
#define KILN_DETAIL_RUN_ON_THRUST(prefix, op)
#endif
#define KILN_DETAIL_KERNELS_OF(prefix, op)                                                                 \
  prefix template bool kiln::detail::kernels_linked<::kiln::ops::op>();                                    \
  KILN_DETAIL_RUN_ON(prefix, cpu_backend, op)                                                              \
  KILN_DETAIL_RUN_ON_THRUST(prefix, op)                                                                    \
  prefix template ::kiln::detail::exec::op_entry kiln::detail::exec::entry_for<::kiln::ops::op>(           \
      const ::kiln::ops::op&, ::kiln::dtype, ::kiln::dtype);                                               \
  prefix template ::kiln::tensor kiln::detail::apply_span<::kiln::ops::op, ::kiln::dtypes::all>(          \
      const ::kiln::ops::op&, std::span<const ::kiln::tensor* const>);                                     \
  prefix template void kiln::detail::backward_of<::kiln::ops::op>(                                         \
      const ::kiln::ops::any_op&, std::span<const ::kiln::tensor>, const ::kiln::tensor&,                  \
      const ::kiln::tensor&, std::span<const char>, std::span<::kiln::tensor>);
#define KILN_DETAIL_EXTERN_KERNELS_OF(op) KILN_DETAIL_KERNELS_OF(extern, op)
// Instantiating the kernels also registers them, so that graphs of a program linking
// them reach every op, whether the program calls it or not.
#define KILN_DETAIL_INSTANTIATE_KERNELS_OF(op) \
  KILN_DETAIL_KERNELS_OF(, op)                  \
  template const bool kiln::detail::kernels_registered<::kiln::ops::op>;

/// Compiles, in this source file, the kernels of every op of `list` (an X-macro of
/// kiln/ops/registry.hpp: KILN_ALL_OPS, KILN_UNARY_OPS, KILN_BINARY_OPS, ...).
/// For example `KILN_INSTANTIATE_KERNELS(KILN_REDUCTION_OPS)`, at namespace scope.
#define KILN_INSTANTIATE_KERNELS(list) list(KILN_DETAIL_INSTANTIATE_KERNELS_OF)

#if defined(KILN_SEPARATE_COMPILATION)
KILN_ALL_OPS(KILN_DETAIL_EXTERN_KERNELS_OF)
#endif

#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_SOURCE)
#define KILN_DETAIL_KERNELS_LINKED(op) &::kiln::detail::kernels_linked<::kiln::ops::op>,
const kiln::detail::kernels_link_function kiln::detail::every_op_kernels[] = {KILN_ALL_OPS(KILN_DETAIL_KERNELS_LINKED)};
#undef KILN_DETAIL_KERNELS_LINKED
#elif defined(KILN_SEPARATE_COMPILATION) && !defined(KILN_DETAIL_NATIVE_LOOP_SOURCE)
// (A native loop of jit_compile, compiled from the single header into a shared object
// that the program loads, runs no kernel and must not refer to the table: the
// program's executable does not export it.)
namespace kiln::detail {
namespace {
// `used`: kept, with its reference to the table, in an optimized object that never reads it.
[[gnu::used]] const kernels_link_function* const link_every_op_kernels = every_op_kernels;
}  // namespace
}  // namespace kiln::detail
#endif

// The runtime's deferred code: class templates on nothing (each has one
// specialization, on void), so that a header-only program compiles their members only
// where it uses them, and so that under separate compilation the source file that
// defines KILN_LIBRARY_SOURCE compiles every member of each with one line, and every
// other file none: a member added to one of these classes is compiled with it.
#define KILN_DETAIL_RUNTIME_CLASSES(prefix)                          \
  prefix template struct kiln::detail::basic_rule_checks<void>;      \
  prefix template struct kiln::detail::basic_tape_runtime<void>;     \
  prefix template struct kiln::detail::basic_function_state<void>;   \
  prefix template struct kiln::detail::basic_concrete_state<void>;   \
  prefix template struct kiln::detail::basic_control_flow_tracer<void>; \
  prefix template class kiln::detail::basic_graph_executor<void>;    \
  prefix template class kiln::detail::optimizer<void>;               \
  prefix template struct kiln::detail::basic_nn_functions<void>;     \
  prefix template struct kiln::detail::basic_random_draws<void>;     \
  prefix template struct kiln::optimizers::detail::basic_optimizer_updates<void>; \
  prefix template struct kiln::detail::basic_variable_writes<void>;    \
  prefix template struct kiln::detail::exec::basic_value_inference<void>; \
  prefix template struct kiln::detail::exec::basic_planner<void>;    \
  prefix template struct kiln::detail::exec::basic_memory_planner<void>; \
  prefix template class kiln::detail::exec::slot_allocator<void>;    \
  prefix template struct kiln::detail::exec::basic_lowering<void>;   \
  prefix template struct kiln::detail::exec::basic_fusion<void>;     \
  prefix template class kiln::detail::exec::native_compiler<void>;   \
  prefix template class kiln::detail::basic_tensors_stage<void>;     \
  prefix template class kiln::detail::basic_slices_stage<void>;      \
  prefix template class kiln::detail::basic_range_stage<void>;       \
  prefix template class kiln::detail::basic_map_stage<void>;         \
  prefix template class kiln::detail::basic_take_stage<void>;        \
  prefix template class kiln::detail::basic_shuffle_stage<void>;     \
  prefix template class kiln::detail::basic_shard_stage<void>;       \
  prefix template class kiln::detail::basic_prefetch_stage<void>;    \
  prefix template class kiln::detail::basic_reduce_dataset_op<void>; \
  prefix template struct kiln::layers::detail::sequential_state<void>; \
  prefix template struct kiln::layers::detail::dense_state<void>;    \
  prefix template struct kiln::layers::detail::conv2d_state<void>;   \
  prefix template struct kiln::layers::detail::pooling_state<void>;  \
  prefix template struct kiln::layers::detail::flatten_state<void>;  \
  prefix template struct kiln::layers::detail::dropout_state<void>;  \
  prefix template struct kiln::layers::detail::embedding_state<void>; \
  prefix template struct kiln::layers::detail::basic_normalization<void>; \
  prefix template struct kiln::layers::detail::batch_normalization_state<void>; \
  prefix template struct kiln::layers::detail::layer_normalization_state<void>; \
  prefix template struct kiln::losses::detail::basic_loss_terms<void>; \
  prefix template struct kiln::initializers::detail::basic_initializer_draws<void>;
// The runtime's functions that are not templates (the graph building of traces, a
// tensor's storage, a call's signature and frame, format_values, host_callback's run,
// ...) are declared KILN_LIBRARY_INLINE instead (kiln/config.hpp), their definitions
// in `#if KILN_DEFINE_LIBRARY` blocks that other files do not parse.
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_SOURCE)
KILN_DETAIL_RUNTIME_CLASSES()
#elif defined(KILN_SEPARATE_COMPILATION)
KILN_DETAIL_RUNTIME_CLASSES(extern)
#endif

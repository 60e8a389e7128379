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

#include "kiln/config.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/exec/kernel_table.hpp"
#include "kiln/exec/tile.hpp"
#include "kiln/ops/registry.hpp"

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
  KILN_DETAIL_RUN_ON(prefix, cpu_backend, op)                                                              \
  KILN_DETAIL_RUN_ON_THRUST(prefix, op)                                                                    \
  prefix template ::kiln::detail::exec::op_entry kiln::detail::exec::entry_for<::kiln::ops::op>(           \
      const ::kiln::ops::op&, ::kiln::dtype, ::kiln::dtype);                                               \
  prefix template void kiln::detail::backward_of<::kiln::ops::op>(                                         \
      const ::kiln::ops::any_op&, std::span<const ::kiln::tensor>, const ::kiln::tensor&,                  \
      const ::kiln::tensor&, std::span<::kiln::tensor>);
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

#pragma once
/// \file
/// The ranks a training loop runs on, as training loops (kiln::fit) and checkpoints
/// see them: a hook declared here, below the distributed component, and filled by
/// `kiln::distribute::data_parallel::scope()` (kiln/distributed.hpp), so that code that
/// does not include that component trains, reports and saves correctly under it.
///
/// What such code does with it (docs/distributed.md, "Hooks"): a training step applies
/// `average_gradients(grads)` instead of `grads`; before its first step a loop calls
/// `broadcast_variables` on the model's and the optimizer's variables; the losses and
/// metrics it reports go through `mean`; a checkpoint is written where `writes_files()`
/// holds, then every rank waits at `barrier`; a checkpoint restored on every rank needs
/// nothing more, one restored on the root alone is followed by `broadcast_variables`.
/// Outside a scope `current_replica_context()` is null: one process, nothing to do.

#include <span>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/trace/effects.hpp"

namespace kiln::detail {

/// What a training loop needs of the ranks it runs on. The function pointers take
/// `self`, the strategy that filled them.
struct replica_context {
  int rank = 0;  ///< this process's rank among the replicas
  int size = 1;  ///< how many replicas train together
  const void* self = nullptr;
  /// The gradients averaged over the ranks (the all-reduce mean, in buckets), in the
  /// same order; an undefined gradient stays undefined. Eagerly, or into the function
  /// being traced.
  std::vector<tensor> (*average_gradients)(const void* self, const std::vector<tensor>& grads) = nullptr;
  /// Gives every rank the root's values of `vars`.
  void (*broadcast_variables)(const void* self, const std::vector<variable>& vars) = nullptr;
  /// Replaces each value by its mean over the ranks (losses and metrics to report).
  void (*mean)(const void* self, std::span<double> values) = nullptr;
  /// Returns when every rank has called it.
  void (*barrier)(const void* self) = nullptr;

  /// Whether this rank writes the files of the run (checkpoints, logs): the first.
  bool writes_files() const { return rank == 0; }
};

/// The replicas of the training this thread runs, or null outside a strategy's scope.
/// \code
/// if (const kiln::detail::replica_context* replicas = kiln::detail::current_replica_context())
///   std::cout << "replica " << replicas->rank << " of " << replicas->size << "\n";
/// \endcode
KILN_LIBRARY_INLINE const replica_context*& current_replica_context();

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE const replica_context*& current_replica_context() {
  thread_local const replica_context* context = nullptr;
  return context;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

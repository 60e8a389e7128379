#pragma once
/// \file
/// How a special op is differentiated: what a replayed trace's special node hands to
/// the gradient tapes recording (kiln/autodiff/replay.hpp). Declared here, below the
/// layers that differentiate the ops, and filled by them: kiln/autodiff/ registers
/// variable reads, `cond` and `while`, kiln/distribute/ its collectives. An op that
/// nobody registers has no gradient: its results are constants to the tapes.

#include <atomic>
#include <span>
#include <string_view>

#include "kiln/graph/graph.hpp"

namespace kiln::detail {

/// Records special node `op`, run on `inputs` with `results`, on the tapes recording.
using special_tape_recorder = void (*)(const special_op& op, std::span<const tensor> inputs,
                                       std::span<const tensor> results);

/// One op's entry: its name and how it is recorded. Entries live as long as the
/// program (a registrant keeps them in static storage) and are never removed.
struct special_gradient {
  std::string_view op;
  special_tape_recorder record;
  const special_gradient* next = nullptr;
};

/// The head of the list of entries: a few, pushed once each, read by every replayed
/// special node, so a lock-free list rather than a map behind a lock.
KILN_LIBRARY_INLINE std::atomic<const special_gradient*>& special_gradients();

/// Adds `entry` (static storage) for its op; an entry already there stays as it is.
KILN_LIBRARY_INLINE void register_special_gradient(special_gradient& entry);

/// How the special op named `op` is recorded, or null when it has no gradient.
KILN_LIBRARY_INLINE special_tape_recorder special_gradient_of(std::string_view op);

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::atomic<const special_gradient*>& special_gradients() {
  static std::atomic<const special_gradient*> head{nullptr};
  return head;
}

KILN_LIBRARY_INLINE void register_special_gradient(special_gradient& entry) {
  const special_gradient* head = special_gradients().load(std::memory_order_acquire);
  do {
    // (pushed twice, an entry would point at itself and every lookup would loop)
    for (const special_gradient* e = head; e; e = e->next)
      if (e == &entry) return;
    entry.next = head;
  } while (!special_gradients().compare_exchange_weak(head, &entry, std::memory_order_acq_rel));
}

KILN_LIBRARY_INLINE special_tape_recorder special_gradient_of(std::string_view op) {
  for (const special_gradient* e = special_gradients().load(std::memory_order_acquire); e; e = e->next)
    if (e->op == op) return e->record;
  return nullptr;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

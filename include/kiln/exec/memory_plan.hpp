#pragma once
/// \file
/// The planner's memory stage: which values reach memory, where each lives (reused
/// workspace slots, fresh buffers, or the tensors of the caller and the graph), and
/// the step after which a fresh value is dropped.

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kiln/exec/fusion.hpp"
#include "kiln/exec/plan.hpp"

namespace kiln::detail::exec {

/// Workspace slots of one dtype, reused by values whose lives do not overlap. A value
/// takes a free slot when its step runs and gives it back after its last read, so no
/// step writes where it reads.
template <class = void>
class slot_allocator {
 public:
  /// A slot of at least `elements` elements, busy through step `until`: the smallest
  /// idle slot that fits, else the largest (which then grows), else a new one.
  int take(std::int64_t elements, int until);

  /// Makes the slots whose values are last read at step `step` or before idle.
  void finish_step(int step);

  /// Elements per slot.
  std::vector<std::int64_t> sizes() &&;

 private:
  struct live_slot {
    int slot;
    int until;
  };
  std::vector<std::int64_t> sizes_;
  std::vector<live_slot> busy_;
  std::vector<int> idle_;
};

/// Where the values of a plan live.
struct memory_plan {
  node_map<bool> in_memory;  ///< values a cluster must write (read outside it, or outputs)
  std::vector<int> fresh;    ///< values created during a call, cleared after it
  std::vector<int> bound;    ///< values in slots
  std::vector<std::vector<int>> release;  ///< per step: fresh values it reads last
  std::array<std::vector<std::int64_t>, dtype_count> slot_elements;  ///< per dtype, per slot
  node_map<int> last_use;  ///< per value: the step that reads it last (the step count for outputs)
};

/// Memory planning, the planner's stage that gives values their homes: a class template
/// on nothing, as the planner's other stages, compiled where a plan is built.
template <class Unused = void>
struct basic_memory_planner {
  /// The memory plan of the scheduled steps `s`; sets the home of every op's value in
  /// `values`, and the slot of those in slots.
  static memory_plan plan_memory(const graph& g, const graph_outline& outline, const node_map<op_entry>& entries,
                                 const clustering& clusters, const schedule& s, node_map<value_info>& values);
};
using memory_planner = basic_memory_planner<>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
memory_plan basic_memory_planner<Unused>::plan_memory(const graph& g, const graph_outline& outline,
                                                      const node_map<op_entry>& entries, const clustering& clusters,
                                                      const schedule& s, node_map<value_info>& values) {
  const std::size_t n = g.nodes().size();
  const int end = int(s.steps.size());
  memory_plan m{node_map<bool>(n, false), {}, {}, std::vector<std::vector<int>>(s.steps.size()), {}, node_map<int>(n, -1)};

  // The step that reads each value last (the end of the call for outputs).
  node_map<int>& last_use = m.last_use;
  for (int id : outline.ops)
    for (int in : g.node_at(id).input_ids()) {
      last_use[in] = std::max(last_use[in], s.step_of[id]);
      const int c = clusters.cluster_of[in];
      if (c >= 0 && c != clusters.cluster_of[id]) m.in_memory[in] = true;
    }
  node_map<bool> is_output(n, false);
  for (int out : outline.outputs) {
    last_use[out] = end;
    m.in_memory[out] = true;
    is_output[out] = true;
  }

  // Values linked through ops that re-describe buffers (reshape) may share memory:
  // if one of them is an output, none of them may live in reused memory, and the
  // memory of one lives as long as any of them is read.
  node_map<int> root(n);
  for (int v = 0; v < root.size(); ++v) root[v] = v;
  auto find = [&](int v) {
    while (root[v] != v) v = root[v] = root[root[v]];
    return v;
  };
  for (int id : outline.ops)
    if (entries[id].evaluates)
      for (int in : g.node_at(id).input_ids()) root[find(in)] = find(id);
  node_map<bool> escapes(n, false);
  node_map<int> family_last_use(n, -1);
  for (int id : outline.ops) {
    const int r = find(id);
    // A special op may keep what it reads (a variable keeps what is assigned to it).
    escapes[r] = escapes[r] || is_output[id] || g.node_at(id).kind() == node_kind::special;
    family_last_use[r] = std::max(family_last_use[r], last_use[id]);
  }

  for (int id : outline.ops) {
    value_info& v = values[id];
    if (clusters.cluster_of[id] >= 0 && !m.in_memory[id])
      v.home = value_home::unused;
    else if (entries[id].evaluates)
      v.home = value_home::evaluated;
    else if (v.type == string || escapes[find(id)])
      v.home = value_home::fresh;
    else
      v.home = value_home::slot;
    if (v.home == value_home::fresh || v.home == value_home::evaluated) m.fresh.push_back(id);
    if (v.home == value_home::slot) m.bound.push_back(id);
  }

  // Fresh values are dropped after their last reader; outputs at the end of the call.
  for (int id : m.fresh)
    if (last_use[id] >= 0 && last_use[id] < end) m.release[std::size_t(last_use[id])].push_back(id);

  std::array<slot_allocator<>, dtype_count> slots;
  std::vector<std::vector<int>> defined(s.steps.size());
  for (int id : m.bound) defined[std::size_t(s.step_of[id])].push_back(id);
  for (int k = 0; k < end; ++k) {
    for (int id : defined[std::size_t(k)]) {
      value_info& v = values[id];
      v.slot = slots[std::size_t(v.type)].take(std::max<std::int64_t>(v.dims.num_elements(), 1),
                                                std::max(family_last_use[find(id)], k));
    }
    for (slot_allocator<>& a : slots) a.finish_step(k);
  }
  for (int t = 0; t < dtype_count; ++t) m.slot_elements[std::size_t(t)] = std::move(slots[std::size_t(t)]).sizes();
  return m;
}
#endif

}  // namespace kiln::detail::exec

#if KILN_DEFINE_LIBRARY
namespace kiln::detail::exec {

template <class Unused>
int slot_allocator<Unused>::take(std::int64_t elements, int until) {
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it)
    if (sizes_[std::size_t(*it)] >= elements &&
        (best == idle_.end() || sizes_[std::size_t(*it)] < sizes_[std::size_t(*best)]))
      best = it;
  if (best == idle_.end())
    best = std::max_element(idle_.begin(), idle_.end(),
                            [&](int a, int b) { return sizes_[std::size_t(a)] < sizes_[std::size_t(b)]; });
  int slot;
  if (best == idle_.end()) {
    slot = int(sizes_.size());
    sizes_.push_back(elements);
  } else {
    slot = *best;
    idle_.erase(best);
    sizes_[std::size_t(slot)] = std::max(sizes_[std::size_t(slot)], elements);
  }
  busy_.push_back({slot, until});
  return slot;
}

template <class Unused>
void slot_allocator<Unused>::finish_step(int step) {
  for (std::size_t i = 0; i < busy_.size();) {
    if (busy_[i].until <= step) {
      idle_.push_back(busy_[i].slot);
      busy_[i] = busy_.back();
      busy_.pop_back();
    } else {
      ++i;
    }
  }
}

template <class Unused>
auto slot_allocator<Unused>::sizes() && -> std::vector<std::int64_t> {
  return std::move(sizes_);
}

}  // namespace kiln::detail::exec
#endif  // KILN_DEFINE_LIBRARY

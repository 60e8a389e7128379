#pragma once
/// \file
/// The memory one run of a plan works in: a tensor per graph value, the reused
/// buffers ("slots") of values that never leave the call, and the tile scratch of
/// fused clusters. A workspace serves one run at a time and is kept for the next,
/// so a call in steady state allocates only its outputs. Workspaces are shared by
/// all plans of a graph, and by the graphs of one function's traces (workspace_pool):
/// a slot grows to the largest size any plan asks for.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kiln/core/allocator.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/exec/plan.hpp"
#include "kiln/graph/graph.hpp"

namespace kiln::detail::exec {

/// 64-byte aligned bytes from kiln's host allocator, kept until a larger size is asked for.
class scratch_buffer {
 public:
  scratch_buffer() = default;
  scratch_buffer(const scratch_buffer&) = delete;
  scratch_buffer& operator=(const scratch_buffer&) = delete;
  ~scratch_buffer() { host_allocator().deallocate(data_, bytes_); }

  /// At least `bytes` bytes; the previous contents are not kept.
  char* reserve(std::size_t bytes) {
    if (bytes > bytes_) {
      host_allocator().deallocate(data_, bytes_);
      data_ = nullptr;
      bytes_ = 0;
      data_ = static_cast<char*>(host_allocator().allocate(bytes));
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  char* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class workspace {
 public:
  /// The plan the values and slots are laid out for (execution_plan::id), 0 for none.
  std::uint64_t bound_plan = 0;
  /// The tensors of the nodes whose values the call holds (slot views, fresh buffers,
  /// evaluated results, and a special op's results side by side), in node order;
  /// value(v) is node v's. Not one per node: a fused chain of 10^5 ops holds a few,
  /// and a tensor per node made each first call fill megabytes it never read.
  std::vector<tensor> values;
  /// Node v's tensor (for a node whose value the call holds).
  tensor& value(int v) { return values[index_of(v)]; }
  /// Where node v's tensor is in `values`.
  std::size_t index_of(int v) const { return std::size_t(at_[std::size_t(v)]); }
  /// Where each value is: an argument, a constant of the graph, or `values[i]`.
  std::vector<const tensor*> refs;
  /// Input pointers of the op or check being run.
  std::vector<const tensor*> inputs;
  /// Base pointers of a cluster's operands in memory, by table entry.
  std::vector<void*> bases;

  /// Lays the workspace out for plan `p` of graph `g`; allocates only slots that grow.
  template <class = void>
  void bind(const graph& g, const execution_plan& p) {
    const std::size_t n = std::size_t(p.values.size());
    at_.assign(n, -1);
    int held = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (g.nodes()[i].kind() == node_kind::special) {
        // Its results side by side, whatever their homes, for the op to write them (a
        // tensor for one without results too, which the plan may still release).
        const std::size_t count = std::max<std::size_t>(std::size_t(g.nodes()[i].result_count()), 1);
        for (std::size_t k = 0; k < count; ++k) at_[i + k] = held + int(k);
        held += int(count);
        i += count - 1;
        continue;
      }
      const value_home home = p.values[int(i)].home;
      if (home == value_home::slot || home == value_home::fresh || home == value_home::evaluated) at_[i] = held++;
    }
    values.assign(std::size_t(held), tensor());
    refs.assign(n, nullptr);
    for (std::size_t i = 0; i < n; ++i) {
      switch (p.values[int(i)].home) {
        case value_home::constant: refs[i] = &g.nodes()[i].value(); break;
        case value_home::slot:
        case value_home::fresh:
        case value_home::evaluated: refs[i] = &value(int(i)); break;
        default: break;
      }
    }
    for (int t = 0; t < dtype_count; ++t) {
      const auto& need = p.slot_elements[std::size_t(t)];
      auto& have = slots_[std::size_t(t)];
      if (have.size() < need.size()) have.resize(need.size());
      for (std::size_t k = 0; k < need.size(); ++k)
        if (!have[k].defined() || have[k].size() < need[k]) have[k] = tensor(dtype(t), shape{need[k]});
    }
    for (int v : p.bound) {
      const value_info& info = p.values[v];
      value(v) = slots_[std::size_t(info.type)][std::size_t(info.slot)].share(info.dims);
    }
    inputs.resize(std::max(inputs.size(), p.max_inputs));
    bases.resize(std::max(bases.size(), std::size_t(p.max_table)));
    bound_plan = p.id;
  }

  /// Tile scratch for `chunks` chunks of cluster `c`: buffers, then pointer tables.
  template <class = void>
  void reserve_chunks(const fused_cluster& c, std::int64_t chunks, char*& buffers, void**& tables) {
    buffers = scratch_.reserve(std::size_t(chunks) * c.chunk_bytes());
    // Whole cache lines per chunk: threads that write their tables for every tile
    // must not share a line.
    constexpr std::size_t line_entries = 64 / sizeof(void*);
    const std::size_t entries = std::size_t(chunks) * std::size_t(c.table_stride()) + line_entries - 1;
    if (tables_.size() < entries) tables_.resize(entries);
    const auto misaligned = reinterpret_cast<std::uintptr_t>(tables_.data()) / sizeof(void*) % line_entries;
    tables = tables_.data() + (misaligned ? line_entries - misaligned : 0);
  }

 private:
  std::vector<int> at_;  ///< by node: its tensor's index in `values`, or -1
  std::array<std::vector<tensor>, dtype_count> slots_;
  scratch_buffer scratch_;
  std::vector<void*> tables_;
};

/// The workspaces that one or more executors run in: the executors of a
/// kiln::function's traces share one pool, so that the function holds the memory of
/// its largest trace rather than the sum over its traces (100 traces of shapes of a
/// million floats held 4 MB each). A workspace serves one run at a time; a run that
/// finds it laid out for another plan lays it out again (workspace::bind), keeping
/// its slots, which only grow.
class workspace_pool {
 public:
  workspace_pool() = default;
  workspace_pool(const workspace_pool&) = delete;
  workspace_pool& operator=(const workspace_pool&) = delete;

  /// A workspace no run is using: the idle one without a lock in the common case of
  /// one caller at a time, else a spare one, else a new one.
  workspace* acquire() {
    if (workspace* w = idle_.exchange(nullptr, std::memory_order_acquire)) return w;
    std::lock_guard lock(mutex_);
    if (!spare_.empty()) {
      workspace* w = spare_.back();
      spare_.pop_back();
      return w;
    }
    return workspaces_.emplace_back(std::make_unique<workspace>()).get();
  }
  /// Gives back a workspace acquire() gave.
  void give_back(workspace* w) {
    workspace* empty = nullptr;
    if (idle_.compare_exchange_strong(empty, w, std::memory_order_release)) return;
    std::lock_guard lock(mutex_);
    spare_.push_back(w);
  }
  /// How many workspaces runs have needed at once, so far.
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return workspaces_.size();
  }

 private:
  mutable std::mutex mutex_;  // guards workspaces_ and spare_
  std::vector<std::unique_ptr<workspace>> workspaces_;
  std::vector<workspace*> spare_;
  std::atomic<workspace*> idle_{nullptr};
};

}  // namespace kiln::detail::exec

#pragma once
/// \file
/// `detail::node_index`: node ids found by a hash, as the tracer finds the constant
/// it captured for a buffer and the optimizer the nodes that may be one. An open
/// addressing table of (hash, id) pairs in one array: a lookup reads one or two cache
/// lines and an insertion allocates nothing but when the table doubles, where a
/// std::unordered_multimap allocates a list node per entry and chases it on every
/// lookup (the cost of a graph of 10^5 nodes was a tenth of its trace in those).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::detail {

/// Ids (non-negative ints) under hashes that may collide; a lookup visits every id
/// stored under the same hash, which the caller then compares as it needs.
/// \code
/// kiln::detail::node_index index;
/// index.insert(42, 7);
/// int found = -1;
/// index.for_each(42, [&](int id) { found = id; return false; });  // found == 7
/// \endcode
class node_index {
 public:
  /// Makes room for `n` entries without growing.
  void reserve(std::size_t n) {
    std::size_t want = 16;
    while (want < 2 * n) want *= 2;
    if (want > slots_.size()) rehash(want);
  }

  /// Forgets every entry, keeping the room.
  void clear() {
    std::fill(slots_.begin(), slots_.end(), slot{});
    size_ = 0;
  }

  void insert(std::size_t hash, int id) {
    if (2 * (size_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
    place(hash, id);
    ++size_;
  }

  /// Calls `visit(id)` for each id inserted under `hash`, in no particular order, until
  /// it returns true; returns whether one did.
  template <class Visit>
  bool for_each(std::size_t hash, Visit&& visit) const {
    if (slots_.empty()) return false;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t k = mix(hash) & mask;; k = (k + 1) & mask) {
      const slot& s = slots_[k];
      if (s.id < 0) return false;
      if (s.hash == hash && visit(s.id)) return true;
    }
  }

 private:
  struct slot {
    std::size_t hash = 0;
    int id = -1;  // -1: empty
  };

  // Pointers and hashes made by multiplying keep their low bits poor: spread the high ones down.
  static std::size_t mix(std::size_t h) {
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
  }

  void place(std::size_t hash, int id) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t k = mix(hash) & mask;
    while (slots_[k].id >= 0) k = (k + 1) & mask;
    slots_[k] = {hash, id};
  }

  void rehash(std::size_t capacity) {
    std::vector<slot> old(capacity);
    old.swap(slots_);
    for (const slot& s : old)
      if (s.id >= 0) place(s.hash, s.id);
  }

  std::vector<slot> slots_;  // a power of two in size, at most half full
  std::size_t size_ = 0;
};

}  // namespace kiln::detail

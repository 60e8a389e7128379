#pragma once
/// \file
/// The host buffer allocator: 64-byte aligned, and caching large blocks, because a
/// fresh large buffer costs a page fault per 4 KiB on first touch (a new 64 MiB
/// buffer is several times slower to fill than a resident one).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "kiln/config.hpp"

namespace kiln::detail {

class caching_allocator {
 public:
  /// Blocks at least this large are kept for reuse when freed.
  static constexpr std::size_t cache_threshold = std::size_t(1) << 16;

  ~caching_allocator() { release_cached(); }

  void* allocate(std::size_t bytes) {
    std::size_t size = round_up(bytes);
    if (size >= cache_threshold) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_bytes_ -= size;
        return p;
      }
    }
    void* p = std::aligned_alloc(buffer_alignment, size);
    if (!p) throw std::bad_alloc();
    return p;
  }

  void deallocate(void* p, std::size_t bytes) {
    if (!p) return;
    std::size_t size = round_up(bytes);
    if (size >= cache_threshold) {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + size <= cache_limit_) {
        free_.emplace(size, p);
        cached_bytes_ += size;
        return;
      }
    }
    std::free(p);
  }

  /// Returns every cached block to the system.
  void release_cached() {
    std::lock_guard lock(mutex_);
    for (auto& [size, p] : free_) std::free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

 private:
  // Large sizes are rounded to 1/8 of their power of two, so blocks of nearby
  // sizes are interchangeable at a bounded (12.5%) waste.
  static std::size_t round_up(std::size_t bytes) {
    std::size_t size = (std::max<std::size_t>(bytes, 1) + buffer_alignment - 1) & ~(buffer_alignment - 1);
    if (size < cache_threshold) return size;
    std::size_t top = std::size_t(1) << (63 - __builtin_clzll(size));
    std::size_t step = top / 8;
    return (size + step - 1) & ~(step - 1);
  }

  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::size_t cached_bytes_ = 0;
  std::size_t cache_limit_ = std::size_t(2) << 30;
};

inline caching_allocator& host_allocator() {
  static caching_allocator instance;
  return instance;
}

}  // namespace kiln::detail

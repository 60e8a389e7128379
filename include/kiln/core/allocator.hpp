#pragma once
/// \file
/// The buffer allocators: 64-byte aligned, and caching. On the host, large blocks are
/// kept because a fresh large buffer costs a page fault per 4 KiB on first touch (a
/// new 64 MiB buffer is several times slower to fill than a resident one); small
/// blocks are kept per thread because aligned allocation from the C library is slow
/// enough to dominate an op on a few elements. The GPU's memory (the Thrust backend
/// under CUDA) is cached the same way, for the same reasons: cudaMalloc and cudaFree
/// of a large block take longer than an elementwise kernel over it.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/this_thread.hpp"

namespace kiln::detail {

/// Where a caching allocator gets its blocks: 64-byte aligned host memory.
///
/// A block is malloc's, `buffer_alignment` bytes longer, aligned inside it, with
/// malloc's address stored just before it: glibc's posix_memalign splits a larger
/// chunk and frees the pieces around the aligned one, and a trace that captured 10^5
/// scalars (two small blocks each: a buffer and its shared count) spent a tenth of its
/// time there and in freeing the fragments again. Under AddressSanitizer a block is
/// posix_memalign's, of its exact size, so that a read past its end is seen.
struct host_system {
  static void* allocate(std::size_t size) {
    void* p = nullptr;
    if constexpr (KILN_ADDRESS_SANITIZER) {
      // posix_memalign takes any size (aligned_alloc wants a multiple of the alignment).
      if (posix_memalign(&p, buffer_alignment, size) != 0) throw std::bad_alloc();
      return p;
    } else {
      if (size > std::size_t(-1) - buffer_alignment) throw std::bad_alloc();
      if (!(p = std::malloc(size + buffer_alignment))) throw std::bad_alloc();
      // malloc's address is 16-byte aligned: the next aligned address at least a pointer
      // past it is at most buffer_alignment past it.
      constexpr auto mask = std::uintptr_t(buffer_alignment - 1);
      const auto aligned = (reinterpret_cast<std::uintptr_t>(p) + sizeof(void*) + mask) & ~mask;
      reinterpret_cast<void**>(aligned)[-1] = p;
      return reinterpret_cast<void*>(aligned);
    }
  }
  static void release(void* p) noexcept {
    if constexpr (KILN_ADDRESS_SANITIZER)
      std::free(p);
    else if (p)
      std::free(static_cast<void**>(p)[-1]);
  }
};

/// Hands out blocks of `System`'s memory (`System::allocate` throws std::bad_alloc
/// when it has none, `System::release` gives a block back) and keeps freed ones.
template <class System>
class basic_caching_allocator {
 public:
  /// Blocks at least this large are kept for reuse when freed.
  static constexpr std::size_t cache_threshold = std::size_t(1) << 16;
  /// Whether freed blocks are kept at all: not under AddressSanitizer, which then sees
  /// every block at its exact size (KILN_ADDRESS_SANITIZER).
  static constexpr bool caches = !KILN_ADDRESS_SANITIZER;

  ~basic_caching_allocator() { release_cached(); }

  void* allocate(std::size_t bytes) {
    if (bytes >= cache_threshold) live_large_bytes_.fetch_add(round_up(bytes), std::memory_order_relaxed);
    if constexpr (!caches) return system_allocate(std::max<std::size_t>(bytes, 1));
    std::size_t size = round_up(bytes);
    if (size < cache_threshold) {
      int c = small_class(size);
      small_cache* cache = thread_cache();
      if (cache && cache->count[c] > 0) return cache->blocks[c][--cache->count[c]];
      return system_allocate(std::size_t(buffer_alignment) << c);
    }
    {
      std::lock_guard lock(mutex_);
      auto it = std::lower_bound(free_.begin(), free_.end(), size, [](const free_block& b, std::size_t s) { return b.size < s; });
      if (it != free_.end() && it->size == size) {
        void* p = it->block;
        free_.erase(it);
        cached_bytes_ -= size;
        return p;
      }
    }
    return system_allocate(size);
  }

  void deallocate(void* p, std::size_t bytes) {
    if (!p) return;
    if (bytes >= cache_threshold) live_large_bytes_.fetch_sub(round_up(bytes), std::memory_order_relaxed);
    if constexpr (!caches) return System::release(p);
    std::size_t size = round_up(bytes);
    if (size < cache_threshold) {
      small_cache* cache = thread_cache();
      int c = small_class(size);
      if (cache && cache->count[c] < small_cache::depth) {
        cache->blocks[c][cache->count[c]++] = p;
        return;
      }
    } else {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + size <= cache_limit_) {
        try {
          auto at = std::upper_bound(free_.begin(), free_.end(), size, [](std::size_t s, const free_block& b) { return s < b.size; });
          free_.insert(at, {size, p});
          cached_bytes_ += size;
          return;
        } catch (const std::bad_alloc&) {
          // no room to remember it: it goes back to the system
        }
      }
    }
    System::release(p);
  }

  /// Returns every cached block to the system.
  void release_cached() {
    std::lock_guard lock(mutex_);
    for (const free_block& b : free_) System::release(b.block);
    free_.clear();
    cached_bytes_ = 0;
  }

  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }
  /// The bytes of blocks of cache_threshold or more handed out and not yet given back:
  /// what large tensors and workspaces hold (tests and benchmarks read it).
  std::size_t live_large_bytes() const { return live_large_bytes_.load(std::memory_order_relaxed); }

 private:
  // When the system has no block left, the cached ones go back to it and it is
  // asked again, as PyTorch's CUDA allocator does.
  void* system_allocate(std::size_t size) {
    try {
      return System::allocate(size);
    } catch (const std::bad_alloc&) {
      release_cached();
      return System::allocate(size);
    }
  }

  // Small blocks come in power-of-two classes from 64 bytes up to cache_threshold, so
  // every size below cache_threshold has a class.
  static constexpr int small_classes = 11;
  static_assert((std::size_t(buffer_alignment) << (small_classes - 1)) == cache_threshold);
  static int small_class(std::size_t size) {
    int c = 0;
    while ((std::size_t(buffer_alignment) << c) < size) ++c;
    return c;
  }
  struct small_cache {
    static constexpr int depth = 32;
    void* blocks[small_classes][depth];
    int count[small_classes] = {};
    ~small_cache() {
      for (int c = 0; c < small_classes; ++c)
        for (int i = 0; i < count[c]; ++i) System::release(blocks[c][i]);
    }
  };
  // Null once the thread's cache is gone: a buffer freed then (a static tensor at
  // exit) goes back to the system.
  static small_cache* thread_cache() { return this_thread_object<small_cache>(); }

  // Large sizes are rounded to 1/8 of their power of two, so blocks of nearby
  // sizes are interchangeable at a bounded (12.5%) waste.
  static std::size_t round_up(std::size_t bytes) {
    std::size_t size = (std::max<std::size_t>(bytes, 1) + buffer_alignment - 1) & ~(buffer_alignment - 1);
    if (size < cache_threshold) return size;
    std::size_t top = std::size_t(1) << (63 - __builtin_clzll(size));
    std::size_t step = top / 8;
    return (size + step - 1) & ~(step - 1);
  }

  // Kept blocks sorted by size. A vector, not a multimap, so that keeping and reusing
  // blocks in steady state allocates nothing: it grows only past its largest count.
  struct free_block {
    std::size_t size;
    void* block;
  };
  mutable std::mutex mutex_;
  std::vector<free_block> free_;
  std::size_t cached_bytes_ = 0;
  std::atomic<std::size_t> live_large_bytes_{0};
  std::size_t cache_limit_ = std::size_t(2) << 30;
};

using caching_allocator = basic_caching_allocator<host_system>;

/// The host's allocator. It is never destroyed: a static object made before kiln's
/// first allocation (a global vector of tensors, a test framework's registry) is
/// destroyed after every static made later, and frees its tensors then.
inline caching_allocator& host_allocator() {
  static caching_allocator* const instance = new caching_allocator;
  return *instance;
}

}  // namespace kiln::detail

// The host allocator: alignment, every size class (small per-thread classes up to
// the large-block threshold, and cached large blocks), and reuse of freed blocks.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include <kiln/kiln.hpp>

using kiln::detail::caching_allocator;

TEST_CASE("blocks of every size class are 64-byte aligned and fully writable") {
  caching_allocator a;
  for (std::size_t n : {std::size_t(1), std::size_t(63), std::size_t(64), std::size_t(65), std::size_t(4097),
                        std::size_t(32768), std::size_t(32769), std::size_t(40000), caching_allocator::cache_threshold - 1,
                        caching_allocator::cache_threshold, std::size_t(70000), std::size_t(1) << 22}) {
    INFO("bytes " << n);
    std::vector<void*> blocks;
    for (int k = 0; k < 50; ++k) {  // more than a size class keeps per thread
      void* p = a.allocate(n);
      REQUIRE(reinterpret_cast<std::uintptr_t>(p) % kiln::buffer_alignment == 0);
      std::memset(p, k, n);
      blocks.push_back(p);
    }
    for (void* p : blocks) a.deallocate(p, n);
  }
}

TEST_CASE("a freed block is handed out again for the same size") {
  caching_allocator a;
  for (std::size_t n : {std::size_t(40), std::size_t(40000), std::size_t(1) << 20}) {
    void* p = a.allocate(n);
    a.deallocate(p, n);
    void* q = a.allocate(n);
    if constexpr (caching_allocator::caches) CHECK(q == p);
    a.deallocate(q, n);
  }
  CHECK((a.cached_bytes() > 0) == caching_allocator::caches);
  a.release_cached();
  CHECK(a.cached_bytes() == 0);
}

#if KILN_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>

TEST_CASE("under AddressSanitizer, a block ends where its size says and is gone once freed") {
  caching_allocator a;
  for (std::size_t n : {std::size_t(1), std::size_t(40), std::size_t(100), std::size_t(70000)}) {
    INFO("bytes " << n);
    char* p = static_cast<char*>(a.allocate(n));
    CHECK_FALSE(__asan_address_is_poisoned(p + n - 1));
    CHECK(__asan_address_is_poisoned(p + n));  // a kernel writing one past the end is reported
    a.deallocate(p, n);
    CHECK(__asan_address_is_poisoned(p));  // and so is one using the buffer after it is freed
  }
}
#endif

// kiln single header, generated from include/kiln/fixed.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_FIXED_HPP
#define KILN_SINGLE_INCLUDE_KILN_FIXED_HPP
// ----- begin kiln/fixed.hpp -----
/// \file
/// The compile-time tier alone: `kiln::fixed`, its ops, `kiln::function` called with
/// `fixed` arguments, control flow, `kiln::fixed_variable` and `kiln::print` on typed
/// values. It compiles in a fraction of kiln/kiln.hpp's time (bench/compile_cost.md):
/// the runtime tier's graphs, executor and optimizer are left out, so a function
/// called with kiln::tensor arguments needs kiln/kiln.hpp. Both may be included in one
/// file, in either order.
/// \code
/// #include <kiln/fixed.hpp>
/// kiln::function dense([](const auto& x, const auto& w, const auto& b) { return kiln::tanh(kiln::matmul(x, w) + b); });
/// auto y = dense(kiln::fixed<float, 8, 64>::ones(), kiln::fixed<float, 64, 32>::ones(), kiln::fixed<float, 32>::zeros());
/// \endcode

#ifndef KILN_SINGLE_INCLUDE_KILN_CONFIG_HPP
#define KILN_SINGLE_INCLUDE_KILN_CONFIG_HPP
// ----- begin kiln/config.hpp -----
#include <cstddef>
/// \file
/// Version, feature macros and portability helpers shared by every kiln header.

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

// The Thrust backend: nvcc builds turn it on when Thrust is reachable (unless the
// user opts out with KILN_NO_THRUST) and run it on the GPU. Host compilers run it on
// THRUST_DEVICE_SYSTEM (CPP or OMP), which is how CI exercises it, only when asked
// with KILN_HAS_THRUST=1 (kiln's CMake package does when Thrust is found): on the
// host it adds nothing a program needs, and its headers cost every source file about
// two seconds of compiling.
#if !defined(KILN_NO_THRUST) && !defined(KILN_HAS_THRUST) && defined(__CUDACC__)
#  if defined(__has_include)
#    if __has_include(<thrust/version.h>)
#      define KILN_HAS_THRUST 1
#    endif
#  endif
#endif
#ifndef KILN_HAS_THRUST
#  define KILN_HAS_THRUST 0
#endif

// KILN_UNROLL before a loop of constant trip count unrolls it in GPU code (host
// compilers unroll as they see fit, and GCC warns of the unknown pragma).
#if defined(__CUDACC__)
#  define KILN_HAS_CUDA 1
#  define KILN_HOST_DEVICE __host__ __device__
#  define KILN_UNROLL _Pragma("unroll")
#else
#  define KILN_HAS_CUDA 0
#  define KILN_HOST_DEVICE
#  define KILN_UNROLL
#endif

// nvcc reads a source file twice, for the host and for the GPU (__CUDA_ARCH__). The
// GPU pass needs only what GPU kernels run, and must not see the CPU backend's SIMD
// kernels: they call the ops' __host__ __device__ functors with xsimd vectors, which
// device code cannot hold. Host-only code skips them there with
// `if constexpr (!KILN_DEVICE_PASS)`; the host pass compiles them as usual.
#if defined(__CUDA_ARCH__)
#  define KILN_DEVICE_PASS 1
#else
#  define KILN_DEVICE_PASS 0
#endif

// Under AddressSanitizer, kiln's allocators hand out exact, fresh blocks instead of
// cached, rounded-up ones (kiln/core/allocator.hpp), so that a kernel reading or
// writing past a buffer's end, or a buffer used after it is freed, is reported.
#if defined(__SANITIZE_ADDRESS__)
#  define KILN_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define KILN_ADDRESS_SANITIZER 1
#  endif
#endif
#ifndef KILN_ADDRESS_SANITIZER
#  define KILN_ADDRESS_SANITIZER 0
#endif
// ThreadSanitizer, detected the same way (see KILN_FLATTEN below).
#if defined(__SANITIZE_THREAD__)
#  define KILN_THREAD_SANITIZER 1
#elif defined(__has_feature)
#  if __has_feature(thread_sanitizer)
#    define KILN_THREAD_SANITIZER 1
#  endif
#endif
#ifndef KILN_THREAD_SANITIZER
#  define KILN_THREAD_SANITIZER 0
#endif

// Separate compilation (kiln/separate_compilation.hpp). Header-only, every source file compiles
// the parts of kiln it uses. A program that defines KILN_SEPARATE_COMPILATION in every
// source file compiles kiln's kernels and heavy runtime functions once, in the one
// source file that also defines KILN_LIBRARY_SOURCE. Such a function is declared
// `KILN_LIBRARY_INLINE` and its definition sits in an `#if KILN_DEFINE_LIBRARY` block.
#if !defined(KILN_SEPARATE_COMPILATION) || defined(KILN_LIBRARY_SOURCE)
#  define KILN_DEFINE_LIBRARY 1
#else
#  define KILN_DEFINE_LIBRARY 0
#endif
#if defined(KILN_SEPARATE_COMPILATION)
#  define KILN_LIBRARY_INLINE
#else
#  define KILN_LIBRARY_INLINE inline
#endif

// KILN_FLATTEN: a kernel loop with every call in it inlined. In a large translation
// unit GCC stops inlining even one-line functions, and a SIMD functor called once
// per batch then costs a call and a round trip of its operands through memory.
// Sanitized builds leave it out: flattening copies every instrumented call (xsimd's
// exp and log, in each of a tile kernel's variants) into each loop, and the
// sanitized kernels of the unary ops compiled in 170 s instead of 35 s. The code run
// is the same, only less inlined.
// KILN_COLD: code off every hot path and next to something far slower (formatting
// text for a stream; the native-loop compiler, which waits for a compiler process),
// optimized for size: it compiles in a fraction of the time in every program that
// can reach it.
// KILN_NOINLINE: error paths kept out of their callers, so that building a message
// neither bloats nor (with GCC 12's string warnings) warns in every caller.
#if defined(__GNUC__) || defined(__clang__)
#  define KILN_ALWAYS_INLINE inline __attribute__((always_inline))
#  if KILN_ADDRESS_SANITIZER || KILN_THREAD_SANITIZER
#    define KILN_FLATTEN
#  else
#    define KILN_FLATTEN __attribute__((flatten))
#  endif
#  define KILN_COLD __attribute__((cold))
#  define KILN_NOINLINE __attribute__((noinline))
#  define KILN_RESTRICT __restrict__
#else
#  define KILN_ALWAYS_INLINE inline
#  define KILN_FLATTEN
#  define KILN_COLD
#  define KILN_NOINLINE
#  define KILN_RESTRICT
#endif

namespace kiln {
/// Byte alignment of every tensor buffer: one cache line, and enough for AVX-512 loads.
inline constexpr std::size_t buffer_alignment = 64;
}  // namespace kiln
// ----- end kiln/config.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CONFIG_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_FIXED_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_FIXED_HPP
// ----- begin kiln/typed/fixed.hpp -----
/// \file
/// `kiln::fixed<T, Dims...>`: a tensor whose element type and shape are part of its
/// type, the values of the compile-time tier. It owns its data,
/// row-major and 64-byte aligned: inline for small sizes (no heap), on the heap past
/// `inline_bytes`. `kiln::spec<T, Dims...>` describes one without a value.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_ALLOCATOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_ALLOCATOR_HPP
// ----- begin kiln/core/allocator.hpp -----
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

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_THIS_THREAD_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_THIS_THREAD_HPP
// ----- begin kiln/core/this_thread.hpp -----
/// \file
/// `this_thread_object<T>()`: a per-thread object that code running while the thread's
/// objects are destroyed can still ask for, safely.

namespace kiln::detail {

/// This thread's `T`, made on first use; null once the thread has begun destroying it
/// (a static tensor freed at exit, a call from another thread_local's destructor). It
/// is reached through trivially destructible thread_locals, which stay readable then.
/// \code
/// struct counter { int calls = 0; };
/// if (counter* c = kiln::detail::this_thread_object<counter>()) ++c->calls;
/// \endcode
template <class T>
T* this_thread_object() {
  thread_local T* current = nullptr;
  thread_local bool finished = false;
  if (!current && !finished) {
    struct owner {
      T object;
      ~owner() {
        current = nullptr;
        finished = true;
      }
    };
    thread_local owner cleanup;
    current = &cleanup.object;
  }
  return current;
}

}  // namespace kiln::detail
// ----- end kiln/core/this_thread.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_THIS_THREAD_HPP

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
// ----- end kiln/core/allocator.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_ALLOCATOR_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_DTYPE_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_DTYPE_HPP
// ----- begin kiln/core/dtype.hpp -----
/// \file
/// Element types: the runtime `kiln::dtype` and its mapping to C++ types.

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
// ----- begin kiln/core/error.hpp -----
/// \file
/// The exception hierarchy: one kind per class of TensorFlow error, all derived from kiln::error.

#include <stdexcept>
#include <string>


namespace kiln {

/// Base of every error kiln raises. `catch (const kiln::error& e)` catches them all.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An argument has a value the operation cannot accept: an index out of range, a
/// call that does not match a concrete function's signature, a NaN under check_numerics.
/// \code throw kiln::invalid_argument_error("gather: index 7 is out of range [0, 3)"); \endcode
class invalid_argument_error : public error {
 public:
  using error::error;
};

/// A value has the right type but the wrong shape or structure (incompatible shapes,
/// mismatched branches, an input_signature mismatch).
class value_error : public error {
 public:
  using error::error;
};

/// A value has the wrong type: a dtype an op does not support, reading a symbolic tensor.
class type_error : public error {
 public:
  using error::error;
};

/// A sequence has no more elements: an iterator past its end, a fixed-size
/// tensor_array read or written past its size (TensorFlow's OutOfRangeError).
/// \code throw kiln::out_of_range_error("IteratorGetNext: End of sequence"); \endcode
class out_of_range_error : public error {
 public:
  using error::error;
};

/// A capability this build does not have, such as the GPU device without a GPU backend.
class unavailable_error : public error {
 public:
  using error::error;
};

/// Memory ran out: a buffer the device cannot allocate (TensorFlow's
/// ResourceExhaustedError). The message names the op, when there is one, and the size.
/// \code throw kiln::resource_exhausted_error("zeros: cannot allocate 4398046511104 bytes on cpu"); \endcode
class resource_exhausted_error : public error {
 public:
  using error::error;
};

/// A broken internal invariant; reaching one is a kiln bug.
class internal_error : public error {
 public:
  using error::error;
};

namespace detail {
/// Raises the kiln::error being handled again, of the same kind, with `prefix` before
/// its message (the function or graph node it came from); any other exception goes on
/// as it is. Call it only inside a catch block.
[[noreturn]] KILN_LIBRARY_INLINE void rethrow_with_prefix(const std::string& prefix);
#if KILN_DEFINE_LIBRARY
[[noreturn]] KILN_LIBRARY_INLINE void rethrow_with_prefix(const std::string& prefix) {
  try {
    throw;
  } catch (const invalid_argument_error& e) {
    throw invalid_argument_error(prefix + e.what());
  } catch (const value_error& e) {
    throw value_error(prefix + e.what());
  } catch (const type_error& e) {
    throw type_error(prefix + e.what());
  } catch (const out_of_range_error& e) {
    throw out_of_range_error(prefix + e.what());
  } catch (const unavailable_error& e) {
    throw unavailable_error(prefix + e.what());
  } catch (const resource_exhausted_error& e) {
    throw resource_exhausted_error(prefix + e.what());
  } catch (const internal_error& e) {
    throw internal_error(prefix + e.what());
  } catch (const error& e) {
    throw error(prefix + e.what());
  }
}
#endif
}  // namespace detail

}  // namespace kiln
// ----- end kiln/core/error.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP

namespace kiln {

/// The element types, one row each: the dtype, its C++ type and the name TensorFlow
/// prints for it. The enum, the constants and every mapping below come from this table.
#define KILN_DTYPES(X)            \
  X(bool_, bool, "bool")          \
  X(int32, std::int32_t, "int32") \
  X(int64, std::int64_t, "int64") \
  X(float32, float, "float32")    \
  X(float64, double, "float64")   \
  X(string, std::string, "string")

#define KILN_DETAIL_DTYPE_ENUMERATOR(d, T, text) d,
/// The element type of a tensor, known at run time.
/// \code kiln::zeros({2}, kiln::int32).dtype() == kiln::int32 \endcode
enum class dtype : std::uint8_t { KILN_DTYPES(KILN_DETAIL_DTYPE_ENUMERATOR) };
#undef KILN_DETAIL_DTYPE_ENUMERATOR

/// The dtypes by name: `kiln::bool_` (C++ `bool`), `kiln::int32` (`std::int32_t`),
/// `kiln::int64` (`std::int64_t`), `kiln::float32` (`float`), `kiln::float64`
/// (`double`), `kiln::string` (`std::string`).
#define KILN_DETAIL_DTYPE_CONSTANT(d, T, text) inline constexpr dtype d = dtype::d;
KILN_DTYPES(KILN_DETAIL_DTYPE_CONSTANT)
#undef KILN_DETAIL_DTYPE_CONSTANT

/// Number of dtypes; tables indexed by dtype have this many rows.
#define KILN_DETAIL_DTYPE_ONE(d, T, text) +1
inline constexpr int dtype_count = 0 KILN_DTYPES(KILN_DETAIL_DTYPE_ONE);
#undef KILN_DETAIL_DTYPE_ONE

/// The name TensorFlow prints for a dtype: `bool`, `int32`, ..., `string`.
constexpr std::string_view name(dtype t) {
#define KILN_DETAIL_DTYPE_NAME(d, T, text) text,
  constexpr std::string_view names[dtype_count] = {KILN_DTYPES(KILN_DETAIL_DTYPE_NAME)};
#undef KILN_DETAIL_DTYPE_NAME
  return names[static_cast<int>(t)];
}

inline std::ostream& operator<<(std::ostream& os, dtype t) { return os << name(t); }

/// A set of dtypes, used by op definitions to say what they accept.
/// \code constexpr kiln::dtype_set floats = kiln::dtype_set{kiln::float32, kiln::float64}; \endcode
class dtype_set {
 public:
  constexpr dtype_set() = default;
  constexpr dtype_set(std::initializer_list<dtype> ts) {
    for (dtype t : ts) bits_ |= bit(t);
  }
#if KILN_HAS_CUDA
  // nvcc's generated host code spells a dtype_set template argument as `{bits}`.
  constexpr dtype_set(std::uint8_t bits) : bits_(bits) {}
#endif
  constexpr bool contains(dtype t) const { return (bits_ & bit(t)) != 0; }
  constexpr dtype_set operator|(dtype_set o) const { return from_bits(bits_ | o.bits_); }
  constexpr dtype_set operator&(dtype_set o) const { return from_bits(bits_ & o.bits_); }
  constexpr bool operator==(const dtype_set&) const = default;

  // Public so that a dtype_set can be a template argument (a structural type).
  std::uint8_t bits_ = 0;

 private:
  static constexpr std::uint8_t bit(dtype t) { return std::uint8_t(1u << static_cast<int>(t)); }
  static constexpr dtype_set from_bits(std::uint8_t b) {
    dtype_set s;
    s.bits_ = b;
    return s;
  }
};

namespace dtypes {
inline constexpr dtype_set floating{float32, float64};
inline constexpr dtype_set integer{int32, int64};
inline constexpr dtype_set numeric = floating | integer;
#define KILN_DETAIL_DTYPE_ITEM(d, T, text) d,
inline constexpr dtype_set all{KILN_DTYPES(KILN_DETAIL_DTYPE_ITEM)};
#undef KILN_DETAIL_DTYPE_ITEM
}  // namespace dtypes

/// Whether a C++ type is one of the element types of the contract.
#define KILN_DETAIL_DTYPE_IS(d, T, text) || std::is_same_v<U, T>
template <class U>
inline constexpr bool has_dtype = false KILN_DTYPES(KILN_DETAIL_DTYPE_IS);
#undef KILN_DETAIL_DTYPE_IS

namespace detail {
template <class U>
consteval dtype dtype_for() {
#define KILN_DETAIL_DTYPE_FOR(d, T, text) \
  if constexpr (std::is_same_v<U, T>)     \
    return d;                             \
  else
  KILN_DTYPES(KILN_DETAIL_DTYPE_FOR)
#undef KILN_DETAIL_DTYPE_FOR
  throw "not an element type";  // has_dtype<U> rules it out
}

template <dtype D>
struct element_type_of;
#define KILN_DETAIL_DTYPE_ELEMENT(d, T, text) \
  template <>                                 \
  struct element_type_of<d> {                 \
    using type = T;                           \
  };
KILN_DTYPES(KILN_DETAIL_DTYPE_ELEMENT)
#undef KILN_DETAIL_DTYPE_ELEMENT
}  // namespace detail

/// The dtype of a C++ element type; `dtype_of<float> == float32`.
template <class T>
  requires has_dtype<T>
inline constexpr dtype dtype_of = detail::dtype_for<T>();

/// The C++ element type of a dtype: `element_t<kiln::float32>` is `float`.
template <dtype D>
using element_t = typename detail::element_type_of<D>::type;

/// Bytes per element (`sizeof(std::string)` for strings).
constexpr std::size_t size_of(dtype t) {
#define KILN_DETAIL_DTYPE_SIZE(d, T, text) sizeof(T),
  constexpr std::size_t sizes[dtype_count] = {KILN_DTYPES(KILN_DETAIL_DTYPE_SIZE)};
#undef KILN_DETAIL_DTYPE_SIZE
  return sizes[static_cast<int>(t)];
}

constexpr bool is_floating(dtype t) { return dtypes::floating.contains(t); }
constexpr bool is_integer(dtype t) { return dtypes::integer.contains(t); }

namespace detail {
/// The error of dtype visitor `visitor` (visit_dtype, the backends' visit_mover) for a
/// value outside the enum, out of line: every visitor (one per op, dtype family and
/// kernel) would otherwise build the message inline.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_invalid_dtype(std::string_view visitor, dtype t) {
  throw internal_error(std::string(visitor) + ": invalid dtype value " + std::to_string(static_cast<int>(t)));
}
}  // namespace detail

/// Calls `f.template operator()<T>()` with the C++ element type `T` of `t`, as
/// every dtype visitor of kiln does; the single switch from a runtime dtype to
/// compiled code.
/// \code kiln::visit_dtype(kiln::float32, []<class T>() { return sizeof(T); }) == 4 \endcode
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
#define KILN_DETAIL_DTYPE_CASE(d, T, text) \
  case d:                                  \
    return f.template operator()<T>();
    KILN_DTYPES(KILN_DETAIL_DTYPE_CASE)
#undef KILN_DETAIL_DTYPE_CASE
  }
  detail::throw_invalid_dtype("visit_dtype", t);
}

}  // namespace kiln
// ----- end kiln/core/dtype.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_DTYPE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_PRINT_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_PRINT_HPP
// ----- begin kiln/core/print.hpp -----
/// \file
/// Printing tensors as TensorFlow does. `std::cout << x` writes what Python's
/// `print(x)` shows for an eager `tf.Tensor`, with `tensor(` for `tf.Tensor(`: the
/// values as NumPy's `str()` lays out an array, then the shape and dtype.
/// `detail::format_values` gives the values alone, as `tf.print` writes them.
/// Both share one layout engine (which elements show, where rows and lines break)
/// and differ only in how one element is written.
/// Formatting is optimized for size (KILN_COLD): writing text is never the hot path,
/// and every program that prints compiles it.

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <mutex>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_DEVICE_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_DEVICE_HPP
// ----- begin kiln/core/device.hpp -----
/// \file
/// Where a tensor's buffer lives and its ops run.

#include <ostream>
#include <string_view>

namespace kiln {

/// The device of a tensor: `cpu` runs the xsimd kernels, `gpu` the Thrust kernels
/// (on CUDA when compiled by nvcc, on the host device system otherwise).
/// \code kiln::ones({2}).device() == kiln::device::cpu \endcode
enum class device : unsigned char { cpu, gpu };

constexpr std::string_view name(device d) { return d == device::cpu ? "cpu" : "gpu"; }
inline std::ostream& operator<<(std::ostream& os, device d) { return os << name(d); }

}  // namespace kiln
// ----- end kiln/core/device.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_DEVICE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_SHAPE_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_SHAPE_HPP
// ----- begin kiln/core/shape.hpp -----
/// \file
/// `kiln::shape`: a fixed-capacity, constexpr list of dims. Because it is a literal
/// type, every shape rule is a constexpr function usable by the compile-time tier.

#include <array>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>


namespace kiln {

/// A dim whose size is not known (only in specs); printed `None`.
inline constexpr std::int64_t none = -1;

/// Tag for a shape of unknown rank (only in specs); printed `<unknown>`.
/// \code kiln::tensor_spec(kiln::unknown_rank, kiln::float32) \endcode
struct unknown_rank_t {
  explicit constexpr unknown_rank_t() = default;
};
inline constexpr unknown_rank_t unknown_rank{};

/// The most dims a kiln tensor can have.
inline constexpr int max_rank = 8;

namespace detail {
// The errors of building a shape or an int_list, out of line: their push_back and
// constructors are inlined into nearly every function that builds one.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_too_many_dims() {
  throw value_error("kiln supports at most " + std::to_string(max_rank) + " dims");
}
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_negative_dim(std::int64_t d) {
  throw value_error("shape dims must be >= 0 or kiln::none, got " + std::to_string(d));
}
}  // namespace detail

/// Dims of a tensor, row-major; `kiln::shape{}` is a scalar.
/// \code kiln::shape s{2, 3}; s.rank() == 2; s.num_elements() == 6; \endcode
class shape {
 public:
  constexpr shape() = default;
  constexpr shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
  constexpr explicit shape(std::span<const std::int64_t> dims) { assign(dims.data(), dims.size()); }
  constexpr shape(unknown_rank_t) : rank_(-1) {}

  /// `s.rank()` is the number of dims; -1 for an unknown rank.
  constexpr int rank() const { return rank_; }
  constexpr bool has_known_rank() const { return rank_ >= 0; }
  /// True when the rank and every dim are known.
  constexpr bool is_fully_defined() const {
    if (rank_ < 0) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] == none) return false;
    return true;
  }
  constexpr std::int64_t operator[](int i) const { return dims_[i]; }
  constexpr std::int64_t& operator[](int i) { return dims_[i]; }
  constexpr const std::int64_t* begin() const { return dims_.data(); }
  constexpr const std::int64_t* end() const { return dims_.data() + (rank_ < 0 ? 0 : rank_); }
  constexpr std::span<const std::int64_t> dims() const { return {begin(), end()}; }

  /// True when the product of the known dims fits in an int64. A kiln::shape built
  /// from a list of dims is checked; one built with push_back is checked by what uses
  /// it (an op checks its rule's result, a tensor its shape).
  constexpr bool count_fits() const {
    std::int64_t n = 1;
    bool overflow = false;
    for (int i = 0; i < rank_; ++i) {
      if (dims_[i] == 0) return true;  // no elements, however large the other dims
      if (dims_[i] == none || overflow) continue;
      // One multiply with a flag at run time (shapes are built on every op); nvcc's
      // front end does not evaluate the builtin in constant expressions.
      if (std::is_constant_evaluated()) {
        overflow = n > INT64_MAX / dims_[i];
        n *= overflow ? 1 : dims_[i];
      } else {
        overflow = __builtin_mul_overflow(n, dims_[i], &n);
      }
    }
    return !overflow;
  }

  /// Product of the dims (1 for a scalar). Only meaningful for a fully defined shape
  /// whose count_fits().
  constexpr std::int64_t num_elements() const {
    // Unsigned, so that a zero dim after a partial product that overflows gives 0
    // rather than undefined behaviour.
    std::uint64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= std::uint64_t(dims_[i]);
    return std::int64_t(n);
  }

  /// Appends a dim; `shape{2}.push_back(3) == shape{2, 3}`.
  constexpr void push_back(std::int64_t d) {
    if (rank_ >= max_rank) detail::throw_too_many_dims();
    if (d < 0 && d != none) detail::throw_negative_dim(d);
    dims_[rank_++] = d;  // not checked yet: a later zero dim may make the count fit (count_fits)
  }

  constexpr bool operator==(const shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }

  /// True when a concrete shape `s` fits this spec (`none` dims and unknown rank match anything).
  constexpr bool accepts(const shape& s) const {
    if (rank_ < 0) return true;
    if (rank_ != s.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != none && dims_[i] != s.dims_[i]) return false;
    return true;
  }

  /// True when some concrete shape fits both this spec and `s` (TensorFlow's
  /// `is_compatible_with`): `(None, 3)` and `(2, None)` are, `(2,)` and `(3,)` are not.
  /// \code kiln::shape{kiln::none, 3}.is_compatible_with(kiln::shape{2, kiln::none}) == true \endcode
  constexpr bool is_compatible_with(const shape& s) const {
    if (rank_ < 0 || s.rank_ < 0) return true;
    if (rank_ != s.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != none && s.dims_[i] != none && dims_[i] != s.dims_[i]) return false;
    return true;
  }

  /// TensorFlow's text: `(2, 3)`, `()`, `(2,)`, `(None, 3)`, `<unknown>`.
  KILN_LIBRARY_INLINE std::string str() const;

 private:
  constexpr void assign(const std::int64_t* d, std::size_t n) {
    if (n > std::size_t(max_rank)) detail::throw_too_many_dims();
    rank_ = static_cast<int>(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (d[i] < 0 && d[i] != none) detail::throw_negative_dim(d[i]);
      dims_[i] = d[i];
    }
    check_count();
  }
  // A shape whose element count wraps would allocate a wrong-sized buffer.
  constexpr void check_count() const {
    if (!count_fits()) throw_count_overflow(*this);
  }
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_count_overflow(const shape& s) {
    throw value_error("shape " + s.str() + " has more elements than an int64 can count");
  }

  int rank_ = 0;
  std::array<std::int64_t, max_rank> dims_{};
};

#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::string shape::str() const {
  if (rank_ < 0) return "<unknown>";
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    char digits[20];
    if (dims_[i] == none)
      s += "None";
    else
      s.append(digits, std::to_chars(digits, digits + sizeof digits, dims_[i]).ptr);
  }
  s += rank_ == 1 ? ",)" : ")";
  return s;
}
#endif

inline std::ostream& operator<<(std::ostream& os, const shape& s) { return os << s.str(); }

/// Row-major strides of a shape, in elements.
constexpr std::array<std::int64_t, max_rank> row_major_strides(const shape& s) {
  std::array<std::int64_t, max_rank> st{};
  std::int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

/// The product of dims [first, last) of `s`: the rows before a dim, or the elements
/// after it.
constexpr std::int64_t elements_between(const shape& s, int first, int last) {
  std::int64_t n = 1;
  for (int d = first; d < last; ++d) n *= s[d];
  return n;
}

}  // namespace kiln
// ----- end kiln/core/shape.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_SHAPE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_SYMBOL_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_SYMBOL_HPP
// ----- begin kiln/core/symbol.hpp -----
/// \file
/// What a symbolic tensor points to: one value of a graph being traced.

#include <cstdint>
#include <string>


namespace kiln::detail {

/// The graph value a symbolic tensor stands for. `trace_id` names the trace that
/// made it, so a symbolic tensor that escapes its trace is recognised when it is
/// used elsewhere.
struct symbol {
  std::uint64_t trace_id = 0;
  int node = -1;
  /// TensorFlow's tensor name, `a:0` (the node's name and the output index), or only
  /// the node's name when `output` gives the index: a name of up to 15 characters
  /// stays in the string (no allocation per traced op), and `multiply_12345:0` is 16.
  std::string name;
  int output = -1;  ///< the output index that `name` leaves out, or -1: none
};

/// TensorFlow's name of the value a symbol stands for: `a:0`, `while:1`.
KILN_LIBRARY_INLINE std::string value_name(const symbol& s);

/// The name of the node a symbol stands for: `while` for `while:1`.
KILN_LIBRARY_INLINE std::string node_name(const symbol& s);

/// True when `a` and `b` stand for the same value of the same trace.
KILN_LIBRARY_INLINE bool same_value(const symbol& a, const symbol& b);

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string value_name(const symbol& s) {
  return s.output < 0 ? s.name : s.name + ":" + std::to_string(s.output);
}

KILN_LIBRARY_INLINE std::string node_name(const symbol& s) {
  return s.output >= 0 ? s.name : s.name.substr(0, s.name.find(':'));
}

KILN_LIBRARY_INLINE bool same_value(const symbol& a, const symbol& b) {
  return a.trace_id == b.trace_id && a.node == b.node;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/core/symbol.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_SYMBOL_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP
// ----- begin kiln/core/tensor.hpp -----
/// \file
/// `kiln::tensor`: the runtime-typed tensor. Eager tensors own a
/// shared immutable buffer; symbolic tensors (inside a trace) carry a dtype, a
/// possibly partial shape and a handle to the graph value they stand for.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_STORAGE_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_STORAGE_HPP
// ----- begin kiln/core/storage.hpp -----
/// \file
/// `storage`: one reference-counted, immutable-after-creation buffer of elements on
/// a device. Devices other than the CPU plug their memory in through a
/// `memory_resource`, so this layer knows nothing of backends.

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>


namespace kiln::detail {

/// How a device allocates and copies its memory.
struct memory_resource {
  void* (*allocate)(std::size_t bytes);
  void (*deallocate)(void* p, std::size_t bytes);
  void (*copy_to_host)(void* host_dst, const void* src, std::size_t bytes);
  void (*copy_from_host)(void* dst, const void* host_src, std::size_t bytes);
};

inline const memory_resource& host_memory() {
  static const memory_resource r{
      [](std::size_t n) { return host_allocator().allocate(n); },
      [](void* p, std::size_t n) { host_allocator().deallocate(p, n); },
      [](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); },
      [](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); },
  };
  return r;
}

/// The GPU's memory, set by the Thrust backend when the build has one.
inline const memory_resource*& gpu_memory_slot() {
  static const memory_resource* r = nullptr;
  return r;
}

inline const memory_resource& memory_for(device d) {
  if (d == device::cpu) return host_memory();
  if (const memory_resource* r = gpu_memory_slot()) return *r;
  throw unavailable_error("kiln::device::gpu is not available: this build has no GPU backend (Thrust not found)");
}

class storage {
 public:
  storage(kiln::dtype t, std::int64_t count, kiln::device d)
      : dtype_(t), device_(d), count_(count), bytes_(std::size_t(count) * size_of(t)) {
    if (t == kiln::string && d != kiln::device::cpu)
      throw type_error("string tensors live on the cpu only; cannot place one on " + std::string(name(d)));
    if (!addressable()) throw exhausted();
    try {
      data_ = held_inline() ? inline_ : memory_for(d).allocate(bytes_);
    } catch (const std::bad_alloc&) {
      throw exhausted();
    }
    if (t == kiln::string) {
      auto* s = static_cast<std::string*>(data_);
      for (std::int64_t i = 0; i < count; ++i) new (s + i) std::string();
    }
  }
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (dtype_ == kiln::string) {
      auto* s = static_cast<std::string*>(data_);
      for (std::int64_t i = 0; i < count_; ++i) s[i].~basic_string();
    }
    if (!held_inline()) memory_for(device_).deallocate(data_, bytes_);
  }

  void* data() { return data_; }
  const void* data() const { return data_; }
  kiln::dtype dtype() const { return dtype_; }
  kiln::device device() const { return device_; }
  std::int64_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }

 private:
  // Pointer arithmetic over the buffer needs its byte count to fit in a ptrdiff_t.
  bool addressable() const { return std::size_t(count_) <= std::size_t(PTRDIFF_MAX) / size_of(dtype_); }
  // Appended to one string: every tensor-making file compiles this message, and a
  // chain of `+` compiles a temporary and its cleanup per piece.
  KILN_COLD KILN_NOINLINE resource_exhausted_error exhausted() const {
    std::string text = "cannot allocate ";
    text += std::to_string(count_);
    text += ' ';
    text += name(dtype_);
    text += " elements (";
    text += addressable() ? std::to_string(bytes_) + " bytes" : "more bytes than memory can address";
    text += ") on ";
    text += name(device_);
    return resource_exhausted_error(text);
  }

  // A scalar's bytes (up to inline_bytes on the host) are held in the storage itself,
  // one block with its shared count instead of two: a trace that captures a scalar
  // per op made two small allocations for each. Not under AddressSanitizer, which sees
  // a read past a block's end only in a block of the exact size.
  static constexpr std::size_t inline_bytes = 16;
  bool held_inline() const {
    return !KILN_ADDRESS_SANITIZER && device_ == kiln::device::cpu && bytes_ <= inline_bytes && dtype_ != kiln::string;
  }

  kiln::dtype dtype_;
  kiln::device device_;
  std::int64_t count_;
  std::size_t bytes_;
  void* data_ = nullptr;
  alignas(16) unsigned char inline_[inline_bytes];
};

/// Allocates a storage and its shared count (one block) from the host's caching
/// allocator, as `make_shared` would from `operator new`: a tensor made in steady
/// state (a graph's output, a variable's new value) then allocates nothing.
template <class T>
struct bookkeeping_allocator {
  using value_type = T;
  bookkeeping_allocator() = default;
  template <class U>
  bookkeeping_allocator(const bookkeeping_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(host_allocator().allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { host_allocator().deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const bookkeeping_allocator<U>&) const noexcept {
    return true;
  }
};

/// A new storage of `count` elements, shared. (Compiled once in a compiled kiln,
/// KILN_LIBRARY_INLINE: a program that makes tensors then compiles neither the
/// storage's constructor nor its shared count's.)
KILN_LIBRARY_INLINE std::shared_ptr<storage> make_storage(kiln::dtype t, std::int64_t count, kiln::device d);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::shared_ptr<storage> make_storage(kiln::dtype t, std::int64_t count, kiln::device d) {
  return std::allocate_shared<storage>(bookkeeping_allocator<storage>(), t, count, d);
}
#endif

}  // namespace kiln::detail
// ----- end kiln/core/storage.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_STORAGE_HPP

namespace kiln {

namespace detail {
/// The graph value a symbolic tensor stands for; defined by the tracer.
struct symbol;
}  // namespace detail

/// What a kernel sees of a tensor: its elements, dtype and shape. Kernels never
/// own or allocate; the caller passes views of inputs and a preallocated output.
struct buffer_view {
  void* data = nullptr;
  kiln::dtype dtype = kiln::float32;
  kiln::shape shape;

  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::int64_t size() const { return shape.num_elements(); }
};

/// A tensor with a runtime dtype, shape and device. Copies share the buffer.
/// \code
/// kiln::tensor x = kiln::constant({{1.f, 2.f}, {3.f, 4.f}});
/// x.shape();               // (2, 2)
/// (x + 1).to_vector<float>();  // {2, 3, 4, 5}
/// \endcode
class tensor {
 public:
  /// An empty handle; using it in an op raises kiln::invalid_argument_error.
  tensor() = default;

  /// An uninitialized eager tensor of the given dtype and shape (kernels fill it).
  tensor(kiln::dtype t, const kiln::shape& s, kiln::device d = kiln::device::cpu)
      : buffer_(detail::make_storage(t, checked_size(s), d)), shape_(s), dtype_(t), device_(d) {}

  /// A symbolic tensor standing for `sym` (used by the tracer).
  tensor(kiln::dtype t, const kiln::shape& s, std::shared_ptr<const detail::symbol> sym)
      : shape_(s), dtype_(t), symbol_(std::move(sym)) {}

  /// False for a default-constructed handle.
  bool defined() const { return buffer_ != nullptr || symbol_ != nullptr; }
  /// Whether this eager tensor and `other` view one buffer (a reshape, `x[i]` or a
  /// copy of the handle).
  /// \code kiln::tensor x = kiln::ones({2, 2}); x[1].shares_buffer_with(x);  // true \endcode
  bool shares_buffer_with(const tensor& other) const { return buffer_ && buffer_ == other.buffer_; }
  kiln::dtype dtype() const { return dtype_; }
  const kiln::shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  /// Number of elements.
  std::int64_t size() const { return shape_.num_elements(); }
  kiln::device device() const { return device_; }
  /// True inside a trace: the tensor has a dtype and shape but no value.
  bool is_symbolic() const { return symbol_ != nullptr; }
  const std::shared_ptr<const detail::symbol>& symbol() const { return symbol_; }

  /// The value of a scalar; `T` must be the tensor's element type.
  /// \code kiln::constant(3).item<int>() == 3 \endcode
  template <class T>
  T item() const {
    if (shape_.rank() != 0 && size() != 1)
      throw value_error("item() needs a tensor with one element, got shape " + shape_.str());
    return host_data<T>("item")[0];
  }

  /// The elements in row-major order; `T` must be the tensor's element type.
  /// \code kiln::range(3).to_vector<int>() == std::vector<int>{0, 1, 2} \endcode
  template <class T>
  std::vector<T> to_vector() const {
    if (device_ != kiln::device::cpu) return to(kiln::device::cpu).to_vector<T>();
    const T* p = host_data<T>("to_vector");
    return std::vector<T>(p, p + size());
  }

  /// Pointer to the first element of an eager tensor on the CPU.
  template <class T>
  const T* data() const {
    return host_data<T>("data");
  }

  /// A copy on device `d` (or this tensor, if it is there already).
  /// \code kiln::tensor g = kiln::ones({2}).to(kiln::device::cpu); \endcode
  KILN_LIBRARY_INLINE tensor to(kiln::device d) const;

  /// Reads a scalar as a condition. A symbolic tensor cannot be tested with C++
  /// `if`/`while`: use kiln::cond and kiln::while_loop.
  explicit operator bool() const;

  /// `x[i]`: the i-th slice along the first axis (negative i counts from the end).
  /// (A template, as op functions are, so that its kernels compile only where used.)
  template <class = void>
  tensor operator[](std::int64_t i) const;
  /// `x[i]` for an int32 or int64 scalar tensor `i` in [0, first dim), eager or
  /// symbolic (a loop counter inside a function): a `gather` on the first axis.
  /// \code
  /// kiln::tensor x = kiln::constant({{1, 2}, {3, 4}});
  /// kiln::function rows([&] { kiln::for_range(2, [&](const kiln::tensor& i) { kiln::print(x[i]); }); });
  /// \endcode
  template <class = void>
  tensor operator[](const tensor& i) const;

  /// Whether this tensor is the only holder of its buffer: no other tensor, copy or
  /// view sees it, so the graph that owns this tensor may write the buffer in place.
  bool sole_owner() const { return buffer_ && buffer_.use_count() == 1; }
  /// How many elements the buffer holds from this tensor's first on: its size, or
  /// more for a view of the start of a larger buffer (a grown tensor_array's).
  std::int64_t buffer_capacity() const { return buffer_ ? buffer_->count() - offset_ : 0; }

  /// The kernel view of an eager tensor.
  buffer_view view() const { return {const_cast<void*>(raw_data()), dtype_, shape_}; }
  void* raw_data() const {
    return static_cast<char*>(const_cast<void*>(buffer_->data())) + offset_ * std::int64_t(size_of(dtype_));
  }
  /// A tensor sharing this one's buffer with another shape of the same size, or a
  /// contiguous window of it starting `offset` elements in.
  tensor share(const kiln::shape& s, std::int64_t offset = 0) const& {
    tensor t = *this;
    return std::move(t).share(s, offset);
  }
  /// The same, taking this tensor's hold on the buffer (no count to change: a loop
  /// that grows an array by a row per iteration reshapes it each time).
  tensor share(const kiln::shape& s, std::int64_t offset = 0) && {
    shape_ = s;
    offset_ += offset;
    return std::move(*this);
  }

  /// Throws kiln::type_error when this tensor has no value (it is symbolic or empty).
  void require_value(std::string_view what) const {
    if (symbol_ || !buffer_) throw_no_value(what, bool(symbol_));
  }

 private:
  static std::int64_t checked_size(const kiln::shape& s) {
    if (!s.is_fully_defined() || !s.count_fits()) throw_unallocatable(s);
    return s.num_elements();
  }

  template <class T>
  const T* host_data(const char* what) const {
    require_value(what);
    if constexpr (!has_dtype<T>) {
      static_assert(has_dtype<T>, "kiln tensors hold bool, int32_t, int64_t, float, double or std::string");
    } else if (dtype_of<T> != dtype_) {
      throw_not_of_dtype(what, dtype_of<T>, dtype_);
    }
    if (device_ != kiln::device::cpu) throw_not_on_host(what, device_);
    return static_cast<const T*>(raw_data());
  }
  // The errors of require_value, checked_size and host_data, out of line: those are
  // inlined wherever a tensor is made or its elements are read.
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_no_value(std::string_view what, bool symbolic) {
    if (symbolic) throw type_error(std::string(what) + ": a symbolic tensor has no value; return it from the function instead");
    throw invalid_argument_error(std::string(what) + ": the tensor is empty (default-constructed)");
  }
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_unallocatable(const kiln::shape& s) {
    if (!s.is_fully_defined()) throw value_error("an eager tensor needs a fully defined shape, got " + s.str());
    throw value_error("a tensor of shape " + s.str() + " has more elements than an int64 can count");
  }
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_not_of_dtype(const char* what, kiln::dtype asked, kiln::dtype held) {
    throw type_error(std::string(what) + "<" + std::string(name(asked)) + ">() on a tensor of dtype " +
                     std::string(name(held)));
  }
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_not_on_host(const char* what, kiln::device d) {
    throw invalid_argument_error(std::string(what) + ": the tensor is on " + std::string(name(d)) +
                                 "; copy it with .to(kiln::device::cpu) first");
  }

  std::shared_ptr<detail::storage> buffer_;
  std::int64_t offset_ = 0;
  kiln::shape shape_;
  kiln::dtype dtype_ = kiln::float32;
  kiln::device device_ = kiln::device::cpu;
  std::shared_ptr<const detail::symbol> symbol_;
};

#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE tensor tensor::to(kiln::device d) const {
  require_value("to");
  if (d == device_) return *this;
  tensor out(dtype_, shape_, d);
  const void* src = raw_data();
  std::size_t bytes = std::size_t(size()) * size_of(dtype_);
  if (d == kiln::device::cpu)
    detail::memory_for(device_).copy_to_host(out.raw_data(), src, bytes);
  else
    detail::memory_for(d).copy_from_host(out.raw_data(), src, bytes);
  return out;
}
#endif

namespace detail {
/// allocate_result's error, out of line (every op's eager call reaches it).
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_result_exhausted(std::string_view op_name, const shape& sh,
                                                                       const resource_exhausted_error& e) {
  std::string text(op_name);
  text += ": result ";
  text += sh.str();
  text += ": ";
  text += e.what();
  throw resource_exhausted_error(text);
}

/// A new `dt` `sh` tensor on `dev` that `op_name` makes: a failed allocation
/// (kiln::resource_exhausted_error) names the op and the shape.
inline tensor allocate_result(std::string_view op_name, dtype dt, const shape& sh, device dev = device::cpu) {
  try {
    return tensor(dt, sh, dev);
  } catch (const resource_exhausted_error& e) {
    throw_result_exhausted(op_name, sh, e);
  }
}
}  // namespace detail

}  // namespace kiln
// ----- end kiln/core/tensor.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP

namespace kiln {

class variable;

namespace config {
namespace detail {
KILN_LIBRARY_INLINE std::atomic<std::ostream*>& print_stream_slot();
}  // namespace detail
/// Where kiln::print writes: standard error unless set, as tf.print. The stream must
/// outlive its use.
/// \code std::ostringstream captured; kiln::config::set_print_stream(captured); \endcode
KILN_LIBRARY_INLINE void set_print_stream(std::ostream& os);
/// The stream kiln::print writes to.
KILN_LIBRARY_INLINE std::ostream& print_stream();

namespace detail {
KILN_LIBRARY_INLINE std::atomic<std::ostream*>& warning_stream_slot();
}  // namespace detail
/// Where kiln writes its warnings (a function that retraces often): standard error
/// unless set, as TensorFlow's logging; null silences them. The stream must outlive
/// its use.
/// \code kiln::config::set_warning_stream(nullptr); \endcode
KILN_LIBRARY_INLINE void set_warning_stream(std::ostream* os);
/// The stream kiln's warnings go to, or null when they are silenced.
KILN_LIBRARY_INLINE std::ostream* warning_stream();
}  // namespace config

namespace detail {

// ---- one number as text ----------------------------------------------------------

/// The two decimal notations: positional (`12.5`) and scientific (`1.25e+01`).
enum class notation { positional, scientific };

/// How trailing zeros of a fraction are trimmed (the `trim` modes of NumPy's Dragon4).
enum class trim_mode {
  keep,        ///< keep every digit and the point: `1.50`, `1.e-05`
  keep_point,  ///< drop trailing zeros, keep the point: `1.5`, `2.`
  one_zero,    ///< drop trailing zeros but one: `1.5`, `2.0`
  no_point,    ///< drop trailing zeros and a bare point: `1.5`, `2`
};

/// Number of fraction digits in a number's text (`"1.25e+01"` has 2).
KILN_COLD KILN_LIBRARY_INLINE int fraction_digits(std::string_view text);

// The printer holds floating-point elements as doubles, which hold float32 values
// exactly, and a flag `single` for float32, whose digits and comparisons NumPy takes
// in float32: one copy of the number code serves both types.

/// `x` with the fewest fraction digits that read back as the same value of its type
/// (float32 when `single`), but at least `min_fraction` and at most `max_fraction` of
/// them, rounded from the exact binary value: the digits NumPy's Dragon4 prints in
/// its "unique" mode.
/// \code kiln::detail::shortest_digits(2.2f, true, kiln::detail::notation::positional, 0, 8) == "2.2" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string shortest_digits(double x, bool single, notation n, int min_fraction = 0,
                                             int max_fraction = std::numeric_limits<int>::max());

/// `text` (as shortest_digits writes it) with its fraction trimmed as `mode` says.
/// \code kiln::detail::trimmed("2", kiln::detail::trim_mode::one_zero) == "2.0" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string trimmed(std::string_view text, trim_mode mode);

/// Python's `repr` of a bytes object, which NumPy prints for each element of a
/// TensorFlow string tensor: `b'aa'`, `b"it's"`, `b'\xff\n'`.
KILN_COLD KILN_LIBRARY_INLINE std::string python_bytes_repr(std::string_view bytes);

/// A string escaped as TensorFlow's C++ runtime escapes it for tf.print (C escapes,
/// octal for other control characters, bytes of UTF-8 sequences kept as they are).
/// \code kiln::detail::c_escaped("a\"b\n") == "a\\\"b\\n" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string c_escaped(std::string_view text);

/// A floating-point element as NumPy's `str()` writes a scalar, which TensorFlow
/// prints for a rank-0 tensor: as Python writes floats (`2.2`, `20.0`, `1e+16`,
/// `1.5e-05`, `nan`, `-inf`) at the element type's own precision.
/// \code kiln::detail::numpy_real_text(2.2f, true) == "2.2" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string numpy_real_text(double x, bool single);

/// A floating-point element as tf.print writes it (TensorFlow's C++ text): 6
/// significant digits (15 for float64) when those read back exactly, else 9 (17):
/// `0.405638`, `0.666458249`.
/// \code kiln::detail::tf_print_real_text(0.5, false) == "0.5" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string tf_print_real_text(double x, bool single);

// ---- the elements of an array ------------------------------------------------------

/// `text` right-aligned in `width` columns.
KILN_COLD KILN_LIBRARY_INLINE std::string padded_left(std::string text, std::size_t width);

/// The texts NumPy's FloatingFormat gives the elements `values` of one array (float32
/// values when `single`) in its default mode (at most 8 fraction digits, only as many
/// as needed): one notation for all (scientific when the largest magnitude is >= 1e8,
/// the smallest non-zero < 1e-4, or their ratio > 1000), all padded to one width, the
/// points aligned.
/// \code kiln::detail::numpy_float_texts({1.5, 2.}, true) == std::vector<std::string>{"1.5", "2. "} \endcode
KILN_COLD KILN_LIBRARY_INLINE std::vector<std::string> numpy_float_texts(const std::vector<double>& values, bool single);

/// The shown elements of an array, copied out of its data: doubles for float32 and
/// float64, 64-bit integers for bool and the integer dtypes, views for strings. What
/// the one dtype-specific part of the printer (format_values_of) hands the rest.
struct element_values {
  dtype type;
  std::vector<double> reals;
  std::vector<std::int64_t> integers;
  std::vector<std::string_view> strings;
  /// How a string element is written (set by the copy of string elements, so that a
  /// program that prints no strings does not compile the escaping).
  std::string (*string_text)(std::string_view, bool numpy) = nullptr;

  KILN_LIBRARY_INLINE std::size_t size() const;
  /// Element `i` as NumPy's `str()` writes a scalar (`numpy`: `2`, `True`, `b'aa'`,
  /// `2.2`), else as tf.print writes it (`2`, `1`, `"aa"`, `2.2`).
  KILN_LIBRARY_INLINE KILN_COLD std::string text(std::size_t i, bool numpy) const;
};

/// String element `x` as NumPy's `str()` writes it (`b'aa'`), else as tf.print
/// does (`"aa"`).
KILN_COLD KILN_LIBRARY_INLINE std::string string_element_text(std::string_view x, bool numpy);

/// The texts NumPy gives the elements of one array: integers right-aligned to a
/// shared width, bools as ` True`/`False`, floats by numpy_float_texts, strings as
/// Python bytes, unpadded.
KILN_COLD KILN_LIBRARY_INLINE std::vector<std::string> numpy_element_texts(const element_values& v);

// ---- layout ------------------------------------------------------------------------

/// The value styles of format_values.
enum class value_style {
  numpy,          ///< NumPy's `str()`, as TensorFlow's eager `print(x)` shows values
  tf_print,       ///< tf.print: every axis longer than 6 shows its 3 first and last items
  tf_print_line,  ///< tf.print with nested rows on one line: `[[1 2] [3 4]]`
};

/// How the values of an array are laid out: which elements show and where rows and
/// lines break.
struct value_layout {
  std::int64_t edge_items = 3;   ///< items shown at each end of a summarized axis
  bool summarize = false;        ///< axes longer than 2 * edge_items show only their ends, around `...`
  std::size_t line_width = 0;    ///< the last axis wraps lines longer than this; 0 never wraps
  bool single_line = false;      ///< nested rows separated by a space instead of line breaks
};

/// The layout of an array of shape `s` in `style`: NumPy wraps lines at 75 columns
/// and shows `...` only past 1000 elements; the tf.print styles never wrap and
/// always summarize.
KILN_COLD KILN_LIBRARY_INLINE value_layout layout_of(const shape& s, value_style style);

/// Whether `layout` shows only the ends of an axis of `length` items.
KILN_LIBRARY_INLINE bool summarized(std::int64_t length, const value_layout& layout);

/// The row-major flat indices of the elements `layout` shows of a tensor of shape `s`,
/// in the order they are written.
KILN_COLD KILN_LIBRARY_INLINE std::vector<std::int64_t> shown_indices(const shape& s, const value_layout& layout);

/// Writes the texts of the shown elements (in shown_indices order) as nested rows:
/// NumPy's `_formatArray`, which is also the layout of TensorFlow's C++ printer once
/// line wrapping is off.
class array_writer {
 public:
  array_writer(const shape& s, const std::vector<std::string>& items, const value_layout& layout)
      : shape_(s), items_(items), layout_(layout) {}

  KILN_LIBRARY_INLINE KILN_COLD std::string write();

 private:
  KILN_LIBRARY_INLINE KILN_COLD void block(int axis, std::size_t indent, std::int64_t width);

  // Appends `word`, first breaking the line when wrapping is on and the word would
  // pass `width` (a line holding only its indent never breaks).
  KILN_LIBRARY_INLINE KILN_COLD void add_word(std::string_view word, std::int64_t width, std::size_t indent);

  const shape& shape_;
  const std::vector<std::string>& items_;
  value_layout layout_;
  std::size_t next_ = 0;
  std::string out_;
};

// ---- whole tensors -----------------------------------------------------------------

/// The shown elements `v` of an array of shape `s` in `style` (format_values_of).
KILN_COLD KILN_LIBRARY_INLINE std::string format_elements(const element_values& v, const shape& s, value_style style);

/// The values of a row-major array of `T` of shape `s` in `style`. NumPy style pads
/// elements to a shared width, wraps lines at 75 columns and shows `...` only past
/// 1000 elements; the tf.print styles write each element unpadded. Only the copy of
/// the shown elements depends on `T`.
/// \code
/// const float data[] = {1.5f, 2.f};
/// kiln::detail::format_values_of(data, kiln::shape{2}, kiln::detail::value_style::numpy) == "[1.5 2. ]";
/// \endcode
template <class T>
KILN_COLD std::string format_values_of(const T* data, const shape& s, value_style style) {
  element_values v{dtype_of<T>, {}, {}, {}, {}};
  if constexpr (std::is_same_v<T, std::string>) v.string_text = string_element_text;
  for (std::int64_t i : shown_indices(s, layout_of(s, style))) {
    if constexpr (std::is_floating_point_v<T>)
      v.reals.push_back(data[i]);
    else if constexpr (std::is_same_v<T, std::string>)
      v.strings.push_back(data[i]);
    else
      v.integers.push_back(data[i]);
  }
  return format_elements(v, s, style);
}

/// The values of eager tensor `x` (copied from the GPU if there) in `style`.
/// \code kiln::detail::format_values(kiln::constant({1.5f, 2.f}), kiln::detail::value_style::numpy) == "[1.5 2. ]" \endcode
KILN_LIBRARY_INLINE std::string format_values(const tensor& x, value_style style);
#if KILN_DEFINE_LIBRARY
KILN_COLD KILN_LIBRARY_INLINE std::string format_values(const tensor& x, value_style style) {
  x.require_value("print");
  const tensor host = x.device() == kiln::device::cpu ? x : x.to(kiln::device::cpu);
  return visit_dtype(host.dtype(), [&]<class T>() {
    return format_values_of(static_cast<const T*>(host.raw_data()), host.shape(), style);  // checked above
  });
}
#endif

/// The values of eager tensor `x` as tf.print writes them (used by kiln::print):
/// `1`, `[1 2 3]`, `[[1 2] [3 4]]` with `single_line`, else each nested row on its
/// own line as TensorFlow writes it. Strings are quoted (`"a"`), bools are `1`/`0`.
/// tf.print writes a lone scalar string argument raw (`a`), which is the caller's
/// business. Symbolic tensors raise kiln::type_error.
/// \code kiln::detail::format_values(kiln::range(10), true) == "[0 1 2 ... 7 8 9]" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string format_values(const tensor& x, bool single_line);

/// One piece of a print: a text, or the input whose values are printed there.
struct print_piece {
  std::string text;
  int input = -1;
};

/// The line kiln::print writes for `pieces` and eager `inputs`, as tf.print writes
/// it: pieces separated by spaces, scalar strings raw, other tensors as their values.
KILN_LIBRARY_INLINE std::string print_line(std::span<const print_piece> pieces, std::span<const tensor* const> inputs);

/// Writes `line` whole to config::print_stream(), so that lines from several threads
/// do not interleave.
KILN_LIBRARY_INLINE void write_print_line(const std::string& line);

/// One argument of kiln::print as a piece of the line: C++ strings and numbers are
/// texts fixed now; tensors (and variables) are inputs printed when the print runs.
template <class T>
void add_print_piece(const T& x, std::vector<print_piece>& pieces, std::vector<tensor>& inputs) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    pieces.push_back({std::string(std::string_view(x)), -1});
  } else if constexpr (std::is_same_v<U, tensor> || std::is_same_v<U, variable> || std::is_convertible_v<const U&, tensor>) {
    pieces.push_back({{}, int(inputs.size())});
    inputs.push_back(tensor(x));
  } else {
    static_assert(std::is_arithmetic_v<U>, "kiln::print takes tensors, variables, C++ strings and C++ numbers");
    if constexpr (std::is_same_v<U, bool>) {
      pieces.push_back({x ? "True" : "False", -1});
    } else if constexpr (std::is_integral_v<U>) {
      pieces.push_back({std::to_string(x), -1});
    } else {
      std::ostringstream os;
      os << x;
      pieces.push_back({os.str(), -1});
    }
  }
}

}  // namespace detail

namespace detail {
/// Writes an eager value as `tensor(values, shape=..., dtype=...)`, values laid out
/// over several lines starting on a line of their own.
KILN_COLD KILN_LIBRARY_INLINE std::ostream& write_eager(std::ostream& os, std::string values, const shape& s, dtype t);
}  // namespace detail

/// Writes `x` as Python's `print` writes an eager `tf.Tensor`, with `tensor(` for
/// `tf.Tensor(`: `tensor([4 1], shape=(2,), dtype=int32)`, `tensor(2.2, shape=(),
/// dtype=float32)`, `tensor(b'aa', shape=(), dtype=string)`; values laid out over
/// several lines start on a line of their own. A symbolic tensor prints as
/// TensorFlow prints one while tracing, with its graph value's name:
/// `Tensor("x:0", shape=(None,), dtype=int32)`. GPU tensors print their values.
/// \code std::cout << kiln::constant({{1, 2}, {3, 4}});  // tensor(\n[[1 2]\n [3 4]], shape=(2, 2), dtype=int32) \endcode
KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor& x);

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::config::detail {

KILN_LIBRARY_INLINE std::atomic<std::ostream*>& print_stream_slot() {
  static std::atomic<std::ostream*> stream{&std::cerr};
  return stream;
}

}  // namespace kiln::config::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void set_print_stream(std::ostream& os) { detail::print_stream_slot() = &os; }

KILN_LIBRARY_INLINE std::ostream& print_stream() { return *detail::print_stream_slot().load(); }

}  // namespace kiln::config

namespace kiln::config::detail {

KILN_LIBRARY_INLINE std::atomic<std::ostream*>& warning_stream_slot() {
  static std::atomic<std::ostream*> stream{&std::cerr};
  return stream;
}

}  // namespace kiln::config::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void set_warning_stream(std::ostream* os) { detail::warning_stream_slot() = os; }

KILN_LIBRARY_INLINE std::ostream* warning_stream() { return detail::warning_stream_slot().load(); }

}  // namespace kiln::config

namespace kiln::detail {

KILN_LIBRARY_INLINE int fraction_digits(std::string_view text) {
  std::size_t point = text.find('.');
  if (point == std::string_view::npos) return 0;
  std::size_t end = std::min(text.find('e'), text.size());
  return static_cast<int>(end - point - 1);
}

KILN_LIBRARY_INLINE std::string shortest_digits(double x, bool single, notation n, int min_fraction, int max_fraction) {
  // Enough for any double: fixed notation of the extremes needs about 330 characters.
  char buffer[512];
  auto write = [&](std::chars_format format, auto... precision) {
    auto written = single ? std::to_chars(buffer, buffer + sizeof buffer, float(x), format, precision...)
                          : std::to_chars(buffer, buffer + sizeof buffer, x, format, precision...);
    if (written.ec != std::errc{}) throw internal_error("shortest_digits: the number does not fit the buffer");
    return std::string(buffer, written.ptr);
  };
  // The shortest digits that read back, in scientific notation. In positional notation
  // they are placed around the point, zeros filling up to it: to_chars' own fixed
  // notation would write every digit of the exact binary value left of the point
  // (float32 123456789 as `123456792`, where NumPy writes `123456790`).
  std::string text = write(std::chars_format::scientific);
  if (n == notation::positional) {
    const std::size_t e = text.find('e');
    const bool negative = text[0] == '-';
    std::string digits = text.substr(negative ? 1 : 0, e - (negative ? 1 : 0));
    std::erase(digits, '.');
    const int exponent = std::stoi(text.substr(e + 1));
    std::string whole, fraction;
    if (exponent < 0) {
      whole = "0";
      fraction = std::string(std::size_t(-exponent - 1), '0') + digits;
    } else if (std::size_t(exponent) + 1 >= digits.size()) {
      whole = digits + std::string(std::size_t(exponent) + 1 - digits.size(), '0');
    } else {
      whole = digits.substr(0, std::size_t(exponent) + 1);
      fraction = digits.substr(std::size_t(exponent) + 1);
    }
    text = (negative ? "-" : "") + whole + (fraction.empty() ? "" : "." + fraction);
  }
  const int fraction = fraction_digits(text);
  const int wanted = std::clamp(fraction, min_fraction, max_fraction);
  if (wanted == fraction) return text;
  // More or fewer digits than the shortest: rounded from the exact binary value.
  return write(n == notation::positional ? std::chars_format::fixed : std::chars_format::scientific, wanted);
}

KILN_LIBRARY_INLINE std::string trimmed(std::string_view text, trim_mode mode) {
  std::size_t e = std::min(text.find('e'), text.size());
  std::string mantissa(text.substr(0, e));
  if (mantissa.find('.') == std::string::npos) {
    mantissa += '.';
  } else if (mode != trim_mode::keep) {
    while (mantissa.back() == '0') mantissa.pop_back();
  }
  if (mode == trim_mode::one_zero && mantissa.back() == '.') mantissa += '0';
  if (mode == trim_mode::no_point && mantissa.back() == '.') mantissa.pop_back();
  return mantissa.append(text.substr(e));
}

KILN_LIBRARY_INLINE std::string python_bytes_repr(std::string_view bytes) {
  bool has_single = bytes.find('\'') != std::string_view::npos;
  bool has_double = bytes.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out = "b";
  out += quote;
  for (char c : bytes) {
    auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u >= 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

KILN_LIBRARY_INLINE std::string c_escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\'':
        out += "\\'";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += '\\';
          out += char('0' + (u >> 6));
          out += char('0' + ((u >> 3) & 7));
          out += char('0' + (u & 7));
        } else {
          out += c;
        }
    }
  }
  return out;
}

KILN_LIBRARY_INLINE std::string numpy_real_text(double x, bool single) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // NumPy compares in long double, so float32 1e-4 (just below 1e-4) is scientific.
  long double magnitude = std::fabs(static_cast<long double>(x));
  if (x == 0 || (magnitude < 1e16L && magnitude >= 1e-4L))
    return trimmed(shortest_digits(x, single, notation::positional), trim_mode::one_zero);
  return trimmed(shortest_digits(x, single, notation::scientific), trim_mode::no_point);
}

KILN_LIBRARY_INLINE std::string tf_print_real_text(double x, bool single) {
  if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
  char buffer[64];
  auto write = [&](int digits) {
    return single ? std::to_chars(buffer, buffer + sizeof buffer, float(x), std::chars_format::general, digits)
                  : std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::general, digits);
  };
  auto written = write(single ? 6 : 15);
  auto reads_back = [&](auto value) {
    std::from_chars(buffer, written.ptr, value);
    return value == decltype(value)(x);
  };
  if (!(single ? reads_back(0.f) : reads_back(0.))) written = write(single ? 9 : 17);
  return std::string(buffer, written.ptr);
}

KILN_LIBRARY_INLINE std::string padded_left(std::string text, std::size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

KILN_LIBRARY_INLINE std::vector<std::string> numpy_float_texts(const std::vector<double>& values, bool single) {
  constexpr int max_fraction = 8;
  bool any_finite = false, any_nonzero = false, any_special = false, negative_infinity = false;
  double largest = 0, smallest = std::numeric_limits<double>::infinity();
  for (double v : values) {
    if (!std::isfinite(v)) {
      any_special = true;
      negative_infinity = negative_infinity || (std::isinf(v) && v < 0);
      continue;
    }
    any_finite = true;
    if (v != 0) {
      any_nonzero = true;
      largest = std::max(largest, std::fabs(v));
      smallest = std::min(smallest, std::fabs(v));
    }
  }
  // NumPy compares in the array's own type: float32 1e-4 is not below float(1e-4). A
  // quotient of floats rounded to double, then to float, is the float quotient.
  auto in_type = [single](double v) { return single ? double(float(v)) : v; };
  bool scientific =
      any_nonzero && (largest >= in_type(1e8) || smallest < in_type(1e-4) || in_type(largest / smallest) > 1000);
  notation n = scientific ? notation::scientific : notation::positional;

  // A first pass over the finite values fixes the digits and widths all share.
  std::vector<std::string> texts(values.size());
  std::size_t int_width = 0, fraction_width = 0, exponent_digits = 0;
  int shared_fraction = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    texts[i] = trimmed(shortest_digits(values[i], single, n, 0, max_fraction), trim_mode::keep_point);
    std::size_t point = texts[i].find('.'), e = std::min(texts[i].find('e'), texts[i].size());
    int_width = std::max(int_width, point);
    shared_fraction = std::max(shared_fraction, int(e - point - 1));
    if (scientific) exponent_digits = std::max(exponent_digits, texts[i].size() - e - 2);
  }
  // Right of the point: the fraction, or in scientific notation also `e+XX`.
  if (any_finite)
    fraction_width = scientific ? std::size_t(shared_fraction) + 2 + exponent_digits : std::size_t(shared_fraction);
  if (any_special) {
    // "nan", "inf" or "-inf" must fit in the shared width, of which the point and
    // the right part take fraction_width + 1.
    std::size_t widest = negative_infinity ? 4 : 3;
    if (widest > fraction_width + 1) int_width = std::max(int_width, widest - fraction_width - 1);
  }
  const std::size_t width = int_width + 1 + fraction_width;

  for (std::size_t i = 0; i < values.size(); ++i) {
    double v = values[i];
    std::string& text = texts[i];
    if (std::isnan(v)) {
      text = "nan";
    } else if (std::isinf(v)) {
      text = v < 0 ? "-inf" : "inf";
    } else if (scientific) {
      // Every mantissa gets the shared number of digits, rounded from the exact value.
      text = trimmed(shortest_digits(v, single, n, shared_fraction, shared_fraction), trim_mode::keep);
      std::size_t digits_at = text.find('e') + 2;
      if (text.size() - digits_at < exponent_digits)
        text.insert(digits_at, exponent_digits - (text.size() - digits_at), '0');
    } else {
      text.append(fraction_width - (text.size() - text.find('.') - 1), ' ');
    }
    text = padded_left(std::move(text), width);
  }
  return texts;
}

KILN_LIBRARY_INLINE std::size_t element_values::size() const { return reals.size() + integers.size() + strings.size(); }

KILN_LIBRARY_INLINE std::string element_values::text(std::size_t i, bool numpy) const {
  if (is_floating(type))
    return numpy ? numpy_real_text(reals[i], type == float32) : tf_print_real_text(reals[i], type == float32);
  if (type == string) return string_text(strings[i], numpy);
  if (type == bool_) return integers[i] ? (numpy ? "True" : "1") : (numpy ? "False" : "0");
  return std::to_string(integers[i]);
}

KILN_LIBRARY_INLINE std::string string_element_text(std::string_view x, bool numpy) {
  return numpy ? python_bytes_repr(x) : "\"" + c_escaped(x) + "\"";
}

KILN_LIBRARY_INLINE std::vector<std::string> numpy_element_texts(const element_values& v) {
  if (is_floating(v.type)) return numpy_float_texts(v.reals, v.type == float32);
  std::vector<std::string> texts;
  std::size_t width = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    texts.push_back(v.type == bool_ ? (v.integers[i] ? " True" : "False") : v.text(i, true));
    if (v.type != string) width = std::max(width, texts.back().size());
  }
  for (std::string& text : texts) text = padded_left(std::move(text), width);
  return texts;
}

KILN_LIBRARY_INLINE value_layout layout_of(const shape& s, value_style style) {
  value_layout layout;
  const bool numpy = style == value_style::numpy;
  layout.summarize = numpy ? s.num_elements() > 1000 : true;
  layout.line_width = numpy ? 75 : 0;
  layout.single_line = style == value_style::tf_print_line;
  return layout;
}

KILN_LIBRARY_INLINE bool summarized(std::int64_t length, const value_layout& layout) {
  return layout.summarize && length > 2 * layout.edge_items;
}

KILN_LIBRARY_INLINE std::vector<std::int64_t> shown_indices(const shape& s, const value_layout& layout) {
  const int rank = s.rank();
  std::vector<std::int64_t> indices;
  if (s.num_elements() == 0) return indices;
  const auto strides = row_major_strides(s);
  std::vector<std::int64_t> at(std::size_t(rank), 0);  // an odometer over the shown positions
  for (;;) {
    std::int64_t flat = 0;
    for (int axis = 0; axis < rank; ++axis) flat += at[std::size_t(axis)] * strides[axis];
    indices.push_back(flat);
    int axis = rank - 1;
    for (; axis >= 0; --axis) {
      std::int64_t& c = at[std::size_t(axis)];
      if (++c == layout.edge_items && summarized(s[axis], layout)) c = s[axis] - layout.edge_items;
      if (c < s[axis]) break;
      c = 0;
    }
    if (axis < 0) return indices;
  }
}

KILN_LIBRARY_INLINE std::string array_writer::write() {
  // A row's first line starts with the brackets it opens and its other lines with
  // an indent as wide: one column per bracket.
  block(0, layout_.single_line ? 0 : 1, static_cast<std::int64_t>(layout_.line_width));
  return std::move(out_);
}

KILN_LIBRARY_INLINE void array_writer::block(int axis, std::size_t indent, std::int64_t width) {
  const std::int64_t length = shape_[axis];
  const bool cut = summarized(length, layout_);
  const std::int64_t shown = cut ? 2 * layout_.edge_items : length;
  out_ += '[';
  if (axis == shape_.rank() - 1) {
    // The closing bracket takes one column of the line.
    for (std::int64_t k = 0; k < shown; ++k) {
      if (k > 0) out_ += ' ';
      if (cut && k == layout_.edge_items) {
        add_word("...", width - 1, indent);
        out_ += ' ';
      }
      add_word(items_[next_++], width - 1, indent);
    }
  } else {
    auto next_row = [&] {
      if (layout_.single_line)
        out_ += ' ';
      else
        out_.append(std::size_t(shape_.rank() - axis - 1), '\n').append(indent, ' ');
    };
    for (std::int64_t k = 0; k < shown; ++k) {
      if (k > 0) next_row();
      if (cut && k == layout_.edge_items) {
        out_ += "...";
        next_row();
      }
      block(axis + 1, layout_.single_line ? indent : indent + 1, width - 1);
    }
  }
  out_ += ']';
}

KILN_LIBRARY_INLINE void array_writer::add_word(std::string_view word, std::int64_t width, std::size_t indent) {
  if (layout_.line_width > 0) {
    const std::size_t line_start = out_.rfind('\n') + 1;  // npos + 1 == 0
    const std::size_t line = out_.size() - line_start;
    if (std::int64_t(line + word.size()) > width && line > indent) {
      while (out_.size() > line_start && out_.back() == ' ') out_.pop_back();
      out_.append(1, '\n').append(indent, ' ');
    }
  }
  out_ += word;
}

KILN_LIBRARY_INLINE std::string format_elements(const element_values& v, const shape& s, value_style style) {
  const bool numpy = style == value_style::numpy;
  if (s.rank() == 0) return v.text(0, numpy);
  if (v.size() == 0) return "[]";
  std::vector<std::string> texts;
  if (numpy) {
    texts = numpy_element_texts(v);
  } else {
    for (std::size_t i = 0; i < v.size(); ++i) texts.push_back(v.text(i, false));
  }
  return array_writer(s, texts, layout_of(s, style)).write();
}

KILN_LIBRARY_INLINE std::string format_values(const tensor& x, bool single_line) {
  return format_values(x, single_line ? value_style::tf_print_line : value_style::tf_print);
}

KILN_LIBRARY_INLINE std::string print_line(std::span<const print_piece> pieces, std::span<const tensor* const> inputs) {
  std::string line;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    if (k) line += ' ';
    const print_piece& p = pieces[k];
    if (p.input < 0) {
      line += p.text;
      continue;
    }
    const tensor& x = *inputs[std::size_t(p.input)];
    if (x.dtype() == string && x.rank() == 0)
      line += x.to(device::cpu).data<std::string>()[0];
    else
      line += format_values(x, false);
  }
  return line + '\n';
}

KILN_LIBRARY_INLINE void write_print_line(const std::string& line) {
  static std::mutex m;
  std::lock_guard lock(m);
  config::print_stream() << line << std::flush;
}

KILN_LIBRARY_INLINE std::ostream& write_eager(std::ostream& os, std::string values, const shape& s, dtype t) {
  if (values.find('\n') != std::string::npos) values.insert(0, "\n");
  return os << "tensor(" << values << ", shape=" << s << ", dtype=" << t << ")";
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor& x) {
  if (!x.defined()) return os << "tensor(<undefined>)";
  if (x.is_symbolic())
    return os << "Tensor(\"" << detail::value_name(*x.symbol()) << "\", shape=" << x.shape() << ", dtype=" << x.dtype()
              << ")";
  return detail::write_eager(os, detail::format_values(x, detail::value_style::numpy), x.shape(), x.dtype());
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/core/print.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_PRINT_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_SPEC_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_SPEC_HPP
// ----- begin kiln/core/spec.hpp -----
/// \file
/// `kiln::tensor_spec`: an argument described by dtype and (possibly partial) shape.

#include <concepts>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>


namespace kiln {

namespace detail {
/// "float32 Tensor, shape=(2, 3)": a value of dtype `t` and shape `s` as a function's
/// signature shows it.
KILN_COLD KILN_LIBRARY_INLINE std::string signature_entry(dtype t, const shape& s);
}  // namespace detail

/// Describes a tensor argument without a value; `kiln::none` dims accept any size.
/// \code kiln::tensor_spec({kiln::none}, kiln::int32) \endcode
struct tensor_spec {
  kiln::shape shape;
  kiln::dtype dtype = float32;
  std::string name;

  tensor_spec() = default;
  tensor_spec(kiln::shape s, kiln::dtype t, std::string n = "") : shape(s), dtype(t), name(std::move(n)) {}

  /// True when a tensor of dtype `t` and shape `s` fits this spec.
  KILN_LIBRARY_INLINE bool accepts(kiln::dtype t, const kiln::shape& s) const;
  bool operator==(const tensor_spec&) const = default;

  /// TensorFlow's text: `TensorSpec(shape=(None,), dtype=tf.int32, name=None)`.
  KILN_LIBRARY_INLINE std::string str() const;
};

KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor_spec& s);

namespace detail {
/// Writes a nested structure as TensorFlow's signatures show it, its leaves numbered
/// in order: `(<1>, (<2>, <3>))`, `[<1>, <2>]`, `(<1>,)`.
/// \code
/// kiln::detail::structure_text s;
/// s.open(false); s.leaf(); s.next(); s.leaf(); s.close(false, 2);  // s.text == "(<1>, <2>)"
/// \endcode
struct structure_text {
  std::string text;
  int leaves = 0;
  KILN_LIBRARY_INLINE void leaf();
  /// A tuple `(`, or a list `[`.
  KILN_LIBRARY_INLINE void open(bool list);
  KILN_LIBRARY_INLINE void next();
  /// Closes what open() opened, around `count` elements (a tuple of one is `(<1>,)`).
  KILN_LIBRARY_INLINE void close(bool list, std::size_t count);
};

/// What a trace was made for, in both tiers, kept in parts: its text is written only
/// where a program shows it (pretty_printed_concrete_signatures, a concrete function
/// printed), so a file that never shows a signature does not compile the writing.
struct trace_signature {
  std::string name;
  std::vector<std::string> arg_names;
  std::vector<std::string> bound_text;  ///< per argument: its bound C++ value's text, or empty
  /// Per argument: the structure of its tensors (`(<1>, <2>)`), empty for one tensor or none.
  std::vector<std::string> arg_structure;
  std::vector<tensor_spec> inputs;      ///< one per tensor argument (leaf), named
  std::vector<int> input_arg;           ///< the argument each input belongs to
  /// Per input: how the signature shows it when not as a tensor (a dataset's
  /// `DatasetSpec(...)`), else empty. May be shorter than `inputs`.
  std::vector<std::string> input_text;
  std::vector<tensor_spec> outputs;     ///< none for a function that returns nothing
  /// The structure of the outputs (`(<1>, <2>)`); empty for one tensor or for nothing.
  std::string output_structure;

  /// `double(a)` or `pow(a, b=2)`.
  KILN_LIBRARY_INLINE std::string header() const;
  /// The header with the Args/Returns block, as TensorFlow prints a signature; a
  /// structure is shown with a line per leaf below it.
  KILN_LIBRARY_INLINE std::string signature_text() const;
};
}  // namespace detail

// ---- the compile-time tier's values, as the runtime tier tells them apart ----------

template <class T, std::int64_t... Dims>
class fixed;  // kiln/typed/fixed.hpp
struct typed_expression;  // kiln/typed/expr.hpp

namespace typed {

template <class X>
struct is_fixed : std::false_type {};
template <class T, std::int64_t... D>
struct is_fixed<fixed<T, D...>> : std::true_type {};
/// Whether `X` (without cv or reference) is a `kiln::fixed`.
template <class X>
concept fixed_value = is_fixed<std::remove_cvref_t<X>>::value;

/// A symbolic value or expression of the compile-time tier.
template <class X>
concept lazy = std::derived_from<std::remove_cvref_t<X>, typed_expression>;

/// What typed ops take: `fixed` values, symbolic values and expressions.
template <class X>
concept operand = fixed_value<X> || lazy<X>;
}  // namespace typed

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string signature_entry(dtype t, const shape& s) {
  std::string text(name(t));
  text += " Tensor, shape=";
  text += s.str();
  return text;
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE bool tensor_spec::accepts(kiln::dtype t, const kiln::shape& s) const {
  return t == dtype && shape.accepts(s);
}

KILN_LIBRARY_INLINE std::string tensor_spec::str() const {
  return "TensorSpec(shape=" + shape.str() + ", dtype=tf." + std::string(kiln::name(dtype)) +
         ", name=" + (name.empty() ? std::string("None") : "'" + name + "'") + ")";
}

KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor_spec& s) { return os << s.str(); }

}  // namespace kiln

namespace kiln::detail {

KILN_LIBRARY_INLINE void structure_text::leaf() {
  text += '<';
  text += std::to_string(++leaves);
  text += '>';
}

KILN_LIBRARY_INLINE void structure_text::open(bool list) { text += list ? '[' : '('; }

KILN_LIBRARY_INLINE void structure_text::next() { text += ", "; }

KILN_LIBRARY_INLINE void structure_text::close(bool list, std::size_t count) {
  if (!list && count == 1) text += ',';
  text += list ? ']' : ')';
}

KILN_LIBRARY_INLINE std::string trace_signature::header() const {
  std::string s = name + "(";
  for (std::size_t i = 0; i < arg_names.size(); ++i) {
    if (i) s += ", ";
    s += arg_names[i];
    if (i < bound_text.size() && !bound_text[i].empty()) s += "=" + bound_text[i];
  }
  return s + ")";
}

KILN_LIBRARY_INLINE std::string trace_signature::signature_text() const {
  std::ostringstream os;
  os << header() << "\n";
  if (!inputs.empty()) os << "  Args:\n";
  auto input_entry = [&](std::size_t k) {
    return k < input_text.size() && !input_text[k].empty() ? input_text[k]
                                                           : signature_entry(inputs[k].dtype, inputs[k].shape);
  };
  for (std::size_t a = 0; a < arg_names.size(); ++a) {
    std::vector<std::size_t> leaves;
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (k < input_arg.size() && input_arg[k] == int(a)) leaves.push_back(k);
    if (leaves.empty()) continue;
    const std::string& structure = a < arg_structure.size() ? arg_structure[a] : std::string();
    if (structure.empty()) {
      for (std::size_t k : leaves) os << "    " << arg_names[a] << ": " << input_entry(k) << "\n";
    } else {
      os << "    " << arg_names[a] << ": " << structure << "\n";
      for (std::size_t j = 0; j < leaves.size(); ++j)
        os << "      <" << j + 1 << ">: " << input_entry(leaves[j]) << "\n";
    }
  }
  os << "  Returns:\n";
  if (!output_structure.empty()) {
    os << "    " << output_structure << "\n";
    for (std::size_t j = 0; j < outputs.size(); ++j)
      os << "      <" << j + 1 << ">: " << signature_entry(outputs[j].dtype, outputs[j].shape) << "\n";
  } else if (outputs.empty()) {
    os << "    NoneTensorSpec()\n";
  } else {
    for (const tensor_spec& out : outputs) os << "    " << signature_entry(out.dtype, out.shape) << "\n";
  }
  return os.str();
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/core/spec.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_SPEC_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_FACTORIES_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_FACTORIES_HPP
// ----- begin kiln/ops/factories.hpp -----
/// \file
/// Tensors made from C++ values, and the factories: constant,
/// zeros, ones, fill, eye, range, zeros_like and ones_like, and the generator behind
/// random::uniform (kiln/trace/random.hpp, since a random draw is stateful). They are
/// sources, not ops: each writes a fresh eager CPU tensor directly (a `device`
/// argument copies the result there).

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_PARALLEL_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_PARALLEL_HPP
// ----- begin kiln/core/parallel.hpp -----
/// \file
/// A small fork-join thread pool for kernels over large tensors. The calling thread
/// works too, nested calls run inline, and calls from several user threads at once
/// are serialized (a second caller runs its loop itself rather than waiting).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>


namespace kiln {
namespace detail {

class thread_pool {
 public:
  KILN_LIBRARY_INLINE explicit thread_pool(int threads);
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  KILN_LIBRARY_INLINE ~thread_pool();

  int size() const { return size_; }

  /// Calls `fn(i)` once for every i in [0, chunks), spread over the pool.
  template <class F>
  void run(std::int64_t chunks, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_erased(
        chunks, [](void* f, std::int64_t i) { (*static_cast<Fn*>(f))(i); },
        const_cast<std::remove_const_t<Fn>*>(std::addressof(fn)));
  }

 private:
  struct job {
    void (*call)(void*, std::int64_t);
    void* fn;
    std::int64_t chunks;
    std::atomic<std::int64_t> next{0};
  };

  // How long a thread that waits spins before it sleeps. Waking a sleeping thread
  // takes tens of microseconds (more in a virtual machine), as long as a whole chunk
  // of a mid-sized matmul: a pool whose workers sleep between the jobs of one
  // computation adds that to every job, and two threads end up slower than one.
  // OpenMP runtimes and Eigen's pool spin for the same reason.
  static constexpr std::chrono::microseconds spin_time{200};

  // run() for any callable: compiled once, not once per kernel that runs in parallel.
  KILN_LIBRARY_INLINE void run_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* fn);

  KILN_LIBRARY_INLINE static bool& inside_worker();

  KILN_LIBRARY_INLINE static void drain(job& j);

  /// Spins until `ready()` or spin_time has passed; returns whether it is ready.
  template <class Ready>
  static bool spin_until(Ready&& ready) {
    const auto deadline = std::chrono::steady_clock::now() + spin_time;
    for (int i = 1;; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#else
      std::this_thread::yield();
#endif
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return false;
    }
  }

  KILN_LIBRARY_INLINE void work();

  int size_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  job* job_ = nullptr;                         // guarded by mutex_
  std::atomic<std::uint64_t> generation_{0};   // written under mutex_, read by spinning workers
  std::atomic<int> active_{0};                 // workers inside the current job
  int sleeping_ = 0;                           // guarded by mutex_
  std::atomic<bool> stopping_{false};
};

KILN_LIBRARY_INLINE int default_thread_count();

struct pool_holder {
  std::mutex mutex;
  std::shared_ptr<thread_pool> pool = std::make_shared<thread_pool>(default_thread_count());
};
KILN_LIBRARY_INLINE pool_holder& pool_state();
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE pool_holder& pool_state() {
  static pool_holder holder;
  return holder;
}
#endif
KILN_LIBRARY_INLINE std::shared_ptr<thread_pool> current_pool();

/// How many chunks `n` items (more than `grain`) split into on `threads` threads: at
/// least `grain` items each, at most four per thread, and as many for every thread.
KILN_LIBRARY_INLINE std::int64_t balanced_chunks(std::int64_t n, std::int64_t grain, std::int64_t threads);

/// parallel_for's ranges for any callable `call(fn, lo, hi)`, compiled once. A range
/// within the grain is one call here too, so that the body behind `call` is compiled
/// once, not again inline in each parallel_for.
KILN_LIBRARY_INLINE void parallel_ranges(std::int64_t n, std::int64_t grain,
                                         void (*call)(void*, std::int64_t, std::int64_t), void* fn);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE void parallel_ranges(std::int64_t n, std::int64_t grain,
                                         void (*call)(void*, std::int64_t, std::int64_t), void* fn) {
  if (n <= grain) {
    call(fn, 0, n);
    return;
  }
  auto pool = current_pool();
  const std::int64_t chunks = pool->size() == 1 ? 1 : balanced_chunks(n, grain, pool->size());
  const std::int64_t step = (n + chunks - 1) / chunks;
  pool->run(chunks, [&](std::int64_t c) {
    const std::int64_t lo = c * step, hi = std::min(n, lo + step);
    if (lo < hi) call(fn, lo, hi);
  });
}
#endif

/// Runs `fn(lo, hi)` over [0, n) in contiguous ranges of at least `grain` items,
/// in parallel when the range is large enough to pay for it.
/// \code
/// std::vector<float> v(1 << 20);
/// kiln::detail::parallel_for(std::int64_t(v.size()), 1 << 16, [&](std::int64_t lo, std::int64_t hi) {
///   std::fill(v.begin() + lo, v.begin() + hi, 1.f);
/// });
/// \endcode
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  using Fn = std::remove_reference_t<F>;
  parallel_ranges(
      n, grain, [](void* f, std::int64_t lo, std::int64_t hi) { (*static_cast<Fn*>(f))(lo, hi); },
      const_cast<std::remove_const_t<Fn>*>(std::addressof(fn)));
}

/// parallel_for, or with `Serial` (a range known at compile time to be no longer than
/// the grain) the one call parallel_for would make, without the thread pool compiled in.
template <bool Serial, class F>
void ranges_for(std::int64_t n, std::int64_t grain, F&& fn) {
  if constexpr (Serial) {
    if (n > 0) fn(std::int64_t(0), n);
  } else {
    parallel_for(n, grain, fn);
  }
}

}  // namespace detail

namespace config {
/// Sets how many threads kernels over large tensors use (default: hardware threads,
/// or the KILN_NUM_THREADS environment variable).
/// \code kiln::config::set_num_threads(1); \endcode
KILN_LIBRARY_INLINE void set_num_threads(int n);
/// The number of threads kernels use.
KILN_LIBRARY_INLINE int num_threads();
}  // namespace config

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE thread_pool::thread_pool(int threads) : size_(std::max(1, threads)) {
  for (int i = 1; i < size_; ++i) workers_.emplace_back([this] { work(); });
}

KILN_LIBRARY_INLINE thread_pool::~thread_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

KILN_LIBRARY_INLINE void thread_pool::run_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* fn) {
  if (chunks <= 0) return;
  std::unique_lock busy(run_mutex_, std::try_to_lock);
  if (chunks == 1 || size_ == 1 || inside_worker() || !busy.owns_lock()) {
    for (std::int64_t i = 0; i < chunks; ++i) call(fn, i);
    return;
  }
  job j{call, fn, chunks};
  bool sleepers = false;
  {
    std::lock_guard lock(mutex_);
    job_ = &j;
    generation_.fetch_add(1, std::memory_order_release);
    sleepers = sleeping_ > 0;
  }
  if (sleepers) wake_.notify_all();
  inside_worker() = true;
  drain(j);
  inside_worker() = false;
  {
    // No worker joins the job from here on; wait until those that joined have left
    // it, so that `j` can die.
    std::lock_guard lock(mutex_);
    job_ = nullptr;
  }
  if (spin_until([&] { return active_.load(std::memory_order_acquire) == 0; })) return;
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
}

KILN_LIBRARY_INLINE bool& thread_pool::inside_worker() {
  thread_local bool flag = false;
  return flag;
}

KILN_LIBRARY_INLINE void thread_pool::drain(job& j) {
  for (std::int64_t i; (i = j.next.fetch_add(1, std::memory_order_relaxed)) < j.chunks;) j.call(j.fn, i);
}

KILN_LIBRARY_INLINE void thread_pool::work() {
  inside_worker() = true;
  std::uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stopping_.load(); });
    std::unique_lock lock(mutex_);
    ++sleeping_;
    wake_.wait(lock, [&] { return stopping_.load() || generation_.load(std::memory_order_relaxed) != seen; });
    --sleeping_;
    if (stopping_) return;
    seen = generation_.load(std::memory_order_relaxed);
    job* j = job_;
    if (j == nullptr) continue;  // it finished before this thread came
    active_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    drain(*j);
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Taking the mutex orders this with the caller's check of active_: it either
      // sees zero or is already waiting when notified.
      std::lock_guard sync(mutex_);
      done_.notify_all();
    }
  }
}

KILN_LIBRARY_INLINE int default_thread_count() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

KILN_LIBRARY_INLINE std::shared_ptr<thread_pool> current_pool() {
  auto& s = pool_state();
  std::lock_guard lock(s.mutex);
  return s.pool;
}

KILN_LIBRARY_INLINE std::int64_t balanced_chunks(std::int64_t n, std::int64_t grain, std::int64_t threads) {
  const std::int64_t chunks = std::min((n + grain - 1) / grain, 4 * threads);
  return std::min(n, (chunks + threads - 1) / threads * threads);
}

}  // namespace kiln::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void set_num_threads(int n) {
  auto& s = kiln::detail::pool_state();
  auto fresh = std::make_shared<kiln::detail::thread_pool>(std::max(1, n));
  std::lock_guard lock(s.mutex);
  s.pool = std::move(fresh);
}

KILN_LIBRARY_INLINE int num_threads() { return kiln::detail::current_pool()->size(); }

}  // namespace kiln::config
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/core/parallel.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_PARALLEL_HPP

namespace kiln {
namespace detail {

// ---- C++ values as elements -------------------------------------------------------

/// A C++ value that is one string element: `"a"`, std::string, std::string_view.
template <class T>
concept string_like = std::is_convertible_v<const T&, std::string_view> && !std::is_arithmetic_v<T>;

/// The element type a C++ value is stored as: string-like values as std::string.
template <class T>
using stored_t = std::conditional_t<string_like<T>, std::string, T>;

/// A C++ value as error messages show it: `1.5 (float64)`, `"a" (string)`.
template <class S>
std::string describe_value(const S& v) {
  if constexpr (std::is_same_v<S, std::string>) {
    return "\"" + v + "\" (string)";
  } else {
    std::string text;
    if constexpr (std::is_same_v<S, bool>) {
      text = v ? "true" : "false";
    } else {
      char buffer[64];
      text.assign(buffer, std::to_chars(buffer, buffer + sizeof buffer, v).ptr);
    }
    return text + " (" + std::string(name(dtype_of<S>)) + ")";
  }
}

// convert_element's errors, out of line: one per source type, not per pair of types.
template <class S>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_not_convertible(std::string_view fn, const S& v, dtype to) {
  throw type_error(std::string(fn) + ": cannot convert " + describe_value(v) + " to " + std::string(name(to)) +
                   (std::is_floating_point_v<S> ? "; kiln::cast converts floats to integers" : ""));
}
template <class S>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_out_of_range(std::string_view fn, const S& v, dtype to) {
  throw value_error(std::string(fn) + ": " + describe_value(v) + " is out of range for " + std::string(name(to)));
}

/// `v` as an element of type `To`, converted as TensorFlow's tf.constant converts a
/// Python value to a dtype: numbers and bools to floats; bools and integers to
/// integers that hold them (else kiln::value_error); strings only to strings, bools
/// only to bools, floats never to integers (else kiln::type_error).
template <class To, class S>
To convert_element(const S& v, std::string_view fn) {
  constexpr bool refused = std::is_same_v<To, std::string> || std::is_same_v<S, std::string> ||
                           std::is_same_v<To, bool> || (std::is_integral_v<To> && std::is_floating_point_v<S>);
  if constexpr (std::is_same_v<To, S>) {
    return v;
  } else if constexpr (refused) {
    throw_not_convertible(fn, v, dtype_of<To>);
  } else if constexpr (std::is_integral_v<To> && !std::is_same_v<S, bool>) {
    if (!std::in_range<To>(v)) throw_out_of_range(fn, v, dtype_of<To>);
    return To(v);
  } else {
    return To(v);
  }
}

/// Raises kiln::value_error naming `fn` unless `s` is fully defined (an eager result needs one).
KILN_LIBRARY_INLINE void require_fully_defined(std::string_view fn, const shape& s);

/// `t`, copied to device `d` unless it is there.
KILN_LIBRARY_INLINE tensor placed(tensor t, device d);

/// constant_of's error for `count` values and shape `s`, out of line: one for every
/// element type.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_values_do_not_fill(std::size_t count, const shape& s) {
  throw value_error("constant: " + std::to_string(count) + " values do not fill shape " + s.str() + " (" +
                    std::to_string(s.num_elements()) + " elements)");
}

/// A tensor of shape `s` holding `values` (row-major) converted to dtype `t`, by
/// default the dtype of the values. Only the six element types instantiate it.
template <class S>
tensor constant_of(const std::vector<S>& values, const shape& s, std::optional<dtype> t, device d) {
  require_fully_defined("constant", s);
  if (std::int64_t(values.size()) != s.num_elements()) throw_values_do_not_fill(values.size(), s);
  tensor out(t.value_or(dtype_of<S>), s);
  visit_dtype(out.dtype(), [&]<class To>() {
    To* p = out.view().as<To>();
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = convert_element<To, S>(values[i], "constant");
  });
  return placed(std::move(out), d);
}

/// constant_of for the values of any C++ element type: string-like ones as std::string.
template <class T>
tensor constant_of_values(const std::vector<T>& values, const shape& s, std::optional<dtype> t, device d) {
  using S = stored_t<T>;
  static_assert(has_dtype<S>,
                "kiln::constant: elements must be bool, std::int32_t, std::int64_t, float, double or strings");
  if constexpr (std::is_same_v<S, T>)
    return constant_of(values, s, t, d);
  else
    return constant_of(std::vector<S>(values.begin(), values.end()), s, t, d);
}

/// Nesting depth of a braced list type: 0 for an element, 2 for a list of lists.
template <class L>
inline constexpr int list_depth = 0;
template <class T>
inline constexpr int list_depth<std::initializer_list<T>> = 1 + list_depth<T>;

/// The element type at the bottom of a nested braced list type.
template <class L>
struct list_element {
  using type = L;
};
template <class T>
struct list_element<std::initializer_list<T>> : list_element<T> {};

/// Appends the elements of nested list `list` to `out` in row-major order, recording
/// each axis's length in `dims` (-1 until seen); rows of unequal lengths are an error.
template <class L, class S>
void flatten_list(const L& list, std::size_t axis, std::array<std::int64_t, 4>& dims, std::vector<S>& out) {
  if constexpr (list_depth<L> == 0) {
    out.push_back(S(list));
  } else {
    const auto n = std::int64_t(list.size());
    if (dims[axis] < 0) {
      dims[axis] = n;
    } else if (dims[axis] != n) {
      throw value_error("constant: the nested list is ragged: rows along axis " + std::to_string(axis) + " have " +
                        std::to_string(dims[axis]) + " and " + std::to_string(n) + " elements");
    }
    for (const auto& item : list) flatten_list(item, axis + 1, dims, out);
  }
}

/// The tensor of a nested braced list: its shape from the nesting, its elements flattened.
template <class L>
tensor constant_of_list(const L& list, std::optional<dtype> t, device d) {
  static_assert(list_depth<L> <= 4, "kiln::constant takes nested lists up to rank 4");
  std::array<std::int64_t, 4> dims;
  dims.fill(-1);
  using S = stored_t<typename list_element<L>::type>;
  static_assert(has_dtype<S>,
                "kiln::constant: elements must be bool, std::int32_t, std::int64_t, float, double or strings");
  std::vector<S> flat;
  flatten_list(list, 0, dims, flat);
  shape s;
  for (int axis = 0; axis < list_depth<L>; ++axis) s.push_back(std::max<std::int64_t>(dims[std::size_t(axis)], 0));
  return constant_of(flat, s, t, d);
}

// ---- filled tensors ---------------------------------------------------------------

/// A tensor of dtype_of<T> and shape `s` whose every element is `value`; large
/// numeric buffers are filled in parallel.
template <class T>
tensor filled(std::string_view fn, const shape& s, const T& value, device d) {
  require_fully_defined(fn, s);
  tensor out = allocate_result(fn, dtype_of<T>, s);
  T* p = out.view().as<T>();
  if constexpr (std::is_same_v<T, std::string>) {
    std::fill(p, p + out.size(), value);
  } else {
    parallel_for(out.size(), 1 << 16, [&](std::int64_t lo, std::int64_t hi) { std::fill(p + lo, p + hi, value); });
  }
  return placed(std::move(out), d);
}

/// A tensor of zeros (`false`, `""`); `fn` names the factory in errors. (This and
/// one_filled are compiled once in a compiled kiln, KILN_LIBRARY_INLINE: they reach
/// every dtype's fill.)
KILN_LIBRARY_INLINE tensor zero_filled(std::string_view fn, const shape& s, dtype t, device d);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE tensor zero_filled(std::string_view fn, const shape& s, dtype t, device d) {
  return visit_dtype(t, [&]<class T>() {
    return filled(fn, s, T{}, d);  // strings: ""
  });
}
#endif

/// A tensor of ones (`true`); strings have no one and raise kiln::type_error naming `fn`.
KILN_LIBRARY_INLINE tensor one_filled(std::string_view fn, const shape& s, dtype t, device d);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE tensor one_filled(std::string_view fn, const shape& s, dtype t, device d) {
  return visit_dtype(t, [&]<class T>() -> tensor {
    if constexpr (std::is_same_v<T, std::string>)
      throw type_error(std::string(fn) + ": string tensors have no one; use kiln::fill(shape, \"text\")");
    else
      return filled(fn, s, T(1), d);
  });
}
#endif

/// The shape of `x` for a `*_like` factory: `x` must be defined, and if symbolic,
/// have a fully defined shape (the result is then an eager constant of that shape).
KILN_LIBRARY_INLINE const shape& like_shape(std::string_view fn, const tensor& x);

// ---- range ------------------------------------------------------------------------

/// The C++ types range takes: those of int32, int64, float32 and float64.
template <class T>
inline constexpr bool is_range_value =
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, float> ||
    std::is_same_v<T, double>;

/// The result type of range over arguments of types Ts: the last of int32, int64,
/// float32, float64 that one of them has (TensorFlow's order).
template <class... Ts>
using range_result_t = std::conditional_t<
    (std::is_same_v<Ts, double> || ...), double,
    std::conditional_t<(std::is_same_v<Ts, float> || ...), float,
                       std::conditional_t<(std::is_same_v<Ts, std::int64_t> || ...), std::int64_t, std::int32_t>>>;

/// range's tensor in element type T, with its argument checks.
template <class T>
tensor make_range(T start, T limit, T delta) {
  auto text = [](T v) { return describe_value(v); };
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta))
      throw invalid_argument_error("range: start, limit and delta must be finite, got " + text(start) + ", " +
                                   text(limit) + " and " + text(delta));
  }
  if (delta == 0) throw invalid_argument_error("range: delta must not be 0");
  if (delta > 0 ? start > limit : start < limit)
    throw invalid_argument_error("range: start " + text(start) + (delta > 0 ? " > limit " : " < limit ") + text(limit) +
                                 " with delta " + text(delta) + (delta > 0 ? "; a positive delta needs start <= limit"
                                                                            : "; a negative delta needs start >= limit"));
  // Counts and values in unsigned arithmetic: limit - start may not fit in T.
  using U = std::uint64_t;
  constexpr U max_count = U(std::numeric_limits<std::int64_t>::max() / 16);
  U count = 0;
  if constexpr (std::is_integral_v<T>) {
    U span = delta > 0 ? U(limit) - U(start) : U(start) - U(limit);
    U step = delta > 0 ? U(delta) : U(0) - U(delta);
    count = span / step + (span % step != 0);
  } else {
    T steps = std::ceil(std::fabs((limit - start) / delta));  // may be inf
    count = steps < T(max_count) ? U(steps) : max_count + 1;
  }
  if (count > max_count)
    throw invalid_argument_error("range: " + text(start) + " to " + text(limit) + " by " + text(delta) +
                                 " has too many elements");
  tensor out(dtype_of<T>, shape{std::int64_t(count)});
  T* p = out.view().as<T>();
  parallel_for(out.size(), 1 << 16, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      if constexpr (std::is_integral_v<T>)
        p[i] = T(U(start) + U(i) * U(delta));  // stays within [start, limit]: no wrap
      else
        p[i] = start + T(i) * delta;
    }
  });
  return out;
}

// ---- random numbers ---------------------------------------------------------------

/// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
/// SC'11): four 32-bit random words from a 128-bit counter and a 64-bit key. Being a
/// pure function of (counter, key), it gives the same numbers on any thread count
/// and any backend.
KILN_HOST_DEVICE constexpr std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                                                        std::array<std::uint32_t, 2> key) {
  constexpr std::uint64_t multiplier0 = 0xD2511F53u, multiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t weyl0 = 0x9E3779B9u, weyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t product0 = multiplier0 * counter[0], product1 = multiplier1 * counter[2];
    counter = {std::uint32_t(product1 >> 32) ^ counter[1] ^ key[0], std::uint32_t(product1),
               std::uint32_t(product0 >> 32) ^ counter[3] ^ key[1], std::uint32_t(product0)};
    key = {key[0] + weyl0, key[1] + weyl1};
  }
  return counter;
}

/// Elements per parallel task of uniform_fill.
inline constexpr std::int64_t uniform_fill_grain = 1 << 14;

/// Fills `out[0, n)` with numbers uniform in [lo, hi) from Philox keyed by `seed`:
/// element i takes words of block i / per_block (one word per 32-bit element, two
/// per 64-bit one) of stream `stream`, so each element depends only on the seed, the
/// stream and its index. A stateful random op takes the next stream at every draw.
/// `Serial` says n is at most uniform_fill_grain (known at compile time).
template <bool Serial = false, class T>
void uniform_fill(T* out, std::int64_t n, std::uint64_t seed, std::uint64_t stream, T lo, T hi) {
  constexpr int per_block = sizeof(T) == 4 ? 4 : 2;
  const std::array<std::uint32_t, 2> key{std::uint32_t(seed), std::uint32_t(seed >> 32)};
  // Element j of a block as 32 or 64 random bits.
  auto bits = [](const std::array<std::uint32_t, 4>& words, int j) {
    if constexpr (per_block == 4)
      return words[std::size_t(j)];
    else
      return std::uint64_t(words[std::size_t(2 * j)]) << 32 | words[std::size_t(2 * j + 1)];
  };
  auto value = [&](const std::array<std::uint32_t, 4>& words, int j) -> T {
    if constexpr (std::is_integral_v<T>) {
      // Unsigned arithmetic: hi - lo may not fit in T. The modulo bias is below
      // (hi - lo) / 2^32 (or 2^64), as in TensorFlow.
      using U = std::make_unsigned_t<T>;
      return T(U(lo) + U(bits(words, j) % U(U(hi) - U(lo))));
    } else {
      // 24 or 53 random bits give u in [0, 1); the bounds are scaled in double, as
      // a float32 span may overflow; a float64 span overflows only for bounds of
      // opposite signs, where the weighted sum below cannot.
      double u = per_block == 4 ? double(bits(words, j) >> 8) * 0x1p-24 : double(bits(words, j) >> 11) * 0x1p-53;
      double span = double(hi) - double(lo);
      T v = std::isfinite(span) ? T(double(lo) + u * span) : T(double(lo) * (1 - u) + double(hi) * u);
      return v < hi ? v : std::nextafter(hi, lo);  // rounding may reach hi, which is excluded
    }
  };
  ranges_for<Serial>(n, uniform_fill_grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t block = begin / per_block; block * per_block < end; ++block) {
      auto words = philox4x32_10(
          {std::uint32_t(block), std::uint32_t(std::uint64_t(block) >> 32), std::uint32_t(stream), std::uint32_t(stream >> 32)},
          key);
      for (int j = 0; j < per_block; ++j) {
        std::int64_t i = block * per_block + j;
        if (i >= begin && i < end) out[i] = value(words, j);
      }
    }
  });
}

/// `v` as an integer of type T, or kiln::invalid_argument_error if it is not one.
template <class T>
T integer_bound(double v, const char* what, dtype t) {
  // -double(min) is 2^31 or 2^63 exactly, unlike double(max).
  if (!(v == std::floor(v) && v >= double(std::numeric_limits<T>::min()) && v < -double(std::numeric_limits<T>::min())))
    throw invalid_argument_error(std::string("random::uniform: ") + what + " " + describe_value(v) +
                                 " is not an integer that " + std::string(name(t)) + " holds");
  return T(v);
}

}  // namespace detail

/// A scalar tensor of a C++ number: bool → bool_, std::int32_t (`int`) → int32,
/// std::int64_t → int64, float → float32, double → float64; with `t`, converted to
/// that dtype as tf.constant converts (kiln::type_error for floats to integers or
/// numbers to bool, kiln::value_error when an integer does not fit); then placed on `d`.
/// \code kiln::constant(2);  kiln::constant(2.5f);  kiln::constant(1, kiln::float64); \endcode
template <class T>
  requires std::is_arithmetic_v<T>
tensor constant(T value, std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  static_assert(has_dtype<T>,
                "kiln::constant takes bool, std::int32_t, std::int64_t, float or double: cast other arithmetic types "
                "(unsigned, char, long long, ...) to one of them");
  return detail::constant_of(std::vector<T>{value}, shape{}, t, d);
}

/// A scalar string tensor.
/// \code kiln::constant("a");  // tensor(b'a', shape=(), dtype=string) \endcode
template <detail::string_like S>
tensor constant(const S& value, std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  return detail::constant_of(std::vector<std::string>{std::string(std::string_view(value))}, shape{}, t, d);
}

/// A tensor from a (nested) braced list, up to rank 4; rows of unequal length raise
/// kiln::value_error. Elements convert to `t` as for scalars.
/// \code kiln::constant({{1.f, 2.f}, {3.f, 4.f}});  kiln::constant({"a", "b"});  kiln::constant({1, 2}, kiln::float32); \endcode
template <class T>
tensor constant(std::initializer_list<T> values, std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  return detail::constant_of_list(values, t, d);
}
/// A tensor from a braced list of rank 2, as the form above.
template <class T>
tensor constant(std::initializer_list<std::initializer_list<T>> values, std::optional<dtype> t = std::nullopt,
                device d = device::cpu) {
  return detail::constant_of_list(values, t, d);
}
/// A tensor from a braced list of rank 3, as the form above.
template <class T>
tensor constant(std::initializer_list<std::initializer_list<std::initializer_list<T>>> values,
                std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  return detail::constant_of_list(values, t, d);
}
/// A tensor from a braced list of rank 4, as the form above.
template <class T>
tensor constant(std::initializer_list<std::initializer_list<std::initializer_list<std::initializer_list<T>>>> values,
                std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  return detail::constant_of_list(values, t, d);
}

/// A tensor of shape `s` from row-major `values`; a count that does not fill `s`
/// raises kiln::value_error naming both.
/// \code kiln::constant(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}); \endcode
template <class T>
tensor constant(const std::vector<T>& values, const shape& s, std::optional<dtype> t = std::nullopt,
                device d = device::cpu) {
  return detail::constant_of_values(values, s, t, d);
}

/// A rank-1 tensor of `values`.
/// \code kiln::constant(std::vector<int>{4, 1});  // tensor([4 1], shape=(2,), dtype=int32) \endcode
template <class T>
tensor constant(const std::vector<T>& values, std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  return detail::constant_of_values(values, shape{std::int64_t(values.size())}, t, d);
}

/// A tensor of zeros (`false` for bool_, `""` for strings).
/// \code kiln::zeros({2, 3});  kiln::zeros({4}, kiln::int32); \endcode
KILN_LIBRARY_INLINE tensor zeros(const shape& s, dtype t = float32, device d = device::cpu);

/// A tensor of ones (`true` for bool_); strings raise kiln::type_error.
/// \code kiln::ones({2, 2});  // tensor([[1. 1.] [1. 1.]], ...) \endcode
KILN_LIBRARY_INLINE tensor ones(const shape& s, dtype t = float32, device d = device::cpu);

/// A tensor whose every element is `value`, of `value`'s dtype (a C++ number or a string).
/// \code kiln::fill({2, 3}, 9);  kiln::fill({2}, "ab"); \endcode
template <class T>
tensor fill(const shape& s, const T& value, device d = device::cpu) {
  if constexpr (detail::string_like<T>) {
    return detail::filled("fill", s, std::string(std::string_view(value)), d);
  } else {
    static_assert(has_dtype<T>, "kiln::fill takes bool, std::int32_t, std::int64_t, float, double or a string");
    return detail::filled("fill", s, value, d);
  }
}

/// The `rows` x `columns` matrix with ones on its diagonal and zeros elsewhere.
/// \code kiln::eye(2, 3, kiln::int32);  // [[1 0 0] [0 1 0]] \endcode
KILN_LIBRARY_INLINE tensor eye(std::int64_t rows, std::int64_t columns, dtype t = float32, device d = device::cpu);

/// The `n` x `n` identity matrix.
/// \code kiln::eye(10, kiln::int32); \endcode
KILN_LIBRARY_INLINE tensor eye(std::int64_t n, dtype t = float32, device d = device::cpu);

/// The numbers `start`, `start + delta`, ... short of `limit`, as tf.range: the
/// dtype is the widest of the arguments' (int → int32, std::int64_t → int64, float →
/// float32, double → float64, in that order). delta 0, or a delta pointing away from
/// `limit`, raises kiln::invalid_argument_error; start == limit gives an empty tensor.
/// \code kiln::range(1, 10, 3);  // [1 4 7], int32
/// kiln::range(0.f, 1.f, 0.25f);  // [0.   0.25 0.5  0.75], float32 \endcode
template <class S, class L, class D = std::int32_t>
tensor range(S start, L limit, D delta = 1) {
  static_assert(detail::is_range_value<S> && detail::is_range_value<L> && detail::is_range_value<D>,
                "kiln::range takes std::int32_t, std::int64_t, float or double arguments");
  using R = detail::range_result_t<S, L, D>;
  return detail::make_range<R>(R(start), R(limit), R(delta));
}

/// `range(0, limit, 1)` in the dtype of `limit`.
/// \code kiln::range(3).to_vector<int>() == std::vector<int>{0, 1, 2} \endcode
template <class L>
tensor range(L limit) {
  return range(L(0), limit, L(1));
}

/// Zeros of the dtype, shape and device of `x`. A symbolic `x` needs a fully
/// defined shape (kiln::value_error otherwise) and gives an eager constant.
/// \code kiln::zeros_like(kiln::constant({1, 2}));  // [0 0], int32 \endcode
KILN_LIBRARY_INLINE tensor zeros_like(const tensor& x);

/// Ones of the dtype, shape and device of `x`; as zeros_like.
/// \code kiln::ones_like(kiln::constant({1.5, 2.5}));  // [1. 1.], float64 \endcode
KILN_LIBRARY_INLINE tensor ones_like(const tensor& x);

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE void require_fully_defined(std::string_view fn, const shape& s) {
  if (!s.is_fully_defined()) throw value_error(std::string(fn) + ": the shape must be fully defined, got " + s.str());
}

KILN_LIBRARY_INLINE tensor placed(tensor t, device d) { return d == device::cpu ? t : t.to(d); }

KILN_LIBRARY_INLINE const shape& like_shape(std::string_view fn, const tensor& x) {
  if (!x.defined()) throw invalid_argument_error(std::string(fn) + ": the tensor is empty (default-constructed)");
  require_fully_defined(fn, x.shape());
  return x.shape();
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE tensor zeros(const shape& s, dtype t, device d) { return detail::zero_filled("zeros", s, t, d); }

KILN_LIBRARY_INLINE tensor ones(const shape& s, dtype t, device d) { return detail::one_filled("ones", s, t, d); }

KILN_LIBRARY_INLINE tensor eye(std::int64_t rows, std::int64_t columns, dtype t, device d) {
  if (rows < 0 || columns < 0)
    throw invalid_argument_error("eye: the numbers of rows and columns must be >= 0, got " + std::to_string(rows) +
                                 " and " + std::to_string(columns));
  if (t == string) throw type_error("eye: string tensors have no identity matrix");
  tensor out = detail::zero_filled("eye", shape{rows, columns}, t, device::cpu);
  visit_dtype(t, [&]<class T>() {
    if constexpr (!std::is_same_v<T, std::string>) {
      T* p = out.view().as<T>();
      for (std::int64_t i = 0; i < std::min(rows, columns); ++i) p[i * columns + i] = T(1);
    }
  });
  return detail::placed(std::move(out), d);
}

KILN_LIBRARY_INLINE tensor eye(std::int64_t n, dtype t, device d) { return eye(n, n, t, d); }

KILN_LIBRARY_INLINE tensor zeros_like(const tensor& x) {
  return detail::zero_filled("zeros_like", detail::like_shape("zeros_like", x), x.dtype(), x.device());
}

KILN_LIBRARY_INLINE tensor ones_like(const tensor& x) {
  return detail::one_filled("ones_like", detail::like_shape("ones_like", x), x.dtype(), x.device());
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/ops/factories.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_FACTORIES_HPP

namespace kiln {
namespace typed {

/// The element types a `fixed` may hold: every dtype but string.
template <class T>
inline constexpr bool element_type = std::is_same_v<T, bool> || std::is_same_v<T, std::int32_t> ||
                                     std::is_same_v<T, std::int64_t> || std::is_same_v<T, float> ||
                                     std::is_same_v<T, double>;

/// A shape known at compile time. Dims are positive.
/// \code static_assert(kiln::typed::dims<2, 3>::size == 6); \endcode
template <std::int64_t... D>
struct dims {
  static constexpr int rank = int(sizeof...(D));
  static constexpr std::int64_t size = (std::int64_t(1) * ... * D);
  static constexpr std::array<std::int64_t, sizeof...(D)> values{D...};
  /// The last dim (1 for a scalar): what an evaluation loop runs SIMD across.
  static constexpr std::int64_t inner = rank == 0 ? 1 : values[std::size_t(rank - 1)];
  static constexpr kiln::shape shape() { return kiln::shape{D...}; }
};

/// The `dims` of the shape `S::value`, a `static constexpr kiln::shape` (a shape
/// rule's result, computed at compile time).
template <class S, class = std::make_integer_sequence<int, S::value.rank()>>
struct dims_of_shape;
template <class S, int... I>
struct dims_of_shape<S, std::integer_sequence<int, I...>> {
  using type = dims<S::value[I]...>;
};
template <class S>
using dims_from = typename dims_of_shape<S>::type;

/// Where a `fixed` keeps `N` elements: past this many bytes, on the heap.
inline constexpr std::size_t inline_bytes = 16384;

/// A `fixed`'s elements: an inline aligned array, or a heap one for large sizes.
template <class T, std::int64_t N, bool Inline = (std::size_t(N) * sizeof(T) <= inline_bytes)>
struct storage {
  alignas(64) T values[N];
  T* data() { return values; }
  const T* data() const { return values; }
};

/// Large elements come from kiln's caching allocator, as a tensor's do: a fresh large
/// buffer would cost a page fault per 4 KiB each time a result is made.
template <class T, std::int64_t N>
struct storage<T, N, false> {
  struct release {
    void operator()(T* p) const { detail::host_allocator().deallocate(p, std::size_t(N) * sizeof(T)); }
  };
  std::unique_ptr<T[], release> values{static_cast<T*>(detail::host_allocator().allocate(std::size_t(N) * sizeof(T)))};

  storage() = default;
  storage(const storage& o) { std::copy_n(o.data(), N, data()); }
  storage(storage&&) noexcept = default;
  storage& operator=(const storage& o) {
    std::copy_n(o.data(), N, data());
    return *this;
  }
  storage& operator=(storage&&) noexcept = default;
  T* data() { return values.get(); }
  const T* data() const { return values.get(); }
};

/// Tag: a `fixed` whose elements are left unset, to be written at once.
struct uninitialized_t {
  explicit constexpr uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

/// The error of `fixed::uniform` with `maxval <= minval`: out of line, one per element
/// type rather than per `fixed` type.
template <class T>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_empty_uniform_range(T minval, T maxval) {
  throw invalid_argument_error("kiln::fixed::uniform: maxval " + std::to_string(maxval) + " must be greater than minval " +
                               std::to_string(minval));
}

}  // namespace typed

/// A tensor whose element type and shape are compile-time: `fixed<float, 2, 3>` holds
/// 2 x 3 floats, `fixed<int>` is a scalar. Ops on `fixed` values compute at once and
/// give `fixed` values whose shape the compiler worked out; shape and dtype errors are
/// compile errors. Called with `fixed` arguments, a kiln::function traces once per
/// argument *type*.
/// \code
/// auto x = kiln::fixed<float, 2, 2>::ones();
/// x(0, 1) = 3.f;
/// std::cout << x * 2.f;  // tensor(\n[[2. 6.]\n [2. 2.]], shape=(2, 2), dtype=float32)
/// \endcode
template <class T, std::int64_t... Dims>
class fixed {
  static_assert(typed::element_type<T>, "kiln::fixed: the element type must be bool, std::int32_t, std::int64_t, float or double");
  static_assert(((Dims > 0) && ...), "kiln::fixed: every dim must be positive");
  static_assert(sizeof...(Dims) <= std::size_t(max_rank), "kiln::fixed: at most 8 dims");

 public:
  using value_type = T;
  using dims_type = typed::dims<Dims...>;
  static constexpr int rank = dims_type::rank;
  static constexpr std::int64_t size = dims_type::size;
  static constexpr std::array<std::int64_t, sizeof...(Dims)> dims = dims_type::values;
  static constexpr kiln::dtype dtype = dtype_of<T>;

  /// Zeros.
  fixed() { std::fill_n(data(), size, T(0)); }
  /// Unset elements, for code that writes them all at once.
  explicit fixed(typed::uninitialized_t) {}
  /// A scalar from its value: `kiln::fixed<float> x = 2.f;`.
  fixed(T value)
    requires(rank == 0)
  {
    *data() = value;
  }
  /// The elements in row-major order: `kiln::fixed<int, 3>{1, 2, 3}`. A list of the
  /// wrong length raises kiln::value_error.
  fixed(std::initializer_list<T> values)
    requires(rank > 0)
  {
    if (std::int64_t(values.size()) != size)
      throw value_error("kiln::fixed: " + std::to_string(values.size()) + " values given for shape " + shape().str() + " (" +
                        std::to_string(size) + " elements)");
    std::copy(values.begin(), values.end(), data());
  }
  /// The values of eager tensor `t`, whose dtype and shape must be this type's; else
  /// kiln::value_error naming both.
  explicit fixed(const tensor& t) {
    if (t.is_symbolic() || !t.defined() || t.dtype() != dtype || t.shape() != shape())
      throw value_error("kiln::fixed: cannot hold " +
                        (t.defined() ? std::string(name(t.dtype())) + " " + t.shape().str() : std::string("an empty tensor")) +
                        (t.is_symbolic() ? " (symbolic)" : "") + " as " + std::string(name(dtype)) + " " + shape().str());
    const std::vector<T> values = t.to_vector<T>();
    std::copy(values.begin(), values.end(), data());
  }

  T* data() { return storage_.data(); }
  const T* data() const { return storage_.data(); }
  static constexpr kiln::shape shape() { return dims_type::shape(); }

  /// Element `(i, j, ...)`, one index per dim.
  template <std::integral... I>
    requires(sizeof...(I) == sizeof...(Dims))
  T& operator()(I... i) {
    return data()[offset(i...)];
  }
  template <std::integral... I>
    requires(sizeof...(I) == sizeof...(Dims))
  const T& operator()(I... i) const {
    return data()[offset(i...)];
  }
  /// A scalar's value.
  T item() const
    requires(rank == 0)
  {
    return *data();
  }

  /// Every element `value`.
  static fixed fill(T value) {
    fixed x(typed::uninitialized);
    std::fill_n(x.data(), size, value);
    return x;
  }
  static fixed zeros() { return fill(T(0)); }
  static fixed ones() { return fill(T(1)); }
  /// The identity matrix (ones on the diagonal of a rank-2 type).
  static fixed eye()
    requires(rank == 2)
  {
    fixed x = zeros();
    for (std::int64_t i = 0; i < std::min(dims[0], dims[1]); ++i) x(i, i) = T(1);
    return x;
  }
  /// `start, start + delta, ...` along a rank-1 type, as kiln::range.
  static fixed range(T start = T(0), T delta = T(1))
    requires(rank == 1 && !std::is_same_v<T, bool>)
  {
    fixed x(typed::uninitialized);
    for (std::int64_t i = 0; i < size; ++i) x.data()[i] = T(start + T(i) * delta);
    return x;
  }
  /// Numbers uniform in [minval, maxval) as a pure function of `seed`: the numbers
  /// kiln::random::stateless_uniform(shape(), seed, minval, maxval, dtype) gives.
  static fixed uniform(std::uint64_t seed, T minval = T(0), T maxval = T(1))
    requires(!std::is_same_v<T, bool>)
  {
    if (!(minval < maxval)) typed::throw_empty_uniform_range(minval, maxval);
    fixed x(typed::uninitialized);
    detail::uniform_fill<(size <= detail::uniform_fill_grain)>(x.data(), size, seed, 0, minval, maxval);
    return x;
  }

  /// An eager kiln::tensor with a copy of the values.
  operator tensor() const {
    tensor t(dtype, shape());
    std::copy_n(data(), size, static_cast<T*>(t.view().data));
    return t;
  }

  /// Printed exactly as the kiln::tensor of the same values.
  friend std::ostream& operator<<(std::ostream& os, const fixed& x) {
    return detail::write_eager(os, detail::format_values_of(x.data(), shape(), detail::value_style::numpy), shape(), dtype);
  }

 private:
  template <class... I>
  static std::int64_t offset(I... i) {
    std::int64_t off = 0;
    std::size_t d = 0;
    ((off = off * dims[d++] + std::int64_t(i)), ...);
    return off;
  }

  typed::storage<T, size> storage_;
};

/// The compile-time spec of a `fixed<T, Dims...>` argument, for
/// `get_concrete_function`: `kiln::spec<float, 2, 3>{}`.
template <class T, std::int64_t... Dims>
struct spec {
  using value_type = fixed<T, Dims...>;
  /// As a runtime kiln::tensor_spec would print: `float32 Tensor, shape=(2, 3)`.
  static std::string str() { return detail::signature_entry(dtype_of<T>, kiln::shape{Dims...}); }
};

namespace typed {
/// The `fixed` type of element type `T` over `dims` `D`.
template <class T, class D>
struct fixed_for;
template <class T, std::int64_t... D>
struct fixed_for<T, dims<D...>> {
  using type = fixed<T, D...>;
};
template <class T, class D>
using fixed_t = typename fixed_for<T, D>::type;
}  // namespace typed

}  // namespace kiln
// ----- end kiln/typed/fixed.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_FIXED_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_EXPR_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_EXPR_HPP
// ----- begin kiln/typed/expr.hpp -----
/// \file
/// Expression templates of the compile-time tier. An elementwise op on typed values
/// builds a `node` whose type carries the op, the element type and the dims its
/// constexpr rules give (a rule that fails is a `static_assert` naming the op and
/// both shapes); `evaluate` runs a whole expression as one loop over the result, a
/// SIMD batch at a time through the op's own functor, so each element gets the bits
/// that the eager kiln::tensor kernels give it.
///
/// Operands read their elements at (row, col) of the result: `row` counts the
/// result's rows (all dims but the last), `col` runs along its last dim. Leaves are
/// data pointers (eager), slots of a trace's frame (traced arguments and results),
/// or values (constants); `broadcast` maps the result's (row, col) to an operand of
/// other dims.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_SIMD_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_SIMD_HPP
// ----- begin kiln/core/simd.hpp -----
/// \file
/// xsimd, as every kiln header includes it. GCC 12's `<immintrin.h>` defines two
/// AVX-512BW blends as macros at `-O0`, and those macros cast their operands straight to
/// GCC's vector types: `xsimd::batch` is a class, which converts to `__m512i` but not to
/// `__v64qi`, so xsimd 8.1's integer `select` (reached by its own `exp` and `log`, and
/// by kiln's `where`) did not compile in a debug build with `-march=native`. The two
/// macros are defined again here, with the conversion to `__m512i` that GCC's other
/// macros of that header have, before xsimd's headers expand them. A file that includes
/// xsimd before kiln gets GCC's macros, and the error, back.

#if defined(__AVX512BW__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#if defined(_mm512_mask_blend_epi8)
#undef _mm512_mask_blend_epi8
#define _mm512_mask_blend_epi8(U, A, W) \
  ((__m512i)__builtin_ia32_blendmb_512_mask((__v64qi)(__m512i)(A), (__v64qi)(__m512i)(W), (__mmask64)(U)))
#endif
#if defined(_mm512_mask_blend_epi16)
#undef _mm512_mask_blend_epi16
#define _mm512_mask_blend_epi16(U, A, W) \
  ((__m512i)__builtin_ia32_blendmw_512_mask((__v32hi)(__m512i)(A), (__v32hi)(__m512i)(W), (__mmask32)(U)))
#endif
#endif

#include <xsimd/xsimd.hpp>
// ----- end kiln/core/simd.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_SIMD_HPP

#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_ELEMENTWISE_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_ELEMENTWISE_HPP
// ----- begin kiln/backend/cpu/elementwise.hpp -----
/// \file
/// CPU elementwise kernel. Broadcast dims are collapsed so the loop nest is as
/// short as possible; the innermost run is an xsimd loop specialised on which
/// operands are contiguous and which are broadcast; large outputs are split over
/// the thread pool.

#include <span>
#include <string>
#include <type_traits>


#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_BACKEND_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_BACKEND_HPP
// ----- begin kiln/backend/backend.hpp -----
/// \file
/// Backends are tag types. A backend implements op `Op` by providing an overload
///   void compute(Tag, const Op&, std::span<const buffer_view> inputs, const buffer_view& output);
/// found by argument-dependent lookup; `supports<Tag, Op>` asks whether one exists.
/// The output is preallocated with the dtype and shape the op's rules gave.
/// An overload for one op is a template all the same (`template <class = void>`): a
/// plain inline function would compile its kernels, for every dtype, in every source
/// file that includes kiln, whether or not it calls the op.

#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_ELEMENTWISE_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_ELEMENTWISE_HPP
// ----- begin kiln/ops/elementwise.hpp -----
/// \file
/// Elementwise ops: one functor each, written once in kiln::math so that it runs
/// on scalars, xsimd batches and in Thrust device code; NumPy broadcasting; C++
/// scalars promoted to the tensor operand's dtype.

#include <span>
#include <string>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_DISPATCH_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_DISPATCH_HPP
// ----- begin kiln/ops/dispatch.hpp -----
/// \file
/// The single entry point through which every op function of the library runs:
/// `detail::apply(op, inputs...)`. It is declared here, below the op families, and
/// defined in kiln/eager/apply.hpp, which runs the op now on eager tensors or hands
/// it to the tracer (kiln/trace/) when an input is symbolic.

#include <array>
#include <concepts>
#include <span>
#include <string>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_MATH_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_MATH_HPP
// ----- begin kiln/ops/math.hpp -----
/// \file
/// The scalar arithmetic that elementwise functors are written in. Each function
/// works on a C++ scalar (host or CUDA device) and on an `xsimd::batch`, so one
/// functor serves the reference, CPU-SIMD and Thrust backends. Integer arithmetic
/// wraps (two's complement) instead of overflowing into undefined behaviour.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>


namespace kiln::math {

template <class T>
inline constexpr bool is_signed_integer = std::is_integral_v<T> && std::is_signed_v<T> && !std::is_same_v<T, bool>;

// ---- scalars -------------------------------------------------------------------

template <class T>
KILN_HOST_DEVICE constexpr T add(T a, T b) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(a) + std::make_unsigned_t<T>(b));
  else
    return a + b;
}
template <class T>
KILN_HOST_DEVICE constexpr T sub(T a, T b) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(a) - std::make_unsigned_t<T>(b));
  else
    return a - b;
}
template <class T>
KILN_HOST_DEVICE constexpr T mul(T a, T b) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(a) * std::make_unsigned_t<T>(b));
  else
    return a * b;
}
template <class T>
KILN_HOST_DEVICE constexpr T neg(T a) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(a));
  else
    return -a;
}
template <class T>
KILN_HOST_DEVICE constexpr T abs(T a) {
  if constexpr (std::is_floating_point_v<T>)
    return std::fabs(a);
  else
    return a < T(0) ? neg(a) : a;
}
template <class T>
KILN_HOST_DEVICE constexpr T max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    return (b > a || b != b) ? b : a;  // ties give a, as std::max and TensorFlow; NaN propagates
  else
    return b > a ? b : a;
}
template <class T>
KILN_HOST_DEVICE constexpr T min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    return (b < a || b != b) ? b : a;
  else
    return b < a ? b : a;
}
template <class T>
KILN_HOST_DEVICE constexpr T select(bool c, T a, T b) {
  return c ? a : b;
}

/// Floor division: rounds toward negative infinity. An integer division by zero
/// gives 0 (callers reject it before running), INT_MIN / -1 wraps.
template <class T>
KILN_HOST_DEVICE constexpr T floordiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::floor(a / b);
  } else {
    if (b == T(0)) return T(0);
    if (b == T(-1)) return neg(a);
    T q = a / b;
    return (a % b != T(0) && ((a < T(0)) != (b < T(0)))) ? T(q - 1) : q;
  }
}
/// Floor modulo: the result has the sign of the divisor, as Python's `%`.
template <class T>
KILN_HOST_DEVICE constexpr T floormod(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    T r = std::fmod(a, b);
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r;
  } else {
    if (b == T(0) || b == T(-1)) return T(0);
    T r = a % b;
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? T(r + b) : r;
  }
}
/// Power; integer exponents use exact square-and-multiply (negative ones give 0,
/// and callers reject them before running).
template <class T>
KILN_HOST_DEVICE constexpr T pow(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::pow(a, b);
  } else {
    if (b < T(0)) return T(0);
    T result = T(1);
    while (b != T(0)) {
      if (b & T(1)) result = mul(result, a);
      a = mul(a, a);
      b = T(b >> 1);
    }
    return result;
  }
}
template <class T>
KILN_HOST_DEVICE T exp(T a) {
  return std::exp(a);
}
template <class T>
KILN_HOST_DEVICE T log(T a) {
  return std::log(a);
}
template <class T>
KILN_HOST_DEVICE T sqrt(T a) {
  return std::sqrt(a);
}
template <class T>
KILN_HOST_DEVICE T tanh(T a) {
  return std::tanh(a);
}
template <class T>
KILN_HOST_DEVICE T erf(T a) {
  return std::erf(a);
}
/// log(epsilon) + 2 of float or double: where softplus's sum would lose the digits of
/// exp(x) (below) or of x (above its negative), as TensorFlow's Softplus kernel cuts.
template <class T>
inline constexpr T softplus_threshold = sizeof(T) == 4 ? T(-13.942385152878742) : T(-34.04365338911715);
/// log(exp(x) + 1); x itself or exp(x) beyond the thresholds.
template <class T>
KILN_HOST_DEVICE T softplus(T a) {
  if (a > -softplus_threshold<T>) return a;
  if (a < softplus_threshold<T>) return std::exp(a);
  return std::log(std::exp(a) + T(1));
}

/// Converts between element types without undefined behaviour: floats to integers
/// saturate (NaN gives 0), anything to bool tests for non-zero.
template <class To, class From>
KILN_HOST_DEVICE constexpr To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    if (v != v) return To(0);
    if (v <= From(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (v >= From(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return To(v);
  } else {
    return To(v);
  }
}

// ---- SIMD batches (host only) ---------------------------------------------------

#if !defined(__CUDA_ARCH__)
/// x * y + z in one rounding where the hardware has it. xsimd 8.1 spells fma on
/// 512-bit registers as a multiply and an add, which fuse only where the compiler
/// contracts them (GCC: at -O2 and above, unless -ffp-contract=off), so the intrinsic is
/// called directly: a kernel gives the same bits whatever the optimization level of
/// the source file that compiles it.
template <class V, class A>
KILN_ALWAYS_INLINE xsimd::batch<V, A> multiply_add(const xsimd::batch<V, A>& x, const xsimd::batch<V, A>& y,
                                                   const xsimd::batch<V, A>& z) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<V, float> && sizeof(x) == 64) {
    return _mm512_fmadd_ps(x, y, z);
  } else if constexpr (std::is_same_v<V, double> && sizeof(x) == 64) {
    return _mm512_fmadd_pd(x, y, z);
  } else {
    return xsimd::fma(x, y, z);
  }
#else
  return xsimd::fma(x, y, z);
#endif
}

template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> add(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return a + b; }
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> sub(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return a - b; }
/// Signed integers multiply as their unsigned bits, which wrap: where the instruction
/// set has no multiply for the lane width (64-bit lanes before AVX-512), xsimd
/// multiplies lane by lane in `T`, and a signed overflow there is undefined behaviour
/// (the fuzzer found it on AVX2).
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> mul(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  if constexpr (is_signed_integer<T>) {
    using U = xsimd::batch<std::make_unsigned_t<T>, A>;
    return xsimd::bitwise_cast<xsimd::batch<T, A>>(xsimd::bitwise_cast<U>(a) * xsimd::bitwise_cast<U>(b));
  } else {
    return a * b;
  }
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> neg(const xsimd::batch<T, A>& a) {
  // xsimd negates AVX-512 batches as 0 - a, which makes -(+0) +0: flip the sign bit.
  if constexpr (std::is_floating_point_v<T>)
    return a ^ xsimd::batch<T, A>(T(-0.0));
  else
    return -a;
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> abs(const xsimd::batch<T, A>& a) { return xsimd::abs(a); }
// x86's max and min instructions give (b > a ? b : a) and (b < a ? b : a) for
// max(b, a) and min(b, a), and a when either is NaN: with a NaN `b` put back, the scalar
// functors' values. The NaN test reads `b` only, so a chain of ops through `a` (the
// `x` of relu's `maximum(x, 0)`) waits for one instruction and a blend, and a constant
// `b` needs no test at all.
#if defined(__x86_64__) || defined(__i386__)
inline constexpr bool x86_max_min = true;
#else
inline constexpr bool x86_max_min = false;
#endif
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> max(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  if constexpr (!std::is_floating_point_v<T>)
    return xsimd::max(a, b);
  else if constexpr (x86_max_min)
    return xsimd::select(xsimd::isnan(b), b, xsimd::max(b, a));
  else
    return xsimd::select((b > a) | xsimd::isnan(b), b, a);  // `b != b` is an ordered compare on AVX-512
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> min(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  if constexpr (!std::is_floating_point_v<T>)
    return xsimd::min(a, b);
  else if constexpr (x86_max_min)
    return xsimd::select(xsimd::isnan(b), b, xsimd::min(b, a));
  else
    return xsimd::select((b < a) | xsimd::isnan(b), b, a);
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> select(const xsimd::batch_bool<T, A>& c, const xsimd::batch<T, A>& a,
                                          const xsimd::batch<T, A>& b) {
  return xsimd::select(c, a, b);
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> floordiv(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  return xsimd::floor(a / b);
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> floormod(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  auto r = xsimd::fmod(a, b);
  auto zero = xsimd::batch<T, A>(T(0));
  // The signs differ, spelled with & | ~: xsimd 8.1's batch_bool `!=` is wrong on SSE
  // (it compares the all-ones masks as floats: NaNs) and its `^` on AVX-512.
  const auto r_negative = r < zero, b_negative = b < zero;
  return xsimd::select((r != zero) & ((r_negative & ~b_negative) | (~r_negative & b_negative)), r + b, r);
}
/// Lane by lane through the scalar `pow`: xsimd's is several ulp off (10 ** 2 is not
/// 100), and a result must not depend on whether an element ran in a batch.
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> pow(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  alignas(A::alignment()) T x[xsimd::batch<T, A>::size], y[xsimd::batch<T, A>::size];
  a.store_aligned(x);
  b.store_aligned(y);
  for (std::size_t i = 0; i < xsimd::batch<T, A>::size; ++i) x[i] = pow(x[i], y[i]);
  return xsimd::batch<T, A>::load_aligned(x);
}
/// xsimd's double exp converts its scaled argument to int64 through a scalar cast,
/// which is undefined behaviour for NaN, the infinities and huge values (the
/// differential fuzzer found it under clang's UBSan). Such lanes go in as 0 and come
/// out as IEEE's exp gives them; the others are xsimd's, unchanged. float converts by
/// instruction (cvttps2dq), which is defined for every input.
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> exp(const xsimd::batch<T, A>& a) {
  if constexpr (std::is_same_v<T, double>) {
    using B = xsimd::batch<double, A>;
    const auto in_range = xsimd::abs(a) <= B(750.0);  // exp overflows past 709.8, underflows below -745.2
    const B r = xsimd::exp(xsimd::select(in_range, a, B(0.0)));
    const B beyond = xsimd::select(a > B(0.0), B(std::numeric_limits<double>::infinity()), B(0.0));
    return xsimd::select(in_range, r, xsimd::select(xsimd::isnan(a), a, beyond));
  } else {
    return xsimd::exp(a);
  }
}
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> log(const xsimd::batch<T, A>& a) { return xsimd::log(a); }
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> sqrt(const xsimd::batch<T, A>& a) { return xsimd::sqrt(a); }
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> softplus(const xsimd::batch<T, A>& a) {
  using B = xsimd::batch<T, A>;
  const B threshold(softplus_threshold<T>), e = math::exp(a);
  return xsimd::select(a > -threshold, a, xsimd::select(a < threshold, e, math::log(e + B(T(1)))));
}
/// xsimd's double erf runs its exp (above) on -x * x: lanes past |x| = 6, where erf
/// rounds to +-1, go in as +-6, and NaN as 0 (and comes out as NaN).
template <class T, class A>
KILN_ALWAYS_INLINE xsimd::batch<T, A> erf(const xsimd::batch<T, A>& a) {
  if constexpr (std::is_same_v<T, double>) {
    using B = xsimd::batch<double, A>;
    const auto nan = xsimd::isnan(a);
    const B clamped = xsimd::select(xsimd::abs(a) <= B(6.0), a, xsimd::copysign(B(6.0), a));
    return xsimd::select(nan, a, xsimd::erf(xsimd::select(nan, B(0.0), clamped)));
  } else {
    return xsimd::erf(a);
  }
}
/// float32 tanh as x * P(x^2) / Q(x^2), a rational minimax fit of degrees 13/6 on
/// [-9, 9]; beyond that tanh rounds to +-1. Within 3.4e-7 relative (6 ulp) of the exact
/// value for every float, checked exhaustively, and about 3x cheaper than xsimd's
/// exp-based tanh, which leaves a fused chain of elementwise ops memory-bound. Near 0
/// the quotient tends to 1, so small x keeps full relative accuracy; NaN stays NaN.
template <class A>
KILN_ALWAYS_INLINE xsimd::batch<float, A> tanh(const xsimd::batch<float, A>& x) {
  using B = xsimd::batch<float, A>;
  const B t = x * x;
  B p = multiply_add(B(-8.4963495400e-14f), t, B(5.2809273136e-11f));
  p = multiply_add(p, t, B(-2.0231422830e-8f));
  p = multiply_add(p, t, B(1.1155838896e-5f));
  p = multiply_add(p, t, B(3.1041028304e-3f));
  p = multiply_add(p, t, B(1.3084141490e-1f));
  p = multiply_add(p, t, B(1.f));
  B q = multiply_add(B(2.5463585354e-4f), t, B(2.4495762646e-2f));
  q = multiply_add(q, t, B(4.6417468630e-1f));
  q = multiply_add(q, t, B(1.f));
  return xsimd::select(xsimd::abs(x) >= B(9.f), xsimd::copysign(B(1.f), x), x * p / q);
}
/// xsimd's double tanh goes through its exp (above): lanes past |x| = 20, where tanh
/// rounds to +-1, and NaN go in as 0 and come out as +-1 and NaN.
template <class A>
KILN_ALWAYS_INLINE xsimd::batch<double, A> tanh(const xsimd::batch<double, A>& a) {
  using B = xsimd::batch<double, A>;
  const auto in_range = xsimd::abs(a) <= B(20.0);
  const B r = xsimd::tanh(xsimd::select(in_range, a, B(0.0)));
  return xsimd::select(in_range, r, xsimd::select(xsimd::isnan(a), a, xsimd::copysign(B(1.0), a)));
}
#endif

}  // namespace kiln::math
// ----- end kiln/ops/math.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_MATH_HPP

namespace kiln {
namespace detail {

/// The dtypes of kiln's own bookkeeping: loop counters and trip counts, bool
/// conditions, tensor_array sizes. An elementwise op that only this bookkeeping runs
/// compiles its kernels for these dtypes alone (apply_bookkeeping); under separate
/// compilation the library has every kernel already.
#if defined(KILN_SEPARATE_COMPILATION)
inline constexpr dtype_set bookkeeping_dtypes = dtypes::all;
#else
inline constexpr dtype_set bookkeeping_dtypes{bool_, int32, int64};
#endif

/// Runs (or records) `op` on `inputs` and returns its result. `Only` limits the
/// dtypes whose kernels an elementwise op compiles here (kiln/ops/op_table.hpp).
template <class Op, dtype_set Only = dtypes::all>
tensor apply_span(const Op& op, std::span<const tensor* const> inputs);

/// Records `op` on `inputs` into the trace in progress (defined by the tracer,
/// kiln/trace/trace_context.hpp).
template <class Op>
tensor record_symbolic(const Op& op, std::span<const tensor* const> inputs);

/// Whether a trace is in progress on this thread (defined by the tracer).
inline bool tracing();

/// Which errors an op whose operands do not fit raises, as TensorFlow 2.12 does in
/// each mode: when it runs (eagerly, or in a graph whose dims are known only then)
/// `invalid_argument_error`; while a function is traced `type_error` for dtypes and
/// `value_error` for shapes.
enum class rule_errors : bool { run, trace };

/// The mode of an op on `inputs`: recorded into a trace (one is in progress, or an
/// input is symbolic), or run. (A template on nothing: kiln/fixed.hpp alone has no
/// tracer to define tracing().)
template <class = void>
rule_errors rule_errors_for(std::span<const tensor* const> in) {
  bool symbolic = tracing();
  for (const tensor* t : in) symbolic = symbolic || t->is_symbolic();
  return symbolic ? rule_errors::trace : rule_errors::run;
}

/// Raises `E` with `text` while tracing, else invalid_argument_error.
template <class E>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_operand_error(rule_errors mode, const std::string& text) {
  if (mode == rule_errors::trace) throw E(text);
  throw invalid_argument_error(text);
}

/// Makes `Op`'s kernels reachable from graphs: instantiated by every call of the op,
/// so that a program compiles the kernels of the ops it calls (kiln/ops/op_table.hpp).
template <class Op, dtype_set Only = dtypes::all>
void register_kernels_on_use();

template <class Op, std::same_as<tensor>... Ts>
tensor apply(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return apply_span(op, std::span<const tensor* const>(ptrs));
}

/// `op` on `inputs` as kiln's own bookkeeping runs it (elementwise ops on
/// bookkeeping_dtypes): where the program does not call the op itself, it compiles
/// the op's kernels for those dtypes only.
/// \code kiln::detail::apply_bookkeeping(kiln::ops::less{}, kiln::constant(0), kiln::constant(3));  // true \endcode
template <class Op, std::same_as<tensor>... Ts>
tensor apply_bookkeeping(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return apply_span<Op, bookkeeping_dtypes>(op, std::span<const tensor* const>(ptrs));
}

/// Runs `op` now on eager `inputs` with the kernels of their device (defined in
/// kiln/eager/apply.hpp).
template <class Op, dtype_set Only = dtypes::all>
tensor execute(const Op& op, std::span<const tensor* const> inputs);

/// Runs `op` now on eager `inputs`, recording nothing even while a trace is in
/// progress: how an op's `evaluate` uses other ops, since it computes a value, also
/// when constant folding evaluates it during a trace.
template <class Op, std::same_as<tensor>... Ts>
tensor execute_now(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return execute(op, std::span<const tensor* const>(ptrs));
}

/// A scalar tensor holding `value` converted to dtype `t` on device `d`.
template <class S>
tensor make_scalar(kiln::dtype t, S value, kiln::device d) {
  tensor out(t, shape{}, kiln::device::cpu);
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string> || std::is_convertible_v<S, std::string>) {
      if constexpr (std::is_same_v<T, std::string> && std::is_convertible_v<S, std::string>)
        *out.view().template as<T>() = T(value);  // T, not std::string: dependent, so only checked where S converts
      else
        throw type_error("cannot combine a " + std::string(name(t)) + " tensor with a " +
                         (std::is_convertible_v<S, std::string> ? std::string("string") : std::string("numeric")) +
                         " C++ value");
    } else {
      *out.view().template as<T>() = math::convert<T>(value);
    }
  });
  return d == kiln::device::cpu ? out : out.to(d);
}

}  // namespace detail

/// A C++ value that kiln promotes to a tensor when it meets one in an op: numbers
/// take the other operand's dtype (`x + 1`), strings join string tensors (`s + "!"`).
template <class S>
concept promotable_scalar = std::is_arithmetic_v<S> || std::is_convertible_v<S, std::string>;

}  // namespace kiln
// ----- end kiln/ops/dispatch.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_DISPATCH_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
// ----- begin kiln/ops/op.hpp -----
/// \file
/// What every op definition provides, and the rules shared between op families.
///
/// An op is a type in kiln::ops holding its attributes, with
/// - `static constexpr std::string_view name`: the op's name in graphs and errors;
/// - `static constexpr std::string_view onnx_name`: the ONNX operator this op lowers to,
///   when it lowers to one; its attributes are the exporter's (kiln/onnx.hpp), and so is
///   any change of layout or dtype around it (conv2d's NHWC transposed for `Conv`). An
///   op that ONNX computes as a composition of operators (silu, square, not_equal,
///   floordiv, floormod, relu_grad, stack, set_item, pad_rows, crop_or_pad,
///   unsorted_segment_sum) has none: the exporter builds it;
/// - `static constexpr int arity`: how many inputs it takes (`ops::variadic`: one or more);
/// - `constexpr dtype_result result_dtype(std::span<const dtype>) const`;
/// - `constexpr shape_result result_shape(std::span<const shape>) const`.
/// Both rules are constexpr, so the compile-time tier turns a failure into a
/// `static_assert` and the runtime tier into a kiln::type_error / kiln::value_error.
/// Elementwise ops derive from `elementwise_op` and add a functor `operator()`.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>


namespace kiln {

/// Outcome of a dtype rule: the result dtype, or the reason there is none.
struct dtype_result {
  dtype value = float32;
  std::string_view failure{};
  constexpr bool ok() const { return failure.empty(); }
};

/// Outcome of a shape rule: the result shape, or the reason there is none.
struct shape_result {
  kiln::shape value{};
  std::string_view failure{};
  constexpr bool ok() const { return failure.empty(); }
};

/// A short constexpr list of integers (axes, permutations, strides), allowing negatives.
/// \code kiln::int_list perm{1, 0}; perm.size() == 2; \endcode
class int_list {
 public:
  constexpr int_list() = default;
  constexpr int_list(std::initializer_list<std::int64_t> v) {
    for (auto x : v) push_back(x);
  }
  constexpr explicit int_list(std::span<const std::int64_t> v) {
    for (auto x : v) push_back(x);
  }
  constexpr void push_back(std::int64_t x) {
    if (size_ >= max_rank) detail::throw_too_many_dims();
    items_[size_++] = x;
  }
  constexpr int size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr std::int64_t operator[](int i) const { return items_[i]; }
  constexpr const std::int64_t* begin() const { return items_.data(); }
  constexpr const std::int64_t* end() const { return items_.data() + size_; }
  constexpr bool operator==(const int_list& o) const {
    if (size_ != o.size_) return false;
    for (int i = 0; i < size_; ++i)
      if (items_[i] != o.items_[i]) return false;
    return true;
  }
  KILN_LIBRARY_INLINE std::string str() const;

 private:
  int size_ = 0;
  std::array<std::int64_t, max_rank> items_{};
};

namespace ops {

/// The arity of an op that takes one or more inputs (concat, stack).
inline constexpr int variadic = -1;

/// One attribute of an op, its name and its member. An op with attributes lists them
/// all in `static constexpr auto attribute_fields()`, which saved graphs write and read
/// (kiln/saved_function.hpp); an op without has none to list.
/// \code
/// struct scaled { std::int64_t axis = 0;
///   static constexpr auto attribute_fields() { return std::tuple{kiln::ops::attribute{"axis", &scaled::axis}}; } };
/// \endcode
template <class Op, class T>
struct attribute {
  std::string_view name;
  T Op::*member;
};
// Spelled out for compilers without C++20's deduction for aggregates (clang before 17).
template <class Op, class T>
attribute(std::string_view, T Op::*) -> attribute<Op, T>;

/// Normalizes a possibly negative axis against `rank`; -1 when out of range.
constexpr int normalize_axis(std::int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) return -1;
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

/// One dim of a broadcast: sizes must match or one must be 1; `none` (unknown)
/// takes the other side's size unless that is 1.
constexpr std::int64_t broadcast_dim(std::int64_t a, std::int64_t b, bool& ok) {
  if (a == b) return a;
  if (a == 1) return b;
  if (b == 1) return a;
  if (a == none) return b;
  if (b == none) return a;
  ok = false;
  return 0;
}

/// NumPy broadcasting of two shapes.
/// \code static_assert(kiln::ops::broadcast_shapes({2, 1}, {3}).value == kiln::shape{2, 3}); \endcode
constexpr shape_result broadcast_shapes(const shape& a, const shape& b) {
  if (!a.has_known_rank() || !b.has_known_rank()) return {shape(unknown_rank)};
  int rank = a.rank() > b.rank() ? a.rank() : b.rank();
  shape out;
  bool ok = true;
  for (int i = 0; i < rank; ++i) {
    int ia = i - (rank - a.rank()), ib = i - (rank - b.rank());
    std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    out.push_back(broadcast_dim(da, db, ok));
  }
  if (!ok) return {{}, "shapes are not broadcast-compatible"};
  return {out};
}

/// Broadcast of any number of shapes.
constexpr shape_result broadcast_all(std::span<const shape> in) {
  shape_result r{in.empty() ? shape{} : in[0]};
  for (std::size_t i = 1; i < in.size() && r.ok(); ++i) r = broadcast_shapes(r.value, in[i]);
  return r;
}

/// The error for a dtype without numbers reaching a kernel for numbers (visit_numeric):
/// out of line, since each visit reaches it from two dtypes.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_not_numeric(dtype t) {
  throw internal_error("a kernel for numbers reached dtype " + std::string(name(t)));
}

/// Calls `f.template operator()<T>()` with the C++ type of a numeric dtype; how the
/// kernels of ops that take numbers only (reductions, linalg) turn a runtime dtype
/// into code.
/// \code kiln::ops::visit_numeric(kiln::float32, [&]<class T>() { static_assert(sizeof(T) >= 4); }); \endcode
template <class F>
void visit_numeric(dtype t, F&& f) {
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      f.template operator()<T>();
    else
      throw_not_numeric(t);
  });
}

/// How an elementwise op's result dtype follows from its inputs'.
enum class result_rule {
  same,            ///< the input dtype
  boolean,         ///< bool (comparisons)
  true_division,   ///< the input dtype, but float64 for integers (TensorFlow's `/`)
};

/// Base of elementwise ops: `arity` inputs of one dtype from `accepts`, broadcast
/// together. `simd` lists the dtypes whose functor also runs on xsimd batches.
template <int Arity, dtype_set Accepts, result_rule Rule = result_rule::same, dtype_set Simd = dtypes::floating>
struct elementwise_op {
  static constexpr int arity = Arity;
  static constexpr dtype_set accepts = Accepts;
  static constexpr dtype_set simd = Simd;
  /// Operand roles. With a leading condition (`where`), operand 0 is a bool read as
  /// `bool` and the others are values of the kernels' element type; without, every
  /// operand is such a value.
  static constexpr bool leading_condition = false;
  /// True when the result's dtype is an attribute of the op (`cast`) rather than a
  /// function of the values' dtype: the kernels then take every output type.
  static constexpr bool converts = false;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    for (dtype t : in)
      if (t != in[0]) return {in[0], "operands must have the same dtype"};
    if (!accepts.contains(in[0])) return {in[0], "dtype not supported"};
    switch (Rule) {
      case result_rule::boolean: return {bool_};
      case result_rule::true_division: return {is_integer(in[0]) ? float64 : in[0]};
      default: return {in[0]};
    }
  }
  constexpr shape_result result_shape(std::span<const shape> in) const { return broadcast_all(in); }
  constexpr bool operator==(const elementwise_op&) const = default;
};

template <class Op>
concept elementwise = requires {
  Op::arity;
  Op::accepts;
  Op::simd;
};

/// The operand whose dtype selects an op's kernel (the element type `In` of
/// elementwise kernels): the first value operand.
template <class Op>
inline constexpr int value_operand = [] {
  if constexpr (elementwise<Op>)
    return Op::leading_condition ? 1 : 0;
  else
    return 0;
}();

/// Calls an elementwise op's functor on operands as the kernels read them:
/// `condition(0)` for a leading condition, `value(k)` for the values.
template <class Op, class Value, class Condition>
KILN_HOST_DEVICE decltype(auto) invoke_elementwise(const Op& op, const Value& value, const Condition& condition) {
  if constexpr (Op::leading_condition)
    return op(condition(0), value(1), value(2));
  else if constexpr (Op::arity == 1)
    return op(value(0));
  else
    return op(value(0), value(1));
}

}  // namespace ops
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE std::string int_list::str() const {
  std::string s = "[";
  for (int i = 0; i < size_; ++i) s += (i ? ", " : "") + std::to_string(items_[i]);
  return s + "]";
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/ops/op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_OP_LIST_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_OP_LIST_HPP
// ----- begin kiln/ops/op_list.hpp -----
/// \file
/// The one op list: every op type of kiln::ops, one entry each, as X-macros that the
/// code which must name every op expands instead of repeating the names. The
/// elementwise ops with a public function of their own are entries `F(public_name, op)`,
/// and from them come the op families `F(op)` below, the public functions of both tiers
/// (on kiln::tensor: kiln/ops/elementwise.hpp and kiln/ops/activations.hpp; on typed
/// operands: kiln/typed/ops.hpp) and their operators. The families give the registry's
/// type lists (kiln/ops/registry.hpp), the kernels a compiled library instantiates
/// (kiln/separate_compilation.hpp), and the files cmake/kiln_library.cmake compiles them in. A test
/// of the ops folder fails when the CMake file's families drift from these, and the
/// fuzzer's programs (test/fuzz/program.hpp) fail to compile when an op listed here is
/// neither one of their steps nor one they name as left out.
///
/// A new elementwise op is its struct in kiln::ops (its name, its ONNX name when it is
/// one ONNX operator, its rules, functor and gradient), one entry in one list here (and
/// in KILN_OPERATORS if it has an operator), and its line in the fuzzer's programs.
/// Ops with attributes (`cast`, `gelu`, `elu`, `leaky_relu`) and `where` have
/// hand-written functions, which take more than operands.

/// The elementwise ops of kiln/ops/elementwise.hpp whose function takes one operand:
/// `F(public_name, op)`, the function `kiln::public_name(x)` in both tiers running
/// `kiln::ops::op`.
///
/// | function | computes |
/// |---|---|
/// | `negative(x)`, also `-x` | elementwise negation |
/// | `abs(x)` | absolute value |
/// | `exp(x)` | e to the x, for floats |
/// | `log(x)` | natural logarithm, for floats |
/// | `sqrt(x)` | square root, for floats |
/// | `square(x)` | `x * x` |
/// | `tanh(x)` | hyperbolic tangent, for floats |
/// | `sigmoid(x)` | `1 / (1 + exp(-x))`, for floats |
/// | `relu(x)` | `maximum(x, 0)` |
/// | `logical_not(b)` | negation of a bool tensor |
///
/// \code
/// const kiln::tensor x = kiln::constant({-1.f, 4.f});
/// const kiln::tensor y = kiln::sqrt(kiln::abs(x));  // [1 2]
/// const auto z = kiln::relu(-kiln::fixed<float, 2>{1.f, -2.f});  // [0 2]
/// \endcode
#define KILN_MATH_UNARY_FUNCTIONS(F)                                                                             \
  F(negative, negate) F(abs, abs) F(exp, exp) F(log, log) F(sqrt, sqrt) F(square, square) F(tanh, tanh)        \
  F(sigmoid, sigmoid) F(relu, relu) F(logical_not, logical_not)

/// The activations of kiln/ops/activations.hpp whose function takes one operand, for
/// floats: `F(public_name, op)` as KILN_MATH_UNARY_FUNCTIONS.
///
/// | function | computes |
/// |---|---|
/// | `erf(x)` | the Gauss error function (`tf.math.erf`) |
/// | `softplus(x)` | `log(exp(x) + 1)`, without overflow |
/// | `silu(x)` | `x * sigmoid(x)` (swish) |
///
/// \code
/// const kiln::tensor y = kiln::softplus(kiln::constant({0.f}));  // [0.693147]
/// \endcode
#define KILN_ACTIVATION_FUNCTIONS(F) F(erf, erf) F(softplus, softplus) F(silu, silu)

/// Every elementwise op whose function takes one operand.
#define KILN_UNARY_FUNCTIONS(F) KILN_MATH_UNARY_FUNCTIONS(F) KILN_ACTIVATION_FUNCTIONS(F)

/// The elementwise ops whose function takes two operands: `F(public_name, op)`, the
/// function `kiln::public_name(x, y)` in both tiers running `kiln::ops::op`, operands
/// broadcast together; a C++ scalar on either side takes the other operand's dtype.
///
/// | function | computes |
/// |---|---|
/// | `add(x, y)`, also `x + y` | sum; concatenates string tensors |
/// | `subtract(x, y)`, also `x - y` | difference |
/// | `multiply(x, y)`, also `x * y` | product |
/// | `divide(x, y)`, also `x / y` | true division (integers give float64) |
/// | `floordiv(x, y)` | division rounding down: `floordiv(7, -2)` is -4 |
/// | `floormod(x, y)`, also `x % y` | the remainder, with the divisor's sign |
/// | `pow(x, y)` | x to the power y |
/// | `maximum(x, y)`, `minimum(x, y)` | the larger, the smaller value |
/// | `equal(x, y)`, also `x == y`; `not_equal`, `!=` | comparison, giving bools |
/// | `less`, `<`; `less_equal`, `<=`; `greater`, `>`; `greater_equal`, `>=` | comparison, giving bools |
/// | `logical_and(a, b)`, `logical_or(a, b)` | on bool tensors |
///
/// \code
/// const kiln::tensor x = kiln::constant({7, -7});
/// const kiln::tensor q = kiln::floordiv(x, 2), r = x % 2;  // [3 -4], [1 1]
/// const kiln::tensor m = kiln::maximum(x, 0);               // [7 0]
/// const auto s = kiln::pow(kiln::fixed<double, 2>{2.0, 3.0}, 2.0);  // [4 9]
/// \endcode
#define KILN_BINARY_FUNCTIONS(F)                                                                                 \
  F(add, add) F(subtract, subtract) F(multiply, multiply) F(divide, divide) F(floordiv, floordiv)              \
  F(floormod, floormod) F(pow, pow) F(maximum, maximum) F(minimum, minimum) F(equal, equal)                    \
  F(not_equal, not_equal) F(less, less) F(less_equal, less_equal) F(greater, greater)                          \
  F(greater_equal, greater_equal) F(logical_and, logical_and) F(logical_or, logical_or)

/// The binary operators of both tiers, `F(symbol, public_name)`: `x symbol y` is
/// `kiln::public_name(x, y)`, with a C++ scalar on either side (unary `-x` is
/// `kiln::negative(x)`).
/// \code
/// const kiln::tensor x = kiln::constant({1.f, 2.f});
/// const kiln::tensor y = (x * 2.f + 1.f) / x;                     // [3 2.5]
/// const auto b = kiln::fixed<int, 2>{1, 2} >= kiln::fixed<int, 2>{2, 2};  // [false true]
/// \endcode
#define KILN_OPERATORS(F)                                                                                        \
  F(+, add) F(-, subtract) F(*, multiply) F(/, divide) F(%, floormod) F(==, equal) F(!=, not_equal) F(<, less)  \
  F(<=, less_equal) F(>, greater) F(>=, greater_equal)

// `F(op)` for each entry `F(public_name, op)` of a function list: the list is expanded
// with `F KILN_DETAIL_OP_OF` for its `F`, which leaves `F (op)`, called once the
// expansion is rescanned.
#define KILN_DETAIL_OP_OF(public_name, op) (op)
#define KILN_DETAIL_RESCAN(...) __VA_ARGS__
#define KILN_DETAIL_OPS_OF(FUNCTIONS, F) KILN_DETAIL_RESCAN(FUNCTIONS(F KILN_DETAIL_OP_OF))

// The op families: `F(op)` once per op type of kiln::ops, for code that must name every
// op (kiln/separate_compilation.hpp declares and instantiates each op's kernels family by family).

/// The elementwise ops with one input (`cast` included).
#define KILN_UNARY_OPS(F) \
  KILN_DETAIL_OPS_OF(KILN_UNARY_FUNCTIONS, F) F(cast) F(gelu) F(elu) F(leaky_relu)
/// The elementwise ops with two or three inputs.
#define KILN_BINARY_OPS(F) KILN_DETAIL_OPS_OF(KILN_BINARY_FUNCTIONS, F) F(where) F(relu_grad)
/// The shape ops.
#define KILN_SHAPE_OPS(F)                                                                                        \
  F(reshape) F(transpose) F(concat) F(stack) F(gather) F(unsorted_segment_sum) F(index) F(slice) F(shape_of)     \
  F(set_item) F(pad_rows) F(crop_or_pad)
/// The reductions.
#define KILN_REDUCTION_OPS(F) F(reduce_sum) F(reduce_mean) F(reduce_max) F(reduce_min) F(argmax)
/// Linear algebra and NN ops: products, convolution, pooling and the ops pooling's
/// gradients run.
#define KILN_LINALG_OPS(F) \
  F(matmul) F(conv2d) F(max_pool) F(avg_pool) F(max_pool_grad) F(max_pool_grad_grad) F(avg_pool_grad)
/// Every op kiln defines.
#define KILN_ALL_OPS(F) KILN_UNARY_OPS(F) KILN_BINARY_OPS(F) KILN_SHAPE_OPS(F) KILN_REDUCTION_OPS(F) KILN_LINALG_OPS(F)
// ----- end kiln/ops/op_list.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_OP_LIST_HPP

namespace kiln::ops {

using dtypes::all;
using dtypes::floating;
using dtypes::numeric;
inline constexpr dtype_set numeric_and_string = numeric | dtype_set{string};
inline constexpr dtype_set logical{bool_};

// ---- unary ------------------------------------------------------------------
struct negate : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "neg";
  static constexpr std::string_view onnx_name = "Neg";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::neg(a); }
  template <class G> void gradient(G& g) const { g.give(0, -g.dy()); }
};
struct abs : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "abs";
  static constexpr std::string_view onnx_name = "Abs";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::abs(a); }
  /// dy * sign(x), 0 at 0 as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct exp : elementwise_op<1, floating> {
  static constexpr std::string_view name = "exp";
  static constexpr std::string_view onnx_name = "Exp";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::exp(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * g.y()); }
};
struct log : elementwise_op<1, floating> {
  static constexpr std::string_view name = "log";
  static constexpr std::string_view onnx_name = "Log";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::log(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() / g.x(0)); }
};
struct sqrt : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sqrt";
  static constexpr std::string_view onnx_name = "Sqrt";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::sqrt(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * 0.5 / g.y()); }
};
struct square : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "square";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::mul(a, a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (2.0 * g.x(0))); }
};
struct tanh : elementwise_op<1, floating> {
  static constexpr std::string_view name = "tanh";
  static constexpr std::string_view onnx_name = "Tanh";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::tanh(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (1.0 - g.y() * g.y())); }
};
struct sigmoid : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sigmoid";
  static constexpr std::string_view onnx_name = "Sigmoid";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return T(1) / (T(1) + math::exp(math::neg(a))); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (g.y() * (1.0 - g.y()))); }
};
struct relu : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu";
  static constexpr std::string_view onnx_name = "Relu";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::max(a, T(0)); }
  /// dy where the result is positive, as TensorFlow's ReluGrad.
  template <class G> void gradient(G& g) const;
};
struct logical_not : elementwise_op<1, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_not";
  static constexpr std::string_view onnx_name = "Not";
  KILN_HOST_DEVICE bool operator()(bool a) const { return !a; }
};
/// Converts to `to`; the kernels' element conversion (math::convert) does the work.
struct cast : elementwise_op<1, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "cast";
  static constexpr std::string_view onnx_name = "Cast";
  static constexpr bool converts = true;
  dtype to = float32;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"to", &cast::to}}; }
  constexpr cast() = default;
  constexpr explicit cast(dtype target) : to(target) {}
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if ((in[0] == string) != (to == string)) return {to, "cannot cast between string and other dtypes"};
    return {to};
  }
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return a; }
  constexpr bool operator==(const cast&) const = default;
  /// Between floating-point dtypes only: an integer path has no gradient.
  template <class G> void gradient(G& g) const {
    if (is_floating(g.x(0).t.dtype()) && is_floating(to)) g.give(0, G::run(cast(g.x(0).t.dtype()), g.dy()));
  }
};

// ---- binary -----------------------------------------------------------------
struct add : elementwise_op<2, numeric_and_string, result_rule::same, numeric> {
  static constexpr std::string_view name = "add";
  static constexpr std::string_view onnx_name = "Add";
  template <class T> KILN_HOST_DEVICE T operator()(const T& a, const T& b) const {
    if constexpr (std::is_same_v<T, std::string>)
      return a + b;
    else
      return math::add(a, b);
  }
  template <class G> void gradient(G& g) const { g.give(0, g.dy()), g.give(1, g.dy()); }
};
struct subtract : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "sub";
  static constexpr std::string_view onnx_name = "Sub";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::sub(a, b); }
  template <class G> void gradient(G& g) const {
    g.give(0, g.dy());
    if (g.needs(1)) g.give(1, -g.dy());
  }
};
struct multiply : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "mul";
  static constexpr std::string_view onnx_name = "Mul";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::mul(a, b); }
  template <class G> void gradient(G& g) const {
    if (g.needs(0)) g.give(0, g.dy() * g.x(1));
    if (g.needs(1)) g.give(1, g.x(0) * g.dy());
  }
};
/// True division: integers divide as float64, as TensorFlow's `/`.
struct divide : elementwise_op<2, numeric, result_rule::true_division> {
  static constexpr std::string_view name = "truediv";
  static constexpr std::string_view onnx_name = "Div";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return double(a) / double(b);
    else
      return a / b;
  }
  template <class G> void gradient(G& g) const {
    if (g.needs(0)) g.give(0, g.dy() / g.x(1));
    if (g.needs(1)) g.give(1, g.dy() * (-g.x(0) / g.x(1) / g.x(1)));
  }
};
struct floordiv : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "floordiv";
  static constexpr bool integer_divisor = true;  // an integer divisor of 0 is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::floordiv(a, b); }
};
struct floormod : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "floormod";
  static constexpr bool integer_divisor = true;
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::floormod(a, b); }
  /// As TensorFlow: dy for the dividend, -dy * floor(x / y) for the divisor.
  template <class G> void gradient(G& g) const;
};
struct pow : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "pow";
  static constexpr std::string_view onnx_name = "Pow";
  static constexpr bool integer_exponent = true;  // a negative integer exponent is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::pow(a, b); }
  /// As TensorFlow: the exponent's gradient is 0 where the base is not positive.
  template <class G> void gradient(G& g) const;
};
struct maximum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "maximum";
  static constexpr std::string_view onnx_name = "Max";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::max(a, b); }
  /// dy goes to the first operand where it is the larger or they tie (the one the
  /// result is), as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct minimum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "minimum";
  static constexpr std::string_view onnx_name = "Min";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::min(a, b); }
  template <class G> void gradient(G& g) const;
};
struct less : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less";
  static constexpr std::string_view onnx_name = "Less";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a < b; }
};
struct less_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less_equal";
  static constexpr std::string_view onnx_name = "LessOrEqual";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a <= b; }
};
struct greater : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater";
  static constexpr std::string_view onnx_name = "Greater";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a > b; }
};
struct greater_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater_equal";
  static constexpr std::string_view onnx_name = "GreaterOrEqual";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a >= b; }
};
struct equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "equal";
  static constexpr std::string_view onnx_name = "Equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a == b; }
};
struct not_equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "not_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a != b; }
};
/// relu's gradient (TensorFlow's ReluGrad): `dy` (operand 1) where relu's result `y`
/// (operand 0) is positive, else 0. One op, so that it runs SIMD where `where` on the
/// bool of `greater` would run element by element.
struct relu_grad : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu_grad";
  template <class T> KILN_HOST_DEVICE T operator()(T y, T dy) const { return math::select(y > T(0), dy, T(0)); }
  /// Linear in dy, with the same selection; y only selects.
  template <class G> void gradient(G& g) const { g.give(1, G::run(relu_grad{}, g.x(0), g.dy())); }
};
struct logical_and : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_and";
  static constexpr std::string_view onnx_name = "And";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
struct logical_or : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_or";
  static constexpr std::string_view onnx_name = "Or";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};

// ---- ternary ----------------------------------------------------------------
/// `where(cond, a, b)`: a bool condition choosing between two values of one dtype.
struct where : elementwise_op<3, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "select";
  static constexpr std::string_view onnx_name = "Where";
  static constexpr bool leading_condition = true;
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (in[0] != bool_) return {in[1], "the condition must be a bool tensor"};
    if (in[1] != in[2]) return {in[1], "both branches must have the same dtype"};
    return {in[1]};
  }
  template <class T> KILN_HOST_DEVICE T operator()(bool c, const T& a, const T& b) const { return c ? a : b; }
  template <class G> void gradient(G& g) const {
    const auto zero = g.dy().scalar(0);
    if (g.needs(1)) g.give(1, G::run(where{}, g.x(0), g.dy(), zero));
    if (g.needs(2)) g.give(2, G::run(where{}, g.x(0), zero, g.dy()));
  }
};

// ---- gradients of the ops above that use ops defined after them -------------

template <class G>
void abs::gradient(G& g) const {
  // `0 > x` rather than `x < 0` (and minimum's `y >= x`): formulas compare with the
  // two comparisons a tape registers (detail::tape_ops), not four.
  const auto zero = g.x(0).scalar(0), dy = g.dy();
  const auto negative = G::run(greater{}, zero, g.x(0));
  g.give(0, G::run(where{}, G::run(greater{}, g.x(0), zero), dy, G::run(where{}, negative, -dy, zero)));
}

template <class G>
void relu::gradient(G& g) const {
  g.give(0, G::run(relu_grad{}, g.y(), g.dy()));
}

template <class G>
void floormod::gradient(G& g) const {
  g.give(0, g.dy());
  if (g.needs(1)) g.give(1, -g.dy() * G::run(floordiv{}, g.x(0), g.x(1)));
}

template <class G>
void pow::gradient(G& g) const {
  const auto x = g.x(0), y = g.x(1), zero = x.scalar(0);
  if (g.needs(0)) g.give(0, g.dy() * y * G::run(pow{}, x, y - 1.0));
  if (!g.needs(1)) return;
  const auto positive = G::run(greater{}, x, zero);
  g.give(1, G::run(where{}, positive, g.dy() * g.y() * G::run(log{}, G::run(where{}, positive, x, x.scalar(1))), zero));
}

template <class G>
void maximum::gradient(G& g) const {
  const auto first = G::run(greater_equal{}, g.x(0), g.x(1)), zero = g.dy().scalar(0);
  if (g.needs(0)) g.give(0, G::run(where{}, first, g.dy(), zero));
  if (g.needs(1)) g.give(1, G::run(where{}, first, zero, g.dy()));
}

template <class G>
void minimum::gradient(G& g) const {
  const auto first = G::run(greater_equal{}, g.x(1), g.x(0)), zero = g.dy().scalar(0);
  if (g.needs(0)) g.give(0, G::run(where{}, first, g.dy(), zero));
  if (g.needs(1)) g.give(1, G::run(where{}, first, zero, g.dy()));
}

/// Whether an op's second integer operand may make it undefined: a divisor (zero is
/// refused) or an exponent (a negative one is).
template <class Op>
concept checks_integer_operand = requires { Op::integer_divisor; } || requires { Op::integer_exponent; };

/// Whether `y`, the second operand of `Op`, is an integer it refuses.
template <checks_integer_operand Op, class T>
constexpr bool refused_integer_operand(T y) {
  if constexpr (requires { Op::integer_divisor; }) return y == T(0);
  else return y < T(0);
}

/// The error of `Op` for a second integer operand it refuses.
template <checks_integer_operand Op>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_refused_integer_operand() {
  throw invalid_argument_error(std::string(Op::name) + (requires { Op::integer_divisor; }
                                                            ? ": integer division by zero"
                                                            : ": integers to negative integer powers are not allowed"));
}

/// Rejects integer division by zero and integers to negative powers before a kernel
/// runs, as TensorFlow does (and as C++ must: both are undefined behaviour).
template <elementwise Op>
  requires checks_integer_operand<Op>
void check_values(const Op&, std::span<const tensor* const> in) {
  const tensor& y = *in[1];
  if (!is_integer(y.dtype()) || y.size() == 0) return;
  bool bad = visit_dtype(y.dtype(), [&]<class T>() {
    if constexpr (math::is_signed_integer<T>) {
      std::vector<T> copied;
      const T* p = y.device() == device::cpu ? y.data<T>() : (copied = y.to_vector<T>()).data();
      for (std::int64_t i = 0, n = y.size(); i < n; ++i)
        if (refused_integer_operand<Op>(p[i])) return true;
    }
    return false;
  });
  if (bad) throw_refused_integer_operand<Op>();
}

}  // namespace kiln::ops

namespace kiln {

// The functions of the one op list (kiln/ops/op_list.hpp, where they are documented):
// each builds its op and hands it to detail::apply, and takes a C++ scalar on either
// side of a binary op, converted to the tensor operand's dtype. Every op function is a
// template, even where nothing is deduced, so that its body, and with it the op's
// kernels, is compiled only in programs that call it. (kiln/ops/activations.hpp
// expands the unary one for its ops.)
#define KILN_DETAIL_TENSOR_UNARY_FUNCTION(fn, op)                                    \
  template <class = void>                                                            \
  tensor fn(const tensor& x) { return detail::apply(ops::op{}, x); }
#define KILN_DETAIL_TENSOR_BINARY_FUNCTION(fn, op)                                   \
  template <class = void>                                                            \
  tensor fn(const tensor& x, const tensor& y) { return detail::apply(ops::op{}, x, y); } \
  template <promotable_scalar S>                                                     \
  tensor fn(const tensor& x, const S& y) {                                           \
    return detail::apply(ops::op{}, x, detail::make_scalar(x.dtype(), y, x.device())); \
  }                                                                                  \
  template <promotable_scalar S>                                                     \
  tensor fn(const S& x, const tensor& y) {                                           \
    return detail::apply(ops::op{}, detail::make_scalar(y.dtype(), x, y.device()), y); \
  }
KILN_MATH_UNARY_FUNCTIONS(KILN_DETAIL_TENSOR_UNARY_FUNCTION)
KILN_BINARY_FUNCTIONS(KILN_DETAIL_TENSOR_BINARY_FUNCTION)
#undef KILN_DETAIL_TENSOR_BINARY_FUNCTION

/// `kiln::cast(x, kiln::int32)`: converts elements (floats to integers truncate
/// toward zero and saturate; NaN becomes 0).
template <class = void>
tensor cast(const tensor& x, dtype to) { return detail::apply(ops::cast(to), x); }
/// `kiln::cast<double>(x)`: the same with the target as a C++ type, as the
/// compile-time tier spells it, so that one generic callable serves both tiers.
template <class T>
  requires has_dtype<T>
tensor cast(const tensor& x) { return cast(x, dtype_of<T>); }

/// `kiln::where(x > 0, x, 0.f)`: picks from `a` where `cond` holds, else from `b`.
template <class = void>
tensor where(const tensor& cond, const tensor& a, const tensor& b) { return detail::apply(ops::where{}, cond, a, b); }
template <promotable_scalar S>
tensor where(const tensor& cond, const tensor& a, const S& b) {
  return where(cond, a, detail::make_scalar(a.dtype(), b, a.device()));
}
template <promotable_scalar S>
tensor where(const tensor& cond, const S& a, const tensor& b) {
  return where(cond, detail::make_scalar(b.dtype(), a, b.device()), b);
}

template <class = void>
tensor operator-(const tensor& x) { return negative(x); }

#define KILN_DETAIL_TENSOR_OPERATOR(sym, fn)                                         \
  template <class = void>                                                            \
  tensor operator sym(const tensor& x, const tensor& y) { return fn(x, y); }        \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const tensor& x, const S& y) { return fn(x, y); }              \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const S& x, const tensor& y) { return fn(x, y); }
KILN_OPERATORS(KILN_DETAIL_TENSOR_OPERATOR)
#undef KILN_DETAIL_TENSOR_OPERATOR

}  // namespace kiln
// ----- end kiln/ops/elementwise.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_ELEMENTWISE_HPP

namespace kiln::backend {

/// Plain scalar loops: the executable specification every other backend is tested against.
struct reference_backend {
  static constexpr std::string_view name = "reference";
};
/// SIMD (xsimd) and multi-threaded kernels for device::cpu.
struct cpu_backend {
  static constexpr std::string_view name = "cpu";
};
/// Thrust kernels for device::gpu (CUDA under nvcc, the host device system otherwise).
struct thrust_backend {
  static constexpr std::string_view name = "thrust";
};

/// True when backend `B` has a kernel for op `Op`.
/// \code static_assert(kiln::backend::supports<kiln::backend::cpu_backend, kiln::ops::add>); \endcode
template <class B, class Op>
concept supports = requires(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  compute(B{}, op, in, out);
};

/// Strides (in elements) of an input broadcast to `out`: 0 along broadcast dims.
/// Aligned to the output's rank.
constexpr std::array<std::int64_t, max_rank> broadcast_strides(const shape& in, const shape& out) {
  std::array<std::int64_t, max_rank> st{};
  std::int64_t acc = 1;
  int offset = out.rank() - in.rank();
  for (int i = in.rank() - 1; i >= 0; --i) {
    st[i + offset] = in[i] == 1 ? 0 : acc;
    acc *= in[i];
  }
  return st;
}

template <class Op, class In, bool Condition = Op::leading_condition,
          class Values = std::make_index_sequence<Op::arity - ops::value_operand<Op>>>
struct elementwise_result;
template <class Op, class In, std::size_t... I>
struct elementwise_result<Op, In, false, std::index_sequence<I...>> {
  using type = std::decay_t<decltype(std::declval<const Op&>()((void(I), std::declval<const In&>())...))>;
};
template <class Op, class In, std::size_t... I>
struct elementwise_result<Op, In, true, std::index_sequence<I...>> {
  using type = std::decay_t<decltype(std::declval<const Op&>()(true, (void(I), std::declval<const In&>())...))>;
};
/// The C++ type an elementwise op produces from operands of type `In`.
template <class Op, class In>
using elementwise_result_t = typename elementwise_result<Op, In>::type;

/// The error for an elementwise op's dtype that this program compiled no kernel for:
/// only kiln's own bookkeeping ran the op, with kernels for the dtypes `only`
/// (detail::apply_bookkeeping).
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_kernel_not_compiled(std::string_view op, dtype_set only, dtype in,
                                                                         dtype out) {
  std::vector<std::string_view> names;
  for (int t = 0; t < dtype_count; ++t)
    if (only.contains(dtype(t))) names.push_back(name(dtype(t)));
  std::string listed;
  for (std::size_t k = 0; k < names.size(); ++k)
    listed.append(k == 0 ? "" : k + 1 == names.size() ? " and " : ", ").append(names[k]);
  throw unavailable_error(std::string(op) + ": this program compiled its kernels for " + listed +
                          " only (for kiln's own bookkeeping), not for " + std::string(name(in)) + " -> " +
                          std::string(name(out)) + "; call the op once where the graph is run, or link kiln's "
                          "kernels (kiln_add_library, or KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS) in one source file)");
}

/// The error for a dtype pair that an op's rules should have refused before its
/// kernels: out of line, since each op's dtype visit reaches it once per dtype.
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_unexpected_dtypes(std::string_view op, dtype in, dtype out) {
  throw internal_error(std::string(op) + ": dtypes " + std::string(name(in)) + " -> " + std::string(name(out)) +
                       " reached a kernel");
}

/// Calls `f.template operator()<In, Out>()` with the C++ types an elementwise op
/// reads and writes, instantiating only the dtypes the op accepts that are in `Only`
/// (for an op only kiln's bookkeeping runs, detail::bookkeeping_dtypes). `In` is the
/// dtype of the value operands (for `where`, the branches).
template <dtype_set Only = dtypes::all, ops::elementwise Op, class F>
void visit_elementwise_types([[maybe_unused]] const Op& op, dtype in, dtype out, F&& f) {
  visit_dtype(in, [&]<class In>() {
    if constexpr (!Op::accepts.contains(dtype_of<In>)) {
      throw_unexpected_dtypes(Op::name, in, out);
    } else if constexpr (!Only.contains(dtype_of<In>)) {
      throw_kernel_not_compiled(Op::name, Only, in, out);
    } else if constexpr (Op::converts) {
      visit_dtype(out, [&]<class Out>() {
        if constexpr (!Only.contains(dtype_of<Out>))
          throw_kernel_not_compiled(Op::name, Only, in, out);
        else if constexpr (std::is_same_v<In, std::string> == std::is_same_v<Out, std::string>)
          f.template operator()<In, Out>();
      });
    } else {
      using Out = elementwise_result_t<Op, In>;
      if (dtype_of<Out> != out) throw_unexpected_dtypes(Op::name, in, out);
      if constexpr (!Only.contains(dtype_of<Out>))
        throw_kernel_not_compiled(Op::name, Only, in, out);
      else
        f.template operator()<In, Out>();
    }
  });
}

/// An elementwise op's CPU kernels for the dtypes `Only` alone (defined in
/// kiln/backend/cpu/elementwise.hpp; see detail::apply_bookkeeping).
template <dtype_set Only, ops::elementwise Op>
void compute_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out);

/// `compute(B{}, op, in, out)`; on the CPU with the kernels of the dtypes `Only`
/// alone, unless `Only` is every dtype: how eager runs and plans reach an op's kernels.
template <dtype_set Only, class B, class Op>
void compute_with(B, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  if constexpr (Only != dtypes::all && std::is_same_v<B, cpu_backend>)
    compute_elementwise<Only>(op, in, out);
  else
    compute(B{}, op, in, out);
}

}  // namespace kiln::backend
// ----- end kiln/backend/backend.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_BACKEND_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_STREAMING_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_STREAMING_HPP
// ----- begin kiln/backend/cpu/streaming.hpp -----
/// \file
/// Loads and stores of xsimd batches that are not one plain full batch: partial ones
/// (a run's head or tail, touching nothing past its end; masked on AVX-512) and
/// non-temporal stores, for outputs too large to stay in cache (streaming them saves
/// reading each line before writing it). Used by the elementwise and matmul kernels,
/// the compile-time tier and native loops (kiln/exec/jit.hpp).

#include <cstddef>
#include <cstdint>
#include <type_traits>



namespace kiln::backend::cpu {

/// The first `count` (0 to width) elements at `p` in the low lanes, zeros above;
/// nothing past p + count is read (AVX-512 masks the load; elsewhere a copy does).
template <class V>
KILN_ALWAYS_INLINE xsimd::batch<V> load_partial(const V* p, std::int64_t count) {
  using batch = xsimd::batch<V>;
#if defined(__AVX512F__)
  if constexpr (sizeof(batch) == 64) {
    const auto mask = static_cast<std::uint32_t>((std::uint64_t(1) << count) - 1);
    if constexpr (std::is_same_v<V, float>)
      return _mm512_maskz_loadu_ps(__mmask16(mask), p);
    else if constexpr (std::is_same_v<V, double>)
      return _mm512_maskz_loadu_pd(__mmask8(mask), p);
    else if constexpr (sizeof(V) == 4)
      return _mm512_maskz_loadu_epi32(__mmask16(mask), p);
    else if constexpr (sizeof(V) == 8)
      return _mm512_maskz_loadu_epi64(__mmask8(mask), p);
  }
#endif
  alignas(64) V lanes[batch::size] = {};
  for (std::int64_t i = 0; i < count; ++i) lanes[i] = p[i];
  return batch::load_aligned(lanes);
}

/// Stores the low `count` (0 to width) lanes of `x` at `p`, touching nothing past
/// p + count.
template <class V>
KILN_ALWAYS_INLINE void store_partial(const xsimd::batch<V>& x, V* p, std::int64_t count) {
  using batch = xsimd::batch<V>;
#if defined(__AVX512F__)
  if constexpr (sizeof(batch) == 64) {
    const auto mask = static_cast<std::uint32_t>((std::uint64_t(1) << count) - 1);
    if constexpr (std::is_same_v<V, float>)
      return _mm512_mask_storeu_ps(p, __mmask16(mask), x);
    else if constexpr (std::is_same_v<V, double>)
      return _mm512_mask_storeu_pd(p, __mmask8(mask), x);
    else if constexpr (sizeof(V) == 4)
      return _mm512_mask_storeu_epi32(p, __mmask16(mask), x);
    else if constexpr (sizeof(V) == 8)
      return _mm512_mask_storeu_epi64(p, __mmask8(mask), x);
  }
#endif
  alignas(64) V lanes[batch::size];
  x.store_aligned(lanes);
  for (std::int64_t i = 0; i < count; ++i) p[i] = lanes[i];
}

/// The `count` (1 to width) elements at `p` followed by copies of the last, as the
/// kernels pad a run's head and tail so that every element goes through the same
/// SIMD functor; nothing past p + count is read. On AVX-512 one masked load merges
/// them into a broadcast of the last, with no store to memory and load back.
template <class V>
KILN_ALWAYS_INLINE xsimd::batch<V> load_padded(const V* p, std::int64_t count) {
  using batch = xsimd::batch<V>;
#if defined(__AVX512F__)
  if constexpr (sizeof(batch) == 64 && std::is_arithmetic_v<V> && !std::is_same_v<V, bool>) {
    const auto mask = static_cast<std::uint32_t>((std::uint64_t(1) << count) - 1);
    if constexpr (std::is_same_v<V, float>)
      return _mm512_mask_loadu_ps(_mm512_set1_ps(p[count - 1]), __mmask16(mask), p);
    else if constexpr (std::is_same_v<V, double>)
      return _mm512_mask_loadu_pd(_mm512_set1_pd(p[count - 1]), __mmask8(mask), p);
    else if constexpr (sizeof(V) == 4)
      return _mm512_mask_loadu_epi32(_mm512_set1_epi32(int(p[count - 1])), __mmask16(mask), p);
    else if constexpr (sizeof(V) == 8)
      return _mm512_mask_loadu_epi64(_mm512_set1_epi64((long long)(p[count - 1])), __mmask8(mask), p);
  }
#endif
  alignas(64) V lanes[batch::size];
  for (std::int64_t l = 0; l < std::int64_t(batch::size); ++l) lanes[l] = p[l < count ? l : count - 1];
  return batch::load_aligned(lanes);
}

/// Where a kernel reads an operand's batch for element i: at `data + i * step`. A
/// contiguous operand is read in place (step 1); a broadcast one from a batch of its
/// copies (step 0), so that one loop serves every mix of contiguous and broadcast
/// operands: a loop per mix would repeat the op's inlined functor, and a load from the
/// stack per batch costs little beside it.
/// \code
/// float x[16] = {}, two = 2.f;
/// kiln::backend::cpu::batch_source<float> a(x, true), b(&two, false);
/// auto sum = a[0] + b[0];  // x[0..width) + 2
/// \endcode
template <class T>
struct batch_source {
  using batch = xsimd::batch<T>;
  alignas(sizeof(batch)) T copies[batch::size];
  const T* data;
  std::int64_t step;

  /// Reads `contiguous` element by element, or `broadcast` where `contiguous` is null.
  batch_source(const T* contiguous, const batch& broadcast)
      : data(contiguous ? contiguous : copies), step(contiguous != nullptr) {
    if (!contiguous) broadcast.store_aligned(copies);
  }
  /// The operand at `p`: read element by element when `contiguous`, else `p[0]`
  /// broadcast.
  batch_source(const T* p, bool contiguous)
      : batch_source(contiguous ? p : nullptr, contiguous ? batch() : batch(p[0])) {}
  batch_source(const batch_source&) = delete;  // `data` may point into `copies`

  KILN_ALWAYS_INLINE batch operator[](std::int64_t i) const { return batch::load_unaligned(data + i * step); }
  /// The `count` elements from i as load_padded reads them.
  KILN_ALWAYS_INLINE batch padded(std::int64_t i, std::int64_t count) const { return load_padded(data + i * step, count); }
};

/// Outputs at least this large are written with non-temporal stores: they do not fit
/// in cache anyway, and streaming them saves reading each line before writing it.
inline constexpr std::size_t streaming_bytes = std::size_t(8) << 20;

/// Stores `b` at `p` (aligned to the batch size) bypassing the caches.
template <class T, class A>
KILN_ALWAYS_INLINE void store_streaming(const xsimd::batch<T, A>& b, T* p) {
#if defined(__AVX512F__)
  if constexpr (sizeof(b) == 64) {
    if constexpr (std::is_same_v<T, float>) return _mm512_stream_ps(p, b);
    else if constexpr (std::is_same_v<T, double>) return _mm512_stream_pd(p, b);
    else return _mm512_stream_si512(reinterpret_cast<__m512i*>(p), b);
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(b) == 32) {
    if constexpr (std::is_same_v<T, float>) return _mm256_stream_ps(p, b);
    else if constexpr (std::is_same_v<T, double>) return _mm256_stream_pd(p, b);
    else return _mm256_stream_si256(reinterpret_cast<__m256i*>(p), b);
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(b) == 16) {
    if constexpr (std::is_same_v<T, float>) return _mm_stream_ps(p, b);
    else if constexpr (std::is_same_v<T, double>) return _mm_stream_pd(p, b);
    else return _mm_stream_si128(reinterpret_cast<__m128i*>(p), b);
  }
#endif
  b.store_aligned(p);
}

/// Stores `b` at `p`: streaming when `Stream` (then `p` is aligned to the batch size).
/// \code
/// alignas(64) float out[64];
/// kiln::backend::cpu::store_batch<false>(xsimd::batch<float>(1.f), out);
/// \endcode
template <bool Stream, class T, class A>
KILN_ALWAYS_INLINE void store_batch(const xsimd::batch<T, A>& b, T* p) {
  if constexpr (Stream)
    store_streaming(b, p);
  else
    b.store_unaligned(p);
}

/// Orders non-temporal stores (weakly ordered) before what follows, such as another
/// thread reading them.
inline void streaming_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace kiln::backend::cpu
// ----- end kiln/backend/cpu/streaming.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_STREAMING_HPP

namespace kiln::backend {
namespace cpu {

/// Elements per parallel task: below this, threads cost more than they save (the
/// pool's workers spin between jobs, so a job starts in well under a microsecond).
inline constexpr std::int64_t elementwise_grain = std::int64_t(1) << 14;

/// The loop nest of an elementwise op after merging dims that every operand
/// walks contiguously (or every operand broadcasts).
template <int Arity>
struct loop_nest {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{};
  std::array<std::array<std::int64_t, max_rank>, Arity> stride{};

  loop_nest(std::span<const buffer_view> in, const shape& out) {
    std::array<std::array<std::int64_t, max_rank>, Arity> full{};
    for (int k = 0; k < Arity; ++k) full[k] = broadcast_strides(in[k].shape, out);
    for (int d = 0; d < out.rank(); ++d) {
      if (out[d] == 1) continue;  // size-1 dims contribute nothing
      bool merge = rank > 0;
      for (int k = 0; k < Arity && merge; ++k) merge = stride[k][rank - 1] == full[k][d] * out[d];
      if (merge) {
        size[rank - 1] *= out[d];
        for (int k = 0; k < Arity; ++k) stride[k][rank - 1] = full[k][d];
      } else {
        size[rank] = out[d];
        for (int k = 0; k < Arity; ++k) stride[k][rank] = full[k][d];
        ++rank;
      }
    }
    if (rank == 0) {  // a scalar, or all dims of size 1
      rank = 1;
      size[0] = 1;
    }
  }
};

template <class T>
inline constexpr bool simd_type =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

/// Whether an op's functor runs on xsimd batches for these dtypes: its kernel has a
/// SIMD loop, can stream its output, and can join a native loop (kiln/exec/jit.hpp).
template <class Op, class In, class Out>
inline constexpr bool simd_kernel = std::is_same_v<In, Out> && simd_type<In> && Op::simd.contains(dtype_of<In>) && Op::arity <= 2;

/// Outputs [from, len) one element at a time; operand k's element for output i is
/// at offset `offset(k, i)`. For `where`, operand 0 is the bool condition.
template <class In, class Out, int Arity, class Op, class Offset>
void element_loop(const Op& op, Out* o, const void* const* p, std::int64_t from, std::int64_t len,
                  Offset offset) {
  for (std::int64_t i = from; i < len; ++i)
    o[i] = math::convert<Out>(ops::invoke_elementwise(
        op, [&](int k) -> const In& { return static_cast<const In*>(p[k])[offset(k, i)]; },
        [&](int k) { return static_cast<const bool*>(p[k])[offset(k, i)]; }));
}

/// One run of `len` outputs of an op with a SIMD kernel. Bit k of `contig` says
/// operand k advances by one element per output; otherwise it is broadcast (stride 0).
/// With `stream`, full batches go to memory with non-temporal stores, and `o` must be
/// aligned to a batch. Both are run-time flags, not template parameters, so that the
/// functor is inlined into one loop, not one per combination (see batch_source); a
/// branch per batch on `stream` costs nothing beside a store that misses every cache.
template <class Op, class T, int Arity>
KILN_FLATTEN void simd_run(unsigned contig, const Op& op, T* KILN_RESTRICT o, const void* const* p,
                           std::int64_t len, bool stream = false) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = B::size;
  const auto in = [&]<int... K>(std::integer_sequence<int, K...>) {
    return std::array<batch_source<T>, Arity>{batch_source<T>(static_cast<const T*>(p[K]), (contig >> K) & 1u)...};
  }(std::make_integer_sequence<int, Arity>{});
  std::int64_t i = 0;
  for (; i + w <= len; i += w) {
    B batch;
    if constexpr (Arity == 1)
      batch = op(in[0][i]);
    else
      batch = op(in[0][i], in[1][i]);
    if (stream)
      store_streaming(batch, o + i);
    else
      batch.store_unaligned(o + i);
  }
  // Fewer than a batch of elements (the tail, or a run shorter than a batch) run as
  // one batch of copies padded with the last of them, so every element goes through
  // the same SIMD functor: results do not depend on an element's position, and a
  // fused cluster, which pads the same way, computes the same bits.
  if (const std::int64_t rest = len - i; rest > 0) {
    if constexpr (Arity == 1)
      store_partial(op(in[0].padded(i, rest)), o + i, rest);
    else
      store_partial(op(in[0].padded(i, rest), in[1].padded(i, rest)), o + i, rest);
  }
}

/// One run of `len` outputs of an op without a SIMD kernel for these dtypes, one
/// element at a time; bit k of `Contig` as `contig` in kiln::backend::cpu::simd_run.
/// For `where`, operand 0 is the bool condition.
template <unsigned Contig, class Op, class In, class Out, int Arity>
void scalar_run(const Op& op, Out* KILN_RESTRICT o, const void* const* p, std::int64_t len) {
  std::int64_t i = 0;
  if constexpr (Op::leading_condition && std::is_same_v<In, Out> && simd_type<In>) {
    // `where`: the bool condition widened to a mask, then a blend of the branches
    // (a select copies bits, so the scalar tail gives the same results).
    using B = xsimd::batch<In>;
    constexpr std::int64_t w = B::size;
    const bool* condition = static_cast<const bool*>(p[0]);
    auto load = [&](int k, std::int64_t j) {
      const In* q = static_cast<const In*>(p[k]);
      return (Contig >> k) & 1u ? B::load_unaligned(q + j) : B(q[0]);
    };
    for (; i + w <= len; i += w) {
      alignas(sizeof(B)) In flags[w];
      for (std::int64_t k = 0; k < w; ++k) flags[k] = In(condition[(Contig & 1u) ? i + k : 0]);
      xsimd::select(B::load_aligned(flags) != B(In(0)), load(1, i), load(2, i)).store_unaligned(o + i);
    }
  }
  element_loop<In, Out, Arity>(op, o, p, i, len, [](int k, std::int64_t j) { return (Contig >> k) & 1u ? j : 0; });
}

/// A run of elements that are objects (strings): never vectorized, so one loop reads
/// each operand's contiguity at run time instead of a loop per combination.
template <class Op, class In, class Out, int Arity>
void object_run(unsigned contig, const Op& op, Out* o, const void* const* p, std::int64_t len) {
  element_loop<In, Out, Arity>(op, o, p, 0, len,
                               [contig](int k, std::int64_t j) { return (contig >> k) & 1u ? j : std::int64_t(0); });
}

/// A run in which every operand is broadcast: one value, computed as a full run
/// computes it (on one element) and copied.
template <class Op, class In, class Out, int Arity>
void broadcast_run(const Op& op, Out* o, const void* const* p, std::int64_t len) {
  constexpr unsigned all = (1u << Arity) - 1;
  if constexpr (simd_kernel<Op, In, Out>)
    simd_run<Op, In, Arity>(all, op, o, p, 1);
  else
    scalar_run<all, Op, In, Out, Arity>(op, o, p, 1);
  std::fill_n(o + 1, len - 1, o[0]);
}

/// Runs `len` outputs of operand contiguity `contig` (bit k: operand k advances by one
/// element per output); `stream` as for kiln::backend::cpu::simd_run.
template <class Op, class In, class Out, int Arity, unsigned Contig = 1>
void dispatch_run(unsigned contig, const Op& op, Out* o, const void* const* p, std::int64_t len,
                  bool stream = false) {
  if constexpr (std::is_same_v<In, std::string>) {
    object_run<Op, In, Out, Arity>(contig, op, o, p, len);
  } else if (contig == 0) {
    // Rare (every operand broadcast along the innermost dim): one value, copied.
    broadcast_run<Op, In, Out, Arity>(op, o, p, len);
  } else if constexpr (simd_kernel<Op, In, Out>) {
    simd_run<Op, In, Arity>(contig, op, o, p, len, stream);
  } else if constexpr (Contig == (1u << Arity)) {
    (void)stream;
  } else if (contig == Contig) {
    scalar_run<Contig, Op, In, Out, Arity>(op, o, p, len);
  } else {
    dispatch_run<Op, In, Out, Arity, Contig + 1>(contig, op, o, p, len);
  }
}

/// One run of an elementwise kernel, its types erased: `len` outputs at `out` from the
/// operands at `p`, of contiguity `contig` (as for dispatch_run), streamed when
/// `stream` (as for simd_run).
using run_fn = void (*)(const void* op, unsigned contig, void* out, const void* const* p, std::int64_t len, bool stream);

template <class Op, class In, class Out>
void erased_run(const void* op, unsigned contig, void* out, const void* const* p, std::int64_t len, bool stream) {
  dispatch_run<Op, In, Out, Op::arity>(contig, *static_cast<const Op*>(op), static_cast<Out*>(out), p, len, stream);
}

/// An elementwise kernel as the loops around its runs see it.
struct erased_kernel {
  run_fn run;
  const void* op;
  std::array<std::size_t, 3> operand_bytes;  ///< the element size of each operand
  std::size_t out_bytes;                     ///< the element size of the output
  std::size_t stream_batch_bytes;            ///< a batch's size where the kernel can stream; 0 otherwise
};

/// The loops of an elementwise kernel around its runs: the broadcast loop nest, split
/// over the thread pool. Compiled once per arity, not once per op and dtypes: all that
/// differs between kernels is `kernel.run`, called once per run.
template <int Arity>
void run_loops(const erased_kernel& kernel, std::span<const buffer_view> in, const buffer_view& out) {
  const std::int64_t n = out.size();
  if (n == 0) return;
  const loop_nest<Arity> nest(in, out.shape);
  const int r = nest.rank;
  const std::int64_t inner = nest.size[r - 1];
  unsigned contig = 0;
  for (int k = 0; k < Arity; ++k)
    if (nest.stride[k][r - 1] == 1) contig |= 1u << k;
  const std::int64_t out_bytes = std::int64_t(kernel.out_bytes);
  const bool stream = kernel.stream_batch_bytes > 0 && std::size_t(n) * kernel.out_bytes >= streaming_bytes;
  kiln::detail::parallel_for(n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
    std::array<std::int64_t, max_rank> idx{};
    for (std::int64_t rest = lo, d = r - 1; d >= 0; --d) {
      idx[d] = rest % nest.size[d];
      rest /= nest.size[d];
    }
    while (lo < hi) {
      std::int64_t len = std::min(inner - idx[r - 1], hi - lo);
      std::array<const void*, Arity> p{};
      for (int k = 0; k < Arity; ++k) {
        std::int64_t off = 0;
        for (int d = 0; d < r; ++d) off += idx[d] * nest.stride[k][d];
        p[k] = static_cast<const char*>(in[k].data) + off * std::int64_t(kernel.operand_bytes[k]);
      }
      char* o = static_cast<char*>(out.data) + lo * out_bytes;
      std::int64_t count = len;
      if (stream) {
        // Non-temporal stores need aligned addresses: the outputs before the first
        // aligned one are stored as usual.
        const auto batch_bytes = std::int64_t(kernel.stream_batch_bytes);
        const auto skew = std::int64_t(reinterpret_cast<std::uintptr_t>(o) % std::uintptr_t(batch_bytes));
        if (const std::int64_t head = skew ? std::min(len, (batch_bytes - skew) / out_bytes) : 0; head > 0) {
          kernel.run(kernel.op, contig, o, p.data(), head, false);
          for (int k = 0; k < Arity; ++k)
            if ((contig >> k) & 1u) p[k] = static_cast<const char*>(p[k]) + head * std::int64_t(kernel.operand_bytes[k]);
          o += head * out_bytes;
          count -= head;
        }
      }
      if (count > 0) kernel.run(kernel.op, contig, o, p.data(), count, stream);
      lo += len;
      idx[r - 1] += len;
      for (int d = r - 1; d > 0 && idx[d] == nest.size[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
    if (stream) streaming_fence();
  });
}

template <class Op, class In, class Out>
void run_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  erased_kernel kernel{&erased_run<Op, In, Out>, &op, {}, sizeof(Out), 0};
  // A leading condition is read as bool and the values as In.
  for (int k = 0; k < Op::arity; ++k)
    kernel.operand_bytes[std::size_t(k)] = k < ops::value_operand<Op> ? sizeof(bool) : sizeof(In);
  if constexpr (simd_kernel<Op, In, Out>) kernel.stream_batch_bytes = sizeof(xsimd::batch<Out>);
  run_loops<Op::arity>(kernel, in, out);
}

}  // namespace cpu

template <dtype_set Only, ops::elementwise Op>
void compute_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  visit_elementwise_types<Only>(op, in[ops::value_operand<Op>].dtype, out.dtype,
                                [&]<class In, class Out>() { cpu::run_elementwise<Op, In, Out>(op, in, out); });
}

template <ops::elementwise Op>
void compute(cpu_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  compute_elementwise<dtypes::all>(op, in, out);
}

}  // namespace kiln::backend
// ----- end kiln/backend/cpu/elementwise.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_ELEMENTWISE_HPP

namespace kiln {

namespace typed {
template <class>
inline constexpr bool always_false = false;
}  // namespace typed

/// Base of the compile-time tier's symbolic values and expressions: it puts namespace
/// kiln among their associated namespaces, where their operators are.
struct typed_expression {
  /// A symbolic value has no truth value while tracing.
  template <class U = void>
  explicit operator bool() const {
    static_assert(typed::always_false<U>,
                  "kiln: a symbolic typed value cannot be converted to bool while tracing; use kiln::cond or "
                  "kiln::while_loop for conditions on values, or a C++ `if` on C++ values");
    return false;
  }
};

namespace typed {

/// The data of a trace's values by slot: its arguments, then the results of its steps.
/// Eager evaluation has none.
using frame = void* const*;

struct cond_step;
struct loop_step;

/// Where the steps of a typed trace describe themselves, for
/// concrete_function::graph(): kiln/typed/graph.hpp implements it with a kiln::graph.
/// Every step can describe itself, in every program, so that a step type means the
/// same in each file of a program; what builds the graph comes with the runtime tier.
class description_sink {
 public:
  /// The node holding slot `slot`'s value, read with dims `dims` (in a branch or loop
  /// body, a placeholder for a value from outside, which becomes an input of the node
  /// that runs it; a reshape node where the slot is read with other dims).
  virtual int value(int slot, std::span<const std::int64_t> dims) = 0;
  /// Slot `slot` holds the value of node `node` from here on.
  virtual void bind(int slot, int node) = 0;
  /// A node of the registry op named `name`, at `op`, whose value has element type
  /// `t` and dims `dims`.
  virtual int op(std::string_view name, const void* op, std::span<const int> inputs, kiln::dtype t,
                 std::span<const std::int64_t> dims) = 0;
  /// A constant node holding a copy of the elements at `data`.
  virtual int constant(kiln::dtype t, std::span<const std::int64_t> dims, const void* data) = 0;
  /// A node with effects (a print, a callback, a variable's read or write); the nodes
  /// of its results. `variable` names the variable it reads or writes, if any.
  virtual std::vector<int> effect(std::string_view name, std::string_view variable, bool writes,
                                  std::vector<int> inputs,
                                  const std::vector<std::pair<kiln::dtype, kiln::shape>>& results) = 0;
  /// A conditional or a loop, with its branches or condition and body.
  virtual void control_flow(const cond_step& c) = 0;
  virtual void control_flow(const loop_step& l) = 0;

 protected:
  ~description_sink() = default;
};

/// Whether `T` has SIMD batches: the CPU kernels' rule, so that an expression runs on
/// batches exactly where the kernels do.
template <class T>
inline constexpr bool simd_type = backend::cpu::simd_type<T>;

template <class T>
using batch = xsimd::batch<T>;

// ---- leaves ------------------------------------------------------------------------

// Besides `load` and `partial`, every expression has `load_chained` and
// `partial_chained`, which read the value `prev` (of the batch or element type `P`)
// instead of slot `slot`'s, and `visit_slots`, which tells the slots it reads and
// whether through a broadcast. An evaluation chain (kiln/typed/trace.hpp) runs the
// assignments of a rebinding loop one batch at a time, each reading the one before
// from a register. A leaf that reads no slot reads as it always does:
#define KILN_TYPED_LEAF_WITHOUT_SLOTS                                                              \
  template <class V, class P>                                                                     \
  V load_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {              \
    return this->template load<V>(f, row, col);                                                   \
  }                                                                                               \
  template <class V, std::int64_t Count, class P>                                                 \
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {           \
    return this->template partial<V, Count>(f, row, col);                                         \
  }                                                                                               \
  template <class F>                                                                              \
  void visit_slots(F&&, bool) const {}

/// Elements at a data pointer, laid out as `D` (eager operands).
template <class T, class D>
struct data_leaf : typed_expression {
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;
  const T* p;

  template <class V>
  V load(frame, std::int64_t row, std::int64_t col) const {
    if constexpr (std::is_same_v<V, T>)
      return p[row * D::inner + col];
    else
      return V::load_unaligned(p + row * D::inner + col);
  }
  template <class V, std::int64_t Count>
  V partial(frame, std::int64_t row, std::int64_t col) const {
    // Every element goes through the batch functor, wherever it sits, as in the CPU
    // kernels. Floats pad with zeros, one masked load; integers with copies of the
    // last element, so that no padding lane divides by zero.
    if constexpr (std::is_floating_point_v<T>)
      return backend::cpu::load_partial(p + row * D::inner + col, Count);
    else
      return backend::cpu::load_padded(p + row * D::inner + col, Count);
  }
  int describe(description_sink& sink) const { return sink.constant(dtype_of<T>, D::values, p); }
  KILN_TYPED_LEAF_WITHOUT_SLOTS
};

/// Elements of slot `index` of the frame, laid out as `D` (traced values).
template <class T, class D>
struct slot_leaf : typed_expression {
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;
  int index;

  const T* at(frame f) const { return static_cast<const T*>(f[index]); }
  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, at(f)}.template load<V>(f, row, col);
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, at(f)}.template partial<V, Count>(f, row, col);
  }
  int describe(description_sink& sink) const { return sink.value(index, D::values); }
  template <class V, class P>
  V load_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    if constexpr (std::is_same_v<V, P>) {
      if (index == slot) return prev;
    }
    return load<V>(f, row, col);
  }
  template <class V, std::int64_t Count, class P>
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    if constexpr (std::is_same_v<V, P>) {
      if (index == slot) return prev;
    }
    return partial<V, Count>(f, row, col);
  }
  template <class F>
  void visit_slots(F&& visit, bool broadcast) const {
    visit(index, broadcast);
  }
};

/// A C++ scalar, converted to the other operand's element type.
template <class T>
struct scalar_leaf : typed_expression {
  using value_type = T;
  using dims_type = dims<>;
  static constexpr bool simd = simd_type<T>;
  T value;

  template <class V>
  V load(frame, std::int64_t, std::int64_t) const {
    return V(value);
  }
  template <class V, std::int64_t Count>
  V partial(frame, std::int64_t, std::int64_t) const {
    return V(value);
  }
  int describe(description_sink& sink) const { return sink.constant(dtype_of<T>, {}, &value); }
  KILN_TYPED_LEAF_WITHOUT_SLOTS
};

/// A `fixed` captured by a trace, kept by value (shared, so copies of the expression
/// that holds it are cheap).
template <class T, class D>
struct constant_leaf : typed_expression {
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;
  std::shared_ptr<const fixed_t<T, D>> value;

  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, value->data()}.template load<V>(f, row, col);
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    return data_leaf<T, D>{{}, value->data()}.template partial<V, Count>(f, row, col);
  }
  int describe(description_sink& sink) const { return sink.constant(dtype_of<T>, D::values, value->data()); }
  KILN_TYPED_LEAF_WITHOUT_SLOTS
};

#undef KILN_TYPED_LEAF_WITHOUT_SLOTS

// ---- broadcasting ------------------------------------------------------------------

/// Operand `E` read as dims `Out` (NumPy broadcasting, dims aligned on the right).
template <class E, class Out>
struct broadcast : typed_expression {
  using value_type = typename E::value_type;
  using dims_type = Out;
  using in_dims = typename E::dims_type;
  static constexpr bool simd = E::simd;
  /// Whether `E` repeats one value along the result's last dim.
  static constexpr bool splat_cols = in_dims::inner == 1 && Out::inner > 1;
  E operand;

  /// `E`'s row for the result's `row`.
  static std::int64_t map_row(std::int64_t row) {
    constexpr int ro = Out::rank, re = in_dims::rank;
    if constexpr (re <= 1) {
      return 0;
    } else {
      std::int64_t in_row = 0, in_stride = 1;
      // Walk the result's row dims from the last (dim ro - 2) to the first.
      for (int d = ro - 2; d >= 0; --d) {
        const std::int64_t size = Out::values[std::size_t(d)], index = row % size;
        row /= size;
        const int e = d - (ro - re);
        if (e < 0) break;
        const std::int64_t in_size = in_dims::values[std::size_t(e)];
        if (in_size != 1) in_row += index * in_stride;
        in_stride *= in_size;
      }
      return in_row;
    }
  }
  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    if constexpr (splat_cols) {
      if constexpr (std::is_same_v<V, value_type>)
        return operand.template load<V>(f, map_row(row), 0);
      else
        return V(first_lane(operand.template partial<V, 1>(f, map_row(row), 0)));
    } else {
      return operand.template load<V>(f, map_row(row), col);
    }
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    if constexpr (splat_cols)
      return load<V>(f, row, col);
    else
      return operand.template partial<V, Count>(f, map_row(row), col);
  }
  /// Broadcasting is implicit in a graph, as in the runtime tier's.
  int describe(description_sink& sink) const { return operand.describe(sink); }
  /// A broadcast operand reads other elements than (row, col), so it never reads a
  /// chained value (an evaluation chain does not take an expression that would).
  template <class V, class P>
  V load_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {
    return load<V>(f, row, col);
  }
  template <class V, std::int64_t Count, class P>
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int, const P&) const {
    return partial<V, Count>(f, row, col);
  }
  template <class F>
  void visit_slots(F&& visit, bool) const {
    operand.visit_slots(visit, true);
  }

 private:
  template <class V>
  static value_type first_lane(const V& v) {
    alignas(64) std::array<value_type, V::size> lanes;
    v.store_aligned(lanes.data());
    return lanes[0];
  }
};

/// `E` as an operand of a result of dims `Out`: itself, or broadcast.
template <class E, class Out>
using operand_as = std::conditional_t<std::is_same_v<typename E::dims_type, Out>, E, broadcast<E, Out>>;

template <class Out, class E>
operand_as<E, Out> broadcast_to(const E& e) {
  if constexpr (std::is_same_v<typename E::dims_type, Out>)
    return e;
  else
    return broadcast<E, Out>{{}, e};
}

// ---- the rules, at compile time ------------------------------------------------------

/// `Op`'s rules applied at compile time to operands of element types `T...` and
/// dims `D...` (each `X` a typed operand type): `op` is `Made::op`.
template <class Made, class... X>
struct op_rule {
  static constexpr dtype_result dtypes = Made::op.result_dtype(std::array<kiln::dtype, sizeof...(X)>{dtype_of<typename X::value_type>...});
  static constexpr shape_result shapes = Made::op.result_shape(std::array<kiln::shape, sizeof...(X)>{X::dims_type::shape()...});
  static constexpr kiln::shape value = shapes.value;
};

/// A default-constructed op, for op_rule.
template <class Op>
struct made {
  static constexpr Op op{};
};

/// What a typed op gives when its rules reject its operands, after the op's
/// `static_assert` has said why (naming the op), so that nothing else is reported.
struct rule_error {};

// ---- elementwise nodes ------------------------------------------------------------------

/// Elementwise `Op` on operands of dims `D` (already broadcast to it).
template <class Op, class D, class... E>
struct node : typed_expression {
  /// The operands' element type (for `where`, its branches').
  using input_type = typename std::tuple_element_t<ops::value_operand<Op>, std::tuple<E...>>::value_type;
  using value_type = element_t<op_rule<made<Op>, E...>::dtypes.value>;
  using dims_type = D;
  /// Batches throughout when the CPU kernel of this op would use them (one input
  /// type, the same output type, at most two operands) and every operand does.
  static constexpr bool simd = backend::cpu::simd_kernel<Op, input_type, value_type> && (E::simd && ...);
  Op op;
  std::tuple<E...> operands;

  /// An expression's type changes with each op, so a variable holding one cannot be
  /// rebound; a symbolic value can.
  template <class Other>
  node& operator=(const Other&) {
    static_assert(always_false<Other>,
                  "kiln: this variable holds an expression, whose type changes with every op, so it cannot be "
                  "reassigned; declare it with the argument's type (`decltype(x) y = x * 2.f;`) or start it from "
                  "a symbolic value (`auto y = x;`)");
    return *this;
  }

  template <class V>
  V load(frame f, std::int64_t row, std::int64_t col) const {
    if constexpr (std::is_same_v<V, value_type>)
      return std::apply([&](const auto&... e) { return apply_scalar(e.template load<typename std::remove_cvref_t<decltype(e)>::value_type>(f, row, col)...); }, operands);
    else
      return std::apply([&](const auto&... e) { return op(e.template load<V>(f, row, col)...); }, operands);
  }
  template <class V, std::int64_t Count>
  V partial(frame f, std::int64_t row, std::int64_t col) const {
    return std::apply([&](const auto&... e) { return op(e.template partial<V, Count>(f, row, col)...); }, operands);
  }
  template <class V, class P>
  V load_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    if constexpr (std::is_same_v<V, value_type>)
      return std::apply([&](const auto&... e) { return apply_scalar(e.template load_chained<typename std::remove_cvref_t<decltype(e)>::value_type>(f, row, col, slot, prev)...); }, operands);
    else
      return std::apply([&](const auto&... e) { return op(e.template load_chained<V>(f, row, col, slot, prev)...); }, operands);
  }
  template <class V, std::int64_t Count, class P>
  V partial_chained(frame f, std::int64_t row, std::int64_t col, int slot, const P& prev) const {
    return std::apply([&](const auto&... e) { return op(e.template partial_chained<V, Count>(f, row, col, slot, prev)...); }, operands);
  }
  template <class F>
  void visit_slots(F&& visit, bool broadcast) const {
    std::apply([&](const auto&... e) { (e.visit_slots(visit, broadcast), ...); }, operands);
  }
  /// Adds the operands' nodes, left to right, then this op's.
  int describe(description_sink& sink) const { return describe(sink, std::index_sequence_for<E...>()); }

 private:
  template <class... A>
  value_type apply_scalar(const A&... a) const {
    return math::convert<value_type>(op(a...));
  }
  template <std::size_t... I>
  int describe(description_sink& sink, std::index_sequence<I...>) const {
    const int inputs[] = {std::get<I>(operands).describe(sink)...};  // braces: left to right
    // A typed cast carries its target in its type; the registry knows it as ops::cast.
    using registry_op = std::conditional_t<std::is_base_of_v<ops::cast, Op>, ops::cast, Op>;
    return sink.op(registry_op::name, static_cast<const registry_op*>(&op), inputs, dtype_of<value_type>, D::values);
  }
};

/// Writes expression `e` (dims `D`) to `out`, reading slots from `f`. (`out` is
/// restrict: stores to it do not change the frame, so a loop reads each slot's
/// pointer once. Flattened: past a few dozen nodes GCC left the operands' calls out of
/// line, and a 50-op chain ran at half speed.)
template <class E>
KILN_FLATTEN void evaluate(const E& e, frame f, typename E::value_type* KILN_RESTRICT out) {
  using T = typename E::value_type;
  using D = typename E::dims_type;
  constexpr std::int64_t inner = D::inner, rows = D::size / inner;
  if constexpr (E::simd) {
    using B = batch<T>;
    constexpr std::int64_t w = B::size;
    for (std::int64_t row = 0; row < rows; ++row) {
      T* o = out + row * inner;
      std::int64_t col = 0;
      for (; col + w <= inner; col += w) e.template load<B>(f, row, col).store_unaligned(o + col);
      if constexpr (inner % w != 0) backend::cpu::store_partial(e.template partial<B, inner % w>(f, row, col), o + col, inner % w);
    }
  } else {
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < inner; ++col) out[row * inner + col] = e.template load<T>(f, row, col);
  }
}

/// One assignment of an evaluation chain: expression `expression` written to slot `out`.
template <class E>
struct chain_link {
  E expression;
  int out;
};

/// Evaluates `links` (at least one) as `evaluate` would one after the other, but one
/// batch position at a time: each link's value is stored to its slot and handed to the
/// next link in a register, in place of the slot the link before wrote. The links
/// write distinct slots that no earlier link reads, and none reads a slot the chain
/// writes through a broadcast (the recorder checks both), so every value a link reads
/// at a position is there already.
template <class E>
KILN_FLATTEN void evaluate_chain(std::span<const chain_link<E>> links, frame f) {
  using T = typename E::value_type;
  using D = typename E::dims_type;
  constexpr std::int64_t inner = D::inner, rows = D::size / inner;
  const std::size_t n = links.size();
  auto at = [&](std::size_t k, std::int64_t row, std::int64_t col) { return static_cast<T*>(f[links[k].out]) + row * inner + col; };
  if constexpr (E::simd) {
    using B = batch<T>;
    constexpr std::int64_t w = B::size;
    for (std::int64_t row = 0; row < rows; ++row) {
      std::int64_t col = 0;
      for (; col + w <= inner; col += w) {
        B v = links[0].expression.template load<B>(f, row, col);
        v.store_unaligned(at(0, row, col));
        for (std::size_t k = 1; k < n; ++k) {
          v = links[k].expression.template load_chained<B>(f, row, col, links[k - 1].out, v);
          v.store_unaligned(at(k, row, col));
        }
      }
      if constexpr (inner % w != 0) {
        constexpr std::int64_t tail = inner % w;
        B v = links[0].expression.template partial<B, tail>(f, row, col);
        backend::cpu::store_partial(v, at(0, row, col), tail);
        for (std::size_t k = 1; k < n; ++k) {
          v = links[k].expression.template partial_chained<B, tail>(f, row, col, links[k - 1].out, v);
          backend::cpu::store_partial(v, at(k, row, col), tail);
        }
      }
    }
  } else {
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < inner; ++col) {
        T v = links[0].expression.template load<T>(f, row, col);
        *at(0, row, col) = v;
        for (std::size_t k = 1; k < n; ++k) *at(k, row, col) = v = links[k].expression.template load_chained<T>(f, row, col, links[k - 1].out, v);
      }
  }
}

/// The `fixed` value of expression `e`, reading slots from `f` (none when eager).
template <class E>
fixed_t<typename E::value_type, typename E::dims_type> materialize(const E& e, frame f = nullptr) {
  fixed_t<typename E::value_type, typename E::dims_type> out(uninitialized);
  evaluate(e, f, out.data());
  return out;
}

/// The node of `op` on expressions `e...` (a `rule_error` when its rules reject them).
template <class Op, class... E>
auto make_node(const Op& op, const E&... e) {
  using rule = op_rule<made<Op>, E...>;
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return rule_error{};
  } else {
    using D = dims_from<rule>;
    return node<Op, D, operand_as<E, D>...>{{}, op, {broadcast_to<D>(e)...}};
  }
}

}  // namespace typed
}  // namespace kiln
// ----- end kiln/typed/expr.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_EXPR_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_OPS_HPP
// ----- begin kiln/typed/ops.hpp -----
/// \file
/// The elementwise ops on typed values, from the op library's definitions
/// (kiln/ops/elementwise.hpp): the same rules, the same functors. On `fixed` values
/// an op computes at once and gives a `fixed`; on a trace's symbolic values it gives
/// an expression, fused with its neighbours until something needs its value.

#include <concepts>
#include <memory>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_ACTIVATIONS_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_ACTIVATIONS_HPP
// ----- begin kiln/ops/activations.hpp -----
/// \file
/// The activations of neural-network layers beside relu, sigmoid and tanh (kiln/ops/
/// elementwise.hpp): gelu (exact and tanh approximation), softplus, silu, elu,
/// leaky_relu, and erf, which exact gelu and its gradient are written with. Each is
/// one elementwise functor (scalars, xsimd batches, Thrust device code) with its
/// gradient formula beside it, computing what TensorFlow 2.12's kernels and
/// `tf.nn` functions compute.

#include <span>
#include <string_view>
#include <tuple>


namespace kiln::ops {

/// The Gauss error function, as `tf.math.erf`.
struct erf : elementwise_op<1, floating> {
  static constexpr std::string_view name = "erf";
  static constexpr std::string_view onnx_name = "Erf";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::erf(a); }
  /// dy * 2 / sqrt(pi) * exp(-x^2).
  template <class G> void gradient(G& g) const {
    const auto x = g.x(0);
    g.give(0, g.dy() * 1.1283791670955126 * G::run(exp{}, -(x * x)));
  }
};

/// `x * P(X <= x)` for a standard normal X (`tf.nn.gelu`): exactly, with erf, or with
/// the tanh approximation when `approximate`.
struct gelu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "gelu";
  static constexpr std::string_view onnx_name = "Gelu";
  bool approximate = false;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"approximate", &gelu::approximate}}; }
  constexpr gelu() = default;
  constexpr explicit gelu(bool tanh_approximation) : approximate(tanh_approximation) {}
  constexpr bool operator==(const gelu&) const = default;
  // TensorFlow's constants and operation order: x / sqrt(2) (not a product), and
  // sqrt(2 / pi) * (x + 0.044715 * x^3).
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    if (approximate) return T(0.5) * x * (T(1) + math::tanh(T(0.7978845608028654) * (x + T(0.044715) * (x * x * x))));
    return T(0.5) * x * (T(1) + math::erf(x / T(1.4142135623730951)));
  }
  /// dy * (Phi(x) + x * phi(x)) exactly; the derivative of the tanh form when
  /// approximating.
  template <class G> void gradient(G& g) const;
};

/// `log(exp(x) + 1)`; x itself above -log(epsilon) - 2 and exp(x) below log(epsilon)
/// + 2, as TensorFlow's Softplus kernel, where the sum would lose x's digits.
struct softplus : elementwise_op<1, floating> {
  static constexpr std::string_view name = "softplus";
  static constexpr std::string_view onnx_name = "Softplus";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::softplus(x); }
  /// dy * sigmoid(x).
  template <class G> void gradient(G& g) const;
};

/// `x * sigmoid(x)` (swish), as `tf.nn.silu`.
struct silu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "silu";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return x * (T(1) / (T(1) + math::exp(math::neg(x)))); }
  /// dy * s * (1 + x * (1 - s)) with s = sigmoid(x).
  template <class G> void gradient(G& g) const;
};

/// `x` where positive, else `alpha * (exp(x) - 1)`, as Keras' `elu` (TensorFlow's Elu
/// kernel for alpha 1).
struct elu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "elu";
  static constexpr std::string_view onnx_name = "Elu";
  double alpha = 1.0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"alpha", &elu::alpha}}; }
  constexpr elu() = default;
  constexpr explicit elu(double a) : alpha(a) {}
  constexpr bool operator==(const elu&) const = default;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    return math::select(x > T(0), x, T(alpha) * (math::exp(x) - T(1)));
  }
  /// dy where x is positive, else dy * (y + alpha).
  template <class G> void gradient(G& g) const;
};

/// `x` where positive, else `alpha * x`, as TensorFlow's LeakyRelu kernel.
struct leaky_relu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "leaky_relu";
  static constexpr std::string_view onnx_name = "LeakyRelu";
  double alpha = 0.3;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"alpha", &leaky_relu::alpha}}; }
  constexpr leaky_relu() = default;
  constexpr explicit leaky_relu(double a) : alpha(a) {}
  constexpr bool operator==(const leaky_relu&) const = default;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::select(x > T(0), x, T(alpha) * x); }
  /// dy where x is positive, else alpha * dy, as TensorFlow's LeakyReluGrad.
  template <class G> void gradient(G& g) const;
};

template <class G>
void gelu::gradient(G& g) const {
  const auto x = g.x(0);
  if (approximate) {
    const double k = 0.7978845608028654, c = 0.044715;
    const auto t = G::run(tanh{}, k * (x + c * (x * x * x)));
    g.give(0, g.dy() * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (k * (1.0 + 3.0 * c * (x * x)))));
  } else {
    const auto cdf = 0.5 * (1.0 + G::run(erf{}, x * 0.7071067811865476));
    const auto pdf = 0.3989422804014327 * G::run(exp{}, -0.5 * (x * x));
    g.give(0, g.dy() * (cdf + x * pdf));
  }
}

template <class G>
void softplus::gradient(G& g) const {
  g.give(0, g.dy() * G::run(sigmoid{}, g.x(0)));
}

template <class G>
void silu::gradient(G& g) const {
  const auto x = g.x(0), s = G::run(sigmoid{}, x);
  g.give(0, g.dy() * (s * (1.0 + x * (1.0 - s))));
}

template <class G>
void elu::gradient(G& g) const {
  const auto positive = G::run(greater{}, g.x(0), g.x(0).scalar(0));
  g.give(0, G::run(where{}, positive, g.dy(), g.dy() * (g.y() + alpha)));
}

template <class G>
void leaky_relu::gradient(G& g) const {
  const auto positive = G::run(greater{}, g.x(0), g.x(0).scalar(0));
  g.give(0, G::run(where{}, positive, g.dy(), g.dy() * alpha));
}

}  // namespace kiln::ops

namespace kiln {

// erf, softplus and silu: the functions of the one op list (kiln/ops/op_list.hpp,
// where they are documented), as kiln/ops/elementwise.hpp writes them.
KILN_ACTIVATION_FUNCTIONS(KILN_DETAIL_TENSOR_UNARY_FUNCTION)
#undef KILN_DETAIL_TENSOR_UNARY_FUNCTION

/// `kiln::gelu(x)`: the Gaussian error linear unit, `x * Phi(x)`; `kiln::gelu(x, true)`
/// uses the tanh approximation (`tf.nn.gelu(x, approximate=True)`).
/// \code kiln::gelu(kiln::constant({-1.f, 0.f, 1.f})); // [-0.158655 0 0.841345] \endcode
template <class = void>
tensor gelu(const tensor& x, bool approximate = false) { return detail::apply(ops::gelu(approximate), x); }

/// `kiln::elu(x, alpha = 1)`: x where positive, else `alpha * (exp(x) - 1)`.
template <class = void>
tensor elu(const tensor& x, double alpha = 1.0) { return detail::apply(ops::elu(alpha), x); }

/// `kiln::leaky_relu(x, alpha = 0.3)`: x where positive, else `alpha * x` (Keras'
/// default slope; `tf.nn.leaky_relu`'s is 0.2).
/// \code kiln::leaky_relu(kiln::constant({-2.f, 3.f})); // [-0.6 3] \endcode
template <class = void>
tensor leaky_relu(const tensor& x, double alpha = 0.3) { return detail::apply(ops::leaky_relu(alpha), x); }

}  // namespace kiln
// ----- end kiln/ops/activations.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_ACTIVATIONS_HPP

namespace kiln {
namespace typed {

/// Whether an op on `X...` (typed operands and C++ scalars) computes at once.
template <class... X>
inline constexpr bool eager = ((!lazy<X>) && ...);

/// The element type of a typed operand.
template <class X>
struct element_of {
  using type = void;
};
template <operand X>
struct element_of<X> {
  using type = typename std::remove_cvref_t<X>::value_type;
};

/// The element type a C++ scalar among `X...` is converted to: the first typed
/// operand's (for `where`, the first branch's).
template <class... X>
struct promoted {
  using type = void;
};
template <class X, class... Rest>
struct promoted<X, Rest...> {
  using type = std::conditional_t<operand<X>, typename element_of<X>::type, typename promoted<Rest...>::type>;
};

/// Operand `x` of an op as an expression: a `fixed` is read where it is (eager) or
/// kept by value (captured by a trace), a C++ scalar becomes a `T`, an expression is
/// itself (a reference: the caller copies it where it keeps it).
template <class T, bool Eager, class X>
decltype(auto) expression_of(const X& x) {
  using V = std::remove_cvref_t<X>;
  if constexpr (fixed_value<V>) {
    using D = typename V::dims_type;
    if constexpr (Eager)
      return data_leaf<typename V::value_type, D>{{}, x.data()};
    else
      return constant_leaf<typename V::value_type, D>{{}, std::make_shared<const V>(x)};
  } else if constexpr (lazy<V>) {
    if constexpr (requires { x.expression(); })
      return x.expression();
    else
      return x;
  } else {
    return scalar_leaf<T>{{}, T(x)};
  }
}

/// ops::cast to `T`, with the target in its type, where the rules read it.
template <class T>
struct cast_to : ops::cast {
  constexpr cast_to() : ops::cast(dtype_of<T>) {}
};

/// `op` on typed operands and C++ scalars (converted to `T`): a `fixed` now, or an
/// expression.
template <class T, class Op, class... X>
auto apply_as(const Op& op, const X&... x) {
  constexpr bool now = eager<X...>;
  auto e = make_node(op, expression_of<T, now>(x)...);
  if constexpr (now && !std::is_same_v<decltype(e), rule_error>)
    return materialize(e);
  else
    return e;  // an expression, or the rule_error after the op's static_assert
}

template <class Op, class... X>
auto apply(const Op& op, const X&... x) {
  return apply_as<typename promoted<X...>::type>(op, x...);
}

/// The expression type of operand `X` (C++ scalars as `T`).
template <class T, class X>
using expression_t = std::remove_cvref_t<decltype(expression_of<T, true>(std::declval<const X&>()))>;

/// `Op`'s rules on operands `X...`, C++ scalars converted to `T`.
template <class T, class Op, class... X>
using rule_for = op_rule<made<Op>, expression_t<T, X>...>;

}  // namespace typed

// A typed op checks its operands with static_asserts whose messages name it (the
// first error line g++ prints); the operands' types, and so their dims, are in the
// "In instantiation of" lines just above.
#define KILN_TYPED_CHECKS(fn, rule, what)                                                          \
  static_assert(rule::dtypes.ok(), "kiln::" #fn ": the operands' element types are not ones this op takes"); \
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::" #fn ": " what)

namespace typed {

}  // namespace typed

/// Ops between a typed operand and a C++ scalar or another typed operand.
template <class X, class Y>
concept typed_operands = (typed::operand<X> && (typed::operand<Y> || std::is_arithmetic_v<Y>)) ||
                         (std::is_arithmetic_v<X> && typed::operand<Y>);

#define KILN_TYPED_UNARY(fn, op)                                                                     \
  template <typed::operand X>                                                                        \
  auto fn(const X& x) {                                                                              \
    using rule = typed::rule_for<void, ops::op, X>;                                                  \
    KILN_TYPED_CHECKS(fn, rule, "");                                                                 \
    return typed::apply(ops::op{}, x);                                                               \
  }
#define KILN_TYPED_BINARY(fn, op)                                                                    \
  template <class X, class Y>                                                                        \
    requires typed_operands<X, Y>                                                                    \
  auto fn(const X& x, const Y& y) {                                                                  \
    using rule = typed::rule_for<typename typed::promoted<X, Y>::type, ops::op, X, Y>;               \
    KILN_TYPED_CHECKS(fn, rule, "the operands' shapes do not broadcast");                            \
    return typed::apply(ops::op{}, x, y);                                                            \
  }

// The functions of the one op list (kiln/ops/op_list.hpp, where they are documented).
KILN_UNARY_FUNCTIONS(KILN_TYPED_UNARY)
KILN_BINARY_FUNCTIONS(KILN_TYPED_BINARY)
#undef KILN_TYPED_UNARY
#undef KILN_TYPED_BINARY
#undef KILN_TYPED_CHECKS

/// `kiln::gelu(x, approximate)` on a typed operand.
template <typed::operand X>
auto gelu(const X& x, bool approximate = false) {
  using rule = typed::rule_for<void, ops::gelu, X>;
  static_assert(rule::dtypes.ok(), "kiln::gelu: the operand's element type must be float or double");
  return typed::apply(ops::gelu(approximate), x);
}
/// `kiln::elu(x, alpha)` on a typed operand.
template <typed::operand X>
auto elu(const X& x, double alpha = 1.0) {
  using rule = typed::rule_for<void, ops::elu, X>;
  static_assert(rule::dtypes.ok(), "kiln::elu: the operand's element type must be float or double");
  return typed::apply(ops::elu(alpha), x);
}
/// `kiln::leaky_relu(x, alpha)` on a typed operand.
template <typed::operand X>
auto leaky_relu(const X& x, double alpha = 0.3) {
  using rule = typed::rule_for<void, ops::leaky_relu, X>;
  static_assert(rule::dtypes.ok(), "kiln::leaky_relu: the operand's element type must be float or double");
  return typed::apply(ops::leaky_relu(alpha), x);
}

/// `kiln::where(x > 0.f, x, 0.f)` on typed operands: `a` where `cond` holds, else `b`.
template <typed::operand C, class A, class B>
  requires(typed::operand<A> || typed::operand<B>)
auto where(const C& cond, const A& a, const B& b) {
  using T = typename typed::promoted<A, B>::type;
  using rule = typed::rule_for<T, ops::where, C, A, B>;
  static_assert(rule::dtypes.ok(), "kiln::where: the condition must hold bools and both branches one element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::where: the operands' shapes do not broadcast");
  return typed::apply_as<T>(ops::where{}, cond, a, b);
}

/// `kiln::cast<double>(x)`: a typed operand's elements converted to `T`.
template <class T, typed::operand X>
auto cast(const X& x) {
  static_assert(typed::element_type<T>, "kiln::cast: the target type must be bool, std::int32_t, std::int64_t, float or double");
  return typed::apply(typed::cast_to<T>{}, x);
}

template <typed::operand X>
auto operator-(const X& x) {
  return negative(x);
}

#define KILN_TYPED_OPERATOR(sym, fn)                                                   \
  template <class X, class Y>                                                          \
    requires typed_operands<X, Y>                                                      \
  auto operator sym(const X& x, const Y& y) {                                          \
    return fn(x, y);                                                                   \
  }
KILN_OPERATORS(KILN_TYPED_OPERATOR)
#undef KILN_TYPED_OPERATOR

}  // namespace kiln
// ----- end kiln/typed/ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_OPS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_TRACE_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_TRACE_HPP
// ----- begin kiln/typed/trace.hpp -----
/// \file
/// Typed traces: how kiln::function runs a callable called with `fixed` arguments.
///
/// The callable runs once per signature *type* (and per value of its C++ arguments)
/// with `symbol`s, symbolic values whose types carry the element type and dims. Ops
/// on them build expression types (kiln/typed/expr.hpp), so what the callable returns
/// is its typed graph. Whatever needs a value in the middle (a symbol assigned an
/// expression, `y = y * 2.f`) ends a fused expression: the trace records a step,
/// one fused loop compiled from the expression's type, that writes a slot of the
/// trace's frame. A call runs the steps in order, then the returned expression,
/// straight into the result: a callable that is one expression is one inlined loop.
///
/// Each signature type has a slot in its function's trace table, found by an index
/// fixed when the program starts, so a later call costs one atomic load, not a lookup.

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_RESULTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_RESULTS_HPP
// ----- begin kiln/core/results.hpp -----
/// \file
/// What traced code gives back, in both tiers alike: the structure of a function's
/// result (`detail::output_of`, each tier saying what its leaves become) and what a
/// loop body returns to stop early (`break_result`, made by kiln::break_if).

#include <array>
#include <cstddef>
#include <tuple>
#include <utility>
#include <vector>

namespace kiln {

class tensor;

/// What a loop body returns to stop early (kiln::break_if): the condition `stop`, a
/// bool scalar kiln::tensor or typed operand, and the values to go on with.
template <class Tuple, class Stop = tensor>
struct break_result {
  Stop stop;
  Tuple next;
};

namespace detail {

/// The type a function gives back for what its traced code returned, `R`: each leaf
/// `L` as `Leaf<L>::type` (kiln::tensor for the runtime tier, kiln::fixed for the
/// typed tier's expressions), tuples, pairs, arrays and vectors keeping their structure.
template <template <class> class Leaf, class R>
struct output_of {
  using type = typename Leaf<R>::type;
};
template <template <class> class Leaf, class... Ts>
struct output_of<Leaf, std::tuple<Ts...>> {
  using type = std::tuple<typename output_of<Leaf, Ts>::type...>;
};
template <template <class> class Leaf, class A, class B>
struct output_of<Leaf, std::pair<A, B>> {
  using type = std::pair<typename output_of<Leaf, A>::type, typename output_of<Leaf, B>::type>;
};
template <template <class> class Leaf, class T, std::size_t N>
struct output_of<Leaf, std::array<T, N>> {
  using type = std::array<typename output_of<Leaf, T>::type, N>;
};
template <template <class> class Leaf, class T, class A>
struct output_of<Leaf, std::vector<T, A>> {
  using type = std::vector<typename output_of<Leaf, T>::type>;
};

}  // namespace detail
}  // namespace kiln
// ----- end kiln/core/results.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_RESULTS_HPP

namespace kiln {
namespace detail {
template <class>
struct basic_function_state;
using function_state = basic_function_state<void>;
}  // namespace detail
namespace typed {

template <class>
class basic_graph_writer;
using graph_writer = basic_graph_writer<void>;

/// A recorded step: `run(data, frame)` writes one slot of the frame; `describe(data,
/// sink)` adds the step to a graph. It owns its data through a plain deleter, not a
/// shared_ptr, whose control block would be compiled once per step type.
struct step {
  void (*run)(const void* data, frame f);
  std::unique_ptr<const void, void (*)(const void*)> data;
  void (*describe)(const void* data, description_sink& sink);
};

/// The step that runs `data` with `Step::run`.
template <class Step>
step step_of(std::unique_ptr<Step> data) {
  using S = std::remove_const_t<Step>;
  return {&S::run, {data.release(), [](const void* p) { delete static_cast<const S*>(p); }}, &S::describe};
}

/// The nodes of slots `slots` in `sink`, read as values of the `fixed` types `V...`.
template <class... V>
std::array<int, sizeof...(V)> slot_values(description_sink& sink, const std::array<int, sizeof...(V)>& slots) {
  std::size_t k = 0;
  return {sink.value(slots[k++], V::dims_type::values)...};  // braces: in order
}

/// A slot that reads a value in place (a fixed_variable's), to be given a copy of it
/// before something overwrites it: while slot `bound` points at `storage`, the value
/// is copied to slot `copy` and `bound` pointed there.
struct redirect {
  int bound, copy;
  const void* storage;
  std::size_t bytes;
};

/// Keeps the values that the slots of `redirects` read in place, before a step
/// overwrites them. A frame is built writable (trace::run): a read in place is a step
/// that points its slot at the value, so the frame's pointers change as steps run.
KILN_LIBRARY_INLINE void keep_values_read_in_place(const std::vector<redirect>& redirects, frame f);

/// What a trace being recorded collects: the slots of its frame (its arguments
/// first) and its steps, in program order.
struct recorder {
  std::vector<std::size_t> slot_bytes;
  std::vector<step> steps;
  std::vector<std::string> argument_names;  ///< as the function's signature names them
  /// Where steps go: the trace's own list, or a branch's or loop body's while it is
  /// traced.
  std::vector<step>* target = &steps;
  /// The reads in place recorded so far (of the variable whose state is at `owner`),
  /// which a later write must not change under the steps that use them.
  struct read_in_place {
    const void* owner;
    int slot;
    const void* storage;
    std::size_t bytes;
    bool top_level;  ///< in the trace's own steps, which run once per call
  };
  std::vector<read_in_place> reads_in_place;

  KILN_LIBRARY_INLINE int add_slot(std::size_t bytes);
  KILN_LIBRARY_INLINE void push(step s);
  /// Records that slot `slot` reads the `bytes` at `storage` in place (the value of
  /// the variable whose state is at `owner`).
  KILN_LIBRARY_INLINE void add_read_in_place(const void* owner, int slot, const void* storage, std::size_t bytes);
  /// The redirects a step that overwrites the value of the variable at `owner` (of
  /// any variable, when null) runs first, with a slot each for the copies. A read of
  /// the trace's own steps that a write of its own steps protects needs no later
  /// protection: it does not run again in the call.
  KILN_LIBRARY_INLINE std::vector<redirect> protect_reads_in_place(const void* owner);
  /// The recorder of the trace in progress on this thread, if any.
  KILN_LIBRARY_INLINE static recorder*& current();
};

/// A step that evaluates expressions of type `E` into slots, one after the other: an
/// evaluation chain. A rebinding loop (`for (...) y = y * 0.5f + x;`) assigns
/// expressions of one type in a row; their steps join the chain of the one before, so
/// that a call runs them as one loop, each value going from one assignment to the next
/// in a register (evaluate_chain), rather than one step and one pass over memory per
/// assignment.
template <class E>
struct evaluation {
  std::vector<chain_link<E>> links;
  static void run(const void* data, frame f) {
    const auto& self = *static_cast<const evaluation*>(data);
    if (self.links.size() == 1)
      evaluate(self.links[0].expression, f, static_cast<typename E::value_type*>(f[self.links[0].out]));
    else
      evaluate_chain<E>(self.links, f);
  }
  static void describe(const void* data, description_sink& sink) {
    for (const chain_link<E>& l : static_cast<const evaluation*>(data)->links) sink.bind(l.out, l.expression.describe(sink));
  }
  /// Whether `e`, written to `out`, may join the chain: `out` is no slot the chain
  /// writes or reads, and `e` reads none the chain writes through a broadcast (which
  /// reads other positions than the one being computed).
  bool takes(const E& e, int out) const {
    bool fits = true;
    for (const chain_link<E>& l : links) {
      if (l.out == out) return false;
      l.expression.visit_slots([&](int slot, bool) { fits = fits && slot != out; }, false);
      e.visit_slots([&](int slot, bool broadcast) { fits = fits && !(broadcast && slot == l.out); }, false);
    }
    return fits;
  }
};

/// The recorder of the trace in progress, or the error for a symbolic value used
/// outside its trace.
KILN_LIBRARY_INLINE recorder& current_recorder();

/// Records a step writing `e` to slot `slot`: a link added to the evaluation chain of
/// the step before when that one evaluates expressions of the same type and takes it.
template <class E>
void record_into(const E& e, int slot) {
  recorder& r = current_recorder();
  if (!r.target->empty() && r.target->back().run == &evaluation<E>::run) {
    // The chain was made here, not const: it may grow while its trace is recorded.
    auto& chain = *const_cast<evaluation<E>*>(static_cast<const evaluation<E>*>(r.target->back().data.get()));
    if (chain.takes(e, slot)) {
      chain.links.push_back({e, slot});  // the one copy of `e`
      return;
    }
  }
  auto chain = std::make_unique<evaluation<E>>();
  chain->links.push_back({e, slot});
  r.push(step_of(std::move(chain)));
}

/// The bytes of a value of typed operand type `X` (a slot's size).
template <class X>
inline constexpr std::size_t bytes_of = sizeof(typename X::value_type) * std::size_t(X::dims_type::size);

/// Records a step writing `e` to a new slot, and returns the slot.
template <class E>
int record(const E& e) {
  const int slot = current_recorder().add_slot(bytes_of<E>);
  record_into(e, slot);
  return slot;
}

/// A symbolic value of the compile-time tier: what a callable traced with a
/// `fixed<T, Dims...>` argument receives, and what an expression becomes when it is
/// assigned (`decltype(x) y = x * 2.f;`, `y = y * y;`): a slot of the trace's frame.
/// \code kiln::function f([](auto x) { auto y = x; for (int i = 0; i < 3; ++i) y = y * x; return y; }); \endcode
template <class T, class D>
class symbol : public typed_expression {
 public:
  using value_type = T;
  using dims_type = D;
  static constexpr bool simd = simd_type<T>;

  /// The value in slot `slot` of the frame (an argument).
  explicit symbol(int slot) : slot_(slot) {}
  /// The value of expression `e`, computed at this point of the trace.
  template <lazy E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, symbol>)
  symbol(const E& e) : slot_(record(checked(expression_of<T, false>(e)))) {}
  /// A constant.
  symbol(const fixed_t<T, D>& value) : symbol(constant_leaf<T, D>{{}, std::make_shared<const fixed_t<T, D>>(value)}) {}

  symbol(const symbol&) = default;
  symbol& operator=(const symbol&) = default;
  /// Rebinds to the value of `e`: `y = y * 2.f;`.
  template <class E>
    requires(lazy<E> || fixed_value<E>)
  symbol& operator=(const E& e) {
    return *this = symbol(e);
  }

  slot_leaf<T, D> expression() const { return {{}, slot_}; }
  int slot() const { return slot_; }

  /// As TensorFlow prints a tensor while tracing: `Tensor("a:0", shape=(3,),
  /// dtype=int32)`, named after its argument (or its slot, for a step's result).
  friend std::ostream& operator<<(std::ostream& os, const symbol& x) {
    const recorder* r = recorder::current();
    const std::string name = r && std::size_t(x.slot_) < r->argument_names.size() ? r->argument_names[std::size_t(x.slot_)]
                                                                                   : "value_" + std::to_string(x.slot_);
    return os << "Tensor(\"" << name << ":0\", shape=" << D::shape() << ", dtype=" << dtype_of<T> << ")";
  }

 private:
  template <class E>
  static const E& checked(const E& e) {
    static_assert(std::is_same_v<typename E::value_type, T> && std::is_same_v<typename E::dims_type, D>,
                  "kiln: a symbolic value keeps its element type and dims; assign it an expression of the same type "
                  "(kiln::cast or kiln::reshape change them)");
    return e;
  }

  int slot_;
};

template <class V>
struct is_symbol : std::false_type {};
template <class T, class D>
struct is_symbol<symbol<T, D>> : std::true_type {};

/// The symbol a traced `fixed` argument becomes.
template <class X>
using symbol_for = symbol<typename X::value_type, typename X::dims_type>;

// ---- signatures --------------------------------------------------------------------

/// C++ values a typed call keys by value: arithmetic values, enums and strings.
template <class X>
concept key_value = std::is_arithmetic_v<std::remove_cvref_t<X>> || std::is_enum_v<std::remove_cvref_t<X>> ||
                    std::is_same_v<std::remove_cvref_t<X>, std::string>;

template <class X>
struct is_spec : std::false_type {};
template <class T, std::int64_t... D>
struct is_spec<spec<T, D...>> : std::true_type {};

/// A `fixed` value, or its `spec` (for get_concrete_function).
template <class X>
concept typed_argument = fixed_value<X> || is_spec<std::remove_cvref_t<X>>::value;

/// Whether a call with `Args` runs in the compile-time tier: at least one `fixed`
/// argument, and otherwise only C++ values.
template <class... Args>
inline constexpr bool typed_call = (fixed_value<Args> || ...) && ((fixed_value<Args> || key_value<Args>) && ...);

/// Whether get_concrete_function with `Args` asks for a typed trace: `fixed` values or
/// specs, and otherwise only C++ values.
template <class... Args>
inline constexpr bool typed_request = (typed_argument<Args> || ...) && ((typed_argument<Args> || key_value<Args>) && ...);

/// The `fixed` type of a typed argument.
template <class X>
struct fixed_of {
  using type = std::remove_cvref_t<X>;
};
template <class T, std::int64_t... D>
struct fixed_of<spec<T, D...>> {
  using type = fixed<T, D...>;
};

/// What the callable receives for argument `X` while tracing.
template <class X>
struct traced {
  using type = std::remove_cvref_t<X>;
};
template <typed_argument X>
struct traced<X> {
  using type = symbol_for<typename fixed_of<std::remove_cvref_t<X>>::type>;
};
template <class X>
using traced_t = typename traced<X>::type;

/// The C++ values of a call, its key within the slot of its signature type.
template <class... Args>
using values_of = decltype(std::tuple_cat(std::declval<std::conditional_t<typed_argument<Args>, std::tuple<>, std::tuple<std::remove_cvref_t<Args>>>>()...));

template <class... Args>
values_of<Args...> values(const Args&... args) {
  return std::tuple_cat([](const auto& a) {
    if constexpr (typed_argument<decltype(a)>)
      return std::tuple<>();
    else
      return std::tuple<std::remove_cvref_t<decltype(a)>>(a);
  }(args)...);
}

// ---- signatures' text --------------------------------------------------------------

/// A value in a typed trace's signature: a typed argument's or result's dtype and
/// shape, or a C++ value (bound in the header: `power(a, b=3)`).
struct signature_leaf {
  bool typed = true;
  dtype type = int64;
  kiln::shape shape = {};
};

/// What a typed trace's signature type says, made at compile time, one per type: a
/// trace records where it is, and the text is written only where a program shows it.
struct signature_type {
  std::span<const signature_leaf> arguments;  ///< one per argument
  std::span<const signature_leaf> outputs;    ///< none for `void`
  /// Writes the outputs' structure (`(<1>, <2>)`), empty for one output or none.
  std::string (*output_structure)();
};

/// A typed trace's signature: its type, and the text of its C++ values (per argument;
/// empty when it has none).
struct recorded_signature {
  const signature_type* type = nullptr;
  std::vector<std::string> bound_text;
};

// An argument's leaf, or a result's.
template <class X>
constexpr signature_leaf argument_leaf() {
  using V = std::remove_cvref_t<X>;
  if constexpr (typed_argument<V>) {
    using F = typename fixed_of<V>::type;
    return {true, dtype_of<typename F::value_type>, F::dims_type::shape()};
  } else {
    return {false};
  }
}
template <class X>
constexpr signature_leaf result_leaf() {
  using V = std::remove_cvref_t<X>;
  if constexpr (lazy<V> || fixed_value<V>)
    return {true, dtype_of<typename V::value_type>, V::dims_type::shape()};
  else if constexpr (has_dtype<V>)
    return {true, dtype_of<V>};
  else
    return {true, int64};  // as the runtime tier returns a C++ value it cannot name
}

// Writes the leaves of a traced result `R` from `next`, unless it is null, in order
// (none for `void`, a tuple's in turn), and says how many there are.
template <class R>
constexpr std::size_t put_outputs(signature_leaf* next) {
  using V = std::remove_cvref_t<R>;
  if constexpr (std::is_void_v<V>) {
    return 0;
  } else if constexpr (!lazy<V> && !fixed_value<V> && requires { std::tuple_size<V>::value; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      std::size_t n = 0;
      ((n += put_outputs<std::tuple_element_t<I, V>>(next ? next + n : nullptr)), ...);
      return n;
    }(std::make_index_sequence<std::tuple_size_v<V>>());
  } else {
    if (next) *next = result_leaf<V>();
    return 1;
  }
}
// Writes the structure of the leaves put_outputs finds in `R` (a std::array as a list).
template <class R>
void describe_outputs(detail::structure_text& s) {
  using V = std::remove_cvref_t<R>;
  if constexpr (!lazy<V> && !fixed_value<V> && requires { std::tuple_size<V>::value; }) {
    constexpr std::size_t n = std::tuple_size_v<V>;
    constexpr bool list = requires { typename V::iterator; };  // std::array
    s.open(list);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((I > 0 ? s.next() : void(), describe_outputs<std::tuple_element_t<I, V>>(s)), ...);
    }(std::make_index_sequence<n>());
    s.close(list, n);
  } else if constexpr (!std::is_void_v<V>) {
    s.leaf();
  }
}
template <class R>
std::string output_structure() {
  detail::structure_text s;
  describe_outputs<R>(s);
  return s.leaves == 1 && s.text == "<1>" ? std::string() : s.text;
}

template <class R>
inline constexpr auto output_leaves = [] {
  std::array<signature_leaf, put_outputs<R>(nullptr)> leaves{};
  put_outputs<R>(leaves.data());
  return leaves;
}();
template <class... Args>
inline constexpr std::array<signature_leaf, sizeof...(Args)> argument_leaves{argument_leaf<Args>()...};

/// The signature type of a typed trace of `Args` that returns `R`.
template <class R, class... Args>
inline constexpr signature_type signature_type_of{argument_leaves<Args...>, output_leaves<R>, &output_structure<R>};

/// Typed trace signature `s` of the function whose state is `state`, written out
/// (defined with the typed tier's calls, kiln/typed/function_calls.hpp).
template <class = void>
detail::trace_signature written(const detail::function_state& state, const recorded_signature& s);

// ---- results -----------------------------------------------------------------------

/// A leaf of what a call returns for the traced result: a `fixed` value for an
/// expression; C++ values and `fixed` constants come back as they are. Tuples and pairs
/// keep their structure (detail::output_of).
template <class R>
struct output_leaf {
  using type = R;
};
template <lazy R>
struct output_leaf<R> {
  using type = fixed_t<typename R::value_type, typename R::dims_type>;
};
template <class R>
using output_t = typename detail::output_of<output_leaf, std::remove_cvref_t<R>>::type;

template <class R>
output_t<R> evaluate_output(const R& r, frame f) {
  if constexpr (lazy<R>) {
    if constexpr (requires { r.expression(); })
      return materialize(r.expression(), f);
    else
      return materialize(r, f);  // in place: an expression can be large
  } else if constexpr (requires { std::tuple_size<R>::value; } && !std::is_array_v<R>) {
    return std::apply([&](const auto&... e) { return output_t<R>(evaluate_output(e, f)...); }, r);
  } else {
    return r;
  }
}

/// Calls `fn` with `recorder` current; restores the previous one (a typed trace may
/// run inside another).
template <class Fn>
decltype(auto) with_recorder(recorder& r, Fn&& fn) {
  struct restore {
    recorder* previous;
    ~restore() { recorder::current() = previous; }
  } guard{std::exchange(recorder::current(), &r)};
  return fn();
}

/// One typed trace: its steps, the size of its frame, and the expression(s) it
/// returns (`R`; none for `void`).
template <class R>
struct trace {
  using stored = std::conditional_t<std::is_void_v<R>, std::tuple<>, R>;
  std::vector<step> steps;
  std::vector<std::size_t> offsets;  ///< each non-argument slot's place in the workspace
  int arguments = 0;
  std::size_t workspace_bytes = 0;
  std::optional<stored> result;
  recorded_signature signature;
  std::vector<std::string> argument_names;  ///< of its typed arguments, for graph()

  /// Runs the trace on the data of its arguments.
  template <std::size_t N>
  output_t<stored> run(const std::array<void*, N>& args) const {
    const std::size_t slots = std::size_t(arguments) + offsets.size();
    // One expression: no frame to build. Steps run even when they add no slot (a print
    // of an argument).
    if (steps.empty()) return evaluate_output(*result, args.data());
    constexpr std::size_t local_slots = 64, local_bytes = 4096;
    std::array<void*, local_slots> local_frame;
    std::unique_ptr<void*[]> heap_frame;
    void** f = local_frame.data();
    if (slots > local_slots) f = (heap_frame.reset(new void*[slots]), heap_frame.get());
    alignas(64) std::byte local[local_bytes];
    // From the C library, which keeps a freed block for the next call too, not the
    // caching allocator: a program that makes no large `fixed` value then does not
    // compile the cache.
    struct heap_workspace {
      std::size_t bytes;
      void* p = bytes ? ::operator new(bytes, std::align_val_t(buffer_alignment)) : nullptr;
      ~heap_workspace() {
        if (p) ::operator delete(p, std::align_val_t(buffer_alignment));
      }
    } heap{workspace_bytes > local_bytes ? workspace_bytes : 0};
    std::byte* workspace = heap.p ? static_cast<std::byte*>(heap.p) : local;
    std::copy(args.begin(), args.end(), f);
    for (std::size_t i = 0; i < offsets.size(); ++i) f[std::size_t(arguments) + i] = workspace + offsets[i];
    for (const step& s : steps) s.run(s.data.get(), f);
    return evaluate_output(*result, f);
  }
};

/// Traces `fn` for `args` (fixed values or specs, and C++ values); `names` names the
/// typed arguments, in order, for printing.
template <class R, class F, class... Args>
std::unique_ptr<trace<R>> trace_now(F& fn, std::vector<std::string> names, const Args&... args) {
  recorder rec;
  rec.argument_names = std::move(names);
  int slot = 0;
  auto arg = [&](const auto& a) -> traced_t<decltype(a)> {
    if constexpr (typed_argument<decltype(a)>) {
      rec.add_slot(0);  // arguments live in the caller's values
      return traced_t<decltype(a)>(slot++);
    } else {
      return a;
    }
  };
  // Braces: the arguments take their slots from left to right.
  std::tuple<traced_t<Args>...> traced_args{arg(args)...};
  auto t = std::make_unique<trace<R>>();
  if constexpr (std::is_void_v<R>) {
    with_recorder(rec, [&] { std::apply(fn, traced_args); });
    t->result.emplace();
  } else {
    t->result.emplace(with_recorder(rec, [&]() -> R { return std::apply(fn, traced_args); }));
  }
  t->arguments = slot;
  for (std::size_t i = std::size_t(slot); i < rec.slot_bytes.size(); ++i) {
    t->offsets.push_back(t->workspace_bytes);
    t->workspace_bytes += (rec.slot_bytes[i] + 63) / 64 * 64;
  }
  t->steps = std::move(rec.steps);
  t->argument_names = std::move(rec.argument_names);
  return t;
}

/// A typed trace as a concrete function: called with the `fixed` values its signature
/// takes (its C++ values are bound), printed as `ConcreteFunction` and its signature.
/// \code
/// kiln::function f([](const auto& x) { return x + x; });
/// auto c = f.get_concrete_function(kiln::spec<float, 3>{});
/// kiln::fixed<float, 3> y = c(kiln::fixed<float, 3>::ones());
/// \endcode
template <class R, class... Fixed>
class concrete_function {
 public:
  concrete_function(const trace<R>* t, std::shared_ptr<const detail::function_state> owner)
      : trace_(t), owner_(std::move(owner)) {}
  auto operator()(const Fixed&... args) const {
    return trace_->run(std::array<void*, sizeof...(Fixed)>{const_cast<void*>(static_cast<const void*>(args.data()))...});
  }
  friend std::ostream& operator<<(std::ostream& os, const concrete_function& c) {
    return os << "ConcreteFunction " << written(*c.owner_, c.trace_->signature).signature_text();
  }
  /// The signature in TensorFlow's format, without a newline at the end, as
  /// TensorFlow's `pretty_printed_signature()`.
  /// \code
  /// kiln::function f([](const auto& x) { return x + x; });
  /// std::cout << f.get_concrete_function(kiln::spec<float, 3>{}).pretty_printed_signature();
  /// \endcode
  std::string pretty_printed_signature() const {
    std::string text = written(*owner_, trace_->signature).signature_text();
    text.pop_back();
    return text;
  }
  /// The trace as a kiln::graph, as the runtime tier traces it from the same callable:
  /// placeholders, ops, `cond` and `while` nodes with their branches and bodies,
  /// effects, and an Identity per output. It needs the runtime tier (kiln/kiln.hpp).
  /// \code
  /// kiln::function f([](const auto& x) { return x + x; });
  /// const kiln::graph g = f.get_concrete_function(kiln::spec<float, 3>{}).graph();  // a value
  /// for (const auto& n : g.nodes()) std::cout << n.op() << "\n";  // Placeholder, add, Identity
  /// \endcode
  template <class Writer = graph_writer>
  auto graph() const {
    if constexpr (requires { sizeof(Writer); })
      return Writer::template graph_of<Fixed...>(*trace_);
    else
      static_assert(always_false<Writer>, "kiln: graph() of a typed trace needs the runtime tier; include <kiln/kiln.hpp>");
  }
  /// graph() in Graphviz's dot language.
  template <class Writer = graph_writer>
  std::string to_dot() const {
    return graph<Writer>().to_dot();
  }

 private:
  const trace<R>* trace_;
  std::shared_ptr<const detail::function_state> owner_;  // the function's traces and options
};

/// The typed::concrete_function of a request with `Args`: its `fixed` argument types.
template <class R, class... Args>
struct concrete_for {
  template <class... F>
  static concrete_function<R, F...> make(std::tuple<F...>*);
  using fixed_arguments = decltype(std::tuple_cat(
      std::declval<std::conditional_t<typed_argument<Args>, std::tuple<typename fixed_of<std::remove_cvref_t<Args>>::type>,
                                       std::tuple<>>>()...));
  using type = decltype(make(static_cast<fixed_arguments*>(nullptr)));
};

// ---- the table of a function's traces ----------------------------------------------

/// A process-wide index per signature type, fixed when the program starts.
KILN_LIBRARY_INLINE std::size_t next_signature_index();
template <class Signature>
inline const std::size_t signature_index = next_signature_index();

/// The traces of one signature type, by the values of its C++ arguments.
template <class R, class Values>
struct signature_traces {
  std::mutex mutex;  // guards by_value
  std::atomic<const trace<R>*> only{nullptr};  // the trace of a signature without C++ values
  std::vector<std::pair<Values, std::unique_ptr<trace<R>>>> by_value;
  std::unique_ptr<trace<R>> only_owner;
};

/// A function's typed traces: one slot per signature type, found by its index.
class trace_table {
 public:
  /// The traces of signature type `Sig`, made on first use.
  template <class Sig, class Entry>
  Entry& entry() {
    const std::size_t i = signature_index<Sig>;
    if (i < direct) {
      if (void* e = direct_[i].load(std::memory_order_acquire)) return *static_cast<Entry*>(e);
    }
    std::lock_guard lock(mutex_);
    for (auto& [index, e] : entries_)
      if (index == i) return *static_cast<Entry*>(e.get());
    entries_.emplace_back(i, owned_entry(new Entry, [](void* e) { delete static_cast<Entry*>(e); }));
    void* e = entries_.back().second.get();
    if (i < direct) direct_[i].store(e, std::memory_order_release);
    return *static_cast<Entry*>(e);
  }

  /// One typed trace at a time (a trace of one function may call another).
  std::recursive_mutex tracing;

 private:
  static constexpr std::size_t direct = 32;
  std::array<std::atomic<void*>, direct> direct_{};
  mutable std::mutex mutex_;
  using owned_entry = std::unique_ptr<void, void (*)(void*)>;
  std::vector<std::pair<std::size_t, owned_entry>> entries_;
};

}  // namespace typed
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE void keep_values_read_in_place(const std::vector<redirect>& redirects, frame f) {
  void** slots = const_cast<void**>(f);
  for (const redirect& r : redirects)
    if (slots[r.bound] == r.storage) {
      std::memcpy(slots[r.copy], r.storage, r.bytes);
      slots[r.bound] = slots[r.copy];
    }
}

KILN_LIBRARY_INLINE int recorder::add_slot(std::size_t bytes) {
  slot_bytes.push_back(bytes);
  return int(slot_bytes.size()) - 1;
}

KILN_LIBRARY_INLINE void recorder::push(step s) { target->push_back(std::move(s)); }

KILN_LIBRARY_INLINE void recorder::add_read_in_place(const void* owner, int slot, const void* storage,
                                                     std::size_t bytes) {
  reads_in_place.push_back({owner, slot, storage, bytes, target == &steps});
}

KILN_LIBRARY_INLINE std::vector<redirect> recorder::protect_reads_in_place(const void* owner) {
  std::vector<redirect> out;
  const bool top = target == &steps;
  std::erase_if(reads_in_place, [&](const read_in_place& r) {
    if (owner && r.owner != owner) return false;
    out.push_back({r.slot, add_slot(r.bytes), r.storage, r.bytes});
    return top && r.top_level;
  });
  return out;
}

KILN_LIBRARY_INLINE recorder*& recorder::current() {
  thread_local recorder* r = nullptr;
  return r;
}

KILN_LIBRARY_INLINE recorder& current_recorder() {
  recorder* r = recorder::current();
  if (!r)
    throw type_error(
        "kiln: a symbolic typed value was used outside the trace that made it; return it from the function instead");
  return *r;
}

KILN_LIBRARY_INLINE std::size_t next_signature_index() {
  static std::atomic<std::size_t> next{0};
  return next++;
}

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/typed/trace.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_TRACE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_UNFUSED_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_UNFUSED_OPS_HPP
// ----- begin kiln/typed/unfused_ops.hpp -----
/// \file
/// The typed ops that end a fused expression, unfused: reductions (axes as template
/// arguments), matmul, conv2d, transpose, reshape, slice, gather, concat and stack (the
/// elementwise ops, which fuse, are kiln/typed/ops.hpp). Each runs the CPU backend's kernel for its one
/// element type, so its values are the eager kiln::tensor's bits, and its result's
/// type comes from the op's constexpr shape rule. On `fixed` values an op computes
/// at once; in a typed trace it is a step that reads its operands' slots (an
/// operand expression is evaluated into a slot first) and writes a new one.

#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_CONV2D_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_CONV2D_HPP
// ----- begin kiln/backend/cpu/conv2d.hpp -----
/// \file
/// 2-D convolution (cross-correlation, as TensorFlow's conv2d) on the CPU for NHWC
/// images and HWIO filters, as an implicit GEMM: output pixels are the rows of A, the
/// filter is B (k = kh, kw, in_c in that order, exactly HWIO's layout) and the
/// micro-kernels of gemm.hpp read each pixel's window straight from the image, with no
/// im2col buffer. For one kh the window row (fw pixels x in_c channels) is contiguous
/// in NHWC, so a pixel needs fh pointers; only windows that cross the border are copied
/// (zero-padded) to a small per-thread buffer.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>


#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_GEMM_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_GEMM_HPP
// ----- begin kiln/backend/cpu/gemm.hpp -----
/// \file
/// Dense matrix product on the CPU, C = A * B, for row-major float, double, int32 and
/// int64 matrices. Register-tiled xsimd micro-kernels (12 rows x 2 vectors of columns
/// on AVX-512) read A in place; large products pack cache-sized blocks of B, shared by
/// kiln's thread pool, while small ones read B in place too, so that a 10x10 product
/// takes about 100 ns. Integer products wrap modulo 2^bits (they are computed in the
/// unsigned twin type), so overflow is never undefined behaviour.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>



namespace kiln::backend::cpu {
namespace detail {

/// The type a product of `T`s is computed in: `T` itself for floating point, the
/// unsigned twin for integers so that overflow wraps. Both share size and
/// representation, and a signed object may be accessed through its unsigned twin.
template <class T>
using gemm_compute_t =
    typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::type_identity<T>>::type;

/// Whether the GEMM and convolution kernels take elements of type `T`: float, double
/// and 32- or 64-bit integers (narrower ones would promote to int and could overflow).
template <class T>
inline constexpr bool is_kernel_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (std::is_integral_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8));

/// Register tile and cache blocks of the micro-kernels for compute type `V`.
/// A tile is `rows` rows of C by `vectors` SIMD vectors of columns; its accumulators
/// (`rows * vectors` registers) must fit the register file with room for the B row
/// and the broadcast A value. A packed B panel (`depth x cols`, KC x NR) is reused by
/// the row tiles of a `row_block x depth` block of A (MC x KC, read in place) that
/// stays in L2; `col_block` (NC) bounds the packed block of B that all threads share.
/// The sizes were tuned against OpenBLAS on AVX-512.
template <class V>
struct gemm_blocking {
  using batch = xsimd::batch<V>;
  static constexpr int width = int(batch::size);
  static constexpr bool wide_registers = sizeof(batch) >= 64;  // AVX-512: 32 registers
  static constexpr int vectors = 2;
  static constexpr int rows = wide_registers ? 12 : 6;
  static constexpr int cols = vectors * width;
  static constexpr std::int64_t depth = 512;
  static constexpr std::int64_t row_block = 48;
  static constexpr std::int64_t col_block = 1024;
};

/// Up to this many multiply-adds (m * n * k) a product reads B in place instead of
/// packing it.
inline constexpr double gemm_direct_work = 256.0 * 256 * 256;
/// Below this many multiply-adds a product runs on the calling thread alone: waking
/// the pool costs more than it saves.
inline constexpr double gemm_parallel_work = 128.0 * 128 * 128;

/// Buffers of `thread_scratch` that can be live at the same time on one thread.
enum class scratch_slot : int { gemm_b, gemm_edge, conv_filter, conv_pointers, conv_rows, count };

/// A reusable block of at least `bytes` bytes, aligned to `kiln::buffer_alignment`,
/// owned by the calling thread: it grows when asked for more and is freed when the
/// thread ends, so steady-state calls allocate nothing.
/// \code
/// using namespace kiln::backend::cpu::detail;
/// float* panel = static_cast<float*>(thread_scratch(scratch_slot::gemm_b, 4096));
/// \endcode
inline void* thread_scratch(scratch_slot slot, std::size_t bytes) {
  struct block {
    void* data = nullptr;
    std::size_t bytes = 0;
    block() = default;
    block(const block&) = delete;
    block& operator=(const block&) = delete;
    ~block() { ::operator delete(data, std::align_val_t{buffer_alignment}); }
  };
  thread_local block blocks[int(scratch_slot::count)];
  block& b = blocks[int(slot)];
  if (b.bytes < bytes) {
    std::size_t grown = std::max(bytes, b.bytes + b.bytes / 2);
    grown = (grown + 4095) / 4096 * 4096;
    ::operator delete(b.data, std::align_val_t{buffer_alignment});
    b.data = nullptr;
    b.bytes = 0;
    b.data = ::operator new(grown, std::align_val_t{buffer_alignment});
    b.bytes = grown;
  }
  return b.data;
}

/// `scratch_slot` storage typed as `count` elements of `V`.
template <class V>
V* thread_scratch_as(scratch_slot slot, std::int64_t count) {
  return static_cast<V*>(thread_scratch(slot, std::size_t(std::max<std::int64_t>(count, 1)) * sizeof(V)));
}

/// Reads rows of A in place through one pointer per row (rows of a tile need not be
/// evenly spaced: edge tiles repeat their last row, convolutions point into images).
template <class V>
struct pointer_rows {
  const V* const* row;
  std::int64_t p = 0;
  KILN_ALWAYS_INLINE V at(int r) const { return row[r][p]; }
  KILN_ALWAYS_INLINE void advance() { ++p; }
};

/// Asks the cache for the line `bytes` past `p`. The address is formed as an integer
/// because it may lie past the end of the array, where pointer arithmetic is undefined;
/// a prefetch never faults.
KILN_ALWAYS_INLINE void prefetch_ahead(const void* p, std::ptrdiff_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + std::uintptr_t(bytes)));
}

/// How many rows of B ahead the micro-kernel prefetches: the hardware streamer alone
/// leaves the FMA units waiting on L2.
inline constexpr std::ptrdiff_t gemm_prefetch_rows = 32;

/// Adds A[Rows x kc] * B[kc x Vectors*width] to the accumulators `acc`. A is read
/// through `a` (`a.at(r)` is row r at the current k, `a.advance()` moves to the next
/// k; see pointer_rows), B row p starts at `b + p * ldb`.
template <int Rows, int Vectors, class V, class ARows>
KILN_ALWAYS_INLINE void multiply_tile(std::int64_t kc, ARows a, const V* KILN_RESTRICT b, std::int64_t ldb,
                                      xsimd::batch<V> (&acc)[Rows][Vectors]) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  for (std::int64_t p = 0; p < kc; ++p, b += ldb, a.advance()) {
    batch b_row[Vectors];
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) b_row[v] = batch::load_unaligned(b + v * width);
#pragma GCC unroll 8
    for (std::ptrdiff_t line = 0; line < std::ptrdiff_t(sizeof(b_row)); line += 64)
      prefetch_ahead(b, gemm_prefetch_rows * ldb * std::ptrdiff_t(sizeof(V)) + line);
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      const batch a_value(a.at(r));
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) acc[r][v] = math::multiply_add(a_value, b_row[v], acc[r][v]);
    }
  }
}

/// Zeroes a tile of accumulators.
template <int Rows, int Vectors, class V>
KILN_ALWAYS_INLINE void clear_tile(xsimd::batch<V> (&acc)[Rows][Vectors]) {
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) acc[r][v] = xsimd::batch<V>(V(0));
}

/// Writes the top-left `rows x cols` of a tile to C (row stride `ldc`), adding to what
/// is there when `accumulate`. Edge tiles use partial stores, so nothing outside C is
/// touched.
template <int Rows, int Vectors, class V>
KILN_ALWAYS_INLINE void store_tile(const xsimd::batch<V> (&acc)[Rows][Vectors], V* c, std::int64_t ldc,
                                   std::int64_t rows, std::int64_t cols, bool accumulate) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  constexpr int tile_cols = Vectors * width;
  if (rows == Rows && cols == tile_cols) {
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < Vectors; ++v) {
        V* dst = c + r * ldc + v * width;
        batch x = acc[r][v];
        if (accumulate) x += batch::load_unaligned(dst);
        x.store_unaligned(dst);
      }
    return;
  }
  // Indexing `acc` with a runtime row would make clang keep the whole tile in memory,
  // inside the k loop too; a copy indexed by constants avoids that.
  batch tile[Rows][Vectors];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < Vectors; ++v) tile[r][v] = acc[r][v];
  for (std::int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < Vectors; ++v) {
      const std::int64_t count = std::min<std::int64_t>(width, cols - v * width);
      if (count <= 0) break;
      V* dst = c + r * ldc + v * width;
      batch x = tile[r][v];
      if (accumulate) x += load_partial(dst, count);
      store_partial(x, dst, count);
    }
}

/// Copies columns [j0, j0 + cols) of a `kc`-row slice of B into `dst` as `kc x Cols`
/// rows, zero-filling the columns past `cols`.
template <int Cols, class V>
KILN_ALWAYS_INLINE void pack_b_panel(const V* b, std::int64_t ldb, std::int64_t kc, std::int64_t cols, V* dst) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  if (cols == Cols) {
    for (std::int64_t p = 0; p < kc; ++p, b += ldb, dst += Cols)
#pragma GCC unroll 8
      for (int v = 0; v < Cols / width; ++v) batch::load_unaligned(b + v * width).store_aligned(dst + v * width);
    return;
  }
  for (std::int64_t p = 0; p < kc; ++p, b += ldb, dst += Cols)
#pragma GCC unroll 8
    for (int v = 0; v < Cols / width; ++v)
      load_partial(b + v * width, std::clamp<std::int64_t>(cols - v * width, 0, width)).store_aligned(dst + v * width);
}

/// Packs a `kc x nc` block of B into panels of `gemm_blocking<V>::cols` columns,
/// panels [first, last) only (threads pack disjoint ranges of one shared block).
template <class V>
void pack_b(const V* b, std::int64_t ldb, std::int64_t kc, std::int64_t nc, std::int64_t first, std::int64_t last,
            V* dst) {
  constexpr int cols = gemm_blocking<V>::cols;
  for (std::int64_t panel = first; panel < last; ++panel) {
    const std::int64_t j = panel * cols;
    pack_b_panel<cols>(b + j, ldb, kc, std::min<std::int64_t>(cols, nc - j), dst + panel * cols * kc);
  }
}

/// Calls `fn(std::integral_constant<int, c>{})` with the smallest c in
/// {1, 2, 4, 8, ..., Max} that is at least `n` (1 <= n <= Max): edge tiles get a
/// kernel close to their size without compiling one for every size.
template <int Max, class F>
KILN_ALWAYS_INLINE void with_size_class(std::int64_t n, F&& fn) {
  if constexpr (Max > 1) {
    constexpr int smaller = int(std::bit_floor(unsigned(Max - 1)));
    if (n <= smaller) return with_size_class<smaller>(n, std::forward<F>(fn));
  }
  fn(std::integral_constant<int, Max>{});
}

/// C[m x cols] (+)= A[m x kc] * B[kc x cols] for one panel of at most `Vectors`
/// vectors of columns, in tiles of at most `Rows` rows: A is read in place (row
/// stride lda), B rows start at b + p * ldb and must be readable for Vectors whole
/// vectors. Each B panel stays in cache while the row tiles pass over it.
template <int Vectors, int Rows, class V>
void multiply_panel(std::int64_t m, std::int64_t cols, std::int64_t kc, const V* a, std::int64_t lda, const V* b,
                    std::int64_t ldb, V* c, std::int64_t ldc, bool accumulate) {
  for (std::int64_t i = 0; i < m; i += Rows) {
    const std::int64_t height = std::min<std::int64_t>(Rows, m - i);
    V* c_tile = c + i * ldc;
    // C is far away in memory: start fetching it now, it is needed after the k loop.
    for (std::int64_t r = 0; r < height; ++r) {
      __builtin_prefetch(c_tile + r * ldc, 1);
      __builtin_prefetch(c_tile + r * ldc + cols - 1, 1);
    }
    with_size_class<Rows>(height, [&](auto tile_height) {
      constexpr int h = decltype(tile_height)::value;
      const V* row[h];
      for (int r = 0; r < h; ++r) row[r] = a + (i + std::min<std::int64_t>(r, height - 1)) * lda;
      xsimd::batch<V> acc[h][Vectors];
      clear_tile(acc);
      multiply_tile<h, Vectors>(kc, pointer_rows<V>{row}, b, ldb, acc);
      store_tile(acc, c_tile, ldc, height, cols, accumulate);
    });
  }
}

/// Splits `total` into `parts` near-equal pieces, each a multiple of `quantum`
/// except the last; returns the piece size.
inline std::int64_t even_split(std::int64_t total, std::int64_t parts, std::int64_t quantum) {
  const std::int64_t piece = (total + parts - 1) / parts;
  return (piece + quantum - 1) / quantum * quantum;
}

/// Runs `fn(i)` for i in [0, tasks) on `pool`, or inline when there is none.
template <class F>
void run_tasks(kiln::detail::thread_pool* pool, std::int64_t tasks, F&& fn) {
  if (pool == nullptr || tasks <= 1) {
    for (std::int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  pool->run(tasks, fn);
}

/// The blocked product for large matrices (see gemm_blocking): blocks of B are packed
/// once and shared by the threads, which split the rows of C (and its columns when
/// there are too few rows) and read A in place.
template <class V>
void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                 std::int64_t ldb, V* c, std::int64_t ldc, kiln::detail::thread_pool* pool) {
  using blocking = gemm_blocking<V>;
  const std::int64_t threads = pool ? pool->size() : 1;
  const std::int64_t nc_max = even_split(n, (n + blocking::col_block - 1) / blocking::col_block, blocking::cols);
  const std::int64_t kc_max = even_split(k, (k + blocking::depth - 1) / blocking::depth, 8);
  // Row blocks come in multiples of the thread count so that threads finish together.
  std::int64_t row_tasks = (m + blocking::row_block - 1) / blocking::row_block;
  row_tasks = std::min((row_tasks + threads - 1) / threads * threads, (m + blocking::rows - 1) / blocking::rows);
  const std::int64_t mc_max = even_split(m, row_tasks, blocking::rows);
  row_tasks = (m + mc_max - 1) / mc_max;
  const std::int64_t col_groups = row_tasks >= threads ? 1 : (threads + row_tasks - 1) / row_tasks;

  V* bp = thread_scratch_as<V>(scratch_slot::gemm_b, (nc_max + blocking::cols) * kc_max);
  for (std::int64_t jc = 0; jc < n; jc += nc_max) {
    const std::int64_t nc = std::min(nc_max, n - jc);
    const std::int64_t panels = (nc + blocking::cols - 1) / blocking::cols;
    const std::int64_t panels_per_group = (panels + col_groups - 1) / col_groups;
    for (std::int64_t pc = 0; pc < k; pc += kc_max) {
      const std::int64_t kc = std::min(kc_max, k - pc);
      const std::int64_t pack_tasks = std::min(threads, panels);
      run_tasks(pool, pack_tasks, [&](std::int64_t t) {
        pack_b(b + pc * ldb + jc, ldb, kc, nc, panels * t / pack_tasks, panels * (t + 1) / pack_tasks, bp);
      });
      run_tasks(pool, row_tasks * col_groups, [&](std::int64_t t) {
        const std::int64_t ic = (t / col_groups) * mc_max, mc = std::min(mc_max, m - ic);
        const std::int64_t first = (t % col_groups) * panels_per_group, last = std::min(panels, first + panels_per_group);
        for (std::int64_t panel = first; panel < last; ++panel) {
          const std::int64_t j = panel * blocking::cols, cols = std::min<std::int64_t>(blocking::cols, nc - j);
          // The last panel skips its vectors that hold only zero padding.
          with_size_class<blocking::vectors>((cols + blocking::width - 1) / blocking::width, [&](auto vectors) {
            multiply_panel<decltype(vectors)::value, blocking::rows>(mc, cols, kc, a + ic * lda + pc, lda, bp + j * kc, blocking::cols,
                                                     c + ic * ldc + jc + j, ldc, pc != 0);
          });
        }
      });
    }
  }
}

/// The product without packing, for small matrices and few rows: A and B are read in
/// place, except the last columns of B when they do not fill a panel, which are copied
/// zero-padded. Tiles are at most `Rows` x `Vectors` vectors; threads split rows and
/// panels.
template <int Rows, int Vectors, class V>
void gemm_direct(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                 std::int64_t ldb, V* c, std::int64_t ldc, kiln::detail::thread_pool* pool) {
  constexpr int width = gemm_blocking<V>::width, cols = Vectors * width;
  const std::int64_t full_panels = n / cols, tail = n - full_panels * cols;
  const std::int64_t tail_vectors = (tail + width - 1) / width;
  const std::int64_t panels = full_panels + (tail > 0);
  V* tail_panel = nullptr;
  if (tail > 0) {
    tail_panel = thread_scratch_as<V>(scratch_slot::gemm_edge, k * cols);
    with_size_class<Vectors>(tail_vectors, [&](auto vectors) {
      pack_b_panel<decltype(vectors)::value * width>(b + full_panels * cols, ldb, k, tail, tail_panel);
    });
  }
  const std::int64_t threads = pool ? pool->size() : 1;
  const std::int64_t row_tasks = std::min((m + Rows - 1) / Rows, (2 * threads + panels - 1) / panels);
  const std::int64_t mc = even_split(m, row_tasks, Rows);
  run_tasks(pool, row_tasks * panels, [&](std::int64_t t) {
    const std::int64_t i = (t / panels) * mc, panel = t % panels, j = panel * cols;
    if (i >= m) return;
    const std::int64_t rows = std::min(mc, m - i);
    if (panel < full_panels) {
      multiply_panel<Vectors, Rows>(rows, cols, k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, false);
      return;
    }
    with_size_class<Vectors>(tail_vectors, [&](auto vectors) {
      constexpr int nv = decltype(vectors)::value;
      multiply_panel<nv, Rows>(rows, tail, k, a + i * lda, lda, tail_panel, nv * width, c + i * ldc + j, ldc, false);
    });
  });
}

/// C[m x 1] = A * b for a single column: one dot product per row, vectorized along k.
template <class V>
void gemm_column(std::int64_t m, std::int64_t k, const V* a, std::int64_t lda, const V* b, std::int64_t ldb, V* c,
                 std::int64_t ldc, kiln::detail::thread_pool* pool) {
  using batch = xsimd::batch<V>;
  constexpr int width = int(batch::size);
  V* column = thread_scratch_as<V>(scratch_slot::gemm_edge, k);
  for (std::int64_t p = 0; p < k; ++p) column[p] = b[p * ldb];
  const std::int64_t row_tasks = pool ? std::min<std::int64_t>(m, 4 * pool->size()) : 1;
  run_tasks(pool, row_tasks, [&](std::int64_t t) {
    for (std::int64_t i = m * t / row_tasks, end = m * (t + 1) / row_tasks; i < end; ++i) {
      const V* row = a + i * lda;
      batch sums[4] = {batch(V(0)), batch(V(0)), batch(V(0)), batch(V(0))};
      std::int64_t p = 0;
      for (; p + 4 * width <= k; p += 4 * width)
        for (int u = 0; u < 4; ++u)
          sums[u] = math::multiply_add(batch::load_unaligned(row + p + u * width), batch::load_aligned(column + p + u * width),
                                 sums[u]);
      for (; p + width <= k; p += width)
        sums[0] = math::multiply_add(batch::load_unaligned(row + p), batch::load_unaligned(column + p), sums[0]);
      // Summed by hand: xsimd::hadd on AVX-512 trips GCC 12's -Wmaybe-uninitialized.
      alignas(64) V lanes[width];
      ((sums[0] + sums[1]) + (sums[2] + sums[3])).store_aligned(lanes);
      V sum = V(0);
      for (V lane : lanes) sum += lane;
      for (; p < k; ++p) sum += row[p] * column[p];
      c[i * ldc] = sum;
    }
  });
}

/// Whether gemm computes an m x n x k product without packing B (gemm_direct): each
/// element is then one fused multiply-add chain over k, from zero and in order.
template <class V>
constexpr bool gemm_unpacked(std::int64_t m, std::int64_t n, std::int64_t k) {
  const double work = double(m) * double(n) * double(k);  // m * n * k may not fit 64 bits
  // One or two rows stream B once; packing B pays off only when many rows reuse it.
  return n != 1 && k > 0 && (m <= 2 || work <= gemm_direct_work || m <= 2 * gemm_blocking<V>::rows);
}

/// gemm on compute types (see gemm_compute_t).
template <class V>
void gemm_compute(std::int64_t m, std::int64_t n, std::int64_t k, const V* a, std::int64_t lda, const V* b,
                  std::int64_t ldb, V* c, std::int64_t ldc) {
  using blocking = gemm_blocking<V>;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, V(0));
    return;
  }
  const double work = double(m) * double(n) * double(k);  // m * n * k may not fit 64 bits
  kiln::detail::thread_pool* pool = nullptr;
  std::shared_ptr<kiln::detail::thread_pool> held;
  if (work >= gemm_parallel_work) {
    held = kiln::detail::current_pool();
    if (held->size() > 1) pool = held.get();
  }
  if (n == 1) return gemm_column(m, k, a, lda, b, ldb, c, ldc, pool);
  if constexpr (std::is_integral_v<V>) {
    // Integer products are rare and small (the guides' power): one kernel serves them
    // all, rather than packing and wide panels compiling two more sets of tiles for
    // each integer type in every program that calls matmul.
    return gemm_direct<blocking::rows, blocking::vectors>(m, n, k, a, lda, b, ldb, c, ldc, pool);
  }
  if (!gemm_unpacked<V>(m, n, k)) return gemm_packed(m, n, k, a, lda, b, ldb, c, ldc, pool);
  // One or two rows: wide panels read long contiguous runs of B's rows.
  if (m <= 2) return gemm_direct<2, 4 * blocking::vectors>(m, n, k, a, lda, b, ldb, c, ldc, pool);
  gemm_direct<blocking::rows, blocking::vectors>(m, n, k, a, lda, b, ldb, c, ldc, pool);
}

}  // namespace detail

/// C[m x n] = A[m x k] * B[k x n] for row-major matrices with leading dimensions
/// (row strides, in elements) lda >= k, ldb >= n, ldc >= n; C is overwritten and must
/// not overlap A or B. T is float, double, int32_t or int64_t; integer products wrap
/// modulo 2^bits. k == 0 gives C = 0. Large products use kiln's thread pool
/// (kiln::config::num_threads()).
/// \code
/// std::vector<float> a(2 * 3, 1.f), b(3 * 4, 2.f), c(2 * 4);
/// kiln::backend::cpu::gemm<float>(2, 4, 3, a.data(), 3, b.data(), 4, c.data(), 4);  // every c == 6
/// \endcode
template <class T>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
          T* c, std::int64_t ldc) {
  static_assert(detail::is_kernel_element_v<T>, "kiln::backend::cpu::gemm: T must be float, double, int32_t or int64_t");
  using V = detail::gemm_compute_t<T>;
  detail::gemm_compute<V>(m, n, k, reinterpret_cast<const V*>(a), lda, reinterpret_cast<const V*>(b), ldb,
                          reinterpret_cast<V*>(c), ldc);
}

}  // namespace kiln::backend::cpu
// ----- end kiln/backend/cpu/gemm.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_GEMM_HPP

namespace kiln::backend::cpu {
namespace detail {

/// Calls `fn(std::integral_constant<int, n>{})` for the runtime `n` in [1, Max], so
/// that each channel panel runs a kernel compiled for its exact width.
template <int Max, class F>
KILN_ALWAYS_INLINE void with_constant(std::int64_t n, F&& fn) {
  if constexpr (Max > 1) {
    if (n < Max) return with_constant<Max - 1>(n, std::forward<F>(fn));
  }
  fn(std::integral_constant<int, Max>{});
}

/// The geometry of one conv2d call (see kiln::backend::cpu::conv2d for the meaning).
struct conv2d_shape {
  std::int64_t batch, in_h, in_w, in_c;
  std::int64_t fh, fw, out_c;
  std::int64_t stride_h, stride_w, pad_top, pad_left;
  std::int64_t out_h, out_w;
};

/// Below this many multiply-adds a convolution runs on the calling thread alone.
inline constexpr double conv2d_parallel_work = 1 << 21;
/// Bytes of input windows that one block of tiles reads (a part of L2).
inline constexpr std::int64_t conv2d_block_bytes = 512 * 1024;

/// Register tile of the convolution for compute type `V`: `rows` output pixels by up
/// to `vectors` SIMD vectors of output channels. Output channels are cut into panels
/// of at most `vectors` vectors, as evenly as possible: with few channels (100 floats
/// are 7 vectors: 4 + 3) this wastes less than fixed-width panels, whose last panel
/// would hold one mostly empty vector.
template <class V>
struct conv2d_tiling {
  static constexpr int rows = 6;
  static constexpr int vectors = gemm_blocking<V>::wide_registers ? 4 : 2;
};

/// Fills `rows[kh * Rows + r]`, for every filter row kh, with a pointer to the fw x in_c
/// window row of output pixel `first + r` (pixels past `pixels` repeat the last one).
/// Windows inside the image point into it; the others are assembled in `edge`
/// (fh * Rows window rows) from the image and `zeros` (one window row of zeros).
template <int Rows, class V>
void gather_window_rows(const V* input, const conv2d_shape& s, std::int64_t first, std::int64_t pixels,
                        const V* zeros, V* edge, const V** rows) {
  const std::int64_t segment = s.fw * s.in_c;
  for (int r = 0; r < Rows; ++r) {
    const std::int64_t q = std::min(first + r, pixels - 1);
    const std::int64_t ow = q % s.out_w, oh = q / s.out_w % s.out_h, image = q / (s.out_w * s.out_h);
    const std::int64_t iw0 = ow * s.stride_w - s.pad_left;
    const bool inside_w = iw0 >= 0 && iw0 + s.fw <= s.in_w;
    for (std::int64_t kh = 0; kh < s.fh; ++kh) {
      const std::int64_t ih = oh * s.stride_h + kh - s.pad_top;
      const V*& row = rows[kh * Rows + r];
      if (ih < 0 || ih >= s.in_h) {
        row = zeros;
        continue;
      }
      const V* image_row = input + (image * s.in_h + ih) * s.in_w * s.in_c;
      if (inside_w) {
        row = image_row + iw0 * s.in_c;
      } else {
        V* dst = edge + (kh * Rows + r) * segment;
        for (std::int64_t kw = 0; kw < s.fw; ++kw) {
          const std::int64_t iw = iw0 + kw;
          V* pixel = dst + kw * s.in_c;
          if (iw < 0 || iw >= s.in_w)
            std::fill(pixel, pixel + s.in_c, V(0));
          else
            std::copy(image_row + iw * s.in_c, image_row + (iw + 1) * s.in_c, pixel);
        }
        row = dst;
      }
    }
  }
}

/// conv2d on compute types (see gemm_compute_t).
template <class V>
void conv2d_compute(const V* input, const V* filters, V* output, const conv2d_shape& s) {
  constexpr int rows = conv2d_tiling<V>::rows, max_vectors = conv2d_tiling<V>::vectors;
  constexpr int width = gemm_blocking<V>::width;
  const std::int64_t pixels = s.batch * s.out_h * s.out_w;
  if (pixels <= 0 || s.out_c <= 0) return;
  const std::int64_t segment = s.fw * s.in_c, depth = s.fh * segment;
  if (depth <= 0) {
    std::fill(output, output + pixels * s.out_c, V(0));
    return;
  }
  // Output channels go in panels of at most max_vectors vectors, as even as possible;
  // `fn(first_channel, std::integral_constant<int, panel_vectors>)` visits them.
  const std::int64_t vectors = (s.out_c + width - 1) / width;
  const std::int64_t panels = (vectors + max_vectors - 1) / max_vectors;
  auto for_each_panel = [&](auto&& fn) {
    for (std::int64_t p = 0; p < panels; ++p) {
      const std::int64_t first = vectors * p / panels, count = vectors * (p + 1) / panels - first;
      with_constant<max_vectors>(count, [&](auto panel_vectors) { fn(first * width, panel_vectors); });
    }
  };
  V* packed_filters = thread_scratch_as<V>(scratch_slot::conv_filter, vectors * width * depth);
  for_each_panel([&](std::int64_t j, auto panel_vectors) {
    constexpr int panel_cols = decltype(panel_vectors)::value * width;
    pack_b_panel<panel_cols>(filters + j, s.out_c, depth, std::min<std::int64_t>(panel_cols, s.out_c - j),
                             packed_filters + j * depth);
  });

  // Tiles go in blocks whose windows fill about conv2d_block_bytes, so that each filter
  // panel, streamed from L2 (or L3 when the filter is large), serves a whole block.
  const std::int64_t tiles = (pixels + rows - 1) / rows;
  const std::int64_t tile_bytes = rows * depth * std::int64_t(sizeof(V));
  const std::int64_t block = std::clamp<std::int64_t>(conv2d_block_bytes / tile_bytes, 1, 16);
  const std::int64_t blocks = (tiles + block - 1) / block;
  // Many more chunks than threads: on a busy machine a descheduled thread then holds
  // up only a small piece of the work.
  std::shared_ptr<kiln::detail::thread_pool> pool;
  if (double(pixels) * double(depth) * double(s.out_c) >= conv2d_parallel_work) pool = kiln::detail::current_pool();
  const std::int64_t chunks = pool && pool->size() > 1 ? std::min<std::int64_t>(blocks, 8 * pool->size()) : 1;
  run_tasks(chunks > 1 ? pool.get() : nullptr, chunks, [&](std::int64_t chunk) {
    const std::int64_t first_block = blocks * chunk / chunks, last_block = blocks * (chunk + 1) / chunks;
    const std::int64_t window_count = block * s.fh * rows;
    const V** window_rows = thread_scratch_as<const V*>(scratch_slot::conv_pointers, window_count);
    // One window row of zeros, then room for the window rows of a block.
    V* zeros = thread_scratch_as<V>(scratch_slot::conv_rows, (1 + window_count) * segment);
    std::fill(zeros, zeros + segment, V(0));
    for (std::int64_t b = first_block; b < last_block; ++b) {
      const std::int64_t first_tile = b * block, last_tile = std::min(tiles, first_tile + block);
      for (std::int64_t tile = first_tile; tile < last_tile; ++tile) {
        const std::int64_t slot = (tile - first_tile) * s.fh * rows;
        gather_window_rows<rows>(input, s, tile * rows, pixels, zeros, zeros + (1 + slot) * segment,
                                 window_rows + slot);
      }
      for_each_panel([&](std::int64_t j, auto panel_vectors) {
        constexpr int nv = decltype(panel_vectors)::value, panel_cols = nv * width;
        const V* b_panel = packed_filters + j * depth;
        for (std::int64_t tile = first_tile; tile < last_tile; ++tile) {
          const V* const* tile_rows = window_rows + (tile - first_tile) * s.fh * rows;
          xsimd::batch<V> acc[rows][nv];
          clear_tile(acc);
          for (std::int64_t kh = 0; kh < s.fh; ++kh)
            multiply_tile<rows, nv>(segment, pointer_rows<V>{tile_rows + kh * rows},
                                    b_panel + kh * segment * panel_cols, panel_cols, acc);
          const std::int64_t first = tile * rows;
          store_tile(acc, output + first * s.out_c + j, s.out_c, std::min<std::int64_t>(rows, pixels - first),
                     std::min<std::int64_t>(panel_cols, s.out_c - j), false);
        }
      });
    }
  });
}

}  // namespace detail

/// 2-D convolution (cross-correlation, as TensorFlow's conv2d): NHWC `input`
/// [batch, in_h, in_w, in_c] and HWIO `filters` [fh, fw, in_c, out_c] give NHWC
/// `output` [batch, out_h, out_w, out_c], overwritten (it must not overlap the inputs).
/// Output pixel (oh, ow) reads input pixels (oh * stride_h + kh - pad_top,
/// ow * stride_w + kw - pad_left); those outside the image count as zero. The caller
/// picks out_h, out_w and the padding offsets (0 for VALID; TensorFlow's SAME rule
/// gives pad_top = max(0, (out_h - 1) * stride_h + fh - in_h) / 2). T is float,
/// double, int32_t or int64_t; integer sums wrap modulo 2^bits. Large convolutions
/// use kiln's thread pool.
/// \code
/// // 1x5x5x1 image, 3x3x1x1 filter, stride 1, VALID: 1x3x3x1 output
/// std::vector<float> in(25, 1.f), k(9, 1.f), out(9);
/// kiln::backend::cpu::conv2d<float>(in.data(), 1, 5, 5, 1, k.data(), 3, 3, 1, 1, 1, 0, 0, out.data(), 3, 3);  // 9s
/// \endcode
template <class T>
void conv2d(const T* input, std::int64_t batch, std::int64_t in_h, std::int64_t in_w, std::int64_t in_c,
            const T* filters, std::int64_t fh, std::int64_t fw, std::int64_t out_c, std::int64_t stride_h,
            std::int64_t stride_w, std::int64_t pad_top, std::int64_t pad_left, T* output, std::int64_t out_h,
            std::int64_t out_w) {
  static_assert(detail::is_kernel_element_v<T>,
                "kiln::backend::cpu::conv2d: T must be float, double, int32_t or int64_t");
  using V = detail::gemm_compute_t<T>;
  const detail::conv2d_shape shape{batch, in_h, in_w, in_c, fh, fw, out_c, stride_h, stride_w, pad_top, pad_left,
                                   out_h, out_w};
  detail::conv2d_compute<V>(reinterpret_cast<const V*>(input), reinterpret_cast<const V*>(filters),
                            reinterpret_cast<V*>(output), shape);
}

}  // namespace kiln::backend::cpu
// ----- end kiln/backend/cpu/conv2d.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_CONV2D_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_REDUCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_REDUCTION_HPP
// ----- begin kiln/backend/cpu/reduction.hpp -----
/// \file
/// CPU reduction kernels. Size-1 dims are dropped and neighbouring dims with the
/// same role merged, so most reductions become rows (the reduced elements are
/// contiguous: SIMD with several accumulators) or columns (a kept contiguous dim
/// follows the reduced one: SIMD across the kept columns); interleaved axes lists
/// take a strided path. Every output is a pairwise tree over fixed-size leaves whose
/// shape depends only on the input's shape: float sums stay accurate, and results
/// are the same whatever the thread count, because threads only choose who
/// evaluates which subtree.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>


#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_REDUCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_REDUCTION_HPP
// ----- begin kiln/ops/reduction.hpp -----
/// \file
/// Reductions: `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min` and `argmax`
/// over all axes, one axis or a list of axes, with TensorFlow's semantics: the
/// result keeps the input's dtype (argmax gives int64), integer sums wrap, an empty
/// sum is 0, an empty float mean is NaN and an empty max is the lowest value.

#include <array>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>


namespace kiln {

/// The axes a reduction runs over: all of them (the default; also `{}` and
/// `std::nullopt`, TensorFlow's `axis=None`), one axis, or a list of axes. Negative
/// axes count from the end. An explicit empty `kiln::int_list` reduces nothing.
/// \code
/// kiln::tensor x = kiln::ones({2, 3, 4});
/// kiln::reduce_sum(x);                      // every axis
/// kiln::reduce_sum(x, -1);                  // the last axis
/// kiln::reduce_sum(x, {0, 1}, true);        // two axes, kept as size 1
/// kiln::reduce_max(x, std::nullopt, true);  // every axis, kept as size 1
/// \endcode
class reduction_axes {
 public:
  constexpr reduction_axes() = default;
  constexpr reduction_axes(std::nullopt_t) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  constexpr reduction_axes(I axis) : all_(false) {
    list_.push_back(static_cast<std::int64_t>(axis));
  }
  constexpr reduction_axes(std::initializer_list<std::int64_t> axes) : all_(false), list_(axes) {}
  constexpr reduction_axes(const int_list& axes) : all_(false), list_(axes) {}

  /// True when every axis is reduced.
  constexpr bool all() const { return all_; }
  /// The listed axes (empty when `all()`).
  constexpr const int_list& list() const { return list_; }
  constexpr bool operator==(const reduction_axes&) const = default;
  /// `None` or the list as `[0, -1]`.
  KILN_LIBRARY_INLINE std::string str() const;

 private:
  bool all_ = true;
  int_list list_;
};

namespace ops {

/// The first invalid entry of an axes list: its position (-1 when every axis is
/// valid) and whether it repeats an earlier axis rather than being out of range.
struct axes_check {
  int position = -1;
  bool repeated = false;
  constexpr bool ok() const { return position < 0; }
};

/// Checks `axes` against a tensor of rank `rank`.
/// \code static_assert(!kiln::ops::check_axes({0, 2}, 2).ok()); \endcode
constexpr axes_check check_axes(const reduction_axes& axes, int rank) {
  std::array<bool, max_rank> seen{};
  for (int i = 0; i < axes.list().size(); ++i) {
    int axis = normalize_axis(axes.list()[i], rank);
    if (axis < 0) return {i, false};
    if (seen[axis]) return {i, true};
    seen[axis] = true;
  }
  return {};
}

/// Which of the `rank` dims a reduction over (valid) `axes` reduces.
/// \code kiln::ops::reduced_dims(-1, 2) == std::array<bool, kiln::max_rank>{false, true} \endcode
constexpr std::array<bool, max_rank> reduced_dims(const reduction_axes& axes, int rank) {
  std::array<bool, max_rank> reduced{};
  for (int d = 0; d < rank; ++d) reduced[d] = axes.all();
  for (std::int64_t axis : axes.list()) reduced[normalize_axis(axis, rank)] = true;
  return reduced;
}

/// How many input elements meet in each output of a reduction of concrete shape `in`.
/// \code kiln::ops::reduced_count(kiln::shape{2, 3}, 1) == 3 \endcode
constexpr std::int64_t reduced_count(const shape& in, const reduction_axes& axes) {
  auto reduced = reduced_dims(axes, in.rank());
  std::int64_t count = 1;
  for (int d = 0; d < in.rank(); ++d)
    if (reduced[d]) count *= in[d];
  return count;
}

/// What a reduction computes; the kernels branch on it at compile time.
/// \code static_assert(kiln::ops::reduce_mean::kind == kiln::ops::reduction_kind::mean); \endcode
enum class reduction_kind { sum, mean, max, min, argmax };

/// Base of the reduction ops: one int32, int64, float32 or float64 input, the axes
/// to reduce and whether reduced dims stay in the result as size 1.
/// \code kiln::ops::reduce_sum op({0, -1}, true);  // axes [0, -1], keepdims \endcode
struct reduction_op {
  reduction_axes axis{};
  static constexpr int arity = 1;
  bool keepdims = false;
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"axis", &reduction_op::axis},
                      attribute{"keepdims", &reduction_op::keepdims}};
  }

  /// The gradient of the result, `g.dy()`, repeated along the reduced dims of the
  /// input (for the formulas of sum and mean).
  template <class G> auto spread(G& g) const { return G::reshape(g.dy(), kept_shape(g)) + g.zeros_like(0); }

  /// The input's shape with the reduced dims kept as size 1: the result's shape with
  /// keepdims, what dy is reshaped to before it is spread back.
  template <class G> shape kept_shape(G& g) const {
    const shape in = g.x(0).t.shape();
    const auto reduced = reduced_dims(axis, in.rank());
    shape kept;
    for (int d = 0; d < in.rank(); ++d) kept.push_back(reduced[std::size_t(d)] ? 1 : in[d]);
    return kept;
  }

  /// The gradient of max and min, as TensorFlow's: dy shared equally by the elements
  /// equal to the result.
  template <class G> auto extreme_gradient(G& g) const;

  constexpr reduction_op() = default;
  constexpr explicit reduction_op(reduction_axes axes, bool keep = false) : axis(axes), keepdims(keep) {}

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!dtypes::numeric.contains(in[0])) return {in[0], "dtype not supported (reductions take int32, int64, float32 or float64)"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const shape& s = in[0];
    if (!s.has_known_rank()) return {axis.all() && !keepdims ? shape{} : shape(unknown_rank)};
    axes_check check = check_axes(axis, s.rank());
    if (!check.ok()) return {{}, check.repeated ? "an axis is listed twice" : "axis out of range"};
    auto reduced = reduced_dims(axis, s.rank());
    shape out;
    for (int d = 0; d < s.rank(); ++d) {
      if (!reduced[d])
        out.push_back(s[d]);  // may be `none`
      else if (keepdims)
        out.push_back(1);
    }
    return {out};
  }
  constexpr bool operator==(const reduction_op&) const = default;
};

/// The ops of this family; their kernels are written once for all of them.
/// \code static_assert(kiln::ops::reduction<kiln::ops::argmax>); \endcode
template <class Op>
concept reduction = std::derived_from<Op, reduction_op> && requires {
  { Op::kind } -> std::convertible_to<reduction_kind>;
};

/// Sum; integers wrap.
struct reduce_sum : reduction_op {
  static constexpr std::string_view name = "reduce_sum";
  static constexpr std::string_view onnx_name = "ReduceSum";
  static constexpr reduction_kind kind = reduction_kind::sum;
  using reduction_op::reduction_op;
  /// dy, spread back over the reduced dims.
  template <class G> void gradient(G& g) const { g.give(0, spread(g)); }
};
/// Mean; integer means truncate toward zero (of the wrapped sum, as TensorFlow).
template <class G>
auto reduction_op::extreme_gradient(G& g) const {
  const shape kept = kept_shape(g);
  const auto chosen = G::run(cast(g.x(0).t.dtype()), G::run(equal{}, G::reshape(g.y(), kept), g.x(0)));
  const auto count = G::run(reduce_sum(axis, true), chosen);
  return chosen / count * G::reshape(g.dy(), kept);
}

struct reduce_mean : reduction_op {
  static constexpr std::string_view name = "reduce_mean";
  static constexpr std::string_view onnx_name = "ReduceMean";
  static constexpr reduction_kind kind = reduction_kind::mean;
  using reduction_op::reduction_op;
  /// dy / count, spread back over the reduced dims.
  template <class G> void gradient(G& g) const {
    g.give(0, spread(g) / double(reduced_count(g.x(0).t.shape(), axis)));
  }
};
/// Largest element; NaN wins over any number.
struct reduce_max : reduction_op {
  static constexpr std::string_view name = "reduce_max";
  static constexpr std::string_view onnx_name = "ReduceMax";
  static constexpr reduction_kind kind = reduction_kind::max;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Smallest element; NaN wins over any number.
struct reduce_min : reduction_op {
  static constexpr std::string_view name = "reduce_min";
  static constexpr std::string_view onnx_name = "ReduceMin";
  static constexpr reduction_kind kind = reduction_kind::min;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Index (int64) of the first largest element, counting the reduced positions in
/// row-major order; the first NaN counts as the largest, as reduce_max returns it.
struct argmax : reduction_op {
  static constexpr std::string_view name = "argmax";
  static constexpr std::string_view onnx_name = "ArgMax";
  static constexpr reduction_kind kind = reduction_kind::argmax;
  using reduction_op::reduction_op;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    dtype_result r = reduction_op::result_dtype(in);
    if (r.ok()) r.value = int64;
    return r;
  }
  /// Raises kiln::invalid_argument_error when input shape `in` has nothing to reduce:
  /// there is no largest element (TensorFlow raises too).
  /// \code kiln::ops::argmax(0).check_input(kiln::shape{0, 3});  // throws \endcode
  KILN_LIBRARY_INLINE void check_input(const shape& in) const;
};

/// Runs argmax's input check before any kernel (found by argument-dependent lookup).
/// \code kiln::argmax(kiln::zeros({0, 3}), 0);  // kiln::invalid_argument_error \endcode
template <class = void>
void check_values(const argmax& op, std::span<const tensor* const> in) { op.check_input(in[0]->shape()); }

/// The mean of `count` values that sum to `sum`, in the element type `T`: integer
/// means truncate toward zero (and are 0 for no values), float ones are NaN then.
/// \code kiln::ops::mean_of<int>(-7, 2) == -3 \endcode
template <class T, class S>
constexpr T mean_of(S sum, std::int64_t count) {
  if constexpr (std::is_floating_point_v<T>)
    return T(sum / S(count));
  else
    return count == 0 ? T(0) : T(std::int64_t(sum) / count);
}

}  // namespace ops

namespace detail {

/// Reduction `op`'s error for the axes `axes` that `check` refused on `x`, as an op
/// whose operands do not fit raises it in `mode`; out of line, shared by every reduction.
[[noreturn]] KILN_COLD KILN_LIBRARY_INLINE void throw_invalid_axes(std::string_view op, const reduction_axes& axes,
                                                                   ops::axes_check check, const tensor& x, rule_errors mode);
#if KILN_DEFINE_LIBRARY
[[noreturn]] KILN_COLD KILN_LIBRARY_INLINE void throw_invalid_axes(std::string_view op, const reduction_axes& axes,
                                                                   ops::axes_check check, const tensor& x, rule_errors mode) {
  std::string axis = std::to_string(axes.list()[check.position]);
  std::string got = "; got " + std::string(name(x.dtype())) + " " + x.shape().str();
  if (check.repeated)
    throw_operand_error<value_error>(mode, std::string(op) + ": axis " + axis + " is listed twice in " + axes.str() + got);
  std::string valid = x.rank() == 0 ? "a scalar has no axes"
                                    : "valid axes are " + std::to_string(-x.rank()) + " to " + std::to_string(x.rank() - 1);
  throw_operand_error<value_error>(mode, std::string(op) + ": axis " + axis + " is out of range for a tensor of rank " +
                                             std::to_string(x.rank()) + " (" + valid + ")" + got);
}
#endif

/// Runs reduction `op` on `x`. Invalid axes raise the operand error naming the axis
/// and the rank here, where both are known (the op's rule can only say which kind of
/// mistake it was).
template <ops::reduction Op>
tensor reduce(const Op& op, const tensor& x) {
  if (x.defined() && x.shape().has_known_rank())
    if (const ops::axes_check check = ops::check_axes(op.axis, x.rank()); !check.ok()) {
      const tensor* in[] = {&x};
      throw_invalid_axes(Op::name, op.axis, check, x, rule_errors_for(in));
    }
  return apply(op, x);
}

}  // namespace detail

/// Sum over `axis` (every axis by default); reduced dims are dropped unless `keepdims`.
/// Integer sums wrap; an empty sum is 0.
/// \code
/// auto x = kiln::constant({{1, 2, 3}, {4, 5, 6}});
/// kiln::reduce_sum(x);              // 21
/// kiln::reduce_sum(x, 0);           // [5 7 9]
/// kiln::reduce_sum(x, -1, true);    // [[6] [15]]
/// kiln::reduce_sum(x, {0, 1});      // 21
/// \endcode
template <class = void>
tensor reduce_sum(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_sum(axis, keepdims), x);
}

/// Mean over `axis` (every axis by default), in the input's dtype: integer means
/// truncate toward zero, an empty float mean is NaN and an empty integer mean 0.
/// \code kiln::reduce_mean(kiln::constant({1.f, 2.f})) // 1.5 \endcode
template <class = void>
tensor reduce_mean(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_mean(axis, keepdims), x);
}

/// Largest element over `axis` (every axis by default). NaN propagates; an empty
/// max is -inf for floats and the lowest value for integers.
/// \code kiln::reduce_max(kiln::constant({{1, 5}, {7, 2}}), 1) // [5 7] \endcode
template <class = void>
tensor reduce_max(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_max(axis, keepdims), x);
}

/// Smallest element over `axis` (every axis by default). NaN propagates; an empty
/// min is +inf for floats and the largest value for integers.
/// \code kiln::reduce_min(kiln::constant({{1, 5}, {7, 2}}), 0) // [1 2] \endcode
template <class = void>
tensor reduce_min(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::reduce_min(axis, keepdims), x);
}

/// Index (int64) of the first largest element along `axis`. With no axis it is the
/// row-major index into the whole tensor (NumPy's convention; TensorFlow's
/// `tf.math.argmax` defaults to axis 0, which is `kiln::argmax(x, 0)`); over a list
/// of axes it counts the reduced positions in row-major order. The first NaN counts
/// as the largest. Reducing an empty axis raises kiln::invalid_argument_error.
/// \code
/// auto x = kiln::constant({{1, 9, 9}, {8, 2, 3}});
/// kiln::argmax(x, 1);  // [1 0]
/// kiln::argmax(x, 0);  // [1 0 0]
/// kiln::argmax(x);     // 1
/// \endcode
template <class = void>
tensor argmax(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::reduce(ops::argmax(axis, keepdims), x);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE std::string reduction_axes::str() const { return all_ ? "None" : list_.str(); }

}  // namespace kiln

namespace kiln::ops {

KILN_LIBRARY_INLINE void argmax::check_input(const shape& in) const {
  if (reduced_count(in, axis) == 0)
    throw invalid_argument_error(std::string(name) + ": the reduced axes " + axis.str() + " of shape " + in.str() +
                                 " are empty, so there is no largest element");
}

}  // namespace kiln::ops
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/ops/reduction.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_REDUCTION_HPP

namespace kiln::backend {
namespace cpu {

/// Elements per leaf when the reduced elements are contiguous (or strided): a
/// float sum adds at most leaf / (SIMD lanes x accumulators) values in sequence.
inline constexpr std::int64_t reduction_leaf = 4096;
/// Rows per leaf when reducing columns; argmax counts rows within a leaf in the
/// element type, which is exact for this many.
inline constexpr std::int64_t column_leaf_rows = 64;
/// Elements per parallel task: below this, threads cost more than they save.
inline constexpr std::int64_t reduction_grain = std::int64_t(1) << 15;

// ---- what a reduction combines ---------------------------------------------------
// A reducer combines partial results (scalars for sum/max/min, value and index for
// argmax); value reducers also combine xsimd batches lane by lane.

/// NaN test for scalars and batches. (On AVX-512, xsimd's `!=` is an ordered
/// compare, so `v != v` is false for NaN there.)
template <class V>
auto is_nan(const V& v) {
  if constexpr (std::is_arithmetic_v<V>)
    return v != v;
  else
    return xsimd::isnan(v);
}

template <class T>
struct sum_reducer {
  using value_type = T;
  using partial = T;
  static constexpr bool indexed = false;
  static constexpr T identity() { return T(0); }
  template <class V>
  static V combine(const V& a, const V& b) {
    return math::add(a, b);
  }
  static T horizontal(const xsimd::batch<T>& b) { return xsimd::hadd(b); }
};

template <class T, bool Largest>
struct extremum_reducer {
  using value_type = T;
  using partial = T;
  static constexpr bool indexed = false;
  static constexpr T identity() {
    using limits = std::numeric_limits<T>;
    if constexpr (std::is_floating_point_v<T>)
      return Largest ? -limits::infinity() : limits::infinity();
    else
      return Largest ? limits::lowest() : limits::max();
  }
  /// The larger (smaller) of `a` and `b`, NaN if either is, as TensorFlow.
  template <class V>
  static V combine(const V& a, const V& b) {
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (Largest)
        return math::select((a > b) | is_nan(a), a, b);
      else
        return math::select((a < b) | is_nan(a), a, b);
    } else if constexpr (Largest) {
      return math::max(a, b);
    } else {
      return math::min(a, b);
    }
  }
  /// The lanes folded in halves. NaN is settled first, so that the fold can use
  /// plain comparisons, which compile to branch-free min/max instructions.
  static T horizontal(const xsimd::batch<T>& b) {
    if constexpr (std::is_floating_point_v<T>)
      if (xsimd::any(is_nan(b))) return std::numeric_limits<T>::quiet_NaN();
    std::array<T, xsimd::batch<T>::size> lanes;
    b.store_unaligned(lanes.data());
    for (std::size_t half = lanes.size() / 2; half > 0; half /= 2)
      for (std::size_t i = 0; i < half; ++i)
        lanes[i] = (Largest ? lanes[i + half] > lanes[i] : lanes[i + half] < lanes[i]) ? lanes[i + half] : lanes[i];
    return lanes[0];
  }
};

/// argmax's partial result: the best value of a range and where it is.
template <class T>
struct indexed_value {
  T value;
  std::int64_t index;
};

template <class T>
struct argmax_reducer {
  using value_type = T;
  using partial = indexed_value<T>;
  static constexpr bool indexed = true;
  /// Where `a` beats `b`: it is larger, or the first NaN. Scalars or batches.
  template <class V>
  static auto beats(const V& a, const V& b) {
    if constexpr (std::is_floating_point_v<T>)
      return (a > b) | (is_nan(a) & !is_nan(b));
    else
      return a > b;
  }
  /// `left` covers smaller indices, so it wins ties.
  static partial combine(const partial& left, const partial& right) {
    return beats(right.value, left.value) ? right : left;
  }
};

template <ops::reduction_kind K, class T>
using reducer_for = std::conditional_t<
    K == ops::reduction_kind::argmax, argmax_reducer<T>,
    std::conditional_t<K == ops::reduction_kind::max, extremum_reducer<T, true>,
                       std::conditional_t<K == ops::reduction_kind::min, extremum_reducer<T, false>, sum_reducer<T>>>>;

/// What a reduction writes for a partial result: the value, or argmax's index.
template <class R>
auto finish(const typename R::partial& p) {
  if constexpr (R::indexed)
    return p.index;
  else
    return p;
}

// ---- the pairwise tree -----------------------------------------------------------
// The tree's recursion and its parallel split are compiled once for every
// reduction: they see partial results as `size` bytes and reach the leaves and
// the combine through function pointers, one indirect call per leaf of thousands
// of elements.

/// How a tree makes and combines partial results of `size` bytes.
struct tree_steps {
  const void* context;
  void (*leaf)(const void* context, std::int64_t index, std::byte* out);
  void (*combine)(const void* context, std::byte* left, const std::byte* right);  ///< left = left (+) right
  std::size_t size;
};

/// Combines leaves [lo, hi) into `out` as a binary tree split at the middle, so its
/// shape depends only on the number of leaves. `scratch` holds a partial per level.
inline void pairwise(const tree_steps& s, std::int64_t lo, std::int64_t hi, std::byte* out, std::byte* scratch) {
  if (hi - lo == 1) return s.leaf(s.context, lo, out);
  const std::int64_t mid = lo + (hi - lo) / 2;
  pairwise(s, lo, mid, out, scratch);
  pairwise(s, mid, hi, scratch, scratch + s.size);
  s.combine(s.context, out, scratch);
}

/// Room for partial results, from the host's caching allocator (a thread's recently
/// freed blocks), so that a reduction in steady state allocates nothing.
class tree_buffer {
 public:
  explicit tree_buffer(std::size_t bytes)
      : bytes_(bytes), data_(static_cast<std::byte*>(kiln::detail::host_allocator().allocate(bytes))) {}
  ~tree_buffer() { kiln::detail::host_allocator().deallocate(data_, bytes_); }
  tree_buffer(const tree_buffer&) = delete;
  tree_buffer& operator=(const tree_buffer&) = delete;
  std::byte* data() { return data_; }

 private:
  std::size_t bytes_;
  std::byte* data_;
};

/// The bytes of one partial per level of a tree of `leaves` leaves.
inline std::size_t tree_scratch_bytes(const tree_steps& s, std::int64_t leaves) {
  return std::size_t(std::bit_width(std::uint64_t(leaves)) + 1) * s.size;
}

/// The same tree as `pairwise(s, 0, leaves, ...)`, with its subtrees a few levels
/// down evaluated in parallel and combined above in the same order.
inline void pairwise_parallel(const tree_steps& s, std::int64_t leaves, std::byte* out) {
  constexpr int split_depth = 5;
  constexpr std::size_t most_subtrees = std::size_t(1) << split_depth;  // enough to balance a pool
  struct range {
    std::int64_t lo, hi;
  };
  std::array<range, most_subtrees> subtrees;
  std::size_t count = 0;
  auto collect = [&](auto& self, std::int64_t lo, std::int64_t hi, int depth) -> void {
    if (depth == split_depth || hi - lo == 1) {
      subtrees[count++] = {lo, hi};
      return;
    }
    const std::int64_t mid = lo + (hi - lo) / 2;
    self(self, lo, mid, depth + 1);
    self(self, mid, hi, depth + 1);
  };
  collect(collect, 0, leaves, 0);

  tree_buffer values(count * s.size);
  kiln::detail::parallel_for(std::int64_t(count), 1, [&](std::int64_t lo, std::int64_t hi) {
    tree_buffer scratch(tree_scratch_bytes(s, leaves));
    for (std::int64_t i = lo; i < hi; ++i)
      pairwise(s, subtrees[std::size_t(i)].lo, subtrees[std::size_t(i)].hi, values.data() + i * s.size, scratch.data());
  });

  tree_buffer scratch(tree_scratch_bytes(s, leaves));
  std::size_t next = 0;
  auto fold = [&](auto& self, std::int64_t lo, std::int64_t hi, int depth, std::byte* into, std::byte* below) -> void {
    if (depth == split_depth || hi - lo == 1) {
      std::memcpy(into, values.data() + next++ * s.size, s.size);
      return;
    }
    const std::int64_t mid = lo + (hi - lo) / 2;
    self(self, lo, mid, depth + 1, into, below);
    self(self, mid, hi, depth + 1, below, below + s.size);
    s.combine(s.context, into, below);
  };
  fold(fold, 0, leaves, 0, out, scratch.data());
}

/// The partial result of `leaves` leaves: `leaf(i)` makes leaf i's, `combine(a, b)`
/// joins neighbours. `P` is trivially copyable. With `OneLeaf` the caller knows at
/// compile time that there is one leaf, and no tree is compiled.
template <class P, bool OneLeaf = false, class Leaf, class Combine>
P tree(std::int64_t leaves, bool parallel, const Leaf& leaf, const Combine& combine) {
  static_assert(std::is_trivially_copyable_v<P>);
  if constexpr (OneLeaf) {
    return leaf(0);
  } else {
    if (leaves == 1) return leaf(0);  // the common case of short rows and columns, inlined
    struct steps_context {
      const Leaf& leaf;
      const Combine& combine;
    } context{leaf, combine};
    const tree_steps s{
        &context,
        [](const void* c, std::int64_t i, std::byte* out) { ::new (out) P(static_cast<const steps_context*>(c)->leaf(i)); },
        [](const void* c, std::byte* left, const std::byte* right) {
          P& l = *std::launder(reinterpret_cast<P*>(left));
          l = static_cast<const steps_context*>(c)->combine(l, *std::launder(reinterpret_cast<const P*>(right)));
        },
        sizeof(P)};
    P result;
    if (parallel) {
      pairwise_parallel(s, leaves, reinterpret_cast<std::byte*>(&result));
    } else {
      tree_buffer scratch(tree_scratch_bytes(s, leaves));
      pairwise(s, 0, leaves, reinterpret_cast<std::byte*>(&result), scratch.data());
    }
    return result;
  }
}

/// Runs `task(unit, parallel_inside)` for units [0, units) of `work` elements each:
/// many units are spread over the threads, a few large ones are split inside. With
/// `Serial`, all on the calling thread.
template <bool Serial = false, class F>
void for_each_unit(std::int64_t units, std::int64_t work, F&& task) {
  if constexpr (Serial) {
    for (std::int64_t u = 0; u < units; ++u) task(u, false);
  } else if (units < 4 * std::int64_t(config::num_threads()) && work >= 2 * reduction_grain) {
    for (std::int64_t u = 0; u < units; ++u) task(u, true);
  } else {
    kiln::detail::parallel_for(units, std::max<std::int64_t>(1, reduction_grain / std::max<std::int64_t>(work, 1)),
                               [&](std::int64_t lo, std::int64_t hi) {
                                 for (std::int64_t u = lo; u < hi; ++u) task(u, false);
                               });
  }
}

// ---- SIMD helpers shared by scalar and batch code ----------------------------------
// Column code is written once for `V` = an xsimd batch or the element type itself.

/// Elements in a `V`: a batch's lanes, or 1.
template <class V>
inline constexpr int lanes_of = 1;
template <class T, class A>
inline constexpr int lanes_of<xsimd::batch<T, A>> = int(xsimd::batch<T, A>::size);

/// Reads a `V` at `p`.
template <class V, class T>
V load(const T* p) {
  if constexpr (std::is_same_v<V, T>)
    return *p;
  else
    return V::load_unaligned(p);
}

/// Writes `v` at `p`.
template <class V, class T>
void store(const V& v, T* p) {
  if constexpr (std::is_same_v<V, T>)
    *p = v;
  else
    v.store_unaligned(p);
}

// ---- rows: the reduced elements are contiguous ------------------------------------

/// Reduces `n` contiguous elements with several independent SIMD accumulators (to
/// hide the latency of each combine), folded pairwise at the end.
template <class R, class T>
T row_leaf(const T* p, std::int64_t n) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = B::size;
  constexpr int accumulators = 8;
  T result = R::identity();
  std::int64_t i = 0;
  if (n >= w) {
    B total(R::identity());
    if (n >= accumulators * w) {
      std::array<B, accumulators> acc;
      acc.fill(B(R::identity()));
      for (; i + accumulators * w <= n; i += accumulators * w)
        for (int k = 0; k < accumulators; ++k) acc[k] = R::combine(acc[k], B::load_unaligned(p + i + k * w));
      for (int half = accumulators / 2; half > 0; half /= 2)
        for (int k = 0; k < half; ++k) acc[k] = R::combine(acc[k], acc[k + half]);
      total = acc[0];
    }
    for (; i + w <= n; i += w) total = R::combine(total, B::load_unaligned(p + i));
    result = R::horizontal(total);
  }
  for (; i < n; ++i) result = R::combine(result, p[i]);
  return result;
}

/// argmax of `n` contiguous elements whose first has index `first`: the SIMD max,
/// then a search for its first occurrence while the elements are still in cache.
template <class T>
indexed_value<T> row_argmax_leaf(const T* p, std::int64_t n, std::int64_t first) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t w = B::size;
  const T best = row_leaf<extremum_reducer<T, true>>(p, n);
  const bool nan = is_nan(best);  // the max is NaN only when there is one
  std::int64_t i = 0;
  for (; i + w <= n; i += w) {
    B v = B::load_unaligned(p + i);
    if (xsimd::any(nan ? is_nan(v) : v == B(best))) break;
  }
  while (i + 1 < n && !(nan ? is_nan(p[i]) : p[i] == best)) ++i;
  return {best, first + i};
}

/// The partial result of `n` elements `stride` apart, the first with index `first`,
/// combined one at a time in order.
template <class R, class T>
typename R::partial scalar_leaf(const T* p, std::int64_t n, std::int64_t stride, std::int64_t first) {
  if constexpr (R::indexed) {
    typename R::partial acc{p[0], first};
    for (std::int64_t i = 1; i < n; ++i)
      if (R::beats(p[i * stride], acc.value)) acc = {p[i * stride], first + i};
    return acc;
  } else {
    T acc = R::identity();
    for (std::int64_t i = 0; i < n; ++i) acc = R::combine(acc, p[i * stride]);
    return acc;
  }
}

/// The partial result of `n` contiguous elements whose first has index `first`.
template <class R, class T>
typename R::partial contiguous_leaf(const T* p, std::int64_t n, std::int64_t first) {
  if constexpr (R::indexed)
    return row_argmax_leaf(p, n, first);
  else
    return row_leaf<R>(p, n);
}

template <class R, bool Small = false, class T, class Out>
void reduce_rows(const T* x, Out* out, std::int64_t rows, std::int64_t n) {
  using P = typename R::partial;
  const std::int64_t leaves = (n + reduction_leaf - 1) / reduction_leaf;
  auto combine = [](const P& a, const P& b) { return R::combine(a, b); };
  for_each_unit<Small>(rows, n, [&](std::int64_t row, bool parallel) {
    const T* p = x + row * n;
    auto leaf = [&](std::int64_t b) {
      const std::int64_t lo = b * reduction_leaf;
      return contiguous_leaf<R>(p + lo, std::min(reduction_leaf, n - lo), lo);
    };
    out[row] = finish<R>(tree<P, Small>(leaves, parallel, leaf, combine));
  });
}

// ---- columns: SIMD across the contiguous kept dim ---------------------------------

/// Vectors of columns one register chunk reduces at once, and chunks per tile: a
/// tile's leaf reads 2-4 KiB of each row, chunk after chunk, so the hardware
/// prefetchers see each row's page read forward (one chunk alone, a few hundred
/// bytes per page, runs at half the bandwidth).
inline constexpr int column_chunk = 8;
inline constexpr int column_chunks = 4;

/// Reduces rows [r0, r1) (`stride` elements apart) of `active` (at most `NB`)
/// vectors of columns starting at `p` into `out`. `V` is an xsimd batch, or the
/// element type itself for a few single columns.
template <class R, class V, int NB, class T>
void column_chunk_leaf(const T* p, std::int64_t stride, std::int64_t r0, std::int64_t r1, int active,
                       typename R::partial* out) {
  constexpr int w = lanes_of<V>;
  if constexpr (R::indexed) {
    std::array<V, NB> best, where;  // `where`: the row within the leaf, exact in T
    for (int k = 0; k < active; ++k) {
      best[k] = load<V>(p + r0 * stride + k * w);
      where[k] = V(T(0));
    }
    for (std::int64_t r = r0 + 1; r < r1; ++r) {
      const V row = V(T(r - r0));
      for (int k = 0; k < active; ++k) {
        const V v = load<V>(p + r * stride + k * w);
        const auto better = R::beats(v, best[k]);
        best[k] = math::select(better, v, best[k]);
        where[k] = math::select(better, row, where[k]);
      }
    }
    std::array<T, NB * w> values, rows;
    for (int k = 0; k < active; ++k) {
      store(best[k], values.data() + k * w);
      store(where[k], rows.data() + k * w);
    }
    for (int j = 0; j < active * w; ++j) out[j] = {values[j], r0 + std::int64_t(rows[j])};
  } else {
    std::array<V, NB> acc;
    acc.fill(V(R::identity()));
    for (std::int64_t r = r0; r < r1; ++r)
      for (int k = 0; k < active; ++k) acc[k] = R::combine(acc[k], load<V>(p + r * stride + k * w));
    for (int k = 0; k < active; ++k) store(acc[k], out + k * w);
  }
}

/// Reduces `rows` rows (`stride` elements apart) of `vectors` (at most NB x Chunks)
/// vectors of columns starting at `p`, and writes their results to `out`: a
/// pairwise tree over leaves of rows, each leaf a chunk of registers at a time.
template <class R, class V, int NB, int Chunks, bool Small, class T, class Out>
void reduce_tile(const T* p, std::int64_t stride, std::int64_t rows, int vectors, bool parallel, Out* out) {
  using P = std::array<typename R::partial, NB * Chunks * lanes_of<V>>;
  const int used = vectors * lanes_of<V>;
  auto leaf = [&](std::int64_t b) {
    const std::int64_t r0 = b * column_leaf_rows, r1 = std::min(rows, r0 + column_leaf_rows);
    P result{};
    for (int first = 0; first < vectors; first += NB)
      column_chunk_leaf<R, V, NB>(p + first * lanes_of<V>, stride, r0, r1, std::min(NB, vectors - first),
                                  result.data() + first * lanes_of<V>);
    return result;
  };
  auto combine = [used](const P& a, const P& b) {
    P c{};
    for (int j = 0; j < used; ++j) c[j] = R::combine(a[j], b[j]);
    return c;
  };
  const P result = tree<P, Small>((rows + column_leaf_rows - 1) / column_leaf_rows, parallel, leaf, combine);
  for (int j = 0; j < used; ++j) out[j] = finish<R>(result[j]);
}

/// Reduces the middle dim of an (outer, rows, inner) input into (outer, inner):
/// tiles of batches of columns, then one tile of the last few columns one by one.
template <class R, bool Small = false, class T, class Out>
void reduce_columns(const T* x, Out* out, std::int64_t outer, std::int64_t rows, std::int64_t inner) {
  using B = xsimd::batch<T>;
  constexpr int w = int(B::size), tile = column_chunk * column_chunks;
  const std::int64_t batches = inner / w, batch_tiles = (batches + tile - 1) / tile;
  const int rest = int(inner % w);
  const std::int64_t tiles = batch_tiles + (rest > 0);
  for_each_unit<Small>(outer * tiles, rows * tile * w, [&](std::int64_t unit, bool parallel) {
    const std::int64_t o = unit / tiles, t = unit % tiles, column = t < batch_tiles ? t * tile * w : batches * w;
    const T* p = x + o * rows * inner + column;
    Out* dst = out + o * inner + column;
    if (t < batch_tiles)
      reduce_tile<R, B, column_chunk, column_chunks, Small>(p, inner, rows,
                                                            int(std::min<std::int64_t>(tile, batches - t * tile)), parallel, dst);
    else
      reduce_tile<R, T, w, 1, Small>(p, inner, rows, rest, parallel, dst);
  });
}

/// Reduces rows shorter than a batch one element at a time: a row is too short for
/// SIMD to pay, and neighbouring rows' independent chains keep the core busy.
template <class R, bool Small = false, class T, class Out>
void reduce_short_rows(const T* x, Out* out, std::int64_t rows, std::int64_t n) {
  kiln::detail::ranges_for<Small>(rows, std::max<std::int64_t>(1, reduction_grain / n), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) out[r] = finish<R>(scalar_leaf<R>(x + r * n, n, 1, 0));
  });
}

// ---- anything else: strided ---------------------------------------------------------

/// Dims (sizes and input strides) walked in row-major order.
struct strided_dims {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{}, stride{};

  /// The input offset of the `flat`-th position, with its multi-index in `idx`.
  std::int64_t offset(std::int64_t flat, std::array<std::int64_t, max_rank>& idx) const {
    std::int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = flat % size[d];
      flat /= size[d];
      off += idx[d] * stride[d];
    }
    return off;
  }
};

/// Reduces the positions [k0, k1) of the reduced dims `walk` from `base`, a run of
/// the innermost reduced dim at a time (contiguous runs take the row kernels).
template <class R, class T>
typename R::partial strided_leaf(const T* base, const strided_dims& walk, std::int64_t k0, std::int64_t k1) {
  const int last = walk.rank - 1;
  const std::int64_t run_size = walk.size[last], run_stride = walk.stride[last];
  std::array<std::int64_t, max_rank> idx{};
  std::int64_t off = walk.offset(k0, idx);
  std::optional<typename R::partial> acc;
  for (std::int64_t k = k0; k < k1;) {
    const std::int64_t len = std::min(run_size - idx[last], k1 - k);
    const typename R::partial part =
        run_stride == 1 ? contiguous_leaf<R>(base + off, len, k) : scalar_leaf<R>(base + off, len, run_stride, k);
    acc = acc ? R::combine(*acc, part) : part;
    k += len;
    off += len * run_stride;
    idx[last] += len;
    for (int d = last; d > 0 && idx[d] == walk.size[d]; --d) {  // carry into the outer reduced dims
      off += walk.stride[d - 1] - walk.size[d] * walk.stride[d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
  return *acc;
}

/// The input's dims without size-1 dims, neighbours of the same role merged.
struct reduction_layout {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{};
  std::array<bool, max_rank> reduced{};

  constexpr reduction_layout(const shape& s, const std::array<bool, max_rank>& reduced_dims) {
    for (int d = 0; d < s.rank(); ++d) {
      if (s[d] == 1) continue;
      if (rank > 0 && reduced[rank - 1] == reduced_dims[d]) {
        size[rank - 1] *= s[d];
      } else {
        size[rank] = s[d];
        reduced[rank] = reduced_dims[d];
        ++rank;
      }
    }
  }
  /// The kept dims (`role` false) or the reduced dims (`role` true) with their strides.
  constexpr strided_dims dims(bool role) const {
    strided_dims out;
    std::int64_t stride = 1;
    std::array<std::int64_t, max_rank> strides{};
    for (int d = rank - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= size[d];
    }
    for (int d = 0; d < rank; ++d) {
      if (reduced[d] == role) {
        out.size[out.rank] = size[d];
        out.stride[out.rank++] = strides[d];
      }
    }
    return out;
  }
};

template <class R, bool Small = false, class T, class Out>
void reduce_strided(const T* x, Out* out, const reduction_layout& layout, std::int64_t outputs, std::int64_t count) {
  using P = typename R::partial;
  const strided_dims kept = layout.dims(false), walk = layout.dims(true);
  const std::int64_t leaves = (count + reduction_leaf - 1) / reduction_leaf;
  auto combine = [](const P& a, const P& b) { return R::combine(a, b); };
  for_each_unit<Small>(outputs, count, [&](std::int64_t o, bool parallel) {
    std::array<std::int64_t, max_rank> idx{};
    const T* base = x + kept.offset(o, idx);
    auto leaf = [&](std::int64_t b) {
      const std::int64_t k0 = b * reduction_leaf;
      return strided_leaf<R>(base, walk, k0, std::min(count, k0 + reduction_leaf));
    };
    out[o] = finish<R>(tree<P, Small>(leaves, parallel, leaf, combine));
  });
}

/// Which kernel reduces a layout: every output is one element (or none), the reduced
/// dims are interleaved with kept ones (strided), a kept contiguous dim follows the
/// reduced one (columns), or the reduced elements are contiguous: rows shorter than a
/// batch, or rows. `outer` and `inner` are the kept sizes before and after the
/// reduced run.
struct reduction_plan {
  enum kind_t { identity, strided, columns, short_rows, rows } kind = identity;
  std::int64_t outer = 1, inner = 1;
};

/// The plan for `count` elements per output of `layout`, with `lanes` per SIMD batch.
constexpr reduction_plan plan_reduction(const reduction_layout& layout, std::int64_t count, std::int64_t lanes) {
  if (count <= 1) return {reduction_plan::identity};
  int runs = 0, run = 0;
  for (int d = 0; d < layout.rank; ++d) {
    if (layout.reduced[d]) {
      ++runs;
      run = d;
    }
  }
  if (runs > 1) return {reduction_plan::strided};
  reduction_plan plan;
  for (int d = 0; d < run; ++d) plan.outer *= layout.size[d];
  for (int d = run + 1; d < layout.rank; ++d) plan.inner *= layout.size[d];
  plan.kind = plan.inner > 1 ? reduction_plan::columns : count < lanes ? reduction_plan::short_rows : reduction_plan::rows;
  return plan;
}

/// Whether a reduction of `elements` elements in all, `count` per output, planned as
/// `plan`, is below the parallel grain with one leaf per output: it then runs on the
/// calling thread without a tree, as the general path would run it.
constexpr bool one_small_task(const reduction_plan& plan, std::int64_t elements, std::int64_t count) {
  return elements <= reduction_grain && count <= (plan.kind == reduction_plan::columns ? column_leaf_rows : reduction_leaf);
}

/// Runs plan `plan`, of kind `K`: the compile-time tier, which knows its plan at
/// compile time, instantiates one kernel, and with `Small` (one_small_task) neither
/// the tree nor the thread pool; `reduce` dispatches at run time.
template <reduction_plan::kind_t K, class R, bool Small = false, class T, class Out>
void reduce_planned(const T* x, Out* out, const reduction_layout& layout, const reduction_plan& plan, std::int64_t outputs,
                    std::int64_t count) {
  if constexpr (K == reduction_plan::identity) {  // nothing to combine: the identity, or each element itself
    kiln::detail::ranges_for<Small>(outputs, reduction_grain, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        if constexpr (R::indexed)
          out[i] = 0;
        else
          out[i] = count == 0 ? R::identity() : x[i];
      }
    });
  } else if constexpr (K == reduction_plan::strided) {
    reduce_strided<R, Small>(x, out, layout, outputs, count);
  } else if constexpr (K == reduction_plan::columns) {
    reduce_columns<R, Small>(x, out, plan.outer, count, plan.inner);
  } else if constexpr (K == reduction_plan::short_rows) {
    reduce_short_rows<R, Small>(x, out, plan.outer, count);
  } else {
    reduce_rows<R, Small>(x, out, plan.outer, count);
  }
}

/// Reduces `x` (laid out as `layout`) into `outputs` values of `count` elements each.
template <class R, class T, class Out>
void reduce(const T* x, Out* out, const reduction_layout& layout, std::int64_t outputs, std::int64_t count) {
  const reduction_plan plan = plan_reduction(layout, count, std::int64_t(xsimd::batch<T>::size));
  switch (plan.kind) {
    case reduction_plan::identity: return reduce_planned<reduction_plan::identity, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::strided: return reduce_planned<reduction_plan::strided, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::columns: return reduce_planned<reduction_plan::columns, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::short_rows:
      return reduce_planned<reduction_plan::short_rows, R>(x, out, layout, plan, outputs, count);
    case reduction_plan::rows: return reduce_planned<reduction_plan::rows, R>(x, out, layout, plan, outputs, count);
  }
}

/// Turns `outputs` sums of `count` elements each, at `out`, into means.
template <bool Small = false, class T>
void sums_to_means(T* out, std::int64_t outputs, std::int64_t count) {
  kiln::detail::ranges_for<Small>(outputs, reduction_grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) out[i] = ops::mean_of<T>(out[i], count);
  });
}

}  // namespace cpu

template <ops::reduction Op>
void compute(cpu_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  using kind = ops::reduction_kind;
  const shape& s = in[0].shape;
  const cpu::reduction_layout layout(s, ops::reduced_dims(op.axis, s.rank()));
  const std::int64_t outputs = out.size(), count = ops::reduced_count(s, op.axis);
  ops::visit_numeric(in[0].dtype, [&]<class T>() {
    using R = cpu::reducer_for<Op::kind, T>;
    using Out = std::conditional_t<R::indexed, std::int64_t, T>;
    cpu::reduce<R>(in[0].as<T>(), out.as<Out>(), layout, outputs, count);
    if constexpr (Op::kind == kind::mean) cpu::sums_to_means(out.as<T>(), outputs, count);
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/cpu/reduction.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_REDUCTION_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
// ----- begin kiln/ops/linalg.hpp -----
/// \file
/// Linear algebra and NN ops: `matmul` (2-D and batched, batch dims broadcast) and
/// `conv2d` (NHWC input, HWIO filters, strides, VALID or SAME padding).

#include <array>
#include <string_view>
#include <utility>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_SHAPE_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_SHAPE_OPS_HPP
// ----- begin kiln/ops/shape_ops.hpp -----
/// \file
/// Shape and data-movement ops: reshape, transpose, concat, stack, gather, `x[i]`,
/// slice, shape_of, set_item, pad_rows and crop_or_pad. None computes new values, so each accepts every dtype,
/// strings included. The rules handle `kiln::none` dims and unknown ranks (the
/// tracer's partial shapes); reshape, `x[i]` and shape_of only re-describe a buffer
/// and so provide `evaluate` instead of kernels. Indices and ranges that do not fit
/// the input raise kiln::invalid_argument_error, as TensorFlow's kernels do, from
/// the `check_values` overloads below, before anything is allocated. Each op's
/// `attributes()` ("perm=[1, 0]") is appended to the errors of its rules, which
/// otherwise could only show the inputs.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_SMALL_VECTOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_SMALL_VECTOR_HPP
// ----- begin kiln/core/small_vector.hpp -----
/// \file
/// `small_vector`: a vector that keeps up to N elements inline, so the per-op
/// bookkeeping of a few inputs (their shapes, dtypes, views) costs no heap
/// allocation and no zero-filling of unused slots.

#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <utility>

namespace kiln::detail {

template <class T, std::size_t N>
class small_vector {
 public:
  small_vector() = default;
  small_vector(const small_vector&) = delete;
  small_vector& operator=(const small_vector&) = delete;
  ~small_vector() {
    std::destroy(begin(), end());
    if (data_ != inline_data()) ::operator delete(data_, std::align_val_t(alignof(T)));
  }

  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    T* fresh = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
    std::uninitialized_move(begin(), end(), fresh);
    std::destroy(begin(), end());
    if (data_ != inline_data()) ::operator delete(data_, std::align_val_t(alignof(T)));
    data_ = fresh;
    capacity_ = n;
  }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == capacity_) reserve(2 * capacity_);
    return *new (data_ + size_++) T(std::forward<Args>(args)...);
  }

  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  std::size_t size() const { return size_; }
  operator std::span<const T>() const { return {data_, size_}; }

 private:
  T* inline_data() { return reinterpret_cast<T*>(inline_); }
  alignas(T) unsigned char inline_[N * sizeof(T)];
  T* data_ = inline_data();
  std::size_t size_ = 0;
  std::size_t capacity_ = N;
};

}  // namespace kiln::detail
// ----- end kiln/core/small_vector.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_SMALL_VECTOR_HPP

namespace kiln {
namespace detail {

/// The most specific shape that both specs allow, or a failure when two known dims differ.
constexpr shape_result merge_shapes(const shape& a, const shape& b) {
  if (!a.has_known_rank()) return {b};
  if (!b.has_known_rank()) return {a};
  if (a.rank() != b.rank()) return {{}, "all inputs must have the same shape"};
  shape out = a;
  for (int d = 0; d < a.rank(); ++d) {
    if (a[d] == none) out[d] = b[d];
    else if (b[d] != none && b[d] != a[d]) return {{}, "all inputs must have the same shape"};
  }
  return {out};
}

/// The dtype rule of ops that join tensors: all of one dtype, kept.
constexpr dtype_result same_dtype(std::span<const dtype> in) {
  for (dtype t : in)
    if (t != in[0]) return {in[0], "all inputs must have the same dtype"};
  return {in.empty() ? float32 : in[0]};
}

/// `[4, -1]`: dims as the user wrote them (-1 for kiln::none).
KILN_LIBRARY_INLINE std::string dims_text(const shape& s);

}  // namespace detail

namespace ops {

/// `reshape(x, new_shape)`: the same elements in another shape; one dim may be
/// kiln::none (-1), inferred from the element count.
struct reshape {
  static constexpr std::string_view name = "reshape";
  static constexpr std::string_view onnx_name = "Reshape";
  static constexpr int arity = 1;
  kiln::shape new_shape;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"shape", &reshape::new_shape}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (!new_shape.has_known_rank()) return {{}, "the new shape must have a known rank"};
    int inferred = -1;
    kiln::shape known_dims;  // the new shape without its -1 dim
    for (int d = 0; d < new_shape.rank(); ++d) {
      if (new_shape[d] != none) {
        known_dims.push_back(new_shape[d]);
      } else if (inferred >= 0) {
        return {{}, "only one dim of the new shape may be -1 (kiln::none)"};
      } else {
        inferred = d;
      }
    }
    if (!known_dims.count_fits()) return {{}, "the new shape has more elements than int64 can count"};
    const std::int64_t known = known_dims.num_elements();
    if (!in[0].is_fully_defined()) return {new_shape};  // the -1 dim stays unknown until run time
    if (!in[0].count_fits()) return {{}, "the input has more elements than int64 can count"};
    const std::int64_t count = in[0].num_elements();
    if (inferred < 0) {
      if (known != count) return {{}, "the new shape has a different number of elements"};
      return {new_shape};
    }
    if (known == 0) {
      if (count == 0) return {{}, "cannot infer the -1 dim of an empty tensor when another dim is 0"};
      return {{}, "the new shape has a different number of elements"};
    }
    if (count % known != 0) return {{}, "the new shape has a different number of elements"};
    kiln::shape out = new_shape;
    out[inferred] = count / known;
    return {out};
  }
  /// Shares the input's buffer: no element is copied.
  KILN_LIBRARY_INLINE tensor evaluate(std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  template <class G> void gradient(G& g) const { g.give(0, G::reshape(g.dy(), g.x(0).t.shape())); }
  constexpr bool operator==(const reshape&) const = default;
};

/// `transpose(x, perm)`: dim i of the result is dim `perm[i]` of `x`; an empty
/// `perm` reverses the dims.
struct transpose {
  static constexpr std::string_view name = "transpose";
  static constexpr std::string_view onnx_name = "Transpose";
  static constexpr int arity = 1;
  int_list perm;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"perm", &transpose::perm}}; }

  /// The permutation for a tensor of `rank` dims (`perm`, or the reversal when it is empty).
  constexpr int_list permutation(int rank) const {
    if (!perm.empty()) return perm;
    int_list reversed;
    for (int d = rank - 1; d >= 0; --d) reversed.push_back(d);
    return reversed;
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape& s = in[0];
    if (!s.has_known_rank() && perm.empty()) return {kiln::shape(unknown_rank)};
    const int rank = s.has_known_rank() ? s.rank() : perm.size();
    if (perm.size() != rank && !perm.empty()) return {{}, "perm must have one entry per dim"};
    const int_list p = permutation(rank);
    std::array<bool, max_rank> seen{};
    kiln::shape out;
    for (int d = 0; d < rank; ++d) {
      if (p[d] < 0 || p[d] >= rank || seen[p[d]]) return {{}, "perm must be a permutation of 0, 1, ..., rank - 1"};
      seen[p[d]] = true;
      out.push_back(s.has_known_rank() ? s[int(p[d])] : none);
    }
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  /// The gradient goes back through the inverse permutation.
  template <class G> void gradient(G& g) const {
    const int rank = g.x(0).t.rank();
    const int_list p = permutation(rank);
    int_list inverse;  // inverse[p[j]] == j
    for (int d = 0; d < rank; ++d)
      for (int j = 0; j < rank; ++j)
        if (p[j] == d) inverse.push_back(j);
    g.give(0, G::transpose(g.dy(), inverse));
  }
  constexpr bool operator==(const transpose&) const = default;
};

/// `concat({a, b}, axis)`: the inputs joined along an existing dim.
struct concat {
  static constexpr std::string_view name = "concat";
  static constexpr std::string_view onnx_name = "Concat";
  static constexpr int arity = variadic;  ///< one or more inputs
  std::int64_t axis = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"axis", &concat::axis}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return detail::same_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (in.empty()) return {{}, "needs at least one input"};
    int rank = -1;
    for (const kiln::shape& s : in)
      if (s.has_known_rank()) rank = s.rank();
    if (rank < 0) return {kiln::shape(unknown_rank)};
    if (rank == 0) return {{}, "cannot concatenate scalars (use kiln::stack)"};
    const int a = normalize_axis(axis, rank);
    if (a < 0) return {{}, "axis is out of range for the inputs' rank"};
    kiln::shape out;
    for (int d = 0; d < rank; ++d) out.push_back(d == a ? 0 : none);
    for (const kiln::shape& s : in) {
      if (!s.has_known_rank()) {
        out[a] = none;
        continue;
      }
      if (s.rank() != rank) return {{}, "all inputs must have the same rank"};
      for (int d = 0; d < rank; ++d) {
        if (d == a) {
          if (s[a] == none) out[a] = none;
          else if (out[a] != none && out[a] > std::numeric_limits<std::int64_t>::max() - s[a])
            return {{}, "the result would have more elements than int64 can count"};
          else if (out[a] != none) out[a] += s[a];
        } else if (out[d] == none) {
          out[d] = s[d];
        } else if (s[d] != none && s[d] != out[d]) {
          return {{}, "all inputs must have the same dims except along the axis"};
        }
      }
    }
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const concat&) const = default;
  /// Each input's gradient is its slice of dy along the axis.
  template <class G> void gradient(G& g) const;
};

/// `stack({a, b}, axis)`: inputs of one shape joined along a new dim.
struct stack {
  static constexpr std::string_view name = "stack";
  static constexpr int arity = variadic;  ///< one or more inputs
  std::int64_t axis = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"axis", &stack::axis}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return detail::same_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (in.empty()) return {{}, "needs at least one input"};
    shape_result common{in[0]};
    for (const kiln::shape& s : in.subspan(1)) {
      common = detail::merge_shapes(common.value, s);
      if (!common.ok()) return common;
    }
    if (!common.value.has_known_rank()) return {kiln::shape(unknown_rank)};
    const int rank = common.value.rank();
    if (rank == max_rank) return {{}, "the result would have more dims than kiln supports"};
    const int a = normalize_axis(axis, rank + 1);
    if (a < 0) return {{}, "axis is out of range for the result's rank"};
    kiln::shape out;
    for (int d = 0; d <= rank; ++d) {
      if (d == a) out.push_back(std::int64_t(in.size()));
      if (d < rank) out.push_back(common.value[d]);
    }
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const stack&) const = default;
  /// Input i's gradient is dy at i along the new dim.
  template <class G> void gradient(G& g) const;
};

/// `gather(x, indices, axis)`: the slices of `x` along `axis` that `indices` (int32
/// or int64, any shape) name; the result's shape is
/// `x.shape[:axis] + indices.shape + x.shape[axis + 1:]`.
struct gather {
  static constexpr std::string_view name = "gather";
  static constexpr std::string_view onnx_name = "Gather";
  static constexpr int arity = 2;
  std::int64_t axis = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"axis", &gather::axis}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "indices must be int32 or int64"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &indices = in[1];
    if (x.has_known_rank() && x.rank() == 0) return {{}, "cannot gather from a scalar"};
    if (!x.has_known_rank() || !indices.has_known_rank()) return {kiln::shape(unknown_rank)};
    const int a = normalize_axis(axis, x.rank());
    if (a < 0) return {{}, "axis is out of range for the input's rank"};
    if (x.rank() - 1 + indices.rank() > max_rank) return {{}, "the result would have more dims than kiln supports"};
    kiln::shape out;
    for (int d = 0; d < a; ++d) out.push_back(x[d]);
    for (std::int64_t d : indices) out.push_back(d);
    for (int d = a + 1; d < x.rank(); ++d) out.push_back(x[d]);
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const gather&) const = default;
  /// dy summed into the rows it was gathered from (unsorted_segment_sum).
  template <class G> void gradient(G& g) const;
};

/// `unsorted_segment_sum(data, segment_ids, num_segments)`: the sum of the slices of
/// `data` that share a segment id, one per segment in [0, num_segments) (0 where no id
/// names it; negative ids are dropped, as TensorFlow drops them). `segment_ids`
/// (int32 or int64) has the shape of `data`'s dims from `axis` on; the result's shape
/// is `data.shape[:axis] + (num_segments,) + data.shape[axis + ids.rank:]`. The adjoint
/// of gather, whose gradient it is. Each segment sums its slices in the order of
/// their ids, on every backend, so every backend gives the same bits.
struct unsorted_segment_sum {
  static constexpr std::string_view name = "unsorted_segment_sum";
  static constexpr int arity = 2;
  std::int64_t num_segments = 0;
  std::int64_t axis = 0;  ///< the dim of `data` where the ids' dims start (gather's gradient sets it)
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"num_segments", &unsorted_segment_sum::num_segments},
                      attribute{"axis", &unsorted_segment_sum::axis}};
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "segment ids must be int32 or int64"};
    if (!dtypes::numeric.contains(in[0])) return {in[0], "data must be numbers"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &data = in[0], &ids = in[1];
    if (num_segments < 0) return {{}, "num_segments must not be negative"};
    if (!data.has_known_rank() || !ids.has_known_rank()) return {kiln::shape(unknown_rank)};
    if (axis < 0 || axis + ids.rank() > data.rank()) return {{}, "segment ids have more dims than data has from the axis on"};
    if (data.rank() - ids.rank() + 1 > max_rank) return {{}, "the result would have more dims than kiln supports"};
    for (int d = 0; d < ids.rank(); ++d) {
      const std::int64_t want = data[int(axis) + d];
      if (want != none && ids[d] != none && want != ids[d])
        return {{}, "segment ids must have the shape of data's dims from the axis on"};
    }
    kiln::shape out;
    for (int d = 0; d < axis; ++d) out.push_back(data[d]);
    out.push_back(num_segments);
    for (int d = int(axis) + ids.rank(); d < data.rank(); ++d) out.push_back(data[d]);
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const unsorted_segment_sum&) const = default;
  /// dy gathered at the ids.
  template <class G> void gradient(G& g) const;
};

/// `x[i]`: the i-th slice along the first dim (negative i counts from the end).
/// Named as TensorFlow names the node that indexing creates.
struct index {
  static constexpr std::string_view name = "strided_slice";
  static constexpr std::string_view onnx_name = "Gather";
  static constexpr int arity = 1;
  std::int64_t i = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"index", &index::i}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape& s = in[0];
    if (!s.has_known_rank()) return {kiln::shape(unknown_rank)};
    if (s.rank() == 0) return {{}, "a scalar cannot be indexed"};
    return {kiln::shape(s.dims().subspan(1))};
  }
  /// Shares the input's buffer: the slice is one contiguous window of it.
  KILN_LIBRARY_INLINE tensor evaluate(std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const index&) const = default;
  /// dy in place of the row, zeros around it.
  template <class G> void gradient(G& g) const;
};

/// `set_item(x, i, value)`: `x` with its i-th slice along the first dim replaced by
/// `value` (TensorFlow's TensorListSetItem, behind kiln::tensor_array::write). It
/// builds a new tensor from slices of `x` and `value` with slice and concat, so it
/// runs on every backend those do.
struct set_item {
  static constexpr std::string_view name = "set_item";
  static constexpr int arity = 3;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "the index must be int32 or int64"};
    if (in[2] != in[0]) return {in[0], "the value must have the dtype of the tensor it is written to"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &i = in[1], &value = in[2];
    if (i.has_known_rank() && i.rank() != 0) return {{}, "the index must be a scalar"};
    if (!x.has_known_rank()) return {x};
    if (x.rank() == 0) return {{}, "cannot write a slice of a scalar"};
    const shape_result row = detail::merge_shapes(kiln::shape(x.dims().subspan(1)), value);
    if (!row.ok()) return {{}, "the value must have the shape of one slice along the first dim"};
    return {x};
  }
  template <class = void>
  tensor evaluate(std::span<const tensor* const> in) const;
  /// The result written into the buffer of `x`, the first input, when no one else
  /// holds it (a graph's value that no later node reads: a loop that accumulates rows
  /// in a tensor_array writes each row, where a copy per row made it quadratic); else,
  /// or for a string tensor or one off the CPU, a copy as evaluate() makes. `in[1]`
  /// and `in[2]` are the index and the value.
  template <class = void>
  tensor evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const set_item&) const = default;
  /// dy with zeros in place of the row for `x`; dy's row for `value`.
  template <class G> void gradient(G& g) const;
};

/// `pad_rows(x, rows)`: `x` with rows of zeros appended along its first dim until it
/// has `rows` (an int32 or int64 scalar), or `x` itself when it has that many
/// already (TensorFlow's TensorListResize, growing only). It makes the elements of
/// a kiln::tensor_array whose size is a tensor and grows one with dynamic_size; as
/// the number of rows is a value, the result's first dim is known only when it runs.
struct pad_rows {
  static constexpr std::string_view name = "pad_rows";
  static constexpr int arity = 2;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "the number of rows must be int32 or int64"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &rows = in[1];
    if (rows.has_known_rank() && rows.rank() != 0) return {{}, "the number of rows must be a scalar"};
    if (!x.has_known_rank()) return {x};
    if (x.rank() == 0) return {{}, "cannot add rows to a scalar"};
    kiln::shape out = x;
    out[0] = none;
    return {out};
  }
  template <class = void>
  tensor evaluate(std::span<const tensor* const> in) const;
  /// The result in the buffer of `x`, the first input, when no one else holds it and
  /// its spare room is enough, else in a new buffer with room for twice the rows
  /// (grow()), so that a tensor_array grown a row at a time in a loop costs amortized
  /// O(1) per row (a copy per row made it quadratic); strings and tensors off the CPU
  /// as evaluate().
  template <class = void>
  tensor evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const;
  /// `x` (on the CPU, not strings) with rows of zeros appended until it has `rows`,
  /// more than it has: in its buffer's spare room when it is the buffer's sole owner
  /// and the room is enough, else in a new buffer with room for twice its rows.
  template <class = void>
  static tensor grow(tensor&& x, std::int64_t rows);
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const pad_rows&) const = default;
  /// dy without the added rows.
  template <class G> void gradient(G& g) const;
};

/// `crop_or_pad(x, like)`: a tensor of `like`'s shape (only its shape is read) and
/// `x`'s dtype whose element i is x's element i + start along every dim, zeros where
/// that falls outside x; start[d] counts `offset[d]` from x's first element, or with
/// `align[d]` == 1 from where the window would begin if its end met x's end. It cuts
/// and pads tensors whose dims are known only when the graph runs, in the gradients of
/// concat, slice and pad_rows, and is its own gradient (negated offsets).
struct crop_or_pad {
  static constexpr std::string_view name = "crop_or_pad";
  static constexpr int arity = 2;
  int_list offset;
  int_list align;  // per dim: 0 counts offset from x's start, 1 from its end
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"offset", &crop_or_pad::offset}, attribute{"align", &crop_or_pad::align}};
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &like = in[1];
    if (offset.size() != align.size()) return {{}, "offset and align must have one entry per dim"};
    for (std::int64_t a : align)
      if (a != 0 && a != 1) return {{}, "align must be 0 (from the start) or 1 (from the end) in every dim"};
    if ((x.has_known_rank() && x.rank() != offset.size()) || (like.has_known_rank() && like.rank() != offset.size()))
      return {{}, "x, like, offset and align must have one rank"};
    if (!like.has_known_rank()) return {kiln::shape(std::vector<std::int64_t>(std::size_t(offset.size()), none))};
    return {like};
  }
  /// Where the window of dim `d` starts in x, for an x dim of `in` elements and a
  /// result dim of `out`.
  constexpr std::int64_t start(int d, std::int64_t in, std::int64_t out) const {
    return offset[d] + (align[d] ? in - out : 0);
  }
  template <class = void>
  tensor evaluate(std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const crop_or_pad&) const = default;
  /// crop_or_pad of dy to x's shape with the offsets negated.
  template <class G> void gradient(G& g) const;
};

/// `slice(x, begin, size)`: the block of `size[d]` elements from `begin[d]` along
/// every dim d; a size of -1 takes everything to the end.
struct slice {
  static constexpr std::string_view name = "slice";
  static constexpr std::string_view onnx_name = "Slice";
  static constexpr int arity = 1;
  int_list begin;
  int_list size;
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"begin", &slice::begin},
                      attribute{"size", &slice::size}};
  }

  /// The extent along dim `d` of a dim of `dim` elements; out-of-range values give
  /// 0 here, and check_values rejects them before anything runs.
  constexpr std::int64_t extent(int d, std::int64_t dim) const {
    if (size[d] >= 0) return size[d];
    if (dim == none) return none;
    if (size[d] != -1 || begin[d] < 0 || begin[d] > dim) return 0;
    return dim - begin[d];
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape& s = in[0];
    if (begin.size() != size.size() || (s.has_known_rank() && begin.size() != s.rank()))
      return {{}, "begin and size must have one entry per dim"};
    kiln::shape out;
    for (int d = 0; d < begin.size(); ++d) out.push_back(extent(d, s.has_known_rank() ? s[d] : none));
    return {out};
  }
  /// The first dim of `s` that begin and size do not fit (begin in [0, dim], size -1
  /// or in [0, dim - begin]), or -1 when they fit every dim.
  constexpr int first_unfit_dim(const kiln::shape& s) const {
    for (int d = 0; d < s.rank(); ++d)
      if (begin[d] < 0 || begin[d] > s[d] || size[d] < -1 || size[d] > s[d] - begin[d]) return d;
    return -1;
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const slice&) const = default;
  /// dy in place of the slice, zeros around it.
  template <class G> void gradient(G& g) const;
};

// ---- gradients of the ops above, which run each other -------------------------

/// `rank` zeros: where a slice from the first element begins.
KILN_LIBRARY_INLINE int_list origin(int rank);

/// The slice of `x` of shape `size` at `begin` (the shape ops' formulas cut dy and
/// zeros with it).
template <class G, class V>
V slice_of(const V& x, const int_list& begin, const kiln::shape& size) {
  int_list sizes;
  for (std::int64_t d : size) sizes.push_back(int(d));
  return G::run(slice{begin, sizes}, x);
}

/// Each entry of `l` negated: the offsets that undo a window's.
KILN_LIBRARY_INLINE int_list negated(const int_list& l);

/// Zeros per dim, `rank` of them, but `at` in dim `axis`.
KILN_LIBRARY_INLINE int_list along(int rank, int axis, std::int64_t at);

template <class G>
void concat::gradient(G& g) const {
  const int rank = g.x(0).t.rank(), a = normalize_axis(axis, rank), n = int(g.arity());
  // The inputs whose sizes along the axis are known only when the graph runs: those
  // up to the first are cut at offsets from dy's start, those from the last at
  // offsets from its end; one between two has neither.
  int first = n, last = -1;
  for (int i = 0; i < n; ++i)
    if (g.x(i).t.shape()[a] == none) first = std::min(first, i), last = i;
  if (last - first > 1)
    throw unavailable_error("concat: no gradient for input " + std::to_string(first + 1) + ", between inputs " +
                            std::to_string(first) + " and " + std::to_string(last) + " whose sizes along axis " +
                            std::to_string(a) + " are known only when the graph runs");
  std::int64_t offset = 0;
  for (int i = 0; i <= std::min(first, n - 1); ++i) {
    const kiln::shape s = g.x(i).t.shape();
    if (s.is_fully_defined())
      g.give(i, slice_of<G>(g.dy(), along(rank, a, offset), s));
    else
      g.give(i, G::run(crop_or_pad{along(rank, a, offset), origin(rank)}, g.dy(), g.x(i)));
    offset += s[a];
  }
  std::int64_t after = 0;
  for (int i = n - 1; i > first; --i) {
    g.give(i, G::run(crop_or_pad{along(rank, a, -after), along(rank, a, 1)}, g.dy(), g.x(i)));
    after += g.x(i).t.shape()[a];
  }
}

template <class G>
void stack::gradient(G& g) const {
  const kiln::shape out = g.y().t.shape();
  const int a = normalize_axis(axis, out.rank());
  kiln::shape one = out;
  one[a] = 1;
  for (int i = 0; i < int(g.arity()); ++i) {
    int_list begin;
    for (int d = 0; d < out.rank(); ++d) begin.push_back(d == a ? i : 0);
    g.give(i, G::reshape(slice_of<G>(g.dy(), begin, one), g.x(i).t.shape()));
  }
}

template <class G>
void gather::gradient(G& g) const {
  const kiln::shape x = g.x(0).t.shape();
  const int a = normalize_axis(axis, x.rank());
  if (x[a] == none)
    throw unavailable_error("gather: no gradient for a tensor of shape " + x.str() + " whose size along axis " +
                            std::to_string(a) + " is known only when the graph runs");
  g.give(0, G::run(unsorted_segment_sum{x[a], a}, g.dy(), g.x(1)));
}

template <class G>
void unsorted_segment_sum::gradient(G& g) const {
  // TensorFlow's _GatherDropNegatives: a dropped (negative) id's slice gets zeros.
  const auto ids = g.x(1), kept = G::run(greater_equal{}, ids, ids.scalar(0));
  const auto rows = G::run(gather{axis}, g.dy(), G::run(where{}, kept, ids, ids.scalar(0)));
  kiln::shape mask = ids.t.shape();  // the ids' dims, then ones: broadcasts against rows
  for (int d = int(axis) + ids.t.rank(); d < rows.t.rank(); ++d) mask.push_back(1);
  g.give(0, G::run(where{}, G::reshape(kept, mask), rows, rows.scalar(0)));
}

template <class G>
void set_item::gradient(G& g) const {
  g.give(0, G::run(set_item{}, g.dy(), g.x(1), g.zeros_like(2)));
  g.give(2, G::run(gather{}, g.dy(), g.x(1)));
}

template <class G>
void pad_rows::gradient(G& g) const {
  const kiln::shape x = g.x(0).t.shape();
  if (x.is_fully_defined())
    g.give(0, slice_of<G>(g.dy(), origin(x.rank()), x));
  else
    g.give(0, G::run(crop_or_pad{origin(x.rank()), origin(x.rank())}, g.dy(), g.x(0)));
}

template <class G>
void crop_or_pad::gradient(G& g) const {
  g.give(0, G::run(crop_or_pad{negated(offset), align}, g.dy(), g.x(0)));
}

/// `block`, a slice at `begin` of a tensor of shape `in`, with zeros (a tensor of
/// shape `in`) around it: the gradient of the slice, built dim by dim.
template <class G, class V>
V zeros_around(V block, const kiln::shape& in, const int_list& begin, const V& zeros) {
  kiln::shape current = block.t.shape();
  for (int d = 0; d < in.rank(); ++d) {
    const std::int64_t before = begin[d], after = in[d] - begin[d] - current[d];
    kiln::shape part = current;
    if (before > 0) {
      part[d] = before;
      block = G::run(concat{d}, slice_of<G>(zeros, origin(in.rank()), part), block);
    }
    if (after > 0) {
      part[d] = after;
      block = G::run(concat{d}, block, slice_of<G>(zeros, origin(in.rank()), part));
    }
    current[d] = in[d];
  }
  return block;
}

template <class G>
void slice::gradient(G& g) const {
  const kiln::shape x = g.x(0).t.shape();
  if (x.is_fully_defined()) {
    g.give(0, zeros_around<G>(g.dy(), x, begin, g.zeros_like(0)));
  } else {
    g.give(0, G::run(crop_or_pad{negated(begin), origin(x.rank())}, g.dy(), g.x(0)));
  }
}

template <class G>
void index::gradient(G& g) const {
  const kiln::shape in = g.x(0).t.shape();
  if (!in.is_fully_defined()) {  // dy as one row, padded to x's shape; a negative i counts from the end
    const crop_or_pad pad{along(in.rank(), 0, i < 0 ? -i - 1 : -i), along(in.rank(), 0, i < 0 ? 1 : 0)};
    g.give(0, G::run(pad, G::run(stack{0}, g.dy()), g.x(0)));
    return;
  }
  kiln::shape row = in;
  row[0] = 1;
  int_list begin;
  for (int d = 0; d < in.rank(); ++d) begin.push_back(d > 0 ? 0 : int(i < 0 ? i + in[0] : i));
  g.give(0, zeros_around<G>(G::reshape(g.dy(), row), in, begin, g.zeros_like(0)));
}

/// `shape_of(x)`: the dims of `x` as a 1-D int32 tensor.
struct shape_of {
  static constexpr std::string_view name = "shape";
  static constexpr std::string_view onnx_name = "Shape";
  static constexpr int arity = 1;

  constexpr dtype_result result_dtype(std::span<const dtype>) const { return {int32}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    return {kiln::shape{in[0].has_known_rank() ? std::int64_t(in[0].rank()) : none}};
  }
  /// Builds the dims on the host, then moves them to the input's device.
  KILN_LIBRARY_INLINE tensor evaluate(std::span<const tensor* const> in) const;
  constexpr bool operator==(const shape_of&) const = default;
};

// detail::run_on calls `check_values(op, inputs)` unqualified before it allocates the
// result; these overloads, found by argument-dependent lookup, reject indices and
// ranges that do not fit the (now concrete) input shapes. Templates, so that a file
// compiles them (and the index readers they instantiate) only where it runs the op.

/// `x[i]` needs -dim <= i < dim for the first dim.
template <class = void>
void check_values(const index& op, std::span<const tensor* const> in) {
  const shape& s = in[0]->shape();
  if (op.i < -s[0] || op.i >= s[0])
    throw invalid_argument_error("strided_slice: index " + std::to_string(op.i) + " is out of range [" +
                                 std::to_string(-s[0]) + ", " + std::to_string(s[0]) +
                                 ") for the first dim of a tensor of shape " + s.str());
}

/// `slice` needs 0 <= begin[d] <= dim and 0 <= size[d] <= dim - begin[d] (or size[d] == -1).
template <class = void>
void check_values(const slice& op, std::span<const tensor* const> in) {
  const shape& s = in[0]->shape();
  const int d = op.first_unfit_dim(s);
  if (d < 0) return;
  const std::string problem =
      op.begin[d] < 0 || op.begin[d] > s[d]
          ? "begin[" + std::to_string(d) + "] = " + std::to_string(op.begin[d]) + " is not in [0, " + std::to_string(s[d]) + "]"
          : "size[" + std::to_string(d) + "] = " + std::to_string(op.size[d]) + " is not -1 or in [0, " +
                std::to_string(s[d] - op.begin[d]) + "]";
  throw invalid_argument_error("slice: " + op.attributes() + " is out of range for shape " + s.str() + ": " + problem);
}

/// Position `k` of a tensor of shape `s` as a multi-index, as TensorFlow prints it ("1, 0").
KILN_LIBRARY_INLINE std::string position_text(std::int64_t k, const shape& s);

/// Calls `f(p)` with a host pointer to the elements of `indices` (int32 or int64, on
/// any device).
template <class F>
void with_host_indices(const tensor& indices, F&& f) {
  auto read = [&]<class T>(std::type_identity<T>) {
    if (indices.device() == device::cpu) {
      f(indices.data<T>());
    } else {
      const std::vector<T> copied = indices.to_vector<T>();
      f(copied.data());
    }
  };
  if (indices.dtype() == int64)
    read(std::type_identity<std::int64_t>{});
  else
    read(std::type_identity<std::int32_t>{});
}

/// Raises kiln::invalid_argument_error, as TensorFlow's CPU kernel, when one of the
/// indices at `p` (of shape `indices`) is outside [0, dim) for `axis` of shape `x`.
template <class I>
void check_gather_indices(const I* p, const shape& indices, std::int64_t axis, const shape& x) {
  const std::int64_t dim = x[normalize_axis(axis, x.rank())], n = indices.num_elements();
  std::int64_t k = 0;
  while (k < n && p[k] >= 0 && p[k] < dim) ++k;
  if (k == n) return;
  throw invalid_argument_error("gather: indices[" + position_text(k, indices) + "] = " + std::to_string(p[k]) +
                               " is not in [0, " + std::to_string(dim) + ") for axis " + std::to_string(axis) +
                               " of shape " + x.str());
}

/// `gather` needs every index in [0, dim) for the gathered dim.
template <class = void>
void check_values(const gather& op, std::span<const tensor* const> in) {
  with_host_indices(*in[1], [&](const auto* p) { check_gather_indices(p, in[1]->shape(), op.axis, in[0]->shape()); });
}

/// `unsorted_segment_sum` needs every segment id below num_segments (negative ones
/// are dropped), as TensorFlow's CPU kernel does.
template <class = void>
void check_values(const unsorted_segment_sum& op, std::span<const tensor* const> in) {
  const shape& ids = in[1]->shape();
  const std::int64_t n = ids.num_elements();
  with_host_indices(*in[1], [&](const auto* p) {
    std::int64_t k = 0;
    while (k < n && p[k] < op.num_segments) ++k;
    if (k == n) return;
    throw invalid_argument_error("unsorted_segment_sum: segment_ids[" + position_text(k, ids) + "] = " +
                                 std::to_string(p[k]) + " is not below num_segments = " + std::to_string(op.num_segments));
  });
}

/// The value of an int32 or int64 scalar index (the `i` of set_item), on any device.
KILN_LIBRARY_INLINE std::int64_t scalar_index(const tensor& index);

/// `set_item` needs 0 <= i < dim for the first dim of `x`.
template <class = void>
void check_set_item_index(std::int64_t i, const shape& x) {
  if (i < 0 || i >= x[0])
    throw invalid_argument_error("set_item: index " + std::to_string(i) + " is not in [0, " + std::to_string(x[0]) +
                                 ") for the first dim of a tensor of shape " + x.str());
}

template <class = void>
void check_values(const set_item&, std::span<const tensor* const> in) {
  check_set_item_index(scalar_index(*in[1]), in[0]->shape());
}

/// `pad_rows` needs a number of rows that is not negative.
template <class = void>
void check_pad_rows(std::int64_t rows, const shape& x) {
  if (rows < 0)
    throw invalid_argument_error("pad_rows: the number of rows must not be negative, got " + std::to_string(rows) +
                                 " for a tensor of shape " + x.str());
}

template <class = void>
void check_values(const pad_rows&, std::span<const tensor* const> in) {
  check_pad_rows(scalar_index(*in[1]), in[0]->shape());
}

}  // namespace ops

namespace detail {

/// Runs an op on a list of tensors (concat, stack).
template <class Op>
tensor apply_to_list(const Op& op, std::span<const tensor> values) {
  small_vector<const tensor*, 8> inputs;
  inputs.reserve(values.size());
  for (const tensor& t : values) inputs.emplace_back(&t);
  return apply_span(op, inputs);
}

}  // namespace detail

/// `kiln::reshape(x, {2, -1})`: the elements of `x` in a new shape; one dim may be -1
/// (kiln::none) and is inferred. An eager result shares `x`'s buffer.
template <class = void>
tensor reshape(const tensor& x, const shape& new_shape) {
  const tensor* in[] = {&x};
  return detail::apply_span(ops::reshape{new_shape}, in);
}

/// `kiln::transpose(x, {1, 0})` swaps the dims of a matrix; `kiln::transpose(x)`
/// reverses the dims of any tensor.
template <class = void>
tensor transpose(const tensor& x, const int_list& perm = {}) {
  const tensor* in[] = {&x};
  return detail::apply_span(ops::transpose{perm}, in);
}

/// `kiln::concat({a, b}, 0)`: joins tensors of one dtype along an existing dim
/// (negative axes count from the end); the other dims must match.
template <class = void>
tensor concat(std::span<const tensor> values, std::int64_t axis) {
  return detail::apply_to_list(ops::concat{axis}, values);
}
/// `kiln::concat({a, b}, -1)`.
template <class = void>
tensor concat(std::initializer_list<tensor> values, std::int64_t axis) {
  return concat(std::span<const tensor>(values.begin(), values.size()), axis);
}

/// `kiln::stack({a, b})`: joins tensors of one shape along a new dim `axis`
/// (shape (2, 3) twice gives (2, 2, 3)).
template <class = void>
tensor stack(std::span<const tensor> values, std::int64_t axis = 0) {
  return detail::apply_to_list(ops::stack{axis}, values);
}
/// `kiln::stack({a, b}, 1)`.
template <class = void>
tensor stack(std::initializer_list<tensor> values, std::int64_t axis = 0) {
  return stack(std::span<const tensor>(values.begin(), values.size()), axis);
}

/// `kiln::gather(x, indices, axis)`: the slices of `x` along `axis` at `indices`
/// (an int32 or int64 tensor of any shape); gathering rows {2, 0} of a (3, 4)
/// matrix gives a (2, 4) one. An index outside [0, dim) raises kiln::invalid_argument_error.
template <class = void>
tensor gather(const tensor& x, const tensor& indices, std::int64_t axis = 0) {
  const tensor* in[] = {&x, &indices};
  return detail::apply_span(ops::gather{axis}, in);
}

/// `kiln::unsorted_segment_sum(data, segment_ids, num_segments)`: for each segment s
/// in [0, num_segments), the sum of the slices `data[j]` whose id `segment_ids[j]` is
/// s (TensorFlow's tf.math.unsorted_segment_sum: `segment_ids`, int32 or int64, has
/// the shape of `data`'s leading dims; a segment no id names is 0, a negative id is
/// dropped, an id of num_segments or more raises kiln::invalid_argument_error).
/// \code kiln::unsorted_segment_sum(kiln::constant({1.f, 2.f, 3.f}), kiln::constant({1, 0, 1}), 2);  // [2 4] \endcode
template <class = void>
tensor unsorted_segment_sum(const tensor& data, const tensor& segment_ids, std::int64_t num_segments) {
  const tensor* in[] = {&data, &segment_ids};
  return detail::apply_span(ops::unsorted_segment_sum{num_segments}, in);
}

/// `kiln::slice(x, {1, 0}, {2, -1})`: rows 1 and 2 of `x`, every column; a size of -1
/// takes everything to the end of its dim.
template <class = void>
tensor slice(const tensor& x, const int_list& begin, const int_list& size) {
  const tensor* in[] = {&x};
  return detail::apply_span(ops::slice{begin, size}, in);
}

/// `kiln::set_item(x, i, value)`: a copy of `x` whose slice `x[i]` is `value`
/// (`i` an int32 or int64 scalar in [0, x.shape()[0])).
/// \code kiln::set_item(kiln::zeros({3, 2}), kiln::constant(1), kiln::ones({2}));  // [[0 0] [1 1] [0 0]] \endcode
template <class = void>
tensor set_item(const tensor& x, const tensor& i, const tensor& value) {
  return detail::apply(ops::set_item{}, x, i, value);
}

template <class>
tensor ops::set_item::evaluate(std::span<const tensor* const> in) const {
  const tensor &x = *in[0], &value = *in[2];
  const std::int64_t i = scalar_index(*in[1]);
  int_list zero, before, begin, after;  // x[:i] is slice(x, zero, before); x[i + 1:] is slice(x, begin, after)
  for (int d = 0; d < x.rank(); ++d) {
    zero.push_back(0);
    before.push_back(d == 0 ? i : -1);
    begin.push_back(d == 0 ? i + 1 : 0);
    after.push_back(-1);
  }
  kiln::shape row = x.shape();
  row[0] = 1;
  return detail::execute_now(concat{0}, detail::execute_now(slice{zero, before}, x), detail::execute_now(reshape{row}, value),
                             detail::execute_now(slice{begin, after}, x));
}

template <class>
tensor ops::set_item::evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const {
  const tensor& value = *in[2];
  if (x.dtype() == string || x.device() != device::cpu || value.device() != device::cpu || !x.sole_owner()) {
    const tensor* rest[] = {&x, in[1], in[2]};
    return evaluate(rest);
  }
  const std::size_t row_bytes = std::size_t(value.size()) * size_of(value.dtype());
  std::memcpy(static_cast<char*>(x.raw_data()) + std::size_t(scalar_index(*in[1])) * row_bytes, value.raw_data(), row_bytes);
  return std::move(x);
}

/// `kiln::pad_rows(x, rows)`: `x` with rows of zeros (`false`, `""`) appended along
/// its first dim until it has `rows` (an int32 or int64 scalar, not negative); `x`
/// itself when it has that many rows already.
/// \code kiln::pad_rows(kiln::ones({1, 2}), kiln::constant(3));  // [[1 1] [0 0] [0 0]] \endcode
template <class = void>
tensor pad_rows(const tensor& x, const tensor& rows) { return detail::apply(ops::pad_rows{}, x, rows); }

template <class>
tensor ops::pad_rows::evaluate(std::span<const tensor* const> in) const {
  const tensor& x = *in[0];
  kiln::shape missing = x.shape();
  missing[0] = scalar_index(*in[1]) - x.shape()[0];
  if (missing[0] <= 0) return x;
  return detail::execute_now(concat{0}, x, kiln::zeros(missing, x.dtype(), x.device()));
}

template <class>
tensor ops::pad_rows::evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const {
  const std::int64_t rows = scalar_index(*in[1]);
  if (rows <= x.shape()[0]) return std::move(x);
  if (x.dtype() == string || x.device() != device::cpu) {
    const tensor* rest[] = {&x, in[1]};
    return evaluate(rest);
  }
  return grow(std::move(x), rows);
}

template <class>
tensor ops::pad_rows::grow(tensor&& x, std::int64_t rows) {
  const std::int64_t have = x.shape()[0];
  kiln::shape grown = x.shape();
  grown[0] = rows;
  const std::int64_t row = have > 0 ? x.size() / have : grown.num_elements() / rows;
  const std::size_t element = size_of(x.dtype());
  tensor out = std::move(x);
  if (!out.sole_owner() || out.buffer_capacity() < rows * row) {
    kiln::shape room = grown;
    room[0] = std::max(rows, 2 * have);
    tensor bigger(out.dtype(), room);
    if (out.size() > 0) std::memcpy(bigger.raw_data(), out.raw_data(), std::size_t(out.size()) * element);
    out = std::move(bigger).share(out.shape());
  }
  std::memset(static_cast<char*>(out.raw_data()) + std::size_t(have * row) * element, 0,
              std::size_t((rows - have) * row) * element);
  return std::move(out).share(grown);
}

/// `kiln::crop_or_pad(x, like, offset, align)`: the window of `x` of `like`'s shape
/// at `offset` (from x's start, or with align 1 in a dim from its end), zeros where
/// it leaves x (see ops::crop_or_pad).
/// \code kiln::crop_or_pad(kiln::constant({1, 2, 3}), kiln::zeros({4}), {-1}, {0});  // [0 1 2 3] \endcode
template <class = void>
tensor crop_or_pad(const tensor& x, const tensor& like, const int_list& offset, const int_list& align) {
  const tensor* in[] = {&x, &like};
  return detail::apply_span(ops::crop_or_pad{offset, align}, in);
}

template <class>
tensor ops::crop_or_pad::evaluate(std::span<const tensor* const> in) const {
  const tensor& x = *in[0];
  const kiln::shape& out = in[1]->shape();
  int_list begin, size;  // the block of x inside the window
  kiln::shape before, after;  // the zeros around it, per dim
  bool empty = false;
  for (int d = 0; d < out.rank(); ++d) {
    const std::int64_t first = start(d, x.shape()[d], out[d]);
    const std::int64_t lo = std::clamp<std::int64_t>(first, 0, x.shape()[d]);
    const std::int64_t hi = std::clamp<std::int64_t>(first + out[d], 0, x.shape()[d]);
    empty |= hi <= lo;
    begin.push_back(lo);
    size.push_back(std::max<std::int64_t>(hi - lo, 0));
    before.push_back(std::clamp<std::int64_t>(lo - first, 0, out[d]));
    after.push_back(out[d] - before[d] - size[d]);
  }
  if (empty) return kiln::zeros(out, x.dtype(), x.device());
  tensor block = detail::execute_now(slice{begin, size}, x);
  for (int d = 0; d < out.rank(); ++d) {
    kiln::shape part = block.shape();
    if (before[d] > 0) {
      part[d] = before[d];
      block = detail::execute_now(concat{d}, kiln::zeros(part, x.dtype(), x.device()), block);
    }
    if (after[d] > 0) {
      part[d] = after[d];
      block = detail::execute_now(concat{d}, block, kiln::zeros(part, x.dtype(), x.device()));
    }
  }
  return block;
}

/// `kiln::shape_of(x)`: the dims of `x` as a 1-D int32 tensor (`[2 3]` for a 2x3 matrix).
template <class = void>
tensor shape_of(const tensor& x) { return detail::apply(ops::shape_of{}, x); }

template <class>
tensor tensor::operator[](std::int64_t i) const {
  const tensor* in[] = {this};
  return detail::apply_span(ops::index{i}, in);
}

template <class>
tensor tensor::operator[](const tensor& i) const {
  if (i.defined() && i.rank() != 0)
    throw value_error("x[i]: the index must be a scalar, got " + std::string(name(i.dtype())) + " " + i.shape().str() +
                      "; use kiln::gather for several indices");
  return gather(*this, i);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string dims_text(const shape& s) { return int_list(s.dims()).str(); }

}  // namespace kiln::detail

namespace kiln::ops {

KILN_LIBRARY_INLINE tensor reshape::evaluate(std::span<const tensor* const> in) const {
  const kiln::shape& s = in[0]->shape();
  return in[0]->share(result_shape(std::span<const kiln::shape>(&s, 1)).value);
}

KILN_LIBRARY_INLINE std::string reshape::attributes() const { return "shape=" + detail::dims_text(new_shape); }

KILN_LIBRARY_INLINE std::string transpose::attributes() const { return "perm=" + perm.str(); }

KILN_LIBRARY_INLINE std::string concat::attributes() const { return "axis=" + std::to_string(axis); }

KILN_LIBRARY_INLINE std::string stack::attributes() const { return "axis=" + std::to_string(axis); }

KILN_LIBRARY_INLINE std::string gather::attributes() const { return "axis=" + std::to_string(axis); }

KILN_LIBRARY_INLINE std::string unsorted_segment_sum::attributes() const {
  return "num_segments=" + std::to_string(num_segments) + (axis == 0 ? "" : ", axis=" + std::to_string(axis));
}

KILN_LIBRARY_INLINE tensor index::evaluate(std::span<const tensor* const> in) const {
  const kiln::shape& s = in[0]->shape();
  kiln::shape rest(s.dims().subspan(1));
  return in[0]->share(rest, (i < 0 ? i + s[0] : i) * rest.num_elements());
}

KILN_LIBRARY_INLINE std::string index::attributes() const { return "index=" + std::to_string(i); }

KILN_LIBRARY_INLINE std::string set_item::attributes() const { return ""; }

KILN_LIBRARY_INLINE std::string pad_rows::attributes() const { return ""; }

KILN_LIBRARY_INLINE std::string crop_or_pad::attributes() const {
  return "offset=" + offset.str() + ", align=" + align.str();
}

KILN_LIBRARY_INLINE std::string slice::attributes() const { return "begin=" + begin.str() + ", size=" + size.str(); }

KILN_LIBRARY_INLINE int_list origin(int rank) {
  int_list o;
  for (int d = 0; d < rank; ++d) o.push_back(0);
  return o;
}

KILN_LIBRARY_INLINE int_list negated(const int_list& l) {
  int_list out;
  for (std::int64_t x : l) out.push_back(-x);
  return out;
}

KILN_LIBRARY_INLINE int_list along(int rank, int axis, std::int64_t at) {
  int_list o;
  for (int d = 0; d < rank; ++d) o.push_back(d == axis ? at : 0);
  return o;
}

KILN_LIBRARY_INLINE tensor shape_of::evaluate(std::span<const tensor* const> in) const {
  const kiln::shape& s = in[0]->shape();
  tensor out(int32, kiln::shape{s.rank()});
  auto* dims = out.view().as<std::int32_t>();
  for (int d = 0; d < s.rank(); ++d) {
    if (s[d] > std::numeric_limits<std::int32_t>::max())
      throw invalid_argument_error("shape: dim " + std::to_string(d) + " of shape " + s.str() +
                                   " does not fit in int32");
    dims[d] = std::int32_t(s[d]);
  }
  return out.to(in[0]->device());
}

KILN_LIBRARY_INLINE std::string position_text(std::int64_t k, const shape& s) {
  std::string position;
  for (std::int64_t d = s.rank() - 1, rest = k; d >= 0; --d) {
    position = std::to_string(rest % s[int(d)]) + (position.empty() ? "" : ", ") + position;
    rest /= s[int(d)];
  }
  return position;
}

KILN_LIBRARY_INLINE std::int64_t scalar_index(const tensor& index) {
  return index.dtype() == int64 ? index.to_vector<std::int64_t>()[0] : index.to_vector<std::int32_t>()[0];
}

}  // namespace kiln::ops
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/ops/shape_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_SHAPE_OPS_HPP

namespace kiln::ops {

/// Shared dtype rule: two operands of one numeric dtype.
constexpr dtype_result same_numeric_dtype(std::span<const dtype> in) {
  if (in[0] != in[1]) return {in[0], "operands must have the same dtype"};
  if (!dtypes::numeric.contains(in[0])) return {in[0], "dtype not supported"};
  return {in[0]};
}

/// `a @ b` over the last two dims; leading (batch) dims broadcast.
struct matmul {
  static constexpr std::string_view name = "matmul";
  static constexpr std::string_view onnx_name = "MatMul";
  static constexpr int arity = 2;
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return same_numeric_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const shape &a = in[0], &b = in[1];
    if (!a.has_known_rank() || !b.has_known_rank()) return {shape(unknown_rank)};
    if (a.rank() < 2 || b.rank() < 2) return {{}, "operands must have rank >= 2"};
    std::int64_t ka = a[a.rank() - 1], kb = b[b.rank() - 2];
    if (ka != kb && ka != none && kb != none) return {{}, "inner dimensions do not match"};
    shape batch_a, batch_b;
    for (int i = 0; i < a.rank() - 2; ++i) batch_a.push_back(a[i]);
    for (int i = 0; i < b.rank() - 2; ++i) batch_b.push_back(b[i]);
    shape_result out = broadcast_shapes(batch_a, batch_b);
    if (!out.ok()) return {{}, "batch dimensions are not broadcast-compatible"};
    out.value.push_back(a[a.rank() - 2]);
    out.value.push_back(b[b.rank() - 1]);
    return out;
  }
  constexpr bool operator==(const matmul&) const = default;
  /// dy · bᵀ and aᵀ · dy (summed over broadcast batch dims by the tape).
  template <class G> void gradient(G& g) const {
    if (g.needs(0)) g.give(0, G::matmul(g.dy(), G::transpose(g.x(1), swap_last_two(g.x(1).t.rank()))));
    if (g.needs(1)) g.give(1, G::matmul(G::transpose(g.x(0), swap_last_two(g.x(0).t.rank())), g.dy()));
  }
  /// The permutation that swaps the last two of `rank` dims.
  static constexpr int_list swap_last_two(int rank) {
    int_list p;
    for (int d = 0; d < rank - 2; ++d) p.push_back(d);
    p.push_back(rank - 1);
    p.push_back(rank - 2);
    return p;
  }
};

/// Sizes of a (batched) matmul and where each batch's operands start, shared by
/// every backend's kernel.
struct matmul_geometry {
  std::int64_t m = 0, n = 0, k = 0, batches = 1;

  constexpr matmul_geometry(const shape& a, const shape& b, const shape& out) {
    const int r = out.rank();
    m = out[r - 2], n = out[r - 1], k = a[a.rank() - 1];
    for (int i = 0; i < r - 2; ++i) batch_.push_back(out[i]);
    batches = batch_.num_elements();
    a_strides_ = leading_strides(a, batch_);
    b_strides_ = leading_strides(b, batch_);
  }
  /// Element offsets of batch `i`'s matrices in a and in b.
  constexpr std::pair<std::int64_t, std::int64_t> operand_offsets(std::int64_t i) const {
    std::int64_t oa = 0, ob = 0;
    for (int d = batch_.rank() - 1; d >= 0; --d) {
      oa += (i % batch_[d]) * a_strides_[d];
      ob += (i % batch_[d]) * b_strides_[d];
      i /= batch_[d];
    }
    return {oa * m * k, ob * k * n};
  }

 private:
  // Broadcast strides, in matrices, of an operand's batch dims against the output's.
  static constexpr std::array<std::int64_t, max_rank> leading_strides(const shape& x, const shape& batch) {
    std::array<std::int64_t, max_rank> st{};
    std::int64_t acc = 1;
    int lead = x.rank() - 2, offset = batch.rank() - lead;
    for (int i = lead - 1; i >= 0; --i) {
      st[i + offset] = x[i] == 1 ? 0 : acc;
      acc *= x[i];
    }
    return st;
  }
  shape batch_;
  std::array<std::int64_t, max_rank> a_strides_{}, b_strides_{};
};

/// Padding of a convolution, as TensorFlow's "VALID" and "SAME".
enum class padding : unsigned char { valid, same };

/// The output size and leading padding of one spatial dim of a convolution.
struct conv_dim {
  std::int64_t out = 0;
  std::int64_t pad_before = 0;
};
constexpr conv_dim conv_output_dim(std::int64_t in, std::int64_t filter, std::int64_t stride, padding p) {
  if (in == none) return {none, 0};
  if (p == padding::valid) return {in >= filter ? (in - filter) / stride + 1 : 0, 0};
  std::int64_t out = (in + stride - 1) / stride;
  std::int64_t total = (out - 1) * stride + filter - in;
  return {out, total > 0 ? total / 2 : 0};
}

/// 2-D convolution (cross-correlation, as TensorFlow's conv2d).
struct conv2d {
  static constexpr std::string_view name = "conv2d";
  static constexpr std::string_view onnx_name = "Conv";
  static constexpr int arity = 2;
  std::int64_t stride_h = 1, stride_w = 1;
  padding pad = padding::valid;
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"stride_h", &conv2d::stride_h},
                      attribute{"stride_w", &conv2d::stride_w},
                      attribute{"padding", &conv2d::pad}};
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return same_numeric_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const shape &x = in[0], &f = in[1];
    if (stride_h < 1 || stride_w < 1) return {{}, "strides must be >= 1"};
    if (!x.has_known_rank() || !f.has_known_rank()) return {shape(unknown_rank)};
    if (x.rank() != 4) return {{}, "the input must have rank 4 (NHWC)"};
    if (f.rank() != 4) return {{}, "the filters must have rank 4 (HWIO)"};
    if (x[3] != f[2] && x[3] != none && f[2] != none) return {{}, "input channels do not match the filters' in-channels"};
    if (pad == padding::valid && x[1] != none && f[0] != none && x[1] < f[0])
      return {{}, "VALID padding needs the input to be at least as large as the filter"};
    if (pad == padding::valid && x[2] != none && f[1] != none && x[2] < f[1])
      return {{}, "VALID padding needs the input to be at least as large as the filter"};
    return {shape{x[0], conv_output_dim(x[1], f[0], stride_h, pad).out, conv_output_dim(x[2], f[1], stride_w, pad).out, f[3]}};
  }
  constexpr bool operator==(const conv2d&) const = default;
  /// Both are stride-1 convolutions of dy spread out by the strides: the input's is a
  /// full correlation with the filters turned by 180° (TensorFlow's
  /// Conv2DBackpropInput), the filters' a correlation of the padded input with dy,
  /// the batch taking the place of the channels (Conv2DBackpropFilter).
  template <class G> void gradient(G& g) const;
};

/// `v` with `step - 1` zeros after each element along `axis` but the last: a strided
/// convolution's output spread over the positions a stride-1 one would have.
template <class G, class V>
V spread_out(const V& v, int axis, std::int64_t step) {
  const shape s = v.t.shape();
  if (step == 1 || s[axis] == 0) return v;
  shape column, gap, spread = s;  // one more dim after `axis`: each element, then its gap
  for (int d = 0; d < s.rank(); ++d) {
    column.push_back(s[d]);
    gap.push_back(s[d]);
    if (d == axis) column.push_back(1), gap.push_back(step - 1);
  }
  spread[axis] = s[axis] * step;
  const V joined = G::run(concat{axis + 1}, G::reshape(v, column), G::zeros(gap, v));
  shape kept = s;  // the last element's gap cut
  kept[axis] = (s[axis] - 1) * step + 1;
  return slice_of<G>(G::reshape(joined, spread), origin(s.rank()), kept);
}

/// `v` with `before` zeros ahead of it along `axis`, then zeros or a cut at the end
/// so that the dim has `length` elements.
template <class G, class V>
V fit_dim(V v, int axis, std::int64_t before, std::int64_t length) {
  shape s = v.t.shape();
  if (before > 0) {
    s[axis] = before;
    v = G::run(concat{axis}, G::zeros(s, v), v);
  }
  s = v.t.shape();
  if (s[axis] < length) {
    s[axis] = length - s[axis];
    v = G::run(concat{axis}, v, G::zeros(s, v));
  } else if (s[axis] > length) {
    s[axis] = length;
    v = slice_of<G>(v, origin(s.rank()), s);
  }
  return v;
}

template <class G>
void conv2d::gradient(G& g) const {
  const shape x = g.x(0).t.shape(), f = g.x(1).t.shape(), y = g.y().t.shape();
  const std::int64_t top = conv_output_dim(x[1], f[0], stride_h, pad).pad_before,
                     left = conv_output_dim(x[2], f[1], stride_w, pad).pad_before;
  const auto spread = spread_out<G>(spread_out<G>(g.dy(), 1, stride_h), 2, stride_w);
  // Input: every input pixel meets each filter tap that read it.
  if (g.needs(0)) {
    const auto turned = G::transpose(
        G::run(gather{0}, G::run(gather{1}, g.x(1), G::reversed_indices(f[1], g.x(1))), G::reversed_indices(f[0], g.x(1))),
        {0, 1, 3, 2});
    const auto framed_dy =
        fit_dim<G>(fit_dim<G>(spread, 1, f[0] - 1 - top, x[1] + f[0] - 1), 2, f[1] - 1 - left, x[2] + f[1] - 1);
    g.give(0, G::run(conv2d{}, framed_dy, turned));
  }
  if (!g.needs(1)) return;
  // Filters: the input as the forward pass saw it (padded, rows no output reached
  // cut), with images and channels swapped, correlated with the spread dy.
  const auto framed_x =
      fit_dim<G>(fit_dim<G>(g.x(0), 1, top, (y[1] - 1) * stride_h + f[0]), 2, left, (y[2] - 1) * stride_w + f[1]);
  g.give(1, G::transpose(G::run(conv2d{}, G::transpose(framed_x, {3, 1, 2, 0}), G::transpose(spread, {1, 2, 0, 3})),
                         {1, 2, 0, 3}));
}

}  // namespace kiln::ops

namespace kiln {

/// Padding of a convolution: `kiln::padding::valid` or `kiln::padding::same`.
using ops::padding;

/// Matrix product over the last two dims; leading dims are batch dims and broadcast.
/// \code kiln::matmul(kiln::ones({2, 3}), kiln::ones({3, 4})).shape() == kiln::shape{2, 4} \endcode
template <class = void>
tensor matmul(const tensor& a, const tensor& b) { return detail::apply(ops::matmul{}, a, b); }

/// Parses "VALID" / "SAME"; anything else is a kiln::value_error.
KILN_LIBRARY_INLINE ops::padding parse_padding(std::string_view p);

/// 2-D convolution of an NHWC input with HWIO filters. `strides` is one int, two
/// ints (height, width) or four (TensorFlow's NHWC form, batch and channel 1).
/// \code kiln::conv2d(kiln::ones({1, 5, 5, 1}), kiln::ones({3, 3, 1, 2}), {1, 1}, "VALID").shape() == kiln::shape{1, 3, 3, 2} \endcode
template <class = void>
tensor conv2d(const tensor& input, const tensor& filters, const int_list& strides, std::string_view padding) {
  ops::conv2d op;
  op.pad = parse_padding(padding);
  if (strides.size() == 1) {
    op.stride_h = op.stride_w = strides[0];
  } else if (strides.size() == 2) {
    op.stride_h = strides[0], op.stride_w = strides[1];
  } else if (strides.size() == 4 && strides[0] == 1 && strides[3] == 1) {
    op.stride_h = strides[1], op.stride_w = strides[2];
  } else {
    throw value_error("conv2d: strides must be 1, 2 or 4 ints (4 as [1, h, w, 1]), got " + strides.str());
  }
  return detail::apply(op, input, filters);
}
/// 2-D convolution with the same stride along height and width.
template <class = void>
tensor conv2d(const tensor& input, const tensor& filters, std::int64_t stride, std::string_view padding) {
  return conv2d(input, filters, int_list{stride}, padding);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE ops::padding parse_padding(std::string_view p) {
  if (p == "VALID") return ops::padding::valid;
  if (p == "SAME") return ops::padding::same;
  throw value_error("conv2d: padding must be \"VALID\" or \"SAME\", got \"" + std::string(p) + "\"");
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/ops/linalg.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP

namespace kiln {
namespace typed {

/// A reduction op over `Axes` (all when none).
template <class Op, bool KeepDims, std::int64_t... Axes>
struct made_reduction {
  static constexpr Op op = sizeof...(Axes) == 0 ? Op(reduction_axes(), KeepDims) : Op(reduction_axes(int_list{Axes...}), KeepDims);
};

/// Dims `D` permuted by `Perm` (reversed when empty).
template <class D, std::int64_t... Perm>
struct transposed {
  static constexpr std::array<int, std::size_t(D::rank)> perm = [] {
    std::array<int, std::size_t(D::rank)> p{};
    if constexpr (sizeof...(Perm) == 0) {
      for (int d = 0; d < D::rank; ++d) p[std::size_t(d)] = D::rank - 1 - d;
    } else {
      int d = 0;
      ((p[std::size_t(d++)] = int(Perm)), ...);
    }
    return p;
  }();
  static constexpr kiln::shape value = [] {
    kiln::shape s;
    for (int d = 0; d < D::rank; ++d) s.push_back(D::values[std::size_t(perm[std::size_t(d)])]);
    return s;
  }();
  static constexpr ops::transpose op{[] {
    int_list l;
    for (int p : perm) l.push_back(p);
    return l;
  }()};
};

/// `ops::reshape` to `Dims`.
template <std::int64_t... Dims>
struct made_reshape {
  static constexpr ops::reshape op{dims<Dims...>::shape()};
};

/// The slot holding the value of operand `x` in the trace being recorded.
template <class X>
int slot_of(const X& x) {
  if constexpr (is_symbol<std::remove_cvref_t<X>>::value) {
    return x.slot();
  } else {
    using E = std::remove_cvref_t<decltype(expression_of<void, false>(x))>;
    return symbol<typename E::value_type, typename E::dims_type>(expression_of<void, false>(x)).slot();
  }
}

/// A step running `Kernel`, which computes `Made::op` into a value of type `Out` and
/// dims `OutD`, on the slots `in` (values of `fixed` types `In`) into slot `out`.
template <class Made, class Kernel, class Out, class OutD, class... In>
struct kernel_step {
  Kernel kernel;
  int out;
  std::array<int, sizeof...(In)> in;
  static void run(const void* data, frame f) {
    const auto& s = *static_cast<const kernel_step*>(data);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      s.kernel(static_cast<Out*>(f[s.out]), static_cast<const typename In::value_type*>(f[s.in[I]])...);
    }(std::index_sequence_for<In...>());
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& s = *static_cast<const kernel_step*>(data);
    sink.bind(s.out, sink.op(decltype(Made::op)::name, &Made::op, slot_values<In...>(sink, s.in), dtype_of<Out>, OutD::values));
  }
};

/// `kernel(out, in...)`, computing `Made::op` on the values of `x...`, giving a value
/// of type `OutT` and dims `OutD`: a `fixed` now, or a symbol written by a step of the
/// trace.
template <class OutT, class OutD, class Made, class Kernel, class... X>
auto apply_kernel(Kernel kernel, const X&... x) {
  if constexpr (eager<X...>) {
    fixed_t<OutT, OutD> out(uninitialized);
    kernel(out.data(), x.data()...);
    return out;
  } else {
    recorder& r = current_recorder();
    using step_t = kernel_step<Made, Kernel, OutT, OutD, fixed_t<typename element_of<X>::type, typename std::remove_cvref_t<X>::dims_type>...>;
    const std::array<int, sizeof...(X)> in{slot_of(x)...};
    const int out = r.add_slot(bytes_of<fixed_t<OutT, OutD>>);
    r.push(step_of(std::make_unique<const step_t>(step_t{kernel, out, in})));
    return symbol<OutT, OutD>(out);
  }
}

/// An integer product small enough for loops whose sizes the compiler knows: integer
/// sums wrap, so their order does not change them, and this gives gemm's values.
template <class T, std::int64_t M, std::int64_t N, std::int64_t K>
void small_integer_matmul(const T* KILN_RESTRICT a, const T* KILN_RESTRICT b, T* KILN_RESTRICT c) {
  using U = std::make_unsigned_t<T>;  // wraps
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      U sum = 0;
      for (std::int64_t k = 0; k < K; ++k) sum += U(a[i * K + k]) * U(b[k * N + j]);
      c[i * N + j] = T(sum);
    }
}

/// A float product that the CPU gemm computes without packing and on one thread: each
/// element is one fused multiply-add chain over k, from zero and in order, as in its
/// micro-kernel, so the values are gemm's; with the sizes known at compile time only
/// this loop is compiled. Tiles of rows keep their accumulators in registers.
template <class T, std::int64_t M, std::int64_t N, std::int64_t K>
void direct_matmul(const T* KILN_RESTRICT a, const T* KILN_RESTRICT b, T* KILN_RESTRICT c) {
  namespace cpu = backend::cpu::detail;
  using B = batch<T>;
  constexpr std::int64_t w = B::size, vectors = (N + w - 1) / w, tail = N - (vectors - 1) * w;
  constexpr std::int64_t rows = std::max<std::int64_t>(1, std::min<std::int64_t>(M, 16 / vectors));
  auto tile = [&]<std::int64_t H>(std::integral_constant<std::int64_t, H>, std::int64_t i0) {
    B acc[H][vectors];
    for (std::int64_t r = 0; r < H; ++r)
      for (std::int64_t v = 0; v < vectors; ++v) acc[r][v] = B(T(0));
    for (std::int64_t p = 0; p < K; ++p) {
      B b_row[vectors];
      for (std::int64_t v = 0; v < vectors; ++v)
        b_row[v] = v + 1 < vectors || tail == w ? B::load_unaligned(b + p * N + v * w) : backend::cpu::load_partial(b + p * N + v * w, tail);
      for (std::int64_t r = 0; r < H; ++r) {
        const B a_value(a[(i0 + r) * K + p]);
        for (std::int64_t v = 0; v < vectors; ++v) acc[r][v] = math::multiply_add(a_value, b_row[v], acc[r][v]);
      }
    }
    for (std::int64_t r = 0; r < H; ++r)
      for (std::int64_t v = 0; v < vectors; ++v) {
        T* dst = c + (i0 + r) * N + v * w;
        if (v + 1 < vectors || tail == w)
          acc[r][v].store_unaligned(dst);
        else
          backend::cpu::store_partial(acc[r][v], dst, tail);
      }
  };
  std::int64_t i0 = 0;
  for (; i0 + rows <= M; i0 += rows) tile(std::integral_constant<std::int64_t, rows>(), i0);
  if constexpr (M % rows != 0) tile(std::integral_constant<std::int64_t, M % rows>(), i0);
}

/// Reduction `Op` over `Axes` (all when none) of `x`.
template <class Op, bool KeepDims, std::int64_t... Axes, class X>
auto reduce(const X& x) {
  using V = std::remove_cvref_t<X>;
  using T = typename V::value_type;
  using D = typename V::dims_type;
  using made_op = made_reduction<Op, KeepDims, Axes...>;
  using rule = op_rule<made_op, V>;
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return rule_error{};
  } else {
    using Out = element_t<rule::dtypes.value>;
    using OutD = dims_from<rule>;
    return apply_kernel<Out, OutD, made_op>(
        [](Out* out, const T* in) {
          namespace cpu = backend::cpu;
          constexpr auto axis = made_op::op.axis;
          constexpr std::int64_t count = ops::reduced_count(D::shape(), axis);
          constexpr cpu::reduction_layout layout(D::shape(), ops::reduced_dims(axis, D::rank));
          constexpr cpu::reduction_plan plan = cpu::plan_reduction(layout, count, std::int64_t(batch<T>::size));
          constexpr bool small = cpu::one_small_task(plan, D::size, count);
          cpu::reduce_planned<plan.kind, cpu::reducer_for<Op::kind, T>, small>(in, out, layout, plan, OutD::size, count);
          if constexpr (Op::kind == ops::reduction_kind::mean) cpu::sums_to_means<small>(out, OutD::size, count);
        },
        x);
  }
}

}  // namespace typed

/// Tag: reduced dims stay in a typed reduction's result with size 1.
struct keep_dims_t {
  explicit constexpr keep_dims_t() = default;
};
inline constexpr keep_dims_t keep_dims{};

// The checks name the op in the first error line (see KILN_TYPED_CHECKS).
#define KILN_TYPED_REDUCTION(fn)                                                                 \
  template <std::int64_t... Axes, typed::operand X>                                              \
  auto fn(const X& x) {                                                                          \
    return fn<Axes...>(x, keep_dims_t(), std::false_type());                                     \
  }                                                                                              \
  template <std::int64_t... Axes, typed::operand X, class Keep = std::true_type>                 \
  auto fn(const X& x, keep_dims_t, Keep = {}) {                                                  \
    using rule = typed::op_rule<typed::made_reduction<ops::fn, Keep::value, Axes...>, std::remove_cvref_t<X>>; \
    static_assert(rule::dtypes.ok(), "kiln::" #fn ": reductions take int32, int64, float32 or float64 values"); \
    static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::" #fn ": an axis is out of range or listed twice"); \
    return typed::reduce<ops::fn, Keep::value, Axes...>(x);                                      \
  }                                                                                              \
  template <std::int64_t Axis, std::int64_t... More>                                             \
  tensor fn(const tensor& x) {                                                                   \
    return fn(x, reduction_axes(int_list{Axis, More...}));                                       \
  }
/// `kiln::reduce_sum<1>(x)`: typed reductions take their axes as template arguments
/// (all axes when none), and `kiln::keep_dims` to keep reduced dims; the same
/// spelling works on a kiln::tensor.
KILN_TYPED_REDUCTION(reduce_sum)
KILN_TYPED_REDUCTION(reduce_mean)
KILN_TYPED_REDUCTION(reduce_max)
KILN_TYPED_REDUCTION(reduce_min)
KILN_TYPED_REDUCTION(argmax)
#undef KILN_TYPED_REDUCTION

/// `kiln::matmul(a, b)` on typed operands: a (batched) matrix product whose inner
/// dims must agree at compile time.
template <typed::operand A, typed::operand B>
auto matmul(const A& a, const B& b) {
  using Va = std::remove_cvref_t<A>;
  using Vb = std::remove_cvref_t<B>;
  using T = typename Va::value_type;
  using Da = typename Va::dims_type;
  using Db = typename Vb::dims_type;
  using rule = typed::op_rule<typed::made<ops::matmul>, Va, Vb>;
  static_assert(rule::dtypes.ok(), "kiln::matmul: both operands must hold one of int32, int64, float32 or float64");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(),
                "kiln::matmul: the inner dimensions must match (and batch dimensions broadcast)");
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    return typed::apply_kernel<T, OutD, typed::made<ops::matmul>>(
        [](T* out, const T* x, const T* y) {
          constexpr ops::matmul_geometry g(Da::shape(), Db::shape(), OutD::shape());
          for (std::int64_t bi = 0; bi < g.batches; ++bi) {
            const auto [oa, ob] = g.operand_offsets(bi);
            if constexpr (std::is_integral_v<T> && g.m * g.n * g.k <= 64 * 64 * 64)
              typed::small_integer_matmul<T, g.m, g.n, g.k>(x + oa, y + ob, out + bi * g.m * g.n);
            else if constexpr (std::is_floating_point_v<T> && backend::cpu::detail::gemm_unpacked<T>(g.m, g.n, g.k) &&
                               double(g.m) * double(g.n) * double(g.k) < backend::cpu::detail::gemm_parallel_work)
              typed::direct_matmul<T, g.m, g.n, g.k>(x + oa, y + ob, out + bi * g.m * g.n);
            else
              backend::cpu::gemm<T>(g.m, g.n, g.k, x + oa, g.k, y + ob, g.n, out + bi * g.m * g.n, g.n);
          }
        },
        a, b);
  }
}

/// `kiln::transpose<1, 0>(x)` on a typed operand: dims permuted by `Perm` (reversed
/// when empty).
template <std::int64_t... Perm, typed::operand X>
auto transpose(const X& x) {
  using T = typename typed::element_of<X>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  static_assert(sizeof...(Perm) == 0 || sizeof...(Perm) == std::size_t(D::rank),
                "kiln::transpose: the permutation must list every dim once");
  using rule = typed::transposed<D, Perm...>;
  using OutD = typed::dims_from<rule>;
  return typed::apply_kernel<T, OutD, rule>(
      [](T* out, const T* in) {
        constexpr auto in_strides = row_major_strides(D::shape());
        std::array<std::int64_t, max_rank> index{};  // the output's multi-index
        for (std::int64_t i = 0; i < OutD::size; ++i) {
          std::int64_t from = 0;
          for (int d = 0; d < D::rank; ++d) from += index[std::size_t(d)] * in_strides[std::size_t(rule::perm[std::size_t(d)])];
          out[i] = in[from];
          for (int d = D::rank - 1; d >= 0 && ++index[std::size_t(d)] == OutD::values[std::size_t(d)]; --d)
            index[std::size_t(d)] = 0;
        }
      },
      x);
}

namespace typed {

/// A list of integers given as a template argument (`std::array{1, 0}`) as an int_list.
template <auto List>
constexpr int_list int_list_of() {
  int_list l;
  for (auto v : List) l.push_back(std::int64_t(v));
  return l;
}

/// `Op` (concat, stack or gather) along `Axis`, for op_rule.
template <class Op, std::int64_t Axis>
struct made_along {
  static constexpr Op op{Axis};
};

/// `ops::slice` of `Begin` and `Size`, for op_rule.
template <auto Begin, auto Size>
struct made_slice {
  static constexpr ops::slice op{int_list_of<Begin>(), int_list_of<Size>()};
};

/// Copies the block of `OutD` that starts at row-major offset `base` of an input of
/// dims `D` (a slice).
template <class D, class OutD, std::int64_t Base, class T>
void copy_block(T* KILN_RESTRICT out, const T* KILN_RESTRICT in) {
  constexpr auto strides = row_major_strides(D::shape());
  constexpr std::int64_t row = OutD::rank == 0 ? 1 : OutD::values[std::size_t(OutD::rank - 1)];
  std::array<std::int64_t, max_rank> index{};  // the output's multi-index, but for its last dim
  for (std::int64_t i = 0; i < OutD::size; i += row) {
    std::int64_t from = Base;
    for (int d = 0; d + 1 < OutD::rank; ++d) from += index[std::size_t(d)] * strides[std::size_t(d)];
    std::copy_n(in + from, row, out + i);
    for (int d = OutD::rank - 2; d >= 0 && ++index[std::size_t(d)] == OutD::values[std::size_t(d)]; --d)
      index[std::size_t(d)] = 0;
  }
}

}  // namespace typed

/// `kiln::slice<std::array{1, 0}, std::array{2, -1}>(x)` on a typed operand: the block
/// of `Size[d]` elements from `Begin[d]` along every dim d (-1: to the end of it);
/// that it lies within `x` is checked at compile time.
template <auto Begin, auto Size, typed::operand X>
auto slice(const X& x) {
  using T = typename typed::element_of<X>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  using made = typed::made_slice<Begin, Size>;
  using rule = typed::op_rule<made, std::remove_cvref_t<X>>;
  static_assert(rule::shapes.ok(), "kiln::slice: begin and size must have one entry per dim");
  static_assert(!rule::shapes.ok() || made::op.first_unfit_dim(D::shape()) < 0,
                "kiln::slice: begin and size must lie within the operand's dims");
  if constexpr (!rule::shapes.ok() || made::op.first_unfit_dim(D::shape()) >= 0) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    constexpr std::int64_t base = [] {
      const auto strides = row_major_strides(D::shape());
      std::int64_t b = 0;
      for (int d = 0; d < D::rank; ++d) b += made::op.begin[d] * strides[std::size_t(d)];
      return b;
    }();
    return typed::apply_kernel<T, OutD, made>([](T* out, const T* in) { typed::copy_block<D, OutD, base>(out, in); }, x);
  }
}

/// `kiln::gather<Axis>(x, indices)` on typed operands: the slices of `x` along `Axis`
/// at `indices` (int32 or int64, any dims; their values are checked when it runs,
/// raising kiln::invalid_argument_error as the runtime tier does).
template <std::int64_t Axis = 0, typed::operand X, typed::operand I>
auto gather(const X& x, const I& indices) {
  using T = typename typed::element_of<X>::type;
  using Index = typename typed::element_of<I>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  using ID = typename std::remove_cvref_t<I>::dims_type;
  using rule = typed::op_rule<typed::made_along<ops::gather, Axis>, std::remove_cvref_t<X>, std::remove_cvref_t<I>>;
  static_assert(rule::dtypes.ok(), "kiln::gather: the indices must be int32 or int64");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::gather: the axis must be one of the operand's dims");
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    constexpr int axis = ops::normalize_axis(Axis, D::rank);
    constexpr std::int64_t outer = elements_between(D::shape(), 0, axis), n = D::values[std::size_t(axis)],
                           inner = elements_between(D::shape(), axis + 1, D::rank), m = ID::size;
    return typed::apply_kernel<T, OutD, typed::made_along<ops::gather, Axis>>(
        [](T* out, const T* in, const Index* index) {
          ops::check_gather_indices(index, ID::shape(), Axis, D::shape());
          for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t j = 0; j < m; ++j) out = std::copy_n(in + (o * n + std::int64_t(index[j])) * inner, inner, out);
        },
        x, indices);
  }
}

namespace typed {
/// `ops::conv2d` with its strides and padding, for op_rule.
template <ops::padding Pad, std::int64_t StrideH, std::int64_t StrideW>
struct made_conv2d {
  static constexpr ops::conv2d op{StrideH, StrideW, Pad};
};
}  // namespace typed

/// `kiln::conv2d<kiln::padding::same, 2>(x, filters)` on typed operands: the 2-D
/// convolution of an NHWC input with HWIO filters, strides `StrideH` and `StrideW`,
/// shapes checked at compile time. It runs the runtime tier's CPU kernel, so it
/// gives its values.
template <ops::padding Pad = ops::padding::valid, std::int64_t StrideH = 1, std::int64_t StrideW = StrideH,
          typed::operand X, typed::operand F>
auto conv2d(const X& x, const F& filters) {
  using rule = typed::op_rule<typed::made_conv2d<Pad, StrideH, StrideW>, std::remove_cvref_t<X>, std::remove_cvref_t<F>>;
  static_assert(rule::dtypes.ok(), "kiln::conv2d: the input and filters must have one numeric element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(),
                "kiln::conv2d: the input (NHWC) and filters (HWIO) do not fit (ranks, channels or VALID sizes)");
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using T = typename typed::element_of<X>::type;
    using XD = typename std::remove_cvref_t<X>::dims_type;
    using FD = typename std::remove_cvref_t<F>::dims_type;
    using OutD = typed::dims_from<rule>;
    return typed::apply_kernel<T, OutD, typed::made_conv2d<Pad, StrideH, StrideW>>(
        [](T* out, const T* in, const T* f) {
          constexpr auto& xs = XD::values;
          constexpr auto& fs = FD::values;
          constexpr std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], StrideH, Pad).pad_before;
          constexpr std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], StrideW, Pad).pad_before;
          backend::cpu::conv2d<T>(in, xs[0], xs[1], xs[2], xs[3], f, fs[0], fs[1], fs[3], StrideH, StrideW, pad_h, pad_w, out,
                                  OutD::values[1], OutD::values[2]);
        },
        x, filters);
  }
}

/// The typed spellings of slice, gather and conv2d on kiln::tensors, so that one
/// generic callable serves both tiers.
template <auto Begin, auto Size>
tensor slice(const tensor& x) {
  return slice(x, typed::int_list_of<Begin>(), typed::int_list_of<Size>());
}
template <std::int64_t Axis>
tensor gather(const tensor& x, const tensor& indices) {
  return gather(x, indices, Axis);
}
template <ops::padding Pad, std::int64_t StrideH = 1, std::int64_t StrideW = StrideH>
tensor conv2d(const tensor& x, const tensor& filters) {
  return conv2d(x, filters, int_list{StrideH, StrideW}, Pad == ops::padding::valid ? "VALID" : "SAME");
}

namespace typed {

/// Joins operands along a dim: for each of `outer` rows, `chunk[k]` elements from
/// operand k in turn (concat and stack differ only in their chunks).
template <std::int64_t Outer, std::int64_t... Chunk, class T, class... In>
void join(T* out, const In*... in) {
  for (std::int64_t o = 0; o < Outer; ++o) ((out = std::copy_n(in + o * Chunk, Chunk, out)), ...);
}

template <class Op, std::int64_t Axis, class... X>
auto join_along(const X&... x) {
  using T = typename typed::element_of<std::tuple_element_t<0, std::tuple<X...>>>::type;
  using rule = typed::op_rule<typed::made_along<Op, Axis>, std::remove_cvref_t<X>...>;
  if constexpr (!rule::dtypes.ok() || !rule::shapes.ok()) {
    return typed::rule_error{};
  } else {
    using OutD = typed::dims_from<rule>;
    using first = typename std::remove_cvref_t<std::tuple_element_t<0, std::tuple<X...>>>::dims_type;
    // Dims before the axis make the rows; concat's axis is one of its operands' dims,
    // stack's a new one.
    constexpr int axis = int(Axis < 0 ? Axis + OutD::rank : Axis);
    constexpr std::int64_t outer = elements_between(first::shape(), 0, axis);
    return apply_kernel<T, OutD, made_along<Op, Axis>>(
        [](T* out, const auto*... in) { join<outer, (std::remove_cvref_t<X>::dims_type::size / outer)...>(out, in...); },
        x...);
  }
}

}  // namespace typed

/// `kiln::concat<1>(a, b, ...)` on typed operands: joined along an existing dim, the
/// others equal (checked at compile time).
template <std::int64_t Axis = 0, typed::operand... X>
  requires(sizeof...(X) > 0)
auto concat(const X&... x) {
  using rule = typed::op_rule<typed::made_along<ops::concat, Axis>, std::remove_cvref_t<X>...>;
  static_assert(rule::dtypes.ok(), "kiln::concat: the operands must have one element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::concat: the operands' dims must be equal but along the axis");
  return typed::join_along<ops::concat, Axis>(x...);
}

/// `kiln::stack<0>(a, b, ...)` on typed operands of one type: joined along a new dim.
template <std::int64_t Axis = 0, typed::operand... X>
  requires(sizeof...(X) > 0)
auto stack(const X&... x) {
  using rule = typed::op_rule<typed::made_along<ops::stack, Axis>, std::remove_cvref_t<X>...>;
  static_assert(rule::dtypes.ok(), "kiln::stack: the operands must have one element type");
  static_assert(!rule::dtypes.ok() || rule::shapes.ok(), "kiln::stack: the operands must have the same dims");
  return typed::join_along<ops::stack, Axis>(x...);
}

/// `kiln::concat<Axis>(a, b)` and `kiln::stack<Axis>(a, b)` on kiln::tensors, so that
/// one generic callable serves both tiers.
template <std::int64_t Axis = 0, class... T>
  requires(sizeof...(T) > 0 && (std::same_as<T, tensor> && ...))
tensor concat(const T&... x) {
  return concat({x...}, Axis);
}
template <std::int64_t Axis = 0, class... T>
  requires(sizeof...(T) > 0 && (std::same_as<T, tensor> && ...))
tensor stack(const T&... x) {
  return stack({x...}, Axis);
}

/// The typed spellings on a kiln::tensor, so that one generic callable serves both
/// tiers: `kiln::transpose<1, 0>(t)`, `kiln::reshape<3, 2>(t)`.
template <std::int64_t P, std::int64_t... More>
tensor transpose(const tensor& x) {
  return transpose(x, int_list{P, More...});
}
template <std::int64_t D, std::int64_t... More>
tensor reshape(const tensor& x) {
  return reshape(x, shape{D, More...});
}

#define KILN_TYPED_LIKE(fn, factory)                                                            \
  template <typed::operand X>                                                                   \
  auto fn(const X&) {                                                                           \
    using V = std::remove_cvref_t<X>;                                                           \
    using F = typed::fixed_t<typename V::value_type, typename V::dims_type>;                    \
    if constexpr (typed::eager<X>)                                                              \
      return F::factory();                                                                      \
    else                                                                                        \
      return typed::symbol<typename V::value_type, typename V::dims_type>(F::factory());         \
  }
/// `kiln::ones_like(x)` of a typed operand: its type, all ones; a symbolic value in
/// a trace, so that a loop can rebind it (`auto c = kiln::ones_like(a); c = c * a;`).
KILN_TYPED_LIKE(ones_like, ones)
/// `kiln::zeros_like(x)` of a typed operand: its type, all zeros.
KILN_TYPED_LIKE(zeros_like, zeros)
#undef KILN_TYPED_LIKE

/// `kiln::reshape<3, 2>(x)` on a typed operand: the same elements in row-major order
/// as new dims with as many elements.
template <std::int64_t... Dims, typed::operand X>
auto reshape(const X& x) {
  using T = typename typed::element_of<X>::type;
  using D = typename std::remove_cvref_t<X>::dims_type;
  static_assert(typed::dims<Dims...>::size == D::size, "kiln::reshape: the new dims must hold as many elements as the old");
  using OutD = typed::dims<Dims...>;
  if constexpr (typed::is_symbol<std::remove_cvref_t<X>>::value)
    return typed::symbol<T, OutD>(x.slot());  // the same slot, read with other dims
  else
    return typed::apply_kernel<T, OutD, typed::made_reshape<Dims...>>([](T* out, const T* in) { std::copy_n(in, D::size, out); }, x);
}

}  // namespace kiln
// ----- end kiln/typed/unfused_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_UNFUSED_OPS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_CONTROL_FLOW_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_CONTROL_FLOW_HPP
// ----- begin kiln/typed/control_flow.hpp -----
/// \file
/// kiln::cond, kiln::while_loop and kiln::for_range on typed values. In a typed trace a
/// branch, a loop's condition and its body are each traced once, into step lists of
/// their own that one step of the trace runs: the branch the condition picks, or the
/// body while the condition holds. Loop variables are slots of the frame; the body's
/// next values are written to slots of their own and then copied into the loop
/// variables, so that each is computed from the values the iteration started with.
/// That both branches, or the body, keep every value's element type and dims is
/// checked at compile time. On `fixed` values (outside a function) they run at once,
/// as C++ control flow.

#include <array>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_CONTROL_FLOW_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_CONTROL_FLOW_HPP
// ----- begin kiln/ops/control_flow.hpp -----
/// \file
/// What both tiers' control flow share: the concepts that tell loop variables, loop
/// options, loop indices and loop bodies apart. kiln::while_loop and kiln::for_range
/// have overloads in each tier; they constrain with these same concepts, so that the
/// typed overloads, which add constraints, are the more specialized ones.

#include <concepts>

namespace kiln {

class tensor;
struct loop_options;

namespace detail {

/// Loop variables given without kiln::loop_options first.
template <class... Vars>
concept plain_loop_variables = (!std::same_as<Vars, loop_options> && ...);

/// A loop's index or bound: a C++ integer, or an int32 scalar tensor.
template <class T>
concept loop_index = std::integral<T> || std::same_as<T, tensor>;

/// A loop body, told apart from a loop index.
template <class T>
concept loop_body = !loop_index<T>;

}  // namespace detail
}  // namespace kiln
// ----- end kiln/ops/control_flow.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_CONTROL_FLOW_HPP

namespace kiln {
namespace typed {

/// The `fixed` type of a typed operand's value.
template <class X>
using value_of = fixed_t<typename std::remove_cvref_t<X>::value_type, typename std::remove_cvref_t<X>::dims_type>;

template <class R>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

/// A branch's or body's result as a tuple: one value, or a std::tuple of them.
template <class R>
auto as_tuple(R&& r) {
  if constexpr (is_tuple<std::remove_cvref_t<R>>::value)
    return std::forward<R>(r);
  else
    return std::tuple<std::remove_cvref_t<R>>(std::forward<R>(r));
}

/// A tuple of one value as the value, of several as the tuple.
template <class Tuple>
auto unwrap(Tuple&& t) {
  if constexpr (std::tuple_size_v<std::remove_cvref_t<Tuple>> == 1)
    return std::get<0>(std::forward<Tuple>(t));
  else
    return std::forward<Tuple>(t);
}

/// Whether the values of tuple types `A` and `B` have the same element types and dims.
template <class A, class B>
struct same_values : std::false_type {};
template <class... A, class... B>
  requires(sizeof...(A) == sizeof...(B))
struct same_values<std::tuple<A...>, std::tuple<B...>>
    : std::bool_constant<(std::is_same_v<value_of<A>, value_of<B>> && ...)> {};

/// Whether a tuple type holds a symbolic value or expression.
template <class Tuple>
struct holds_lazy : std::false_type {};
template <class... T>
struct holds_lazy<std::tuple<T...>> : std::bool_constant<(lazy<T> || ...)> {};

/// Whether typed operand `P` is a bool scalar.
template <class P>
inline constexpr bool bool_scalar =
    std::is_same_v<typename std::remove_cvref_t<P>::value_type, bool> && std::remove_cvref_t<P>::dims_type::size == 1;

/// Whether a typed loop body's result stops early (kiln::break_if on a typed condition:
/// kiln/core/results.hpp's break_result).
template <class R>
struct is_break : std::false_type {};
template <class Tuple, class P>
struct is_break<break_result<Tuple, P>> : std::bool_constant<operand<P>> {};
/// Whether a body's result stops on a symbolic condition.
template <class R>
inline constexpr bool stops_lazily = false;
template <class Tuple, class P>
inline constexpr bool stops_lazily<break_result<Tuple, P>> = lazy<P>;

/// A loop body's next values as a tuple, with or without kiln::break_if.
template <class R>
auto next_values(R&& r) {
  if constexpr (is_break<std::remove_cvref_t<R>>::value)
    return as_tuple(std::forward<R>(r).next);
  else
    return as_tuple(std::forward<R>(r));
}

KILN_LIBRARY_INLINE void run_steps(const std::vector<step>& steps, frame f);

/// Traces `fn()` with the steps it records going to `steps`.
template <class Fn>
decltype(auto) trace_into(std::vector<step>& steps, Fn&& fn) {
  recorder& r = current_recorder();
  struct restore {
    recorder& r;
    std::vector<step>* previous;
    ~restore() { r.target = previous; }
  } guard{r, std::exchange(r.target, &steps)};
  return fn();
}

/// A symbol of its own slot holding the value of typed operand `x` (a copy).
template <class X>
symbol_for<value_of<X>> fresh_symbol(const X& x) {
  return symbol_for<value_of<X>>(record(expression_of<void, false>(x)));
}

/// A `cond` step: the steps of the branch that slot `pred` picks, which write the
/// slots `results`.
struct cond_step {
  int pred;
  std::vector<step> then_steps, else_steps;
  std::vector<int> results;
  KILN_LIBRARY_INLINE static void run(const void* data, frame f);
  KILN_LIBRARY_INLINE static void describe(const void* data, description_sink& sink);
};

/// A loop step: the condition's steps, then while slot `pred` holds the body's, each
/// iteration ending with the copies of next values into the loop variables, unless
/// slot `stop` (kiln::break_if's condition, when the body has one) holds.
struct loop_step {
  struct copy {
    int from, to;
    std::size_t bytes;
  };
  std::vector<step> cond_steps, body_steps;
  int pred = -1, stop = -1;
  std::vector<copy> copies;
  KILN_LIBRARY_INLINE static void run(const void* data, frame f);
  KILN_LIBRARY_INLINE static void describe(const void* data, description_sink& sink);
};

/// Writes the values of `values` to slots `slots`, in the steps being recorded.
template <class Tuple, std::size_t N>
void record_values(const Tuple& values, const std::array<int, N>& slots) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (record_into(expression_of<void, false>(std::get<I>(values)), slots[I]), ...);
  }(std::make_index_sequence<N>());
}

/// while_loop and for_range on typed values; `ForRange` picks the messages.
template <bool ForRange, class Cond, class Body, class... Vars>
auto loop(Cond& cond_fn, Body& body_fn, const Vars&... vars) {
  using var_values = std::tuple<value_of<Vars>...>;
  using pred_t = std::invoke_result_t<Cond&, const value_of<Vars>&...>;
  using body_t = std::invoke_result_t<Body&, const value_of<Vars>&...>;
  using next_t = decltype(next_values(std::declval<body_t>()));
  constexpr bool breaks = is_break<body_t>::value;
  static_assert(bool_scalar<pred_t>, "kiln::while_loop: the condition must give a bool scalar");
  if constexpr (ForRange)
    static_assert(same_values<var_values, next_t>::value,
                  "kiln::for_range: the body must give each loop variable its element type and dims");
  else
    static_assert(same_values<var_values, next_t>::value,
                  "kiln::while_loop: the body must give each loop variable its element type and dims");
  if constexpr (!bool_scalar<pred_t> || !same_values<var_values, next_t>::value) {
    return rule_error{};
  } else if constexpr (eager<Vars...> && !lazy<pred_t> && !holds_lazy<next_t>::value && !stops_lazily<body_t>) {
    // `fixed` values, and a condition and body that read no symbolic value: now.
    var_values v{vars...};
    while (std::apply(cond_fn, v).data()[0]) {
      auto r = std::apply(body_fn, v);
      if constexpr (breaks) {
        if (r.stop.data()[0]) break;
      }
      v = var_values(next_values(std::move(r)));
    }
    return unwrap(std::move(v));
  } else {
    std::tuple<symbol_for<value_of<Vars>>...> loop_vars{fresh_symbol(vars)...};
    auto data = std::make_unique<loop_step>();
    trace_into(data->cond_steps, [&] { data->pred = slot_of(std::apply(cond_fn, loop_vars)); });
    trace_into(data->body_steps, [&] {
      auto r = std::apply(body_fn, loop_vars);
      if constexpr (breaks) data->stop = slot_of(r.stop);
      const auto next = next_values(std::move(r));
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (data->copies.push_back({fresh_symbol(std::get<I>(next)).slot(), std::get<I>(loop_vars).slot(),
                                 bytes_of<value_of<Vars>>}),
         ...);
      }(std::index_sequence_for<Vars...>());
    });
    current_recorder().push(step_of(std::move(data)));
    return unwrap(std::move(loop_vars));
  }
}

}  // namespace typed

/// kiln::cond on a typed bool scalar: on a `fixed` value it runs the branch it picks;
/// in a typed trace both branches are traced, must give values of the same element
/// types and dims (checked at compile time), and the one the condition picks runs.
/// \code
/// kiln::function f([](const auto& x) { return kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x; }, [&] { return -x; }); });
/// f(kiln::fixed<float, 3>::ones());  // [1 1 1]
/// \endcode
template <typed::operand P, class Then, class Else>
auto cond(const P& pred, Then then_fn, Else else_fn) {
  using then_t = decltype(typed::as_tuple(then_fn()));
  using else_t = decltype(typed::as_tuple(else_fn()));
  static_assert(typed::bool_scalar<P>, "kiln::cond: the condition must be a bool scalar");
  static_assert(typed::same_values<then_t, else_t>::value,
                "kiln::cond: both branches must give values of the same element types and dims");
  if constexpr (!typed::bool_scalar<P> || !typed::same_values<then_t, else_t>::value) {
    return typed::rule_error{};
  } else if constexpr (typed::eager<P> && !typed::holds_lazy<then_t>::value && !typed::holds_lazy<else_t>::value) {
    using result = decltype(typed::unwrap(std::declval<then_t>()));
    return pred.data()[0] ? result(typed::unwrap(typed::as_tuple(then_fn()))) : result(typed::unwrap(typed::as_tuple(else_fn())));
  } else {
    typed::recorder& r = typed::current_recorder();
    auto data = std::make_unique<typed::cond_step>();
    data->pred = typed::slot_of(pred);
    std::array<int, std::tuple_size_v<then_t>> slots{};
    auto results = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{typed::symbol_for<typed::value_of<std::tuple_element_t<I, then_t>>>(
          slots[I] = r.add_slot(typed::bytes_of<typed::value_of<std::tuple_element_t<I, then_t>>>))...};
    }(std::make_index_sequence<std::tuple_size_v<then_t>>());
    typed::trace_into(data->then_steps, [&] { typed::record_values(typed::as_tuple(then_fn()), slots); });
    typed::trace_into(data->else_steps, [&] { typed::record_values(typed::as_tuple(else_fn()), slots); });
    data->results.assign(slots.begin(), slots.end());
    r.push(typed::step_of(std::move(data)));
    return typed::unwrap(std::move(results));
  }
}

/// kiln::break_if on a typed bool scalar, ending the body of a typed while_loop or
/// for_range: when `pred` holds the loop stops, keeping the values this iteration
/// started with; otherwise it goes on with `next...`.
/// \code auto i = kiln::while_loop([](const auto& i) { return i < 10; }, [](const auto& i) { return kiln::break_if(i == 3, i + 1); }, kiln::fixed<int>(0)); \endcode
template <typed::operand P, class... Next>
auto break_if(const P& pred, const Next&... next) {
  static_assert(typed::bool_scalar<P>, "kiln::break_if: the condition must be a bool scalar");
  return break_result<std::tuple<Next...>, P>{pred, std::tuple<Next...>(next...)};
}

/// kiln::while_loop on typed loop variables: on `fixed` values a C++ loop; in a typed
/// trace the condition and the body are traced once, and the body must give each
/// variable its element type and dims (checked at compile time).
/// \code
/// kiln::function f([](const auto& x0) {
///   return kiln::while_loop([](const auto& x) { return kiln::reduce_sum(x) > 1.f; }, [](const auto& x) { return kiln::tanh(x); }, x0);
/// });
/// f(kiln::fixed<float, 3>::ones());
/// \endcode
template <class Cond, class Body, class... Vars>
  requires detail::plain_loop_variables<Vars...> && (sizeof...(Vars) > 0) && (typed::operand<Vars> && ...)
auto while_loop(Cond cond_fn, Body body_fn, const Vars&... vars) {
  return typed::loop<false>(cond_fn, body_fn, vars...);
}

/// kiln::for_range on typed loop variables, `i` an int32 scalar of the same tier.
/// \code auto total = kiln::for_range(10, [](const auto& i, const auto& t) { return t + kiln::cast<float>(i); }, kiln::fixed<float>(0.f)); \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body> && detail::plain_loop_variables<Vars...> &&
           (sizeof...(Vars) > 0) && (typed::operand<Vars> && ...)
auto for_range(const Limit& limit, Body body_fn, const Vars&... vars) {
  static_assert(std::is_integral_v<Limit>, "kiln::for_range: on typed loop variables the limit is a C++ integer");
  const std::int32_t n = std::int32_t(limit);
  auto cond_fn = [n](const auto& i, const auto&...) { return i < n; };
  auto body = [&body_fn](const auto& i, const auto&... v) {
    auto r = body_fn(i, v...);
    auto next = std::tuple_cat(std::tuple(i + 1), typed::next_values(std::move(r)));
    if constexpr (typed::is_break<decltype(r)>::value)
      return break_result<decltype(next), decltype(r.stop)>{r.stop, std::move(next)};
    else
      return next;
  };
  auto out = typed::as_tuple(typed::loop<true>(cond_fn, body, fixed<std::int32_t>(0), vars...));
  return typed::unwrap(std::apply([](auto&&, auto&&... rest) { return std::tuple{std::move(rest)...}; }, std::move(out)));
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE void run_steps(const std::vector<step>& steps, frame f) {
  for (const step& s : steps) s.run(s.data.get(), f);
}

KILN_LIBRARY_INLINE void cond_step::run(const void* data, frame f) {
  const auto& c = *static_cast<const cond_step*>(data);
  run_steps(*static_cast<const bool*>(f[c.pred]) ? c.then_steps : c.else_steps, f);
}

KILN_LIBRARY_INLINE void cond_step::describe(const void* data, description_sink& sink) {
  sink.control_flow(*static_cast<const cond_step*>(data));
}

KILN_LIBRARY_INLINE void loop_step::run(const void* data, frame f) {
  const auto& l = *static_cast<const loop_step*>(data);
  for (;;) {
    run_steps(l.cond_steps, f);
    if (!*static_cast<const bool*>(f[l.pred])) return;
    run_steps(l.body_steps, f);
    if (l.stop >= 0 && *static_cast<const bool*>(f[l.stop])) return;
    for (const copy& c : l.copies) std::memcpy(f[c.to], f[c.from], c.bytes);
  }
}

KILN_LIBRARY_INLINE void loop_step::describe(const void* data, description_sink& sink) {
  sink.control_flow(*static_cast<const loop_step*>(data));
}

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/typed/control_flow.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_CONTROL_FLOW_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_EFFECTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_EFFECTS_HPP
// ----- begin kiln/typed/effects.hpp -----
/// \file
/// State and effects of the compile-time tier: `kiln::fixed_variable<T, Dims...>` and
/// kiln::print of typed values. In a typed trace they are steps, so they happen at
/// every call, in program order. A plain kiln::variable used with typed values is a
/// compile error that names fixed_variable.

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>


namespace kiln {

/// A variable whose element type and shape are compile-time, for functions called with
/// `fixed` arguments. Copies share the value. Inside a typed trace
/// `read_value`, `assign`, `assign_add` and `assign_sub` run at every call, in program
/// order, and give the value read or written; outside one, `value()` reads it and
/// `set(x)` writes it.
/// \code
/// kiln::fixed_variable<float, 3> total;
/// kiln::function add_to([&](const auto& x) { return total.assign_add(x); });
/// add_to(kiln::fixed<float, 3>::ones());
/// add_to(kiln::fixed<float, 3>::ones());  // total.value() is [2 2 2]
/// \endcode
namespace typed {

/// A fixed_variable's value and name, shared by its copies and the traces using it.
template <class V>
struct variable_state {
  V value;
  std::string name;
};

/// A step reading the variable in place: it points slot `slot` at the value, which a
/// later write or host callback of the trace copies first for the steps that still
/// read it (recorder::protect_reads_in_place). Holds the state, so the trace keeps
/// the variable alive.
template <class V>
struct variable_read {
  std::shared_ptr<variable_state<V>> target;
  int slot;
  variable_read(std::shared_ptr<variable_state<V>> t, int s) : target(std::move(t)), slot(s) {}
  static void run(const void* data, frame f) {
    const auto& a = *static_cast<const variable_read*>(data);
    const_cast<void**>(f)[a.slot] = a.target->value.data();  // frames are writable (keep_values_read_in_place)
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& a = *static_cast<const variable_read*>(data);
    sink.bind(a.slot, sink.effect("ReadVariableOp", a.target->name, false, {}, {{V::dtype, V::shape()}})[0]);
  }
};

/// A step writing slot `slot` to the variable, after giving the reads in place that
/// `redirects` names a copy of the value they read.
template <class V>
struct variable_write {
  std::shared_ptr<variable_state<V>> target;
  int slot;
  std::vector<redirect> redirects;
  static void run(const void* data, frame f) {
    const auto& a = *static_cast<const variable_write*>(data);
    keep_values_read_in_place(a.redirects, f);
    std::memcpy(a.target->value.data(), f[a.slot], bytes_of<V>);
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& a = *static_cast<const variable_write*>(data);
    sink.effect("AssignVariableOp", a.target->name, true, {sink.value(a.slot, V::dims_type::values)},
                {{V::dtype, V::shape()}});
  }
};

}  // namespace typed

template <class T, std::int64_t... Dims>
class fixed_variable {
 public:
  using value_type = fixed<T, Dims...>;
  using symbol_type = typed::symbol_for<value_type>;

  /// A variable holding `initial` (zeros by default).
  explicit fixed_variable(const value_type& initial = value_type(), std::string name = "Variable")
      : state_(std::make_shared<state>(state{initial, std::move(name)})) {}

  /// The value now (outside a function).
  value_type value() const { return state_->value; }
  /// Sets the value now (outside a function).
  void set(const value_type& x) { state_->value = x; }
  const std::string& name() const { return state_->name; }

  /// The value at this point of every run of the trace. It is read in place, not
  /// copied: a write of the variable later in the trace (or a host callback, which
  /// might write it) first gives the steps that use this value a copy of it.
  symbol_type read_value() const {
    typed::recorder& r = recorder_for("read_value");
    return read_in_place(r, true);
  }
  /// Writes `x` (a typed operand of this type) and gives the value written.
  template <class X>
    requires typed::operand<X>
  symbol_type assign(const X& x) {
    recorder_for("assign");
    const symbol_type written(typed::expression_of<T, false>(x));
    typed::recorder& r = typed::current_recorder();
    auto write = std::make_unique<typed::variable_write<value_type>>(
        typed::variable_write<value_type>{state_, written.slot(), r.protect_reads_in_place(state_.get())});
    r.push(typed::step_of(std::move(write)));
    return written;
  }
  /// Adds `x` to the value and gives the sum.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_add(const X& x) {
    // The value read is used by the sum alone, computed before the write: no copy.
    return assign(read_in_place(recorder_for("assign_add"), false) + x);
  }
  /// Subtracts `x` from the value and gives the difference.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_sub(const X& x) {
    return assign(read_in_place(recorder_for("assign_sub"), false) - x);
  }

 private:
  using state = typed::variable_state<value_type>;
  /// A slot that reads the value in place; `kept` when a later write must give the
  /// steps reading it a copy.
  symbol_type read_in_place(typed::recorder& r, bool kept) const {
    const int out = r.add_slot(0);  // no workspace: it points at the value
    r.push(typed::step_of(std::make_unique<const typed::variable_read<value_type>>(state_, out)));
    if (kept) r.add_read_in_place(state_.get(), out, state_->value.data(), typed::bytes_of<value_type>);
    return symbol_type(out);
  }
  static typed::recorder& recorder_for(const char* member) {
    typed::recorder* r = typed::recorder::current();
    if (!r)
      throw type_error(std::string("kiln::fixed_variable::") + member +
                       ": only inside a function called with fixed arguments; outside one, read with value() and write "
                       "with set()");
    return *r;
  }

  std::shared_ptr<state> state_;
};

namespace typed {

/// A print step: the line of `pieces`, whose inputs are read from slots as tensors.
struct print_step {
  struct input {
    int slot;
    kiln::dtype dtype;
    kiln::shape shape;
  };
  std::vector<detail::print_piece> pieces;
  std::vector<input> inputs;
  KILN_LIBRARY_INLINE static void run(const void* data, frame f);
  KILN_LIBRARY_INLINE static void describe(const void* data, description_sink& sink);
};

}  // namespace typed

/// kiln::print in a typed trace: typed values are printed as they are at every call.
/// \code kiln::function f([](const auto& x) { kiln::print("x is", x); return x * 2; }); \endcode
template <class... Args>
  requires(typed::lazy<Args> || ...)
void print(const Args&... args) {
  auto data = std::make_unique<typed::print_step>();
  std::vector<tensor> unused;
  (
      [&](const auto& a) {
        using A = std::remove_cvref_t<decltype(a)>;
        if constexpr (typed::operand<A>) {
          using V = typed::value_of<A>;
          data->pieces.push_back({{}, int(data->inputs.size())});
          data->inputs.push_back({typed::slot_of(a), V::dtype, V::shape()});
        } else {
          detail::add_print_piece(a, data->pieces, unused);
        }
      }(args),
      ...);
  typed::current_recorder().push(typed::step_of(std::move(data)));
}

namespace typed {

/// Whether `R` is what a typed host callback may return: nothing, a `fixed`, or a
/// std::tuple of them.
template <class R>
inline constexpr bool callback_result = std::is_void_v<R> || fixed_value<R>;
template <class... R>
inline constexpr bool callback_result<std::tuple<R...>> = (fixed_value<R> && ...);

/// How many values a callback's result `R` holds.
template <class R>
inline constexpr std::size_t result_count = 1;
template <>
inline constexpr std::size_t result_count<void> = 0;
template <class... R>
inline constexpr std::size_t result_count<std::tuple<R...>> = sizeof...(R);

/// A `fixed` of type `V` holding a copy of the value at `p`.
template <class V>
V copy_of(const void* p) {
  V v(uninitialized);
  std::memcpy(v.data(), p, bytes_of<V>);
  return v;
}

/// A host callback step: `fn` on copies of the slots `in` as `fixed` values, its
/// results written to the slots `out`. A callback may set any fixed_variable, so the
/// values read in place before it are copied first (`redirects`).
template <class F, class R, class... In>
struct callback_step {
  static constexpr std::size_t results = result_count<R>;
  mutable F fn;  // a callback may keep state of its own, as a C++ function may
  std::array<int, sizeof...(In)> in;
  std::array<int, results> out;
  std::vector<redirect> redirects;
  static void run(const void* data, frame f) {
    const auto& c = *static_cast<const callback_step*>(data);
    keep_values_read_in_place(c.redirects, f);
    auto call = [&]<std::size_t... I>(std::index_sequence<I...>) -> R { return c.fn(copy_of<In>(f[c.in[I]])...); };
    if constexpr (results == 0) {
      call(std::index_sequence_for<In...>());
    } else {
      const auto values = as_tuple(call(std::index_sequence_for<In...>()));
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (std::memcpy(f[c.out[K]], std::get<K>(values).data(), bytes_of<std::tuple_element_t<K, std::remove_cvref_t<decltype(values)>>>), ...);
      }(std::make_index_sequence<results>());
    }
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& c = *static_cast<const callback_step*>(data);
    const auto nodes = slot_values<In...>(sink, c.in);
    std::vector<std::pair<kiln::dtype, kiln::shape>> specs;
    if constexpr (results > 0) {
      using values = decltype(as_tuple(std::declval<R>()));
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (specs.emplace_back(std::tuple_element_t<K, values>::dtype, std::tuple_element_t<K, values>::shape()), ...);
      }(std::make_index_sequence<results>());
    }
    const std::vector<int> ids = sink.effect("HostCallback", {}, true, {nodes.begin(), nodes.end()}, specs);
    for (std::size_t k = 0; k < results; ++k) sink.bind(c.out[k], ids[k]);
  }
};

}  // namespace typed

/// kiln::host_callback on typed values (TensorFlow's tf.py_function): C++ function
/// `fn` runs at every call of the trace, in program order, on `fixed` copies of the
/// inputs' values, and returns nothing, a `fixed` or a std::tuple of them, which the
/// trace goes on with. On `fixed` values outside a function it runs at once.
/// \code
/// kiln::function f([&](const auto& x) {
///   return kiln::host_callback([](const kiln::fixed<float, 3>& v) { return v * 2.f; }, x + 1.f);
/// });
/// \endcode
template <class F, typed::operand... Inputs>
  requires(sizeof...(Inputs) > 0)
auto host_callback(F fn, const Inputs&... inputs) {
  using R = std::invoke_result_t<F&, const typed::value_of<Inputs>&...>;
  static_assert(typed::callback_result<R>,
                "kiln::host_callback: on typed values the callback returns nothing, a kiln::fixed or a std::tuple of them");
  if constexpr (!typed::callback_result<R>) {
    return typed::rule_error{};
  } else if constexpr (typed::eager<Inputs...>) {
    return fn(typed::value_of<Inputs>(inputs)...);
  } else {
    using step_t = typed::callback_step<F, R, typed::value_of<Inputs>...>;
    typed::recorder& r = typed::current_recorder();
    auto data = std::make_unique<step_t>(step_t{std::move(fn), {typed::slot_of(inputs)...}, {}, {}});
    data->redirects = r.protect_reads_in_place(nullptr);
    if constexpr (step_t::results == 0) {
      r.push(typed::step_of(std::move(data)));
    } else {
      using results_t = decltype(typed::as_tuple(std::declval<R>()));
      auto symbols = [&]<std::size_t... K>(std::index_sequence<K...>) {
        return std::tuple{typed::symbol_for<std::tuple_element_t<K, results_t>>(
            data->out[K] = r.add_slot(typed::bytes_of<std::tuple_element_t<K, results_t>>))...};
      }(std::make_index_sequence<step_t::results>());
      r.push(typed::step_of(std::move(data)));
      return typed::unwrap(std::move(symbols));
    }
  }
}

// A kiln::variable holds a runtime kiln::tensor; typed values take a fixed_variable.
#define KILN_VARIABLE_WITH_TYPED(sym)                                                                          \
  template <typed::operand X>                                                                                  \
  auto operator sym(const variable&, const X&) {                                                               \
    static_assert(typed::always_false<X>,                                                                      \
                  "kiln: a kiln::variable cannot be used with fixed arguments; use kiln::fixed_variable<T, Dims...>"); \
    return typed::rule_error{};                                                                                \
  }                                                                                                            \
  template <typed::operand X>                                                                                  \
  auto operator sym(const X&, const variable&) {                                                               \
    static_assert(typed::always_false<X>,                                                                      \
                  "kiln: a kiln::variable cannot be used with fixed arguments; use kiln::fixed_variable<T, Dims...>"); \
    return typed::rule_error{};                                                                                \
  }
KILN_VARIABLE_WITH_TYPED(+)
KILN_VARIABLE_WITH_TYPED(-)
KILN_VARIABLE_WITH_TYPED(*)
KILN_VARIABLE_WITH_TYPED(/)
KILN_VARIABLE_WITH_TYPED(<)
KILN_VARIABLE_WITH_TYPED(>)
#undef KILN_VARIABLE_WITH_TYPED

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE void print_step::run(const void* data, frame f) {
  const auto& p = *static_cast<const print_step*>(data);
  std::vector<tensor> values;
  std::vector<const tensor*> in;
  values.reserve(p.inputs.size());
  for (const input& i : p.inputs) {
    tensor& t = values.emplace_back(i.dtype, i.shape);
    std::memcpy(t.view().data, f[i.slot], std::size_t(i.shape.num_elements()) * size_of(i.dtype));
  }
  for (const tensor& t : values) in.push_back(&t);
  detail::write_print_line(detail::print_line(p.pieces, in));
}

KILN_LIBRARY_INLINE void print_step::describe(const void* data, description_sink& sink) {
  std::vector<int> inputs;
  for (const input& i : static_cast<const print_step*>(data)->inputs)
    inputs.push_back(sink.value(i.slot, i.shape.dims()));
  sink.effect("PrintV2", {}, true, std::move(inputs), {});
}

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/typed/effects.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_EFFECTS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_FUNCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_FUNCTION_HPP
// ----- begin kiln/trace/function.hpp -----
/// \file
/// kiln::function: its options and its state. Its calls are the tiers': with `fixed`
/// arguments the compile-time tier's (kiln/typed/function_calls.hpp, which kiln/fixed.hpp
/// and kiln/kiln.hpp include), with kiln::tensor arguments the runtime tier's
/// (kiln/trace/runtime_tier.hpp, which kiln/kiln.hpp includes and kiln/fixed.hpp does not).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_JIT_SWITCH_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_JIT_SWITCH_HPP
// ----- begin kiln/exec/jit_switch.hpp -----
/// \file
/// The switch behind `function_options::jit_compile`, apart from the native-loop
/// compiler itself (kiln/exec/jit.hpp) so that the compile-time tier, which has
/// function_options too, need not include that compiler.

#include <concepts>

namespace kiln::detail {

/// The native-loop compiler behind function_options::jit_compile, defined in
/// kiln/exec/jit.hpp (runtime tier).
template <class>
struct native_loops;

/// function_options::jit_compile: a bool that, where a program turns it on, brings in
/// the native-loop compiler. Its constructor is a template, so that a program that
/// never sets the option compiles none of that compiler (its source generation, disk
/// cache and process spawning).
class jit_switch {
 public:
  constexpr jit_switch() = default;
  template <std::same_as<bool> B>
  jit_switch(B on) : on_(on) {
    if constexpr (requires { native_loops<B>::enable(); })
      if (on) native_loops<B>::enable();
  }
  constexpr operator bool() const { return on_; }

 private:
  bool on_ = false;
};
}  // namespace kiln::detail
// ----- end kiln/exec/jit_switch.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_JIT_SWITCH_HPP

namespace kiln {

namespace typed {
struct recorded_signature;
class trace_table;
}  // namespace typed

/// Options of a kiln::function.
/// \code kiln::function f([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}}); \endcode
struct function_options {
  /// Shown in signatures and errors.
  std::string name = "function";
  /// Names of the arguments; `x0`, `x1`, ... where not given.
  std::vector<std::string> arg_names = {};
  /// When set, the function traces at most once, for these specs, and rejects other inputs.
  std::optional<std::vector<tensor_spec>> input_signature = std::nullopt;
  /// Compile each fused elementwise cluster to one native loop with the system C++
  /// compiler (see kiln/exec/jit.hpp): intermediates stay in registers. The first
  /// call of a signature then costs a compile (about a second), unless an earlier
  /// process left the loop in the cache on disk.
  detail::jit_switch jit_compile = {};
  /// After a retrace, dims that changed become `None`, so further sizes reuse the trace.
  bool reduce_retracing = false;
};

namespace detail {

/// Fails to compile with the error for a kiln::function called with arguments its
/// callable does not take: the line above the error, "In instantiation of ... [with
/// Args = {...}]", names their types, and nothing after it reaches the callable.
template <class... Args>
inline constexpr bool accepted_by_callable = false;
template <class... Args>
void callable_does_not_accept() {
  static_assert(accepted_by_callable<Args...>, "kiln::function: the callable does not accept arguments of these types "
                                               "(Args, on the line above)");
}

struct argument_texts;
struct call_signature;
template <class>
struct basic_concrete_state;
using concrete_state = basic_concrete_state<void>;
struct runtime_traces;
class trace_context;

/// kiln::function's calls with kiln::tensor arguments, defined in
/// kiln/trace/runtime_tier.hpp. A program that includes kiln/fixed.hpp alone has the
/// compile-time tier only; calling a function with tensors there fails to compile
/// here: include <kiln/kiln.hpp> for the runtime tier.
template <class F>
struct runtime_tier;

/// Whether the runtime tier is there: kiln/kiln.hpp has been included.
template <class F>
concept has_runtime_tier = requires { sizeof(runtime_tier<F>); };

/// kiln::function's calls with `fixed` arguments, defined in
/// kiln/typed/function_calls.hpp (the compile-time tier), which kiln/fixed.hpp and
/// kiln/kiln.hpp include.
template <class F>
struct typed_tier;

/// Whether a call with `Args` is the compile-time tier's (`fixed` arguments).
template <class F, class... Args>
concept typed_call_of = requires { sizeof(typed_tier<F>); } && typed_tier<F>::template calls<Args...>;
/// Whether a get_concrete_function with `Args` asks for a typed trace.
template <class F, class... Args>
concept typed_request_of = requires { sizeof(typed_tier<F>); } && typed_tier<F>::template requests<Args...>;

/// What a kiln::function and its copies share: its options and traces
/// (`function_state`, the one specialization). Not a template on the callable, so that
/// what does not depend on it is compiled once per program, not once per function. The
/// members that trace and dispatch calls with tensor arguments are defined with the
/// runtime tier (kiln/trace/runtime_tier.hpp); a template on nothing, so that a file
/// compiles them (and the tracing, optimizer and executor behind them) only where it
/// calls a function with tensors, and a compiled kiln compiles them all with one
/// explicit instantiation (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_function_state {
  explicit basic_function_state(function_options o) : options(std::move(o)) {}

  function_options options;
  mutable std::mutex mutex;        // guards signatures and runtime
  /// A trace's signature: the runtime tier's, or else a typed trace's (it lives in
  /// `typed`), with how the compile-time tier writes it.
  struct signature_record {
    std::shared_ptr<const trace_signature> runtime;
    const typed::recorded_signature* typed = nullptr;
    trace_signature (*written)(const basic_function_state&, const typed::recorded_signature&) = nullptr;
  };
  std::vector<signature_record> signatures;  // of every trace, in either tier, in the order they were made
  std::recursive_mutex tracing;    // one trace at a time; a nested trace (recursion) re-enters
  /// The runtime tier's traces, made by its first call, with a deleter it sets: a file
  /// whose functions make typed traces only does not compile them.
  std::unique_ptr<runtime_traces, void (*)(runtime_traces*)> runtime{nullptr, nullptr};
  /// The traces of calls with `fixed` arguments, made by the first such call
  /// (kiln/typed/function_calls.hpp), with a deleter it sets; `typed_owner` owns them,
  /// `typed` is what calls read.
  std::atomic<typed::trace_table*> typed{nullptr};
  std::unique_ptr<typed::trace_table, void (*)(typed::trace_table*)> typed_owner{nullptr, nullptr};

  /// Adds a new typed trace's signature, which `written` writes out.
  void add_signature(const typed::recorded_signature& s,
                     trace_signature (*written)(const basic_function_state&, const typed::recorded_signature&));

  void check_input_signature(call_signature& sig, const std::vector<tensor_spec>& expected) const;

  /// The kiln::value_error for a call that `expected` does not accept (out of line: it
  /// formats tensors).
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_input_signature_mismatch(
      const call_signature& sig, const std::vector<tensor_spec>& expected);

  /// The trace that serves `sig`: a known one, or the one `trace_now(context, sig)`
  /// makes, registered under sig's key (one trace at a time; a recursion with the same
  /// signature is an error).
  std::shared_ptr<const concrete_state> find_or_trace(call_signature& sig,
                                                      std::shared_ptr<concrete_state> (*trace_now)(void*, const call_signature&),
                                                      void* context);

  /// The name of argument `i`: as the options give it, else x0, x1, ...
  std::string arg_name(std::size_t i) const;

  /// A new trace for `sig`, its arguments shown as `texts` says: its names and
  /// signature, and a placeholder in `context` per tensor leaf.
  std::shared_ptr<concrete_state> start_trace(const call_signature& sig, argument_texts texts, trace_context& context,
                                              std::vector<tensor>& placeholders) const;

  /// Makes `t` an output of trace `c`.
  static void add_output(concrete_state& c, trace_context& context, const tensor& t);

  /// Ends trace `c`: its graph, optimized and planned.
  static void finish_trace(concrete_state& c, trace_context& context);

  // Whether `sig` has a tensor_spec leaf (a get_concrete_function that asks for a
  // trace of those specs) rather than tensors only (a call).
  static bool asks_for_specs(const call_signature& sig);

  // The trace that serves `sig` when one is known: the one traced for its key, or for
  // a call, the more general trace it was dispatched to before.
  std::shared_ptr<concrete_state> known_trace(const call_signature& sig) const;

  // Whether trace `t` was made for the structure (nesting, C++ values) and dtypes of `sig`.
  static bool same_structure_and_dtypes(const concrete_state& t, const call_signature& sig);

  // A trace more general than the call (None dims, unknown ranks; made by
  // get_concrete_function or reduce_retracing) serves it, as TensorFlow dispatches to
  // the most specific trace that accepts a call: the one with the fewest unknowns.
  // get_concrete_function with tensor_specs asks for a trace of those specs instead.
  std::shared_ptr<concrete_state> most_specific_trace_accepting(const call_signature& sig) const;

  // reduce_retracing: the call is keyed by the most specific specs that accept both it
  // and the latest trace of its structure and dtypes, as TensorFlow's common
  // supertype: a dim that differs becomes None, a rank that differs unknown.
  void relax(call_signature& sig);

  /// After how many runtime-tier traces a function warns that it retraces often, as
  /// TensorFlow does after 5 (to config::warning_stream(), once per function).
  static constexpr std::size_t retracing_warning_traces = 5;
  void warn_retracing() const;

  // Variables may be created by the first trace only, and must outlive it: a
  // later trace would create another variable at each retrace, and a variable that
  // dies with the trace would be created anew at every call in eager code.
  void check_created_variables(const trace_context& context) const;
};
using function_state = basic_function_state<void>;

}  // namespace detail

/// TensorFlow's tf.function: traces `fn` once per input signature and runs the trace
/// on later calls with that signature. Called with kiln::tensor arguments, the trace
/// is a graph (the runtime tier); called with kiln::fixed arguments, a typed trace
/// made at compile time (the compile-time tier).
/// \code
/// kiln::function dbl([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}});
/// dbl(kiln::constant(1));    // traces, then runs: tensor(2, shape=(), dtype=int32)
/// dbl(kiln::constant(2));    // runs the same graph
/// \endcode
template <class F>
class function {
 public:
  explicit function(F fn, function_options options = {})
      : fn_(std::move(fn)), state_(std::make_shared<detail::function_state>(std::move(options))) {}

  /// Calls the function: traces on a new signature, then runs the trace. An object the
  /// callable takes by non-const reference (`[](auto& model, auto x)`) is keyed by
  /// address and passed as itself.
  template <class... Args>
  auto operator()(Args&&... args) {
    if constexpr (detail::typed_call_of<F, Args...>) {
      return detail::typed_tier<F>::call(*this, args...);
    } else if constexpr (!detail::has_runtime_tier<F>) {
      static_assert(detail::has_runtime_tier<F>, "kiln::function: a call with kiln::tensor arguments needs the runtime "
                                                 "tier; include <kiln/kiln.hpp> (kiln/fixed.hpp has the compile-time tier only)");
    } else {
      return detail::runtime_tier<F>::call(*this, std::forward<Args>(args)...);
    }
  }

  /// Traces for these arguments (values, tensor_specs or C++ values) without running.
  /// With `fixed` values or kiln::spec<T, Dims...> the trace is a typed one, and the
  /// result a typed::concrete_function taking the `fixed` arguments.
  template <class... Args>
  auto get_concrete_function(Args&&... args) {
    if constexpr (detail::typed_request_of<F, Args...>) {
      return detail::typed_tier<F>::get_concrete_function(*this, args...);
    } else if constexpr (!detail::has_runtime_tier<F>) {
      static_assert(detail::has_runtime_tier<F>, "kiln::function: a trace for kiln::tensor arguments needs the runtime "
                                                 "tier; include <kiln/kiln.hpp> (kiln/fixed.hpp has the compile-time tier only)");
    } else {
      return detail::runtime_tier<F>::get_concrete_function(*this, std::forward<Args>(args)...);
    }
  }

  /// Every trace's signature, in TensorFlow's format, in the order they were made,
  /// separated by blank lines, with no newline at the end (as TensorFlow's string).
  std::string pretty_printed_concrete_signatures() const {
    std::lock_guard lock(state_->mutex);
    std::string s;
    for (const auto& [runtime, typed, written] : state_->signatures) {
      if (!s.empty()) s += "\n\n";
      const std::string text = (runtime ? *runtime : written(*state_, *typed)).signature_text();
      s.append(text, 0, text.size() - 1);  // without its closing newline
    }
    return s;
  }
  /// How many times the callable has been traced, in either tier.
  int tracing_count() const {
    std::lock_guard lock(state_->mutex);
    return int(state_->signatures.size());
  }

 private:
  friend struct detail::runtime_tier<F>;
  friend struct detail::typed_tier<F>;

  F fn_;
  std::shared_ptr<detail::function_state> state_;
};

template <class F>
function(F) -> function<F>;
template <class F>
function(F, function_options) -> function<F>;

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
void basic_function_state<Unused>::add_signature(const typed::recorded_signature& s,
                                                 trace_signature (*written)(const basic_function_state&,
                                                                            const typed::recorded_signature&)) {
  std::lock_guard lock(mutex);
  signatures.push_back({nullptr, &s, written});
}

template <class Unused>
std::string basic_function_state<Unused>::arg_name(std::size_t i) const {
  if (i < options.arg_names.size()) return options.arg_names[i];
  std::string name = "x";  // appended, not `"x" + ...`: GCC 12 warns of the latter here
  name += std::to_string(i);
  return name;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY
// ----- end kiln/trace/function.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_FUNCTION_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_FUNCTION_CALLS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_FUNCTION_CALLS_HPP
// ----- begin kiln/typed/function_calls.hpp -----
/// \file
/// kiln::function's calls in the compile-time tier: with `fixed` arguments (and C++
/// values), each signature type traced once into a typed trace (kiln/typed/trace.hpp),
/// run at every later call. kiln::function (kiln/trace/function.hpp) hands such calls
/// here; kiln/fixed.hpp and kiln/kiln.hpp include this header.

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>


namespace kiln {

template <class>
detail::trace_signature typed::written(const detail::function_state& state, const recorded_signature& s) {
  detail::trace_signature w;
  w.name = state.options.name;
  w.bound_text = s.bound_text;
  for (const signature_leaf& a : s.type->arguments) {
    w.arg_names.push_back(state.arg_name(w.arg_names.size()));
    if (!a.typed) continue;
    w.inputs.emplace_back(a.shape, a.type, w.arg_names.back());
    w.input_arg.push_back(int(w.arg_names.size() - 1));
  }
  for (const signature_leaf& out : s.type->outputs) w.outputs.emplace_back(out.shape, out.type);
  w.output_structure = s.type->output_structure();
  return w;
}

namespace detail {

template <class F>
struct typed_tier {
  /// Whether a call with `Args` is this tier's.
  template <class... Args>
  static constexpr bool calls = typed::typed_call<Args...>;
  /// Whether a get_concrete_function with `Args` asks for a typed trace.
  template <class... Args>
  static constexpr bool requests = typed::typed_request<Args...>;

  /// A call with `fixed` arguments (and C++ values): traced at its first call with
  /// these C++ values, then the trace runs.
  template <class... Args>
  static auto call(function<F>& f, const Args&... args) {
    if constexpr (!std::is_invocable_v<F&, typed::traced_t<Args>&...>) {
      callable_does_not_accept<Args...>();
    } else {
      const auto* t = trace_for(f, args...);
      if constexpr (std::is_void_v<std::invoke_result_t<F&, typed::traced_t<Args>&...>>)
        t->run(data(args...));
      else
        return t->run(data(args...));
    }
  }

  /// The typed::concrete_function of these arguments (`fixed` values or
  /// kiln::spec<T, Dims...>, and C++ values), traced now if it is not yet.
  template <class... Args>
  static auto get_concrete_function(function<F>& f, const Args&... args) {
    if constexpr (!std::is_invocable_v<F&, typed::traced_t<Args>&...>) {
      callable_does_not_accept<Args...>();
    } else {
      using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
      using concrete = typename typed::concrete_for<R, Args...>::type;
      return concrete(trace_for(f, args...), f.state_);
    }
  }

 private:
  // The function's typed traces, made by its first typed call.
  static typed::trace_table& traces(function_state& state) {
    if (typed::trace_table* t = state.typed.load(std::memory_order_acquire)) return *t;
    std::lock_guard lock(state.mutex);
    if (!state.typed_owner) {
      state.typed_owner = {new typed::trace_table, [](typed::trace_table* t) { delete t; }};
      state.typed.store(state.typed_owner.get(), std::memory_order_release);
    }
    return *state.typed_owner;
  }

  // The typed trace of these arguments (`fixed` values or specs, and C++ values): the
  // slot of their signature type, found by its index, then the trace of these C++
  // values in it, traced now if there is none.
  template <class... Args>
  static auto trace_for(function<F>& f, const Args&... args) {
    using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
    using entry = typed::signature_traces<R, typed::values_of<Args...>>;
    typed::trace_table& table = traces(*f.state_);
    entry& e = table.template entry<std::tuple<typename typed::fixed_of<std::remove_cvref_t<Args>>::type...>, entry>();
    const typed::trace<R>* t = nullptr;
    if constexpr (std::tuple_size_v<typed::values_of<Args...>> == 0) {
      t = e.only.load(std::memory_order_acquire);
      if (!t) {
        std::lock_guard tracing(table.tracing);
        if (!(t = e.only.load(std::memory_order_acquire))) {
          e.only_owner = trace<R>(f, args...);
          e.only.store(t = e.only_owner.get(), std::memory_order_release);
        }
      }
    } else {
      const auto key = typed::values(args...);
      std::lock_guard tracing(table.tracing);
      std::lock_guard lock(e.mutex);
      for (const auto& [k, known] : e.by_value)
        if (k == key) t = known.get();
      if (!t) t = e.by_value.emplace_back(key, trace<R>(f, args...)).second.get();
    }
    return t;
  }

  // The data of a typed call's `fixed` arguments, in order.
  template <class... Args>
  static auto data(const Args&... args) {
    std::array<void*, (std::size_t(typed::typed_argument<Args>) + ... + 0)> data{};
    std::size_t i = 0;
    (
        [&](const auto& a) {
          if constexpr (typed::fixed_value<decltype(a)>) data[i++] = const_cast<void*>(static_cast<const void*>(a.data()));
        }(args),
        ...);
    return data;
  }

  template <class R, class... Args>
  static std::unique_ptr<typed::trace<R>> trace(function<F>& f, const Args&... args) {
    // The typed arguments' names, for the trace; the C++ values' text, for its signature.
    std::vector<std::string> typed_names, bound_text;
    std::size_t position = 0;
    (
        [&](const auto& a) {
          if constexpr (typed::typed_argument<decltype(a)>) {
            typed_names.push_back(f.state_->arg_name(position));
          } else {
            std::ostringstream os;
            os << a;
            bound_text.resize(sizeof...(Args));
            bound_text[position] = os.str();
          }
          ++position;
        }(args),
        ...);
    auto t = typed::trace_now<R>(f.fn_, std::move(typed_names), args...);
    t->signature = {&typed::signature_type_of<R, Args...>, std::move(bound_text)};
    f.state_->add_signature(t->signature, &typed::written<>);
    return t;
  }
};

}  // namespace detail

}  // namespace kiln
// ----- end kiln/typed/function_calls.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_FUNCTION_CALLS_HPP
// ----- end kiln/fixed.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_FIXED_HPP

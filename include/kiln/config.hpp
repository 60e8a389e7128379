#pragma once
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

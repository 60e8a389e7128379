#pragma once
/// \file
/// Non-temporal stores of xsimd batches, for outputs too large to stay in cache:
/// streaming them saves reading each line before writing it. Used by the
/// elementwise kernels and by native loops (kiln/exec/jit.hpp).

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "kiln/config.hpp"

namespace kiln::backend::cpu {

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
/// \code store_batch<true>(v, out + i); \endcode
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

#pragma once
/// \file
/// Loads and stores of xsimd batches that are not one plain full batch: partial ones
/// (a run's head or tail, touching nothing past its end; masked on AVX-512) and
/// non-temporal stores, for outputs too large to stay in cache (streaming them saves
/// reading each line before writing it). Used by the elementwise and matmul kernels,
/// the compile-time tier and native loops (kiln/exec/jit.hpp).

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kiln/core/simd.hpp"

#include "kiln/config.hpp"

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

#pragma once
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

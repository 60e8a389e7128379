#pragma once
/// \file
/// The scalar arithmetic that elementwise functors are written in. Each function
/// works on a C++ scalar (host or CUDA device) and on an `xsimd::batch`, so one
/// functor serves the reference, CPU-SIMD and Thrust backends. Integer arithmetic
/// wraps (two's complement) instead of overflowing into undefined behaviour.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/simd.hpp"

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

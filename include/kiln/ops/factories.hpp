#pragma once
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

#include "kiln/config.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"

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

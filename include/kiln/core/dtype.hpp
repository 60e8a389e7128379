#pragma once
/// \file
/// Element types: the runtime `kiln::dtype` and its mapping to C++ types.

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/core/error.hpp"

namespace kiln {

/// The element type of a tensor, known at run time.
/// \code kiln::zeros({2}, kiln::int32).dtype() == kiln::int32 \endcode
enum class dtype : std::uint8_t { bool_, int32, int64, float32, float64, string };

inline constexpr dtype bool_ = dtype::bool_;      ///< C++ `bool`
inline constexpr dtype int32 = dtype::int32;      ///< C++ `std::int32_t`
inline constexpr dtype int64 = dtype::int64;      ///< C++ `std::int64_t`
inline constexpr dtype float32 = dtype::float32;  ///< C++ `float`
inline constexpr dtype float64 = dtype::float64;  ///< C++ `double`
inline constexpr dtype string = dtype::string;    ///< C++ `std::string`

/// Number of dtypes; tables indexed by dtype have this many rows.
inline constexpr int dtype_count = 6;

/// The name TensorFlow prints for a dtype: `bool`, `int32`, ..., `string`.
constexpr std::string_view name(dtype t) {
  constexpr std::string_view names[dtype_count] = {"bool", "int32", "int64", "float32", "float64", "string"};
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
inline constexpr dtype_set all{bool_, int32, int64, float32, float64, string};
}  // namespace dtypes

/// The dtype of a C++ element type; `dtype_of<float> == float32`. Only the six
/// element types of the contract have one.
template <class T>
inline constexpr bool has_dtype =
    std::is_same_v<T, bool> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::string>;

template <class T>
  requires has_dtype<T>
inline constexpr dtype dtype_of = std::is_same_v<T, bool>           ? bool_
                                  : std::is_same_v<T, std::int32_t> ? int32
                                  : std::is_same_v<T, std::int64_t> ? int64
                                  : std::is_same_v<T, float>        ? float32
                                  : std::is_same_v<T, double>       ? float64
                                                                    : string;

namespace detail {
template <dtype D> struct element_type_of;
template <> struct element_type_of<bool_> { using type = bool; };
template <> struct element_type_of<int32> { using type = std::int32_t; };
template <> struct element_type_of<int64> { using type = std::int64_t; };
template <> struct element_type_of<float32> { using type = float; };
template <> struct element_type_of<float64> { using type = double; };
template <> struct element_type_of<string> { using type = std::string; };
}  // namespace detail

/// The C++ element type of a dtype: `element_t<kiln::float32>` is `float`.
template <dtype D>
using element_t = typename detail::element_type_of<D>::type;

/// Bytes per element (`sizeof(std::string)` for strings).
constexpr std::size_t size_of(dtype t) {
  constexpr std::size_t sizes[dtype_count] = {sizeof(bool), 4, 8, 4, 8, sizeof(std::string)};
  return sizes[static_cast<int>(t)];
}

constexpr bool is_floating(dtype t) { return dtypes::floating.contains(t); }
constexpr bool is_integer(dtype t) { return dtypes::integer.contains(t); }

/// Calls `f(std::type_identity<T>{})` with the C++ element type of `t`; the
/// single switch from a runtime dtype to compiled code.
/// \code kiln::visit_dtype(x.dtype(), [&](auto tag) { using T = typename decltype(tag)::type; ... }); \endcode
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case bool_: return f(std::type_identity<bool>{});
    case int32: return f(std::type_identity<std::int32_t>{});
    case int64: return f(std::type_identity<std::int64_t>{});
    case float32: return f(std::type_identity<float>{});
    case float64: return f(std::type_identity<double>{});
    case string: return f(std::type_identity<std::string>{});
  }
  throw internal_error("visit_dtype: invalid dtype value " + std::to_string(static_cast<int>(t)));
}

}  // namespace kiln

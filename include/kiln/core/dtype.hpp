#pragma once
/// \file
/// Element types: the runtime `kiln::dtype` and its mapping to C++ types.

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

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

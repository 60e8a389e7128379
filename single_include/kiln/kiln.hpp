// kiln single header, generated from include/kiln/kiln.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_KILN_HPP
#define KILN_SINGLE_INCLUDE_KILN_KILN_HPP
// ----- begin kiln/kiln.hpp -----
/// \file
/// The umbrella header: `#include <kiln/kiln.hpp>` gives the whole public API.

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

// Separate compilation (kiln/kernels.hpp). Header-only, every source file compiles
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
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
// ----- begin kiln/core/error.hpp -----
/// \file
/// The exception hierarchy of API.md section 7.

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
[[noreturn]] inline void rethrow_with_prefix(const std::string& prefix) {
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
}  // namespace detail

}  // namespace kiln
// ----- end kiln/core/error.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
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
  std::string str() const {
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
  explicit thread_pool(int threads) : size_(std::max(1, threads)) {
    for (int i = 1; i < size_; ++i) workers_.emplace_back([this] { work(); });
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

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
  void run_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* fn) {
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

  static bool& inside_worker() {
    thread_local bool flag = false;
    return flag;
  }

  static void drain(job& j) {
    for (std::int64_t i; (i = j.next.fetch_add(1, std::memory_order_relaxed)) < j.chunks;) j.call(j.fn, i);
  }

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

  void work() {
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

inline int default_thread_count() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

struct pool_holder {
  std::mutex mutex;
  std::shared_ptr<thread_pool> pool = std::make_shared<thread_pool>(default_thread_count());
};
inline pool_holder& pool_state() {
  static pool_holder holder;
  return holder;
}
inline std::shared_ptr<thread_pool> current_pool() {
  auto& s = pool_state();
  std::lock_guard lock(s.mutex);
  return s.pool;
}

/// How many chunks `n` items (more than `grain`) split into on `threads` threads: at
/// least `grain` items each, at most four per thread, and as many for every thread.
inline std::int64_t balanced_chunks(std::int64_t n, std::int64_t grain, std::int64_t threads) {
  const std::int64_t chunks = std::min((n + grain - 1) / grain, 4 * threads);
  return std::min(n, (chunks + threads - 1) / threads * threads);
}

/// parallel_for's ranges for any callable `call(fn, lo, hi)`, compiled once. A range
/// within the grain is one call here too, so that the body behind `call` is compiled
/// once, not again inline in each parallel_for.
inline void parallel_ranges(std::int64_t n, std::int64_t grain, void (*call)(void*, std::int64_t, std::int64_t), void* fn) {
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
inline void set_num_threads(int n) {
  auto& s = kiln::detail::pool_state();
  auto fresh = std::make_shared<kiln::detail::thread_pool>(std::max(1, n));
  std::lock_guard lock(s.mutex);
  s.pool = std::move(fresh);
}
/// The number of threads kernels use.
inline int num_threads() { return kiln::detail::current_pool()->size(); }
}  // namespace config

}  // namespace kiln
// ----- end kiln/core/parallel.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_PARALLEL_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP
// ----- begin kiln/core/tensor.hpp -----
/// \file
/// `kiln::tensor`: the runtime-typed tensor of API.md section 1. Eager tensors own a
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
struct host_system {
  // posix_memalign takes any size (aligned_alloc wants a multiple of the alignment),
  // so that blocks can be exact under AddressSanitizer.
  static void* allocate(std::size_t size) {
    void* p = nullptr;
    if (posix_memalign(&p, buffer_alignment, size) != 0) throw std::bad_alloc();
    return p;
  }
  static void release(void* p) noexcept { std::free(p); }
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
      data_ = memory_for(d).allocate(bytes_);
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
    memory_for(device_).deallocate(data_, bytes_);
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

  kiln::dtype dtype_;
  kiln::device device_;
  std::int64_t count_;
  std::size_t bytes_;
  void* data_ = nullptr;
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

/// A new storage of `count` elements, shared.
inline std::shared_ptr<storage> make_storage(kiln::dtype t, std::int64_t count, kiln::device d) {
  return std::allocate_shared<storage>(bookkeeping_allocator<storage>(), t, count, d);
}

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
  tensor to(kiln::device d) const {
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

  /// The kernel view of an eager tensor.
  buffer_view view() const { return {const_cast<void*>(raw_data()), dtype_, shape_}; }
  void* raw_data() const {
    return static_cast<char*>(const_cast<void*>(buffer_->data())) + offset_ * std::int64_t(size_of(dtype_));
  }
  /// A tensor sharing this one's buffer with another shape of the same size, or a
  /// contiguous window of it starting `offset` elements in.
  tensor share(const kiln::shape& s, std::int64_t offset = 0) const {
    tensor t = *this;
    t.shape_ = s;
    t.offset_ = offset_ + offset;
    return t;
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
  /// TensorFlow's tensor name, `a:0`: the node's name and the output index.
  std::string name;
};

/// The name of the node a symbol stands for: `while` for `while:1`.
inline std::string node_name(const symbol& s) { return s.name.substr(0, s.name.find(':')); }

/// True when `a` and `b` stand for the same value of the same trace.
inline bool same_value(const symbol& a, const symbol& b) { return a.trace_id == b.trace_id && a.node == b.node; }

}  // namespace kiln::detail
// ----- end kiln/core/symbol.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_SYMBOL_HPP

namespace kiln {

class variable;

namespace config {
namespace detail {
inline std::atomic<std::ostream*>& print_stream_slot() {
  static std::atomic<std::ostream*> stream{&std::cerr};
  return stream;
}
}  // namespace detail
/// Where kiln::print writes: standard error unless set, as tf.print. The stream must
/// outlive its use.
/// \code std::ostringstream captured; kiln::config::set_print_stream(captured); \endcode
inline void set_print_stream(std::ostream& os) { detail::print_stream_slot() = &os; }
/// The stream kiln::print writes to.
inline std::ostream& print_stream() { return *detail::print_stream_slot().load(); }
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
KILN_COLD inline int fraction_digits(std::string_view text) {
  std::size_t point = text.find('.');
  if (point == std::string_view::npos) return 0;
  std::size_t end = std::min(text.find('e'), text.size());
  return static_cast<int>(end - point - 1);
}

// The printer holds floating-point elements as doubles, which hold float32 values
// exactly, and a flag `single` for float32, whose digits and comparisons NumPy takes
// in float32: one copy of the number code serves both types.

/// `x` with the fewest fraction digits that read back as the same value of its type
/// (float32 when `single`), but at least `min_fraction` and at most `max_fraction` of
/// them, rounded from the exact binary value: the digits NumPy's Dragon4 prints in
/// its "unique" mode.
/// \code kiln::detail::shortest_digits(2.2f, true, kiln::detail::notation::positional, 0, 8) == "2.2" \endcode
KILN_COLD inline std::string shortest_digits(double x, bool single, notation n, int min_fraction = 0,
                                             int max_fraction = std::numeric_limits<int>::max()) {
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

/// `text` (as shortest_digits writes it) with its fraction trimmed as `mode` says.
/// \code kiln::detail::trimmed("2", kiln::detail::trim_mode::one_zero) == "2.0" \endcode
KILN_COLD inline std::string trimmed(std::string_view text, trim_mode mode) {
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

/// Python's `repr` of a bytes object, which NumPy prints for each element of a
/// TensorFlow string tensor: `b'aa'`, `b"it's"`, `b'\xff\n'`.
KILN_COLD inline std::string python_bytes_repr(std::string_view bytes) {
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

/// A string escaped as TensorFlow's C++ runtime escapes it for tf.print (C escapes,
/// octal for other control characters, bytes of UTF-8 sequences kept as they are).
/// \code kiln::detail::c_escaped("a\"b\n") == "a\\\"b\\n" \endcode
KILN_COLD inline std::string c_escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\'': out += "\\'"; break;
      case '\\': out += "\\\\"; break;
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

/// A floating-point element as NumPy's `str()` writes a scalar, which TensorFlow
/// prints for a rank-0 tensor: as Python writes floats (`2.2`, `20.0`, `1e+16`,
/// `1.5e-05`, `nan`, `-inf`) at the element type's own precision.
/// \code kiln::detail::numpy_real_text(2.2f, true) == "2.2" \endcode
KILN_COLD inline std::string numpy_real_text(double x, bool single) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // NumPy compares in long double, so float32 1e-4 (just below 1e-4) is scientific.
  long double magnitude = std::fabs(static_cast<long double>(x));
  if (x == 0 || (magnitude < 1e16L && magnitude >= 1e-4L))
    return trimmed(shortest_digits(x, single, notation::positional), trim_mode::one_zero);
  return trimmed(shortest_digits(x, single, notation::scientific), trim_mode::no_point);
}

/// A floating-point element as tf.print writes it (TensorFlow's C++ text): 6
/// significant digits (15 for float64) when those read back exactly, else 9 (17):
/// `0.405638`, `0.666458249`.
/// \code kiln::detail::tf_print_real_text(0.5, false) == "0.5" \endcode
KILN_COLD inline std::string tf_print_real_text(double x, bool single) {
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

// ---- the elements of an array ------------------------------------------------------

/// `text` right-aligned in `width` columns.
KILN_COLD inline std::string padded_left(std::string text, std::size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

/// The texts NumPy's FloatingFormat gives the elements `values` of one array (float32
/// values when `single`) in its default mode (at most 8 fraction digits, only as many
/// as needed): one notation for all (scientific when the largest magnitude is >= 1e8,
/// the smallest non-zero < 1e-4, or their ratio > 1000), all padded to one width, the
/// points aligned.
/// \code kiln::detail::numpy_float_texts({1.5, 2.}, true) == std::vector<std::string>{"1.5", "2. "} \endcode
KILN_COLD inline std::vector<std::string> numpy_float_texts(const std::vector<double>& values, bool single) {
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
  if (any_finite) fraction_width = scientific ? std::size_t(shared_fraction) + 2 + exponent_digits : std::size_t(shared_fraction);
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
      if (text.size() - digits_at < exponent_digits) text.insert(digits_at, exponent_digits - (text.size() - digits_at), '0');
    } else {
      text.append(fraction_width - (text.size() - text.find('.') - 1), ' ');
    }
    text = padded_left(std::move(text), width);
  }
  return texts;
}

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

  std::size_t size() const { return reals.size() + integers.size() + strings.size(); }
  /// Element `i` as NumPy's `str()` writes a scalar (`numpy`: `2`, `True`, `b'aa'`,
  /// `2.2`), else as tf.print writes it (`2`, `1`, `"aa"`, `2.2`).
  KILN_COLD std::string text(std::size_t i, bool numpy) const {
    if (is_floating(type))
      return numpy ? numpy_real_text(reals[i], type == float32) : tf_print_real_text(reals[i], type == float32);
    if (type == string) return string_text(strings[i], numpy);
    if (type == bool_) return integers[i] ? (numpy ? "True" : "1") : (numpy ? "False" : "0");
    return std::to_string(integers[i]);
  }
};

/// String element `x` as NumPy's `str()` writes it (`b'aa'`), else as tf.print
/// does (`"aa"`).
KILN_COLD inline std::string string_element_text(std::string_view x, bool numpy) {
  return numpy ? python_bytes_repr(x) : "\"" + c_escaped(x) + "\"";
}

/// The texts NumPy gives the elements of one array: integers right-aligned to a
/// shared width, bools as ` True`/`False`, floats by numpy_float_texts, strings as
/// Python bytes, unpadded.
KILN_COLD inline std::vector<std::string> numpy_element_texts(const element_values& v) {
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
KILN_COLD inline value_layout layout_of(const shape& s, value_style style) {
  value_layout layout;
  const bool numpy = style == value_style::numpy;
  layout.summarize = numpy ? s.num_elements() > 1000 : true;
  layout.line_width = numpy ? 75 : 0;
  layout.single_line = style == value_style::tf_print_line;
  return layout;
}

/// Whether `layout` shows only the ends of an axis of `length` items.
inline bool summarized(std::int64_t length, const value_layout& layout) {
  return layout.summarize && length > 2 * layout.edge_items;
}

/// The row-major flat indices of the elements `layout` shows of a tensor of shape `s`,
/// in the order they are written.
KILN_COLD inline std::vector<std::int64_t> shown_indices(const shape& s, const value_layout& layout) {
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

/// Writes the texts of the shown elements (in shown_indices order) as nested rows:
/// NumPy's `_formatArray`, which is also the layout of TensorFlow's C++ printer once
/// line wrapping is off.
class array_writer {
 public:
  array_writer(const shape& s, const std::vector<std::string>& items, const value_layout& layout)
      : shape_(s), items_(items), layout_(layout) {}

  KILN_COLD std::string write() {
    // A row's first line starts with the brackets it opens and its other lines with
    // an indent as wide: one column per bracket.
    block(0, layout_.single_line ? 0 : 1, static_cast<std::int64_t>(layout_.line_width));
    return std::move(out_);
  }

 private:
  KILN_COLD void block(int axis, std::size_t indent, std::int64_t width) {
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

  // Appends `word`, first breaking the line when wrapping is on and the word would
  // pass `width` (a line holding only its indent never breaks).
  KILN_COLD void add_word(std::string_view word, std::int64_t width, std::size_t indent) {
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

  const shape& shape_;
  const std::vector<std::string>& items_;
  value_layout layout_;
  std::size_t next_ = 0;
  std::string out_;
};

// ---- whole tensors -----------------------------------------------------------------

/// The shown elements `v` of an array of shape `s` in `style` (format_values_of).
KILN_COLD inline std::string format_elements(const element_values& v, const shape& s, value_style style) {
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
KILN_COLD inline std::string format_values(const tensor& x, bool single_line) {
  return format_values(x, single_line ? value_style::tf_print_line : value_style::tf_print);
}

/// One piece of a print: a text, or the input whose values are printed there.
struct print_piece {
  std::string text;
  int input = -1;
};

/// The line kiln::print writes for `pieces` and eager `inputs`, as tf.print writes
/// it: pieces separated by spaces, scalar strings raw, other tensors as their values.
inline std::string print_line(std::span<const print_piece> pieces, std::span<const tensor* const> inputs) {
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

/// Writes `line` whole to config::print_stream(), so that lines from several threads
/// do not interleave.
inline void write_print_line(const std::string& line) {
  static std::mutex m;
  std::lock_guard lock(m);
  config::print_stream() << line << std::flush;
}

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
KILN_COLD inline std::ostream& write_eager(std::ostream& os, std::string values, const shape& s, dtype t) {
  if (values.find('\n') != std::string::npos) values.insert(0, "\n");
  return os << "tensor(" << values << ", shape=" << s << ", dtype=" << t << ")";
}
}  // namespace detail

/// Writes `x` as Python's `print` writes an eager `tf.Tensor`, with `tensor(` for
/// `tf.Tensor(`: `tensor([4 1], shape=(2,), dtype=int32)`, `tensor(2.2, shape=(),
/// dtype=float32)`, `tensor(b'aa', shape=(), dtype=string)`; values laid out over
/// several lines start on a line of their own. A symbolic tensor prints as
/// TensorFlow prints one while tracing, with its graph value's name:
/// `Tensor("x:0", shape=(None,), dtype=int32)`. GPU tensors print their values.
/// \code std::cout << kiln::constant({{1, 2}, {3, 4}});  // tensor(\n[[1 2]\n [3 4]], shape=(2, 2), dtype=int32) \endcode
inline std::ostream& operator<<(std::ostream& os, const tensor& x) {
  if (!x.defined()) return os << "tensor(<undefined>)";
  if (x.is_symbolic())
    return os << "Tensor(\"" << x.symbol()->name << "\", shape=" << x.shape() << ", dtype=" << x.dtype() << ")";
  return detail::write_eager(os, detail::format_values(x, detail::value_style::numpy), x.shape(), x.dtype());
}

}  // namespace kiln
// ----- end kiln/core/print.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_CORE_PRINT_HPP

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
// ----- begin kiln/ops/op.hpp -----
/// \file
/// What every op definition provides, and the rules shared between op families.
///
/// An op is a type in kiln::ops holding its attributes, with
/// - `static constexpr std::string_view name`: the op's name in graphs and errors;
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
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < size_; ++i) s += (i ? ", " : "") + std::to_string(items_[i]);
    return s + "]";
  }

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
// ----- end kiln/ops/op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
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
/// dtypes whose kernels an elementwise op compiles here (kiln/exec/kernel_table.hpp).
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
/// input is symbolic), or run.
inline rule_errors rule_errors_for(std::span<const tensor* const> in) {
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
/// so that a program compiles the kernels of the ops it calls (kiln/exec/kernel_table.hpp).
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

namespace kiln::ops {

using dtypes::all;
using dtypes::floating;
using dtypes::numeric;
inline constexpr dtype_set numeric_and_string = numeric | dtype_set{string};
inline constexpr dtype_set logical{bool_};

// ---- unary ------------------------------------------------------------------
struct negate : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "neg";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::neg(a); }
  template <class G> void gradient(G& g) const { g.give(0, -g.dy()); }
};
struct abs : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "abs";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::abs(a); }
  /// dy * sign(x), 0 at 0 as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct exp : elementwise_op<1, floating> {
  static constexpr std::string_view name = "exp";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::exp(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * g.y()); }
};
struct log : elementwise_op<1, floating> {
  static constexpr std::string_view name = "log";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::log(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() / g.x(0)); }
};
struct sqrt : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sqrt";
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
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::tanh(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (1.0 - g.y() * g.y())); }
};
struct sigmoid : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sigmoid";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return T(1) / (T(1) + math::exp(math::neg(a))); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (g.y() * (1.0 - g.y()))); }
};
struct relu : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::max(a, T(0)); }
  /// dy where the result is positive, as TensorFlow's ReluGrad.
  template <class G> void gradient(G& g) const;
};
struct logical_not : elementwise_op<1, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_not";
  KILN_HOST_DEVICE bool operator()(bool a) const { return !a; }
};
/// Converts to `to`; the kernels' element conversion (math::convert) does the work.
struct cast : elementwise_op<1, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "cast";
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
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::sub(a, b); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy()), g.give(1, -g.dy()); }
};
struct multiply : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "mul";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::mul(a, b); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * g.x(1)), g.give(1, g.x(0) * g.dy()); }
};
/// True division: integers divide as float64, as TensorFlow's `/`.
struct divide : elementwise_op<2, numeric, result_rule::true_division> {
  static constexpr std::string_view name = "truediv";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return double(a) / double(b);
    else
      return a / b;
  }
  template <class G> void gradient(G& g) const {
    g.give(0, g.dy() / g.x(1));
    g.give(1, g.dy() * (-g.x(0) / g.x(1) / g.x(1)));
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
  static constexpr bool integer_exponent = true;  // a negative integer exponent is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::pow(a, b); }
  /// As TensorFlow: the exponent's gradient is 0 where the base is not positive.
  template <class G> void gradient(G& g) const;
};
struct maximum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "maximum";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::max(a, b); }
  /// dy goes to the first operand where it is the larger or they tie (the one the
  /// result is), as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct minimum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "minimum";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::min(a, b); }
  template <class G> void gradient(G& g) const;
};
struct less : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a < b; }
};
struct less_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a <= b; }
};
struct greater : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a > b; }
};
struct greater_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a >= b; }
};
struct equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a == b; }
};
struct not_equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "not_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a != b; }
};
struct logical_and : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_and";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
struct logical_or : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_or";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};

// ---- ternary ----------------------------------------------------------------
/// `where(cond, a, b)`: a bool condition choosing between two values of one dtype.
struct where : elementwise_op<3, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "select";
  static constexpr bool leading_condition = true;
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (in[0] != bool_) return {in[1], "the condition must be a bool tensor"};
    if (in[1] != in[2]) return {in[1], "both branches must have the same dtype"};
    return {in[1]};
  }
  template <class T> KILN_HOST_DEVICE T operator()(bool c, const T& a, const T& b) const { return c ? a : b; }
  template <class G> void gradient(G& g) const {
    const auto zero = g.dy().scalar(0);
    g.give(1, G::run(where{}, g.x(0), g.dy(), zero)), g.give(2, G::run(where{}, g.x(0), zero, g.dy()));
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
  const auto zero = g.y().scalar(0);
  g.give(0, G::run(where{}, G::run(greater{}, g.y(), zero), g.dy(), zero));
}

template <class G>
void floormod::gradient(G& g) const {
  g.give(0, g.dy());
  g.give(1, -g.dy() * G::run(floordiv{}, g.x(0), g.x(1)));
}

template <class G>
void pow::gradient(G& g) const {
  const auto x = g.x(0), y = g.x(1), zero = x.scalar(0);
  g.give(0, g.dy() * y * G::run(pow{}, x, y - 1.0));
  const auto positive = G::run(greater{}, x, zero);
  g.give(1, G::run(where{}, positive, g.dy() * g.y() * G::run(log{}, G::run(where{}, positive, x, x.scalar(1))), zero));
}

template <class G>
void maximum::gradient(G& g) const {
  const auto first = G::run(greater_equal{}, g.x(0), g.x(1)), zero = g.dy().scalar(0);
  g.give(0, G::run(where{}, first, g.dy(), zero)), g.give(1, G::run(where{}, first, zero, g.dy()));
}

template <class G>
void minimum::gradient(G& g) const {
  const auto first = G::run(greater_equal{}, g.x(1), g.x(0)), zero = g.dy().scalar(0);
  g.give(0, G::run(where{}, first, g.dy(), zero)), g.give(1, G::run(where{}, first, zero, g.dy()));
}

/// Rejects integer division by zero and integers to negative powers before a kernel
/// runs, as TensorFlow does (and as C++ must: both are undefined behaviour).
template <elementwise Op>
  requires(requires { Op::integer_divisor; } || requires { Op::integer_exponent; })
void check_values(const Op&, std::span<const tensor* const> in) {
  constexpr bool divisor = requires { Op::integer_divisor; };
  const tensor& y = *in[1];
  if (!is_integer(y.dtype()) || y.size() == 0) return;
  bool bad = visit_dtype(y.dtype(), [&]<class T>() {
    if constexpr (math::is_signed_integer<T>) {
      std::vector<T> copied;
      const T* p = y.device() == device::cpu ? y.data<T>() : (copied = y.to_vector<T>()).data();
      for (std::int64_t i = 0, n = y.size(); i < n; ++i)
        if (divisor ? p[i] == T(0) : p[i] < T(0)) return true;
    }
    return false;
  });
  if (bad)
    throw invalid_argument_error(std::string(Op::name) + (divisor ? ": integer division by zero"
                                                                  : ": integers to negative integer powers are not allowed"));
}

}  // namespace kiln::ops

namespace kiln {

// Each function builds its op and hands it to detail::apply. The operators take a
// C++ scalar on either side and convert it to the tensor operand's dtype. Every op
// function is a template, even where nothing is deduced, so that its body, and with
// it the op's kernels, is compiled only in programs that call it.
#define KILN_UNARY_FUNCTION(fn, op)                                                  \
  template <class = void>                                                            \
  tensor fn(const tensor& x) { return detail::apply(ops::op{}, x); }
#define KILN_BINARY_FUNCTION(fn, op)                                                 \
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

/// `kiln::negative(x)`, also `-x`: elementwise negation.
KILN_UNARY_FUNCTION(negative, negate)
/// `kiln::abs(kiln::constant({-1, 2}))` is `[1 2]`.
KILN_UNARY_FUNCTION(abs, abs)
/// `kiln::exp(x)`: e to the x, for float tensors.
KILN_UNARY_FUNCTION(exp, exp)
/// `kiln::log(x)`: natural logarithm, for float tensors.
KILN_UNARY_FUNCTION(log, log)
/// `kiln::sqrt(x)`: square root, for float tensors.
KILN_UNARY_FUNCTION(sqrt, sqrt)
/// `kiln::square(x)` is `x * x`.
KILN_UNARY_FUNCTION(square, square)
/// `kiln::tanh(x)`: hyperbolic tangent, for float tensors.
KILN_UNARY_FUNCTION(tanh, tanh)
/// `kiln::sigmoid(x)` is `1 / (1 + exp(-x))`.
KILN_UNARY_FUNCTION(sigmoid, sigmoid)
/// `kiln::relu(x)` is `maximum(x, 0)`.
KILN_UNARY_FUNCTION(relu, relu)
/// `kiln::logical_not(b)` on a bool tensor.
KILN_UNARY_FUNCTION(logical_not, logical_not)

/// `kiln::add(x, y)`, also `x + y`; concatenates string tensors.
KILN_BINARY_FUNCTION(add, add)
/// `kiln::subtract(x, y)`, also `x - y`.
KILN_BINARY_FUNCTION(subtract, subtract)
/// `kiln::multiply(x, y)`, also `x * y`.
KILN_BINARY_FUNCTION(multiply, multiply)
/// `kiln::divide(x, y)`, also `x / y`: true division (integers give float64).
KILN_BINARY_FUNCTION(divide, divide)
/// `kiln::floordiv(7, kiln::constant(-2))` is `-4`: division rounding down.
KILN_BINARY_FUNCTION(floordiv, floordiv)
/// `kiln::floormod(x, y)`, also `x % y`: the remainder takes the divisor's sign.
KILN_BINARY_FUNCTION(floormod, floormod)
/// `kiln::pow(x, 2)`: x to the power y.
KILN_BINARY_FUNCTION(pow, pow)
/// `kiln::maximum(x, 0)`: elementwise larger value.
KILN_BINARY_FUNCTION(maximum, maximum)
/// `kiln::minimum(x, y)`: elementwise smaller value.
KILN_BINARY_FUNCTION(minimum, minimum)
/// `kiln::equal(x, y)`, also `x == y`: a bool tensor.
KILN_BINARY_FUNCTION(equal, equal)
/// `kiln::not_equal(x, y)`, also `x != y`.
KILN_BINARY_FUNCTION(not_equal, not_equal)
/// `kiln::less(x, y)`, also `x < y`.
KILN_BINARY_FUNCTION(less, less)
/// `kiln::less_equal(x, y)`, also `x <= y`.
KILN_BINARY_FUNCTION(less_equal, less_equal)
/// `kiln::greater(x, y)`, also `x > y`.
KILN_BINARY_FUNCTION(greater, greater)
/// `kiln::greater_equal(x, y)`, also `x >= y`.
KILN_BINARY_FUNCTION(greater_equal, greater_equal)
/// `kiln::logical_and(a, b)` on bool tensors.
KILN_BINARY_FUNCTION(logical_and, logical_and)
/// `kiln::logical_or(a, b)` on bool tensors.
KILN_BINARY_FUNCTION(logical_or, logical_or)

#undef KILN_UNARY_FUNCTION
#undef KILN_BINARY_FUNCTION

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

#define KILN_BINARY_OPERATOR(sym, fn)                                                \
  template <class = void>                                                            \
  tensor operator sym(const tensor& x, const tensor& y) { return fn(x, y); }        \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const tensor& x, const S& y) { return fn(x, y); }              \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const S& x, const tensor& y) { return fn(x, y); }
KILN_BINARY_OPERATOR(+, add)
KILN_BINARY_OPERATOR(-, subtract)
KILN_BINARY_OPERATOR(*, multiply)
KILN_BINARY_OPERATOR(/, divide)
KILN_BINARY_OPERATOR(%, floormod)
KILN_BINARY_OPERATOR(==, equal)
KILN_BINARY_OPERATOR(!=, not_equal)
KILN_BINARY_OPERATOR(<, less)
KILN_BINARY_OPERATOR(<=, less_equal)
KILN_BINARY_OPERATOR(>, greater)
KILN_BINARY_OPERATOR(>=, greater_equal)
#undef KILN_BINARY_OPERATOR

}  // namespace kiln
// ----- end kiln/ops/elementwise.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_ELEMENTWISE_HPP
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
  std::string str() const { return all_ ? "None" : list_.str(); }

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
  static constexpr reduction_kind kind = reduction_kind::max;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Smallest element; NaN wins over any number.
struct reduce_min : reduction_op {
  static constexpr std::string_view name = "reduce_min";
  static constexpr reduction_kind kind = reduction_kind::min;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Index (int64) of the first largest element, counting the reduced positions in
/// row-major order; the first NaN counts as the largest, as reduce_max returns it.
struct argmax : reduction_op {
  static constexpr std::string_view name = "argmax";
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
  void check_input(const shape& in) const {
    if (reduced_count(in, axis) == 0)
      throw invalid_argument_error(std::string(name) + ": the reduced axes " + axis.str() + " of shape " + in.str() +
                                   " are empty, so there is no largest element");
  }
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
[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_invalid_axes(std::string_view op, const reduction_axes& axes,
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
// ----- end kiln/ops/reduction.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_REDUCTION_HPP
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
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_FACTORIES_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_FACTORIES_HPP
// ----- begin kiln/ops/factories.hpp -----
/// \file
/// Tensors made from C++ values, and the factories of API.md section 1: constant,
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
inline void require_fully_defined(std::string_view fn, const shape& s) {
  if (!s.is_fully_defined()) throw value_error(std::string(fn) + ": the shape must be fully defined, got " + s.str());
}

/// `t`, copied to device `d` unless it is there.
inline tensor placed(tensor t, device d) { return d == device::cpu ? t : t.to(d); }

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

/// A tensor of zeros (`false`, `""`); `fn` names the factory in errors.
inline tensor zero_filled(std::string_view fn, const shape& s, dtype t, device d) {
  return visit_dtype(t, [&]<class T>() {
    return filled(fn, s, T{}, d);  // strings: ""
  });
}

/// A tensor of ones (`true`); strings have no one and raise kiln::type_error naming `fn`.
inline tensor one_filled(std::string_view fn, const shape& s, dtype t, device d) {
  return visit_dtype(t, [&]<class T>() -> tensor {
    if constexpr (std::is_same_v<T, std::string>)
      throw type_error(std::string(fn) + ": string tensors have no one; use kiln::fill(shape, \"text\")");
    else
      return filled(fn, s, T(1), d);
  });
}

/// The shape of `x` for a `*_like` factory: `x` must be defined, and if symbolic,
/// have a fully defined shape (the result is then an eager constant of that shape).
inline const shape& like_shape(std::string_view fn, const tensor& x) {
  if (!x.defined()) throw invalid_argument_error(std::string(fn) + ": the tensor is empty (default-constructed)");
  require_fully_defined(fn, x.shape());
  return x.shape();
}

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
/// \copydoc constant(std::initializer_list<T>, std::optional<dtype>, device)
template <class T>
tensor constant(std::initializer_list<std::initializer_list<T>> values, std::optional<dtype> t = std::nullopt,
                device d = device::cpu) {
  return detail::constant_of_list(values, t, d);
}
/// \copydoc constant(std::initializer_list<T>, std::optional<dtype>, device)
template <class T>
tensor constant(std::initializer_list<std::initializer_list<std::initializer_list<T>>> values,
                std::optional<dtype> t = std::nullopt, device d = device::cpu) {
  return detail::constant_of_list(values, t, d);
}
/// \copydoc constant(std::initializer_list<T>, std::optional<dtype>, device)
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
inline tensor zeros(const shape& s, dtype t = float32, device d = device::cpu) {
  return detail::zero_filled("zeros", s, t, d);
}

/// A tensor of ones (`true` for bool_); strings raise kiln::type_error.
/// \code kiln::ones({2, 2});  // tensor([[1. 1.] [1. 1.]], ...) \endcode
inline tensor ones(const shape& s, dtype t = float32, device d = device::cpu) {
  return detail::one_filled("ones", s, t, d);
}

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
inline tensor eye(std::int64_t rows, std::int64_t columns, dtype t = float32, device d = device::cpu) {
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

/// The `n` x `n` identity matrix.
/// \code kiln::eye(10, kiln::int32); \endcode
inline tensor eye(std::int64_t n, dtype t = float32, device d = device::cpu) { return eye(n, n, t, d); }

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
inline tensor zeros_like(const tensor& x) {
  return detail::zero_filled("zeros_like", detail::like_shape("zeros_like", x), x.dtype(), x.device());
}

/// Ones of the dtype, shape and device of `x`; as zeros_like.
/// \code kiln::ones_like(kiln::constant({1.5, 2.5}));  // [1. 1.], float64 \endcode
inline tensor ones_like(const tensor& x) {
  return detail::one_filled("ones_like", detail::like_shape("ones_like", x), x.dtype(), x.device());
}

}  // namespace kiln
// ----- end kiln/ops/factories.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_FACTORIES_HPP

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
inline std::string dims_text(const shape& s) { return int_list(s.dims()).str(); }

}  // namespace detail

namespace ops {

/// `reshape(x, new_shape)`: the same elements in another shape; one dim may be
/// kiln::none (-1), inferred from the element count.
struct reshape {
  static constexpr std::string_view name = "reshape";
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
  tensor evaluate(std::span<const tensor* const> in) const {
    const kiln::shape& s = in[0]->shape();
    return in[0]->share(result_shape(std::span<const kiln::shape>(&s, 1)).value);
  }
  std::string attributes() const { return "shape=" + detail::dims_text(new_shape); }
  template <class G> void gradient(G& g) const { g.give(0, G::reshape(g.dy(), g.x(0).t.shape())); }
  constexpr bool operator==(const reshape&) const = default;
};

/// `transpose(x, perm)`: dim i of the result is dim `perm[i]` of `x`; an empty
/// `perm` reverses the dims.
struct transpose {
  static constexpr std::string_view name = "transpose";
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
  std::string attributes() const { return "perm=" + perm.str(); }
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
  std::string attributes() const { return "axis=" + std::to_string(axis); }
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
  std::string attributes() const { return "axis=" + std::to_string(axis); }
  constexpr bool operator==(const stack&) const = default;
  /// Input i's gradient is dy at i along the new dim.
  template <class G> void gradient(G& g) const;
};

/// `gather(x, indices, axis)`: the slices of `x` along `axis` that `indices` (int32
/// or int64, any shape) name; the result's shape is
/// `x.shape[:axis] + indices.shape + x.shape[axis + 1:]`.
struct gather {
  static constexpr std::string_view name = "gather";
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
  std::string attributes() const { return "axis=" + std::to_string(axis); }
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
  std::string attributes() const {
    return "num_segments=" + std::to_string(num_segments) + (axis == 0 ? "" : ", axis=" + std::to_string(axis));
  }
  constexpr bool operator==(const unsorted_segment_sum&) const = default;
  /// dy gathered at the ids.
  template <class G> void gradient(G& g) const;
};

/// `x[i]`: the i-th slice along the first dim (negative i counts from the end).
/// Named as TensorFlow names the node that indexing creates.
struct index {
  static constexpr std::string_view name = "strided_slice";
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
  tensor evaluate(std::span<const tensor* const> in) const {
    const kiln::shape& s = in[0]->shape();
    kiln::shape rest(s.dims().subspan(1));
    return in[0]->share(rest, (i < 0 ? i + s[0] : i) * rest.num_elements());
  }
  std::string attributes() const { return "index=" + std::to_string(i); }
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
  std::string attributes() const { return ""; }
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
  std::string attributes() const { return ""; }
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
  std::string attributes() const { return "offset=" + offset.str() + ", align=" + align.str(); }
  constexpr bool operator==(const crop_or_pad&) const = default;
  /// crop_or_pad of dy to x's shape with the offsets negated.
  template <class G> void gradient(G& g) const;
};

/// `slice(x, begin, size)`: the block of `size[d]` elements from `begin[d]` along
/// every dim d; a size of -1 takes everything to the end.
struct slice {
  static constexpr std::string_view name = "slice";
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
  std::string attributes() const { return "begin=" + begin.str() + ", size=" + size.str(); }
  constexpr bool operator==(const slice&) const = default;
  /// dy in place of the slice, zeros around it.
  template <class G> void gradient(G& g) const;
};

// ---- gradients of the ops above, which run each other -------------------------

/// `rank` zeros: where a slice from the first element begins.
inline int_list origin(int rank) {
  int_list o;
  for (int d = 0; d < rank; ++d) o.push_back(0);
  return o;
}

/// The slice of `x` of shape `size` at `begin` (the shape ops' formulas cut dy and
/// zeros with it).
template <class G, class V>
V slice_of(const V& x, const int_list& begin, const kiln::shape& size) {
  int_list sizes;
  for (std::int64_t d : size) sizes.push_back(int(d));
  return G::run(slice{begin, sizes}, x);
}

/// Each entry of `l` negated: the offsets that undo a window's.
inline int_list negated(const int_list& l) {
  int_list out;
  for (std::int64_t x : l) out.push_back(-x);
  return out;
}

/// Zeros per dim, `rank` of them, but `at` in dim `axis`.
inline int_list along(int rank, int axis, std::int64_t at) {
  int_list o;
  for (int d = 0; d < rank; ++d) o.push_back(d == axis ? at : 0);
  return o;
}

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
  static constexpr int arity = 1;

  constexpr dtype_result result_dtype(std::span<const dtype>) const { return {int32}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    return {kiln::shape{in[0].has_known_rank() ? std::int64_t(in[0].rank()) : none}};
  }
  /// Builds the dims on the host, then moves them to the input's device.
  tensor evaluate(std::span<const tensor* const> in) const {
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
inline std::string position_text(std::int64_t k, const shape& s) {
  std::string position;
  for (std::int64_t d = s.rank() - 1, rest = k; d >= 0; --d) {
    position = std::to_string(rest % s[int(d)]) + (position.empty() ? "" : ", ") + position;
    rest /= s[int(d)];
  }
  return position;
}

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
inline std::int64_t scalar_index(const tensor& index) {
  return index.dtype() == int64 ? index.to_vector<std::int64_t>()[0] : index.to_vector<std::int32_t>()[0];
}

/// `set_item` needs 0 <= i < dim for the first dim.
template <class = void>
void check_values(const set_item&, std::span<const tensor* const> in) {
  const std::int64_t rows = in[0]->shape()[0];
  const std::int64_t i = scalar_index(*in[1]);
  if (i < 0 || i >= rows)
    throw invalid_argument_error("set_item: index " + std::to_string(i) + " is not in [0, " + std::to_string(rows) +
                                 ") for the first dim of a tensor of shape " + in[0]->shape().str());
}

/// `pad_rows` needs a number of rows that is not negative.
template <class = void>
void check_values(const pad_rows&, std::span<const tensor* const> in) {
  if (const std::int64_t rows = scalar_index(*in[1]); rows < 0)
    throw invalid_argument_error("pad_rows: the number of rows must not be negative, got " + std::to_string(rows) +
                                 " for a tensor of shape " + in[0]->shape().str());
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
// ----- end kiln/ops/shape_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_SHAPE_OPS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
// ----- begin kiln/ops/linalg.hpp -----
/// \file
/// Linear algebra and NN ops: `matmul` (2-D and batched, batch dims broadcast) and
/// `conv2d` (NHWC input, HWIO filters, strides, VALID or SAME padding).

#include <array>
#include <string_view>
#include <utility>


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
    g.give(0, G::matmul(g.dy(), G::transpose(g.x(1), swap_last_two(g.x(1).t.rank()))));
    g.give(1, G::matmul(G::transpose(g.x(0), swap_last_two(g.x(0).t.rank())), g.dy()));
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
  const auto turned = G::transpose(
      G::run(gather{0}, G::run(gather{1}, g.x(1), G::reversed_indices(f[1], g.x(1))), G::reversed_indices(f[0], g.x(1))),
      {0, 1, 3, 2});
  const auto framed_dy =
      fit_dim<G>(fit_dim<G>(spread, 1, f[0] - 1 - top, x[1] + f[0] - 1), 2, f[1] - 1 - left, x[2] + f[1] - 1);
  g.give(0, G::run(conv2d{}, framed_dy, turned));
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
inline ops::padding parse_padding(std::string_view p) {
  if (p == "VALID") return ops::padding::valid;
  if (p == "SAME") return ops::padding::same;
  throw value_error("conv2d: padding must be \"VALID\" or \"SAME\", got \"" + std::string(p) + "\"");
}

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
// ----- end kiln/ops/linalg.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_NN_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_NN_HPP
// ----- begin kiln/ops/nn.hpp -----
/// \file
/// What classifiers need: `softmax`, `log_softmax`, `reduce_logsumexp` and the
/// softmax cross-entropy with integer labels, as TensorFlow's `tf.nn` functions. Each
/// is written with the registry's ops (max-shifted for stability, as TensorFlow's
/// kernels are), so it runs on every backend, eagerly and in graphs, fuses with its
/// neighbours and has the gradient those ops give; no kernel of its own.

#include <cstdint>
#include <limits>
#include <string>


namespace kiln {

inline tensor stop_gradient(const tensor& x);  // kiln/autodiff/tape.hpp

namespace detail {

/// Raises kiln::type_error unless `x` holds floating-point values (`fn` names the function).
inline void require_floating(std::string_view fn, const tensor& x) {
  if (!x.defined()) throw invalid_argument_error(std::string(fn) + ": the tensor is empty (default-constructed)");
  if (!is_floating(x.dtype()))
    throw type_error(std::string(fn) + ": takes float32 or float64 values, got " + std::string(name(x.dtype())));
}

/// The largest element along `axis` (kept as size 1), 0 where it is not finite (an
/// axis of -inf only), and cut off from gradient tapes: what stable softmaxes
/// subtract, as TensorFlow's reduce_logsumexp does.
template <class = void>
tensor shift_of(const tensor& x, reduction_axes axis) {
  const tensor m = stop_gradient(reduce_max(x, axis, true));
  return where(abs(m) < std::numeric_limits<double>::infinity(), m, 0.0);
}

}  // namespace detail

/// log(sum(exp(x))) over `axis` (every axis by default), computed without overflow.
/// \code kiln::reduce_logsumexp(kiln::constant({0.f, 0.f}));  // log 2 = 0.6931472 \endcode
template <class = void>
tensor reduce_logsumexp(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  detail::require_floating("reduce_logsumexp", x);
  const tensor m = detail::shift_of(x, axis);
  const tensor kept = log(reduce_sum(exp(x - m), axis, true)) + m;
  return keepdims ? kept : reduce_sum(kept, axis, false);  // drops the size-1 dims
}

/// exp(x) / sum(exp(x)) along `axis` (the last by default), as tf.nn.softmax.
/// \code kiln::softmax(kiln::constant({1.0, 1.0}));  // [0.5 0.5] \endcode
template <class = void>
tensor softmax(const tensor& logits, std::int64_t axis = -1) {
  detail::require_floating("softmax", logits);
  const tensor e = exp(logits - detail::shift_of(logits, reduction_axes{axis}));
  return e / reduce_sum(e, reduction_axes{axis}, true);
}

/// log(softmax(logits)) along `axis` (the last by default), computed without
/// overflow or log(0), as tf.nn.log_softmax.
/// \code kiln::log_softmax(kiln::constant({0.f, 0.f}));  // [-0.6931472 -0.6931472] \endcode
template <class = void>
tensor log_softmax(const tensor& logits, std::int64_t axis = -1) {
  detail::require_floating("log_softmax", logits);
  const tensor shifted = logits - detail::shift_of(logits, reduction_axes{axis});
  return shifted - log(reduce_sum(exp(shifted), reduction_axes{axis}, true));
}

/// The cross-entropy of softmax(logits) against class indices, one loss per label, as
/// tf.nn.sparse_softmax_cross_entropy_with_logits: `logits` is (..., classes) of
/// float32 or float64, `labels` int32 or int64 of the leading dims. A label outside
/// [0, classes) raises kiln::invalid_argument_error when it is used, eagerly or in a graph.
/// \code
/// auto loss = kiln::sparse_softmax_cross_entropy(kiln::constant({1}), kiln::constant({{0.f, 0.f}}));  // [0.6931472]
/// \endcode
template <class = void>
tensor sparse_softmax_cross_entropy(const tensor& labels, const tensor& logits) {
  detail::require_floating("sparse_softmax_cross_entropy", logits);
  if (!labels.defined() || !is_integer(labels.dtype()))
    throw type_error("sparse_softmax_cross_entropy: labels are int32 or int64 class indices, got " +
                     std::string(labels.defined() ? name(labels.dtype()) : "an empty tensor"));
  const shape& s = logits.shape();
  if (!s.has_known_rank() || s.rank() < 1 || s[s.rank() - 1] == none)
    throw value_error("sparse_softmax_cross_entropy: logits need a known last dim (the classes), got " + s.str());
  const std::int64_t classes = s[s.rank() - 1];
  const tensor class_ids = cast(range(classes), labels.dtype());
  // Gathering the labels from the class ids checks each against the classes (the
  // gather's own index check, eager or in a graph) and gives the labels themselves.
  const tensor checked = gather(class_ids, labels);
  shape column = labels.shape();
  column.push_back(1);
  const tensor one_hot = cast(equal(reshape(checked, column), class_ids), logits.dtype());
  return -reduce_sum(one_hot * log_softmax(logits), -1);
}

}  // namespace kiln
// ----- end kiln/ops/nn.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_NN_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_REGISTRY_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_REGISTRY_HPP
// ----- begin kiln/ops/registry.hpp -----
/// \file
/// The op registry: every op type, one row each, in one Boost.Mp11 list per family.
/// Graphs store an op as an `ops::any_op` over these lists, and the cross-backend suite
/// walks them; calling an op without its row stops at `ops::registered`'s `static_assert`.

#include <boost/mp11/list.hpp>

#include <string_view>
#include <type_traits>


namespace kiln::ops {

// The op lists are X-macros, `F(op)` once per op type of kiln::ops, so that code
// which must name every op (kiln/kernels.hpp declares and instantiates each op's
// kernels) expands them instead of repeating them.

/// The elementwise ops with one input (`cast` included).
#define KILN_UNARY_OPS(F) \
  F(negate) F(abs) F(exp) F(log) F(sqrt) F(square) F(tanh) F(sigmoid) F(relu) F(logical_not) F(cast)
/// The elementwise ops with two or three inputs.
#define KILN_BINARY_OPS(F)                                                                                       \
  F(add) F(subtract) F(multiply) F(divide) F(floordiv) F(floormod) F(pow) F(maximum) F(minimum) F(less)        \
  F(less_equal) F(greater) F(greater_equal) F(equal) F(not_equal) F(logical_and) F(logical_or) F(where)
#define KILN_SHAPE_OPS(F)                                                                                        \
  F(reshape) F(transpose) F(concat) F(stack) F(gather) F(unsorted_segment_sum) F(index) F(slice) F(shape_of)     \
  F(set_item) F(pad_rows) F(crop_or_pad)
#define KILN_REDUCTION_OPS(F) F(reduce_sum) F(reduce_mean) F(reduce_max) F(reduce_min) F(argmax)
#define KILN_LINALG_OPS(F) F(matmul) F(conv2d)
/// Every op kiln defines.
#define KILN_ALL_OPS(F) KILN_UNARY_OPS(F) KILN_BINARY_OPS(F) KILN_SHAPE_OPS(F) KILN_REDUCTION_OPS(F) KILN_LINALG_OPS(F)

/// The C++ name of op type `Op`, as generated source spells it (kiln/exec/jit.hpp).
/// \code static_assert(kiln::ops::qualified_name<kiln::ops::tanh> == "kiln::ops::tanh"); \endcode
template <class Op>
inline constexpr std::string_view qualified_name{};
#define KILN_DETAIL_QUALIFIED_NAME(op) \
  template <>                          \
  inline constexpr std::string_view qualified_name<op> = "kiln::ops::" #op;
KILN_ALL_OPS(KILN_DETAIL_QUALIFIED_NAME)
#undef KILN_DETAIL_QUALIFIED_NAME

#define KILN_DETAIL_LIST_ITEM(op) , op
// mp_list<void, a, b, ...> without the void: the X-macros put a comma before each op.
#define KILN_DETAIL_TYPE_LIST(LIST) boost::mp11::mp_pop_front<boost::mp11::mp_list<void LIST(KILN_DETAIL_LIST_ITEM)>>

using elementwise_ops = boost::mp11::mp_append<KILN_DETAIL_TYPE_LIST(KILN_UNARY_OPS), KILN_DETAIL_TYPE_LIST(KILN_BINARY_OPS)>;
using shape_ops = KILN_DETAIL_TYPE_LIST(KILN_SHAPE_OPS);
using reduction_ops = KILN_DETAIL_TYPE_LIST(KILN_REDUCTION_OPS);
using linalg_ops = KILN_DETAIL_TYPE_LIST(KILN_LINALG_OPS);
#undef KILN_DETAIL_TYPE_LIST
#undef KILN_DETAIL_LIST_ITEM

/// Every op kiln defines.
using all_ops = boost::mp11::mp_append<elementwise_ops, shape_ops, reduction_ops, linalg_ops>;

/// Whether op type `Op` has its row in the registry, which graphs need to hold it.
/// \code static_assert(kiln::ops::registered<kiln::ops::tanh>); \endcode
template <class Op, class List = all_ops>
inline constexpr bool registered = false;
template <class Op, class... Ops>
inline constexpr bool registered<Op, boost::mp11::mp_list<Ops...>> = (std::is_same_v<Op, Ops> || ...);

}  // namespace kiln::ops
// ----- end kiln/ops/registry.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_REGISTRY_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_TENSOR_ARRAY_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_TENSOR_ARRAY_HPP
// ----- begin kiln/ops/tensor_array.hpp -----
/// \file
/// `kiln::tensor_array`: a number of tensors of one dtype and shape, written one at
/// a time, usually in a loop, and stacked at the end (TensorFlow's TensorArray). Its
/// size is a number, or a tensor known only when a graph runs; with dynamic_size,
/// writes past the end grow it. It is a value: `write` returns the updated array and
/// leaves the one it was called on as it was, so that it can be a loop variable. It holds one
/// tensor of shape `(size,) + element shape`, created at the first write, whose
/// value gives the element shape; until then it holds an empty `(0,)` tensor. The
/// size is the first dim of that tensor once written, so a loop or a function
/// carries the array as that one tensor.

#include <concepts>
#include <cstdint>
#include <string>


namespace kiln {

/// How a kiln::tensor_array may change, given after its size.
/// \code kiln::tensor_array rows(kiln::float32, 0, {.dynamic_size = true}); \endcode
struct tensor_array_options {
  /// Whether a write past the end grows the array to hold it, the elements between
  /// reading as zeros (TensorFlow's dynamic_size); a read past the end stays an error.
  bool dynamic_size = false;
};

/// `size` tensors of dtype `type` and one shape, written by index.
/// \code
/// kiln::tensor_array squares(kiln::float32, 3);
/// for (int i = 0; i < 3; ++i) squares = squares.write(i, kiln::constant(float(i * i)));
/// squares.stack();  // [0 1 4]
/// \endcode
class tensor_array {
 public:
  /// An array of `size` elements of dtype `type`, none written yet.
  /// \code kiln::tensor_array states(kiln::float32, 10); \endcode
  tensor_array(kiln::dtype type, std::int64_t size, tensor_array_options options = {})
      : type_(type), size_(size), dynamic_size_(options.dynamic_size), elements_(kiln::zeros({0}, type)) {
    if (size < 0) throw invalid_argument_error("tensor_array: the size must not be negative, got " + std::to_string(size));
  }
  /// An array whose size is an int32 or int64 scalar tensor. An eager size is read
  /// at once; a symbolic one (inside a function) gives an array whose size is known
  /// only when the graph runs: size() then raises and size_tensor() tells it.
  /// \code kiln::tensor_array states(kiln::float32, kiln::shape_of(kiln::ones({4, 2}))[0]); \endcode
  // The members that call ops are templates, as op functions are, so that the ops'
  // kernels compile only where the members are used.
  template <class = void>
  tensor_array(kiln::dtype type, const tensor& size, tensor_array_options options = {})
      : tensor_array(type, std::int64_t(0), options) {
    if (!is_integer(size.dtype()))
      throw type_error("tensor_array: the size must be int32 or int64, got " + std::string(name(size.dtype())));
    if (size.rank() != 0) throw value_error("tensor_array: the size must be a scalar, got shape " + size.shape().str());
    if (size.is_symbolic()) {
      size_ = none;
      size_tensor_ = size.dtype() == int32 ? size : detail::apply_bookkeeping(ops::cast(int32), size);
    } else {
      *this = tensor_array(type, ops::scalar_index(size), options);
    }
  }

  /// The array with element `i` (an int32 or int64 scalar, or a C++ integer) set to
  /// `value`, which must have the array's dtype and the shape of earlier writes.
  /// `i` must be below the size, unless the array has dynamic_size.
  /// \code
  /// kiln::tensor_array states(kiln::float32, 2);
  /// states = states.write(1, kiln::ones({3}));
  /// \endcode
  template <class = void>
  tensor_array write(const tensor& i, const tensor& value) const {
    if (value.dtype() != type_)
      throw type_error("tensor_array.write: the array holds " + std::string(name(type_)) + " elements, got a " +
                       std::string(name(value.dtype())) + " value");
    if (!unwritten() && value.shape() != element_shape())
      throw value_error("tensor_array.write: the array holds elements of shape " + element_shape().str() +
                        ", got a value of shape " + value.shape().str());
    check_eager_index(i, true);
    tensor elements = (unwritten() ? holding_zeros(value.shape(), value.device()) : *this).elements_;
    if (dynamic_size_) elements = kiln::pad_rows(elements, i + 1);
    return with_elements(kiln::set_item(elements, i, value));
  }
  template <std::integral I>
  tensor_array write(I i, const tensor& value) const {
    return write(kiln::constant(std::int64_t(i)), value);
  }

  /// Element `i` (an int32 or int64 scalar, or a C++ integer); an element not yet
  /// written reads as zeros. An index past the end raises kiln::out_of_range_error
  /// eagerly, kiln::invalid_argument_error when a graph runs (as TensorFlow's eager
  /// TensorArray and its TensorList in graphs do); write() likewise.
  /// \code
  /// kiln::tensor_array states = kiln::tensor_array(kiln::float32, 2).write(1, kiln::ones({3}));
  /// kiln::tensor last = states.read(states.size() - 1);  // [1 1 1]
  /// \endcode
  template <class = void>
  tensor read(const tensor& i) const {
    check_eager_index(i, false);
    require_written("read");
    return kiln::gather(elements_, i);
  }
  template <std::integral I>
  tensor read(I i) const {
    return read(kiln::constant(std::int64_t(i)));
  }

  /// All elements in one tensor of shape `(size,) + element shape`.
  /// \code kiln::tensor all = kiln::tensor_array(kiln::float32, 2).write(0, kiln::ones({3})).stack();  // (2, 3) \endcode
  tensor stack() const {
    require_written("stack");
    return elements_;
  }

  /// The number of elements, when it is known without running a graph: it is not
  /// for a size given as a symbolic tensor, nor inside a function after a write to
  /// an array with dynamic_size; then kiln::value_error, and size_tensor() tells it.
  /// \code kiln::tensor_array(kiln::float32, 10).size() == 10; \endcode
  std::int64_t size() const {
    if (size_ == none)
      throw value_error("tensor_array.size: the number of elements is known only when the graph runs; use size_tensor()");
    return size_;
  }
  /// The number of elements as an int32 scalar tensor (TensorFlow's TensorArray.size()),
  /// symbolic inside a function when size() does not know it.
  /// \code kiln::tensor n = kiln::tensor_array(kiln::float32, 10).size_tensor();  // 10 \endcode
  template <class = void>
  tensor size_tensor() const {
    if (size_ != none) return kiln::constant(std::int32_t(size_));
    return unwritten() ? size_tensor_ : kiln::shape_of(elements_)[0];
  }
  /// Whether writes past the end grow the array (tensor_array_options::dynamic_size).
  /// \code kiln::tensor_array(kiln::int32, 0, {.dynamic_size = true}).dynamic_size() == true; \endcode
  bool dynamic_size() const { return dynamic_size_; }
  /// The elements' dtype.
  /// \code kiln::tensor_array(kiln::float32, 10).dtype() == kiln::float32; \endcode
  kiln::dtype dtype() const { return type_; }

  /// Whether no element has been written yet (so the element shape is not known).
  /// \code kiln::tensor_array(kiln::int32, 2).unwritten() == true; \endcode
  bool unwritten() const {
    return (size_ != 0 || dynamic_size_) && elements_.rank() == 1 && elements_.shape()[0] == 0;
  }

  /// The tensor that holds the elements: how loops and functions carry the array.
  /// \code
  /// const kiln::tensor_array states = kiln::tensor_array(kiln::float32, 2).write(0, kiln::ones({3}));
  /// const kiln::tensor& t = states.elements();  // (2, 3)
  /// \endcode
  const tensor& elements() const { return elements_; }
  /// The same array holding `elements` instead (of the same dtype); once written,
  /// the array's size is the first dim of its elements.
  /// \code
  /// kiln::tensor_array states(kiln::float32, 2);
  /// auto next = states.with_elements(kiln::zeros({2, 3}));
  /// \endcode
  tensor_array with_elements(tensor elements) const {
    tensor_array out = *this;
    out.elements_ = std::move(elements);
    if (!out.unwritten()) {
      out.size_ = out.elements_.shape()[0];
      out.size_tensor_ = tensor();
    }
    return out;
  }
  /// The array with every element zeros of `element_shape`, on device `d`: what a
  /// first write starts from, and how an array first written in a loop body enters
  /// the loop.
  /// \code auto zeroed = kiln::tensor_array(kiln::float32, 3).holding_zeros({2});  // stack(): (3, 2) zeros \endcode
  template <class = void>
  tensor_array holding_zeros(const shape& element_shape, device d = device::cpu) const {
    shape rows{size_ == none ? 0 : size_};
    for (std::int64_t dim : element_shape) rows.push_back(dim);
    const tensor zeros = kiln::zeros(rows, type_, d);
    return with_elements(size_ == none ? kiln::pad_rows(zeros, size_tensor_) : zeros);
  }

 private:
  shape element_shape() const { return shape(elements_.shape().dims().subspan(1)); }
  // An eager index past the end of an array of known size (a write only when it cannot
  // grow): out_of_range_error with TensorFlow's message. A symbolic index is checked
  // by gather and set_item when the graph runs.
  void check_eager_index(const tensor& i, bool writing) const {
    if (detail::tracing() || i.is_symbolic() || size_ == none || i.rank() != 0 || (i.dtype() != int32 && i.dtype() != int64))
      return;
    const std::int64_t index = ops::scalar_index(i);
    if (index >= 0 && (index < size_ || (writing && dynamic_size_))) return;
    throw out_of_range_error(writing ? "tensor_array.write: Tried to write to index " + std::to_string(index) +
                                           " but array is not resizeable and size is: " + std::to_string(size_)
                                     : "tensor_array.read: Tried to read from index " + std::to_string(index) +
                                           " but array size is: " + std::to_string(size_));
  }
  // An array of size 0 stacks to an empty tensor even though nothing was written.
  void require_written(const char* what) const {
    if (unwritten() && size_ != 0)
      throw value_error(std::string("tensor_array.") + what + ": no element of this array of size " +
                        (size_ == none ? std::string("None") : std::to_string(size_)) +
                        " was written, so its element shape is unknown");
  }

  kiln::dtype type_;
  std::int64_t size_;  ///< kiln::none when known only when the graph runs
  bool dynamic_size_;
  tensor size_tensor_;  ///< the symbolic size of an unwritten array whose size_ is none
  tensor elements_;
};

}  // namespace kiln
// ----- end kiln/ops/tensor_array.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_TENSOR_ARRAY_HPP

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
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_ELEMENTWISE_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_ELEMENTWISE_HPP
// ----- begin kiln/backend/reference/elementwise.hpp -----
/// \file
/// Reference elementwise kernel: one output element at a time, each input index
/// computed from scratch. Slow and obviously right.

#include <span>


namespace kiln::backend {

template <ops::elementwise Op>
void compute(reference_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  std::array<std::array<std::int64_t, max_rank>, 3> strides{};
  for (int k = 0; k < Op::arity; ++k) strides[k] = broadcast_strides(in[k].shape, os);
  auto offset = [&](int k, std::int64_t flat) {
    std::int64_t off = 0;
    for (int d = os.rank() - 1; d >= 0; --d) {
      off += (flat % os[d]) * strides[k][d];
      flat /= os[d];
    }
    return off;
  };
  visit_elementwise_types(op, in[ops::value_operand<Op>].dtype, out.dtype, [&]<class In, class Out>() {
    Out* o = out.as<Out>();
    for (std::int64_t i = 0, n = os.num_elements(); i < n; ++i)
      o[i] = math::convert<Out>(ops::invoke_elementwise(
          op, [&](int k) -> const In& { return in[k].as<In>()[offset(k, i)]; },
          [&](int k) { return in[k].as<bool>()[offset(k, i)]; }));
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/reference/elementwise.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_ELEMENTWISE_HPP
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
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_REDUCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_REDUCTION_HPP
// ----- begin kiln/backend/reference/reduction.hpp -----
/// \file
/// Reference reduction kernel: one pass over the input in row-major order, each
/// element's output and reduced position computed from scratch. Float sums are
/// accumulated in a wider type so that the reference is the more accurate side.

#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>


namespace kiln::backend {

template <ops::reduction Op>
void compute(reference_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  using kind = ops::reduction_kind;
  const shape& s = in[0].shape;
  const auto reduced = ops::reduced_dims(op.axis, s.rank());
  const std::int64_t count = ops::reduced_count(s, op.axis), outputs = out.size();

  ops::visit_numeric(in[0].dtype, [&]<class T>() {
    constexpr bool floating = std::is_floating_point_v<T>;
    // Integers wrap in their own type, as TensorFlow's do.
    using acc_t = std::conditional_t<std::is_same_v<T, float>, double, std::conditional_t<floating, long double, T>>;
    constexpr acc_t lowest = floating ? -std::numeric_limits<acc_t>::infinity() : std::numeric_limits<acc_t>::lowest();
    constexpr acc_t highest = floating ? std::numeric_limits<acc_t>::infinity() : std::numeric_limits<acc_t>::max();
    std::vector<acc_t> acc(outputs, Op::kind == kind::min ? highest : Op::kind == kind::sum || Op::kind == kind::mean ? acc_t(0) : lowest);
    std::vector<std::int64_t> best(outputs, -1);

    const T* x = in[0].as<T>();
    for (std::int64_t i = 0, n = s.num_elements(); i < n; ++i) {
      std::int64_t rest = i, o = 0, o_scale = 1, k = 0, k_scale = 1;
      for (int d = s.rank() - 1; d >= 0; --d) {
        std::int64_t coord = rest % s[d];
        rest /= s[d];
        if (reduced[d]) {
          k += coord * k_scale;
          k_scale *= s[d];
        } else {
          o += coord * o_scale;
          o_scale *= s[d];
        }
      }
      const acc_t v = acc_t(x[i]);
      if constexpr (Op::kind == kind::sum || Op::kind == kind::mean) {
        acc[o] = math::add(acc[o], v);
      } else if constexpr (Op::kind == kind::max) {
        acc[o] = math::max(acc[o], v);
      } else if constexpr (Op::kind == kind::min) {
        acc[o] = math::min(acc[o], v);
      } else {
        bool nan_first = floating && v != v && acc[o] == acc[o];
        if (best[o] < 0 || v > acc[o] || nan_first) {
          acc[o] = v;
          best[o] = k;
        }
      }
    }

    for (std::int64_t o = 0; o < outputs; ++o) {
      if constexpr (Op::kind == kind::argmax) {
        out.as<std::int64_t>()[o] = best[o];
      } else if constexpr (Op::kind == kind::mean) {
        out.as<T>()[o] = ops::mean_of<T>(acc[o], count);
      } else {
        out.as<T>()[o] = T(acc[o]);
      }
    }
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/reference/reduction.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_REDUCTION_HPP
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
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_SHAPE_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_SHAPE_OPS_HPP
// ----- begin kiln/backend/reference/shape_ops.hpp -----
/// \file
/// Reference kernels of the data-movement ops: for every output element, its
/// multi-index, the input element it comes from, and one assignment. Slow and
/// obviously right. (reshape, `x[i]`, shape_of and set_item need no kernel: they evaluate.)

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>


namespace kiln::backend {
namespace reference {

using multi_index = std::array<std::int64_t, max_rank>;

inline multi_index unravel(std::int64_t flat, const shape& s) {
  multi_index idx{};
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

inline std::int64_t ravel(const multi_index& idx, const shape& s) {
  std::int64_t flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + idx[d];
  return flat;
}

/// Fills `out`: element i is element `source(i).second` of input `source(i).first`.
template <class Source>
void copy_from(std::span<const buffer_view> in, const buffer_view& out, Source source) {
  visit_dtype(out.dtype, [&]<class T>() {
    T* o = out.as<T>();
    for (std::int64_t i = 0, n = out.size(); i < n; ++i) {
      auto [k, j] = source(i);
      o[i] = in[k].template as<const T>()[j];
    }
  });
}

inline std::int64_t read_index(const buffer_view& indices, std::int64_t i) {
  return indices.dtype == int64 ? indices.as<const std::int64_t>()[i] : indices.as<const std::int32_t>()[i];
}

}  // namespace reference

template <class = void>
void compute(reference_backend, const ops::transpose& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int_list perm = op.permutation(xs.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index o = reference::unravel(i, out.shape), x{};
    for (int d = 0; d < out.shape.rank(); ++d) x[perm[d]] = o[d];
    return std::pair{std::size_t(0), reference::ravel(x, xs)};
  });
}

template <class = void>
void compute(reference_backend, const ops::concat& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index idx = reference::unravel(i, out.shape);
    std::size_t k = 0;
    while (idx[a] >= in[k].shape[a]) idx[a] -= in[k++].shape[a];
    return std::pair{k, reference::ravel(idx, in[k].shape)};
  });
}

template <class = void>
void compute(reference_backend, const ops::stack& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index o = reference::unravel(i, out.shape), x{};
    for (int d = 0, e = 0; d < out.shape.rank(); ++d)
      if (d != a) x[e++] = o[d];
    return std::pair{std::size_t(o[a]), reference::ravel(x, in[0].shape)};
  });
}

template <class = void>
void compute(reference_backend, const ops::gather& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &is = in[1].shape;
  const int a = ops::normalize_axis(op.axis, xs.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index o = reference::unravel(i, out.shape), x{}, j{};
    for (int d = 0; d < a; ++d) x[d] = o[d];
    for (int d = 0; d < is.rank(); ++d) j[d] = o[a + d];
    x[a] = reference::read_index(in[1], reference::ravel(j, is));
    for (int d = a + 1; d < xs.rank(); ++d) x[d] = o[d - 1 + is.rank()];
    return std::pair{std::size_t(0), reference::ravel(x, xs)};
  });
}

template <class = void>
void compute(reference_backend, const ops::unsorted_segment_sum& op, std::span<const buffer_view> in,
             const buffer_view& out) {
  const shape &ds = in[0].shape, &ids = in[1].shape;
  const int a = int(op.axis);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    T* o = out.as<T>();
    std::fill_n(o, out.size(), T(0));
    for (std::int64_t i = 0, n = ds.num_elements(); i < n; ++i) {  // in order, so each segment sums its ids in order
      const reference::multi_index x = reference::unravel(i, ds);
      std::int64_t j = 0;
      for (int d = 0; d < ids.rank(); ++d) j = j * ids[d] + x[a + d];
      const std::int64_t segment = reference::read_index(in[1], j);
      if (segment < 0) continue;
      reference::multi_index y{};
      for (int d = 0; d < a; ++d) y[d] = x[d];
      y[a] = segment;
      for (int d = a + ids.rank(); d < ds.rank(); ++d) y[d - ids.rank() + 1] = x[d];
      T& sum = o[reference::ravel(y, out.shape)];
      sum = math::add(sum, in[0].as<const T>()[i]);
    }
  });
}

template <class = void>
void compute(reference_backend, const ops::slice& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index idx = reference::unravel(i, out.shape);
    for (int d = 0; d < out.shape.rank(); ++d) idx[d] += op.begin[d];
    return std::pair{std::size_t(0), reference::ravel(idx, in[0].shape)};
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/reference/shape_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_SHAPE_OPS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_SHAPE_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_SHAPE_OPS_HPP
// ----- begin kiln/backend/cpu/shape_ops.hpp -----
/// \file
/// CPU kernels of the data-movement ops. Every kernel copies contiguous runs of
/// elements: trivially copyable dtypes move as raw bytes with memcpy (dispatched on
/// the element size alone, so int32 and float32 share one instantiation), strings by
/// assignment. Dims that both sides walk contiguously are merged first, so a run is
/// as long as it can be. A transpose that moves the innermost dim cannot copy runs;
/// it goes tile by tile, so that reads and writes both stay in cache. Large outputs
/// are split over the thread pool. (reshape, `x[i]`, shape_of and set_item need no kernel.)

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif


namespace kiln::backend {
namespace cpu {

/// Bytes a parallel task copies at least: below this, waking threads costs more than it saves.
inline constexpr std::int64_t copy_grain_bytes = std::int64_t(1) << 18;

/// Side of the square tiles of a transpose: a 32x32 tile of float64 is 8 KiB read
/// and 8 KiB written, well within L1.
inline constexpr std::int64_t transpose_tile_side = 32;

// Movers copy elements between buffers, offsets counted in elements. Their loops
// take everything as value parameters: the compiler must assume a byte store may
// alias any memory, so a loop bound read through a reference would be reloaded on
// every element.

/// Moves trivially copyable elements of `Size` bytes.
template <std::size_t Size>
struct byte_mover {
  static constexpr std::int64_t size = Size;
  static constexpr std::int64_t grain = std::max<std::int64_t>(1, copy_grain_bytes / size);

  static const unsigned char* at(const void* p, std::int64_t i) { return static_cast<const unsigned char*>(p) + i * size; }
  static unsigned char* at(void* p, std::int64_t i) { return static_cast<unsigned char*>(p) + i * size; }
  /// dst[to + i] = src[from + i] for i < count.
  static void copy(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t count) {
    if (count == 1)  // runs of one element are common (stack along the last axis); skip the call
      std::memcpy(at(dst, to), at(src, from), Size);
    else
      std::memcpy(at(dst, to), at(src, from), std::size_t(count) * Size);
  }
  /// dst[to + i] = src[from + i * step] for i < count.
  static void copy_strided(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t step,
                           std::int64_t count) {
    unsigned char* d = at(dst, to);
    const unsigned char* s = at(src, from);
    for (std::int64_t i = 0; i < count; ++i) std::memcpy(d + i * size, s + i * step * size, Size);
  }
  /// dst[to + i] = src[from + indices[i]] for i < count.
  template <class I>
  static void copy_indexed(void* dst, std::int64_t to, const void* src, std::int64_t from, const I* indices,
                           std::int64_t count) {
    unsigned char* d = at(dst, to);
    const unsigned char* s = at(src, from);
    for (std::int64_t i = 0; i < count; ++i) std::memcpy(d + i * size, s + std::int64_t(indices[i]) * size, Size);
  }
};

/// Moves std::string elements by assignment (the output's strings already exist).
struct string_mover {
  static constexpr std::int64_t grain = copy_grain_bytes / std::int64_t(sizeof(std::string));

  static const std::string* at(const void* p, std::int64_t i) { return static_cast<const std::string*>(p) + i; }
  static std::string* at(void* p, std::int64_t i) { return static_cast<std::string*>(p) + i; }
  static void copy(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t count) {
    std::copy_n(at(src, from), count, at(dst, to));
  }
  static void copy_strided(void* dst, std::int64_t to, const void* src, std::int64_t from, std::int64_t step,
                           std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) *at(dst, to + i) = *at(src, from + i * step);
  }
  template <class I>
  static void copy_indexed(void* dst, std::int64_t to, const void* src, std::int64_t from, const I* indices,
                           std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) *at(dst, to + i) = *at(src, from + std::int64_t(indices[i]));
  }
};

/// Calls `f.template operator()<Mover>()` with the mover for dtype `t`.
template <class F>
void visit_mover(dtype t, F&& f) {
  switch (t) {
    case bool_: return f.template operator()<byte_mover<sizeof(bool)>>();
    case int32:
    case float32: return f.template operator()<byte_mover<4>>();
    case int64:
    case float64: return f.template operator()<byte_mover<8>>();
    case string: return f.template operator()<string_mover>();
  }
  kiln::detail::throw_invalid_dtype("visit_mover", t);
}

/// An output walked in row-major order whose element at multi-index `idx` comes from
/// input element `base + sum(idx[d] * stride[d])`.
struct strided_walk {
  int rank = 0;
  std::array<std::int64_t, max_rank> dims{}, stride{};
  std::int64_t base = 0;

  /// The walk over `out` with input `stride`s, minus size-1 dims, with neighbours
  /// merged where the input side chains too (the output side always does).
  strided_walk(const shape& out, const std::array<std::int64_t, max_rank>& in_stride, std::int64_t in_base)
      : base(in_base) {
    for (int d = 0; d < out.rank(); ++d) {
      if (out[d] == 1) continue;
      if (rank > 0 && stride[rank - 1] == in_stride[d] * out[d]) {
        dims[rank - 1] *= out[d];
        stride[rank - 1] = in_stride[d];
      } else {
        dims[rank] = out[d];
        stride[rank] = in_stride[d];
        ++rank;
      }
    }
    if (rank == 0) {  // one element
      rank = 1;
      dims[0] = stride[0] = 1;
    }
  }

  std::int64_t size() const {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= dims[d];
    return n;
  }
};

/// Copies a walk whose last dim is contiguous in the output, run by run: one memcpy
/// per run when the input side is contiguous too.
template <class Mover>
void copy_walk(const strided_walk& w, const void* src, void* dst) {
  const int r = w.rank;
  const std::int64_t run = w.dims[r - 1], step = w.stride[r - 1];
  kiln::detail::parallel_for(w.size(), Mover::grain, [&](std::int64_t lo, std::int64_t hi) {
    std::array<std::int64_t, max_rank> idx{};
    std::int64_t from = w.base;
    for (std::int64_t rest = lo, d = r - 1; d >= 0; --d) {
      idx[d] = rest % w.dims[d];
      rest /= w.dims[d];
      from += idx[d] * w.stride[d];
    }
    for (std::int64_t to = lo; to < hi;) {
      const std::int64_t len = std::min(run - idx[r - 1], hi - to);
      if (step == 1)
        Mover::copy(dst, to, src, from, len);
      else
        Mover::copy_strided(dst, to, src, from, step, len);
      to += len;
      from += len * step;
      idx[r - 1] += len;
      for (int d = r - 1; d > 0 && idx[d] == w.dims[d]; --d) {
        from += w.stride[d - 1] - w.dims[d] * w.stride[d];
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

/// transpose_tile through a buffer in L1 (see there), for trivially copyable elements.
template <class Mover>
void transpose_buffered(const void* src, std::int64_t src_stride, void* dst, std::int64_t dst_stride, std::int64_t rows,
                        std::int64_t cols) {
  constexpr std::int64_t t = transpose_tile_side;
  alignas(buffer_alignment) unsigned char buffer[t * t * Mover::size];  // buffer[j][i] = src[i + j * src_stride]
  for (std::int64_t j = 0; j < cols; ++j) Mover::copy(buffer, j * t, src, j * src_stride, rows);
  for (std::int64_t i = 0; i < rows; ++i) Mover::copy_strided(dst, i * dst_stride, buffer, i, t, cols);
}

#if defined(__AVX512F__)
/// `dst[i * dst_stride + j] = src[i + j * src_stride]` for a 16 x 16 block of 4-byte
/// elements (moved as floats, bits unchanged): sixteen rows in registers, interleaved
/// in pairs, then in fours, then as 128-bit lanes twice.
inline void transpose_16x16(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride) {
  __m512 r[16], t[16];
  for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(src + k * src_stride);
  for (int k = 0; k < 16; k += 2) {
    t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 16; k += 4) {
    r[k] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)
    for (int k = 0; k < 4; ++k) {
      t[h + k] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0x88);
      t[h + k + 4] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0xdd);
    }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * dst_stride, r[k]);
}
#endif

/// Copies a `rows` x `cols` tile that a transpose turns around:
/// `dst[i * dst_stride + j] = src[i + j * src_stride]`. Trivially copyable elements
/// go through a buffer in L1, read and written a whole row at a time: rows far apart
/// in memory often share cache sets, so reading them a column at a time would evict
/// them before they are used up.
template <class Mover>
void transpose_tile(const void* src, std::int64_t src_stride, void* dst, std::int64_t dst_stride, std::int64_t rows,
                    std::int64_t cols) {
  if constexpr (std::is_same_v<Mover, string_mover>) {  // a string copy costs more than any cache miss
    for (std::int64_t i = 0; i < rows; ++i) Mover::copy_strided(dst, i * dst_stride, src, i, src_stride, cols);
  } else {
#if defined(__AVX512F__)
    if constexpr (Mover::size == 4) {
      // 16 x 16 blocks turn around in registers; what is left of the tile goes through
      // the buffer below.
      constexpr std::int64_t b = 16;
      const std::int64_t full_rows = rows / b * b, full_cols = cols / b * b;
      for (std::int64_t j = 0; j < full_cols; j += b)
        for (std::int64_t i = 0; i < full_rows; i += b)
          transpose_16x16(static_cast<const float*>(src) + i + j * src_stride, src_stride,
                          static_cast<float*>(dst) + i * dst_stride + j, dst_stride);
      if (full_rows < rows)
        transpose_buffered<Mover>(Mover::at(src, full_rows), src_stride, Mover::at(dst, full_rows * dst_stride), dst_stride,
                                  rows - full_rows, cols);
      if (full_cols < cols && full_rows > 0)
        transpose_buffered<Mover>(Mover::at(src, full_cols * src_stride), src_stride, Mover::at(dst, full_cols), dst_stride,
                                  full_rows, cols - full_cols);
      return;
    }
#endif
    transpose_buffered<Mover>(src, src_stride, dst, dst_stride, rows, cols);
  }
}

/// Copies a walk whose input-contiguous dim `q` is not the last one (a transpose
/// that moves the innermost dim) in square tiles over dims `q` and `last`.
template <class Mover>
void copy_walk_tiled(const strided_walk& w, int q, const void* src, void* dst) {
  const int last = w.rank - 1;
  std::array<std::int64_t, max_rank> out_stride{};
  for (std::int64_t d = last, acc = 1; d >= 0; --d) {
    out_stride[d] = acc;
    acc *= w.dims[d];
  }
  constexpr std::int64_t t = transpose_tile_side;
  const std::int64_t tiles_q = (w.dims[q] + t - 1) / t, tiles_last = (w.dims[last] + t - 1) / t;
  const std::int64_t tasks = w.size() / (w.dims[q] * w.dims[last]) * tiles_q * tiles_last;
  kiln::detail::parallel_for(tasks, std::max<std::int64_t>(1, Mover::grain / (t * t)), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t task = lo; task < hi; ++task) {
      std::int64_t rest = task;
      const std::int64_t l0 = rest % tiles_last * t;
      rest /= tiles_last;
      const std::int64_t q0 = rest % tiles_q * t;
      rest /= tiles_q;
      std::int64_t from = w.base + q0 + l0 * w.stride[last], to = q0 * out_stride[q] + l0;
      for (int d = last - 1; d >= 0; --d) {
        if (d == q) continue;
        from += rest % w.dims[d] * w.stride[d];
        to += rest % w.dims[d] * out_stride[d];
        rest /= w.dims[d];
      }
      transpose_tile<Mover>(Mover::at(src, from), w.stride[last], Mover::at(dst, to), out_stride[q],
                            std::min(t, w.dims[q] - q0), std::min(t, w.dims[last] - l0));
    }
  });
}

/// Concatenation along a dim: the output is `outer` rows, each made of one run of
/// `run(k)` elements from every input k in turn.
template <class Mover, class Run>
void join(std::span<const buffer_view> in, std::int64_t outer, Run run, const buffer_view& out) {
  const std::int64_t row = out.size() / outer;
  kiln::detail::parallel_for(out.size(), Mover::grain, [&](std::int64_t lo, std::int64_t hi) {
    const std::size_t inputs = in.size();
    std::int64_t o = lo / row, p = lo % row, start = 0;  // row o, position p in it, input k starts at `start`
    std::size_t k = 0;
    while (p >= start + run(k)) start += run(k++);
    for (std::int64_t to = lo; to < hi;) {
      const std::int64_t r = run(k), len = std::min(r - (p - start), hi - to);
      if (len > 0) Mover::copy(out.data, to, in[k].data, o * r + (p - start), len);
      to += len;
      p += len;
      if (p - start == r) {
        start += r;
        if (++k == inputs) {
          k = 0;
          start = p = 0;
          ++o;
        }
      }
    }
  });
}

/// Gather as `outer x m` rows of `inner` elements: row (o, j) of the output is row
/// (o, indices[j]) of the input, viewed as `outer x n x inner`. The indices were
/// checked by ops::check_values.
template <class Mover, class I>
void gather_rows(const buffer_view& x, const I* indices, std::int64_t m, int axis, const buffer_view& out) {
  const std::int64_t n = x.shape[axis], inner = elements_between(x.shape, axis + 1, x.shape.rank());
  kiln::detail::parallel_for(out.size(), Mover::grain, [&](std::int64_t lo, std::int64_t hi) {
    std::int64_t col = lo % inner, j = lo / inner % m, row_base = lo / inner / m * n;  // row_base: o * n
    for (std::int64_t to = lo; to < hi;) {
      if (inner == 1) {  // one element per index: copy the elements of a run of indices
        const std::int64_t len = std::min(m - j, hi - to);
        Mover::copy_indexed(out.data, to, x.data, row_base, indices + j, len);
        to += len;
        j += len;
      } else {
        const std::int64_t len = std::min(inner - col, hi - to);
        Mover::copy(out.data, to, x.data, (row_base + std::int64_t(indices[j])) * inner + col, len);
        to += len;
        col = 0;
        ++j;
      }
      if (j == m) {
        j = 0;
        row_base += n;
      }
    }
  });
}

/// unsorted_segment_sum as `outer` blocks: row j of block b of `data` (m rows of
/// `inner` elements) is added to row ids[j] of block b of `out` (`segments` rows).
/// Threads split the (block, column) pairs, so each output element is one thread's
/// sum of its rows in the order of j, whatever the split.
template <class T, class I>
void segment_sum_rows(const T* data, const I* ids, std::int64_t m, std::int64_t segments, std::int64_t outer,
                      std::int64_t inner, T* out) {
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t(1) << 15) / std::max<std::int64_t>(m + segments, 1));
  kiln::detail::parallel_for(outer * inner, grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t at = lo; at < hi;) {
      const std::int64_t b = at / inner, first = at % inner, last = std::min(inner, first + (hi - at));
      T* block = out + b * segments * inner;
      for (std::int64_t s = 0; s < segments; ++s) std::fill(block + s * inner + first, block + s * inner + last, T(0));
      for (std::int64_t j = 0; j < m; ++j) {
        if (ids[j] < 0) continue;  // dropped, as TensorFlow drops negative ids
        T* sum = block + std::int64_t(ids[j]) * inner;
        const T* row = data + (b * m + j) * inner;
        for (std::int64_t c = first; c < last; ++c) sum[c] = math::add(sum[c], row[c]);
      }
      at += last - first;
    }
  });
}

}  // namespace cpu

template <class = void>
void compute(cpu_backend, const ops::unsorted_segment_sum& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& ds = in[0].shape;
  const int a = int(op.axis), ids_end = a + in[1].shape.rank();
  const std::int64_t outer = elements_between(ds, 0, a), inner = elements_between(ds, ids_end, ds.rank()), m = in[1].size();
  ops::visit_numeric(out.dtype, [&]<class T>() {
    if (in[1].dtype == int64)
      cpu::segment_sum_rows(in[0].as<const T>(), in[1].as<const std::int64_t>(), m, op.num_segments, outer, inner, out.as<T>());
    else
      cpu::segment_sum_rows(in[0].as<const T>(), in[1].as<const std::int32_t>(), m, op.num_segments, outer, inner, out.as<T>());
  });
}

template <class = void>
void compute(cpu_backend, const ops::transpose& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int_list perm = op.permutation(xs.rank());
  const std::array<std::int64_t, max_rank> x_stride = row_major_strides(xs);
  std::array<std::int64_t, max_rank> stride{};
  for (int d = 0; d < xs.rank(); ++d) stride[d] = x_stride[perm[d]];
  const cpu::strided_walk w(out.shape, stride, 0);
  int q = 0;  // the walk dim that is contiguous in the input
  while (w.stride[q] != 1) ++q;
  cpu::visit_mover(out.dtype, [&]<class Mover>() {
    if (q == w.rank - 1)
      cpu::copy_walk<Mover>(w, in[0].data, out.data);
    else
      cpu::copy_walk_tiled<Mover>(w, q, in[0].data, out.data);
  });
}

template <class = void>
void compute(cpu_backend, const ops::slice& op, std::span<const buffer_view> in, const buffer_view& out) {
  const std::array<std::int64_t, max_rank> stride = row_major_strides(in[0].shape);
  std::int64_t base = 0;
  for (int d = 0; d < out.shape.rank(); ++d) base += op.begin[d] * stride[d];
  const cpu::strided_walk w(out.shape, stride, base);
  cpu::visit_mover(out.dtype, [&]<class Mover>() { cpu::copy_walk<Mover>(w, in[0].data, out.data); });
}

template <class = void>
void compute(cpu_backend, const ops::concat& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  const int a = ops::normalize_axis(op.axis, os.rank());
  const std::int64_t outer = elements_between(os, 0, a), inner = elements_between(os, a + 1, os.rank());
  auto run = [&](std::size_t k) { return in[k].shape[a] * inner; };
  cpu::visit_mover(out.dtype, [&]<class Mover>() { cpu::join<Mover>(in, outer, run, out); });
}

template <class = void>
void compute(cpu_backend, const ops::stack& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  const int a = ops::normalize_axis(op.axis, os.rank());
  const std::int64_t outer = elements_between(os, 0, a), inner = elements_between(os, a + 1, os.rank());
  auto run = [inner](std::size_t) { return inner; };
  cpu::visit_mover(out.dtype, [&]<class Mover>() { cpu::join<Mover>(in, outer, run, out); });
}

template <class = void>
void compute(cpu_backend, const ops::gather& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int axis = ops::normalize_axis(op.axis, in[0].shape.rank());
  const std::int64_t m = in[1].size();
  cpu::visit_mover(out.dtype, [&]<class Mover>() {
    if (in[1].dtype == int64)
      cpu::gather_rows<Mover>(in[0], in[1].as<const std::int64_t>(), m, axis, out);
    else
      cpu::gather_rows<Mover>(in[0], in[1].as<const std::int32_t>(), m, axis, out);
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/cpu/shape_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_SHAPE_OPS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_LINALG_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_LINALG_HPP
// ----- begin kiln/backend/reference/linalg.hpp -----
/// \file
/// Reference matmul and conv2d: the textbook loops.

#include <span>


namespace kiln::backend {

template <class = void>
void compute(reference_backend, const ops::matmul&, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::matmul_geometry g(in[0].shape, in[1].shape, out.shape);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    for (std::int64_t bi = 0; bi < g.batches; ++bi) {
      auto [oa, ob] = g.operand_offsets(bi);
      const T* a = in[0].as<T>() + oa;
      const T* b = in[1].as<T>() + ob;
      T* c = out.as<T>() + bi * g.m * g.n;
      for (std::int64_t i = 0; i < g.m; ++i)
        for (std::int64_t j = 0; j < g.n; ++j) {
          T acc = T(0);
          for (std::int64_t p = 0; p < g.k; ++p) acc = math::add(acc, math::mul(a[i * g.k + p], b[p * g.n + j]));
          c[i * g.n + j] = acc;
        }
    }
  });
}

template <class = void>
void compute(reference_backend, const ops::conv2d& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &fs = in[1].shape, &os = out.shape;
  const std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], op.stride_h, op.pad).pad_before;
  const std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], op.stride_w, op.pad).pad_before;
  ops::visit_numeric(out.dtype, [&]<class T>() {
    const T* x = in[0].as<T>();
    const T* f = in[1].as<T>();
    T* o = out.as<T>();
    for (std::int64_t b = 0; b < os[0]; ++b)
      for (std::int64_t oy = 0; oy < os[1]; ++oy)
        for (std::int64_t ox = 0; ox < os[2]; ++ox)
          for (std::int64_t co = 0; co < os[3]; ++co) {
            T acc = T(0);
            for (std::int64_t fy = 0; fy < fs[0]; ++fy)
              for (std::int64_t fx = 0; fx < fs[1]; ++fx) {
                std::int64_t iy = oy * op.stride_h + fy - pad_h, ix = ox * op.stride_w + fx - pad_w;
                if (iy < 0 || iy >= xs[1] || ix < 0 || ix >= xs[2]) continue;  // zero padding
                for (std::int64_t ci = 0; ci < xs[3]; ++ci)
                  acc = math::add(acc, math::mul(x[((b * xs[1] + iy) * xs[2] + ix) * xs[3] + ci],
                                                 f[((fy * fs[1] + fx) * fs[2] + ci) * fs[3] + co]));
              }
            o[((b * os[1] + oy) * os[2] + ox) * os[3] + co] = acc;
          }
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/reference/linalg.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_REFERENCE_LINALG_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_LINALG_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_LINALG_HPP
// ----- begin kiln/backend/cpu/linalg.hpp -----
/// \file
/// CPU matmul and conv2d: the op-library side of the packed GEMM and convolution
/// kernels in gemm.hpp and conv2d.hpp.

#include <span>

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
    // Integer products are rare and small (the seeds' power): one kernel serves them
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

namespace kiln::backend {

template <class = void>
void compute(cpu_backend, const ops::matmul&, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::matmul_geometry g(in[0].shape, in[1].shape, out.shape);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    for (std::int64_t bi = 0; bi < g.batches; ++bi) {
      auto [oa, ob] = g.operand_offsets(bi);
      cpu::gemm<T>(g.m, g.n, g.k, in[0].as<T>() + oa, g.k, in[1].as<T>() + ob, g.n, out.as<T>() + bi * g.m * g.n, g.n);
    }
  });
}

template <class = void>
void compute(cpu_backend, const ops::conv2d& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &fs = in[1].shape, &os = out.shape;
  const std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], op.stride_h, op.pad).pad_before;
  const std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], op.stride_w, op.pad).pad_before;
  ops::visit_numeric(out.dtype, [&]<class T>() {
    cpu::conv2d<T>(in[0].as<T>(), xs[0], xs[1], xs[2], xs[3], in[1].as<T>(), fs[0], fs[1], fs[3], op.stride_h, op.stride_w,
                   pad_h, pad_w, out.as<T>(), os[1], os[2]);
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/cpu/linalg.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_CPU_LINALG_HPP
#if KILN_HAS_THRUST
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_MEMORY_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_MEMORY_HPP
// ----- begin kiln/backend/thrust/memory.hpp -----
/// \file
/// The memory of kiln::device::gpu. Under CUDA it is device memory (cudaMalloc,
/// cudaMemcpy); on a host device system it is host memory from kiln's caching
/// allocator, so the Thrust kernels run on the host unchanged. Including this header
/// makes the GPU device available: it registers the memory with the storage layer.

#include <cstddef>
#include <new>
#include <string>

#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_SYSTEM_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_SYSTEM_HPP
// ----- begin kiln/backend/thrust/system.hpp -----
/// \file
/// The Thrust device system the thrust_backend runs on, and the transform over
/// output elements that most Thrust kernels of kiln are.
///
/// nvcc builds use Thrust's CUDA system. A host compiler cannot build that system,
/// so when the build did not choose one (THRUST_DEVICE_SYSTEM, set by kiln's CMake
/// to CPP or OMP) the "device" is the host's sequential CPP system; this keeps a
/// plain `g++ -Iinclude` build working wherever Thrust headers are on the path.
///
/// Kernels hand Thrust raw pointers together with the `thrust::device` policy: the
/// policy, not the pointer type, selects the device system. Wrapping them in
/// `thrust::device_ptr` would make the host device systems write through
/// `thrust::device_reference`, which Thrust implements by binding a reference to a
/// null system pointer (undefined behaviour that UBSan reports).


#if !defined(THRUST_DEVICE_SYSTEM) && !defined(__CUDACC__)
#  define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif

#include <cstdint>

#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>


/// True when device memory is CUDA memory that host code must not dereference.
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#  define KILN_THRUST_CUDA 1
#else
#  define KILN_THRUST_CUDA 0
#endif

namespace kiln::backend::thrust_kernels {

/// Sets every element `i` of `out` (of type `T`) to `element(i)`: the one kernel
/// shape of most gpu ops, a transform over the output's flat indices.
/// For example `fill_elements<float>(out, read_strided<float>{x, index})`.
template <class T, class Element>
void fill_elements(const buffer_view& out, const Element& element) {
  ::thrust::counting_iterator<std::int64_t> first(0);
  ::thrust::transform(::thrust::device, first, first + out.size(), out.as<T>(), element);
}

}  // namespace kiln::backend::thrust_kernels
// ----- end kiln/backend/thrust/system.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_SYSTEM_HPP

#if KILN_THRUST_CUDA
#  include <cuda_runtime_api.h>
#endif

namespace kiln::backend::thrust_kernels {

#if KILN_THRUST_CUDA
/// Turns a CUDA error into the kiln error a caller can act on.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the sticky error state so later calls can proceed
  if (status == cudaErrorMemoryAllocation) throw std::bad_alloc();
  std::string message = std::string("kiln::device::gpu: ") + what + " failed: " + cudaGetErrorString(status);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) throw unavailable_error(message);
  throw internal_error(message);
}

/// cudaMalloc and cudaFree, for the caching allocator.
struct cuda_system {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  // Runs in destructors, also after the CUDA runtime shut down at exit: never throws.
  static void release(void* p) noexcept { (void)cudaFree(p); }
};

/// The GPU's blocks, cached as the host's are (core/allocator.hpp). Thrust's
/// algorithms on `thrust::device` return when their kernels have finished, so a
/// freed block is idle and can be handed out again at once. Never destroyed, as the
/// host's (a static tensor may be freed after every other static).
inline detail::basic_caching_allocator<cuda_system>& gpu_allocator() {
  static auto* const instance = new detail::basic_caching_allocator<cuda_system>;
  return *instance;
}

/// CUDA device memory.
inline const detail::memory_resource& gpu_memory() {
  static const detail::memory_resource resource{
      [](std::size_t bytes) { return gpu_allocator().allocate(bytes); },
      [](void* p, std::size_t bytes) { gpu_allocator().deallocate(p, bytes); },
      [](void* host_dst, const void* src, std::size_t bytes) {
        check_cuda(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
      },
      [](void* dst, const void* host_src, std::size_t bytes) {
        check_cuda(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
      },
  };
  return resource;
}
#else
/// On a host device system, "device" memory is host memory; it is the same
/// resource as the CPU's, so transfers are plain copies.
inline const detail::memory_resource& gpu_memory() { return detail::host_memory(); }
#endif

/// Set during static initialization of every program that includes this header.
inline const bool gpu_memory_registered = (detail::gpu_memory_slot() = &gpu_memory(), true);

}  // namespace kiln::backend::thrust_kernels
// ----- end kiln/backend/thrust/memory.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_MEMORY_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_ELEMENTWISE_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_ELEMENTWISE_HPP
// ----- begin kiln/backend/thrust/elementwise.hpp -----
/// \file
/// Thrust elementwise kernel: one `thrust::transform` per op over the output's flat
/// indices. Its functor calls the op's own functor (the one the other backends use)
/// on operands located through broadcast strides; dims that every operand walks
/// alike are merged first, so operands of equal shape (the common case) cost one
/// multiply per element and no division.

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_STRIDED_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_STRIDED_HPP
// ----- begin kiln/backend/thrust/strided.hpp -----
/// \file
/// `strided_offsets`: the device-side index arithmetic of the Thrust kernels. An
/// output element's flat (row-major) index becomes the element offsets of several
/// operands, each walking the output's dims with its own strides: 0 along a
/// broadcast dim, permuted for a transpose, the source's strides for a slice.

#include <array>
#include <cstdint>


namespace kiln::backend::thrust_kernels {

/// Element offsets of `N` operands for one output element.
template <int N>
struct offsets {
  std::int64_t at[N];
};

/// Maps flat output indices to operand offsets; plain data, copied to the device by
/// value inside kernel functors.
/// \code
/// using kiln::backend::thrust_kernels::strided_offsets;
/// strided_offsets<1> t = strided_offsets<1>::over(kiln::shape{2, 3}, {{{1, 2}}});  // transpose of a (3, 2)
/// t(4).at[0] == 3;  // output (1, 1) reads input (1, 1), at offset 1 * 2 + 1
/// \endcode
template <int N>
struct strided_offsets {
  int rank = 0;
  std::int64_t size[max_rank] = {};
  std::int64_t stride[N][max_rank] = {};

  /// Walks the dims of `out` with per-operand strides `strides[k][d]`.
  static strided_offsets over(const shape& out, const std::array<std::array<std::int64_t, max_rank>, N>& strides) {
    strided_offsets s;
    s.rank = out.rank();
    for (int d = 0; d < s.rank; ++d) {
      s.size[d] = out[d];
      for (int k = 0; k < N; ++k) s.stride[k][d] = strides[k][d];
    }
    return s;
  }

  /// Integer division is the costly part on a GPU, so the outermost dim needs none:
  /// a contiguous or collapsed (rank 1) walk costs one multiply per operand. The dim
  /// loop is unrolled over every possible dim, so that each `size[d]` and `stride[k][d]`
  /// has a constant index: indexing them with a variable makes CUDA copy this whole
  /// object to each thread's local memory, which made a kernel several times slower.
  KILN_HOST_DEVICE offsets<N> operator()(std::int64_t flat) const {
    offsets<N> o{};
    KILN_UNROLL
    for (int d = max_rank - 1; d > 0; --d) {
      if (d >= rank) continue;
      std::int64_t i = flat % size[d];
      flat /= size[d];
      KILN_UNROLL
      for (int k = 0; k < N; ++k) o.at[k] += i * stride[k][d];
    }
    if (rank > 0)
      KILN_UNROLL
      for (int k = 0; k < N; ++k) o.at[k] += flat * stride[k][0];
    return o;
  }
};

}  // namespace kiln::backend::thrust_kernels
// ----- end kiln/backend/thrust/strided.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_STRIDED_HPP

namespace kiln::backend {
namespace thrust_kernels {

/// Computes output element `i` of elementwise op `Op` reading `In` and writing `Out`.
template <class Op, class In, class Out>
struct elementwise_element {
  static constexpr int arity = Op::arity;
  Op op;
  const void* operand[arity];  // a leading condition (`where`) points to bools
  strided_offsets<arity> index;

  KILN_HOST_DEVICE Out operator()(std::int64_t i) const {
    const offsets<arity> o = index(i);
    return math::convert<Out>(ops::invoke_elementwise(
        op, [&](int k) -> const In& { return static_cast<const In*>(operand[k])[o.at[k]]; },
        [&](int k) { return static_cast<const bool*>(operand[k])[o.at[k]]; }));
  }
};

template <class Op, class In, class Out>
void run_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  constexpr int arity = Op::arity;
  const cpu::loop_nest<arity> nest(in, out.shape);
  elementwise_element<Op, In, Out> element{op, {}, {}};
  element.index.rank = nest.rank;
  for (int d = 0; d < nest.rank; ++d) {
    element.index.size[d] = nest.size[d];
    for (int k = 0; k < arity; ++k) element.index.stride[k][d] = nest.stride[k][d];
  }
  for (int k = 0; k < arity; ++k) element.operand[k] = in[k].data;
  fill_elements<Out>(out, element);
}

}  // namespace thrust_kernels

template <ops::elementwise Op>
void compute(thrust_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  visit_elementwise_types(op, in[ops::value_operand<Op>].dtype, out.dtype, [&]<class In, class Out>() {
    if constexpr (std::is_same_v<In, std::string> || std::is_same_v<Out, std::string>)
      throw internal_error(std::string(Op::name) + ": string tensors cannot be on the gpu");
    else
      thrust_kernels::run_elementwise<Op, In, Out>(op, in, out);
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/thrust/elementwise.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_ELEMENTWISE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_REDUCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_REDUCTION_HPP
// ----- begin kiln/backend/thrust/reduction.hpp -----
/// \file
/// Thrust reduction kernels. The input is enumerated with the kept dims first and
/// the reduced dims last, so that output `o` is the reduction of enumerated
/// elements [o * count, (o + 1) * count). Many outputs (or few elements each) make
/// one thread per output loop over its elements, which reads neighbouring memory in
/// neighbouring threads when the innermost dim is kept; few long reductions go to
/// `thrust::reduce_by_key`, which splits each over the whole device. Float sums
/// are compensated double sums, accurate whatever order the device adds in.

#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include <thrust/reduce.h>


namespace kiln::backend {
namespace thrust_kernels {

/// A double sum carrying the rounding error of its additions (each found exactly by
/// Knuth's TwoSum, as in Kahan-Babuska-Neumaier summation): a sum of any length,
/// added in any order, is then about as accurate as one in twice the precision,
/// like the reference's wide sequential sum.
struct compensated_sum {
  double sum;
  double error;

  KILN_HOST_DEVICE compensated_sum operator+(const compensated_sum& o) const {
    const double s = sum + o.sum, o_part = s - sum;
    return {s, error + o.error + ((sum - (s - o_part)) + (o.sum - o_part))};
  }
  /// Once the sum is infinite or NaN the error term is meaningless (inf - inf).
  KILN_HOST_DEVICE double value() const { return sum - sum == 0 ? sum + error : sum; }
};

/// A value and the position (among the reduced elements) it came from; position -1
/// marks the empty partial result.
template <class T>
struct indexed_value {
  T value;
  std::int64_t position;
};

/// What reduction `Kind` keeps while combining elements of type `T`, and how it
/// turns that into the output element: the device-side half of a reduction op.
template <ops::reduction_kind Kind, class T>
struct reducer {
  static constexpr bool sums = Kind == ops::reduction_kind::sum || Kind == ops::reduction_kind::mean;
  using accumulator = std::conditional_t<sums && std::is_floating_point_v<T>, compensated_sum, T>;
  using partial = std::conditional_t<Kind == ops::reduction_kind::argmax, indexed_value<T>, accumulator>;
  using output = std::conditional_t<Kind == ops::reduction_kind::argmax, std::int64_t, T>;

  std::int64_t count;  // elements per output

  KILN_HOST_DEVICE partial identity() const {
    if constexpr (sums)
      return accumulator{};
    else if constexpr (Kind == ops::reduction_kind::min)
      return highest();
    else if constexpr (Kind == ops::reduction_kind::max)
      return lowest();
    else
      return {lowest(), -1};
  }
  /// Element `x` at reduced position `position` as a partial result.
  KILN_HOST_DEVICE partial lift(T x, std::int64_t position) const {
    if constexpr (Kind == ops::reduction_kind::argmax)
      return {x, position};
    else if constexpr (std::is_same_v<accumulator, compensated_sum>)
      return compensated_sum{double(x), 0};
    else
      return x;
  }
  /// Associative (and commutative), as reduce_by_key needs: argmax keeps the first
  /// NaN, else the first largest value, whatever the order of combination.
  KILN_HOST_DEVICE partial operator()(const partial& a, const partial& b) const {
    if constexpr (std::is_same_v<accumulator, compensated_sum>) {
      return a + b;
    } else if constexpr (sums) {
      return math::add(a, b);
    } else if constexpr (Kind == ops::reduction_kind::max) {
      return math::max(a, b);
    } else if constexpr (Kind == ops::reduction_kind::min) {
      return math::min(a, b);
    } else {
      if (a.position < 0) return b;
      if (b.position < 0) return a;
      const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
      if (a_nan != b_nan) return a_nan ? a : b;
      if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
      return a.position < b.position ? a : b;
    }
  }
  KILN_HOST_DEVICE output finish(const partial& p) const {
    if constexpr (Kind == ops::reduction_kind::argmax)
      return p.position;
    else if constexpr (std::is_same_v<accumulator, compensated_sum>)
      return Kind == ops::reduction_kind::mean ? ops::mean_of<T>(p.value(), count) : T(p.value());
    else if constexpr (Kind == ops::reduction_kind::mean)
      return ops::mean_of<T>(p, count);
    else
      return p;
  }

 private:
  static KILN_HOST_DEVICE T lowest() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  static KILN_HOST_DEVICE T highest() {
    if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
};

/// Enumerated element `j` (kept dims first, reduced dims last) as a partial result.
template <ops::reduction_kind Kind, class T>
struct lift_element {
  reducer<Kind, T> reduce;
  const T* x;
  strided_offsets<1> input;

  KILN_HOST_DEVICE typename reducer<Kind, T>::partial operator()(std::int64_t j) const {
    return reduce.lift(x[input(j).at[0]], j % reduce.count);
  }
};

/// Output `o`, reduced by one thread in order.
template <ops::reduction_kind Kind, class T>
struct reduce_output {
  lift_element<Kind, T> element;

  KILN_HOST_DEVICE typename reducer<Kind, T>::output operator()(std::int64_t o) const {
    const reducer<Kind, T>& reduce = element.reduce;
    typename reducer<Kind, T>::partial acc = reduce.identity();
    for (std::int64_t j = o * reduce.count, end = j + reduce.count; j < end; ++j) acc = reduce(acc, element(j));
    return reduce.finish(acc);
  }
};

/// The output a run of enumerated elements belongs to.
struct output_of_element {
  std::int64_t count;
  KILN_HOST_DEVICE std::int64_t operator()(std::int64_t j) const { return j / count; }
};

/// Turns a partial result into the output element as reduce_by_key writes it.
template <ops::reduction_kind Kind, class T>
struct finish_output {
  reducer<Kind, T> reduce;
  KILN_HOST_DEVICE typename reducer<Kind, T>::output operator()(const typename reducer<Kind, T>::partial& p) const {
    return reduce.finish(p);
  }
};

/// Below this many outputs, each reducing more elements than there are outputs,
/// one thread per output would leave most of a GPU idle.
inline constexpr std::int64_t outputs_to_fill_device = std::int64_t(1) << 16;

template <ops::reduction_kind Kind, class T>
void run_reduction(const reduction_axes& axes, const buffer_view& in, const buffer_view& out) {
  const shape& s = in.shape;
  const auto reduced = ops::reduced_dims(axes, s.rank());
  const auto strides = row_major_strides(s);
  shape enumerated;
  std::array<std::array<std::int64_t, max_rank>, 1> enumerated_strides{};
  for (bool reduced_pass : {false, true}) {
    for (int d = 0; d < s.rank(); ++d) {
      if (reduced[d] != reduced_pass) continue;
      enumerated_strides[0][enumerated.rank()] = strides[d];
      enumerated.push_back(s[d]);
    }
  }
  const std::int64_t count = ops::reduced_count(s, axes), outputs = out.size();
  using out_t = typename reducer<Kind, T>::output;
  const lift_element<Kind, T> element{{count}, in.as<const T>(), strided_offsets<1>::over(enumerated, enumerated_strides)};
  if (count == 0 || outputs >= count || outputs >= outputs_to_fill_device) {
    fill_elements<out_t>(out, reduce_output<Kind, T>{element});
  } else {
    ::thrust::counting_iterator<std::int64_t> first(0);
    ::thrust::reduce_by_key(::thrust::device, ::thrust::make_transform_iterator(first, output_of_element{count}),
                            ::thrust::make_transform_iterator(first + outputs * count, output_of_element{count}),
                            ::thrust::make_transform_iterator(first, element), ::thrust::make_discard_iterator(),
                            ::thrust::make_transform_output_iterator(out.as<out_t>(), finish_output<Kind, T>{element.reduce}),
                            ::thrust::equal_to<std::int64_t>(), element.reduce);
  }
}

}  // namespace thrust_kernels

template <ops::reduction Op>
void compute(thrust_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  ops::visit_numeric(in[0].dtype, [&]<class T>() { thrust_kernels::run_reduction<Op::kind, T>(op.axis, in[0], out); });
}

}  // namespace kiln::backend
// ----- end kiln/backend/thrust/reduction.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_REDUCTION_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_SHAPE_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_SHAPE_OPS_HPP
// ----- begin kiln/backend/thrust/shape_ops.hpp -----
/// \file
/// Thrust kernels of the data-movement ops. transpose, slice and gather are one
/// `thrust::transform` over the output's elements, each reading the input element
/// it comes from (a gather). concat and stack copy each input into its window of
/// the output: viewed as matrices with the joined axis and everything after it as
/// columns, input k fills a block of columns of the output. Indices were checked
/// on the host before any kernel runs (ops::check_values), so kernels read in
/// bounds. String tensors never live on the gpu. (reshape, `x[i]`, shape_of and set_item
/// need no kernel: they evaluate on any device.)

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/permutation_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>


namespace kiln::backend {
namespace thrust_kernels {

/// Calls `f.template operator()<T>()` with the element type of `t`; strings, which
/// cannot be on the gpu, are an internal error.
template <class F>
void visit_device_dtype(dtype t, std::string_view op, F&& f) {
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string>)
      throw internal_error(std::string(op) + ": string tensors cannot be on the gpu");
    else
      f.template operator()<T>();
  });
}

/// Output element `i` is input element `index(i)`.
template <class T>
struct read_strided {
  const T* x;
  strided_offsets<1> index;
  KILN_HOST_DEVICE T operator()(std::int64_t i) const { return x[index(i).at[0]]; }
};

/// Fills `out` from `x` (starting `first` elements in), walking the output's dims
/// with the input strides `strides`.
inline void copy_strided(std::string_view op, const buffer_view& x, std::int64_t first,
                         const std::array<std::int64_t, max_rank>& strides, const buffer_view& out) {
  const auto index = strided_offsets<1>::over(out.shape, {strides});
  visit_device_dtype(out.dtype, op, [&]<class T>() {
    fill_elements<T>(out, read_strided<T>{x.as<const T>() + first, index});
  });
}

/// Output element `i` of a gather, seen as (outer, gathered, inner): row `indices[j]`
/// of the input seen as (outer, dim, inner).
template <class T>
struct gather_element {
  const T* x;
  const void* indices;
  bool wide_indices;  // int64 rather than int32; uniform across threads, so no divergence
  std::int64_t gathered, dim, inner;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t r = i % inner, rest = i / inner, j = rest % gathered, o = rest / gathered;
    const std::int64_t row = wide_indices ? static_cast<const std::int64_t*>(indices)[j]
                                          : std::int64_t(static_cast<const std::int32_t*>(indices)[j]);
    return x[(o * dim + row) * inner + r];
  }
};

/// Output element `i` of an unsorted_segment_sum, seen as (outer, segment, inner):
/// the sum, in order, of the data rows (outer, order[k], inner) for k from
/// starts[segment] to starts[segment + 1], the rows of that segment.
template <class T>
struct segment_sum_element {
  const T* data;
  const std::int64_t* order;   // data's row numbers sorted stably by segment id
  const std::int64_t* starts;  // segments + 1 positions in `order`
  std::int64_t rows, segments, inner;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t r = i % inner, rest = i / inner, s = rest % segments, o = rest / segments;
    T sum = T(0);
    for (std::int64_t k = starts[s]; k < starts[s + 1]; ++k) sum = math::add(sum, data[(o * rows + order[k]) * inner + r]);
    return sum;
  }
};

/// Where element `j` of a block `columns` wide lands in a matrix `width` wide, the
/// block starting at column `first_column`.
struct block_position {
  std::int64_t columns, width, first_column;
  KILN_HOST_DEVICE std::int64_t operator()(std::int64_t j) const {
    return (j / columns) * width + first_column + j % columns;
  }
};

/// Copies input k, `lengths[k]` long along the joined axis, into its block of
/// columns of `out`; `inner` is the product of the output's dims after the axis.
inline void join(std::string_view op, std::span<const buffer_view> in, std::span<const std::int64_t> lengths,
                 std::int64_t inner, const buffer_view& out) {
  std::int64_t total = 0;
  for (std::int64_t n : lengths) total += n;
  visit_device_dtype(out.dtype, op, [&]<class T>() {
    std::int64_t first_column = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const std::int64_t columns = lengths[k] * inner, n = in[k].size();
      if (n > 0) {
        auto positions = ::thrust::make_transform_iterator(::thrust::counting_iterator<std::int64_t>(0),
                                                           block_position{columns, total * inner, first_column});
        ::thrust::copy_n(::thrust::device, in[k].as<const T>(), n, ::thrust::make_permutation_iterator(out.as<T>(), positions));
      }
      first_column += columns;
    }
  });
}

/// The product of dims [from, to) of `s`.
inline std::int64_t dims_product(const shape& s, int from, int to) {
  std::int64_t n = 1;
  for (int d = from; d < to; ++d) n *= s[d];
  return n;
}

}  // namespace thrust_kernels

template <class = void>
void compute(thrust_backend, const ops::transpose& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int_list perm = op.permutation(xs.rank());
  const auto x_strides = row_major_strides(xs);
  std::array<std::int64_t, max_rank> strides{};
  for (int d = 0; d < xs.rank(); ++d) strides[d] = x_strides[perm[d]];
  thrust_kernels::copy_strided(ops::transpose::name, in[0], 0, strides, out);
}

template <class = void>
void compute(thrust_backend, const ops::slice& op, std::span<const buffer_view> in, const buffer_view& out) {
  const auto strides = row_major_strides(in[0].shape);
  std::int64_t first = 0;
  for (int d = 0; d < in[0].shape.rank(); ++d) first += op.begin[d] * strides[d];
  thrust_kernels::copy_strided(ops::slice::name, in[0], first, strides, out);
}

template <class = void>
void compute(thrust_backend, const ops::gather& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int a = ops::normalize_axis(op.axis, xs.rank());
  thrust_kernels::visit_device_dtype(out.dtype, ops::gather::name, [&]<class T>() {
    const thrust_kernels::gather_element<T> element{in[0].as<const T>(), in[1].data, in[1].dtype == int64, in[1].size(),
                                                    xs[a], thrust_kernels::dims_product(xs, a + 1, xs.rank())};
    thrust_kernels::fill_elements<T>(out, element);
  });
}

template <class = void>
void compute(thrust_backend, const ops::unsorted_segment_sum& op, std::span<const buffer_view> in,
             const buffer_view& out) {
  const shape& ds = in[0].shape;
  const int ids_end = int(op.axis) + in[1].shape.rank();
  const std::int64_t rows = in[1].size();
  // Each output element sums its segment's rows: the row numbers sorted stably by id,
  // and where each segment starts among them (negative ids sort first, before segment 0).
  ::thrust::device_vector<std::int64_t> ids(static_cast<std::size_t>(rows)), order(static_cast<std::size_t>(rows)),
      starts(static_cast<std::size_t>(op.num_segments + 1));
  // (Raw pointers: the vectors' own iterators write through device references, which
  // bind a null execution policy on host systems.)
  std::int64_t *id = ::thrust::raw_pointer_cast(ids.data()), *row = ::thrust::raw_pointer_cast(order.data()),
               *start = ::thrust::raw_pointer_cast(starts.data());
  if (in[1].dtype == int64)
    ::thrust::copy_n(::thrust::device, in[1].as<const std::int64_t>(), rows, id);
  else
    ::thrust::copy_n(::thrust::device, in[1].as<const std::int32_t>(), rows, id);
  ::thrust::sequence(::thrust::device, row, row + rows);
#if KILN_THRUST_CUDA
  ::thrust::stable_sort_by_key(::thrust::device, id, id + rows, row);
#else
  // A host system's device memory is host memory: std::stable_sort, as thrust's sort
  // binds a null execution policy in its buffers there.
  std::stable_sort(row, row + rows, [id](std::int64_t a, std::int64_t b) { return id[a] < id[b]; });
  std::stable_sort(id, id + rows);
#endif
  const ::thrust::counting_iterator<std::int64_t> segment(0);
  ::thrust::lower_bound(::thrust::device, id, id + rows, segment, segment + op.num_segments + 1, start);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    const thrust_kernels::segment_sum_element<T> element{in[0].as<const T>(), row, start, rows, op.num_segments,
                                                         thrust_kernels::dims_product(ds, ids_end, ds.rank())};
    thrust_kernels::fill_elements<T>(out, element);
  });
}

template <class = void>
void compute(thrust_backend, const ops::concat& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  detail::small_vector<std::int64_t, 8> lengths;
  for (const buffer_view& v : in) lengths.emplace_back(v.shape[a]);
  thrust_kernels::join(ops::concat::name, in, lengths,
                       thrust_kernels::dims_product(out.shape, a + 1, out.shape.rank()), out);
}

template <class = void>
void compute(thrust_backend, const ops::stack& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  detail::small_vector<std::int64_t, 8> lengths;  // each input is one slice along the new axis
  for (std::size_t k = 0; k < in.size(); ++k) lengths.emplace_back(1);
  thrust_kernels::join(ops::stack::name, in, lengths, thrust_kernels::dims_product(out.shape, a + 1, out.shape.rank()),
                       out);
}

}  // namespace kiln::backend
// ----- end kiln/backend/thrust/shape_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_SHAPE_OPS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_LINALG_HPP
#define KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_LINALG_HPP
// ----- begin kiln/backend/thrust/linalg.hpp -----
/// \file
/// Thrust matmul and conv2d: one `thrust::transform` over the output's elements,
/// each thread computing one dot product in the same order as the reference.
/// Neighbouring threads compute neighbouring output columns, so their reads of the
/// right operand (or of the filters) are neighbouring too. Correct and simple;
/// tiled shared-memory kernels or cuBLAS are the way to GPU peak.

#include <cstdint>
#include <span>
#include <type_traits>


namespace kiln::backend {
namespace thrust_kernels {

/// Element `i` of a (batched) matrix product.
template <class T>
struct matmul_element {
  const T* a;
  const T* b;
  ops::matmul_geometry geometry;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t m = geometry.m, n = geometry.n, k = geometry.k;
    const std::int64_t batch = i / (m * n), row = i / n % m, column = i % n;
    const auto [a_offset, b_offset] = geometry.operand_offsets(batch);
    const T* a_row = a + a_offset + row * k;
    const T* b_column = b + b_offset + column;
    T acc = T(0);
    for (std::int64_t p = 0; p < k; ++p) acc = math::add(acc, math::mul(a_row[p], b_column[p * n]));
    return acc;
  }
};

/// Element `i` of an NHWC convolution with HWIO filters; taps outside the input
/// are the zero padding and are skipped.
template <class T>
struct conv2d_element {
  const T* x;
  const T* filters;
  std::int64_t height, width, channels;              // input
  std::int64_t filter_height, filter_width;          // filters
  std::int64_t out_height, out_width, out_channels;  // output
  std::int64_t stride_h, stride_w, pad_h, pad_w;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t co = i % out_channels, ox = i / out_channels % out_width;
    const std::int64_t oy = i / (out_channels * out_width) % out_height, b = i / (out_channels * out_width * out_height);
    T acc = T(0);
    for (std::int64_t fy = 0; fy < filter_height; ++fy) {
      const std::int64_t iy = oy * stride_h + fy - pad_h;
      if (iy < 0 || iy >= height) continue;
      for (std::int64_t fx = 0; fx < filter_width; ++fx) {
        const std::int64_t ix = ox * stride_w + fx - pad_w;
        if (ix < 0 || ix >= width) continue;
        const T* pixel = x + ((b * height + iy) * width + ix) * channels;
        const T* taps = filters + (fy * filter_width + fx) * channels * out_channels + co;
        for (std::int64_t ci = 0; ci < channels; ++ci) acc = math::add(acc, math::mul(pixel[ci], taps[ci * out_channels]));
      }
    }
    return acc;
  }
};

}  // namespace thrust_kernels

template <class = void>
void compute(thrust_backend, const ops::matmul&, std::span<const buffer_view> in, const buffer_view& out) {
  const ops::matmul_geometry geometry(in[0].shape, in[1].shape, out.shape);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::matmul_element<T>{in[0].as<const T>(), in[1].as<const T>(), geometry});
  });
}

template <class = void>
void compute(thrust_backend, const ops::conv2d& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &fs = in[1].shape, &os = out.shape;
  const std::int64_t pad_h = ops::conv_output_dim(xs[1], fs[0], op.stride_h, op.pad).pad_before;
  const std::int64_t pad_w = ops::conv_output_dim(xs[2], fs[1], op.stride_w, op.pad).pad_before;
  ops::visit_numeric(out.dtype, [&]<class T>() {
    thrust_kernels::fill_elements<T>(out, thrust_kernels::conv2d_element<T>{in[0].as<const T>(), in[1].as<const T>(),
                                                                            xs[1], xs[2], xs[3], fs[0], fs[1], os[1], os[2],
                                                                            os[3], op.stride_h, op.stride_w, pad_h, pad_w});
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/thrust/linalg.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_BACKEND_THRUST_LINALG_HPP
#endif

#ifndef KILN_SINGLE_INCLUDE_KILN_EAGER_APPLY_HPP
#define KILN_SINGLE_INCLUDE_KILN_EAGER_APPLY_HPP
// ----- begin kiln/eager/apply.hpp -----
/// \file
/// Eager execution of one op: check the inputs against the op's dtype and shape
/// rules (raising the contract's errors with both sides in the message), allocate
/// the result on the inputs' device and run the device's backend kernel.

#include <atomic>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EAGER_CHECK_NUMERICS_HPP
#define KILN_SINGLE_INCLUDE_KILN_EAGER_CHECK_NUMERICS_HPP
// ----- begin kiln/eager/check_numerics.hpp -----
/// \file
/// `kiln::debugging::enable_check_numerics()`: while on, every op's float result is
/// scanned and the first op that produces a NaN or an Inf raises
/// kiln::invalid_argument_error naming it, eagerly and in graphs (which then run
/// node by node so that the op can be named). A debugging mode: each check reads
/// the whole result once more.

#include <atomic>
#include <cmath>
#include <string>
#include <string_view>


namespace kiln {
namespace detail {
/// Raises kiln::invalid_argument_error when the float tensor `result` of op `op`
/// holds a NaN or an Inf; `node` names the graph node, empty for an eager op.
inline void check_numerics(std::string_view op, const tensor& result, std::string_view node = {}) {
  if (!is_floating(result.dtype()) || !result.defined() || result.is_symbolic() || result.size() == 0) return;
  const tensor host = result.to(kiln::device::cpu);
  bool nan = false, inf = false;
  auto scan = [&]<class T>(const T* p) {
    for (std::int64_t i = 0, n = host.size(); i < n && !nan; ++i) {
      nan = nan || std::isnan(p[i]);
      inf = inf || std::isinf(p[i]);
    }
  };
  if (result.dtype() == float32)
    scan(host.data<float>());
  else
    scan(host.data<double>());
  if (!nan && !inf) return;
  std::string where = "op " + std::string(op);
  if (!node.empty()) where += " (node " + std::string(node) + ")";
  throw invalid_argument_error("check_numerics: " + where + " produced " + (nan ? "NaN" : "Inf") + " in its " +
                               std::string(name(result.dtype())) + " " + result.shape().str() + " result");
}

/// check_numerics while enable_check_numerics() is in effect, else null: every eager
/// op reaches the check through this pointer, so that a program that never enables
/// it compiles none of it.
using numerics_check = void (*)(std::string_view op, const tensor& result, std::string_view node);
inline std::atomic<numerics_check>& numerics_check_hook() {
  static std::atomic<numerics_check> hook{nullptr};
  return hook;
}
}  // namespace detail

namespace debugging {
/// From now on, every op checks its float results and raises
/// kiln::invalid_argument_error naming the first op that produces a NaN or an Inf.
/// \code
/// kiln::debugging::enable_check_numerics();
/// kiln::log(kiln::constant(0.f));  // throws: "check_numerics: op log produced Inf ..."
/// \endcode
inline void enable_check_numerics() { detail::numerics_check_hook() = &detail::check_numerics; }
/// Turns the checks of enable_check_numerics() off again.
/// \code kiln::debugging::disable_check_numerics(); \endcode
inline void disable_check_numerics() { detail::numerics_check_hook() = nullptr; }
/// Whether enable_check_numerics() is in effect.
/// \code kiln::debugging::check_numerics_enabled() == false  // unless enabled \endcode
inline bool check_numerics_enabled() { return detail::numerics_check_hook().load(std::memory_order_relaxed) != nullptr; }
}  // namespace debugging

}  // namespace kiln
// ----- end kiln/eager/check_numerics.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EAGER_CHECK_NUMERICS_HPP

namespace kiln {
namespace detail {

/// "int32 (2, 3), float32 (3,)": the inputs as an error message shows them.
KILN_COLD inline std::string describe_inputs(std::span<const tensor* const> in) {
  std::string s;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    s += name(in[i]->dtype());
    s += ' ';
    s += in[i]->shape().str();
  }
  return s;
}

// The errors of the checks below, out of line: every file that runs an op eagerly
// compiles these checks, and an inline message costs a temporary and its cleanup per
// piece.

/// `E` saying "op: what; got <the inputs>".
template <class E>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_with_inputs(std::string_view op, std::string_view what,
                                                            std::span<const tensor* const> in) {
  std::string text(op);
  text += ": ";
  text += what;
  text += "; got ";
  text += describe_inputs(in);
  throw E(text);
}

[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_empty_input(std::string_view op, std::size_t i) {
  throw invalid_argument_error(std::string(op) + ": input " + std::to_string(i) + " is an empty tensor");
}

[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_no_kernel(std::string_view op, std::string_view where) {
  throw unavailable_error(std::string(op) + ": " + std::string(where));
}

[[noreturn]] KILN_COLD KILN_NOINLINE inline void throw_mixed_devices(std::string_view op, kiln::device a, kiln::device b) {
  throw invalid_argument_error(std::string(op) + ": inputs are on different devices (" + std::string(name(a)) + " and " +
                               std::string(name(b)) + ")");
}

/// The dtypes and shapes of an op's inputs, or the error for an empty input.
struct input_types {
  small_vector<dtype, 4> dtypes;
  small_vector<shape, 4> shapes;

  input_types(std::string_view op, std::span<const tensor* const> in) {
    dtypes.reserve(in.size());
    shapes.reserve(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!in[i]->defined()) throw_empty_input(op, i);
      dtypes.emplace_back(in[i]->dtype());
      shapes.emplace_back(in[i]->shape());
    }
  }
};

/// An op's dtype and shape rules behind pointers, so that what checks an op's inputs
/// around them (infer) is compiled once rather than once per op; and, for an op that
/// has attributes the inputs do not show (`perm=[1, 0]`), their text for its errors.
struct op_rules {
  dtype_result (*result_dtype)(const void* op, std::span<const dtype> in);
  shape_result (*result_shape)(const void* op, std::span<const shape> in);
  std::string (*attributes)(const void* op);  ///< null for an op without
};
template <class Op>
inline constexpr op_rules rules_of{
    [](const void* op, std::span<const dtype> in) { return static_cast<const Op*>(op)->result_dtype(in); },
    [](const void* op, std::span<const shape> in) { return static_cast<const Op*>(op)->result_shape(in); },
    [] {
      if constexpr (requires(const Op& o) { o.attributes(); })
        return +[](const void* op) { return static_cast<const Op*>(op)->attributes(); };
      else
        return static_cast<std::string (*)(const void*)>(nullptr);
    }()};

/// The error of op `op` (named `op_name`) whose rule rejected `in` for the reason
/// `what`, as `mode` says (`E` while tracing), naming the inputs and the op's attributes.
template <class E>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_rule_error(rule_errors mode, std::string_view op_name, std::string_view what,
                                                          std::span<const tensor* const> in, const void* op,
                                                          const op_rules& rules) {
  std::string text(op_name);
  text += ": ";
  text += what;
  text += "; got ";
  text += describe_inputs(in);
  if (rules.attributes) {
    const std::string attributes = rules.attributes(op);
    if (!attributes.empty()) text += " with " + attributes;
  }
  throw_operand_error<E>(mode, text);
}

/// The dtype and shape the op `op` named `op_name` gives for `inputs` by `rules`, or
/// the contract's error for `mode`.
template <class = void>
std::pair<dtype, shape> infer_by_rules(std::string_view op_name, const void* op, const op_rules& rules,
                                       std::span<const tensor* const> in, rule_errors mode) {
  const input_types types(op_name, in);
  const dtype_result dt = rules.result_dtype(op, types.dtypes);
  if (!dt.ok()) throw_rule_error<type_error>(mode, op_name, dt.failure, in, op, rules);
  const shape_result sh = [&] {
    try {
      return rules.result_shape(op, types.shapes);
    } catch (const value_error& e) {  // a result that kiln::shape refuses: too many elements
      throw_rule_error<value_error>(mode, op_name, e.what(), in, op, rules);
    }
  }();
  if (!sh.ok()) throw_rule_error<value_error>(mode, op_name, sh.failure, in, op, rules);
  if (!sh.value.count_fits())
    throw_rule_error<value_error>(mode, op_name, "the result shape " + sh.value.str() + " has more elements than an int64 can count",
                                  in, op, rules);
  return {dt.value, sh.value};
}

/// The dtype and shape `op` gives for `inputs`, or the contract's error for `mode`
/// (running it, or recording it into a trace).
template <class Op>
std::pair<dtype, shape> infer(const Op& op, std::span<const tensor* const> in, rule_errors mode = rule_errors::run) {
  return infer_by_rules(Op::name, &op, rules_of<Op>, in, mode);
}

/// The device all of an op's inputs are on (the CPU for none), or the error for
/// inputs that are symbolic or on different devices.
inline kiln::device input_device(std::string_view op, std::span<const tensor* const> in) {
  const kiln::device dev = in.empty() ? kiln::device::cpu : in[0]->device();
  for (const tensor* t : in) {
    t->require_value(op);
    if (t->device() != dev) throw_mixed_devices(op, dev, t->device());
  }
  return dev;
}

/// A backend kernel behind a function pointer: writes `op`'s result for `in` to `out`.
using kernel_call = void (*)(const void* op, std::span<const buffer_view> in, const buffer_view& out);

/// Backend `B`'s kernel of `Op` (on the CPU, of the dtypes `Only`) as a kernel_call:
/// the one function that eager runs and plans (kiln/exec/tile.hpp) both call.
template <class B, class Op, dtype_set Only = dtypes::all>
void backend_kernel(const void* op, std::span<const buffer_view> in, const buffer_view& out) {
  if constexpr (!KILN_DEVICE_PASS || !std::is_same_v<B, backend::cpu_backend>)
    backend::compute_with<Only>(B{}, *static_cast<const Op*>(op), in, out);
}

/// Runs `kernel` on `in` into `out`, already allocated, when `out` has elements.
inline void run_kernel_into(std::span<const tensor* const> in, tensor& out, kernel_call kernel, const void* op) {
  if (out.size() == 0) return;
  small_vector<buffer_view, 4> views;
  views.reserve(in.size());
  for (const tensor* t : in) views.emplace_back(t->view());
  kernel(op, std::span<const buffer_view>(views), out.view());
}

/// Allocates op `op_name`'s `dt` `sh` result on `dev` and runs `kernel` into it, so
/// that what every op does around its kernel is compiled once.
inline tensor run_kernel(std::string_view op_name, dtype dt, const shape& sh, kiln::device dev,
                         std::span<const tensor* const> in, kernel_call kernel, const void* op) {
  tensor out = allocate_result(op_name, dt, sh, dev);
  run_kernel_into(in, out, kernel, op);
  return out;
}

/// Whether `Op` makes its eager result itself instead of running a kernel: reshape and
/// x[i] re-describe their input's buffer, set_item, pad_rows and crop_or_pad run other ops.
template <class Op>
concept evaluated = requires(const Op& op, std::span<const tensor* const> in) { op.evaluate(in); };

/// Runs `op` on eager `inputs` with backend `B` (on the device the inputs are on),
/// with the CPU kernels of the dtypes `Only` (an elementwise op's; see
/// apply_bookkeeping). Not `inline`: kiln/kernels.hpp can compile it once per program.
template <class B, class Op, dtype_set Only = dtypes::all>
tensor run_on(const Op& op, std::span<const tensor* const> in) {
  auto [dt, sh] = infer(op, in);
  const kiln::device dev = input_device(Op::name, in);
  // An op whose values can be wrong for its kernel (an index out of range, an
  // integer division by zero) provides `check_values`, found by argument-dependent lookup.
  if constexpr (requires { check_values(op, in); }) check_values(op, in);
  if constexpr (evaluated<Op>) {
    return op.evaluate(in);
  } else if constexpr (!backend::supports<B, Op>) {
    // Reached only through kiln/kernels.hpp, which instantiates every op on every backend.
    throw_no_kernel(Op::name, "the " + std::string(B::name) + " backend has no kernel for it");
  } else {
    return run_kernel(Op::name, dt, sh, dev, in, &backend_kernel<B, Op, Only>, &op);
  }
}

/// Runs `op` on eager `inputs` with the backend of the device they are on.
template <class Op, dtype_set Only>
tensor execute(const Op& op, std::span<const tensor* const> in) {
  if (!in.empty() && in[0]->device() == kiln::device::gpu) {
#if KILN_HAS_THRUST
    if constexpr (backend::supports<backend::thrust_backend, Op> || evaluated<Op>)
      return run_on<backend::thrust_backend>(op, in);
#endif
    throw_no_kernel(Op::name, "no GPU kernel in this build");
  }
  return run_on<backend::cpu_backend, Op, Only>(op, in);
}

/// How many gradient tapes record on this thread (kiln/autodiff/tape.hpp).
inline int& recording_tapes() {
  thread_local int count = 0;
  return count;
}

/// How reads of a kiln::variable reach the gradient tapes of their thread, which
/// watch them as TensorFlow's tapes watch trainable variables: a function set when the
/// first tape is made (kiln/autodiff/tape.hpp), called with the variable's identity
/// and the value read.
using variable_read_recorder = void (*)(const void* variable, const tensor& value);
inline std::atomic<variable_read_recorder>& variable_read_hook() {
  static std::atomic<variable_read_recorder> hook{nullptr};
  return hook;
}

/// Records an op on the gradient tapes of this thread, which may replace `out` by a
/// copy (detail::unaliased_for_tapes, kiln/autodiff/tape.hpp); defined with the kernel
/// table, kiln/exec/kernel_table.hpp.
template <class Op>
void record_on_tapes(const Op& op, std::span<const tensor* const> in, tensor& out);

/// True when an op on `in` is recorded rather than run: while tracing, or when an
/// input is symbolic.
inline bool records_symbolically(std::span<const tensor* const> in) {
  bool symbolic = tracing();
  for (const tensor* t : in) symbolic = symbolic || t->is_symbolic();
  return symbolic;
}

template <class Op, dtype_set Only>
tensor apply_span(const Op& op, std::span<const tensor* const> in) {
  // Checked first, and the rest left out for such an op, so that this is the error,
  // rather than pages from ops::any_op's constructor.
  static_assert(ops::registered<Op>,
                "kiln: this op has no row in the op registry: add F(<op>) to its family's list in kiln/ops/registry.hpp");
  if constexpr (ops::registered<Op>) {
    register_kernels_on_use<Op, Only>();
    // Inside a trace every op is recorded, eager inputs or not, as TensorFlow records
    // ops on constants: folding them is the optimizer's pass, which leaves an op that
    // fails in the graph, to fail only if it runs (non-strict execution).
    const bool symbolic = records_symbolically(in);
    tensor out = symbolic ? record_symbolic(op, in) : execute<Op, Only>(op, in);
    if (!symbolic)
      if (const numerics_check check = numerics_check_hook().load(std::memory_order_relaxed)) check(Op::name, out, {});
    // Tapes record symbolic ops too: a tape inside a kiln::function differentiates the
    // trace, its backward pass joining the same graph.
    if (recording_tapes() > 0) record_on_tapes(op, in, out);
    return out;
  } else {
    return {};
  }
}

}  // namespace detail
}  // namespace kiln
// ----- end kiln/eager/apply.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EAGER_APPLY_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EAGER_TRUTH_VALUE_HPP
#define KILN_SINGLE_INCLUDE_KILN_EAGER_TRUTH_VALUE_HPP
// ----- begin kiln/eager/truth_value.hpp -----
/// \file
/// `kiln::tensor::operator bool`: the truth value of an eager tensor, as Python's
/// `bool(t)` gives it for an eager `tf.Tensor`, and the error that tells a C++ `if`
/// on a symbolic tensor apart from a graph condition.

#include <string>
#include <type_traits>


namespace kiln {

/// The truth of a one-element tensor: a bool's value, a number other than zero, a
/// string that is not empty. A symbolic tensor has no value to test: a C++ `if` or
/// `while` on one raises kiln::type_error pointing to kiln::cond and kiln::while_loop;
/// more than one element (or none) raises kiln::value_error.
/// \code if (kiln::constant(3) > 2) std::cout << "more\n";  // eager: reads the value \endcode
inline tensor::operator bool() const {
  if (is_symbolic())
    throw type_error(
        "using a symbolic tensor as a C++ bool is not allowed: a C++ if or while runs once, while tracing; use "
        "kiln::cond or kiln::while_loop for a condition on a tensor inside a kiln::function");
  require_value("operator bool");
  if (size() != 1)
    throw value_error(std::string(size() == 0 ? "the truth value of an empty tensor is ambiguous"
                                              : "the truth value of a tensor with more than one element is ambiguous") +
                      "; got shape " + shape().str());
  const tensor host = device() == kiln::device::cpu ? *this : to(kiln::device::cpu);
  return visit_dtype(dtype(), [&]<class T>() {
    const T& value = *host.data<T>();
    if constexpr (std::is_same_v<T, std::string>)
      return !value.empty();
    else
      return value != T(0);  // NaN is true, as in C++ and Python
  });
}

}  // namespace kiln
// ----- end kiln/eager/truth_value.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EAGER_TRUTH_VALUE_HPP

#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_FIXED_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_FIXED_HPP
// ----- begin kiln/typed/fixed.hpp -----
/// \file
/// `kiln::fixed<T, Dims...>`: a tensor whose element type and shape are part of its
/// type, the values of the compile-time tier (API.md section 1). It owns its data,
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

#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_SPEC_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_SPEC_HPP
// ----- begin kiln/trace/spec.hpp -----
/// \file
/// `kiln::tensor_spec`: an argument described by dtype and (possibly partial) shape.

#include <ostream>
#include <sstream>
#include <string>
#include <vector>


namespace kiln {

namespace detail {
/// "float32 Tensor, shape=(2, 3)": a value of dtype `t` and shape `s` as a function's
/// signature shows it.
KILN_COLD inline std::string signature_entry(dtype t, const shape& s) {
  std::string text(name(t));
  text += " Tensor, shape=";
  text += s.str();
  return text;
}
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
  bool accepts(kiln::dtype t, const kiln::shape& s) const { return t == dtype && shape.accepts(s); }
  bool operator==(const tensor_spec&) const = default;

  /// TensorFlow's text: `TensorSpec(shape=(None,), dtype=tf.int32, name=None)`.
  std::string str() const {
    return "TensorSpec(shape=" + shape.str() + ", dtype=tf." + std::string(kiln::name(dtype)) +
           ", name=" + (name.empty() ? std::string("None") : "'" + name + "'") + ")";
  }
};

inline std::ostream& operator<<(std::ostream& os, const tensor_spec& s) { return os << s.str(); }

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
  void leaf() { text += "<" + std::to_string(++leaves) + ">"; }
  /// A tuple `(`, or a list `[`.
  void open(bool list) { text += list ? '[' : '('; }
  void next() { text += ", "; }
  /// Closes what open() opened, around `count` elements (a tuple of one is `(<1>,)`).
  void close(bool list, std::size_t count) {
    if (!list && count == 1) text += ',';
    text += list ? ']' : ')';
  }
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
  std::string header() const {
    std::string s = name + "(";
    for (std::size_t i = 0; i < arg_names.size(); ++i) {
      if (i) s += ", ";
      s += arg_names[i];
      if (i < bound_text.size() && !bound_text[i].empty()) s += "=" + bound_text[i];
    }
    return s + ")";
  }
  /// The header with the Args/Returns block, as TensorFlow prints a signature; a
  /// structure is shown with a line per leaf below it.
  std::string signature_text() const {
    std::ostringstream os;
    os << header() << "\n";
    if (!inputs.empty()) os << "  Args:\n";
    auto input_entry = [&](std::size_t k) {
      return k < input_text.size() && !input_text[k].empty() ? input_text[k] : signature_entry(inputs[k].dtype, inputs[k].shape);
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
        for (std::size_t j = 0; j < leaves.size(); ++j) os << "      <" << j + 1 << ">: " << input_entry(leaves[j]) << "\n";
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
};
}  // namespace detail

}  // namespace kiln
// ----- end kiln/trace/spec.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_SPEC_HPP

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
template <class X>
struct is_fixed : std::false_type {};
template <class T, std::int64_t... D>
struct is_fixed<fixed<T, D...>> : std::true_type {};
/// Whether `X` (without cv or reference) is a `kiln::fixed`.
template <class X>
concept fixed_value = is_fixed<std::remove_cvref_t<X>>::value;

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
  /// of its results.
  virtual std::vector<int> effect(std::string_view name, bool writes, std::vector<int> inputs,
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
};

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


namespace kiln {
namespace typed {

/// A symbolic value or expression of the compile-time tier.
template <class X>
concept lazy = std::derived_from<std::remove_cvref_t<X>, typed_expression>;

/// What typed ops take: `fixed` values, symbolic values and expressions.
template <class X>
concept operand = fixed_value<X> || lazy<X>;

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

KILN_TYPED_UNARY(negative, negate)
KILN_TYPED_UNARY(abs, abs)
KILN_TYPED_UNARY(exp, exp)
KILN_TYPED_UNARY(log, log)
KILN_TYPED_UNARY(sqrt, sqrt)
KILN_TYPED_UNARY(square, square)
KILN_TYPED_UNARY(tanh, tanh)
KILN_TYPED_UNARY(sigmoid, sigmoid)
KILN_TYPED_UNARY(relu, relu)
KILN_TYPED_UNARY(logical_not, logical_not)
KILN_TYPED_BINARY(add, add)
KILN_TYPED_BINARY(subtract, subtract)
KILN_TYPED_BINARY(multiply, multiply)
KILN_TYPED_BINARY(divide, divide)
KILN_TYPED_BINARY(floordiv, floordiv)
KILN_TYPED_BINARY(floormod, floormod)
KILN_TYPED_BINARY(pow, pow)
KILN_TYPED_BINARY(maximum, maximum)
KILN_TYPED_BINARY(minimum, minimum)
KILN_TYPED_BINARY(equal, equal)
KILN_TYPED_BINARY(not_equal, not_equal)
KILN_TYPED_BINARY(less, less)
KILN_TYPED_BINARY(less_equal, less_equal)
KILN_TYPED_BINARY(greater, greater)
KILN_TYPED_BINARY(greater_equal, greater_equal)
KILN_TYPED_BINARY(logical_and, logical_and)
KILN_TYPED_BINARY(logical_or, logical_or)
#undef KILN_TYPED_UNARY
#undef KILN_TYPED_BINARY
#undef KILN_TYPED_CHECKS

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
KILN_TYPED_OPERATOR(+, add)
KILN_TYPED_OPERATOR(-, subtract)
KILN_TYPED_OPERATOR(*, multiply)
KILN_TYPED_OPERATOR(/, divide)
KILN_TYPED_OPERATOR(%, floormod)
KILN_TYPED_OPERATOR(==, equal)
KILN_TYPED_OPERATOR(!=, not_equal)
KILN_TYPED_OPERATOR(<, less)
KILN_TYPED_OPERATOR(<=, less_equal)
KILN_TYPED_OPERATOR(>, greater)
KILN_TYPED_OPERATOR(>=, greater_equal)
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


namespace kiln {
namespace detail {
struct function_state;
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

/// What a trace being recorded collects: the slots of its frame (its arguments
/// first) and its steps, in program order.
struct recorder {
  std::vector<std::size_t> slot_bytes;
  std::vector<step> steps;
  std::vector<std::string> argument_names;  ///< as the function's signature names them
  /// Where steps go: the trace's own list, or a branch's or loop body's while it is
  /// traced.
  std::vector<step>* target = &steps;

  int add_slot(std::size_t bytes) {
    slot_bytes.push_back(bytes);
    return int(slot_bytes.size()) - 1;
  }
  void push(step s) { target->push_back(std::move(s)); }
  /// The recorder of the trace in progress on this thread, if any.
  static recorder*& current() {
    thread_local recorder* r = nullptr;
    return r;
  }
};

/// A step that evaluates expression `E` into slot `out`.
template <class E>
struct evaluation {
  evaluation(const E& e, int slot) : expression(e), out(slot) {}
  E expression;
  int out;
  static void run(const void* data, frame f) {
    const auto& self = *static_cast<const evaluation*>(data);
    evaluate(self.expression, f, static_cast<typename E::value_type*>(f[self.out]));
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& self = *static_cast<const evaluation*>(data);
    sink.bind(self.out, self.expression.describe(sink));
  }
};

/// The recorder of the trace in progress, or the error for a symbolic value used
/// outside its trace.
inline recorder& current_recorder() {
  recorder* r = recorder::current();
  if (!r) throw type_error("kiln: a symbolic typed value was used outside the trace that made it; return it from the function instead");
  return *r;
}

/// Records a step writing `e` to slot `slot`.
template <class E>
void record_into(const E& e, int slot) {
  current_recorder().push(step_of(std::make_unique<const evaluation<E>>(e, slot)));  // the one copy of `e`
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
/// (defined with the function state, kiln/trace/function.hpp).
template <class = void>
detail::trace_signature written(const detail::function_state& state, const recorded_signature& s);

// ---- results -----------------------------------------------------------------------

/// What a call returns for the traced result `R`: `fixed` values for expressions, in
/// the same structure.
template <class R>
struct output {
  using type = R;  // C++ values and `fixed` constants come back as they are
};
template <lazy R>
struct output<R> {
  using type = fixed_t<typename R::value_type, typename R::dims_type>;
};
template <class... R>
struct output<std::tuple<R...>> {
  using type = std::tuple<typename output<R>::type...>;
};
template <class A, class B>
struct output<std::pair<A, B>> {
  using type = std::pair<typename output<A>::type, typename output<B>::type>;
};
template <class R>
using output_t = typename output<std::remove_cvref_t<R>>::type;

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
  /// The signature in the seeds' format, without a newline at the end, as
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
inline std::size_t next_signature_index() {
  static std::atomic<std::size_t> next{0};
  return next++;
}
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
// ----- end kiln/typed/trace.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_TRACE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_KERNELS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_KERNELS_HPP
// ----- begin kiln/typed/kernels.hpp -----
/// \file
/// Typed ops that end a fused expression: reductions (axes as template arguments),
/// matmul, transpose and reshape. Each runs the CPU backend's kernel for its one
/// element type, so its values are the eager kiln::tensor's bits, and its result's
/// type comes from the op's constexpr shape rule. On `fixed` values an op computes
/// at once; in a typed trace it is a step that reads its operands' slots (an
/// operand expression is evaluated into a slot first) and writes a new one.

#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>


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
// ----- end kiln/typed/kernels.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_KERNELS_HPP

#ifndef KILN_SINGLE_INCLUDE_KILN_GRAPH_GRAPH_HPP
#define KILN_SINGLE_INCLUDE_KILN_GRAPH_GRAPH_HPP
// ----- begin kiln/graph/graph.hpp -----
/// \file
/// `kiln::graph`: the runtime IR a trace produces. A graph is a list of nodes in
/// execution order; each node is a placeholder (an argument), a constant (a value
/// captured at trace time), an op of the registry, a special op (a variable read or
/// write, a print, a host callback, a conditional, a loop: kiln/exec/effects.hpp and
/// kiln/exec/control_flow.hpp), or the Identity that marks an output. A special op
/// with several results is followed by one `Result` node per result after the first.
/// Nodes refer to their inputs by index; names are unique within a graph and are
/// what a listing or Graphviz shows.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>


namespace kiln {

namespace ops {

/// Any op of the registry, as a graph node stores it: which op (its position in
/// `all_ops`) and the op, shared by the copies (an op never changes once made).
/// A class of kiln's own rather than a std::variant of the registry: libstdc++'s
/// variant instantiates its storage and special members by recursion over every
/// alternative, which every source file that includes kiln paid. Read it with
/// ops::holds_alternative, `unchecked` and ops::visit.
/// \code
/// kiln::ops::any_op op = kiln::ops::add{};
/// assert(kiln::ops::holds_alternative<kiln::ops::add>(op) && kiln::ops::name_of(op) == "add");
/// \endcode
class any_op {
 public:
  /// How many ops the registry has.
  static constexpr std::size_t size = boost::mp11::mp_size<all_ops>::value;
  /// The position of op type `Op`.
  template <class Op>
  static constexpr std::size_t position_of = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    std::size_t i = 0;
    (void)((std::is_same_v<Op, Ops> ? false : (++i, true)) && ...);
    return i;
  }(static_cast<all_ops*>(nullptr));

  /// Holds no op (index() is `size`); what a node that is not a registry op keeps.
  any_op() = default;
  template <class Op>
    requires registered<Op>
  any_op(Op op) : box_(new box<Op>(std::move(op))), index_(position_of<Op>) {}
  template <class Op>
  any_op(std::in_place_type_t<Op>, Op op) : any_op(std::move(op)) {}
  any_op(const any_op& other) noexcept : box_(other.box_), index_(other.index_) {
    if (box_) box_->references.fetch_add(1, std::memory_order_relaxed);
  }
  any_op(any_op&& other) noexcept : box_(std::exchange(other.box_, nullptr)), index_(std::exchange(other.index_, size)) {}
  any_op& operator=(any_op other) noexcept {
    std::swap(box_, other.box_);
    std::swap(index_, other.index_);
    return *this;
  }
  ~any_op() {
    if (box_ && box_->references.fetch_sub(1, std::memory_order_acq_rel) == 1) box_->destroy(box_);
  }

  /// The position of the op held in `all_ops`.
  std::size_t index() const { return index_; }
  /// The op held, which must be an `Op`.
  template <class Op>
  const Op& unchecked() const {
    return static_cast<const box<Op>*>(box_)->op;
  }
  /// The address of the op held (null for none), for code that reaches the op
  /// through its type-erased rules (detail::op_rules) rather than its type.
  const void* address() const { return box_ ? box_->op : nullptr; }

 private:
  struct box_base {
    std::atomic<std::size_t> references{1};
    void (*destroy)(box_base*);
    const void* op;  ///< the derived box's op
  };
  template <class Op>
  struct box : box_base {
    explicit box(Op o) : box_base{{1}, [](box_base* b) { delete static_cast<box*>(b); }, &op}, op(std::move(o)) {}
    Op op;
  };
  box_base* box_ = nullptr;
  std::size_t index_ = size;
};

/// Whether `op` holds an `Op`.
template <class Op>
bool holds_alternative(const any_op& op) {
  return op.index() == any_op::position_of<Op>;
}

/// `f(the op that op holds)`, as std::visit, through one table of function pointers
/// per visitor type.
/// \code kiln::ops::visit([](const auto& o) { return o.name; }, kiln::ops::any_op(kiln::ops::add{})) == "add" \endcode
template <class F>
decltype(auto) visit(F&& f, const any_op& op) {
  return []<class... Ops>(F& g, const any_op& o, boost::mp11::mp_list<Ops...>*) -> decltype(auto) {
    using result = std::invoke_result_t<F&, const boost::mp11::mp_front<all_ops>&>;
    static constexpr result (*table[])(F&, const any_op&) = {
        [](F& h, const any_op& x) -> result { return h(x.unchecked<Ops>()); }...};
    return table[o.index()](g, o);
  }(f, op, static_cast<all_ops*>(nullptr));
}

/// The registry name of the op that `op` holds: `add`, `matmul`; "" when it holds none.
inline std::string_view name_of(const any_op& op) {
  static constexpr auto names = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    return std::array<std::string_view, sizeof...(Ops) + 1>{Ops::name..., ""};
  }(static_cast<all_ops*>(nullptr));
  return names[op.index()];
}

/// ops::value_operand of the op that `op` holds: the operand whose dtype selects its kernel.
inline int value_operand_of(const any_op& op) {
  static constexpr auto operands = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    return std::array<int, sizeof...(Ops)>{value_operand<Ops>...};
  }(static_cast<all_ops*>(nullptr));
  return operands[op.index()];
}

}  // namespace ops

class graph;

/// An op that is not a pure function of its inputs or that runs graphs of its own:
/// variable reads and writes, prints, host callbacks, conditionals and loops. The
/// same object runs eagerly and as a graph node. Effects run in program order and
/// are never pruned, folded or merged.
///
/// A derived op defines `name()`, `has_effects()`, `run(inputs)` (returning a tensor,
/// or a vector of tensors when it has other than one result) and optionally
/// `subgraphs()`, and passes `std::type_identity<itself>` to this base. Calls reach
/// them through a table of function pointers made where the op is constructed, not
/// through virtual functions: a compiler treats every override of a virtual function
/// as reachable wherever the base is used, so each program that ran any graph, or
/// just freed a tensor, would compile the loops, conditionals and datasets too.
class special_op {
 public:
  /// The op as a graph listing shows it: `ReadVariableOp`, `PrintV2`, `cond`, `while`.
  std::string_view name() const { return table_->name(*this); }
  /// True when running it does more than compute its results (a write, a print, a
  /// callback), so that it runs even when no output needs it.
  bool has_effects() const { return table_->has_effects(*this); }
  /// Runs on eager inputs and writes one tensor per result into `results`.
  void run(std::span<const tensor* const> inputs, std::span<tensor> results) const {
    table_->run(*this, inputs, results);
  }
  /// The graphs it runs, labelled (`then`, `else`, `cond`, `body`), for to_dot().
  std::vector<std::pair<std::string, const graph*>> subgraphs() const { return table_->subgraphs(*this); }
  /// This op as an `Op`, or null when it is another kind of special op.
  template <class Op>
  const Op* as() const {
    return table_ == &table_of<Op> ? static_cast<const Op*>(this) : nullptr;
  }

 protected:
  template <class Op>
  explicit special_op(std::type_identity<Op>) : table_(&table_of<Op>) {}
  special_op(const special_op&) = default;
  special_op& operator=(const special_op&) = default;
  // Owners hold the derived type (std::make_shared), so no virtual destructor.
  ~special_op() = default;

 private:
  // An op's run() returns its one result as a tensor, so that no vector is allocated
  // for it, or a vector of its results (empty when it has none).
  static void deliver(tensor result, std::span<tensor> results, const special_op& op) {
    if (results.size() != 1) wrong_count(op, 1, results.size());
    results[0] = std::move(result);
  }
  static void deliver(std::vector<tensor> out, std::span<tensor> results, const special_op& op) {
    if (out.size() != results.size()) wrong_count(op, out.size(), results.size());
    std::move(out.begin(), out.end(), results.begin());
  }
  [[noreturn]] static void wrong_count(const special_op& op, std::size_t gave, std::size_t expected) {
    throw internal_error(std::string(op.name()) + " gave " + std::to_string(gave) + " results instead of " +
                         std::to_string(expected));
  }
  struct operations {
    std::string_view (*name)(const special_op&);
    bool (*has_effects)(const special_op&);
    void (*run)(const special_op&, std::span<const tensor* const>, std::span<tensor>);
    std::vector<std::pair<std::string, const graph*>> (*subgraphs)(const special_op&);
  };
  template <class Op>
  static constexpr operations table_of{
      [](const special_op& op) { return std::string_view(static_cast<const Op&>(op).name()); },
      [](const special_op& op) { return static_cast<const Op&>(op).has_effects(); },
      [](const special_op& op, std::span<const tensor* const> in, std::span<tensor> results) {
        deliver(static_cast<const Op&>(op).run(in), results, op);
      },
      [](const special_op& op) -> std::vector<std::pair<std::string, const graph*>> {
        // (Op's own subgraphs(), not this base's, which would call itself)
        if constexpr (!std::is_same_v<decltype(&Op::subgraphs), decltype(&special_op::subgraphs)>)
          return static_cast<const Op&>(op).subgraphs();
        else
          return {};
      }};
  const operations* table_;
};

/// What a graph node is.
enum class node_kind : unsigned char {
  placeholder,  ///< an argument of the function
  constant,     ///< a value captured while tracing
  op,           ///< an op of the registry
  special,      ///< a special_op; the node's value is its first result
  result,       ///< a further result of the special node just before it
  identity,     ///< an output of the function
};

/// One node of a kiln::graph.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x + 1; });
/// const kiln::graph g = f.get_concrete_function(kiln::constant(1)).graph();
/// for (const kiln::node& n : g.nodes()) std::cout << n.name() << " = " << n.op() << "\n";
/// \endcode
class node {
 public:
  /// Unique within its graph: the argument name, or the op's name with a suffix (`add_1`).
  const std::string& name() const { return name_; }
  /// The op: `Placeholder`, `Const`, `Identity`, `Result`, a special op such as
  /// `cond`, or a registry op such as `add`.
  std::string_view op() const {
    switch (kind_) {
      case node_kind::placeholder: return "Placeholder";
      case node_kind::constant: return "Const";
      case node_kind::identity: return "Identity";
      case node_kind::result: return "Result";
      case node_kind::special: return special_->name();
      default: return ops::name_of(op_);
    }
  }
  /// Names of the nodes whose outputs this node reads, in order.
  const std::vector<std::string>& inputs() const { return input_names_; }
  kiln::dtype dtype() const { return dtype_; }
  /// Possibly partial (`None` dims) when the function accepts several shapes.
  const kiln::shape& shape() const { return shape_; }

  node_kind kind() const { return kind_; }
  /// Indices (into graph::nodes()) of the inputs.
  const std::vector<int>& input_ids() const { return input_ids_; }
  const ops::any_op& operation() const { return op_; }
  /// The captured value of a constant node.
  const tensor& value() const { return value_; }
  /// The op of a special node.
  const special_op& special() const { return *special_; }
  /// How many results a special node has (its own value and the Result nodes after it).
  int result_count() const { return result_count_; }

 private:
  friend class graph;
  std::string name_;
  node_kind kind_ = node_kind::op;
  ops::any_op op_;
  std::vector<int> input_ids_;
  std::vector<std::string> input_names_;
  kiln::dtype dtype_ = float32;
  kiln::shape shape_;
  tensor value_;
  std::shared_ptr<const special_op> special_;
  int result_count_ = 1;
};

/// A traced computation: nodes in execution order, the arguments and the outputs.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x + 1; });
/// auto g = f.get_concrete_function(kiln::constant(1)).graph();
/// for (const auto& n : g.nodes()) std::cout << n.op() << "\n";  // Placeholder, add, Identity
/// \endcode
class graph {
 public:
  const std::vector<node>& nodes() const { return nodes_; }
  /// Node `id` (an index into nodes()).
  const node& node_at(int id) const { return nodes_[std::size_t(id)]; }
  /// Node indices of the placeholders, in argument order.
  const std::vector<int>& arguments() const { return arguments_; }
  /// Node indices of the Identity nodes, in output order.
  const std::vector<int>& outputs() const { return outputs_; }

  int add_placeholder(const std::string& name, kiln::dtype t, const kiln::shape& s) {
    int id = add(node_kind::placeholder, name, {}, t, s);
    arguments_.push_back(id);
    return id;
  }
  int add_constant(const tensor& value) {
    int id = add(node_kind::constant, "Const", {}, value.dtype(), value.shape());
    nodes_[id].value_ = value;
    return id;
  }
  int add_op(const ops::any_op& op, std::vector<int> inputs, kiln::dtype t, const kiln::shape& s) {
    std::string base(ops::name_of(op));
    int id = add(node_kind::op, base, std::move(inputs), t, s);
    nodes_[id].op_ = op;
    return id;
  }
  /// Adds special op `op` with one result per entry of `results`; returns the nodes
  /// that hold them (the special node, then its Result nodes), none when it has no
  /// results (the node then has no value).
  std::vector<int> add_special(std::shared_ptr<const special_op> op, std::vector<int> inputs,
                               const std::vector<std::pair<kiln::dtype, kiln::shape>>& results) {
    const std::string base(op->name());
    int id = add(node_kind::special, base, std::move(inputs), results.empty() ? bool_ : results[0].first,
                 results.empty() ? kiln::shape{} : results[0].second);
    nodes_[std::size_t(id)].special_ = std::move(op);
    nodes_[std::size_t(id)].result_count_ = int(results.size());
    std::vector<int> ids;
    if (!results.empty()) ids.push_back(id);
    for (std::size_t k = 1; k < results.size(); ++k)
      ids.push_back(add(node_kind::result, nodes_[std::size_t(id)].name_ + ":" + std::to_string(k), {id}, results[k].first,
                        results[k].second));
    return ids;
  }
  /// Copies special node `n` of another graph (and its Result nodes) with `inputs`.
  std::vector<int> add_special_like(const node& n, std::vector<int> inputs, std::span<const node> results) {
    std::vector<std::pair<kiln::dtype, kiln::shape>> specs;
    if (n.result_count_ > 0) specs.emplace_back(n.dtype_, n.shape_);
    for (const node& r : results.first(std::size_t(std::max(n.result_count_ - 1, 0)))) specs.emplace_back(r.dtype_, r.shape_);
    return add_special(n.special_, std::move(inputs), specs);
  }
  /// True when some special node has effects (its graph must run even for no output).
  bool has_effects() const {
    for (const node& n : nodes_)
      if (n.kind_ == node_kind::special && n.special_->has_effects()) return true;
    return false;
  }
  int add_output(int source) {
    int id = add(node_kind::identity, "Identity", {source}, nodes_[source].dtype_, nodes_[source].shape_);
    outputs_.push_back(id);
    return id;
  }

  /// The graph in Graphviz's dot language: one box per node, labelled `name\nop`;
  /// the branches and bodies of conditionals and loops as nested clusters.
  template <class = void>
  std::string to_dot() const {
    std::ostringstream os;
    os << "digraph kiln {\n  node [shape=box, fontname=\"monospace\"];\n";
    write_dot(os, "n", "  ");
    os << "}\n";
    return os.str();
  }

 private:
  template <class = void>
  void write_dot(std::ostringstream& os, const std::string& prefix, const std::string& indent) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const node& n = nodes_[i];
      os << indent << prefix << i << " [label=\"" << n.name() << "\\n" << n.op() << " " << name(n.dtype()) << " "
         << n.shape().str() << "\"];\n";
      for (int in : n.input_ids()) os << indent << prefix << in << " -> " << prefix << i << ";\n";
      if (n.kind_ != node_kind::special) continue;
      for (const auto& [label, sub] : n.special_->subgraphs()) {
        const std::string inner = prefix + std::to_string(i) + "_" + label + "_";
        os << indent << "subgraph cluster_" << inner << " {\n" << indent << "  label=\"" << n.name() << " " << label
           << "\";\n";
        sub->write_dot(os, inner, indent + "  ");
        os << indent << "}\n";
      }
    }
  }

  int add(node_kind kind, const std::string& base, std::vector<int> inputs, kiln::dtype t, const kiln::shape& s) {
    node n;
    n.kind_ = kind;
    n.name_ = unique_name(base);
    for (int in : inputs) n.input_names_.push_back(nodes_.at(std::size_t(in)).name_);
    n.input_ids_ = std::move(inputs);
    n.dtype_ = t;
    n.shape_ = s;
    nodes_.push_back(std::move(n));
    return int(nodes_.size()) - 1;
  }
  // TensorFlow's naming: the first `add`, then `add_1`, `add_2`, ...
  std::string unique_name(const std::string& base) {
    int& count = name_counts_[base];
    std::string candidate = count == 0 ? base : base + "_" + std::to_string(count);
    ++count;
    while (name_counts_.count(candidate) && candidate != base) candidate = base + "_" + std::to_string(count++);
    if (candidate != base) name_counts_[candidate] = 1;
    return candidate;
  }

  std::vector<node> nodes_;
  std::vector<int> arguments_;
  std::vector<int> outputs_;
  std::unordered_map<std::string, int> name_counts_;
};

}  // namespace kiln
// ----- end kiln/graph/graph.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_GRAPH_GRAPH_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_TRACE_CONTEXT_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_TRACE_CONTEXT_HPP
// ----- begin kiln/trace/trace_context.hpp -----
/// \file
/// The trace context: while a kiln::function traces its callable, every op that
/// meets a symbolic tensor is recorded here, as a node of the graph being built.
/// Contexts nest (a function traced while tracing another) through a per-thread stack.
/// A subgraph context (a branch of kiln::cond, a loop's condition or body) captures
/// the symbolic tensors of the traces around it as extra placeholders.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace kiln::detail {

class trace_context {
 public:
  /// Starts tracing function `function_name` on this thread.
  explicit trace_context(std::string function_name)
      : id_(next_id()), function_name_(std::move(function_name)), previous_(current_slot()), record_(&record_op) {
    current_slot() = this;
  }
  /// Marks a subgraph trace: traces a branch or loop body inside the trace in progress.
  struct subgraph_t {};
  static constexpr subgraph_t subgraph{};
  explicit trace_context(subgraph_t) : trace_context(current_slot() ? current_slot()->function_name_ : std::string()) {
    capturing_ = previous_ != nullptr;
  }
  trace_context(const trace_context&) = delete;
  trace_context& operator=(const trace_context&) = delete;
  ~trace_context() { current_slot() = previous_; }

  /// The innermost trace in progress on this thread, or null.
  static trace_context* current() { return current_slot(); }
  /// Makes `c` the innermost trace of this thread and returns the one it replaces:
  /// kiln::init_scope suspends tracing with it.
  static trace_context* exchange_current(trace_context* c) { return std::exchange(current_slot(), c); }

  const std::string& function_name() const { return function_name_; }
  /// What the symbolic tensors of this trace carry as their `trace_id`.
  std::uint64_t id() const { return id_; }
  kiln::graph& graph() { return graph_; }

  /// A new argument of the function, as the symbolic tensor the callable receives.
  tensor placeholder(const std::string& name, dtype t, const shape& s) { return symbolic(graph_.add_placeholder(name, t, s)); }

  /// The symbolic tensor standing for node `id` of this trace's graph.
  tensor symbolic(int id) {
    const node& n = graph_.node_at(id);
    std::string name = n.kind() == node_kind::result ? n.name() : n.name() + ":0";
    return tensor(n.dtype(), n.shape(), std::make_shared<const symbol>(symbol{id_, id, std::move(name)}));
  }

  /// Records special op `op` on `inputs`; returns one symbolic tensor per result.
  std::vector<tensor> record_special(std::shared_ptr<const special_op> op, std::span<const tensor> inputs,
                                     const std::vector<std::pair<dtype, shape>>& results) {
    std::vector<int> ids;
    for (const tensor& t : inputs) ids.push_back(node_of(t));
    std::vector<tensor> out;
    for (int id : graph_.add_special(std::move(op), std::move(ids), results)) out.push_back(symbolic(id));
    return out;
  }

  /// Makes `t` an output of the graph (an Identity node) and returns that node.
  const node& add_output(const tensor& t) { return graph_.node_at(graph_.add_output(node_of(t))); }

  /// The outer tensors this subgraph captured, one per placeholder after the ones
  /// the subgraph was given (in the order the subgraph first used them).
  const std::vector<tensor>& captures() const { return captures_; }

  /// Remembers a variable created while tracing, for the function to check that it
  /// outlives the trace (kiln::function allows singleton variables only).
  void note_created_variable(std::weak_ptr<const void> handle) { function_trace().created_.push_back(std::move(handle)); }
  const std::vector<std::weak_ptr<const void>>& created_variables() const { return created_; }

  /// The node of this trace that `t` stands for: its own node when `t` is one of this
  /// trace's symbolic tensors, a captured constant when `t` is eager.
  int node_of(const tensor& t) {
    if (!t.defined()) throw invalid_argument_error(function_name_ + ": an empty tensor was used while tracing");
    if (t.is_symbolic()) {
      if (t.symbol()->trace_id != id_ && capturing_ && encloses(t.symbol()->trace_id)) return capture(t);
      if (t.symbol()->trace_id != id_)
        throw type_error(function_name_ + ": the symbolic tensor " + t.symbol()->name +
                         " belongs to another trace; a symbolic tensor cannot be used outside the trace that made it "
                         "(return it from the function instead)");
      return t.symbol()->node;
    }
    for (const auto& [value, id] : captured_)
      if (value.raw_data() == t.raw_data() && value.shape() == t.shape() && value.dtype() == t.dtype()) return id;
    int id = graph_.add_constant(t);
    captured_.emplace_back(t, id);
    return id;
  }

  /// Copies the nodes of `g` (another function's trace) into this trace, its
  /// placeholders bound to nodes `args`; returns the nodes of its outputs.
  template <class = void>
  std::vector<int> inline_graph(const kiln::graph& g, std::span<const int> args) {
    std::vector<int> mapped(g.nodes().size(), -1);
    for (std::size_t i = 0; i < g.arguments().size(); ++i) mapped[std::size_t(g.arguments()[i])] = args[i];
    std::vector<int> outputs;
    for (std::size_t i = 0; i < g.nodes().size(); ++i) {
      const node& n = g.nodes()[i];
      switch (n.kind()) {
        case node_kind::placeholder: break;
        case node_kind::constant: mapped[i] = node_of(n.value()); break;
        case node_kind::identity:
          mapped[i] = mapped[std::size_t(n.input_ids()[0])];
          outputs.push_back(mapped[i]);
          break;
        case node_kind::op: {
          std::vector<int> ins;
          for (int in : n.input_ids()) ins.push_back(mapped[std::size_t(in)]);
          mapped[i] = graph_.add_op(n.operation(), std::move(ins), n.dtype(), n.shape());
          break;
        }
        case node_kind::special: {
          std::vector<int> ins;
          for (int in : n.input_ids()) ins.push_back(mapped[std::size_t(in)]);
          std::vector<int> ids = graph_.add_special_like(n, std::move(ins), std::span(g.nodes()).subspan(i + 1));
          for (std::size_t k = 0; k < ids.size(); ++k) mapped[i + k] = ids[k];
          break;
        }
        case node_kind::result: break;  // copied with its special node
      }
    }
    return outputs;
  }

  /// Records `op` applied to `inputs`, its result `dt` `sh`, and returns that
  /// symbolic result. Through a pointer that the constructor sets: every op function
  /// reaches this, and a program that never traces then compiles none of the graph
  /// building behind it.
  tensor record(ops::any_op op, std::span<const tensor* const> inputs, dtype dt, const shape& sh) {
    return record_(*this, std::move(op), inputs, dt, sh);
  }

 private:
  static tensor record_op(trace_context& c, ops::any_op op, std::span<const tensor* const> inputs, dtype dt,
                          const shape& sh) {
    std::vector<int> ids;
    ids.reserve(inputs.size());
    for (const tensor* t : inputs) ids.push_back(c.node_of(*t));
    return c.symbolic(c.graph_.add_op(std::move(op), std::move(ids), dt, sh));
  }

  // Whether trace `trace_id` is one this subgraph sits in (up to its function's trace).
  bool encloses(std::uint64_t trace_id) const {
    for (const trace_context* c = previous_; c; c = c->previous_) {
      if (c->id_ == trace_id) return true;
      if (!c->capturing_) return false;
    }
    return false;
  }
  int capture(const tensor& t) {
    for (std::size_t k = 0; k < captures_.size(); ++k)
      if (same_value(*captures_[k].symbol(), *t.symbol())) return capture_ids_[k];
    int id = graph_.add_placeholder(node_name(*t.symbol()), t.dtype(), t.shape());
    captures_.push_back(t);
    capture_ids_.push_back(id);
    return id;
  }
  trace_context& function_trace() {
    trace_context* c = this;
    while (c->capturing_) c = c->previous_;
    return *c;
  }

  static trace_context*& current_slot() {
    thread_local trace_context* current = nullptr;
    return current;
  }
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }

  std::uint64_t id_;
  std::string function_name_;
  trace_context* previous_;
  tensor (*record_)(trace_context&, ops::any_op, std::span<const tensor* const>, dtype, const shape&);
  kiln::graph graph_;
  std::vector<std::pair<tensor, int>> captured_;
  bool capturing_ = false;
  std::vector<tensor> captures_;
  std::vector<int> capture_ids_;
  std::vector<std::weak_ptr<const void>> created_;
};

inline bool tracing() { return trace_context::current() != nullptr; }

}  // namespace kiln::detail

namespace kiln {

/// Lifts what runs in its scope out of the function being traced, as tf.init_scope:
/// ops run at once on eager tensors and variables change now, once, while tracing,
/// instead of becoming part of the graph. Outside a trace it changes nothing.
/// \code
/// struct model {
///   kiln::variable v{kiln::constant(0)};
///   bool initialized = false;
/// } m;
/// kiln::function f([&](const kiln::tensor& x) {
///   if (!m.initialized) {
///     kiln::init_scope lift;
///     m.initialized = true;
///     m.v.assign_add(1);  // runs once, while tracing
///   }
///   return x + m.v.read_value();
/// });
/// \endcode
class init_scope {
 public:
  init_scope() : suspended_(detail::trace_context::exchange_current(nullptr)) {}
  init_scope(const init_scope&) = delete;
  init_scope& operator=(const init_scope&) = delete;
  ~init_scope() { detail::trace_context::exchange_current(suspended_); }

 private:
  detail::trace_context* suspended_;
};

}  // namespace kiln

namespace kiln::detail {

[[noreturn]] inline void throw_outside_trace(std::string_view op) {
  throw type_error(std::string(op) +
                   ": a symbolic tensor was used outside the trace that made it; return it from the function instead");
}

template <class Op>
tensor record_symbolic(const Op& op, std::span<const tensor* const> inputs) {
  trace_context* trace = trace_context::current();
  if (!trace) throw_outside_trace(Op::name);
  auto [dt, sh] = infer(op, inputs, rule_errors::trace);
  return trace->record(ops::any_op(std::in_place_type<Op>, op), inputs, dt, sh);
}

}  // namespace kiln::detail
// ----- end kiln/trace/trace_context.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_TRACE_CONTEXT_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_TILE_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_TILE_HPP
// ----- begin kiln/exec/tile.hpp -----
/// \file
/// The per-op entry points a plan calls, chosen once when the plan is built: one
/// function pointer per graph node, so running a plan never visits the op variant,
/// checks a rule or switches on a dtype.
///
/// - `backend::cpu::run_fn` runs an elementwise op on one tile of a fused cluster: the
///   run of eager execution's kernel;
/// - `compound_fn` runs one with the scalar arithmetic around it folded into its
///   pass (kiln/exec/fold.hpp);
/// - `gather_fn` copies the elements of a broadcast operand that one tile reads;
/// - `check_fn` is an op's value check (integer division by zero, ...), run before
///   the cluster that holds the op;
/// - `op_fn` runs a node that is not fused: its value check, then its kernel into a
///   preallocated output, or `evaluate` for ops that make their result themselves
///   (detail::evaluated).

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_FOLD_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_FOLD_HPP
// ----- begin kiln/exec/fold.hpp -----
/// \file
/// Folded arithmetic: `x * a + b` next to an elementwise op of a fused cluster runs in
/// that op's pass, on registers, instead of passes of its own over the tile. Every
/// part of the feature lives here: what a fold is (folded_arithmetic), which nodes of
/// a cluster fold (fold_arithmetic, called by the planner), how a tile computes it
/// (the compound kernels behind compound_fn) and how a native loop spells it
/// (scale_and_shift_source). Tiles and native loops both round through
/// scale_and_shift, so neither changes a bit of eager's results.

#include <cstdint>
#include <string>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_NODE_MAP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_NODE_MAP_HPP
// ----- begin kiln/exec/node_map.hpp -----
/// \file
/// `node_map<T>`: one value per node of a graph, indexed by node id. Graphs number
/// their nodes with `int`; planning code reads `cluster_of[id]` instead of
/// converting every id into a vector index.

#include <cstddef>
#include <vector>

namespace kiln::detail::exec {

/// One `T` per node of a graph, indexed by node id.
/// For example `node_map<int> cluster_of(g.nodes().size(), -1); cluster_of[id] = 0;`.
template <class T>
class node_map {
 public:
  node_map() = default;
  explicit node_map(std::size_t nodes, const T& value = T()) : items_(nodes, value) {}

  decltype(auto) operator[](int id) { return items_[std::size_t(id)]; }
  decltype(auto) operator[](int id) const { return items_[std::size_t(id)]; }
  /// The number of nodes.
  int size() const { return int(items_.size()); }

 private:
  std::vector<T> items_;
};

}  // namespace kiln::detail::exec
// ----- end kiln/exec/node_map.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_NODE_MAP_HPP

namespace kiln::detail::exec {

/// A scale or shift of folded_arithmetic: table entry `entry`, read as one broadcast
/// value or element by element, and negated when `negated`. Entry -1 is the identity:
/// 1 for a scale (-1 when negated), -0 for a shift (x + -0 is x for every x, -0 too).
struct fold_operand {
  int entry = -1;
  bool contiguous = false;
  bool negated = false;
};

/// Scalar arithmetic that runs in the pass of the op around it: the pass computes
/// post(op(pre(x))) with pre(x) = x * pre_scale + pre_shift (unary ops only) and
/// post(r) = r * scale + shift. Each product and sum is rounded on its own, as the
/// separate ops round them. Only unary ops read a contiguous scale or shift.
/// For example, `tanh(x * 0.5 + 1) * x - 0.25` is a tanh with pre 0.5, 1 and post scale x,
/// shift 0.25 negated.
struct folded_arithmetic {
  bool pre = false;
  fold_operand pre_scale, pre_shift, scale, shift;
};

/// Runs an elementwise op with folded arithmetic on `len` elements, a multiple of
/// padded_elements; `table` and `in` as for an instruction (kiln/exec/plan.hpp).
using compound_fn = void (*)(const void* op, unsigned contig, const folded_arithmetic& fold, void* out, void* const* table,
                             const int* in, std::int64_t len);

/// Whether a compiler barrier can keep a product in a register of its own: without it
/// GCC contracts `a * b + c` into one fused multiply-add, rounded once, and folded
/// arithmetic would no longer compute eager's bits.
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
inline constexpr bool can_fold_arithmetic = true;
#else
inline constexpr bool can_fold_arithmetic = false;
#endif

template <class B>
B rounded(B v) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(v.data));
#elif defined(__aarch64__)
  asm("" : "+w"(v.data));
#endif
  return v;
}

/// r * scale + shift, each rounded on its own: the one place folded arithmetic is
/// computed, in tiles and native loops.
template <class B>
B scale_and_shift(const B& r, const B& scale, const B& shift) {
  return ops::add{}(rounded(ops::multiply{}(r, scale)), shift);
}

/// A broadcast fold operand as a batch.
template <class T, class B = xsimd::batch<T>>
B fold_splat(const fold_operand& o, void* const* table, T identity) {
  if (o.entry < 0) return o.negated ? ops::negate{}(B(identity)) : B(identity);
  const B v(*static_cast<const T*>(table[o.entry]));
  return o.negated ? ops::negate{}(v) : v;
}

/// Where a compound kernel reads a fold operand's batch for element i (a batch_source),
/// negated when `negated`.
template <class T>
struct fold_source {
  using B = xsimd::batch<T>;
  backend::cpu::batch_source<T> source;
  bool negated;

  fold_source(const fold_operand& o, void* const* table, T identity)
      : source(o.contiguous ? static_cast<const T*>(table[o.entry]) : nullptr,
               o.contiguous ? B() : fold_splat<T>(o, table, identity)),
        negated(o.contiguous && o.negated) {}

  B operator[](std::int64_t i) const { return negated ? ops::negate{}(source[i]) : source[i]; }
};

// ---- Tiles: the compound kernels ----
// The operands' contiguity is read at run time (batch_source), not instantiated per
// combination.

// Without pre arithmetic, pre_scale and pre_shift are 1 and -0.0, which give every
// value back bit for bit: one loop per op and type rather than one with and one without.
template <class Op, class T>
KILN_FLATTEN void compound_unary(const Op& op, const folded_arithmetic& f, T* KILN_RESTRICT out, const T* x, void* const* table,
                                 std::int64_t len) {
  using B = xsimd::batch<T>;
  const T one = T(1), minus_zero = T(-0.0);
  const B pre_scale = fold_splat<T>(f.pre_scale, table, one), pre_shift = fold_splat<T>(f.pre_shift, table, minus_zero);
  const fold_source<T> scale(f.scale, table, one), shift(f.shift, table, minus_zero);
  for (std::int64_t i = 0; i < len; i += std::int64_t(B::size)) {
    const B v = scale_and_shift(B::load_unaligned(x + i), pre_scale, pre_shift);
    scale_and_shift(B(op(v)), scale[i], shift[i]).store_unaligned(out + i);
  }
}

template <class Op, class T>
KILN_FLATTEN void compound_binary(const Op& op, const folded_arithmetic& f, T* KILN_RESTRICT out, const T* a, const T* b,
                                  unsigned contig, void* const* table, std::int64_t len) {
  using B = xsimd::batch<T>;
  const B scale = fold_splat<T>(f.scale, table, T(1)), shift = fold_splat<T>(f.shift, table, T(-0.0));
  const backend::cpu::batch_source<T> first(a, (contig & 1u) != 0), second(b, (contig & 2u) != 0);
  for (std::int64_t i = 0; i < len; i += std::int64_t(B::size))
    scale_and_shift(op(first[i], second[i]), scale, shift).store_unaligned(out + i);
}

/// The compound_fn of an op with a SIMD kernel for T.
template <class Op, class T>
void run_compound(const void* p, unsigned contig, const folded_arithmetic& f, void* out, void* const* table, const int* in,
                  std::int64_t len) {
  const Op& op = *static_cast<const Op*>(p);
  T* o = static_cast<T*>(out);
  auto operand = [&](int k) { return static_cast<const T*>(table[in[k]]); };
  if constexpr (Op::arity == 1) {
    compound_unary(op, f, o, operand(0), table, len);
  } else {
    compound_binary(op, f, o, operand(0), operand(1), contig, table, len);
  }
}

// ---- Native loops: the same arithmetic as source text ----

/// `x * scale + shift` as a native loop's source, through scale_and_shift as the
/// compound kernels compute it; `operand(entry, contiguous)` names the register
/// holding a table entry.
/// For example `kiln::detail::exec::scale_and_shift(v0, s3, B(T(-0.0)))`.
template <class = void>
std::string scale_and_shift_source(const std::string& x, const fold_operand& scale, const fold_operand& shift,
                                   auto&& operand) {
  auto value = [&](const fold_operand& o, const char* identity) {
    const std::string v = o.entry < 0 ? std::string("B(T(") + identity + "))" : operand(o.entry, o.contiguous);
    return o.negated ? "kiln::ops::negate{}(" + v + ")" : v;
  };
  return "kiln::detail::exec::scale_and_shift(" + x + ", " + value(scale, "1") + ", " + value(shift, "-0.0") + ")";
}

// ---- Planning: which nodes fold ----

/// The folds of one cluster, by node: whether it was folded, and for an op that runs,
/// the value its pass reads instead of its input (pre), the value it defines (the
/// last of its post arithmetic), how many nodes it took in, and the folded
/// arithmetic, with node ids where the plan later puts table entries.
struct folds {
  node_map<bool> folded;
  node_map<int> input, result, count;
  node_map<folded_arithmetic> arithmetic;
};

enum class folded_op { none, add, subtract, multiply };

/// Folds scalar arithmetic around the ops of a cluster of graph `g` whose members are
/// `members` (in graph order; `inside(v)` says whether value v is one of them).
/// `values[id]` gives a node's `type` and `dims`, `entries[id].compound` whether its op
/// has compound kernels, `in_memory[id]` whether its value must reach memory. (`g` is
/// generic so that native loops include this file without kiln::graph.)
///
/// A node folds when its value is read once, by the op it folds into (or is produced
/// by it), and never reaches memory. Before a unary op: a product and a sum with
/// one-element operands. After any op: a product, then a sum, with one-element
/// operands, or after a unary op also with cluster-shaped operands computed before
/// it, since the folded pass runs at the op's place.
folds fold_arithmetic(const auto& g, const std::vector<int>& members, const auto& values, const auto& entries,
                      const node_map<bool>& in_memory, auto inside) {
  const std::size_t n = g.nodes().size();
  folds f{node_map<bool>(n, false), node_map<int>(n, -1), node_map<int>(n, -1), node_map<int>(n, 0),
          node_map<folded_arithmetic>(n)};
  if (!can_fold_arithmetic) return f;
  // Which arithmetic node `id` is, if it may be folded into an op of dtype `t`.
  auto arithmetic_of = [&](int id, dtype t) {
    if (values[id].type != t || !entries[id].compound) return folded_op::none;
    for (int in : g.node_at(id).input_ids())
      if (values[in].type != t) return folded_op::none;
    // Found by argument-dependent lookup: this header leaves kiln/graph/graph.hpp out,
    // so that a native loop's source includes no more than it needs.
    const auto& op = g.node_at(id).operation();
    if (holds_alternative<ops::add>(op)) return folded_op::add;
    if (holds_alternative<ops::subtract>(op)) return folded_op::subtract;
    if (holds_alternative<ops::multiply>(op)) return folded_op::multiply;
    return folded_op::none;
  };
  node_map<int> reads(n, 0), reader(n, -1), place(n, -1);
  for (std::size_t k = 0; k < members.size(); ++k) {
    place[members[k]] = int(k);
    for (int in : g.node_at(members[k]).input_ids()) {
      ++reads[in];
      reader[in] = members[k];
    }
  }
  auto read_once = [&](int v) { return inside(v) && !in_memory[v] && reads[v] == 1; };
  auto one_element = [&](int v) { return !inside(v) && values[v].dims.num_elements() == 1; };

  // Pre: the sum, then the product, that make a unary op's input.
  for (int u : members) {
    if (!entries[u].compound || g.node_at(u).input_ids().size() != 1) continue;
    const dtype t = values[u].type;
    folded_arithmetic& a = f.arithmetic[u];
    int x = g.node_at(u).input_ids()[0];
    for (bool shift_open = true; read_once(x) && !f.folded[x];) {
      const folded_op kind = arithmetic_of(x, t);
      if (kind == folded_op::none || (kind != folded_op::multiply && !shift_open)) break;
      const auto& in = g.node_at(x).input_ids();  // two operands: add, subtract and multiply are binary
      const int s = one_element(in[1]) ? 1 : one_element(in[0]) ? 0 : -1;
      if (s < 0) break;
      if (kind == folded_op::multiply) {
        a.pre_scale.entry = in[std::size_t(s)];
      } else {
        a.pre_shift = {in[std::size_t(s)], false, kind == folded_op::subtract && s == 1};
        a.pre_scale.negated = kind == folded_op::subtract && s == 0;  // s - v is (-v) + s
        shift_open = false;
      }
      a.pre = true;
      f.folded[x] = true;
      ++f.count[u];
      x = in[std::size_t(1 - s)];
      if (kind == folded_op::multiply) break;
    }
    if (a.pre) f.input[u] = x;
  }

  // Post: the product, then the sum, that the op's result goes through.
  for (int h : members) {
    if (f.folded[h] || !entries[h].compound) continue;
    const auto& hin = g.node_at(h).input_ids();
    const bool unary = hin.size() == 1;
    if (!unary && (hin.size() != 2 || (one_element(hin[0]) && one_element(hin[1])))) continue;
    const dtype t = values[h].type;
    folded_arithmetic& a = f.arithmetic[h];
    int v = h;
    bool scaled = false, shifted = false;
    while (read_once(v) && !shifted) {
      const int r = reader[v];
      const folded_op kind = arithmetic_of(r, t);
      if (kind == folded_op::none || f.folded[r] || (kind == folded_op::multiply && scaled)) break;
      const auto& in = g.node_at(r).input_ids();
      const int k = in[0] == v ? 1 : 0;  // the other operand
      const int o = in[std::size_t(k)];
      const bool contiguous = !one_element(o);
      if (contiguous && (!unary || (inside(o) && place[o] >= place[h]))) break;
      if (kind == folded_op::multiply) {
        a.scale = {o, contiguous, a.scale.negated};
        scaled = true;
      } else {
        a.shift = {o, contiguous, kind == folded_op::subtract && k == 1};
        if (kind == folded_op::subtract && k == 0) a.scale.negated = !a.scale.negated;  // o - v is (-v) + o
        shifted = true;
      }
      f.folded[r] = true;
      ++f.count[h];
      place[r] = place[h];
      v = r;
    }
    if (v != h) f.result[h] = v;
  }
  return f;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/fold.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_FOLD_HPP

namespace kiln::detail::exec {

/// Runs an elementwise op on one element: `out` and `in[k]` point to single values.
/// It is called as `fn(&op, &result, operands)`.
using scalar_fn = void (*)(const void* op, void* out, const void* const* in);

/// Checks an op's input values before anything runs (throws kiln::invalid_argument_error).
using check_fn = void (*)(const void* op, std::span<const tensor* const> in);

/// Runs a non-fused op on eager inputs: `out` is preallocated with the op's dtype
/// and shape for ops with a kernel; ops with `evaluate` assign it.
using op_fn = void (*)(const void* op, std::span<const tensor* const> in, tensor& out);

/// How the elements of a broadcast operand follow the elements of a cluster: the
/// cluster's loop nest after merging dims, with this operand's strides (0 where
/// it is broadcast).
struct broadcast_read {
  int rank = 1;
  std::array<std::int64_t, max_rank> size{};
  std::array<std::int64_t, max_rank> stride{};
  std::size_t element_bytes = 0;
  /// Copies `len` elements, from cluster element `lo` on, of operand `src` to `dst`.
  void (*gather)(const broadcast_read& b, const void* src, void* dst, std::int64_t lo, std::int64_t len) = nullptr;

  // A template, as what it instantiates (a gather per dtype) is needed only where a
  // file runs a graph.
  template <class = void>
  broadcast_read(dtype t, const shape& operand, const shape& cluster);
};

template <class T>
void gather_tile(const broadcast_read& b, const void* src, void* dst, std::int64_t lo, std::int64_t len) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  const int r = b.rank;
  std::array<std::int64_t, max_rank> idx{};
  std::int64_t off = 0;
  for (std::int64_t rest = lo, k = r - 1; k >= 0; --k) {
    idx[std::size_t(k)] = rest % b.size[std::size_t(k)];
    rest /= b.size[std::size_t(k)];
    off += idx[std::size_t(k)] * b.stride[std::size_t(k)];
  }
  const std::int64_t inner = b.size[std::size_t(r - 1)], step = b.stride[std::size_t(r - 1)];
  while (len > 0) {
    std::int64_t run = std::min(inner - idx[std::size_t(r - 1)], len);
    if (step == 1)
      std::copy_n(s + off, run, d);
    else if (step == 0)
      std::fill_n(d, run, s[off]);
    else
      for (std::int64_t i = 0; i < run; ++i) d[i] = s[off + i * step];
    d += run;
    len -= run;
    off += run * step;
    idx[std::size_t(r - 1)] += run;
    for (int k = r - 1; k > 0 && idx[std::size_t(k)] == b.size[std::size_t(k)]; --k) {
      off += b.stride[std::size_t(k - 1)] - idx[std::size_t(k)] * b.stride[std::size_t(k)];
      idx[std::size_t(k)] = 0;
      ++idx[std::size_t(k - 1)];
    }
  }
}

template <class>
broadcast_read::broadcast_read(dtype t, const shape& operand, const shape& cluster) {
  const buffer_view view{nullptr, t, operand};
  const backend::cpu::loop_nest<1> nest(std::span<const buffer_view>(&view, 1), cluster);
  rank = nest.rank;
  size = nest.size;
  stride = nest.stride[0];
  element_bytes = size_of(t);
  visit_dtype(t, [&]<class T>() {
    if constexpr (!std::is_same_v<T, std::string>) gather = &gather_tile<T>;
  });
}

// An op with a SIMD kernel runs its batch functor on a broadcast batch, so that one
// element gets the bits it gets in a tile or eagerly (their kernels use the batch
// functor for every element, kiln/backend/cpu/elementwise.hpp).
template <class Op, class In, class Out>
void run_scalar(const void* op, void* out, const void* const* in) {
  const Op& o = *static_cast<const Op*>(op);
  auto arg = [&](int k) { return *static_cast<const In*>(in[k]); };
  Out* result = static_cast<Out*>(out);
  if constexpr (backend::cpu::simd_kernel<Op, In, Out>) {
    using B = xsimd::batch<In>;
    if constexpr (Op::arity == 1)
      *result = o(B(arg(0))).get(0);
    else
      *result = o(B(arg(0)), B(arg(1))).get(0);
  } else {
    *result = kiln::math::convert<Out>(
        ops::invoke_elementwise(o, arg, [&](int k) { return *static_cast<const bool*>(in[k]); }));
  }
}

template <class Op>
void check_op(const void* op, std::span<const tensor* const> in) {
  check_values(*static_cast<const Op*>(op), in);
}

template <class Op, dtype_set Only = dtypes::all>
void run_op(const void* p, std::span<const tensor* const> in, tensor& out) {
  const Op& op = *static_cast<const Op*>(p);
  if constexpr (requires { check_values(op, in); }) check_values(op, in);
  if constexpr (evaluated<Op>) {
    out = op.evaluate(in);
  } else {
    run_kernel_into(in, out, &backend_kernel<backend::cpu_backend, Op, Only>, p);
  }
}

/// The entry points of one graph op, as a plan stores them.
struct op_entry {
  const void* op = nullptr;      ///< the op object inside the graph node
  op_fn run = nullptr;           ///< run unfused
  backend::cpu::run_fn tile = nullptr;  ///< run on a tile; null when the op cannot be fused
  /// Run on a tile with folded arithmetic; null unless the op has a SIMD kernel.
  compound_fn compound = nullptr;
  scalar_fn scalar = nullptr;    ///< run on one element; set with `tile`
  check_fn check = nullptr;      ///< value check; null when the op has none
  bool evaluates = false;        ///< the result may share an input's buffer (reshape, x[i])
  /// The op's C++ name when a native loop can call its functor on xsimd batches
  /// (a SIMD kernel for these dtypes and no attributes); empty otherwise.
  std::string_view native_name{};
};

/// The entry points of `op` for value operands of dtype `in` and a result of dtype
/// `out`. Elementwise ops on strings are not fused (their elements are objects).
/// One instantiation per op holds all of the op's CPU kernels as a plan uses them
/// (not `inline`, so that kiln/kernels.hpp can compile it once per program); `Only`
/// limits them to some dtypes (detail::apply_bookkeeping).
template <class Op, dtype_set Only = dtypes::all>
op_entry entry_for(const Op& op, dtype in, dtype out) {
  op_entry e;
  e.op = &op;
  e.run = &run_op<Op, Only>;
  e.evaluates = evaluated<Op>;
  if constexpr (requires(std::span<const tensor* const> s) { check_values(op, s); }) e.check = &check_op<Op>;
  if constexpr (ops::elementwise<Op>) {
    if (in != string && out != string)
      backend::visit_elementwise_types<Only>(op, in, out, [&]<class In, class Out>() {
        if constexpr (!std::is_same_v<In, std::string> && !std::is_same_v<Out, std::string>) {
          e.tile = &backend::cpu::erased_run<Op, In, Out>;
          e.scalar = &run_scalar<Op, In, Out>;
        }
        if constexpr (backend::cpu::simd_kernel<Op, In, Out>) {
          // Folding pays where chains of float arithmetic run; integer chains run
          // unfolded, which spares every program two dtypes' folded kernels.
          if constexpr (can_fold_arithmetic && std::is_floating_point_v<In>) e.compound = &run_compound<Op, In>;
          if constexpr (std::is_empty_v<Op>) e.native_name = ops::qualified_name<Op>;
        }
      });
  }
  return e;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/tile.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_TILE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_KERNEL_TABLE_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_KERNEL_TABLE_HPP
// ----- begin kiln/exec/kernel_table.hpp -----
/// \file
/// The kernels this program compiled, one row per op of the registry: how graphs
/// reach kernels without compiling every op of the library.
///
/// A graph can hold any op, so a plan or the optimizer that dispatched over every op
/// of the registry would compile the kernels of all of them, for every dtype and
/// backend, in each source file that runs a kiln::function. Instead an op's row is
/// filled when the program first runs the op (`detail::apply`, the one entry point of
/// every op function, eager or traced, registers it): a source file pays for the ops
/// it calls. A row that only kiln's own bookkeeping filled (loop counters:
/// detail::apply_bookkeeping) has the kernels of bools and integers alone until the
/// program calls the op itself. A graph that meets an op whose row is empty, or
/// lacks its dtype (one made by another program, or by ops inlined from a library),
/// raises kiln::unavailable_error naming the op. Separate compilation (kiln/kernels.hpp)
/// registers every op it instantiates.

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_AUTODIFF_BACKWARD_HPP
#define KILN_SINGLE_INCLUDE_KILN_AUTODIFF_BACKWARD_HPP
// ----- begin kiln/autodiff/backward.hpp -----
/// \file
/// How an op's gradient formula runs: `detail::gradient_builder`, the one argument of
/// every op's `gradient` member (written beside the op, in kiln/ops/), and
/// `detail::backward_of<Op>`, which kiln/exec/kernel_table.hpp puts in the op's row.
///
/// A formula calls ops through the kernel table (`run_registered`), never through
/// kiln's op functions: a program that calls tanh then compiles tanh's formula, not
/// the kernels of the ops the formula uses. A gradient tape registers those that the
/// formulas of several ops run when it is made (`detail::tape_ops`), so that only
/// programs with tapes compile them; an op that one formula alone runs (log, in pow's)
/// is registered by that formula, so that only programs that call its op compile it.

#include <span>
#include <string>
#include <type_traits>
#include <vector>


namespace kiln::detail {

/// Runs `op` now on eager `inputs` through its row of the kernel table (defined in
/// kiln/exec/kernel_table.hpp), recording it on the tapes of this thread.
tensor run_registered(const ops::any_op& op, std::span<const tensor* const> inputs);

/// The ops a gradient tape registers when it is made (kiln/autodiff/tape.hpp): those
/// that the formulas of several ops or of common ones run (transpose, for matmul's),
/// and those the tape's own code runs (summing gradients, reducing them to an input's
/// shape, zeros_shaped_like). The formulas of pow (log, pow), floormod (floordiv) and
/// matmul (matmul) register what else they run.
using tape_ops = boost::mp11::mp_list<ops::add, ops::subtract, ops::multiply, ops::divide, ops::negate, ops::cast,
                                      ops::equal, ops::greater, ops::greater_equal, ops::where, ops::reshape,
                                      ops::transpose, ops::reduce_sum, ops::slice, ops::concat, ops::gather,
                                      ops::unsorted_segment_sum, ops::set_item, ops::stack, ops::crop_or_pad>;

/// Zeros of `x`'s dtype and shape, also where its dims are known only when the graph
/// runs (a tensor array's rows in a loop): then zeros selected over x's own shape
/// (`x == x` is false for NaN, but both branches are 0).
inline tensor zeros_shaped_like(const tensor& x) {
  if (x.shape().is_fully_defined() || !x.is_symbolic()) return zero_filled("gradient", x.shape(), x.dtype(), x.device());
  const tensor zero = make_scalar(x.dtype(), 0, x.device());
  const tensor* same_in[] = {&x, &x};
  const tensor same = run_registered(ops::equal{}, same_in);
  const tensor* in[] = {&same, &zero, &zero};
  return run_registered(ops::where{}, in);
}

/// What an op's gradient formula reads (its inputs, its result, the gradient of the
/// result) and gives (the gradient of each input it is differentiable in).
/// \code
/// struct my_tanh {  // an op's member, as kiln::ops::tanh has it
///   template <class G> void gradient(G& g) const { g.give(0, g.dy() * (1.0 - g.y() * g.y())); }
/// };
/// \endcode
class gradient_builder {
 public:
  /// A tensor of the formula; its arithmetic runs through the kernel table.
  struct value {
    tensor t;

    // Templates, as op functions are, so that a program compiles the ops they run
    // only where a gradient formula runs.
    template <class = void>
    friend value operator+(const value& a, const value& b) { return run(ops::add{}, a, b); }
    template <class = void>
    friend value operator-(const value& a, const value& b) { return run(ops::subtract{}, a, b); }
    template <class = void>
    friend value operator*(const value& a, const value& b) { return run(ops::multiply{}, a, b); }
    template <class = void>
    friend value operator/(const value& a, const value& b) { return run(ops::divide{}, a, b); }
    template <class = void>
    friend value operator-(const value& a) { return run(ops::negate{}, a); }
    template <class = void>
    friend value operator+(const value& a, double s) { return a + a.scalar(s); }
    template <class = void>
    friend value operator-(const value& a, double s) { return a - a.scalar(s); }
    template <class = void>
    friend value operator*(const value& a, double s) { return a * a.scalar(s); }
    template <class = void>
    friend value operator/(const value& a, double s) { return a / a.scalar(s); }
    template <class = void>
    friend value operator+(double s, const value& a) { return a.scalar(s) + a; }
    template <class = void>
    friend value operator-(double s, const value& a) { return a.scalar(s) - a; }
    template <class = void>
    friend value operator*(double s, const value& a) { return a.scalar(s) * a; }
    /// `s` as a scalar of this value's dtype.
    value scalar(double s) const { return {make_scalar(t.dtype(), s, t.device())}; }
  };

  gradient_builder(std::span<const tensor> inputs, const tensor& output, const tensor& upstream, std::span<tensor> grads)
      : inputs_(inputs), output_(output), upstream_(upstream), grads_(grads) {}

  /// Input `i` of the op.
  value x(int i) const { return {inputs_[std::size_t(i)]}; }
  /// How many inputs the op has.
  std::size_t arity() const { return inputs_.size(); }
  /// The op's result.
  value y() const { return {output_}; }
  /// The gradient of the target with respect to the result.
  value dy() const { return {upstream_}; }
  /// Zeros of input `i`'s dtype and shape (what a gradient is broadcast onto).
  value zeros_like(int i) const { return {zeros_shaped_like(inputs_[std::size_t(i)])}; }
  /// Gives `g`, of the result's shape or input `i`'s (the tape sums it back over
  /// broadcast dims), as the gradient of input `i`.
  void give(int i, const value& g) { grads_[std::size_t(i)] = g.t; }

  /// Zeros of `like`'s dtype, on its device, in shape `s`.
  static value zeros(const shape& s, const value& like) {
    return {zero_filled("gradient", s, like.t.dtype(), like.t.device())};
  }
  /// The int32 indices n - 1, ..., 1, 0 on `like`'s device: gathered with them, a dim
  /// of n elements comes out reversed.
  template <class = void>
  static value reversed_indices(std::int64_t n, const value& like) {
    std::vector<std::int32_t> indices(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) indices[static_cast<std::size_t>(i)] = std::int32_t(n - 1 - i);
    return {constant(indices, std::nullopt, like.t.device())};
  }
  template <class = void>
  static value reshape(const value& v, const shape& to) { return run(ops::reshape{to}, v); }
  template <class = void>
  static value transpose(const value& v, const int_list& perm) { return run(ops::transpose{perm}, v); }
  template <class = void>
  static value matmul(const value& a, const value& b) { return run(ops::matmul{}, a, b); }

  /// `op` on `operands`; registers `Op` at its first run unless a tape has.
  template <class Op, std::same_as<value>... V>
  KILN_COLD static value run(const Op& op, const V&... operands) {
    if constexpr (!ops::registered<Op, tape_ops>) register_kernels_on_use<Op>();  // Op is not in tape_ops
    const tensor* in[] = {&operands.t...};
    return {run_registered(ops::any_op(std::in_place_type<Op>, op), std::span<const tensor* const>(in))};
  }

 private:
  std::span<const tensor> inputs_;
  const tensor& output_;
  const tensor& upstream_;
  std::span<tensor> grads_;
};

/// Whether `Op` has a gradient formula.
template <class Op>
inline constexpr bool differentiable = requires(const Op& op, gradient_builder& g) { op.gradient(g); };

/// Runs the formula of the `Op` that `op` holds: writes the gradient of each
/// differentiable input to `grads` (left undefined for the others).
template <class Op>
KILN_COLD void backward_of(const ops::any_op& op, std::span<const tensor> inputs, const tensor& output, const tensor& upstream,
                 std::span<tensor> grads) {
  if constexpr (differentiable<Op>) {
    gradient_builder g(inputs, output, upstream, grads);
    op.unchecked<Op>().gradient(g);
  }
}

}  // namespace kiln::detail
// ----- end kiln/autodiff/backward.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_AUTODIFF_BACKWARD_HPP

namespace kiln::detail {

/// The entry points of one op, type-erased over the graph's op variant. Atomic, as a
/// thread may register an op (again, after kiln/kernels.hpp did) while another runs
/// a graph that holds it.
struct op_kernels {
  using execute_fn = tensor (*)(const ops::any_op&, std::span<const tensor* const>);
  using entry_fn = exec::op_entry (*)(const ops::any_op&, dtype, dtype);
  /// Runs the op now on eager inputs (kiln::detail::execute); null until registered.
  std::atomic<execute_fn> execute{nullptr};
  /// The entry points a plan calls (exec::entry_for); set before `execute`.
  std::atomic<entry_fn> entry{nullptr};
  /// The op's dtype and shape rules (exec::infer_values calls them on a plan's inputs
  /// with the op's `any_op::address`); set before `execute`.
  std::atomic<const op_rules*> rules{nullptr};
  using backward_fn = void (*)(const ops::any_op&, std::span<const tensor>, const tensor&, const tensor&,
                               std::span<tensor>);
  /// The op's gradient formula (detail::backward_of); set before `execute`.
  std::atomic<backward_fn> backward{nullptr};
  /// Records the op into the trace in progress (a gradient formula run while tracing,
  /// by a tape inside a kiln::function); set before `execute`.
  std::atomic<execute_fn> record{nullptr};
  using equal_fn = bool (*)(const ops::any_op&, const ops::any_op&);
  /// Whether two ops of this row have the same attributes; set before `execute`.
  std::atomic<equal_fn> equal{nullptr};
};

/// One row per op of the registry; a row is empty until its op registers.
inline std::array<op_kernels, ops::any_op::size>& kernel_table() {
  static std::array<op_kernels, ops::any_op::size> table{};
  return table;
}

/// Serializes registrations, so that a row registered for bookkeeping dtypes never
/// replaces a complete one.
inline std::mutex& registration_mutex() {
  static std::mutex m;
  return m;
}

/// Fills `Op`'s row; with `Only` (detail::apply_bookkeeping), with kernels for those
/// dtypes alone and only if the row is empty: the op's first call by the program
/// itself fills it again, complete.
template <class Op, dtype_set Only = dtypes::all>
bool register_kernels() {
  op_kernels& row = kernel_table()[ops::any_op::position_of<Op>];
  std::lock_guard lock(registration_mutex());
  if constexpr (Only != dtypes::all)
    if (row.execute.load(std::memory_order_acquire)) return true;
  if constexpr (!KILN_DEVICE_PASS) {  // the CPU planner and its fused kernels (config.hpp)
    row.entry.store(
        [](const ops::any_op& op, dtype in, dtype out) { return exec::entry_for<Op, Only>(op.unchecked<Op>(), in, out); },
        std::memory_order_release);
    row.rules.store(&rules_of<Op>, std::memory_order_release);
  }
  row.backward.store(&backward_of<Op>, std::memory_order_release);
  row.record.store([](const ops::any_op& op, std::span<const tensor* const> in) {
    return record_symbolic(op.unchecked<Op>(), in);
  }, std::memory_order_release);
  row.equal.store([](const ops::any_op& a, const ops::any_op& b) { return a.unchecked<Op>() == b.unchecked<Op>(); },
                  std::memory_order_release);
  row.execute.store(
      [](const ops::any_op& op, std::span<const tensor* const> in) { return execute<Op, Only>(op.unchecked<Op>(), in); },
      std::memory_order_release);
  return true;
}

/// Fills `Op`'s row before main runs: how kiln/kernels.hpp registers every op it
/// instantiates.
template <class Op>
inline const bool kernels_registered = register_kernels<Op>();

/// Fills `Op`'s row at its first call (before its first node can be recorded). At
/// run time rather than before main, so that an op function that a source file
/// compiles but never runs costs no machine code for its kernels.
template <class Op, dtype_set Only>
void register_kernels_on_use() {
  static const bool registered = register_kernels<Op, Only>();
  (void)registered;
}

/// The row of the op a graph node holds, or kiln::unavailable_error naming the op.
inline const op_kernels& kernels_of(const ops::any_op& op) {
  if (op.index() == ops::any_op::size) throw internal_error("kernels_of: a node that holds no op");
  const op_kernels& row = kernel_table()[op.index()];
  if (!row.execute.load(std::memory_order_acquire)) {
    throw unavailable_error(std::string(ops::name_of(op)) +
                            ": this program compiled no kernel for this op, since it never calls the op itself; call "
                            "it once where the graph is run, or link kiln's kernels (kiln_add_library, or "
                            "KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS) in one source file)");
  }
  return row;
}

/// Whether `a` and `b` are the same op with the same attributes. Through the kernel
/// table, so that comparing ops compiles the comparisons of the ops this program
/// calls, not of every op; false for an op whose row is empty.
inline bool same_op(const ops::any_op& a, const ops::any_op& b) {
  if (a.index() != b.index() || a.index() == ops::any_op::size) return false;
  const auto equal = kernel_table()[a.index()].equal.load(std::memory_order_acquire);
  return equal && equal(a, b);
}

/// Runs the op a graph node holds now, on eager inputs.
inline tensor execute_any(const ops::any_op& op, std::span<const tensor* const> in) {
  return kernels_of(op).execute.load(std::memory_order_acquire)(op, in);
}

/// How eager ops reach the gradient tapes of their thread: a function set when the
/// first tape is made (kiln/autodiff/tape.hpp). A pointer, so that a program without
/// tapes compiles nothing of them.
/// The recorder may replace `out` by a copy (unaliased_for_tapes).
using tape_recorder = void (*)(const ops::any_op& op, std::span<const tensor* const> in, tensor& out);
inline std::atomic<tape_recorder>& tape_hook() {
  static std::atomic<tape_recorder> hook{nullptr};
  return hook;
}

inline void record_any_on_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out) {
  tape_hook().load(std::memory_order_relaxed)(op, in, out);
}

template <class Op>
void record_on_tapes(const Op& op, std::span<const tensor* const> in, tensor& out) {
  record_any_on_tapes(ops::any_op(std::in_place_type<Op>, op), in, out);
}

/// Runs the op a graph node holds on `in`: now on eager inputs, or recorded into the
/// trace in progress (where a tape inside a kiln::function differentiates).
inline tensor run_registered(const ops::any_op& op, std::span<const tensor* const> in) {
  tensor out = records_symbolically(in) ? kernels_of(op).record.load(std::memory_order_acquire)(op, in) : execute_any(op, in);
  if (recording_tapes() > 0) record_any_on_tapes(op, in, out);
  return out;
}

}  // namespace kiln::detail

namespace kiln::detail::exec {

/// The entry points of the op a graph node holds.
inline op_entry entry_of(const ops::any_op& op, dtype in, dtype out) {
  return kernels_of(op).entry.load(std::memory_order_acquire)(op, in, out);
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/kernel_table.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_KERNEL_TABLE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_AUTODIFF_TAPE_HPP
#define KILN_SINGLE_INCLUDE_KILN_AUTODIFF_TAPE_HPP
// ----- begin kiln/autodiff/tape.hpp -----
/// \file
/// Reverse-mode gradients of eager code: kiln::gradient_tape records the eager ops
/// that read watched tensors (or results of recorded ops) while it is alive, and
/// `gradient` runs each recorded op's formula (kiln/autodiff/backward.hpp) from the
/// target back to the sources, as TensorFlow's GradientTape does.
///
/// A tape knows an eager tensor by its elements' address, dtype and shape: the tape
/// holds every tensor it recorded, so no recorded buffer is reused while it lives. It
/// knows a symbolic tensor by its trace and node: a tape made inside a kiln::function
/// records the ops the trace records, and `gradient` adds the backward pass to the same
/// graph. Reading a kiln::variable while a tape records watches the value read, as
/// TensorFlow's tapes watch trainable variables. The ops a tape runs to compute
/// gradients go through the kernel table and are recorded by the other tapes of the
/// thread, which is how nested tapes give higher-order gradients.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>


namespace kiln {

/// What `gradient_tape::gradient` gives for a source the target does not depend on:
/// an undefined tensor (`none`, TensorFlow's default) or zeros of the source's shape.
enum class unconnected_gradients { none, zero };

/// Options of a gradient_tape: a persistent tape may compute gradients more than once.
struct gradient_tape_options {
  bool persistent = false;
};

class gradient_tape;
class variable;

namespace detail {

struct concrete_state;

/// A kiln::function call as the tapes record it: the backward pass of its trace
/// (kiln/autodiff/function_gradient.hpp), behind a function pointer.
struct differentiable_call {
  /// Owns what `backward` needs (the trace's backward function).
  std::shared_ptr<const void> self;
  /// Gives the gradients of the call's floating-point inputs and of each variable in
  /// `variables`, in that order, from the call's `inputs` and one gradient per
  /// floating-point output.
  std::vector<tensor> (*backward)(const void* self, std::span<const tensor> inputs, std::span<const tensor> output_grads);
  /// The variables the trace reads (their identities), with their dtypes and shapes.
  std::vector<std::tuple<const void*, dtype, shape>> variables;
};

/// How kiln::function calls reach the tapes of their thread: a function set when the
/// first tape is made, so that a program without tapes compiles no backward pass.
using call_recorder = void (*)(const concrete_state& c, std::span<const tensor> inputs, std::span<const tensor> outputs);
inline std::atomic<call_recorder>& call_hook() {
  static std::atomic<call_recorder> hook{nullptr};
  return hook;
}
/// The branches of a `cond` node and each one's arguments (indices into the node's
/// captures), as a tape keeps them to differentiate the node.
struct cond_branches {
  graph then_graph;
  std::vector<int> then_args;
  graph else_graph;
  std::vector<int> else_args;
};
/// How `cond` nodes reach the tapes recording in their trace: a function set when the
/// first tape is made, as for calls.
using cond_recorder = void (*)(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                               std::span<const tensor> outputs);
inline std::atomic<cond_recorder>& cond_hook() {
  static std::atomic<cond_recorder> hook{nullptr};
  return hook;
}
/// How `while` nodes reach the tapes recording in their trace, as `cond` nodes do.
class while_op;
using loop_recorder = void (*)(const while_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs);
inline std::atomic<loop_recorder>& loop_hook() {
  static std::atomic<loop_recorder> hook{nullptr};
  return hook;
}
/// Records a `while` node on the tapes of this thread (kiln/autodiff/function_gradient.hpp).
template <class = void>
void record_loop_on_tapes(const while_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs);
/// How kiln::function calls replay their trace op by op for the tapes recording
/// (kiln/autodiff/replay.hpp): set when the first tape is made, as for calls.
using graph_replayer = std::vector<tensor> (*)(const graph& g, std::span<const tensor> args);
inline std::atomic<graph_replayer>& replay_hook() {
  static std::atomic<graph_replayer> hook{nullptr};
  return hook;
}
/// Runs graph `g` node by node for the tapes (kiln/autodiff/replay.hpp).
template <class = void>
std::vector<tensor> replay(const graph& g, std::span<const tensor> args);
/// How a replayed trace's special nodes (variable reads, `cond`, `while`) reach the
/// tapes recording: set when the first tape is made, so that a program without tapes
/// compiles none of it.
using special_recorder = void (*)(const node& n, std::span<const tensor> value, std::size_t at, std::size_t count);
inline std::atomic<special_recorder>& special_hook() {
  static std::atomic<special_recorder> hook{nullptr};
  return hook;
}
/// How a replayed trace's collective nodes (kiln/distributed.hpp) reach the tapes
/// recording: set by the distributed component, which defines their gradients, so that
/// a program without it compiles none of them.
using collective_recorder = void (*)(const special_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs);
inline std::atomic<collective_recorder>& collective_hook() {
  static std::atomic<collective_recorder> hook{nullptr};
  return hook;
}
/// Hands special node `n` to the tapes of this thread (kiln/autodiff/replay.hpp).
template <class = void>
void record_special_on_tapes(const node& n, std::span<const tensor> value, std::size_t at, std::size_t count);
/// Records a `cond` node on the tapes of this thread (kiln/autodiff/function_gradient.hpp).
template <class = void>
void record_cond_on_tapes(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                          std::span<const tensor> outputs);

/// Records a call of concrete function `c` on the tapes of this thread (defined in
/// kiln/autodiff/function_gradient.hpp; a template, compiled where a tape is made).
template <class = void>
void record_function_call(const concrete_state& c, std::span<const tensor> inputs, std::span<const tensor> outputs);

/// A tensor as a tape knows it: an eager one by its elements, a symbolic one by the
/// value of the trace it stands for; or a variable read inside a kiln::function call.
struct tape_key {
  const void* data = nullptr;
  std::uint64_t trace_id = 0;
  int node = -1;
  dtype type;
  shape dims;
  explicit tape_key(const tensor& t) : type(t.dtype()), dims(t.shape()) {
    if (t.is_symbolic())
      trace_id = t.symbol()->trace_id, node = t.symbol()->node;
    else
      data = t.raw_data();
  }
  /// The reads of the variable with identity `variable` inside function calls.
  static tape_key of_variable(const void* variable, dtype t, const shape& s) {
    tape_key k(t, s);
    k.data = variable;
    k.trace_id = ~std::uint64_t{0};
    return k;
  }
  friend bool operator<(const tape_key& a, const tape_key& b) {
    if (a.data != b.data || a.trace_id != b.trace_id || a.node != b.node || a.type != b.type)
      return std::tie(a.data, a.trace_id, a.node, a.type) < std::tie(b.data, b.trace_id, b.node, b.type);
    return std::ranges::lexicographical_compare(a.dims.dims(), b.dims.dims());
  }
  friend bool operator==(const tape_key& a, const tape_key& b) { return !(a < b) && !(b < a); }

 private:
  tape_key(dtype t, const shape& s) : type(t), dims(s) {}
};

/// The tapes recording on this thread, innermost last.
inline std::vector<gradient_tape*>& active_tapes() {
  thread_local std::vector<gradient_tape*> tapes;
  return tapes;
}

template <class = void>
void record_on_active_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out);
template <class = void>
void watch_on_active_tapes(const void* variable, const tensor& value);
template <class = void>
void record_call_on_active_tapes(const std::shared_ptr<const differentiable_call>& call, std::span<const tensor> in,
                                 std::span<const tensor> out);

/// `g` summed over the dims it was broadcast along, as a tensor of shape `to`.
inline tensor unbroadcast(const tensor& g, const shape& to) {
  if (g.shape() == to) return g;
  const int lead = g.rank() - to.rank();
  int_list axes;
  for (int d = 0; d < g.rank(); ++d)
    if (d < lead || (to[d - lead] == 1 && g.shape()[d] != 1)) axes.push_back(d);
  tensor summed = g;
  if (!axes.empty()) {
    const tensor* in[] = {&g};
    summed = run_registered(ops::reduce_sum(reduction_axes(axes), false), in);
  }
  const tensor* in[] = {&summed};
  return run_registered(ops::reshape{to}, in);
}

/// `a + b`, or whichever is defined.
inline tensor sum_defined(const tensor& a, const tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  const tensor* in[] = {&a, &b};
  return run_registered(ops::add{}, in);
}

/// The vector-Jacobian product of a graph (kiln/autodiff/function_gradient.hpp).
template <class = void>
std::vector<tensor> vector_jacobian_product(const graph& g, std::span<const tensor> args, const std::vector<tensor>& sources,
                                            std::span<const tensor> output_grads,
                                            const std::vector<std::tuple<const void*, dtype, shape>>& variables,
                                            std::vector<bool>* connected = nullptr);

/// Registers detail::tape_ops, when a tape is made.
template <class... Ops>
void register_tape_ops(boost::mp11::mp_list<Ops...>) {
  (register_kernels_on_use<Ops>(), ...);
}

}  // namespace detail

/// Records eager ops on watched tensors while alive; `gradient` differentiates a
/// target with respect to sources, as TensorFlow's `tf.GradientTape`.
/// \code
/// kiln::tensor x = kiln::constant(3.f);
/// kiln::gradient_tape tape;
/// tape.watch(x);
/// kiln::tensor y = x * x;
/// std::cout << tape.gradient(y, x);  // tensor(6.0, shape=(), dtype=float32)
/// \endcode
class gradient_tape {
 public:
  // A template, and what it names depends on `Lazy`, so that only a program that makes
  // a tape compiles the formulas' ops and the backward pass of functions.
  template <class Lazy = void>
  explicit gradient_tape(gradient_tape_options options = {})
      : persistent_(options.persistent),
        trace_id_(detail::trace_context::current() ? detail::trace_context::current()->id() : 0) {
    detail::register_tape_ops(detail::tape_ops{});
    detail::tape_hook().store(&detail::record_on_active_tapes<Lazy>, std::memory_order_relaxed);
    detail::variable_read_hook().store(&detail::watch_on_active_tapes<Lazy>, std::memory_order_relaxed);
    detail::call_hook().store(&detail::record_function_call<Lazy>, std::memory_order_relaxed);
    detail::cond_hook().store(&detail::record_cond_on_tapes<Lazy>, std::memory_order_relaxed);
    detail::loop_hook().store(&detail::record_loop_on_tapes<Lazy>, std::memory_order_relaxed);
    detail::special_hook().store(&detail::record_special_on_tapes<Lazy>, std::memory_order_relaxed);
    detail::replay_hook().store(&detail::replay<Lazy>, std::memory_order_relaxed);
    detail::active_tapes().push_back(this);
    ++detail::recording_tapes();
  }
  gradient_tape(const gradient_tape&) = delete;
  gradient_tape& operator=(const gradient_tape&) = delete;
  ~gradient_tape() {
    auto& tapes = detail::active_tapes();
    std::erase(tapes, this);
    if (recording_) --detail::recording_tapes();
  }

  /// Records the ops that read `t` from now on (floating-point tensors only; inside a
  /// kiln::function, symbolic ones too).
  template <class = void>
  void watch(const tensor& t) {
    if (t.defined() && is_floating(t.dtype())) tracked_.emplace(detail::tape_key(t), t);
  }

  /// The gradient of `target` (summed when it is not a scalar) with respect to
  /// `source`: a tensor of the source's shape, or per `unconnected` when the target
  /// does not depend on it (an undefined tensor by default; integer sources never do).
  template <class = void>
  tensor gradient(const tensor& target, const tensor& source,
                  unconnected_gradients unconnected = unconnected_gradients::none) {
    return gradient(target, std::vector<tensor>{source}, unconnected)[0];
  }
  /// Gradients of `target` with respect to each of `sources`.
  template <class = void>
  std::vector<tensor> gradient(const tensor& target, const std::vector<tensor>& sources,
                               unconnected_gradients unconnected = unconnected_gradients::none) {
    std::vector<tensor> out = gradients_of(target, sources);
    for (std::size_t k = 0; k < sources.size(); ++k)
      if (!out[k].defined() && sources[k].defined())
        out[k] = unconnected_gradient(sources[k].dtype(), sources[k].shape(), sources[k].device(), unconnected);
    return out;
  }

  /// The gradient of `target` with respect to variable `v`: the sum over the values
  /// of `v` read while the tape recorded (variables are watched when read).
  /// \code
  /// kiln::variable v(3.f);
  /// kiln::gradient_tape tape;
  /// kiln::tensor y = v * v;
  /// tape.gradient(y, v);  // tensor(6.0, shape=(), dtype=float32)
  /// \endcode
  template <std::same_as<variable> Variable>
  tensor gradient(const tensor& target, const Variable& v, unconnected_gradients unconnected = unconnected_gradients::none) {
    return gradient(target, std::vector<Variable>{v}, unconnected)[0];
  }
  /// Gradients of `target` with respect to each of `vars`, as `apply_gradients` takes them.
  template <std::same_as<variable> Variable>
  std::vector<tensor> gradient(const tensor& target, const std::vector<Variable>& vars,
                               unconnected_gradients unconnected = unconnected_gradients::none) {
    std::vector<std::tuple<const void*, dtype, shape>> ids;
    for (const Variable& v : vars) {
      if (!v) throw invalid_argument_error("gradient_tape.gradient: a source variable is an empty handle");
      ids.emplace_back(v.identity(), v.dtype(), v.shape());
    }
    std::vector<tensor> out = gradients_with_variables(target, {}, ids);
    for (std::size_t k = 0; k < vars.size(); ++k)
      if (!out[k].defined()) out[k] = unconnected_gradient(vars[k].dtype(), vars[k].shape(), kiln::device::cpu, unconnected);
    return out;
  }

 private:
  template <class>
  friend void detail::record_on_active_tapes(const ops::any_op&, std::span<const tensor* const>, tensor&);
  template <class>
  friend void detail::watch_on_active_tapes(const void*, const tensor&);
  template <class>
  friend void detail::record_call_on_active_tapes(const std::shared_ptr<const detail::differentiable_call>&,
                                                 std::span<const tensor>, std::span<const tensor>);
  template <class>
  friend std::vector<tensor> detail::vector_jacobian_product(const graph&, std::span<const tensor>, const std::vector<tensor>&,
                                                             std::span<const tensor>,
                                                             const std::vector<std::tuple<const void*, dtype, shape>>&,
                                                             std::vector<bool>*);

  // The gradients of `target` with respect to `sources`, then to each variable of
  // `ids`: the sum over its values read while recording and its reads inside recorded
  // function calls (undefined where the target depends on none).
  template <class = void>
  std::vector<tensor> gradients_with_variables(
      const tensor& target, std::vector<tensor> sources, const std::vector<std::tuple<const void*, dtype, shape>>& ids);
  // `variables`, when given, adds the gradient of each variable's reads inside function
  // calls after those of `sources`.
  template <class = void>
  std::vector<tensor> gradients_of(
      const tensor& target, const std::vector<tensor>& sources,
      const std::vector<std::tuple<const void*, dtype, shape>>* variables = nullptr);
  // A source the target does not depend on: zeros on request, else an undefined tensor.
  static tensor unconnected_gradient(dtype t, const shape& s, kiln::device d, unconnected_gradients unconnected) {
    if (unconnected == unconnected_gradients::zero && is_floating(t)) return detail::zero_filled("gradient", s, t, d);
    return {};
  }
  template <class = void>
  void watch_read(const void* variable, const tensor& value) {
    if (!records(value)) return;
    const detail::tape_key key(value);
    auto [begin, end] = variable_reads_.equal_range(variable);
    if (std::none_of(begin, end, [&](const auto& read) { return detail::tape_key(read.second) == key; }))
      variable_reads_.emplace(variable, value);
    watch(value);
  }

  // A recorded op, or a recorded function call (`call` set, `op` unused).
  struct entry {
    ops::any_op op;
    std::vector<tensor> inputs;
    std::vector<tensor> outputs;
    std::shared_ptr<const detail::differentiable_call> call;
  };

  // A tape records the values of where it was made: eager ones outside a function,
  // the trace's own inside one (not those of a function traced while it records).
  bool records(const tensor& t) const {
    return recording_ && is_floating(t.dtype()) && (t.is_symbolic() ? t.symbol()->trace_id : 0) == trace_id_;
  }

  template <class = void>
  void record(const ops::any_op& op, std::span<const tensor* const> in, const tensor& out) {
    if (!records(out)) return;
    bool reads_tracked = false;
    for (const tensor* t : in) reads_tracked = reads_tracked || tracked_.count(detail::tape_key(*t)) > 0;
    if (!reads_tracked) return;
    entry e{op, {}, {out}, nullptr};
    for (const tensor* t : in) e.inputs.push_back(*t);
    entries_.push_back(std::move(e));
    tracked_.emplace(detail::tape_key(out), out);
  }

  // A kiln::function call: recorded when it reads a tracked tensor or a variable
  // (variables are watched when read).
  template <class = void>
  void record_call(const std::shared_ptr<const detail::differentiable_call>& call, std::span<const tensor> in,
                   std::span<const tensor> out) {
    if (std::ranges::none_of(out, [&](const tensor& t) { return records(t); })) return;
    bool reads_tracked = !call->variables.empty();
    for (const tensor& t : in) reads_tracked = reads_tracked || tracked_.count(detail::tape_key(t)) > 0;
    if (!reads_tracked) return;
    entries_.push_back(entry{ops::any_op(), {in.begin(), in.end()}, {out.begin(), out.end()}, call});
    for (const tensor& t : out)
      if (is_floating(t.dtype())) tracked_.emplace(detail::tape_key(t), t);
  }

  // Adds `g` to the gradient kept under `key`.
  template <class = void>
  static void accumulate(std::map<detail::tape_key, tensor>& grads, const detail::tape_key& key, const tensor& g) {
    if (!g.defined()) return;  // unconnected
    auto [at, fresh] = grads.emplace(key, g);
    if (!fresh) at->second = detail::sum_defined(at->second, g);
  }

  template <class = void>
  void backpropagate_call(const entry& e, std::map<detail::tape_key, tensor>& grads) const {
    auto reached = [&](const tensor& y) { return is_floating(y.dtype()) && grads.contains(detail::tape_key(y)); };
    if (std::ranges::none_of(e.outputs, reached)) return;
    std::vector<tensor> dys;
    for (const tensor& y : e.outputs)
      if (is_floating(y.dtype())) dys.push_back(reached(y) ? grads.at(detail::tape_key(y)) : detail::zeros_shaped_like(y));
    const std::vector<tensor> g = e.call->backward(e.call->self.get(), e.inputs, dys);
    std::size_t k = 0;
    for (const tensor& x : e.inputs)
      if (is_floating(x.dtype())) accumulate(grads, detail::tape_key(x), g[k++]);
    for (const auto& [id, t, s] : e.call->variables) accumulate(grads, detail::tape_key::of_variable(id, t, s), g[k++]);
  }

  template <class = void>
  void backpropagate(const tensor& target, std::map<detail::tape_key, tensor>& grads) const {
    grads.emplace(detail::tape_key(target),
                  detail::one_filled("gradient", detail::like_shape("gradient", target), target.dtype(), target.device()));
    for (auto e = entries_.rbegin(); e != entries_.rend(); ++e) {
      if (e->call) {
        backpropagate_call(*e, grads);
        continue;
      }
      auto it = grads.find(detail::tape_key(e->outputs[0]));
      if (it == grads.end()) continue;
      const tensor dy = it->second;
      std::vector<tensor> in_grads(e->inputs.size());
      detail::kernels_of(e->op).backward.load(std::memory_order_acquire)(e->op, e->inputs, e->outputs[0], dy, in_grads);
      for (std::size_t i = 0; i < e->inputs.size(); ++i) {
        const tensor& x = e->inputs[i];
        if (in_grads[i].defined() && is_floating(x.dtype()))
          accumulate(grads, detail::tape_key(x), detail::unbroadcast(in_grads[i], x.shape()));
      }
    }
  }

  void pause() {
    if (recording_) --detail::recording_tapes(), recording_ = false;
  }
  void resume() {
    if (!recording_) ++detail::recording_tapes(), recording_ = true;
  }

  bool persistent_ = false;
  std::uint64_t trace_id_;  ///< the trace the tape was made in, 0 outside one
  bool used_ = false;
  bool recording_ = true;
  std::vector<entry> entries_;
  std::map<detail::tape_key, tensor> tracked_;  ///< watched tensors and results of recorded ops, held
  std::multimap<const void*, tensor> variable_reads_;  ///< each variable's values read while recording
};

#if KILN_DEFINE_LIBRARY
template <class>
std::vector<tensor> gradient_tape::gradients_with_variables(
    const tensor& target, std::vector<tensor> sources, const std::vector<std::tuple<const void*, dtype, shape>>& ids) {
  const std::size_t given = sources.size();
  std::vector<std::size_t> first{given};  // where each variable's reads start in `sources`
  for (const auto& [id, t, s] : ids) {
    auto [begin, end] = variable_reads_.equal_range(id);
    for (auto it = begin; it != end; ++it) sources.push_back(it->second);
    first.push_back(sources.size());
  }
  std::vector<tensor> per_source = gradients_of(target, sources, &ids);
  std::vector<tensor> out(per_source.begin(), per_source.begin() + std::ptrdiff_t(given));
  for (std::size_t k = 0; k < ids.size(); ++k) {
    tensor sum = per_source[sources.size() + k];  // the reads inside function calls
    for (std::size_t r = first[k]; r < first[k + 1]; ++r) sum = detail::sum_defined(sum, per_source[r]);
    out.push_back(sum);
  }
  return out;
}
template <class>
std::vector<tensor> gradient_tape::gradients_of(
    const tensor& target, const std::vector<tensor>& sources,
    const std::vector<std::tuple<const void*, dtype, shape>>* variables) {
  if (!target.defined()) throw invalid_argument_error("gradient_tape.gradient: the target is an empty tensor");
  for (std::size_t k = 0; k < sources.size(); ++k)
    if (!sources[k].defined())
      throw invalid_argument_error("gradient_tape.gradient: source " + std::to_string(k) + " is an empty tensor");
  if (used_ && !persistent_)
    throw invalid_argument_error(
        "gradient_tape: a non-persistent tape computes one set of gradients; make it with {.persistent = true}");
  used_ = true;
  std::map<detail::tape_key, tensor> grads;
  {
    // The ops that compute gradients are not this tape's to record (the other tapes
    // of the thread record them).
    struct paused {
      gradient_tape& tape;
      ~paused() { tape.resume(); }
    } guard{(pause(), *this)};
    if (is_floating(target.dtype()) && tracked_.count(detail::tape_key(target))) backpropagate(target, grads);
  }
  std::vector<tensor> out;
  for (const tensor& s : sources) {
    auto it = s.defined() ? grads.find(detail::tape_key(s)) : grads.end();
    out.push_back(it != grads.end() && tracked_.count(it->first) ? it->second : tensor());
  }
  if (variables)
    for (const auto& [id, t, s] : *variables) {
      auto it = grads.find(detail::tape_key::of_variable(id, t, s));
      out.push_back(it != grads.end() ? it->second : tensor());
    }
  if (!persistent_) entries_.clear(), tracked_.clear(), variable_reads_.clear();
  return out;
}
#endif

namespace detail {

/// A copy of eager `x` (numbers, not strings) in a buffer of its own, on x's device.
inline tensor fresh_copy(const tensor& x) {
  tensor copy(x.dtype(), x.shape());
  const tensor host = x.device() == device::cpu ? x : x.to(device::cpu);
  if (x.size() > 0) std::memcpy(copy.raw_data(), host.raw_data(), std::size_t(x.size()) * size_of(x.dtype()));
  return x.device() == device::cpu ? copy : copy.to(x.device());
}

/// `out`, or while gradient tapes record, a copy of it when it is a floating-point
/// view of one of its eager inputs' buffers. Tapes tell eager tensors apart by buffer
/// address, dtype and shape, and a view can share all three with another tensor on
/// the tape (`m[0]` read twice; `reshape(x, {1, n})[0]` and `x`), whose gradient would
/// then be counted twice.
inline tensor unaliased_for_tapes(tensor out, std::span<const tensor* const> in) {
  if (out.is_symbolic() || !is_floating(out.dtype())) return out;
  bool view = false;
  for (const tensor* t : in) view = view || out.shares_buffer_with(*t);
  return view ? fresh_copy(out) : out;
}

template <class>
void record_on_active_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out) {
  out = unaliased_for_tapes(std::move(out), in);
  for (gradient_tape* tape : active_tapes()) tape->record(op, in, out);
}

template <class>
void watch_on_active_tapes(const void* variable, const tensor& value) {
  for (gradient_tape* tape : active_tapes()) tape->watch_read(variable, value);
}

/// Records a call described by `call` on the tapes of this thread.
template <class>
void record_call_on_active_tapes(const std::shared_ptr<const differentiable_call>& call, std::span<const tensor> in,
                                 std::span<const tensor> out) {
  for (gradient_tape* tape : active_tapes()) tape->record_call(call, in, out);
}

}  // namespace detail

/// `x`, cut off from every gradient tape: gradients do not flow through the result.
/// \code kiln::tensor frozen = kiln::stop_gradient(kiln::constant({1.f, 2.f})); \endcode
inline tensor stop_gradient(const tensor& x) {
  if (!x.defined() || x.is_symbolic() || !is_floating(x.dtype())) return x;
  return detail::fresh_copy(x);
}

}  // namespace kiln
// ----- end kiln/autodiff/tape.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_AUTODIFF_TAPE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_PLAN_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_PLAN_HPP
// ----- begin kiln/exec/plan.hpp -----
/// \file
/// Execution plans. A plan is what a graph does for one set of concrete argument
/// dtypes, shapes and devices: every node's concrete dtype and shape (inferred with
/// the ops' own rules), a schedule of only the nodes the outputs need, elementwise
/// nodes of one shape fused into clusters that run tile by tile, the entry point of
/// every op resolved to a function pointer, and a home for every value (reused
/// workspace memory, or a fresh buffer for what leaves the call). A plan is
/// immutable once built; several threads run it at once, each in its own workspace.
/// kiln/exec/planner.hpp builds one; this file holds what a plan is made of.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <variant>
#include <vector>


namespace kiln::detail::exec {

/// Where a value lives while a plan runs.
enum class value_home : std::uint8_t {
  unused,     ///< not needed by any output, or kept in a cluster's tile scratch only
  argument,   ///< the caller's tensor
  constant,   ///< the graph's captured tensor
  slot,       ///< workspace memory reused across calls
  fresh,      ///< a new buffer each call (outputs, strings, values an output may alias)
  evaluated,  ///< assigned by the op itself (detail::evaluated)
};

/// What a plan knows of one node's value.
struct value_info {
  value_home home = value_home::unused;
  dtype type = float32;
  shape dims;
  /// For a value in a slot: its index among the slots of its dtype.
  int slot = -1;
};

/// One elementwise node of a cluster, with the scalar arithmetic folded into its pass
/// (the nodes of that arithmetic get no instruction of their own): operands, result
/// and fold operands are indices into the cluster's per-tile pointer table.
struct instruction {
  backend::cpu::run_fn fn = nullptr;
  compound_fn compound = nullptr;  ///< set, and run instead of `fn`, when `fold` is not empty
  const void* op = nullptr;
  unsigned contig = 0;
  int arity = 0;
  int out = 0;
  std::array<int, 3> in{};
  dtype type = float32;             ///< of the result
  std::string_view native_name{};  ///< op_entry::native_name
  folded_arithmetic fold;
  int folded_ops = 0;  ///< nodes folded into this one
};

/// A cluster compiled to one native loop (kiln/exec/jit.hpp): runs `len` elements,
/// a multiple of padded_elements, of the tile whose pointer table is `table`.
using native_fn = void (*)(void* const* table, std::int64_t len);

/// A value a cluster reads or writes in memory, with the table entry it fills.
struct cluster_operand {
  int value = 0;
  int entry = 0;
  std::size_t element_bytes = 0;
  bool written = false;  ///< a result of the cluster (else an input)
};

/// A value read by a cluster in the shape of another (a row or column vector):
/// gathered per tile into a buffer of the tile scratch.
struct gathered_operand {
  int value = 0;
  int entry = 0;
  broadcast_read read;
};

/// A value check to run before a cluster.
struct cluster_check {
  check_fn fn = nullptr;
  const void* op = nullptr;
  std::vector<int> inputs;
  int node = -1;  ///< the node it checks, which its error names
};

/// Instructions always run on a multiple of this many elements, so that their SIMD
/// loops never end in a scalar remainder (a scalar tanh costs as much as a batch).
/// The last elements of a cluster that are not a multiple run in staging buffers,
/// padded with copies of the last element, so padded lanes see only valid values
/// (no integer division by garbage zero).
inline constexpr std::int64_t padded_elements = 64 / sizeof(float);
/// Bytes of one staging buffer: `padded_elements` of the widest dtype.
inline constexpr std::size_t staging_bytes = padded_elements * sizeof(double);

/// Elementwise nodes of one result shape evaluated together, tile by tile.
/// The pointer table of a tile holds, in order: `buffers` tile buffers (scratch of
/// the cluster's intermediates, then gathered operands), then one entry per
/// operand in memory. A chunk's scratch holds the tile buffers, then one staging
/// buffer per streamed operand.
struct fused_cluster {
  std::vector<int> nodes;  ///< the graph nodes fused, in order
  shape dims;
  std::int64_t size = 0;
  std::int64_t tile = 0;         ///< elements per tile
  std::size_t buffer_bytes = 0;  ///< bytes per tile buffer (a multiple of 64)
  int buffers = 0;               ///< scratch buffers, gathered buffers included
  int table_size = 0;
  std::vector<instruction> code;
  std::vector<cluster_operand> streamed;   ///< arguments or results of the cluster's shape: advance per tile
  std::vector<cluster_operand> broadcast;  ///< one-element operands: read with stride 0
  std::vector<gathered_operand> gathered;
  std::vector<int> allocated;  ///< results with a fresh buffer, created before the cluster runs
  std::vector<cluster_check> checks;
  native_fn native = nullptr;  ///< set when the cluster was compiled (function_options::jit_compile)

  /// Whether one pass over memory runs the whole cluster (a native loop, or one
  /// instruction): its streams are then regular enough for the hardware prefetcher.
  bool single_pass() const { return native || code.size() == 1; }
  /// Entries between the pointer tables of two chunks: whole cache lines.
  int table_stride() const { return (table_size + 7) & ~7; }
  std::size_t chunk_bytes() const { return std::size_t(buffers) * buffer_bytes + streamed.size() * staging_bytes; }
};

/// A step that runs one op through its op_fn.
struct op_step {
  int value = -1;  ///< the op's node
  op_fn run = nullptr;
  const void* op = nullptr;
  bool allocate = false;  ///< the op's result is fresh and has a kernel: allocate it first
  std::vector<int> inputs;
};

/// A step that runs a special op (a variable access, a print, a conditional, a loop):
/// its results are values `value`, `value + 1`, ...
struct special_step {
  int value = -1;
  std::vector<int> inputs;
};

/// A step that runs fused cluster `cluster` of execution_plan::clusters.
struct cluster_step {
  int cluster = -1;
};

/// One step of a schedule, and the fresh values whose last reader it is.
struct plan_step {
  std::variant<op_step, special_step, cluster_step> action;
  std::vector<int> release;
};

/// Dtype, device and shape of one argument, as a plan's key holds them.
struct argument_key {
  dtype type = float32;
  device place = device::cpu;
  shape dims;
  bool operator==(const argument_key&) const = default;
};

/// What a graph does for one set of argument dtypes, devices and shapes.
struct execution_plan {
  /// Distinguishes plans for the workspaces bound to them (never reused).
  std::uint64_t id = next_id();
  std::vector<argument_key> key;
  /// Run node by node through detail::execute: some tensor is not on the CPU, or a
  /// rule fails for these shapes (execution then raises the eager error in order).
  bool interpreted = false;
  node_map<value_info> values;
  std::vector<plan_step> steps;
  std::vector<fused_cluster> clusters;
  std::vector<int> outputs;  ///< the value of each output
  std::vector<int> fresh;    ///< values created during a call, cleared after it
  std::vector<int> bound;    ///< values in slots: bound once per workspace
  std::array<std::vector<std::int64_t>, dtype_count> slot_elements;  ///< per dtype, per slot
  std::size_t max_inputs = 0;
  int max_table = 0;
  /// Interpreted plans for arguments on a GPU: the graph's CPU constants, copied
  /// there once, since a trace records no device (`x + 1` on a GPU tensor traces a
  /// CPU scalar 1).
  std::vector<std::pair<int, tensor>> moved_constants;

  /// True when the arguments have this plan's dtypes, devices and shapes.
  bool accepts(std::span<const tensor> args) const {
    if (args.size() != key.size()) return false;
    for (std::size_t i = 0; i < args.size(); ++i)
      if (args[i].dtype() != key[i].type || args[i].device() != key[i].place || args[i].shape() != key[i].dims) return false;
    return true;
  }

 private:
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }
};

/// True for the nodes a schedule runs: registry ops, special ops and their results.
template <class = void>
bool computed(const node& n) {
  return n.kind() == node_kind::op || n.kind() == node_kind::special || n.kind() == node_kind::result;
}

/// The part of planning that does not depend on shapes: which nodes the outputs and
/// the effects need (non-strict execution), and where each output comes from.
struct graph_outline {
  template <class = void>
  explicit graph_outline(const graph& g) : needed(g.nodes().size(), false) {
    const int n = needed.size();
    for (int out : g.outputs()) {
      int source = out;
      while (g.node_at(source).kind() == node_kind::identity) source = g.node_at(source).input_ids()[0];
      outputs.push_back(source);
      needed[source] = true;
    }
    for (int i = 0; i < n; ++i)
      if (g.node_at(i).kind() == node_kind::special && g.node_at(i).special().has_effects()) needed[i] = true;
    for (int i = n; i-- > 0;)
      if (needed[i])
        for (int in : g.node_at(i).input_ids()) needed[in] = true;
    for (int i = 0; i < n; ++i)
      if (needed[i] && computed(g.node_at(i))) ops.push_back(i);
    release.resize(ops.size());
    node_map<int> last_reader(g.nodes().size(), -1);
    for (std::size_t k = 0; k < ops.size(); ++k)
      for (int in : g.node_at(ops[k]).input_ids()) last_reader[in] = int(k);
    for (int out : outputs) last_reader[out] = -1;
    for (int i = 0; i < n; ++i)
      if (last_reader[i] >= 0 && computed(g.node_at(i))) release[std::size_t(last_reader[i])].push_back(i);
  }
  node_map<bool> needed;
  std::vector<int> ops;      ///< needed op nodes, in graph (topological) order
  std::vector<int> outputs;  ///< the value node of each output
  /// For node by node execution: the op values whose last reader is ops[k].
  std::vector<std::vector<int>> release;
};

/// Each op of an interpreted cluster passes over a whole tile before the next op
/// starts, so a tile's memory traffic overlaps its compute only when the pass is
/// short: at 256 elements (16 AVX-512 batches) the out-of-order core runs one op while
/// the loads of the next tile, prefetched, arrive. Tiles of 2048 measured 1.5x slower
/// on a chain of five ops over 16M floats.
inline constexpr std::int64_t interpreted_max_tile = 256;
/// A native loop (function_options::jit_compile), or a cluster of one instruction once
/// its arithmetic is folded, streams memory in one pass with its intermediates in
/// registers: long tiles spare it calls (256 measured 1.8x slower for a native loop).
inline constexpr std::int64_t single_pass_max_tile = 4096;

/// Sets the tile of cluster `c` (at most `max_tile` elements) and its buffers' size:
/// the tile scratch of a chunk stays within about 32 KiB, to stay in L1.
template <class = void>
void set_tile(fused_cluster& c, std::int64_t max_tile) {
  constexpr std::size_t budget_bytes = std::size_t(32) << 10;
  constexpr std::int64_t min_tile = 64;
  const std::int64_t budget = std::int64_t(budget_bytes / (sizeof(double) * std::size_t(std::max(c.buffers, 1))));
  std::int64_t tile = std::clamp(budget, min_tile, max_tile) & ~std::int64_t(63);
  // One tile for a small cluster, rounded up so every tile buffer stays 64-byte aligned.
  if (c.size < tile) tile = std::max<std::int64_t>((c.size + 63) & ~std::int64_t(63), min_tile);
  c.tile = tile;
  c.buffer_bytes = std::size_t(tile) * sizeof(double);
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/plan.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_PLAN_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_PLANNER_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_PLANNER_HPP
// ----- begin kiln/exec/planner.hpp -----
/// \file
/// The planner: builds the execution_plan of a graph for one set of arguments by
/// passing data through its stages, each a function of its own file:
///
///     infer_values ─▶ form_clusters ─▶ schedule_steps ─▶ plan_memory ─▶ lower_cluster
///     (infer_values)  (fusion)         (fusion)          (memory_plan)  (lowering, fold)

#include <algorithm>
#include <memory>
#include <span>
#include <variant>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_FUSION_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_FUSION_HPP
// ----- begin kiln/exec/fusion.hpp -----
/// \file
/// The planner's fusion and scheduling stages.
///
/// Fusion: a cluster grows along producer-to-consumer edges between elementwise
/// nodes of the same result shape, in graph order. Once anything outside a cluster
/// reads one of its values, the cluster is closed, so it can run as one step at
/// the place of its last node without reordering a reader before it. Values that
/// only the cluster reads live in per-tile scratch and never reach memory. An op
/// with a value check (integer floordiv, floormod, pow) joins a cluster only as a
/// node whose inputs come from outside it, so its check runs on real values before
/// the cluster starts, as eager execution would run it.

#include <algorithm>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_INFER_VALUES_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_INFER_VALUES_HPP
// ----- begin kiln/exec/infer_values.hpp -----
/// \file
/// The planner's first stage: the concrete dtype and dims of every node the outputs
/// need, for one set of arguments, by the ops' own rules, and each op's entry points.

#include <optional>
#include <span>
#include <vector>


namespace kiln::detail::exec {

/// Every needed node's value (dtype and dims; arguments and constants also get their
/// home) and the entry points of its op.
struct typed_nodes {
  node_map<value_info> values;
  node_map<op_entry> entries;
};

/// The typed nodes of graph `g` for `args`, or nothing when the plan must interpret:
/// a tensor off the CPU, a rule that fails for these shapes, or a shape the rules
/// leave partly unknown.
/// For example `if (auto typed = infer_values(g, outline, args)) form_clusters(g, outline, *typed);`.
template <class = void>
std::optional<typed_nodes> infer_values(const graph& g, const graph_outline& outline, std::span<const tensor> args) {
  const std::size_t n = g.nodes().size();
  typed_nodes t{node_map<value_info>(n), node_map<op_entry>(n)};
  const auto& arguments = g.arguments();
  if (arguments.size() != args.size()) return std::nullopt;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].device() != device::cpu) return std::nullopt;
    t.values[arguments[i]] = {value_home::argument, args[i].dtype(), args[i].shape()};
  }
  for (int i = 0; i < outline.needed.size(); ++i) {
    const node& c = g.node_at(i);
    if (!outline.needed[i] || c.kind() != node_kind::constant) continue;
    if (c.value().device() != device::cpu) return std::nullopt;
    t.values[i] = {value_home::constant, c.value().dtype(), c.value().shape()};
  }
  std::vector<dtype> dtypes;
  std::vector<shape> shapes;
  for (int id : outline.ops) {
    const node& op_node = g.node_at(id);
    value_info& v = t.values[id];
    if (op_node.kind() != node_kind::op) {
      // A special op's results have the dtypes and shapes traced for them; it
      // makes its own tensors, which may be its inputs (evaluated, like reshape).
      if (!op_node.shape().is_fully_defined()) return std::nullopt;
      v.type = op_node.dtype();
      v.dims = op_node.shape();
      t.entries[id].evaluates = true;
      continue;
    }
    dtypes.clear();
    shapes.clear();
    for (int in : op_node.input_ids()) {
      dtypes.push_back(t.values[in].type);
      shapes.push_back(t.values[in].dims);
    }
    // Through the op's row rather than a visit of every op, so that a source file
    // compiles the rules of the ops it runs.
    const op_rules& rules = *kernels_of(op_node.operation()).rules.load(std::memory_order_acquire);
    const void* op = op_node.operation().address();
    const dtype_result dt = rules.result_dtype(op, dtypes);
    const shape_result sh = rules.result_shape(op, shapes);
    if (!dt.ok() || !sh.ok() || !sh.value.is_fully_defined()) return std::nullopt;
    v.type = dt.value;
    v.dims = sh.value;
    const dtype in = dtypes.empty() ? v.type : dtypes[std::size_t(ops::value_operand_of(op_node.operation()))];
    bool text = v.type == string;
    for (dtype d : dtypes) text = text || d == string;
    t.entries[id] = entry_of(op_node.operation(), text ? string : in, v.type);
  }
  return t;
}

/// For a plan that interprets arguments on one GPU: the graph's needed CPU constants,
/// copied there once (a trace records no device: `x + 1` on a GPU tensor traces a
/// CPU scalar 1).
template <class = void>
std::vector<std::pair<int, tensor>> moved_constants(const graph& g, const graph_outline& outline,
                                                    std::span<const tensor> args) {
  std::vector<std::pair<int, tensor>> moved;
  if (args.empty()) return moved;
  const device d = args[0].device();
  for (const tensor& a : args)
    if (a.device() != d) return moved;
  if (d == device::cpu) return moved;
  for (int i = 0; i < outline.needed.size(); ++i) {
    const node& c = g.node_at(i);
    if (outline.needed[i] && c.kind() == node_kind::constant && c.value().device() == device::cpu && c.value().dtype() != string)
      moved.emplace_back(i, c.value().to(d));
  }
  return moved;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/infer_values.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_INFER_VALUES_HPP

namespace kiln::detail::exec {

/// Elementwise nodes grouped into clusters that run as one step each.
struct clustering {
  std::vector<std::vector<int>> members;  ///< per cluster, its nodes in graph order
  node_map<int> cluster_of;               ///< a node's cluster, -1 for none
};

/// The clusters of the needed nodes of `g` (see the file comment).
/// For example `x * 2 + 1` on one shape is one cluster of two nodes.
template <class = void>
clustering form_clusters(const graph& g, const graph_outline& outline, const typed_nodes& typed) {
  struct group {
    std::vector<int> members;
    bool open = true;
  };
  std::vector<group> groups;
  node_map<int> cluster_of(g.nodes().size(), -1);
  auto close_reader_of = [&](int input) {
    if (cluster_of[input] >= 0) groups[std::size_t(cluster_of[input])].open = false;
  };
  auto dims_of = [&](const group& gr) -> const shape& { return typed.values[gr.members[0]].dims; };
  std::vector<int> joined;
  for (int id : outline.ops) {
    const node& n = g.node_at(id);
    const op_entry& e = typed.entries[id];
    if (!e.tile) {
      for (int in : n.input_ids()) close_reader_of(in);
      continue;
    }
    // A checked op takes all its inputs from outside its cluster (see the file comment).
    joined.clear();
    for (int in : n.input_ids()) {
      const int c = cluster_of[in];
      if (c < 0) continue;
      group& gr = groups[std::size_t(c)];
      if (gr.open && !e.check && dims_of(gr) == typed.values[id].dims) {
        if (std::find(joined.begin(), joined.end(), c) == joined.end()) joined.push_back(c);
      } else {
        gr.open = false;
      }
    }
    int target;
    if (joined.empty()) {
      target = int(groups.size());
      groups.emplace_back();
    } else {
      target = joined[0];
      for (std::size_t k = 1; k < joined.size(); ++k) {
        group& from = groups[std::size_t(joined[k])];
        for (int m : from.members) cluster_of[m] = target;
        auto& to = groups[std::size_t(target)].members;
        to.insert(to.end(), from.members.begin(), from.members.end());
        from.members.clear();
      }
    }
    groups[std::size_t(target)].members.push_back(id);
    cluster_of[id] = target;
  }

  // Number the groups that were not merged into others.
  clustering result{{}, std::move(cluster_of)};
  std::vector<int> number(groups.size(), -1);
  for (std::size_t c = 0; c < groups.size(); ++c) {
    if (groups[c].members.empty()) continue;
    number[c] = int(result.members.size());
    std::sort(groups[c].members.begin(), groups[c].members.end());
    result.members.push_back(std::move(groups[c].members));
  }
  for (int id : outline.ops)
    if (result.cluster_of[id] >= 0) result.cluster_of[id] = number[std::size_t(result.cluster_of[id])];
  return result;
}

/// The steps of a plan in order, and the step that defines each value.
struct schedule {
  std::vector<plan_step> steps;
  node_map<int> step_of;  ///< -1 for values no step defines
};

/// Ops run at their own place in graph order, a cluster at the place of its last node.
/// Cluster steps are numbered as `clusters` numbers them.
template <class = void>
schedule schedule_steps(const graph& g, const graph_outline& outline, const typed_nodes& typed,
                        const clustering& clusters) {
  struct placed {
    int place;             // the node whose place in graph order the step takes
    int op = -1;           // the op node, or -1 for a cluster
    int cluster = -1;
    bool operator<(const placed& o) const { return place < o.place; }
  };
  std::vector<placed> order;
  for (int id : outline.ops)
    if (clusters.cluster_of[id] < 0 && g.node_at(id).kind() != node_kind::result) order.push_back({id, id, -1});
  for (std::size_t c = 0; c < clusters.members.size(); ++c) order.push_back({clusters.members[c].back(), -1, int(c)});
  std::sort(order.begin(), order.end());

  schedule s{{}, node_map<int>(g.nodes().size(), -1)};
  for (const placed& p : order) {
    const int step = int(s.steps.size());
    if (p.op < 0) {
      for (int m : clusters.members[std::size_t(p.cluster)]) s.step_of[m] = step;
      s.steps.push_back({cluster_step{p.cluster}, {}});
    } else if (g.node_at(p.op).kind() == node_kind::special) {
      // Its results are the nodes after it; one with none still defines its own node.
      for (int k = 0; k < std::max(g.node_at(p.op).result_count(), 1); ++k) s.step_of[p.op + k] = step;
      s.steps.push_back({special_step{p.op, g.node_at(p.op).input_ids()}, {}});
    } else {
      const op_entry& e = typed.entries[p.op];
      s.step_of[p.op] = step;
      s.steps.push_back({op_step{p.op, e.run, e.op, false, g.node_at(p.op).input_ids()}, {}});
    }
  }
  return s;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/fusion.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_FUSION_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_LOWERING_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_LOWERING_HPP
// ----- begin kiln/exec/lowering.hpp -----
/// \file
/// The planner's lowering stage: a cluster's nodes become a tile program, the
/// instructions of the ops that run (with arithmetic folded into them) over a table
/// of tile buffers and operands in memory.

#include <algorithm>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_MEMORY_PLAN_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_MEMORY_PLAN_HPP
// ----- begin kiln/exec/memory_plan.hpp -----
/// \file
/// The planner's memory stage: which values reach memory, where each lives (reused
/// workspace slots, fresh buffers, or the tensors of the caller and the graph), and
/// the step after which a fresh value is dropped.

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>


namespace kiln::detail::exec {

/// Workspace slots of one dtype, reused by values whose lives do not overlap. A value
/// takes a free slot when its step runs and gives it back after its last read, so no
/// step writes where it reads.
template <class = void>
class slot_allocator {
 public:
  /// A slot of at least `elements` elements, busy through step `until`: the smallest
  /// idle slot that fits, else the largest (which then grows), else a new one.
  int take(std::int64_t elements, int until) {
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (sizes_[std::size_t(*it)] >= elements && (best == idle_.end() || sizes_[std::size_t(*it)] < sizes_[std::size_t(*best)]))
        best = it;
    if (best == idle_.end())
      best = std::max_element(idle_.begin(), idle_.end(), [&](int a, int b) { return sizes_[std::size_t(a)] < sizes_[std::size_t(b)]; });
    int slot;
    if (best == idle_.end()) {
      slot = int(sizes_.size());
      sizes_.push_back(elements);
    } else {
      slot = *best;
      idle_.erase(best);
      sizes_[std::size_t(slot)] = std::max(sizes_[std::size_t(slot)], elements);
    }
    busy_.push_back({slot, until});
    return slot;
  }

  /// Makes the slots whose values are last read at step `step` or before idle.
  void finish_step(int step) {
    for (std::size_t i = 0; i < busy_.size();) {
      if (busy_[i].until <= step) {
        idle_.push_back(busy_[i].slot);
        busy_[i] = busy_.back();
        busy_.pop_back();
      } else {
        ++i;
      }
    }
  }

  /// Elements per slot.
  std::vector<std::int64_t> sizes() && { return std::move(sizes_); }

 private:
  struct live_slot {
    int slot;
    int until;
  };
  std::vector<std::int64_t> sizes_;
  std::vector<live_slot> busy_;
  std::vector<int> idle_;
};

/// Where the values of a plan live.
struct memory_plan {
  node_map<bool> in_memory;  ///< values a cluster must write (read outside it, or outputs)
  std::vector<int> fresh;    ///< values created during a call, cleared after it
  std::vector<int> bound;    ///< values in slots
  std::vector<std::vector<int>> release;  ///< per step: fresh values it reads last
  std::array<std::vector<std::int64_t>, dtype_count> slot_elements;  ///< per dtype, per slot
};

/// The memory plan of the scheduled steps `s`; sets the home of every op's value in
/// `values`, and the slot of those in slots.
template <class = void>
memory_plan plan_memory(const graph& g, const graph_outline& outline, const node_map<op_entry>& entries,
                        const clustering& clusters, const schedule& s, node_map<value_info>& values) {
  const std::size_t n = g.nodes().size();
  const int end = int(s.steps.size());
  memory_plan m{node_map<bool>(n, false), {}, {}, std::vector<std::vector<int>>(s.steps.size()), {}};

  // The step that reads each value last (the end of the call for outputs).
  node_map<int> last_use(n, -1);
  for (int id : outline.ops)
    for (int in : g.node_at(id).input_ids()) {
      last_use[in] = std::max(last_use[in], s.step_of[id]);
      const int c = clusters.cluster_of[in];
      if (c >= 0 && c != clusters.cluster_of[id]) m.in_memory[in] = true;
    }
  node_map<bool> is_output(n, false);
  for (int out : outline.outputs) {
    last_use[out] = end;
    m.in_memory[out] = true;
    is_output[out] = true;
  }

  // Values linked through ops that re-describe buffers (reshape) may share memory:
  // if one of them is an output, none of them may live in reused memory, and the
  // memory of one lives as long as any of them is read.
  node_map<int> root(n);
  for (int v = 0; v < root.size(); ++v) root[v] = v;
  auto find = [&](int v) {
    while (root[v] != v) v = root[v] = root[root[v]];
    return v;
  };
  for (int id : outline.ops)
    if (entries[id].evaluates)
      for (int in : g.node_at(id).input_ids()) root[find(in)] = find(id);
  node_map<bool> escapes(n, false);
  node_map<int> family_last_use(n, -1);
  for (int id : outline.ops) {
    const int r = find(id);
    // A special op may keep what it reads (a variable keeps what is assigned to it).
    escapes[r] = escapes[r] || is_output[id] || g.node_at(id).kind() == node_kind::special;
    family_last_use[r] = std::max(family_last_use[r], last_use[id]);
  }

  for (int id : outline.ops) {
    value_info& v = values[id];
    if (clusters.cluster_of[id] >= 0 && !m.in_memory[id])
      v.home = value_home::unused;
    else if (entries[id].evaluates)
      v.home = value_home::evaluated;
    else if (v.type == string || escapes[find(id)])
      v.home = value_home::fresh;
    else
      v.home = value_home::slot;
    if (v.home == value_home::fresh || v.home == value_home::evaluated) m.fresh.push_back(id);
    if (v.home == value_home::slot) m.bound.push_back(id);
  }

  // Fresh values are dropped after their last reader; outputs at the end of the call.
  for (int id : m.fresh)
    if (last_use[id] >= 0 && last_use[id] < end) m.release[std::size_t(last_use[id])].push_back(id);

  std::array<slot_allocator<>, dtype_count> slots;
  std::vector<std::vector<int>> defined(s.steps.size());
  for (int id : m.bound) defined[std::size_t(s.step_of[id])].push_back(id);
  for (int k = 0; k < end; ++k) {
    for (int id : defined[std::size_t(k)]) {
      value_info& v = values[id];
      v.slot = slots[std::size_t(v.type)].take(std::max<std::int64_t>(v.dims.num_elements(), 1),
                                                std::max(family_last_use[find(id)], k));
    }
    for (slot_allocator<>& a : slots) a.finish_step(k);
  }
  for (int t = 0; t < dtype_count; ++t) m.slot_elements[std::size_t(t)] = std::move(slots[std::size_t(t)]).sizes();
  return m;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/memory_plan.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_MEMORY_PLAN_HPP

namespace kiln::detail::exec {

/// An op of a cluster that runs, with the values it reads (its operands, then its
/// fold operands) and the value it defines (the last of its folded arithmetic).
struct lowered_op {
  int op;
  int result;
  std::vector<int> reads;
};

/// The ops of cluster `members` that run once `f`'s arithmetic is folded, in order.
template <class = void>
std::vector<lowered_op> ops_that_run(const graph& g, const std::vector<int>& members, const folds& f) {
  std::vector<lowered_op> code;
  for (int id : members) {
    if (f.folded[id]) continue;
    lowered_op l{id, f.result[id] >= 0 ? f.result[id] : id, {}};
    if (f.input[id] >= 0)
      l.reads.push_back(f.input[id]);
    else
      l.reads = g.node_at(id).input_ids();
    const folded_arithmetic& a = f.arithmetic[id];
    for (const fold_operand* o : {&a.pre_scale, &a.pre_shift, &a.scale, &a.shift})
      if (o->entry >= 0) l.reads.push_back(o->entry);
    code.push_back(std::move(l));
  }
  return code;
}

/// Tile buffers for the results of `code` that stay out of memory, each reused once
/// its last reader in the cluster has run: a node's buffer (-1 for none), and how
/// many there are.
template <class = void>
std::pair<node_map<int>, int> scratch_buffers(const std::vector<lowered_op>& code, const node_map<bool>& in_memory,
                                              auto inside) {
  node_map<int> last_read(std::size_t(in_memory.size()), -1);
  for (std::size_t k = 0; k < code.size(); ++k)
    for (int in : code[k].reads) last_read[in] = int(k);
  node_map<int> scratch_of(std::size_t(in_memory.size()), -1);
  std::vector<int> free_scratch;
  int count = 0;
  for (std::size_t k = 0; k < code.size(); ++k) {
    const int id = code[k].result;
    if (!in_memory[id]) {
      if (free_scratch.empty()) {
        scratch_of[id] = count++;
      } else {
        scratch_of[id] = free_scratch.back();
        free_scratch.pop_back();
      }
    }
    for (int in : code[k].reads)
      if (inside(in) && scratch_of[in] >= 0 && last_read[in] == int(k) &&
          std::find(free_scratch.begin(), free_scratch.end(), scratch_of[in]) == free_scratch.end())
        free_scratch.push_back(scratch_of[in]);
  }
  return {std::move(scratch_of), count};
}

/// The tile program of cluster `cluster` of `clusters`, whose values have their homes.
/// Its pointer table holds the scratch buffers, then gathered operands, then the
/// operands in memory (streamed, broadcast, and the results written).
template <class = void>
fused_cluster lower_cluster(const graph& g, const node_map<op_entry>& entries, const clustering& clusters, int cluster,
                            const node_map<value_info>& values, const memory_plan& memory) {
  const std::vector<int>& members = clusters.members[std::size_t(cluster)];
  auto inside = [&](int v) { return clusters.cluster_of[v] == cluster; };
  fused_cluster c;
  c.nodes = members;
  c.dims = values[members[0]].dims;
  c.size = c.dims.num_elements();
  const folds f = fold_arithmetic(g, members, values, entries, memory.in_memory, inside);
  const std::vector<lowered_op> code = ops_that_run(g, members, f);
  const auto [scratch_of, scratch] = scratch_buffers(code, memory.in_memory, inside);

  // Operands outside the cluster: streamed in place, broadcast, or gathered.
  std::vector<int> externals;
  for (const lowered_op& l : code)
    for (int in : l.reads)
      if (!inside(in) && std::find(externals.begin(), externals.end(), in) == externals.end()) externals.push_back(in);
  std::vector<int> gathered_values;
  for (int in : externals) {
    const std::int64_t count = values[in].dims.num_elements();
    if (count != c.size && count != 1) gathered_values.push_back(in);
  }
  c.buffers = scratch + int(gathered_values.size());

  node_map<int> entry_of_value(g.nodes().size(), -1);
  for (std::size_t i = 0; i < gathered_values.size(); ++i) {
    const int in = gathered_values[i];
    entry_of_value[in] = scratch + int(i);
    c.gathered.push_back({in, scratch + int(i), broadcast_read(values[in].type, values[in].dims, c.dims)});
  }
  int next = c.buffers;
  for (int in : externals) {
    if (entry_of_value[in] >= 0) continue;
    entry_of_value[in] = next;
    const cluster_operand op{in, next++, size_of(values[in].type)};
    (values[in].dims.num_elements() == c.size ? c.streamed : c.broadcast).push_back(op);
  }
  for (const lowered_op& l : code) {
    const int id = l.result;
    if (scratch_of[id] >= 0) {
      entry_of_value[id] = scratch_of[id];
    } else {
      entry_of_value[id] = next;
      c.streamed.push_back({id, next++, size_of(values[id].type), true});
      if (values[id].home == value_home::fresh) c.allocated.push_back(id);
    }
  }
  c.table_size = next;

  for (const lowered_op& l : code) {
    const op_entry& e = entries[l.op];
    instruction ins;
    ins.fn = e.tile;
    ins.op = e.op;
    ins.arity = int(g.node_at(l.op).input_ids().size());
    ins.out = entry_of_value[l.result];
    ins.type = values[l.result].type;
    ins.native_name = e.native_name;
    for (int k = 0; k < ins.arity; ++k) {
      const int in = l.reads[std::size_t(k)];
      ins.in[std::size_t(k)] = entry_of_value[in];
      const bool one_value = !inside(in) && values[in].dims.num_elements() == 1 && c.size != 1;
      if (!one_value) ins.contig |= 1u << k;
    }
    const folded_arithmetic& a = f.arithmetic[l.op];
    ins.folded_ops = f.count[l.op];
    if (a.pre || l.result != l.op) {
      ins.compound = e.compound;
      ins.fold = a;
      for (fold_operand* o : {&ins.fold.pre_scale, &ins.fold.pre_shift, &ins.fold.scale, &ins.fold.shift})
        if (o->entry >= 0) o->entry = entry_of_value[o->entry];
    }
    c.code.push_back(ins);
  }
  set_tile(c, c.single_pass() ? single_pass_max_tile : interpreted_max_tile);
  for (int id : members)
    if (const op_entry& e = entries[id]; e.check) c.checks.push_back({e.check, e.op, g.node_at(id).input_ids(), id});
  return c;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/lowering.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_LOWERING_HPP

namespace kiln::detail::exec {

/// The plan of graph `g` (outlined by `outline`) for `args`.
/// For example `build_plan(g, graph_outline(g), args)->steps.size()`.
template <class = void>
std::unique_ptr<execution_plan> build_plan(const graph& g, const graph_outline& outline, std::span<const tensor> args) {
  auto p = std::make_unique<execution_plan>();
  for (const tensor& a : args) p->key.push_back({a.dtype(), a.device(), a.shape()});
  p->outputs = outline.outputs;
  std::optional<typed_nodes> typed = infer_values(g, outline, args);
  if (!typed) {
    p->interpreted = true;
    p->moved_constants = moved_constants(g, outline, args);
    return p;
  }
  const clustering clusters = form_clusters(g, outline, *typed);
  schedule s = schedule_steps(g, outline, *typed, clusters);
  p->values = std::move(typed->values);
  memory_plan memory = plan_memory(g, outline, typed->entries, clusters, s, p->values);

  p->steps = std::move(s.steps);
  for (std::size_t k = 0; k < p->steps.size(); ++k) {
    plan_step& step = p->steps[k];
    step.release = std::move(memory.release[k]);
    if (auto* op = std::get_if<op_step>(&step.action)) {
      op->allocate = p->values[op->value].home == value_home::fresh;
      p->max_inputs = std::max(p->max_inputs, op->inputs.size());
    } else if (auto* special = std::get_if<special_step>(&step.action)) {
      p->max_inputs = std::max(p->max_inputs, special->inputs.size());
    }
  }
  for (std::size_t c = 0; c < clusters.members.size(); ++c) {
    fused_cluster& cluster = p->clusters.emplace_back(lower_cluster(g, typed->entries, clusters, int(c), p->values, memory));
    p->max_table = std::max(p->max_table, cluster.table_size);
    for (const cluster_check& k : cluster.checks) p->max_inputs = std::max(p->max_inputs, k.inputs.size());
  }
  p->fresh = std::move(memory.fresh);
  p->bound = std::move(memory.bound);
  p->slot_elements = std::move(memory.slot_elements);
  return p;
}

}  // namespace kiln::detail::exec
// ----- end kiln/exec/planner.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_PLANNER_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_WORKSPACE_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_WORKSPACE_HPP
// ----- begin kiln/exec/workspace.hpp -----
/// \file
/// The memory one run of a plan works in: a tensor per graph value, the reused
/// buffers ("slots") of values that never leave the call, and the tile scratch of
/// fused clusters. A workspace serves one run at a time and is kept for the next,
/// so a call in steady state allocates only its outputs. Workspaces are shared by
/// all plans of a graph: a slot grows to the largest size any plan asks for.

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>


namespace kiln::detail::exec {

/// 64-byte aligned bytes from kiln's host allocator, kept until a larger size is asked for.
class scratch_buffer {
 public:
  scratch_buffer() = default;
  scratch_buffer(const scratch_buffer&) = delete;
  scratch_buffer& operator=(const scratch_buffer&) = delete;
  ~scratch_buffer() { host_allocator().deallocate(data_, bytes_); }

  /// At least `bytes` bytes; the previous contents are not kept.
  char* reserve(std::size_t bytes) {
    if (bytes > bytes_) {
      host_allocator().deallocate(data_, bytes_);
      data_ = nullptr;
      bytes_ = 0;
      data_ = static_cast<char*>(host_allocator().allocate(bytes));
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  char* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class workspace {
 public:
  /// The plan the values and slots are laid out for (execution_plan::id), 0 for none.
  std::uint64_t bound_plan = 0;
  /// One tensor per graph node: slot views, fresh buffers and evaluated results.
  std::vector<tensor> values;
  /// Where each value is: an argument, a constant of the graph, or `values[i]`.
  std::vector<const tensor*> refs;
  /// Input pointers of the op or check being run.
  std::vector<const tensor*> inputs;
  /// Base pointers of a cluster's operands in memory, by table entry.
  std::vector<void*> bases;

  /// Lays the workspace out for plan `p` of graph `g`; allocates only slots that grow.
  template <class = void>
  void bind(const graph& g, const execution_plan& p) {
    const std::size_t n = std::size_t(p.values.size());
    values.assign(n, tensor());
    refs.assign(n, nullptr);
    for (std::size_t i = 0; i < n; ++i) {
      switch (p.values[int(i)].home) {
        case value_home::constant: refs[i] = &g.nodes()[i].value(); break;
        case value_home::slot:
        case value_home::fresh:
        case value_home::evaluated: refs[i] = &values[i]; break;
        default: break;
      }
    }
    for (int t = 0; t < dtype_count; ++t) {
      const auto& need = p.slot_elements[std::size_t(t)];
      auto& have = slots_[std::size_t(t)];
      if (have.size() < need.size()) have.resize(need.size());
      for (std::size_t k = 0; k < need.size(); ++k)
        if (!have[k].defined() || have[k].size() < need[k]) have[k] = tensor(dtype(t), shape{need[k]});
    }
    for (int v : p.bound) {
      const value_info& info = p.values[v];
      values[std::size_t(v)] = slots_[std::size_t(info.type)][std::size_t(info.slot)].share(info.dims);
    }
    inputs.resize(std::max(inputs.size(), p.max_inputs));
    bases.resize(std::max(bases.size(), std::size_t(p.max_table)));
    bound_plan = p.id;
  }

  /// Tile scratch for `chunks` chunks of cluster `c`: buffers, then pointer tables.
  template <class = void>
  void reserve_chunks(const fused_cluster& c, std::int64_t chunks, char*& buffers, void**& tables) {
    buffers = scratch_.reserve(std::size_t(chunks) * c.chunk_bytes());
    // Whole cache lines per chunk: threads that write their tables for every tile
    // must not share a line.
    constexpr std::size_t line_entries = 64 / sizeof(void*);
    const std::size_t entries = std::size_t(chunks) * std::size_t(c.table_stride()) + line_entries - 1;
    if (tables_.size() < entries) tables_.resize(entries);
    const auto misaligned = reinterpret_cast<std::uintptr_t>(tables_.data()) / sizeof(void*) % line_entries;
    tables = tables_.data() + (misaligned ? line_entries - misaligned : 0);
  }

 private:
  std::array<std::vector<tensor>, dtype_count> slots_;
  scratch_buffer scratch_;
  std::vector<void*> tables_;
};

}  // namespace kiln::detail::exec
// ----- end kiln/exec/workspace.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_WORKSPACE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_EXECUTOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_EXECUTOR_HPP
// ----- begin kiln/exec/executor.hpp -----
/// \file
/// Runs a graph on concrete tensors. The first call with new argument dtypes, devices
/// and shapes builds a plan (kiln/exec/plan.hpp) and caches it; later calls find it
/// with a few comparisons and run it in a workspace kept from earlier calls: fused
/// clusters tile by tile (large ones over the thread pool), other ops through
/// function pointers chosen at planning. Tensors off the CPU, and shapes a rule
/// rejects, run node by node through detail::execute, which raises eager's errors.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <variant>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_JIT_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_JIT_HPP
// ----- begin kiln/exec/jit.hpp -----
/// \file
/// Native loops for fused clusters, the code generation behind
/// `function_options::jit_compile`. A tiled cluster runs one op at a time over a
/// tile, storing every intermediate in a tile buffer; a native loop runs all of the
/// cluster's ops on one xsimd batch after another, with the intermediates in
/// registers, as a hand-written loop would. The loop calls the ops' own functors
/// (kiln/ops/elementwise.hpp) and folded arithmetic's scale_and_shift
/// (kiln/exec/fold.hpp), so it computes the tiled kernels' bits.
///
/// The source of a loop is compiled by the system C++ compiler into a shared
/// library, loaded with dlopen and kept on disk under a name derived from its text
/// and kiln's headers, so a later process loads it without compiling. Settings come
/// from the environment:
/// - `KILN_JIT_CXX`: the compiler (default `c++`);
/// - `KILN_JIT_FLAGS`: more flags, separated by spaces (say `-I` for xsimd);
/// - `KILN_JIT_CACHE`: the directory (default `$XDG_CACHE_HOME/kiln/jit` or
///   `~/.cache/kiln/jit`).
/// When a loop cannot be compiled or loaded, its cluster runs tiled, and kiln says
/// why once on stderr.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

// POSIX calls rather than <filesystem> and <fstream>, which every file that includes
// kiln would parse (about 0.1 s of the include) for a feature few programs turn on.
#if __has_include(<dlfcn.h>) && __has_include(<spawn.h>) && __has_include(<sys/wait.h>) && __has_include(<dirent.h>)
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define KILN_HAS_NATIVE_LOOPS 1
extern char** environ;
#else
#define KILN_HAS_NATIVE_LOOPS 0
#endif

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

namespace kiln::detail::exec {

/// The C++ element type of a dtype that native loops handle, or "" for others.
template <class = void>
std::string_view native_type_name(dtype t) {
  switch (t) {
    case float32: return "float";
    case float64: return "double";
    case int32: return "std::int32_t";
    case int64: return "std::int64_t";
    default: return {};
  }
}

/// This header's absolute path: under kiln's own headers, or the single header itself.
template <class = void>
std::string jit_header() {
  std::string path = __FILE__;
#if KILN_HAS_NATIVE_LOOPS
  if (!path.starts_with('/'))
    if (char* cwd = ::getcwd(nullptr, 0)) {
      path = std::string(cwd) + '/' + path;
      std::free(cwd);
    }
#endif
  return path;
}

/// The directory holding kiln's own headers (`.../include/`), or "" when kiln is
/// used through its single header.
template <class = void>
std::string kiln_include_root() {
  const std::string here = jit_header();
  const std::string own = "kiln/exec/jit.hpp";
  return here.ends_with(own) ? here.substr(0, here.size() - own.size()) : std::string();
}

/// The lines a native loop's source starts with: kiln's op functors, folded
/// arithmetic and xsimd. From kiln's own headers (found with `-I`
/// kiln_include_root()), only those; from the single header, all of it, with the
/// library parts declared only.
template <class = void>
std::string native_prelude() {
  std::string s = "#include <cstdint>\n#include <type_traits>\n#include <xsimd/xsimd.hpp>\n";
  if (!kiln_include_root().empty())
    return s + "#include \"kiln/backend/cpu/streaming.hpp\"\n#include \"kiln/exec/fold.hpp\"\n";
  return s + "#define KILN_SEPARATE_COMPILATION 1\n#include \"" + jit_header() + "\"\n";
}

/// The source of cluster `c` as one native loop, `extern "C" kiln_native_loop` of
/// type native_fn; "" when the cluster has fewer than two ops, folded ones included
/// (nothing to keep in registers), or an op has no SIMD functor for the cluster's
/// one dtype. Like the elementwise kernels, a loop whose results are too large for
/// the cache writes them with non-temporal stores.
/// It holds lines such as `const B v0 = kiln::ops::abs{}(m3);`.
template <class = void>
KILN_COLD std::string native_source(const fused_cluster& c) {
  std::size_t ops = 0;
  for (const instruction& i : c.code) ops += 1 + std::size_t(i.folded_ops);
  if (ops < 2) return {};
  const dtype type = c.code[0].type;
  const std::string_view element = native_type_name(type);
  if (element.empty()) return {};
  for (const instruction& i : c.code)
    if (i.native_name.empty() || i.type != type) return {};

  // Table entries below `c.buffers` are tile buffers: the cluster's intermediates
  // (kept in registers here) and gathered operands (loaded). Entries from
  // `c.buffers` on are operands in memory: loaded, one broadcast value, or stored.
  std::string setup, body, written;
  std::vector<std::string> held(std::size_t(c.table_size));  // the register holding an entry's value
  std::vector<bool> splat(std::size_t(c.table_size), false);
  auto operand = [&](int entry, bool contiguous) {
    const std::size_t e = std::size_t(entry);
    const std::string n = std::to_string(e);
    if (!contiguous) {
      if (!splat[e]) setup += "  const B s" + n + "(*static_cast<const T*>(table[" + n + "]));\n";
      splat[e] = true;
      return "s" + n;
    }
    if (held[e].empty()) {
      setup += "  const T* const p" + n + " = static_cast<const T*>(table[" + n + "]);\n";
      body += "      const B m" + n + " = B::load_unaligned(p" + n + " + i);\n";
      held[e] = "m" + n;
    }
    return held[e];
  };
  for (std::size_t k = 0; k < c.code.size(); ++k) {
    const instruction& ins = c.code[k];
    const bool folded = ins.compound != nullptr;
    std::string call = std::string(ins.native_name) + "{}(";
    for (int a = 0; a < ins.arity; ++a) {
      std::string x = operand(ins.in[std::size_t(a)], (ins.contig >> a) & 1u);
      if (folded && ins.fold.pre) x = scale_and_shift_source(x, ins.fold.pre_scale, ins.fold.pre_shift, operand);
      call += (a ? ", " : "") + x;
    }
    call += ")";
    if (folded) call = scale_and_shift_source(call, ins.fold.scale, ins.fold.shift, operand);
    const std::string v = "v" + std::to_string(k), n = std::to_string(ins.out);
    body += "      const B " + v + " = " + call + ";\n";
    held[std::size_t(ins.out)] = v;
    if (ins.out >= c.buffers) {
      setup += "  T* const w" + n + " = static_cast<T*>(table[" + n + "]);\n";
      body += "      kiln::backend::cpu::store_batch<decltype(stream)::value>(" + v + ", w" + n + " + i);\n";
      written += " && reinterpret_cast<std::uintptr_t>(w" + n + ") % sizeof(B) == 0";
    }
  }
  const bool large = std::size_t(c.size) * size_of(type) >= backend::cpu::streaming_bytes;
  std::string s = "// kiln native loop:";
  for (const instruction& i : c.code) s += " " + std::string(i.native_name.substr(i.native_name.rfind(':') + 1));
  s += "\n" + native_prelude();
  s += "extern \"C\" void kiln_native_loop(void* const* table, std::int64_t len) {\n";
  s += "  using T = " + std::string(element) + ";\n  using B = xsimd::batch<T>;\n";
  s += "  static_assert(" + std::to_string(padded_elements) + " % B::size == 0, \"lengths are multiples of the padding\");\n";
  s += setup;
  s += "  const auto loop = [&](auto stream) {\n    for (std::int64_t i = 0; i < len; i += B::size) {\n" + body + "    }\n  };\n";
  if (large) {
    s += "  if (true" + written + ") {\n    loop(std::true_type{});\n    kiln::backend::cpu::streaming_fence();\n    return;\n  }\n";
  }
  s += "  loop(std::false_type{});\n}\n";
  return s;
}

/// Compiles and loads native loops, once per source text per process (and once per
/// machine, through the disk cache). Thread-safe; loaded libraries stay loaded. (A
/// template, as this header's functions are, so that only a program that turns
/// jit_compile on compiles it.)
template <class = void>
class native_compiler {
 public:
  static native_compiler& instance() {
    static native_compiler compiler;
    return compiler;
  }

  /// The loop of `source` (from native_source), or nullptr when it cannot be had.
  native_fn load(const std::string& source) {
    std::lock_guard lock(mutex_);
    if (auto it = loaded_.find(source); it != loaded_.end()) return it->second;
    std::string why;
    native_fn fn = compile_and_load(source, why);
    if (!fn && !warned_) {
      warned_ = true;
      std::fprintf(stderr, "kiln: jit_compile: %s; fused clusters run tiled instead\n", why.c_str());
    }
    loaded_.emplace(source, fn);
    return fn;
  }

  /// How many loops were compiled (not found on disk) by this process.
  int compiled_count() const {
    std::lock_guard lock(mutex_);
    return compiled_;
  }

 private:
  static std::string setting(const char* name, std::string fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
  }

#if KILN_HAS_NATIVE_LOOPS
  static std::string cache_directory() {
    if (const char* d = std::getenv("KILN_JIT_CACHE"); d && *d) return d;
    if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kiln/jit";
    if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/kiln/jit";
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-jit";
  }

  // Every file below `dir`, at any depth; a link to a directory is listed, not
  // followed (a link back up would never end).
  static void files_below(const std::string& dir, std::vector<std::string>& out) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string path = dir + '/' + name;
      struct ::stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode))
        files_below(path, out);
      else
        out.push_back(path);
    }
    ::closedir(d);
  }

  // Sizes and times of kiln's headers, so that a loop compiled against other
  // headers is not loaded.
  KILN_COLD static std::string headers_fingerprint() {
    std::string s;
    auto add = [&](const std::string& p) {
      struct ::stat st {};
      if (::stat(p.c_str(), &st) != 0) return;
      std::int64_t modified = std::int64_t(st.st_mtime) * 1000000000;
#if defined(__linux__)
      modified += st.st_mtim.tv_nsec;
#endif
      s += p + ':' + std::to_string(std::int64_t(st.st_size)) + ':' + std::to_string(modified) + ';';
    };
    if (const std::string root = kiln_include_root(); !root.empty()) {
      std::vector<std::string> files;
      files_below(root + "kiln", files);
      std::sort(files.begin(), files.end());
      for (const std::string& p : files) add(p);
    } else {
      add(jit_header());
    }
    return s;
  }

  static std::uint64_t fnv1a(std::string_view text) {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
    return h;
  }

  static std::string read_text(const std::string& path) {
    std::string text;
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      char buffer[4096];
      for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
      std::fclose(f);
    }
    return text;
  }

  static bool write_text(const std::string& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    return std::fclose(f) == 0 && written;
  }

  // mkdir -p: each missing directory of `dir`, in turn.
  static void make_directories(const std::string& dir) {
    for (std::size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1))
      ::mkdir(dir.substr(0, slash).c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
  }
#endif

  KILN_COLD native_fn compile_and_load(const std::string& source, std::string& why) {
#if KILN_HAS_NATIVE_LOOPS
    const std::string cxx = setting("KILN_JIT_CXX", "c++");
    std::vector<std::string> args = {cxx, "-std=c++20", "-O3", "-march=native", "-fPIC", "-shared", "-w"};
    if (const std::string root = kiln_include_root(); !root.empty()) args.push_back("-I" + root);
    std::istringstream extra(setting("KILN_JIT_FLAGS", ""));
    for (std::string flag; extra >> flag;) args.push_back(flag);

    static const std::string fingerprint = headers_fingerprint();
    std::string key_text = source + '\n' + fingerprint;
    for (const std::string& a : args) key_text += '\n' + a;
    char name[32];
    std::snprintf(name, sizeof name, "kiln-%016llx", static_cast<unsigned long long>(fnv1a(key_text)));
    const std::string dir = cache_directory(), stem = dir + '/' + name;
    const std::string library = stem + ".so", text = stem + ".cpp", log = stem + ".log";
    make_directories(dir);

    // The disk copy is used when its source is this one; otherwise compile under
    // names of this process, then rename, so that concurrent processes never load
    // a half-written library.
    if (!(::access(library.c_str(), F_OK) == 0 && read_text(text) == source)) {
      const std::string own = stem + '.' + std::to_string(::getpid());
      const std::string tmp_library = own + ".so", tmp_text = own + ".cpp";
      if (!write_text(tmp_text, source)) {
        why = "cannot write " + tmp_text;
        return nullptr;
      }
      args.insert(args.end(), {"-o", tmp_library, tmp_text});
      const int status = run(args, log);
      if (status != 0) {
        ::unlink(tmp_text.c_str());
        why = "`" + cxx + "` failed (" + (status < 0 ? "could not start" : "exit " + std::to_string(status)) +
              "), see " + log;
        return nullptr;
      }
      if (std::rename(tmp_library.c_str(), library.c_str()) != 0 || std::rename(tmp_text.c_str(), text.c_str()) != 0) {
        why = "cannot place " + library + ": " + std::strerror(errno);
        return nullptr;
      }
      ++compiled_;
    }
    void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      why = std::string("dlopen: ") + ::dlerror();
      return nullptr;
    }
    if (void* symbol = ::dlsym(handle, "kiln_native_loop")) return reinterpret_cast<native_fn>(symbol);
    why = library + " has no kiln_native_loop";
    return nullptr;
#else
    (void)source;
    why = "no dlopen or posix_spawn on this platform";
    return nullptr;
#endif
  }

#if KILN_HAS_NATIVE_LOOPS
  // Runs a command without a shell, its output into `log`; the exit status, or -1.
  static int run(const std::vector<std::string>& args, const std::string& log) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    const int started = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (started != 0) return -1;
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
      if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
#endif

  mutable std::mutex mutex_;
  std::unordered_map<std::string, native_fn> loaded_;  // by source; nullptr for a failure
  bool warned_ = false;
  int compiled_ = 0;
};

/// Compiles the clusters of plan `p` that native loops handle.
template <class = void>
KILN_COLD void compile_native_loops(execution_plan& p) {
  for (fused_cluster& c : p.clusters)
    if (std::string source = native_source(c); !source.empty()) {
      c.native = native_compiler<>::instance().load(source);
      if (c.native) set_tile(c, single_pass_max_tile);
    }
}

/// How executors with native loops reach compile_native_loops: set by
/// function_options::jit_compile where a program turns it on. Through a pointer, so
/// that a program that never does compiles none of this header's functions.
using native_loop_compiler = void (*)(execution_plan&);
inline std::atomic<native_loop_compiler>& native_loops_hook() {
  static std::atomic<native_loop_compiler> hook{nullptr};
  return hook;
}

}  // namespace kiln::detail::exec

namespace kiln::detail {
template <class>
struct native_loops {
  static void enable() { exec::native_loops_hook().store(&exec::compile_native_loops<>, std::memory_order_release); }
};
}  // namespace kiln::detail
// ----- end kiln/exec/jit.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_JIT_HPP

namespace kiln::detail {

/// Runs one graph, from any number of threads at once.
/// \code
/// kiln::function twice([](const kiln::tensor& x) { return x + x; });
/// const kiln::graph g = twice.get_concrete_function(kiln::constant(2.f)).graph();
/// kiln::detail::graph_executor run(g);
/// std::vector<kiln::tensor> out = run.run(std::vector<kiln::tensor>{kiln::constant(2.f)});  // [4]
/// \endcode
/// (A template on nothing, as the planner's functions are, so that a program compiles
/// the executor and the planner only where it runs a graph.)
template <class = void>
class basic_graph_executor {
 public:
  /// Plans kept per executor; calls with yet other shapes plan for themselves.
  static constexpr int max_cached_plans = 32;

  /// With `native_loops`, fused clusters are compiled to native loops (kiln/exec/jit.hpp).
  explicit basic_graph_executor(const graph& g, jit_switch native_loops = {}) : graph_(&g), outline_(g), native_(native_loops) {}
  basic_graph_executor(const basic_graph_executor&) = delete;
  basic_graph_executor& operator=(const basic_graph_executor&) = delete;

  /// Runs the graph on `args` (one eager tensor per placeholder) and returns the outputs.
  std::vector<tensor> run(std::span<const tensor> args) const {
    std::vector<tensor> outputs;
    run(args, outputs);
    return outputs;
  }

  /// The same, with the outputs in `outputs` (cleared first): a caller that keeps the
  /// vector makes a call in steady state allocate nothing but what the kernels need.
  void run(std::span<const tensor> args, std::vector<tensor>& outputs) const;

  /// How many plans this executor has cached (one per argument shape set seen).
  int cached_plans() const { return cached_count_.load(std::memory_order_acquire); }

  /// The schedule for `args`, one step per word: an op's name, or a fused cluster
  /// as its ops in brackets (braces for a native loop); `interpreted` when the graph
  /// runs node by node.
  /// For example `"[mul add] matmul [tanh]"`.
  std::string schedule(std::span<const tensor> args) const {
    std::unique_ptr<exec::execution_plan> transient;
    const exec::execution_plan& p = find_plan(args, transient);
    if (p.interpreted) return "interpreted";
    std::string s;
    for (const exec::plan_step& step : p.steps) {
      if (!s.empty()) s += ' ';
      const auto* cluster = std::get_if<exec::cluster_step>(&step.action);
      if (!cluster) {
        const auto* op = std::get_if<exec::op_step>(&step.action);
        const int value = op ? op->value : std::get<exec::special_step>(step.action).value;
        s += graph_->node_at(value).op();
        continue;
      }
      const exec::fused_cluster& c = p.clusters[std::size_t(cluster->cluster)];
      s += c.native ? '{' : '[';
      for (int id : c.nodes) s += std::string(graph_->node_at(id).op()) + ' ';
      s.back() = c.native ? '}' : ']';
    }
    return s;
  }

 private:
  // A workspace for one run: taken from the idle slot without locking in the common
  // single-caller case, returned with the call's fresh values released.
  class lease {
   public:
    lease(const basic_graph_executor& owner, const exec::execution_plan& p) : owner_(owner), plan_(p), ws_(owner.acquire()) {}
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      for (int v : plan_.fresh) ws_->values[std::size_t(v)] = tensor();
      owner_.give_back(ws_);
    }
    exec::workspace* operator->() const { return ws_; }
    exec::workspace& operator*() const { return *ws_; }

   private:
    const basic_graph_executor& owner_;
    const exec::execution_plan& plan_;
    exec::workspace* ws_;
  };

  exec::workspace* acquire() const {
    if (exec::workspace* w = idle_.exchange(nullptr, std::memory_order_acquire)) return w;
    std::lock_guard lock(workspace_mutex_);
    if (!spare_.empty()) {
      exec::workspace* w = spare_.back();
      spare_.pop_back();
      return w;
    }
    return workspaces_.emplace_back(std::make_unique<exec::workspace>()).get();
  }
  void give_back(exec::workspace* w) const {
    exec::workspace* empty = nullptr;
    if (idle_.compare_exchange_strong(empty, w, std::memory_order_release)) return;
    std::lock_guard lock(workspace_mutex_);
    spare_.push_back(w);
  }

  const exec::execution_plan& find_plan(std::span<const tensor> args, std::unique_ptr<exec::execution_plan>& transient) const {
    if (const exec::execution_plan* p = recent_.load(std::memory_order_acquire); p && p->accepts(args)) return *p;
    if (const exec::execution_plan* p = find_cached(args, cached_count_.load(std::memory_order_acquire))) return *p;
    std::lock_guard lock(plans_mutex_);
    const int count = cached_count_.load(std::memory_order_relaxed);
    if (const exec::execution_plan* p = find_cached(args, count)) return *p;  // planned by another thread meanwhile
    auto fresh = exec::build_plan(*graph_, outline_, args);
    if (native_)
      if (const exec::native_loop_compiler compile = exec::native_loops_hook().load(std::memory_order_acquire))
        compile(*fresh);
    if (count == max_cached_plans) {
      transient = std::move(fresh);
      return *transient;
    }
    const exec::execution_plan* p = owned_plans_.emplace_back(std::move(fresh)).get();
    cached_[std::size_t(count)].store(p, std::memory_order_release);
    cached_count_.store(count + 1, std::memory_order_release);
    recent_.store(p, std::memory_order_release);
    return *p;
  }
  const exec::execution_plan* find_cached(std::span<const tensor> args, int count) const {
    for (int i = 0; i < count; ++i) {
      const exec::execution_plan* p = cached_[std::size_t(i)].load(std::memory_order_acquire);
      if (p->accepts(args)) {
        recent_.store(p, std::memory_order_release);
        return p;
      }
    }
    return nullptr;
  }

  static std::span<const tensor* const> gather_inputs(const std::vector<int>& ids, exec::workspace& ws) {
    for (std::size_t k = 0; k < ids.size(); ++k) ws.inputs[k] = ws.refs[std::size_t(ids[k])];
    return {ws.inputs.data(), ids.size()};
  }

  static void run_op(const exec::op_step& s, const exec::execution_plan& p, exec::workspace& ws) {
    tensor& out = ws.values[std::size_t(s.value)];
    if (s.allocate) {
      const exec::value_info& v = p.values[s.value];
      out = tensor(v.type, v.dims);
    }
    s.run(s.op, gather_inputs(s.inputs, ws), out);
  }

  // Runs the special op of node `id` and stores its results in the values of `id`
  // and the Result nodes after it.
  void run_special(int id, std::span<const tensor* const> inputs, std::vector<tensor>& values) const {
    const node& n = graph_->node_at(id);
    n.special().run(inputs, std::span(values).subspan(std::size_t(id), std::size_t(n.result_count())));
  }

  void run_cluster(const exec::fused_cluster& c, const exec::execution_plan& p, exec::workspace& ws) const {
    for (const exec::cluster_check& k : c.checks) {
      try {
        k.fn(k.op, gather_inputs(k.inputs, ws));
      } catch (const error&) {
        rethrow_at_node(k.node);
      }
    }
    for (int v : c.allocated) {
      const exec::value_info& info = p.values[v];
      try {
        ws.values[std::size_t(v)] = tensor(info.type, info.dims);
      } catch (const error&) {  // out of memory
        rethrow_at_node(v);
      }
    }
    if (c.size == 0) return;
    void** bases = ws.bases.data();
    for (const auto* list : {&c.streamed, &c.broadcast})
      for (const exec::cluster_operand& o : *list) bases[o.entry] = ws.refs[std::size_t(o.value)]->raw_data();
    for (const exec::gathered_operand& o : c.gathered) bases[o.entry] = ws.refs[std::size_t(o.value)]->raw_data();

    // Chunks of whole tiles, each with its own scratch; one chunk runs inline.
    std::int64_t chunks = 1;
    if (c.size > backend::cpu::elementwise_grain)
      chunks = balanced_chunks(c.size, backend::cpu::elementwise_grain, config::num_threads());
    const std::int64_t per_chunk = ((c.size + chunks - 1) / chunks + c.tile - 1) / c.tile * c.tile;
    chunks = (c.size + per_chunk - 1) / per_chunk;
    char* buffers = nullptr;
    void** tables = nullptr;
    ws.reserve_chunks(c, chunks, buffers, tables);
    auto chunk = [&](std::int64_t k) {
      run_chunk(c, bases, buffers + std::size_t(k) * c.chunk_bytes(), tables + k * c.table_stride(), k * per_chunk,
                std::min(c.size, (k + 1) * per_chunk));
    };
    if (chunks == 1) {
      chunk(0);
    } else {
      parallel_for(chunks, 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t k = lo; k < hi; ++k) chunk(k);
      });
    }
  }

  static void run_chunk(const exec::fused_cluster& c, void* const* bases, char* buffers, void** table, std::int64_t lo,
                        std::int64_t hi) {
    for (int b = 0; b < c.buffers; ++b) table[b] = buffers + std::size_t(b) * c.buffer_bytes;
    for (const exec::cluster_operand& o : c.broadcast) table[o.entry] = bases[o.entry];
    for (std::int64_t t = lo; t < hi; t += c.tile) {
      const std::int64_t len = std::min(c.tile, hi - t);
      const std::int64_t whole = len / exec::padded_elements * exec::padded_elements;
      if (whole > 0) {
        for (const exec::cluster_operand& o : c.streamed)
          table[o.entry] = static_cast<char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes);
        for (const exec::gathered_operand& o : c.gathered) o.read.gather(o.read, bases[o.entry], table[o.entry], t, whole);
        if (const std::int64_t ahead = t + prefetch_distance * c.tile; !c.single_pass() && ahead < hi)
          prefetch_tile(c, bases, ahead, std::min(c.tile, hi - ahead));
        run_code(c, table, whole);
      }
      if (whole < len) run_staged(c, bases, buffers + std::size_t(c.buffers) * c.buffer_bytes, table, t + whole, len - whole);
    }
  }

  // Tiles ahead that prefetch_tile asks for: one tile of a five-op chain takes about
  // as long as a trip to memory, and with two threads sharing the bus one tile ahead
  // measured 1.45x the hand loop on 16M floats, two tiles 1.16x.
  static constexpr std::int64_t prefetch_distance = 2;

  // Asks for the memory of the streamed operands of the tile from `t` on, `len`
  // elements, while the current tile computes: the hardware prefetcher sees no
  // stream during a compute-bound op, so without this every tile would start with
  // a wait for memory. (A single pass streams: the hardware keeps up, and on AMD Zen 4
  // these prefetches made a folded chain 1.45x slower than none.)
  // Written operands too, so that their stores do not wait for the lines to be read
  // for ownership.
  static void prefetch_tile(const exec::fused_cluster& c, void* const* bases, std::int64_t t, std::int64_t len) {
    constexpr std::int64_t line = 64;
    for (const exec::cluster_operand& o : c.streamed) {
      const char* p = static_cast<const char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes);
      const std::int64_t bytes = len * std::int64_t(o.element_bytes);
      for (std::int64_t b = 0; b < bytes; b += line) prefetch_line(p + b);
    }
  }

  // GCC may delete a loop whose only effect is __builtin_prefetch (C++ loops are
  // assumed to finish, and a prefetch is no side effect), so on x86 the prefetch is
  // an asm statement the compiler must keep.
  static void prefetch_line(const char* p) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*p));
#else
    __builtin_prefetch(p, 0, 3);
#endif
  }

  static void run_code(const exec::fused_cluster& c, void* const* table, std::int64_t len) {
    if (c.native) return c.native(table, len);
    for (const exec::instruction& i : c.code) {
      if (i.compound) {
        i.compound(i.op, i.contig, i.fold, table[i.out], table, i.in.data(), len);
      } else {
        // Entry by entry: one wide load of entries just stored could not be forwarded
        // from those stores and would wait for every older one, the tile's included.
        const void* operands[3];
        for (int k = 0; k < i.arity; ++k) operands[k] = table[i.in[std::size_t(k)]];
        i.fn(i.op, i.contig, table[i.out], operands, len, false);
      }
    }
  }

  // The last `len` (< padded_elements) elements of a cluster, from `t` on: inputs are
  // copied to staging buffers and padded with their last element, the code runs on
  // padded_elements, and the results are copied back.
  static void run_staged(const exec::fused_cluster& c, void* const* bases, char* staging, void** table, std::int64_t t,
                         std::int64_t len) {
    auto pad = [len](char* p, std::size_t bytes) {
      for (std::int64_t i = len; i < exec::padded_elements; ++i) std::memcpy(p + i * bytes, p + (len - 1) * bytes, bytes);
    };
    for (std::size_t k = 0; k < c.streamed.size(); ++k) {
      const exec::cluster_operand& o = c.streamed[k];
      char* s = staging + k * exec::staging_bytes;
      table[o.entry] = s;
      if (o.written) continue;
      std::memcpy(s, static_cast<const char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes), std::size_t(len) * o.element_bytes);
      pad(s, o.element_bytes);
    }
    for (const exec::gathered_operand& o : c.gathered) {
      o.read.gather(o.read, bases[o.entry], table[o.entry], t, len);
      pad(static_cast<char*>(table[o.entry]), o.read.element_bytes);
    }
    run_code(c, table, exec::padded_elements);
    for (std::size_t k = 0; k < c.streamed.size(); ++k) {
      const exec::cluster_operand& o = c.streamed[k];
      if (o.written)
        std::memcpy(static_cast<char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes), staging + k * exec::staging_bytes,
                    std::size_t(len) * o.element_bytes);
    }
  }

  // Node by node on eager tensors, as eager execution runs them: the path for
  // tensors off the CPU, and for calls whose shapes some op's rule rejects.
  std::vector<tensor> interpret(std::span<const tensor> args, const exec::execution_plan* p = nullptr) const {
    const graph& g = *graph_;
    std::vector<tensor> values(g.nodes().size());
    for (std::size_t i = 0; i < args.size(); ++i) values[std::size_t(g.arguments()[i])] = args[i];
    auto needed_constant = [&](int i) { return outline_.needed[i] && g.node_at(i).kind() == node_kind::constant; };
    for (int i = 0; i < outline_.needed.size(); ++i)
      if (needed_constant(i)) values[std::size_t(i)] = g.node_at(i).value();
    if (p)
      for (const auto& [id, moved] : p->moved_constants) values[std::size_t(id)] = moved;
    // A constant may be an op's result folded at trace time.
    const bool checking = debugging::check_numerics_enabled();
    if (checking)
      for (int i = 0; i < outline_.needed.size(); ++i)
        if (needed_constant(i)) check_numerics(g.node_at(i).op(), values[std::size_t(i)], g.node_at(i).name());
    for (std::size_t k = 0; k < outline_.ops.size(); ++k) {
      const int id = outline_.ops[k];
      const node& n = g.node_at(id);
      small_vector<const tensor*, 4> inputs;
      inputs.reserve(n.input_ids().size());
      for (int in : n.input_ids()) inputs.emplace_back(&values[std::size_t(in)]);
      try {
        if (n.kind() == node_kind::special) {
          run_special(id, std::span<const tensor* const>(inputs.begin(), inputs.size()), values);
        } else if (n.kind() == node_kind::op) {
          values[std::size_t(id)] = execute_any(n.operation(), inputs);
        }
      } catch (const error&) {
        rethrow_at_node(id);
      }
      if (checking)
        for (int r = id; r < id + std::max(n.result_count(), 1); ++r) check_numerics(n.op(), values[std::size_t(r)], n.name());
      for (int r : outline_.release[k]) values[std::size_t(r)] = tensor();
    }
    std::vector<tensor> outputs;
    outputs.reserve(outline_.outputs.size());
    for (int v : outline_.outputs) outputs.push_back(values[std::size_t(v)]);
    return outputs;
  }

  // The error in flight, raised again naming graph node `id`, as TensorFlow's graph
  // errors name their node.
  [[noreturn]] KILN_COLD KILN_NOINLINE void rethrow_at_node(int id) const {
    rethrow_with_prefix("node '" + graph_->node_at(id).name() + "': ");
  }

  const graph* graph_;
  exec::graph_outline outline_;
  bool native_ = false;

  mutable std::mutex plans_mutex_;  // guards owned_plans_ and publishing new plans
  mutable std::vector<std::unique_ptr<exec::execution_plan>> owned_plans_;
  mutable std::array<std::atomic<const exec::execution_plan*>, max_cached_plans> cached_{};
  mutable std::atomic<int> cached_count_{0};
  mutable std::atomic<const exec::execution_plan*> recent_{nullptr};

  mutable std::mutex workspace_mutex_;  // guards workspaces_ and spare_
  mutable std::vector<std::unique_ptr<exec::workspace>> workspaces_;
  mutable std::vector<exec::workspace*> spare_;
  mutable std::atomic<exec::workspace*> idle_{nullptr};
};

using graph_executor = basic_graph_executor<>;

#if KILN_DEFINE_LIBRARY
template <class Lazy>
void basic_graph_executor<Lazy>::run(std::span<const tensor> args, std::vector<tensor>& outputs) const {
  outputs.clear();
  if (args.size() != graph_->arguments().size())
    throw invalid_argument_error("the graph takes " + std::to_string(graph_->arguments().size()) + " arguments, got " +
                                 std::to_string(args.size()));
  // check_numerics names the op that produced a NaN or an Inf, so every op's
  // result must exist: node by node, no fusion.
  const bool eager = std::all_of(args.begin(), args.end(), [](const tensor& a) { return a.defined() && !a.is_symbolic(); });
  if (debugging::check_numerics_enabled() || !eager) {
    outputs = interpret(args);
    return;
  }
  std::unique_ptr<exec::execution_plan> transient;
  const exec::execution_plan& p = find_plan(args, transient);
  if (p.interpreted) {
    outputs = interpret(args, &p);
    return;
  }

  lease ws(*this, p);
  if (ws->bound_plan != p.id) ws->bind(*graph_, p);
  const auto& arguments = graph_->arguments();
  for (std::size_t i = 0; i < args.size(); ++i) ws->refs[std::size_t(arguments[i])] = &args[i];
  for (const exec::plan_step& s : p.steps) {
    if (const auto* op = std::get_if<exec::op_step>(&s.action)) {
      try {
        run_op(*op, p, *ws);
      } catch (const error&) {
        rethrow_at_node(op->value);
      }
    } else if (const auto* cluster = std::get_if<exec::cluster_step>(&s.action)) {
      run_cluster(p.clusters[std::size_t(cluster->cluster)], p, *ws);
    } else if (const auto* special = std::get_if<exec::special_step>(&s.action)) {
      try {
        run_special(special->value, gather_inputs(special->inputs, *ws), ws->values);
      } catch (const error&) {
        rethrow_at_node(special->value);
      }
    }
    for (int r : s.release) ws->values[std::size_t(r)] = tensor();
  }
  outputs.reserve(p.outputs.size());
  for (int v : p.outputs) outputs.push_back(*ws->refs[std::size_t(v)]);
}
#endif

}  // namespace kiln::detail
// ----- end kiln/exec/executor.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_EXECUTOR_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_PASSES_OPTIMIZE_HPP
#define KILN_SINGLE_INCLUDE_KILN_PASSES_OPTIMIZE_HPP
// ----- begin kiln/passes/optimize.hpp -----
/// \file
/// Graph optimizations, run once per trace before planning: constant folding,
/// algebraic simplification (`x * 1`, `x + 0`, `-(-x)`, casts and reshapes that
/// change nothing) and common-subexpression elimination. Pruning of what no output
/// needs happens when the graph is planned (kiln/exec/executor.hpp).

#include <cstdint>
#include <map>
#include <utility>
#include <vector>


namespace kiln::detail {

/// True when every element of the eager tensor `t` equals `v`.
template <class = void>
bool filled_with(const tensor& t, double v) {
  if (t.device() != device::cpu) return false;
  return visit_dtype(t.dtype(), [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      const T* p = t.data<T>();
      for (std::int64_t i = 0, n = t.size(); i < n; ++i)
        if (double(p[i]) != v) return false;
      return true;
    }
    return false;
  });
}

template <class = void>
class optimizer {
 public:
  explicit optimizer(const graph& in) : in_(in), map_(in.nodes().size(), -1) {}

  graph run() {
    for (std::size_t i = 0; i < in_.nodes().size(); ++i) {
      const node& n = in_.nodes()[i];
      switch (n.kind()) {
        case node_kind::placeholder: map_[i] = out_.add_placeholder(n.name(), n.dtype(), n.shape()); break;
        case node_kind::constant: map_[i] = out_.add_constant(n.value()); break;
        case node_kind::identity: map_[i] = out_.add_output(map_[std::size_t(n.input_ids()[0])]); break;
        case node_kind::op: map_[i] = rewrite(n); break;
        case node_kind::special: copy_special(i); break;
        case node_kind::result: break;  // copied with its special node
      }
    }
    return std::move(out_);
  }

 private:
  // Special ops are copied as they are: effects must not be folded or merged.
  void copy_special(std::size_t i) {
    const node& n = in_.nodes()[i];
    std::vector<int> ins;
    for (int in : n.input_ids()) ins.push_back(map_[std::size_t(in)]);
    std::vector<int> ids = out_.add_special_like(n, std::move(ins), std::span(in_.nodes()).subspan(i + 1));
    for (std::size_t k = 0; k < ids.size(); ++k) map_[i + k] = ids[k];
  }

  int rewrite(const node& n) {
    std::vector<int> ins;
    for (int in : n.input_ids()) ins.push_back(map_[std::size_t(in)]);
    if (int same = simplify(n, ins); same >= 0) return same;
    if (int folded = fold(n, ins); folded >= 0) return folded;
    auto key = std::make_pair(n.operation().index(), ins);
    auto [first, last] = seen_.equal_range(key);
    for (auto it = first; it != last; ++it)
      if (same_op(out_.node_at(it->second).operation(), n.operation())) return it->second;
    int id = out_.add_op(n.operation(), ins, n.dtype(), n.shape());
    seen_.emplace(std::move(key), id);
    return id;
  }

  const node& at(int id) const { return out_.node_at(id); }
  bool constant_filled(int id, double v) const { return at(id).kind() == node_kind::constant && filled_with(at(id).value(), v); }
  // The input can stand for the node itself: same dtype and shape, so no broadcast is lost.
  bool passes_through(const node& n, int input) const { return at(input).dtype() == n.dtype() && at(input).shape() == n.shape(); }

  /// The node `n` reduces to, or -1. (A test per op that simplifies, not a visit of
  /// every op: each source file that optimizes a graph compiles this.)
  int simplify(const node& n, const std::vector<int>& ins) const {
    const ops::any_op& op = n.operation();
    auto keep_if = [&](int id) { return passes_through(n, id) ? id : -1; };
    if (ops::holds_alternative<ops::multiply>(op)) {
      if (constant_filled(ins[1], 1)) return keep_if(ins[0]);
      if (constant_filled(ins[0], 1)) return keep_if(ins[1]);
    } else if (ops::holds_alternative<ops::add>(op)) {
      if (constant_filled(ins[1], 0)) return keep_if(ins[0]);
      if (constant_filled(ins[0], 0)) return keep_if(ins[1]);
    } else if (ops::holds_alternative<ops::subtract>(op)) {
      if (constant_filled(ins[1], 0)) return keep_if(ins[0]);
    } else if (ops::holds_alternative<ops::divide>(op)) {
      if (constant_filled(ins[1], 1)) return keep_if(ins[0]);
    } else if (ops::holds_alternative<ops::negate>(op)) {
      const node& inner = at(ins[0]);
      if (inner.kind() == node_kind::op && ops::holds_alternative<ops::negate>(inner.operation()))
        return keep_if(inner.input_ids()[0]);
    } else if (ops::holds_alternative<ops::cast>(op) || ops::holds_alternative<ops::reshape>(op)) {
      return keep_if(ins[0]);
    }
    return -1;
  }

  /// A constant holding `n`'s value when all its inputs are constants, or -1. An op
  /// whose evaluation fails is left in the graph: it raises only if it runs.
  int fold(const node& n, const std::vector<int>& ins) {
    std::vector<const tensor*> values;
    for (int in : ins) {
      if (at(in).kind() != node_kind::constant) return -1;
      values.push_back(&at(in).value());
    }
    if (ins.empty()) return -1;
    try {
      tensor v = execute_any(n.operation(), values);
      return out_.add_constant(v);
    } catch (const error&) {
      return -1;
    }
  }

  const graph& in_;
  graph out_;
  std::vector<int> map_;
  std::multimap<std::pair<std::size_t, std::vector<int>>, int> seen_;
};

/// The optimized form of `g`: same arguments and outputs, fewer nodes.
template <class = void>
graph optimize(const graph& g) {
  return optimizer<>(g).run();
}

}  // namespace kiln::detail
// ----- end kiln/passes/optimize.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_PASSES_OPTIMIZE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_EFFECTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_EFFECTS_HPP
// ----- begin kiln/exec/effects.hpp -----
/// \file
/// The special ops of state and effects (API.md section 4): reading and writing a
/// variable, printing and calling back into C++. Each is one object that runs eagerly
/// and as a graph node; the graph keeps effects in program order and never prunes them.

#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace kiln {
namespace detail {

/// What a kiln::variable handle points to: its value, swapped (never written in
/// place) by every assignment, so a value read earlier stays what it was.
class variable_state {
 public:
  variable_state(std::string name, dtype type, shape dims) : name_(std::move(name)), type_(type), dims_(std::move(dims)) {}

  const std::string& name() const { return name_; }
  dtype type() const { return type_; }
  /// As declared at creation; partial when the initial value was symbolic with None dims.
  const shape& dims() const { return dims_; }

  tensor read() const {
    std::lock_guard lock(mutex_);
    if (!value_.defined())
      throw value_error("variable " + label() + " is read before its initial value is set (a variable created while "
                        "tracing gets it when the function first runs)");
    return value_;
  }
  /// Replaces the value with `f(old value)` (the old value is undefined before
  /// initialization) under the variable's lock; returns the new value.
  template <class F>
  tensor update(F&& f) {
    std::lock_guard lock(mutex_);
    value_ = f(value_);
    return value_;
  }
  /// `'name' float32 (2,)`, as messages show the variable.
  std::string label() const { return "'" + name_ + "' " + std::string(kiln::name(type_)) + " " + dims_.str(); }

  /// Raises kiln::invalid_argument_error unless `x` fits this variable's dtype and
  /// shape; a symbolic `x` (a write being traced) only needs a shape that may fit,
  /// and the write checks the value's when the graph runs, as TensorFlow does.
  void check(std::string_view op, const tensor& x) const {
    const bool fits = x.is_symbolic() ? dims_.is_compatible_with(x.shape()) : dims_.accepts(x.shape());
    if (x.dtype() != type_ || !fits)
      throw invalid_argument_error(std::string(op) + ": variable " + label() + " cannot take a " +
                                   std::string(kiln::name(x.dtype())) + " " + x.shape().str() +
                                   " value; the dtype and shape of a variable are fixed");
  }

 private:
  std::string name_;
  dtype type_;
  shape dims_;
  mutable std::mutex mutex_;
  tensor value_;
};

/// Reads a variable: its current value.
class read_variable_op final : public special_op {
 public:
  explicit read_variable_op(std::shared_ptr<variable_state> v)
      : special_op(std::type_identity<read_variable_op>()), var_(std::move(v)) {}
  std::string_view name() const { return "ReadVariableOp"; }
  bool has_effects() const { return false; }
  tensor run(std::span<const tensor* const>) const { return var_->read(); }
  /// The variable it reads (whose address is the kiln::variable's identity).
  const std::shared_ptr<variable_state>& state() const { return var_; }

 private:
  std::shared_ptr<variable_state> var_;
};

/// How an assignment combines the variable's value with its input.
enum class assign_mode : unsigned char {
  assign,      ///< `v.assign(x)`
  add,         ///< `v.assign_add(x)`
  subtract,    ///< `v.assign_sub(x)`
  initialize,  ///< the initial value of a variable created while tracing: set on the first run only
};

/// Writes a variable; its result is the new value. The members that run the
/// assignment are templates, compiled only where a program writes a variable.
class assign_variable_op final : public special_op {
 public:
  template <class = void>
  assign_variable_op(std::shared_ptr<variable_state> v, assign_mode mode)
      : special_op(std::type_identity<assign_variable_op>()), var_(std::move(v)), mode_(mode) {}
  std::string_view name() const {
    switch (mode_) {
      case assign_mode::add: return "AssignAddVariableOp";
      case assign_mode::subtract: return "AssignSubVariableOp";
      case assign_mode::initialize: return "InitializeVariableOp";
      default: return "AssignVariableOp";
    }
  }
  bool has_effects() const { return true; }
  template <class = void>
  tensor run(std::span<const tensor* const> in) const { return apply(*in[0]); }
  /// The variable it writes (how, name() says).
  const std::shared_ptr<variable_state>& state() const { return var_; }

  /// The assignment on an eager value; a value of another dtype or shape raises
  /// kiln::invalid_argument_error. What a variable holds is never a value a gradient
  /// tape tracks (as in TensorFlow, gradients do not flow through an assignment): the
  /// sums run their kernels directly, unseen by tapes, and an assigned value is copied
  /// while a tape records on this thread.
  template <class = void>
  tensor apply(const tensor& x) const {
    var_->check(name(), x);
    return var_->update([&](const tensor& old) {
      const tensor* in[] = {&old, &x};
      switch (mode_) {
        case assign_mode::add: return (void)require(old), execute(ops::add{}, in);
        case assign_mode::subtract: return (void)require(old), execute(ops::subtract{}, in);
        case assign_mode::initialize: return old.defined() ? old : x;
        default: return recording_tapes() > 0 ? stop_gradient(x) : x;
      }
    });
  }

 private:
  const tensor& require(const tensor& old) const {
    if (!old.defined()) throw value_error(std::string(name()) + ": variable " + var_->label() + " has no value yet");
    return old;
  }
  std::shared_ptr<variable_state> var_;
  assign_mode mode_;
};

/// Writes one line to config::print_stream() at every run.
class print_op final : public special_op {
 public:
  explicit print_op(std::vector<print_piece> pieces)
      : special_op(std::type_identity<print_op>()), pieces_(std::move(pieces)) {}
  std::string_view name() const { return "PrintV2"; }
  bool has_effects() const { return true; }
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    write_print_line(print_line(pieces_, in));
    return {};
  }
  const std::vector<print_piece>& pieces() const { return pieces_; }

 private:
  std::vector<print_piece> pieces_;
};

/// Calls a C++ function on eager tensors at every run (kiln::host_callback).
class host_callback_op final : public special_op {
 public:
  using callback = std::function<std::vector<tensor>(std::span<const tensor* const>)>;
  template <class = void>
  host_callback_op(callback fn, std::vector<std::pair<dtype, shape>> results)
      : special_op(std::type_identity<host_callback_op>()), fn_(std::move(fn)), results_(std::move(results)) {}
  std::string_view name() const { return "HostCallback"; }
  bool has_effects() const { return true; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    std::vector<tensor> out = fn_(in);
    if (out.size() != results_.size())
      throw invalid_argument_error("host_callback: the function returned " + std::to_string(out.size()) +
                                   " tensors, but out_specs has " + std::to_string(results_.size()));
    for (std::size_t k = 0; k < out.size(); ++k) {
      const auto& [type, dims] = results_[k];
      if (!out[k].defined() || out[k].is_symbolic() || out[k].dtype() != type || !dims.accepts(out[k].shape()))
        throw invalid_argument_error("host_callback: result " + std::to_string(k) + " is " +
                                     (out[k].defined() ? std::string(kiln::name(out[k].dtype())) + " " + out[k].shape().str()
                                                       : std::string("an empty tensor")) +
                                     ", but out_specs says " + std::string(kiln::name(type)) + " " + dims.str());
    }
    return out;
  }
  const std::vector<std::pair<dtype, shape>>& results() const { return results_; }

 private:
  callback fn_;
  std::vector<std::pair<dtype, shape>> results_;
};

}  // namespace detail
}  // namespace kiln
// ----- end kiln/exec/effects.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_EFFECTS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_CONTROL_FLOW_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_CONTROL_FLOW_HPP
// ----- begin kiln/exec/control_flow.hpp -----
/// \file
/// The special ops of control flow: a conditional that runs one of two traced
/// branches, and a loop that runs a traced condition and body until the condition
/// fails (or the body asks to stop). Each branch, condition and body is a graph of
/// its own, optimized once and run by its own executor, with its plans and
/// workspaces kept across calls like a function's.

#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_SCALAR_PROGRAM_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_SCALAR_PROGRAM_HPP
// ----- begin kiln/exec/scalar_program.hpp -----
/// \file
/// A graph of elementwise ops on one-element values, compiled to a flat list of
/// scalar calls over a register file. A loop whose condition and body are such
/// graphs (counters, accumulators, convergence tests) runs them with this instead of
/// an executor, whose per-run bookkeeping (finding the plan, leasing a workspace,
/// creating result tensors) costs several times a few scalar ops.

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <vector>


namespace kiln::detail::exec {

/// One value of any non-string dtype.
struct scalar_value {
  alignas(8) unsigned char bytes[8];
};

class scalar_program {
 public:
  /// The program of `g`, or nothing when some node is not a placeholder, a constant,
  /// an output or an elementwise op of one element, or is an op that checks integer
  /// values (division by zero), which the program could not report.
  template <class = void>
  static std::optional<scalar_program> compile(const graph& g) {
    scalar_program p;
    const auto& nodes = g.nodes();
    p.initial_.resize(nodes.size());
    for (std::size_t id = 0; id < nodes.size(); ++id) {
      const node& n = nodes[id];
      if (n.dtype() == string || !n.shape().is_fully_defined() || n.shape().num_elements() != 1) return std::nullopt;
      switch (n.kind()) {
        case node_kind::placeholder:
          break;
        case node_kind::constant:
          if (n.value().device() != kiln::device::cpu) return std::nullopt;
          std::memcpy(p.initial_[id].bytes, n.value().raw_data(), size_of(n.dtype()));
          break;
        case node_kind::identity:
          p.code_.push_back({copy_value, nullptr, int(id), {n.input_ids()[0], -1, -1}});
          break;
        case node_kind::op: {
          const std::vector<int>& in = n.input_ids();
          const dtype operand = nodes[std::size_t(in[std::size_t(ops::value_operand_of(n.operation()))])].dtype();
          const op_entry e = entry_of(n.operation(), operand, n.dtype());
          // Elementwise value checks reject integer operands only (division by zero,
          // negative powers): on floats the op needs none.
          if (!e.scalar || (e.check && !is_floating(operand)) || in.size() > 3) return std::nullopt;
          instruction i{e.scalar, e.op, int(id), {-1, -1, -1}};
          for (std::size_t k = 0; k < in.size(); ++k) i.in[k] = in[k];
          p.code_.push_back(i);
          break;
        }
        default:
          return std::nullopt;
      }
    }
    p.arguments_ = g.arguments();
    p.outputs_ = g.outputs();
    return p;
  }

  /// A register file holding the program's constants, for run().
  std::vector<scalar_value> registers() const { return initial_; }
  /// The register of argument `k`.
  int argument(std::size_t k) const { return arguments_[k]; }
  /// The register of output `k`.
  int output(std::size_t k) const { return outputs_[k]; }

  /// Runs the program on `r`, whose argument registers are set.
  void run(std::vector<scalar_value>& r) const {
    for (const instruction& i : code_) {
      const void* const in[3] = {register_at(r, i.in[0]), register_at(r, i.in[1]), register_at(r, i.in[2])};
      i.fn(i.op, r[std::size_t(i.out)].bytes, in);
    }
  }

 private:
  struct instruction {
    scalar_fn fn;
    const void* op;  ///< the op object in the graph node
    int out;
    int in[3];
  };

  static const void* register_at(std::vector<scalar_value>& r, int k) { return k < 0 ? nullptr : r[std::size_t(k)].bytes; }
  static void copy_value(const void*, void* out, const void* const* in) { std::memcpy(out, in[0], sizeof(scalar_value)); }

  std::vector<scalar_value> initial_;
  std::vector<instruction> code_;
  std::vector<int> arguments_, outputs_;
};

}  // namespace kiln::detail::exec
// ----- end kiln/exec/scalar_program.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_SCALAR_PROGRAM_HPP

namespace kiln::detail {

/// A graph that a special op runs: the graph as traced (for listings and to_dot),
/// its optimized form and the executor of that. (Its members that optimize and run,
/// and those of the ops below, are templates, as the planner's functions are, so that
/// a program compiles the planner only where it runs a graph.)
class subgraph {
 public:
  template <class = void>
  explicit subgraph(graph traced) : traced_(std::move(traced)), optimized_(optimize(traced_)), executor_(optimized_) {}
  subgraph(const subgraph&) = delete;
  subgraph& operator=(const subgraph&) = delete;

  const graph& traced() const { return traced_; }
  const graph& optimized() const { return optimized_; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor> args) const { return executor_.run(args); }

 private:
  graph traced_;
  graph optimized_;
  graph_executor executor_;
};

/// The value of a scalar bool_ condition computed by a graph.
inline bool truth_of(const tensor& pred, std::string_view op) {
  if (pred.dtype() != bool_ || pred.size() != 1)
    throw invalid_argument_error(std::string(op) + ": the condition must be a bool scalar, got " +
                                 std::string(name(pred.dtype())) + " " + pred.shape().str());
  return bool(pred);
}

/// `kiln::cond`: inputs are the predicate, then the values the branches captured;
/// each branch takes its own captures (`then_args`, `else_args` index the inputs
/// after the predicate).
class cond_op final : public special_op {
 public:
  template <class = void>
  cond_op(graph then_graph, std::vector<int> then_args, graph else_graph, std::vector<int> else_args)
      : special_op(std::type_identity<cond_op>()), then_(std::move(then_graph)), else_(std::move(else_graph)),
        then_args_(std::move(then_args)), else_args_(std::move(else_args)),
        effects_(then_.traced().has_effects() || else_.traced().has_effects()) {}
  std::string_view name() const { return "cond"; }
  bool has_effects() const { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const {
    return {{"then", &then_.traced()}, {"else", &else_.traced()}};
  }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const bool taken = truth_of(*in[0], "cond");
    const std::vector<int>& picks = taken ? then_args_ : else_args_;
    std::vector<tensor> args;
    args.reserve(picks.size());
    for (int k : picks) args.push_back(*in[std::size_t(k) + 1]);
    return (taken ? then_ : else_).run(args);
  }
  /// The branches as traced, and the captures (indices after the predicate) each takes.
  const graph& then_graph() const { return then_.traced(); }
  const graph& else_graph() const { return else_.traced(); }
  const std::vector<int>& then_args() const { return then_args_; }
  const std::vector<int>& else_args() const { return else_args_; }

 private:
  subgraph then_, else_;
  std::vector<int> then_args_, else_args_;
  bool effects_;
};

/// `kiln::while_loop`: inputs are the loop variables' initial values, then the values
/// the condition captured, then those the body captured. The condition graph takes
/// the loop variables and its captures and gives a bool scalar; the body graph takes
/// the loop variables and its captures and gives the next values, led by a stop
/// flag when it ends in kiln::break_if. A loop variable traced with `None` dims (a
/// shape invariant) may change shape from one iteration to the next: the executors
/// plan per argument shapes, and such graphs never compile to scalar programs, whose
/// values must be one element each.
class while_op final : public special_op {
 public:
  template <class = void>
  while_op(int loop_vars, graph cond_graph, int cond_captures, graph body_graph, bool body_breaks)
      : special_op(std::type_identity<while_op>()), vars_(loop_vars), cond_captures_(cond_captures), breaks_(body_breaks),
        cond_(std::move(cond_graph)), body_(std::move(body_graph)),
        effects_(cond_.traced().has_effects() || body_.traced().has_effects()),
        cond_program_(exec::scalar_program::compile(cond_.optimized())),
        body_program_(exec::scalar_program::compile(body_.optimized())) {}
  std::string_view name() const { return "while"; }
  bool has_effects() const { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const {
    return {{"cond", &cond_.traced()}, {"body", &body_.traced()}};
  }
  int loop_variables() const { return vars_; }
  int cond_captures() const { return cond_captures_; }
  bool breaks() const { return breaks_; }
  const graph& cond_graph() const { return cond_.traced(); }
  const graph& body_graph() const { return body_.traced(); }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    if (scalar_loop(in)) return run_scalar(in);
    const std::size_t n = std::size_t(vars_);
    // The argument lists of the condition and the body: loop variables, then captures.
    std::vector<tensor> cond_args(n), body_args(n);
    for (std::size_t k = 0; k < n; ++k) cond_args[k] = *in[k];
    for (std::size_t k = n; k < n + std::size_t(cond_captures_); ++k) cond_args.push_back(*in[k]);
    for (std::size_t k = n + std::size_t(cond_captures_); k < in.size(); ++k) body_args.push_back(*in[k]);
    for (;;) {
      if (!truth_of(cond_.run(cond_args)[0], "while_loop")) break;
      for (std::size_t k = 0; k < n; ++k) body_args[k] = std::move(cond_args[k]);
      std::vector<tensor> next = body_.run(body_args);
      const std::size_t first = breaks_ ? 1 : 0;
      if (breaks_ && truth_of(next[0], "break_if")) {
        for (std::size_t k = 0; k < n; ++k) cond_args[k] = std::move(body_args[k]);
        break;
      }
      for (std::size_t k = 0; k < n; ++k) cond_args[k] = std::move(next[k + first]);
    }
    cond_args.resize(n);
    return cond_args;
  }

 private:
  // Whether the condition and body compiled to scalar programs and the inputs are
  // one-element tensors on the CPU. check_numerics needs the executor, which names ops.
  bool scalar_loop(std::span<const tensor* const> in) const {
    if (!cond_program_ || !body_program_ || debugging::check_numerics_enabled()) return false;
    for (const tensor* t : in)
      if (!t->defined() || t->is_symbolic() || t->device() != kiln::device::cpu || t->size() != 1) return false;
    return true;
  }

  // The loop on scalar programs: loop variables and captures live in registers, and
  // an iteration allocates nothing.
  template <class = void>
  std::vector<tensor> run_scalar(std::span<const tensor* const> in) const {
    const exec::scalar_program &cond = *cond_program_, &body = *body_program_;
    const std::size_t n = std::size_t(vars_), cond_end = n + std::size_t(cond_captures_);
    auto load = [](const tensor& t, exec::scalar_value& r) { std::memcpy(r.bytes, t.raw_data(), size_of(t.dtype())); };
    std::vector<exec::scalar_value> cond_registers = cond.registers(), body_registers = body.registers(), vars(n);
    for (std::size_t k = 0; k < n; ++k) load(*in[k], vars[k]);
    for (std::size_t k = n; k < cond_end; ++k) load(*in[k], cond_registers[std::size_t(cond.argument(k))]);
    for (std::size_t k = cond_end; k < in.size(); ++k) load(*in[k], body_registers[std::size_t(body.argument(k - cond_end + n))]);
    const std::size_t first = breaks_ ? 1 : 0;
    auto truth = [](const exec::scalar_value& r) { return r.bytes[0] != 0; };  // a bool_ is one byte, 0 or 1
    for (;;) {
      for (std::size_t k = 0; k < n; ++k) cond_registers[std::size_t(cond.argument(k))] = vars[k];
      cond.run(cond_registers);
      if (!truth(cond_registers[std::size_t(cond.output(0))])) break;
      for (std::size_t k = 0; k < n; ++k) body_registers[std::size_t(body.argument(k))] = vars[k];
      body.run(body_registers);
      if (breaks_ && truth(body_registers[std::size_t(body.output(0))])) break;
      for (std::size_t k = 0; k < n; ++k) vars[k] = body_registers[std::size_t(body.output(k + first))];
    }
    std::vector<tensor> out;
    out.reserve(n);
    for (std::size_t k = 0; k < n; ++k) {
      tensor t(in[k]->dtype(), in[k]->shape());
      std::memcpy(t.raw_data(), vars[k].bytes, size_of(t.dtype()));
      out.push_back(std::move(t));
    }
    return out;
  }

  int vars_;
  int cond_captures_;
  bool breaks_;
  subgraph cond_, body_;
  bool effects_;
  std::optional<exec::scalar_program> cond_program_, body_program_;
};

}  // namespace kiln::detail
// ----- end kiln/exec/control_flow.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_CONTROL_FLOW_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_SIGNATURE_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_SIGNATURE_HPP
// ----- begin kiln/trace/signature.hpp -----
/// \file
/// Signatures of kiln::function calls. A call's arguments are flattened to leaves,
/// following the contract: a tensor contributes its dtype and shape, a C++ number,
/// string or enum its value, a tuple, pair, std::array, std::vector or aggregate its
/// leaves, a kiln::variable its identity, a dataset its element spec (and its handle
/// as a tensor), and any other object its address. The leaves give the cache key,
/// the tensors the function runs on, and (when tracing) the placeholders the
/// callable gets.

#include <boost/pfr.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>


namespace kiln::detail {

template <class T>
struct is_tuple_like : std::false_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T, std::size_t N>
struct is_tuple_like<std::array<T, N>> : std::true_type {};
/// Sequences a signature shows as a list (`[<1>, <2>]`), as TensorFlow a Python list.
template <class T>
struct is_std_array : std::false_type {};
template <class T, std::size_t N>
struct is_std_array<std::array<T, N>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>  // std::vector<bool> holds proxies, not values: it is an object like any other
struct is_vector<std::vector<T, A>> : std::bool_constant<!std::is_same_v<T, bool>> {};

template <class T>
struct is_char_array : std::false_type {};
template <std::size_t N>
struct is_char_array<char[N]> : std::true_type {};

/// A C++ string: keyed by its text, whatever holds it (a literal `"relu"` is a `char[5]`).
template <class T>
inline constexpr bool is_string_like = std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view> ||
                                       std::is_same_v<T, const char*> || std::is_same_v<T, char*> ||
                                       is_char_array<T>::value;

/// The text of a C++ string; a char array holds it up to its first NUL.
template <class T>
std::string_view string_text(const T& s) {
  if constexpr (is_char_array<T>::value) return std::string_view(s, std::find(s, s + std::extent_v<T>, '\0') - s);
  else return std::string_view(s);
}

/// A C++ value that is part of a signature by its value.
template <class T>
inline constexpr bool is_value_leaf = std::is_arithmetic_v<T> || std::is_enum_v<T> || is_string_like<T>;

/// A plain struct kiln flattens field by field.
template <class T>
inline constexpr bool is_flattened_aggregate = std::is_aggregate_v<T> && !std::is_array_v<T> && std::is_class_v<T> &&
                                               std::is_copy_constructible_v<T> && !std::is_same_v<T, tensor_spec>;

/// A structure kiln flattens element by element: tuple, pair, std::array, std::vector
/// or aggregate.
template <class T>
inline constexpr bool is_sequence = is_tuple_like<T>::value || is_vector<T>::value || is_flattened_aggregate<T>;

/// Calls `f(element)` for each element of sequence `x` (each field of an aggregate), in order.
/// \code
/// const std::pair pair{1, 2.f};
/// kiln::detail::for_each_element(pair, [](const auto& e) { std::cout << e; });  // 12
/// \endcode
template <class T, class F>
void for_each_element(T& x, F&& f) {
  using U = std::remove_const_t<T>;
  if constexpr (is_tuple_like<U>::value) std::apply([&](auto&... e) { (f(e), ...); }, x);
  else if constexpr (is_vector<U>::value) for (auto& e : x) f(e);
  else boost::pfr::for_each_field(x, f);
}

/// How many elements sequence `x` has.
template <class T>
std::size_t sequence_size(const T& x) {
  if constexpr (is_tuple_like<T>::value) return std::tuple_size_v<T>;
  else if constexpr (is_vector<T>::value) return x.size();
  else return boost::pfr::tuple_size_v<T>;
}

/// Which kind of leaf a key word sequence starts with.
enum class leaf : std::uint64_t { tensor = 1, value, sequence, address, handle };

/// An object a function receives through a handle tensor (a kiln::data::dataset),
/// as TensorFlow passes a dataset as a variant tensor: keyed by the spec it describes
/// (`append_spec_key`), so objects of one spec share a trace, and given to the graph
/// as `handle()`, so that every call runs on the object it was called with.
/// \code static_assert(kiln::detail::handle_argument<kiln::data::dataset>); \endcode
template <class T>
concept handle_argument = requires(const T& x, std::vector<std::uint64_t>& key, const tensor& h) {
  { x.handle() } -> std::same_as<const tensor&>;
  x.append_spec_key(key);
  { x.with_handle(h) } -> std::same_as<T>;
};

template <class T>
std::uint64_t type_code() {
  static const char tag = 0;
  return std::uint64_t(reinterpret_cast<std::uintptr_t>(&tag));
}

/// A C++ value as a signature shows it (`2`, `"a"`, `true`) and the name of its kind
/// (`int`, `string`, ...), as TensorFlow's messages say "int value 2".
template <class T>
std::pair<std::string, std::string> describe_leaf(const T& v) {
  std::ostringstream os;
  if constexpr (is_string_like<T>) {
    os << '"' << string_text(v) << '"';
    return {"string", os.str()};
  } else if constexpr (std::is_same_v<T, bool>) {
    return {"bool", v ? "true" : "false"};
  } else if constexpr (std::is_enum_v<T>) {
    os << +static_cast<std::underlying_type_t<T>>(v);
    return {"enum", os.str()};
  } else if constexpr (std::is_floating_point_v<T>) {
    os << v;
    return {std::is_same_v<T, float> ? "float" : "double", os.str()};
  } else {
    os << +v;
    return {std::is_same_v<T, char> ? "char" : "int", os.str()};
  }
}

inline void add_shape(std::vector<std::uint64_t>& key, dtype t, const shape& s) {
  key.push_back(std::uint64_t(t));
  key.push_back(std::uint64_t(std::int64_t(s.rank())));
  for (std::int64_t d : s.dims()) key.push_back(std::uint64_t(d));
}

/// The flattened arguments of one call.
struct call_signature {
  struct value_leaf {
    int arg = 0;
    std::vector<std::uint64_t> key;
    std::string kind;  ///< `int`, `string`, ...
    std::string text;  ///< `2`, `"a"`, ...
  };
  /// The cache key. Its first `structure_size` words are the call's structure: all but
  /// the tensors' dtypes and shapes (nesting, C++ values, addresses, and a marker where
  /// each tensor sits); `seal` appends each tensor's spec. input_signature and
  /// reduce_retracing change the specs of a call, never its structure.
  std::vector<std::uint64_t> key;
  std::size_t structure_size = 0;
  bool sealed = false;
  /// One entry per tensor leaf: the tensor (null for a tensor_spec), its spec and argument.
  std::vector<const tensor*> tensors;
  std::vector<tensor_spec> specs;
  std::vector<int> tensor_arg;
  std::vector<value_leaf> values;

  /// Ends the structure (the first time, after flattening) or drops the specs an
  /// earlier seal appended, then appends the current specs.
  void seal() {
    if (!sealed) structure_size = key.size();
    key.resize(structure_size);
    sealed = true;
    for (const tensor_spec& s : specs) add_shape(key, s.dtype, s.shape);
  }
  std::span<const std::uint64_t> structure() const { return {key.data(), structure_size}; }

  /// Empties it for another call, keeping the vectors' capacity.
  void clear() {
    key.clear();
    structure_size = 0;
    sealed = false;
    tensors.clear();
    specs.clear();
    tensor_arg.clear();
    values.clear();
  }
};

/// What a call of a kiln::function needs besides its arguments: the signature that
/// keys it and room for its outputs.
struct call_frame {
  call_signature signature;
  std::vector<tensor> outputs;
};

/// A call_frame taken from this thread's pool and given back at the end of the call,
/// empty, so that its vectors keep their capacity and a call in steady state allocates
/// nothing to key itself or collect its outputs. A call made during another (from a
/// host callback, or while tracing) takes a frame of its own.
class pooled_call_frame {
 public:
  pooled_call_frame() {
    pool* p = this_thread_frames();
    frame_ = p && p->count > 0 ? p->frames[--p->count] : new call_frame;
  }
  ~pooled_call_frame() {
    frame_->signature.clear();
    frame_->outputs.clear();
    pool* p = this_thread_frames();
    if (p && p->count < pool::depth)
      p->frames[p->count++] = frame_;
    else
      delete frame_;
  }
  pooled_call_frame(const pooled_call_frame&) = delete;
  pooled_call_frame& operator=(const pooled_call_frame&) = delete;
  call_frame* operator->() const { return frame_; }

 private:
  struct pool {
    static constexpr int depth = 8;
    call_frame* frames[depth];
    int count = 0;
    ~pool() {
      for (int i = 0; i < count; ++i) delete frames[i];
    }
  };
  // Null for a call made while the thread's objects are destroyed: it takes a frame
  // of its own.
  static pool* this_thread_frames() { return this_thread_object<pool>(); }
  call_frame* frame_;
};

/// How a signature shows a C++ argument with no tensor in it, as Python shows the
/// value: `2`, `"a"`, `[1, -1]` (sequences and aggregates as lists); empty when it
/// holds a tensor or an object keyed by address.
template <class T>
std::string bound_text_of(const T& x) {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_value_leaf<U>) {
    return describe_leaf(x).second;
  } else if constexpr (is_sequence<U>) {
    std::string s = "[";
    bool ok = true;
    for_each_element(x, [&](const auto& e) {
      std::string t = bound_text_of(e);
      ok = ok && !t.empty();
      s += (s.size() > 1 ? ", " : "") + t;
    });
    return ok ? s + "]" : std::string();
  } else {
    return {};
  }
}

/// An object that the callable takes by non-const reference (`auto& model`): keyed by
/// address and passed through as itself, never flattened into a copy, so that what the
/// callable changes in it while tracing is changed in the caller's object.
template <class T>
struct object_reference {
  T& object;
};
template <class T>
struct is_object_reference : std::false_type {};
template <class T>
struct is_object_reference<object_reference<T>> : std::true_type {};

/// `a` as an object_reference when it is a non-const object (not a tensor, string or
/// number) that the caller passed as an lvalue; else `a` itself.
template <class A>
decltype(auto) reference_if_object(A&& a) {
  using U = std::remove_cvref_t<A>;
  if constexpr (std::is_lvalue_reference_v<A> && !std::is_const_v<std::remove_reference_t<A>> && std::is_class_v<U> &&
                !std::is_same_v<U, tensor> && !std::is_same_v<U, tensor_spec> && !is_string_like<U>)
    return object_reference<U>{a};
  else
    return std::forward<A>(a);
}

/// What the callable receives for `a` when it runs eagerly: the object behind an
/// object_reference, else `a` itself.
template <class A>
decltype(auto) referenced(A&& a) {
  if constexpr (is_object_reference<std::remove_cvref_t<A>>::value)
    return (a.object);
  else
    return std::forward<A>(a);
}

template <class T>
void flatten(const T& x, call_signature& sig, int arg) {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_object_reference<U>::value) {
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(std::addressof(x.object))));
  } else if constexpr (std::is_same_v<U, tensor>) {
    sig.key.push_back(std::uint64_t(leaf::tensor));
    sig.tensors.push_back(&x);
    sig.specs.emplace_back(x.shape(), x.dtype());
    sig.tensor_arg.push_back(arg);
  } else if constexpr (std::is_same_v<U, tensor_spec>) {
    sig.key.push_back(std::uint64_t(leaf::tensor));
    sig.tensors.push_back(nullptr);
    sig.specs.push_back(x);
    sig.tensor_arg.push_back(arg);
  } else if constexpr (handle_argument<U>) {
    sig.key.push_back(std::uint64_t(leaf::handle));
    x.append_spec_key(sig.key);
    flatten(x.handle(), sig, arg);
  } else if constexpr (is_value_leaf<U>) {
    auto [kind, text] = describe_leaf(x);
    call_signature::value_leaf v{arg, {std::uint64_t(leaf::value)}, kind, text};
    if constexpr (is_string_like<U>) {
      std::string_view s = string_text(x);
      v.key.push_back(s.size());
      for (std::size_t i = 0; i < s.size(); i += 8) {
        std::uint64_t w = 0;
        std::memcpy(&w, s.data() + i, std::min<std::size_t>(8, s.size() - i));
        v.key.push_back(w);
      }
    } else {
      v.key.push_back(type_code<U>());
      std::uint64_t bits = 0;
      std::memcpy(&bits, &x, sizeof(U));
      v.key.push_back(bits);
    }
    sig.key.insert(sig.key.end(), v.key.begin(), v.key.end());
    sig.values.push_back(std::move(v));
  } else if constexpr (is_sequence<U>) {
    sig.key.push_back(std::uint64_t(leaf::sequence));
    sig.key.push_back(sequence_size(x));
    for_each_element(x, [&](const auto& e) { flatten(e, sig, arg); });
  } else if constexpr (std::is_pointer_v<U>) {
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(x)));
  } else if constexpr (requires { { x.identity() } -> std::same_as<const void*>; }) {
    // A handle (kiln::variable): every copy of it stands for the same object.
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(x.identity())));
  } else {
    sig.key.push_back(std::uint64_t(leaf::address));
    sig.key.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(std::addressof(x))));
  }
}

/// How a trace's signature shows its arguments (trace_signature): per argument, the
/// text of its bound C++ value and the structure of its tensors; per tensor, its text
/// when it is not shown as a tensor. Written once per trace, never per call.
struct argument_texts {
  std::vector<std::string> bound, structure, inputs;
};

/// Writes argument `x`'s tensors to `s` in flatten()'s order (elements without a
/// tensor as their values), and each tensor's text to `inputs`: a handle argument's
/// `signature_text()` (`DatasetSpec(...)`), else empty.
template <class T>
void describe_tensors(const T& x, structure_text& s, std::vector<std::string>& inputs) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, tensor> || std::is_same_v<U, tensor_spec> || handle_argument<U>) {
    s.leaf();
    if constexpr (requires { { x.signature_text() } -> std::convertible_to<std::string>; }) inputs.push_back(x.signature_text());
    else inputs.emplace_back();
  } else if constexpr (is_sequence<U> && !is_object_reference<U>::value) {
    constexpr bool list = is_vector<U>::value || is_std_array<U>::value;
    s.open(list);
    std::size_t count = 0;
    for_each_element(x, [&](const auto& e) {
      if (count++) s.next();
      describe_tensors(e, s, inputs);
    });
    s.close(list, count);
  } else {
    s.text += bound_text_of(x);
  }
}

/// The texts of a trace's arguments.
template <class... Args>
argument_texts texts_of(const Args&... args) {
  argument_texts t;
  (
      [&](const auto& a) {
        t.bound.push_back(bound_text_of(a));
        structure_text s;
        describe_tensors(a, s, t.inputs);
        // One tensor (or none) is shown as itself; only a structure is written out.
        t.structure.push_back(s.leaves > 0 && s.text != "<1>" ? std::move(s.text) : std::string());
      }(args),
      ...);
  return t;
}

/// Replaces every tensor leaf of `x`, in flattening order, with the next of `next`.
template <class T>
void replace_tensors(T& x, const tensor*& next) {
  if constexpr (std::is_same_v<T, tensor>) {
    x = *next++;
  } else if constexpr (handle_argument<T>) {
    x = x.with_handle(*next++);
  } else if constexpr (is_sequence<T>) {
    for_each_element(x, [&](auto& e) { replace_tensors(e, next); });
  }
}

/// The argument the callable receives while tracing: `a` with its tensors replaced
/// by placeholders (a tensor_spec becomes a tensor); an object keyed by address (or
/// an object_reference) is passed through as itself.
template <class A>
decltype(auto) traced_argument(A&& a, const tensor*& next) {
  using U = std::remove_cvref_t<A>;
  if constexpr (is_object_reference<U>::value) {
    return (a.object);
  } else if constexpr (std::is_same_v<U, tensor> || std::is_same_v<U, tensor_spec>) {
    return tensor(*next++);
  } else if constexpr (handle_argument<U>) {
    return a.with_handle(*next++);
  } else if constexpr (is_char_array<U>::value) {
    return std::forward<A>(a);
  } else if constexpr (is_value_leaf<U> || std::is_pointer_v<U>) {
    return U(a);
  } else if constexpr (is_sequence<U>) {
    U copy(a);
    replace_tensors(copy, next);
    return copy;
  } else {
    return std::forward<A>(a);
  }
}

}  // namespace kiln::detail

namespace kiln::detail {
/// Whether `F` can be called with the arguments a trace of `Args` passes.
template <class F, class... Args>
concept takes_traced_arguments =
    std::is_invocable_v<F&, decltype(traced_argument(std::declval<Args>(), std::declval<const tensor*&>()))...>;

/// Whether `F` takes some of `Args` only as the caller's objects by reference: then
/// those are passed as object_references (keyed by address) instead of flattened copies.
template <class F, class... Args>
concept takes_objects_by_reference =
    !takes_traced_arguments<F, Args...> &&
    takes_traced_arguments<F, decltype(reference_if_object(std::declval<Args>()))...>;
}  // namespace kiln::detail
// ----- end kiln/trace/signature.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_SIGNATURE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_FUNCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_FUNCTION_HPP
// ----- begin kiln/trace/function.hpp -----
/// \file
/// kiln::function: its options, its state, and its calls in the compile-time tier
/// (`fixed` arguments, kiln/typed/trace.hpp). Calls with kiln::tensor arguments are
/// the runtime tier's, defined by kiln/trace/runtime_tier.hpp, which kiln/kiln.hpp
/// includes and kiln/fixed.hpp does not.

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


namespace kiln {

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
struct concrete_state;
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

/// What a kiln::function and its copies share: its options and traces. Not a
/// template, so that what does not depend on the callable is compiled once per
/// program, not once per function. The members that trace and dispatch calls with
/// tensor arguments are defined with the runtime tier (kiln/trace/runtime_tier.hpp),
/// as templates on nothing: a file compiles them (and the tracing, optimizer and
/// executor behind them) only where it calls a function with tensors.
struct function_state {
  explicit function_state(function_options o) : options(std::move(o)) {}

  function_options options;
  mutable std::mutex mutex;        // guards signatures and runtime
  /// A trace's signature: the runtime tier's, or else a typed trace's (it lives in `typed`).
  struct signature_record {
    std::shared_ptr<const trace_signature> runtime;
    const typed::recorded_signature* typed = nullptr;
  };
  std::vector<signature_record> signatures;  // of every trace, in either tier, in the order they were made
  std::recursive_mutex tracing;    // one trace at a time; a nested trace (recursion) re-enters
  /// The runtime tier's traces, made by its first call, with a deleter it sets: a file
  /// whose functions make typed traces only does not compile them.
  std::unique_ptr<runtime_traces, void (*)(runtime_traces*)> runtime{nullptr, nullptr};
  typed::trace_table typed;  // traces of calls with `fixed` arguments

  /// Adds a new typed trace's signature.
  void add_signature(const typed::recorded_signature& s) {
    std::lock_guard lock(mutex);
    signatures.push_back({nullptr, &s});
  }

  template <class = void>
  void check_input_signature(call_signature& sig, const std::vector<tensor_spec>& expected) const;

  /// The kiln::value_error for a call that `expected` does not accept (out of line: it
  /// formats tensors).
  template <class = void>
  [[noreturn]] KILN_COLD KILN_NOINLINE static void throw_input_signature_mismatch(
      const call_signature& sig, const std::vector<tensor_spec>& expected);

  /// The trace that serves `sig`: a known one, or the one `trace_now(context, sig)`
  /// makes, registered under sig's key (one trace at a time; a recursion with the same
  /// signature is an error).
  template <class = void>
  std::shared_ptr<const concrete_state> find_or_trace(call_signature& sig,
                                                      std::shared_ptr<concrete_state> (*trace_now)(void*, const call_signature&),
                                                      void* context);

  /// The name of argument `i`: as the options give it, else x0, x1, ...
  std::string arg_name(std::size_t i) const {
    if (i < options.arg_names.size()) return options.arg_names[i];
    std::string name = "x";  // appended, not `"x" + ...`: GCC 12 warns of the latter here
    name += std::to_string(i);
    return name;
  }

  /// A new trace for `sig`, its arguments shown as `texts` says: its names and
  /// signature, and a placeholder in `context` per tensor leaf.
  template <class = void>
  std::shared_ptr<concrete_state> start_trace(const call_signature& sig, argument_texts texts, trace_context& context,
                                              std::vector<tensor>& placeholders) const;

  /// Makes `t` an output of trace `c`.
  template <class = void>
  static void add_output(concrete_state& c, trace_context& context, const tensor& t);

  /// Ends trace `c`: its graph, optimized and planned.
  template <class = void>
  static void finish_trace(concrete_state& c, trace_context& context);

  // Whether `sig` has a tensor_spec leaf (a get_concrete_function that asks for a
  // trace of those specs) rather than tensors only (a call).
  template <class = void>
  static bool asks_for_specs(const call_signature& sig);

  // The trace that serves `sig` when one is known: the one traced for its key, or for
  // a call, the more general trace it was dispatched to before.
  template <class = void>
  std::shared_ptr<concrete_state> known_trace(const call_signature& sig) const;

  // Whether trace `t` was made for the structure (nesting, C++ values) and dtypes of `sig`.
  template <class = void>
  static bool same_structure_and_dtypes(const concrete_state& t, const call_signature& sig);

  // A trace more general than the call (None dims, unknown ranks; made by
  // get_concrete_function or reduce_retracing) serves it, as TensorFlow dispatches to
  // the most specific trace that accepts a call: the one with the fewest unknowns.
  // get_concrete_function with tensor_specs asks for a trace of those specs instead.
  template <class = void>
  std::shared_ptr<concrete_state> most_specific_trace_accepting(const call_signature& sig) const;

  // reduce_retracing: the call is keyed by the most specific specs that accept both it
  // and the latest trace of its structure and dtypes, as TensorFlow's common
  // supertype: a dim that differs becomes None, a rank that differs unknown.
  template <class = void>
  void relax(call_signature& sig);

  // Variables may be created by the first trace only, and must outlive it: a
  // later trace would create another variable at each retrace, and a variable that
  // dies with the trace would be created anew at every call in eager code.
  template <class = void>
  void check_created_variables(const trace_context& context) const;
};

}  // namespace detail

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
    if constexpr (typed::typed_call<Args...>) {
      if constexpr (std::is_invocable_v<F&, typed::traced_t<Args>&...>) return typed_call(args...);
      else detail::callable_does_not_accept<Args...>();
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
    if constexpr (typed::typed_request<Args...>) {
      if constexpr (!std::is_invocable_v<F&, typed::traced_t<Args>&...>) {
        detail::callable_does_not_accept<Args...>();
      } else {
        using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
        using concrete = typename typed::concrete_for<R, Args...>::type;
        return concrete(typed_trace_for(args...), state_);
      }
    } else if constexpr (!detail::has_runtime_tier<F>) {
      static_assert(detail::has_runtime_tier<F>, "kiln::function: a trace for kiln::tensor arguments needs the runtime "
                                                 "tier; include <kiln/kiln.hpp> (kiln/fixed.hpp has the compile-time tier only)");
    } else {
      return detail::runtime_tier<F>::get_concrete_function(*this, std::forward<Args>(args)...);
    }
  }

  /// Every trace's signature, in the seeds' format, in the order they were made,
  /// separated by blank lines, with no newline at the end (as TensorFlow's string).
  std::string pretty_printed_concrete_signatures() const {
    std::lock_guard lock(state_->mutex);
    std::string s;
    for (const auto& [runtime, typed] : state_->signatures) {
      if (!s.empty()) s += "\n\n";
      const std::string text = (runtime ? *runtime : typed::written(*state_, *typed)).signature_text();
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

  // A call in the compile-time tier (kiln/typed/trace.hpp).
  template <class... Args>
  auto typed_call(const Args&... args) {
    const auto* t = typed_trace_for(args...);
    if constexpr (std::is_void_v<std::invoke_result_t<F&, typed::traced_t<Args>&...>>)
      t->run(typed_data(args...));
    else
      return t->run(typed_data(args...));
  }

  // The typed trace of these arguments (`fixed` values or specs, and C++ values): the
  // slot of their signature type, found by its index, then the trace of these C++
  // values in it, traced now if there is none.
  template <class... Args>
  auto typed_trace_for(const Args&... args) {
    using R = std::invoke_result_t<F&, typed::traced_t<Args>&...>;
    using entry = typed::signature_traces<R, typed::values_of<Args...>>;
    entry& e = state_->typed.template entry<std::tuple<typename typed::fixed_of<std::remove_cvref_t<Args>>::type...>, entry>();
    const typed::trace<R>* t = nullptr;
    if constexpr (std::tuple_size_v<typed::values_of<Args...>> == 0) {
      t = e.only.load(std::memory_order_acquire);
      if (!t) {
        std::lock_guard tracing(state_->typed.tracing);
        if (!(t = e.only.load(std::memory_order_acquire))) {
          e.only_owner = trace_typed<R>(args...);
          e.only.store(t = e.only_owner.get(), std::memory_order_release);
        }
      }
    } else {
      const auto key = typed::values(args...);
      std::lock_guard tracing(state_->typed.tracing);
      std::lock_guard lock(e.mutex);
      for (const auto& [k, known] : e.by_value)
        if (k == key) t = known.get();
      if (!t) t = e.by_value.emplace_back(key, trace_typed<R>(args...)).second.get();
    }
    return t;
  }

  // The data of a typed call's `fixed` arguments, in order.
  template <class... Args>
  static auto typed_data(const Args&... args) {
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
  std::unique_ptr<typed::trace<R>> trace_typed(const Args&... args) {
    // The typed arguments' names, for the trace; the C++ values' text, for its signature.
    std::vector<std::string> typed_names, bound_text;
    std::size_t position = 0;
    (
        [&](const auto& a) {
          if constexpr (typed::typed_argument<decltype(a)>) {
            typed_names.push_back(state_->arg_name(position));
          } else {
            std::ostringstream os;
            os << a;
            bound_text.resize(sizeof...(Args));
            bound_text[position] = os.str();
          }
          ++position;
        }(args),
        ...);
    auto t = typed::trace_now<R>(fn_, std::move(typed_names), args...);
    t->signature = {&typed::signature_type_of<R, Args...>, std::move(bound_text)};
    state_->add_signature(t->signature);
    return t;
  }

  F fn_;
  std::shared_ptr<detail::function_state> state_;
};

template <class F>
function(F) -> function<F>;
template <class F>
function(F, function_options) -> function<F>;

}  // namespace kiln
// ----- end kiln/trace/function.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_FUNCTION_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_RUNTIME_TIER_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_RUNTIME_TIER_HPP
// ----- begin kiln/trace/runtime_tier.hpp -----
/// \file
/// kiln::function's runtime tier (API.md section 3): calls with kiln::tensor
/// arguments traced into a graph once per input signature, and
/// `kiln::concrete_function`, one such trace.

#include <algorithm>
#include <any>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_AUTODIFF_REPLAY_HPP
#define KILN_SINGLE_INCLUDE_KILN_AUTODIFF_REPLAY_HPP
// ----- begin kiln/autodiff/replay.hpp -----
/// \file
/// Replaying a trace node by node, so that the gradient tapes recording see its ops:
/// how a kiln::function called while another is traced joins a tape of the outer
/// trace, how a function with effects runs under an eager tape (its writes and prints
/// happen once, in order, and its reads are the values of the moment), and how a
/// function's backward pass is traced (kiln/autodiff/function_gradient.hpp).

#include <span>
#include <vector>


namespace kiln::detail {

/// Hands special node `n` (its inputs and `count` results in `value`, the results from
/// `at`) to the tapes recording: a variable read is watched, and a `cond` or `while`
/// node is recorded as kiln::cond and kiln::while_loop record the nodes they make, a
/// collective as kiln::all_reduce and its kind record theirs.
template <class>
void record_special_on_tapes(const node& n, std::span<const tensor> value, std::size_t at, std::size_t count) {
  std::vector<tensor> inputs;
  for (int id : n.input_ids()) inputs.push_back(value[std::size_t(id)]);
  const std::span<const tensor> results = value.subspan(at, count);
  const special_op& op = n.special();
  if (const auto* read = op.as<read_variable_op>()) {
    watch_on_active_tapes(read->state().get(), value[at]);
  } else if (op.name() == "cond") {  // (by name: as<cond_op> would compile the node's kernels in every program)
    const auto& c = static_cast<const cond_op&>(op);
    cond_hook().load(std::memory_order_relaxed)(
        inputs[0], cond_branches{c.then_graph(), c.then_args(), c.else_graph(), c.else_args()},
        std::span<const tensor>(inputs).subspan(1), results);
  } else if (op.name() == "while") {
    loop_hook().load(std::memory_order_relaxed)(static_cast<const while_op&>(op), inputs, results);
  } else if (op.name().starts_with("Collective")) {  // (kiln/exec/collective_op.hpp)
    if (collective_recorder record = collective_hook().load(std::memory_order_relaxed)) record(op, inputs, results);
  }
}

/// Runs graph `g` on `args` node by node and returns its outputs: into the trace in
/// progress when there is one, else eagerly. Ops run through the kernel table
/// (detail::run_registered), so the tapes recording there record them, and variable
/// reads are handed to those tapes as kiln::variable's own reads are. Special ops
/// (effects, control flow) are copied into the trace, or run, in program order.
template <class>
std::vector<tensor> replay(const graph& g, std::span<const tensor> args) {
  trace_context* trace = trace_context::current();
  std::vector<tensor> value(g.nodes().size());
  for (std::size_t i = 0; i < g.arguments().size(); ++i) value[std::size_t(g.arguments()[i])] = args[i];
  std::vector<tensor> outputs;
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const node& n = g.nodes()[i];
    switch (n.kind()) {
      case node_kind::placeholder:
      case node_kind::result:  // set with its special node
        break;
      case node_kind::constant: value[i] = n.value(); break;
      case node_kind::identity: outputs.push_back(value[std::size_t(n.input_ids()[0])]); break;
      case node_kind::op: {
        std::vector<const tensor*> in;
        for (int id : n.input_ids()) in.push_back(&value[std::size_t(id)]);
        value[i] = run_registered(n.operation(), in);
        break;
      }
      case node_kind::special: {
        std::vector<tensor> results;
        if (trace) {
          std::vector<int> ins;
          for (int id : n.input_ids()) ins.push_back(trace->node_of(value[std::size_t(id)]));
          for (int id : trace->graph().add_special_like(n, std::move(ins), std::span(g.nodes()).subspan(i + 1)))
            results.push_back(trace->symbolic(id));
        } else {
          std::vector<const tensor*> in;
          for (int id : n.input_ids()) in.push_back(&value[std::size_t(id)]);
          results.resize(std::size_t(n.result_count()));
          n.special().run(in, results);
        }
        for (std::size_t k = 0; k < results.size(); ++k) value[i + k] = std::move(results[k]);
        if (recording_tapes() > 0) special_hook().load(std::memory_order_relaxed)(n, value, i, results.size());
        break;
      }
    }
  }
  return outputs;
}

}  // namespace kiln::detail
// ----- end kiln/autodiff/replay.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_AUTODIFF_REPLAY_HPP

namespace kiln {

namespace config {
namespace detail {
inline std::atomic<bool>& eager_functions() {
  static std::atomic<bool> flag{false};
  return flag;
}
}  // namespace detail
/// When on, every kiln::function calls its callable directly on eager tensors
/// (for debugging: C++ side effects then happen at every call).
/// \code kiln::config::run_functions_eagerly(true); \endcode
inline void run_functions_eagerly(bool on) { detail::eager_functions() = on; }
/// Whether kiln::function calls run their callables eagerly.
inline bool functions_run_eagerly() { return detail::eager_functions(); }
}  // namespace config

namespace detail {

/// Writes and reads saved functions; defined by kiln/saved_function.hpp.
template <class = void>
struct saved_function_io;

/// What a traced callable returned, as the function gives it back: tensors stay
/// tensors, C++ numbers become tensors, tuples, pairs, arrays and vectors keep
/// their structure, a tensor_array stays one (its leaf is the tensor of its elements).
template <class R>
struct output_of {
  using type = tensor;  // tensor, or a C++ number that becomes one
};
template <>
struct output_of<tensor_array> {
  using type = tensor_array;
};
template <class... Ts>
struct output_of<std::tuple<Ts...>> {
  using type = std::tuple<typename output_of<Ts>::type...>;
};
template <class A, class B>
struct output_of<std::pair<A, B>> {
  using type = std::pair<typename output_of<A>::type, typename output_of<B>::type>;
};
template <class T, std::size_t N>
struct output_of<std::array<T, N>> {
  using type = std::array<typename output_of<T>::type, N>;
};
template <class T, class A>
struct output_of<std::vector<T, A>> {
  using type = std::vector<typename output_of<T>::type>;
};
template <class R>
using output_t = typename output_of<std::remove_cvref_t<R>>::type;

template <class T>
tensor scalar_constant(const T& v) {
  static_assert(has_dtype<T> || std::is_same_v<T, int> || std::is_same_v<T, long long>,
                "a kiln::function may return tensors, C++ numbers of the element types, and tuples, pairs, arrays "
                "and vectors of those");
  using E = std::conditional_t<has_dtype<T>, T, std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>>;
  tensor t(dtype_of<E>, shape{});
  *t.view().template as<E>() = E(v);
  return t;
}

/// Calls `f(leaf)` for every leaf of a returned value, in order.
template <class R, class F>
void for_each_output(const R& r, F&& f) {
  using U = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<U, tensor>) {
    f(r);
  } else if constexpr (std::is_same_v<U, tensor_array>) {
    f(r.elements());
  } else if constexpr (is_tuple_like<U>::value || is_vector<U>::value) {
    for_each_element(r, [&](const auto& e) { for_each_output(e, f); });
  } else {
    f(scalar_constant(r));
  }
}

/// Writes the structure of a returned value's tensors to `s`, as for_each_output walks them.
template <class R>
void describe_outputs(const R& r, structure_text& s) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_tuple_like<U>::value || is_vector<U>::value) {
    constexpr bool list = is_vector<U>::value || is_std_array<U>::value;
    s.open(list);
    std::size_t count = 0;
    for_each_element(r, [&](const auto& e) {
      if (count++) s.next();
      describe_outputs(e, s);
    });
    s.close(list, count);
  } else {
    s.leaf();
  }
}
/// The structure of a returned value as a signature shows it; empty for one tensor.
template <class R>
std::string output_structure_text(const R& r) {
  if constexpr (is_tuple_like<std::remove_cvref_t<R>>::value || is_vector<std::remove_cvref_t<R>>::value) {
    structure_text s;
    describe_outputs(r, s);
    return s.text;
  } else {
    return {};
  }
}

/// The returned structure `traced` with its leaves taken, in order, from `next`.
template <class R>
output_t<R> rebuild_output(const R& traced, const tensor*& next) {
  using U = std::remove_cvref_t<R>;
  if constexpr (is_tuple_like<U>::value) {
    return std::apply([&](const auto&... e) { return output_t<R>{rebuild_output(e, next)...}; }, traced);
  } else if constexpr (is_vector<U>::value) {
    output_t<R> out;
    for (const auto& e : traced) out.push_back(rebuild_output(e, next));
    return out;
  } else if constexpr (std::is_same_v<U, tensor_array>) {
    return traced.with_elements(*next++);
  } else {
    return *next++;
  }
}

/// One trace: the signature it was made for (its inputs named after their
/// placeholders), its graph and how to run it.
struct concrete_state : trace_signature {
  std::vector<call_signature::value_leaf> bound;  ///< non-tensor leaves, fixed at trace time
  std::vector<std::uint64_t> structure;           ///< the call_signature::structure it was traced for
  kiln::graph graph;      ///< as traced
  kiln::graph optimized;  ///< as run
  std::unique_ptr<graph_executor> executor;
  std::any traced_result;  ///< the callable's return value, symbolic
  bool returns_void = false;
  jit_switch jit_compile;  ///< function_options::jit_compile
  /// The backward pass, described on the first call under a gradient tape
  /// (kiln/autodiff/function_gradient.hpp).
  mutable std::once_flag backward_once;
  mutable std::shared_ptr<const differentiable_call> backward;

  /// Checks a call's flattened arguments against this trace's signature.
  template <class = void>
  void check_call(const call_signature& sig) const {
    for (const auto& v : sig.values) {
      const call_signature::value_leaf* traced = nullptr;
      for (const auto& b : bound)
        if (b.arg == v.arg) traced = &b;
      std::string arg = v.arg < int(arg_names.size()) ? arg_names[std::size_t(v.arg)] : std::to_string(v.arg);
      if (!traced)
        throw type_error("ConcreteFunction " + header() + " takes a tensor in " + arg + ", but was called with " + v.kind +
                         " value " + v.text);
      if (traced->key != v.key)
        throw type_error("ConcreteFunction " + header() + " was constructed with " + traced->kind + " value " +
                         traced->text + " in " + arg + ", but was called with " + v.kind + " value " + v.text + ".");
    }
    if (sig.tensors.size() != inputs.size())
      throw invalid_argument_error(header() + ": expected " + std::to_string(inputs.size()) + " tensor inputs, got " +
                                   std::to_string(sig.tensors.size()));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const tensor& t = *sig.tensors[i];
      if (t.dtype() != inputs[i].dtype)
        throw invalid_argument_error("cannot compute " + name + " as input #" + std::to_string(i) +
                                     "(zero-based) was expected to be a " + std::string(kiln::name(inputs[i].dtype)) +
                                     " tensor but is a " + std::string(kiln::name(t.dtype())) + " tensor");
      if (!inputs[i].shape.accepts(t.shape()))
        throw invalid_argument_error("cannot compute " + name + " as input #" + std::to_string(i) +
                                     "(zero-based) was expected to have shape " + inputs[i].shape.str() +
                                     " but has shape " + t.shape().str());
    }
  }

  concrete_state() = default;
  concrete_state(const concrete_state&) = delete;
  concrete_state& operator=(const concrete_state&) = delete;

  /// Optimizes the traced graph and plans how to run it (after tracing).
  template <class = void>
  void compile();

  /// Runs the trace on eager tensors, or inlines it into the trace in progress when
  /// some are symbolic (a function called while tracing another); the outputs go to `out`.
  template <class = void>
  void run(const call_signature& sig, std::vector<tensor>& out) const;
};

// The optimizer and the executor are reached only through these, so that a program
// compiled with KILN_SEPARATE_COMPILATION compiles them once, and a header-only file
// only where it calls a function with tensors (they are templates on nothing).
#if KILN_DEFINE_LIBRARY
template <class>
void concrete_state::compile() {
  optimized = optimize(graph);
  executor = std::make_unique<graph_executor>(optimized, jit_compile);
}

template <class>
void concrete_state::run(const call_signature& sig, std::vector<tensor>& out) const {
  // Called while another function is being traced, with symbolic inputs or not, the
  // trace's ops join the outer graph, so that they run with every call of it.
  trace_context* outer = trace_context::current();
  out.clear();
  if (outer) {
    // A tape recording in the outer trace sees the ops one by one.
    if (recording_tapes() > 0) {
      std::vector<tensor> args;
      for (const tensor* t : sig.tensors) args.push_back(*t);
      out = replay_hook().load(std::memory_order_relaxed)(graph, args);
      return;
    }
    std::vector<int> args;
    for (const tensor* t : sig.tensors) args.push_back(outer->node_of(*t));
    for (int id : outer->inline_graph(graph, args)) out.push_back(outer->symbolic(id));
    return;
  }
  small_vector<tensor, 4> args;
  args.reserve(sig.tensors.size());
  for (const tensor* t : sig.tensors) {
    if (t->is_symbolic()) throw type_error(name + ": a symbolic tensor was used outside the trace that made it");
    args.emplace_back(*t);
  }
  const std::span<const tensor> inputs(args.begin(), args.size());
  if (recording_tapes() > 0 && graph.has_effects()) {
    // Under a gradient tape, a function with effects runs op by op, recorded as eager
    // code is: its backward pass cannot run it again.
    out = replay_hook().load(std::memory_order_relaxed)(graph, inputs);
    return;
  }
  try {
    executor->run(inputs, out);
  } catch (const error&) {
    rethrow_with_prefix("in " + name + ": ");
  }
  // Under a gradient tape, a function without effects is one differentiable op.
  if (recording_tapes() > 0) call_hook().load(std::memory_order_relaxed)(*this, inputs, out);
}
#endif

// ---- function_state: the runtime tier's members ------------------------------------

#if KILN_DEFINE_LIBRARY
template <class>
void function_state::check_input_signature(call_signature& sig,
                                           const std::vector<tensor_spec>& expected) const {
  bool ok = sig.values.empty() && sig.specs.size() == expected.size();
  for (std::size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i].accepts(sig.specs[i].dtype, sig.specs[i].shape);
  if (!ok) throw_input_signature_mismatch(sig, expected);
  // Every call then has the input signature's specs, so it reuses the one trace.
  for (std::size_t i = 0; i < expected.size(); ++i) sig.specs[i].shape = expected[i].shape;
}

template <class>
[[noreturn]] void function_state::throw_input_signature_mismatch(const call_signature& sig,
                                                                  const std::vector<tensor_spec>& expected) {
  {
    std::ostringstream os;
    os << "C++ inputs incompatible with input_signature:\n  inputs: (\n";
    for (std::size_t i = 0; i < sig.tensors.size(); ++i) {
      os << "    ";
      if (sig.tensors[i]) os << *sig.tensors[i]; else os << sig.specs[i];
      os << (i + 1 < sig.tensors.size() ? ",\n" : ")\n");
    }
    for (const auto& v : sig.values) os << "    " << v.kind << " value " << v.text << "\n";
    os << "  input_signature: (\n";
    for (std::size_t i = 0; i < expected.size(); ++i) os << "    " << expected[i] << (i + 1 < expected.size() ? ",\n" : ").");
    throw value_error(os.str());
  }
}

/// A function's traces in the runtime tier (function_state::runtime).
struct runtime_traces {
  struct key_hash {
    std::size_t operator()(const std::vector<std::uint64_t>& k) const {
      std::size_t h = k.size();
      for (std::uint64_t w : k) h = (h ^ std::size_t(w)) * 0x100000001b3ull;
      return h;
    }
  };
  using trace_map = std::unordered_map<std::vector<std::uint64_t>, std::shared_ptr<concrete_state>, key_hash>;

  std::vector<std::shared_ptr<concrete_state>> traces;
  trace_map by_key;      // each trace under the key it was traced for
  trace_map dispatched;  // calls served by a more general trace; forgotten at each new trace
  std::vector<std::vector<std::uint64_t>> tracing_keys;  // signatures being traced right now
};

template <class>
std::shared_ptr<const concrete_state> function_state::find_or_trace(
    call_signature& sig, std::shared_ptr<concrete_state> (*trace_now)(void*, const call_signature&), void* context) {
  {
    std::lock_guard lock(mutex);
    if (!runtime) runtime = {new runtime_traces, [](runtime_traces* r) { delete r; }};
    if (auto known = known_trace(sig)) return known;
  }
  std::lock_guard one_trace_at_a_time(tracing);
  {
    std::lock_guard lock(mutex);
    if (auto known = known_trace(sig)) return known;  // traced by another thread meanwhile
    for (const auto& k : runtime->tracing_keys)
      if (k == sig.key)
        throw value_error(options.name +
                          " calls itself with the same signature while tracing, which would recurse forever; a "
                          "recursive kiln::function must change a C++ argument on every call");
    if (auto general = most_specific_trace_accepting(sig)) {
      runtime->dispatched.emplace(sig.key, general);
      return general;
    }
    if (options.reduce_retracing) relax(sig);
    if (auto it = runtime->by_key.find(sig.key); it != runtime->by_key.end()) return it->second;
    runtime->tracing_keys.push_back(sig.key);
  }
  std::shared_ptr<concrete_state> traced;
  try {
    traced = trace_now(context, sig);
  } catch (...) {
    std::lock_guard lock(mutex);
    runtime->tracing_keys.pop_back();
    throw;
  }
  std::lock_guard lock(mutex);
  runtime->tracing_keys.pop_back();
  runtime->traces.push_back(traced);
  signatures.push_back({traced});
  runtime->by_key.emplace(sig.key, traced);
  runtime->dispatched.clear();  // the new trace may be more specific for some of them
  return traced;
}

template <class>
std::shared_ptr<concrete_state> function_state::start_trace(
    const call_signature& sig, argument_texts texts, trace_context& context, std::vector<tensor>& placeholders) const {
  auto c = std::make_shared<concrete_state>();
  c->name = options.name;
  c->jit_compile = options.jit_compile;
  for (std::size_t i = 0; i < texts.bound.size(); ++i) c->arg_names.push_back(arg_name(i));
  c->bound = sig.values;
  c->bound_text = std::move(texts.bound);
  c->arg_structure = std::move(texts.structure);
  c->input_text = std::move(texts.inputs);
  const std::span<const std::uint64_t> structure = sig.structure();
  c->structure.assign(structure.begin(), structure.end());
  c->input_arg = sig.tensor_arg;
  for (std::size_t i = 0; i < sig.specs.size(); ++i) {
    placeholders.push_back(context.placeholder(c->arg_names[std::size_t(sig.tensor_arg[i])], sig.specs[i].dtype,
                                               sig.specs[i].shape));
    c->inputs.emplace_back(sig.specs[i].shape, sig.specs[i].dtype, context.graph().nodes().back().name());
  }
  return c;
}

template <class>
void function_state::add_output(concrete_state& c, trace_context& context, const tensor& t) {
  const node& n = context.add_output(t);
  c.outputs.emplace_back(n.shape(), n.dtype(), n.name() + ":0");
}

template <class>
void function_state::finish_trace(concrete_state& c, trace_context& context) {
  c.graph = std::move(context.graph());
  // Constant folding runs ops on constants, which must compute, not be recorded.
  kiln::init_scope outside_every_trace;
  c.compile();
}

template <class>
bool function_state::asks_for_specs(const call_signature& sig) {
  return std::ranges::count(sig.tensors, nullptr) > 0;
}

template <class>
std::shared_ptr<concrete_state> function_state::known_trace(const call_signature& sig) const {
  if (auto it = runtime->by_key.find(sig.key); it != runtime->by_key.end()) return it->second;
  if (asks_for_specs(sig)) return nullptr;
  auto it = runtime->dispatched.find(sig.key);
  return it != runtime->dispatched.end() ? it->second : nullptr;
}

template <class>
bool function_state::same_structure_and_dtypes(const concrete_state& t, const call_signature& sig) {
  if (!std::ranges::equal(t.structure, sig.structure()) || t.inputs.size() != sig.specs.size()) return false;
  for (std::size_t i = 0; i < sig.specs.size(); ++i)
    if (t.inputs[i].dtype != sig.specs[i].dtype) return false;
  return true;
}

template <class>
std::shared_ptr<concrete_state> function_state::most_specific_trace_accepting(const call_signature& sig) const {
  std::shared_ptr<concrete_state> best;
  if (asks_for_specs(sig)) return best;
  int best_unknowns = 0;
  for (const auto& t : runtime->traces) {
    if (!same_structure_and_dtypes(*t, sig)) continue;
    int unknowns = 0;
    bool accepts = true;
    for (std::size_t i = 0; accepts && i < sig.specs.size(); ++i) {
      const shape& traced = t->inputs[i].shape;
      accepts = traced.accepts(sig.specs[i].shape);
      unknowns += traced.has_known_rank() ? int(std::ranges::count(traced.dims(), none)) : max_rank + 1;
    }
    if (accepts && (!best || unknowns < best_unknowns)) {
      best = t;
      best_unknowns = unknowns;
    }
  }
  return best;
}

template <class>
void function_state::relax(call_signature& sig) {
  for (auto t = runtime->traces.rbegin(); t != runtime->traces.rend(); ++t) {
    if (!same_structure_and_dtypes(**t, sig)) continue;
    for (std::size_t i = 0; i < sig.specs.size(); ++i) {
      const shape& traced = (*t)->inputs[i].shape;
      shape& s = sig.specs[i].shape;
      if (!traced.has_known_rank() || traced.rank() != s.rank()) {
        s = unknown_rank;
        continue;
      }
      for (int d = 0; d < s.rank(); ++d)
        if (traced[d] != s[d]) s[d] = none;
    }
    sig.seal();
    return;
  }
}

template <class>
void function_state::check_created_variables(const trace_context& context) const {
  const auto& created = context.created_variables();
  if (created.empty()) return;
  bool first;
  {
    std::lock_guard lock(mutex);
    first = runtime->traces.empty();
  }
  const bool dropped = std::ranges::any_of(created, [](const auto& v) { return v.expired(); });
  if (!first || dropped)
    throw value_error("kiln::function only supports singleton variables created on the first call; " +
                      std::string(dropped ? "a variable created while tracing was dropped at the end of the trace"
                                          : "a variable was created while tracing a new signature") +
                      ". Create variables once, outside the function or in state it keeps across calls");
}
#endif

/// Re-raises a kiln error from tracing or running a function with its name in front.
[[noreturn]] inline void rethrow_with_function_name(const std::string& fn) { rethrow_with_prefix("in " + fn + ": "); }

}  // namespace detail

/// One trace of a kiln::function: a graph for one input signature. Call it with
/// tensors (and, optionally, the C++ values it was traced with).
/// \code
/// kiln::function pow([](const kiln::tensor& x, int n) { return kiln::pow(x, float(n)); });
/// auto square = pow.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::float32), 2);
/// square(kiln::constant(10.f));  // 100
/// \endcode
class concrete_function {
 public:
  explicit concrete_function(std::shared_ptr<const detail::concrete_state> s) : state_(std::move(s)) {}

  /// Runs the graph; a function with one output returns it, use call_flat for several.
  /// A callable that returns nothing gives an empty (undefined) tensor.
  template <class... Args>
  tensor operator()(const Args&... args) const {
    std::vector<tensor> out = call(args...);
    if (state_->returns_void) return tensor();
    if (out.size() != 1)
      throw value_error(state_->header() + " returns " + std::to_string(out.size()) + " tensors: use call_flat");
    return out[0];
  }
  /// Runs the graph and returns every output tensor, in order.
  template <class... Args>
  std::vector<tensor> call_flat(const Args&... args) const {
    return call(args...);
  }

  /// The traced graph.
  const kiln::graph& graph() const { return state_->graph; }
  /// One spec per tensor input, named after its argument.
  const std::vector<tensor_spec>& structured_input_signature() const { return state_->inputs; }
  /// One spec per output, named after the graph value (`Identity:0`).
  std::vector<tensor_spec> structured_outputs() const { return state_->outputs; }

  friend std::ostream& operator<<(std::ostream& os, const concrete_function& f) {
    return os << "ConcreteFunction " << f.state_->signature_text();
  }
  /// The signature in the seeds' format, without a newline at the end, as
  /// TensorFlow's `pretty_printed_signature()`: `double(a)`, then its Args and Returns.
  /// \code
  /// kiln::function dbl([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}});
  /// std::cout << dbl.get_concrete_function(kiln::constant(1)).pretty_printed_signature();
  /// \endcode
  std::string pretty_printed_signature() const {
    std::string text = state_->signature_text();
    text.pop_back();
    return text;
  }

  /// Writes this trace, its constants and its variables' values to `path`, for
  /// kiln::load in another program; needs `#include <kiln/saved_function.hpp>`.
  /// \code
  /// kiln::function f([](const kiln::tensor& x) { return x * 2; });
  /// f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)).save("f.kiln");
  /// \endcode
  template <class Io = detail::saved_function_io<>>
  void save(const std::string& path) const {
    if constexpr (requires { Io::save(*this, path); })
      Io::save(*this, path);
    else
      static_assert(sizeof(Io*) == 0, "concrete_function::save needs #include <kiln/saved_function.hpp>");
  }

 private:
  // The saved-function format (kiln/saved_function.hpp) writes the trace itself.
  template <class>
  friend struct detail::saved_function_io;
  template <class... Args>
  std::vector<tensor> call(const Args&... args) const {
    detail::pooled_call_frame frame;
    int arg = 0;
    (detail::flatten(args, frame->signature, arg++), ...);
    state_->check_call(frame->signature);
    std::vector<tensor> out;
    state_->run(frame->signature, out);
    return out;
  }
  std::shared_ptr<const detail::concrete_state> state_;
};

namespace detail {

/// kiln::function's calls with kiln::tensor arguments (and C++ values): each new
/// signature is traced into a graph, which later calls with that signature run.
template <class F>
struct runtime_tier {
  template <class... Args>
  static auto call(function<F>& f, Args&&... args) {
    if constexpr ((typed::fixed_value<Args> || ...)) {
      // `fixed` beside runtime arguments: the runtime tier, with the values as tensors.
      return call(f, runtime_argument(std::forward<Args>(args))...);
    } else if constexpr (takes_objects_by_reference<F, Args...>) {
      return call(f, reference_if_object(std::forward<Args>(args))...);
    } else if constexpr (!takes_traced_arguments<F, Args...>) {
      callable_does_not_accept<Args...>();
    } else {
      using R = result_t<Args...>;
      if (config::functions_run_eagerly()) return run_eagerly<R>(f, std::forward<Args>(args)...);
      pooled_call_frame frame;
      call_signature& sig = frame->signature;
      signature_of(sig, f, args...);
      auto concrete = find_or_trace<R>(f, sig, std::forward<Args>(args)...);
      concrete->run(sig, frame->outputs);
      if constexpr (std::is_void_v<R>) {
        return;
      } else {
        const tensor* next = frame->outputs.data();
        return rebuild_output(std::any_cast<const std::remove_cvref_t<R>&>(concrete->traced_result), next);
      }
    }
  }

  template <class... Args>
  static auto get_concrete_function(function<F>& f, Args&&... args) {
    if constexpr (takes_objects_by_reference<F, Args...>) {
      return get_concrete_function(f, reference_if_object(std::forward<Args>(args))...);
    } else if constexpr (!takes_traced_arguments<F, Args...>) {
      callable_does_not_accept<Args...>();
    } else {
      call_signature sig;
      signature_of(sig, f, args...);
      return kiln::concrete_function(find_or_trace<result_t<Args...>>(f, sig, std::forward<Args>(args)...));
    }
  }

 private:
  template <class A>
  static decltype(auto) runtime_argument(A&& a) {
    if constexpr (typed::fixed_value<A>)
      return tensor(a);
    else
      return std::forward<A>(a);
  }

  // What the callable returns when traced with `Args`.
  template <class... Args>
  using result_t = std::invoke_result_t<F&, decltype(traced_argument(std::declval<Args>(), std::declval<const tensor*&>()))...>;

  template <class... Args>
  static void signature_of(call_signature& sig, const function<F>& f, const Args&... args) {
    int arg = 0;
    (flatten(args, sig, arg++), ...);
    if (const auto& expected = f.state_->options.input_signature) f.state_->check_input_signature(sig, *expected);
    sig.seal();
  }

  template <class R, class... Args>
  static auto run_eagerly(function<F>& f, Args&&... args) {
    if constexpr (std::is_void_v<R>) {
      f.fn_(referenced(std::forward<Args>(args))...);
    } else {
      auto r = f.fn_(referenced(std::forward<Args>(args))...);
      std::vector<tensor> leaves;
      for_each_output(r, [&](const tensor& t) { leaves.push_back(t); });
      const tensor* next = leaves.data();
      return rebuild_output(r, next);
    }
  }

  template <class R, class... Args>
  static std::shared_ptr<const concrete_state> find_or_trace(function<F>& f, call_signature& sig, Args&&... args) {
    auto trace_it = [&](const call_signature& s) { return trace<R>(f, s, std::forward<Args>(args)...); };
    return f.state_->find_or_trace(
        sig, [](void* it, const call_signature& s) { return (*static_cast<decltype(trace_it)*>(it))(s); }, &trace_it);
  }

  template <class R, class... Args>
  static std::shared_ptr<concrete_state> trace(function<F>& f, const call_signature& sig, Args&&... args) {
    function_state& state = *f.state_;
    trace_context context(state.options.name);
    std::vector<tensor> placeholders;
    std::shared_ptr<concrete_state> c = state.start_trace(sig, texts_of(args...), context, placeholders);
    try {
      const tensor* next = placeholders.data();
      auto call = [&]<std::size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
        // Each argument takes its placeholders from its own position, whatever
        // order the compiler evaluates the arguments in.
        std::array<const tensor*, sizeof...(Args)> starts{};
        for (std::size_t a = 0, k = 0; a != sizeof...(Args); ++a) {  // `<` warns for none (-Wtype-limits)
          starts[a] = next + k;
          while (k < sig.tensor_arg.size() && sig.tensor_arg[k] == int(a)) ++k;
        }
        return f.fn_(traced_argument(std::forward<Args>(args), starts[I])...);
      };
      if constexpr (std::is_void_v<R>) {
        call(std::index_sequence_for<Args...>{});
        c->returns_void = true;
      } else {
        std::remove_cvref_t<R> result = call(std::index_sequence_for<Args...>{});
        for_each_output(result, [&](const tensor& t) { function_state::add_output(*c, context, t); });
        c->output_structure = output_structure_text(result);
        c->traced_result = std::move(result);
      }
      state.check_created_variables(context);
    } catch (const error&) {
      rethrow_with_function_name(state.options.name);
    }
    state.finish_trace(*c, context);
    return c;
  }
};

}  // namespace detail

}  // namespace kiln
// ----- end kiln/trace/runtime_tier.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_RUNTIME_TIER_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_AUTODIFF_FUNCTION_GRADIENT_HPP
#define KILN_SINGLE_INCLUDE_KILN_AUTODIFF_FUNCTION_GRADIENT_HPP
// ----- begin kiln/autodiff/function_gradient.hpp -----
/// \file
/// A kiln::function as a differentiable op. A call made while an eager gradient tape
/// records is recorded as one entry; its backward pass is a kiln::function of its own,
/// traced once per signature of the trace's inputs and output gradients and run as an
/// optimized graph: its body replays the forward trace under a tape and differentiates
/// the sum of each floating-point output times its gradient, which gives the inputs'
/// gradients and those of the variables the trace reads. (The forward values are
/// computed again in the backward graph rather than kept from the call.) A `cond` node
/// recorded under a tape in its trace is differentiated the same way, branch by branch,
/// and a `while` node by a loop that walks its iterations back.

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_CONTROL_FLOW_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_CONTROL_FLOW_HPP
// ----- begin kiln/trace/control_flow.hpp -----
/// \file
/// Control flow (API.md section 4): `kiln::cond`, `kiln::while_loop`,
/// `kiln::for_range` and `kiln::break_if`. Outside a trace they run as C++ control
/// flow on eager tensors; while tracing, branches, conditions and bodies are traced
/// once each into subgraphs of a `cond` or `while` node (kiln/exec/control_flow.hpp),
/// with the tensors they use from the enclosing trace passed in as captures.

#include <atomic>
#include <concepts>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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

/// What a loop body returns to stop early: `pred`, and the values to go on with.
template <class Tuple>
struct break_result {
  tensor stop;
  Tuple next;
};

/// Ends a loop body: when `pred` holds, the loop stops and keeps the values this
/// iteration started with (an `if (pred) break;` at the top of the body); otherwise
/// it goes on with `next...`.
/// \code
/// kiln::while_loop([](auto i) { return i < 10; },
///                  [](auto i) { return kiln::break_if(i == 3, i + 1); }, kiln::constant(0));  // 3
/// \endcode
template <class P, class... Next>
  requires(std::convertible_to<const P&, tensor> && !typed::operand<P>)  // typed conditions: typed/control_flow.hpp
break_result<std::tuple<std::decay_t<Next>...>> break_if(const P& pred, Next&&... next) {
  return {tensor(pred), std::tuple<std::decay_t<Next>...>(std::forward<Next>(next)...)};
}

/// Options of kiln::while_loop and kiln::for_range, given just before the loop
/// variables.
/// \code
/// // Rows appended to x: its first dim grows, so the loop gives x a shape invariant.
/// kiln::tensor x = kiln::for_range(
///     5, [](const kiln::tensor&, const kiln::tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));  // (5, 10)
/// \endcode
struct loop_options {
  /// The shapes the loop variables may take from one iteration to the next
  /// (TensorFlow's shape_invariants): one entry per tensor of the loop variables, in
  /// order (a tuple or vector variable has one per tensor in it); entries left out
  /// at the end, and std::nullopt, keep a variable's shape exact. A `kiln::none`
  /// dim, or kiln::unknown_rank, may change. An invariant must accept the value its
  /// variable enters with and every value the body gives it, else kiln::value_error;
  /// the loop's results have the invariant's shape. A tensor_array takes none: with
  /// dynamic_size, the loop lets its size change by itself.
  std::vector<std::optional<shape>> shape_invariants = {};
  /// At most this many iterations run (TensorFlow's maximum_iterations): the loop
  /// stops when its condition fails or the count is reached, whichever comes first.
  /// A bound on a loop that might not end; negative counts raise kiln::value_error.
  std::optional<std::int64_t> maximum_iterations = std::nullopt;
};

namespace detail {

template <class T>
struct is_break_result : std::false_type {};
template <class T>
struct is_break_result<break_result<T>> : std::true_type {};

using value_spec = std::pair<dtype, shape>;

/// "float32 (2,)", as the errors of control flow show a value.
template <class = void>
std::string spec_text(const value_spec& s) { return std::string(name(s.first)) + " " + s.second.str(); }
/// "(int32 (), float32 (2,))": several specs as a message shows them.
template <class = void>
std::string specs_text(std::span<const value_spec> specs) {
  std::string s = "(";
  for (std::size_t k = 0; k < specs.size(); ++k) s += (k ? ", " : "") + spec_text(specs[k]);
  return s + ")";
}

/// The leaves of a structure of tensors, in order.
template <class S>
std::vector<tensor> leaves_of(const S& s) {
  std::vector<tensor> out;
  for_each_output(s, [&](const tensor& t) { out.push_back(t); });
  return out;
}
template <class = void>
std::vector<value_spec> specs_of(std::span<const tensor> leaves) {
  std::vector<value_spec> out;
  for (const tensor& t : leaves) out.emplace_back(t.dtype(), t.shape());
  return out;
}

/// A branch, condition or body as traced: its graph, the outer tensors it captured
/// (its placeholders after the parameters) and the specs of its outputs.
struct traced_subgraph {
  graph g;
  std::vector<tensor> captures;
  std::vector<value_spec> outputs;
};

/// Traces `fn(parameters)` into a subgraph whose first placeholders have the specs
/// and names of `params`; returns what `fn` returned (symbolic, for its structure).
template <class Fn>
auto trace_subgraph(Fn&& fn, std::span<const tensor_spec> params, traced_subgraph& out) {
  trace_context context(trace_context::subgraph);
  std::vector<tensor> placeholders;
  for (const tensor_spec& p : params) placeholders.push_back(context.placeholder(p.name, p.dtype, p.shape));
  auto result = fn(std::span<const tensor>(placeholders));
  for_each_output(result, [&](const tensor& t) {
    const node& n = context.add_output(t);
    out.outputs.emplace_back(n.dtype(), n.shape());
  });
  out.g = std::move(context.graph());
  out.captures = context.captures();
  return result;
}
/// The name of the subgraph parameter that stands for `p`: its node's, or `loop_var`.
template <class = void>
std::string parameter_name(const tensor& p) { return p.is_symbolic() ? node_name(*p.symbol()) : "loop_var"; }
/// trace_subgraph with parameters standing for the tensors `params`, with `specs` (a
/// loop variable's may be less specific than its value).
template <class Fn>
auto trace_subgraph(Fn&& fn, std::span<const tensor> params, std::span<const value_spec> specs, traced_subgraph& out) {
  std::vector<tensor_spec> parameters;
  for (std::size_t k = 0; k < params.size(); ++k)
    parameters.emplace_back(specs[k].second, specs[k].first, parameter_name(params[k]));
  return trace_subgraph(std::forward<Fn>(fn), std::span<const tensor_spec>(parameters), out);
}

/// Index of `t` (a capture, by the graph value it stands for) in `all`, appended if new.
template <class = void>
int capture_index(std::vector<tensor>& all, const tensor& t) {
  for (std::size_t k = 0; k < all.size(); ++k)
    if (same_value(*all[k].symbol(), *t.symbol())) return int(k);
  all.push_back(t);
  return int(all.size()) - 1;
}

/// Loop variables `vars` as one value: the value itself for one, a tuple for several.
template <class... Vars>
auto loop_result(std::tuple<Vars...>&& vars) {
  if constexpr (sizeof...(Vars) == 1)
    return std::move(std::get<0>(vars));
  else
    return std::move(vars);
}

/// `v` as loop state holds it: C++ numbers become tensors, structures stay.
template <class V>
output_t<V> as_output(const V& v) {
  std::vector<tensor> leaves = leaves_of(v);
  const tensor* next = leaves.data();
  return rebuild_output(v, next);
}

/// Appends, per leaf of `s`, the tensor_array whose elements it holds, or nullptr.
template <class S>
void array_leaves(const S& s, std::vector<const tensor_array*>& out) {
  using U = std::remove_cvref_t<S>;
  if constexpr (std::is_same_v<U, tensor_array>)
    out.push_back(&s);
  else if constexpr (is_tuple_like<U>::value || is_vector<U>::value)
    for_each_element(s, [&](const auto& e) { array_leaves(e, out); });
  else
    out.push_back(nullptr);
}
template <class S>
std::vector<const tensor_array*> array_leaves(const S& s) {
  std::vector<const tensor_array*> out;
  array_leaves(s, out);
  return out;
}

/// `s` with its first dim `kiln::none`: the elements of an array that may grow.
template <class = void>
shape any_rows(shape s) {
  s[0] = none;
  return s;
}

/// The shape invariant of each leaf of a loop state whose leaves hold `arrays` (a
/// tensor_array or null each) and whose first `hidden` leaves are kiln's own: those
/// `options` gives, and for a written tensor_array with dynamic_size its elements
/// with any number of rows. Raises kiln::value_error for more invariants than
/// variables, and for an invariant given to a tensor_array.
template <class = void>
std::vector<std::optional<shape>> loop_invariants(std::span<const tensor_array* const> arrays,
                                                  const loop_options& options, std::size_t hidden) {
  const auto& given = options.shape_invariants;
  if (given.size() > arrays.size() - hidden)
    throw value_error("while_loop: " + std::to_string(given.size()) + " shape invariants for " +
                      std::to_string(arrays.size() - hidden) + " loop variables");
  std::vector<std::optional<shape>> out(arrays.size());
  for (std::size_t k = hidden; k < arrays.size(); ++k) {
    const tensor_array* array = arrays[k];
    if (k - hidden < given.size() && given[k - hidden]) {
      if (array)
        throw value_error("while_loop: loop variable " + std::to_string(k - hidden) +
                          " is a tensor_array, which takes no shape invariant (with dynamic_size its size may change)");
      out[k] = given[k - hidden];
    } else if (array && array->dynamic_size() && !array->unwritten()) {
      out[k] = any_rows(array->elements().shape());
    }
  }
  return out;
}

/// The specs loop variables keep: the specs of the values they enter with, whose
/// shapes `invariants` relax. Raises kiln::value_error for an invariant that does
/// not accept the value its variable enters with.
template <class = void>
std::vector<value_spec> loop_specs(std::span<const tensor> entering, std::span<const std::optional<shape>> invariants,
                                   std::size_t hidden) {
  std::vector<value_spec> specs = specs_of(entering);
  for (std::size_t k = 0; k < specs.size(); ++k) {
    if (!invariants[k]) continue;
    if (!invariants[k]->accepts(specs[k].second))
      throw value_error("while_loop: loop variable " + std::to_string(k - hidden) + " enters the loop as " +
                        spec_text(specs[k]) + ", which its shape invariant " + invariants[k]->str() + " does not accept");
    specs[k].second = *invariants[k];
  }
  return specs;
}

/// Raises kiln::value_error unless a body's results `got` fit the loop variables'
/// specs: the same dtype, and a shape that the spec, exact or relaxed by the
/// variable's shape invariant, accepts. The first `hidden` loop variables are kiln's
/// own (for_range's counter): messages number the caller's variables from 0.
template <class = void>
void check_loop_specs(std::span<const value_spec> got, std::span<const value_spec> expected,
                      std::span<const std::optional<shape>> invariants, std::size_t hidden,
                      std::string_view loop = "while_loop") {
  if (got.size() != expected.size())
    throw value_error(std::string(loop) + ": the body returns " + std::to_string(got.size() - hidden) + " tensors for " +
                      std::to_string(expected.size() - hidden) + " loop variables");
  for (std::size_t k = 0; k < expected.size(); ++k) {
    if (got[k].first == expected[k].first && expected[k].second.accepts(got[k].second)) continue;
    const std::string variable = std::string(loop) + ": loop variable " + std::to_string(k - hidden);
    if (got[k].first == expected[k].first && k < invariants.size() && invariants[k])
      throw value_error(variable + " has the shape invariant " + invariants[k]->str() + " but is " + spec_text(got[k]) +
                        " after one iteration");
    std::string message = variable + " enters the loop as " + spec_text(expected[k]) + " but is " + spec_text(got[k]) +
                          " after one iteration; a loop variable must keep its dtype and shape";
    if (got[k].first == expected[k].first)
      message += "; to let its shape change, give the loop a shape invariant with kiln::none dims "
                 "(kiln::loop_options{.shape_invariants = ...})";
    throw value_error(message);
  }
}

/// Takes the spec a body gave the unwritten tensor arrays `arrays` (their first
/// write) as their spec from now on, with any number of rows for one with
/// dynamic_size; returns the leaves that changed.
template <class = void>
std::vector<std::size_t> settle_arrays(std::span<const tensor_array* const> arrays,
                                       std::vector<value_spec>& specs, std::span<const value_spec> got) {
  std::vector<std::size_t> settled;
  for (std::size_t k = 0; k < arrays.size() && k < got.size(); ++k) {
    const tensor_array* array = arrays[k];
    if (!array || !array->unwritten() || got[k].first != specs[k].first || got[k] == specs[k]) continue;
    specs[k] = {got[k].first, array->dynamic_size() ? any_rows(got[k].second) : got[k].second};
    settled.push_back(k);
  }
  return settled;
}

/// The next loop state: `current`'s structure with the leaves of what a body returned.
template <class State>
State next_state(const State& current, std::span<const tensor> returned, std::vector<value_spec>& expected,
                 std::span<const std::optional<shape>> invariants, std::size_t hidden,
                 std::string_view loop = "while_loop") {
  const std::vector<value_spec> got = specs_of(returned);
  settle_arrays(array_leaves(current), expected, got);
  check_loop_specs(got, expected, invariants, hidden, loop);
  const tensor* next = returned.data();
  return rebuild_output(current, next);
}

/// A `cond` node recorded into `trace` from its two traced branches; gives its
/// results. What does not depend on the branches' C++ types, so that a program
/// compiles it once, not once per cond (and not at all when it traces none: a
/// template on nothing).
template <class = void>
std::vector<tensor> record_cond(trace_context& trace, const tensor& pred, traced_subgraph& then_graph,
                                traced_subgraph& else_graph);

/// record_cond, set when a program first traces a cond: how the gradient of a `cond`
/// node (kiln/autodiff/function_gradient.hpp) records its own, so that a program that
/// makes tapes but traces no cond does not compile it. Null until then.
using cond_tracer = std::vector<tensor> (*)(trace_context&, const tensor&, traced_subgraph&, traced_subgraph&);
inline std::atomic<cond_tracer>& cond_tracer_hook() {
  static std::atomic<cond_tracer> hook{nullptr};
  return hook;
}

template <class>
std::vector<tensor> record_cond(trace_context& trace, const tensor& pred, traced_subgraph& then_graph,
                                traced_subgraph& else_graph) {
  cond_tracer_hook().store(&record_cond<>, std::memory_order_relaxed);
  if (then_graph.outputs != else_graph.outputs) {
    throw value_error("cond: both branches must return the same structure, dtypes and shapes; the true branch returns " +
                      specs_text(then_graph.outputs) + " and the false branch " + specs_text(else_graph.outputs));
  }
  std::vector<tensor> inputs{pred};
  std::vector<int> then_args, else_args;
  std::vector<tensor> captures;
  for (const tensor& t : then_graph.captures) then_args.push_back(capture_index(captures, t));
  for (const tensor& t : else_graph.captures) else_args.push_back(capture_index(captures, t));
  inputs.insert(inputs.end(), captures.begin(), captures.end());
  const std::vector<value_spec> results = then_graph.outputs;
  // A gradient tape recording in this trace differentiates the node: it keeps the
  // branches (copied before they move into the node).
  std::optional<cond_branches> for_tapes;
  if (recording_tapes() > 0) for_tapes = cond_branches{then_graph.g, then_args, else_graph.g, else_args};
  auto op = std::make_shared<cond_op>(std::move(then_graph.g), std::move(then_args), std::move(else_graph.g),
                                      std::move(else_args));
  std::vector<tensor> out = trace.record_special(std::move(op), inputs, results);
  if (for_tapes) cond_hook().load(std::memory_order_relaxed)(pred, std::move(*for_tapes), captures, out);
  return out;
}
}  // namespace detail

/// Runs `then_fn()` if the bool scalar `pred` holds, else `else_fn()`. While tracing,
/// both branches are traced and the graph gets a `cond` node; the branches must then
/// return the same structure, dtypes and shapes (or both nothing), else
/// kiln::value_error. A C++ `if` on a C++ value instead picks a branch at trace time.
/// \code
/// kiln::tensor x = kiln::constant(-2.f);
/// kiln::tensor y = kiln::cond(x > 0, [&] { return x; }, [&] { return -x; });  // 2
/// \endcode
template <class Then, class Else>
auto cond(const tensor& pred, Then then_fn, Else else_fn) {
  using R = std::invoke_result_t<Then&>;
  static_assert(std::is_same_v<std::remove_cvref_t<R>, std::remove_cvref_t<std::invoke_result_t<Else&>>>,
                "kiln::cond: both branches must return the same type");
  detail::trace_context* trace = detail::trace_context::current();
  if (!trace) {
    const bool taken = detail::truth_of(pred, "cond");
    if constexpr (std::is_void_v<R>) {
      taken ? then_fn() : else_fn();
      return;
    } else {
      return detail::as_output(taken ? then_fn() : else_fn());
    }
  } else {
    if (pred.dtype() != bool_ || pred.rank() != 0)
      throw value_error("cond: the predicate must be a bool scalar, got " + std::string(name(pred.dtype())) + " " +
                        pred.shape().str());
    // A branch that returns nothing is traced as returning an empty tuple.
    auto branch = [](auto& fn) {
      return [&fn](std::span<const tensor>) {
        if constexpr (std::is_void_v<R>) {
          fn();
          return std::tuple<>{};
        } else {
          return fn();
        }
      };
    };
    detail::traced_subgraph then_graph, else_graph;
    auto traced = detail::trace_subgraph(branch(then_fn), std::span<const tensor_spec>(), then_graph);
    detail::trace_subgraph(branch(else_fn), std::span<const tensor_spec>(), else_graph);
    const std::vector<tensor> out = detail::record_cond(*trace, pred, then_graph, else_graph);
    if constexpr (!std::is_void_v<R>) {
      const tensor* next = out.data();
      return detail::rebuild_output(traced, next);
    }
  }
}

namespace detail {
/// The results of a loop whose first variable was a counter of kiln's own, without it.
template <std::size_t UserVars, class Out>
auto without_counter(Out&& out) {
  if constexpr (UserVars == 0) {
    return;
  } else if constexpr (UserVars == 1) {
    return std::get<1>(std::forward<Out>(out));
  } else {
    return std::apply([](auto&&, auto&&... rest) { return std::tuple{std::move(rest)...}; }, std::forward<Out>(out));
  }
}

/// `body_fn`'s result `r` (one value, a tuple or a break_result) with `counter` in front.
template <class R>
auto with_counter(const tensor& counter, R&& r) {
  if constexpr (is_break_result<std::remove_cvref_t<R>>::value) {
    auto next = std::tuple_cat(std::tuple{counter}, std::move(r.next));
    return break_result<decltype(next)>{r.stop, std::move(next)};
  } else {
    return std::tuple_cat(std::tuple{counter}, std::tuple<std::remove_cvref_t<R>>(std::forward<R>(r)));
  }
}

/// Loop-counter arithmetic, `a op b`, through apply_bookkeeping: a program that
/// does not call the op itself compiles its kernels for integers and bools only.
/// For the ops most programs call anyway (`+`, `-`, `*`, `<`) the counters use the
/// plain op instead, whose kernels are then compiled once, not also in a bookkeeping
/// variant.
template <class Op>
tensor counter_op(const tensor& a, const tensor& b) {
  return apply_bookkeeping(Op{}, a, b);
}
template <class Op, std::integral S>
tensor counter_op(const tensor& a, S b) {
  return apply_bookkeeping(Op{}, a, make_scalar(a.dtype(), b, a.device()));
}

/// The typed part of a while loop, as the traced loop calls it: its condition and
/// body on the leaves of a state, and the state it enters with once a tensor_array
/// first written in the body has settled its element shape. Function pointers that
/// the typed loop's constructor sets, not virtual functions (see special_op).
struct loop_calls {
  tensor (*condition)(loop_calls& self, std::span<const tensor> leaves);
  /// The leaves of the next state, after the stop flag when the body ends in break_if.
  std::vector<tensor> (*body)(loop_calls& self, std::span<const tensor> leaves);
  void (*restart)(loop_calls& self, std::span<const tensor> leaves);
};

/// A while loop traced on the leaves of its state: its condition and body traced into
/// subgraphs, and a `while` node recorded; gives the leaves of its results. The first
/// `hidden` leaves are kiln's own; `arrays` holds each leaf's tensor_array, or null.
/// What does not depend on the loop's C++ types, so that a program compiles it once,
/// not once per loop (and not at all when it traces none: a template on nothing).
template <class = void>
std::vector<tensor> trace_while_loop(trace_context& trace, std::size_t hidden, const loop_options& options,
                                     std::vector<tensor> leaves, std::vector<const tensor_array*> arrays,
                                     std::vector<value_spec> specs, std::vector<std::optional<shape>> invariants,
                                     bool breaks, loop_calls& calls);

/// trace_while_loop, set when a program first traces a loop: how the gradient of a
/// `while` node (kiln/autodiff/function_gradient.hpp) traces its own loops, so that a
/// program that makes tapes but traces no loop does not compile the loop tracer. Null
/// until then.
using loop_tracer = std::vector<tensor> (*)(trace_context&, std::size_t, const loop_options&, std::vector<tensor>,
                                            std::vector<const tensor_array*>, std::vector<value_spec>,
                                            std::vector<std::optional<shape>>, bool, loop_calls&);
inline std::atomic<loop_tracer>& loop_tracer_hook() {
  static std::atomic<loop_tracer> hook{nullptr};
  return hook;
}

template <class>
std::vector<tensor> trace_while_loop(trace_context& trace, std::size_t hidden, const loop_options& options,
                                     std::vector<tensor> leaves, std::vector<const tensor_array*> arrays,
                                     std::vector<value_spec> specs, std::vector<std::optional<shape>> invariants,
                                     bool breaks, loop_calls& calls) {
  loop_tracer_hook().store(&trace_while_loop<>, std::memory_order_relaxed);
  // maximum_iterations: a counter of kiln's own in front of the loop variables, and
  // the condition `counter < maximum && cond`.
  const std::size_t counted = options.maximum_iterations ? 1 : 0;
  tensor limit;
  if (counted) {
    limit = kiln::constant(*options.maximum_iterations);
    leaves.insert(leaves.begin(), kiln::constant(std::int64_t(0)));
    arrays.insert(arrays.begin(), nullptr);
    specs.insert(specs.begin(), value_spec{int64, shape{}});
    invariants.insert(invariants.begin(), std::nullopt);
    ++hidden;
  }
  auto user_leaves = [&](std::span<const tensor> p) { return p.subspan(counted); };
  traced_subgraph cond_graph, body_graph;
  auto trace_loop = [&] {
    cond_graph = {};
    body_graph = {};
    trace_subgraph(
        [&](std::span<const tensor> p) {
          if (!counted) return calls.condition(calls, p);
          const tensor below = p[0] < limit;
          return counter_op<ops::logical_and>(below, calls.condition(calls, user_leaves(p)));
        },
        leaves, specs, cond_graph);
    if (cond_graph.outputs[0] != value_spec{bool_, shape{}})
      throw value_error("while_loop: the condition must give a bool scalar, got " + spec_text(cond_graph.outputs[0]));
    trace_subgraph(
        [&](std::span<const tensor> p) {
          std::vector<tensor> next = calls.body(calls, user_leaves(p));
          if (counted) next.insert(next.begin() + (breaks ? 1 : 0), p[0] + std::int64_t(1));
          return next;
        },
        leaves, specs, body_graph);
    std::span<const value_spec> next_specs(body_graph.outputs);
    if (breaks) {
      if (body_graph.outputs[0] != value_spec{bool_, shape{}})
        throw value_error("break_if: the condition must be a bool scalar, got " + spec_text(body_graph.outputs[0]));
      next_specs = next_specs.subspan(1);
    }
    return next_specs;
  };
  std::span<const value_spec> next_specs = trace_loop();
  // A tensor_array first written in the body enters the loop holding zeros of the
  // shape that write gave it; the body is traced again for that input.
  if (const std::vector<std::size_t> settled = settle_arrays(arrays, specs, next_specs); !settled.empty()) {
    for (std::size_t k : settled)
      leaves[k] = arrays[k]->holding_zeros(shape(specs[k].second.dims().subspan(1)), leaves[k].device()).elements();
    calls.restart(calls, user_leaves(leaves));  // the arrays above belonged to the state it replaces
    next_specs = trace_loop();
  }
  check_loop_specs(next_specs, specs, invariants, hidden);

  std::vector<tensor> inputs = leaves;
  inputs.insert(inputs.end(), cond_graph.captures.begin(), cond_graph.captures.end());
  inputs.insert(inputs.end(), body_graph.captures.begin(), body_graph.captures.end());
  auto op = std::make_shared<while_op>(int(leaves.size()), std::move(cond_graph.g), int(cond_graph.captures.size()),
                                       std::move(body_graph.g), breaks);
  const while_op& node = *op;  // the graph keeps it
  std::vector<tensor> out = trace.record_special(std::move(op), inputs, specs);
  if (recording_tapes() > 0) loop_hook().load(std::memory_order_relaxed)(node, inputs, out);
  out.erase(out.begin(), out.begin() + std::ptrdiff_t(counted));
  return out;
}

/// kiln::while_loop, whose first `hidden` loop variables are kiln's own: eager, a C++
/// loop; traced, trace_while_loop on the leaves of the state.
template <class Cond, class Body, class... Vars>
auto while_loop(std::size_t hidden, const loop_options& options, Cond cond_fn, Body body_fn, const Vars&... vars) {
  if (options.maximum_iterations && *options.maximum_iterations < 0)
    throw value_error("while_loop: maximum_iterations must be >= 0, got " +
                      std::to_string(*options.maximum_iterations));
  using state = std::tuple<output_t<Vars>...>;
  state initial{as_output(vars)...};
  const std::vector<tensor> initial_leaves = leaves_of(initial);
  const std::vector<const tensor_array*> arrays = array_leaves(initial);
  const std::vector<std::optional<shape>> invariants = loop_invariants(arrays, options, hidden);
  std::vector<value_spec> specs = loop_specs(initial_leaves, invariants, hidden);
  using R = std::invoke_result_t<Body&, const output_t<Vars>&...>;
  constexpr bool breaks = is_break_result<std::remove_cvref_t<R>>::value;

  trace_context* trace = trace_context::current();
  if (!trace) {
    state current = std::move(initial);
    for (std::int64_t n = 0;; ++n) {
      // The condition runs at the last iteration too, as `n < maximum && cond` does.
      const bool go = truth_of(std::apply(cond_fn, current), "while_loop");
      if (!go || (options.maximum_iterations && n >= *options.maximum_iterations)) break;
      auto r = std::apply(body_fn, current);
      if constexpr (breaks) {
        if (truth_of(r.stop, "break_if")) break;
        current = next_state(current, leaves_of(r.next), specs, invariants, hidden);
      } else {
        current = next_state(current, leaves_of(r), specs, invariants, hidden);
      }
    }
    return loop_result(std::move(current));
  }
  struct typed_calls : loop_calls {
    Cond& cond_fn;
    Body& body_fn;
    state& initial;
    typed_calls(Cond& c, Body& b, state& s)
        : loop_calls{[](loop_calls& self, std::span<const tensor> leaves) {
                       auto& t = static_cast<typed_calls&>(self);
                       return tensor(std::apply(t.cond_fn, t.at(leaves)));
                     },
                     [](loop_calls& self, std::span<const tensor> leaves) {
                       auto& t = static_cast<typed_calls&>(self);
                       auto r = std::apply(t.body_fn, t.at(leaves));
                       if constexpr (is_break_result<decltype(r)>::value) {
                         std::vector<tensor> out = leaves_of(r.stop);
                         for_each_output(r.next, [&](const tensor& x) { out.push_back(x); });
                         return out;
                       } else {
                         return leaves_of(r);
                       }
                     },
                     [](loop_calls& self, std::span<const tensor> leaves) {
                       auto& t = static_cast<typed_calls&>(self);
                       t.initial = t.at(leaves);
                     }},
          cond_fn(c),
          body_fn(b),
          initial(s) {}
    state at(std::span<const tensor> leaves) const {
      const tensor* next = leaves.data();
      return rebuild_output(initial, next);
    }
  } calls(cond_fn, body_fn, initial);
  const std::vector<tensor> out = trace_while_loop(*trace, hidden, options, initial_leaves, arrays, std::move(specs),
                                                   invariants, breaks, calls);
  return loop_result(calls.at(out));
}
}  // namespace detail

/// kiln::while_loop with `options`: shape invariants let loop variables change shape.
/// \code
/// // Halves x's length until one element is left: the sum of its elements.
/// kiln::tensor sum = kiln::while_loop(
///     [](const kiln::tensor& x) { return kiln::shape_of(x)[0] > 1; },
///     [](const kiln::tensor& x) { return kiln::reduce_sum(kiln::reshape(x, {-1, 2}), 1); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none}}}, kiln::constant({1, 2, 3, 4}));  // [10]
/// \endcode
template <class Cond, class Body, class... Vars>
auto while_loop(Cond cond_fn, Body body_fn, const loop_options& options, const Vars&... vars) {
  static_assert(sizeof...(Vars) > 0, "kiln::while_loop: give at least one loop variable");
  return detail::while_loop(std::size_t(0), options, std::move(cond_fn), std::move(body_fn), vars...);
}

/// Runs `body_fn` while `cond_fn` holds: `cond_fn(vars...)` gives a bool scalar,
/// `body_fn(vars...)` the next values (one value, a std::tuple for several, or
/// kiln::break_if). Returns the final values in the same form. While tracing, the
/// condition and body are traced once into a `while` node; a loop variable whose
/// dtype or shape changes raises kiln::value_error naming it and both specs (a shape
/// may change where kiln::loop_options gives it a shape invariant).
/// \code
/// auto [i, total] = kiln::while_loop([](auto i, auto) { return i < 10; },
///                                    [](auto i, auto t) { return std::tuple{i + 1, t + i}; },
///                                    kiln::constant(0), kiln::constant(0));  // 10, 45
/// \endcode
template <class Cond, class Body, class... Vars>
  requires detail::plain_loop_variables<Vars...>
auto while_loop(Cond cond_fn, Body body_fn, const Vars&... vars) {
  return while_loop(std::move(cond_fn), std::move(body_fn), loop_options{}, vars...);
}

namespace detail {
inline tensor index_tensor(const tensor& t) { return t; }
template <std::integral T>
tensor index_tensor(T v) {
  return kiln::constant(std::int32_t(v));
}

/// kiln::for_range as a while loop over a counter `k < n` with `i = start + k * delta`.
template <class Body, class... Vars>
auto counted_loop(const tensor& start, const tensor& limit, const tensor& delta, Body& body_fn, const loop_options& options,
                  const Vars&... vars) {
  // Python's range length: ceil((limit - start) / delta), at least 0.
  const tensor trips = counter_op<ops::maximum>(
      apply_bookkeeping(ops::negate{}, counter_op<ops::floordiv>(start - limit, delta)), 0);
  auto cond_fn = [&](const tensor& k, const auto&...) { return k < trips; };
  auto body = [&](const tensor& k, const auto&... v) {
    const tensor i = start + k * delta;
    using R = std::invoke_result_t<Body&, const tensor&, decltype(v)...>;
    if constexpr (std::is_void_v<R>) {
      body_fn(i, v...);
      return k + 1;
    } else {
      return with_counter(k + 1, body_fn(i, v...));
    }
  };
  return without_counter<sizeof...(Vars)>(
      detail::while_loop(std::size_t(1), options, cond_fn, body, kiln::constant(std::int32_t(0)), vars...));
}
}  // namespace detail

/// kiln::for_range with `options`: shape invariants let loop variables change shape.
/// \code
/// kiln::tensor x = kiln::for_range(
///     5, [](const kiln::tensor&, const kiln::tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
///     kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));  // (5, 10)
/// \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body>
auto for_range(const Limit& limit, Body body_fn, const loop_options& options, const Vars&... vars) {
  return detail::counted_loop(kiln::constant(std::int32_t(0)), detail::index_tensor(limit), kiln::constant(std::int32_t(1)),
                              body_fn, options, vars...);
}
/// A loop over `i = 0, 1, ..., limit - 1` (an int32 scalar tensor): a `while` node
/// in a graph whatever `limit` is (a plain C++ loop in the callable unrolls at trace
/// time instead). `body_fn(i, vars...)` gives the next values; with no loop
/// variables it returns nothing.
/// \code
/// kiln::for_range(3, [](const kiln::tensor& i) { kiln::print(i); });  // 0, 1, 2
/// kiln::tensor total = kiln::for_range(4, [](auto i, auto t) { return t + i; }, kiln::constant(0));  // 6
/// \endcode
template <class Limit, class Body, class... Vars>
  requires detail::loop_index<Limit> && detail::loop_body<Body> && detail::plain_loop_variables<Vars...>
auto for_range(const Limit& limit, Body body_fn, const Vars&... vars) {
  return for_range(limit, std::move(body_fn), loop_options{}, vars...);
}
/// `for i in range(start, limit, delta)` with `options` (see kiln::loop_options).
/// \code
/// kiln::tensor evens = kiln::for_range(0, 10, 2, [](const kiln::tensor& i, const kiln::tensor& x) {
///   return kiln::concat({x, kiln::reshape(i, {1})}, 0);
/// }, kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none}}}, kiln::zeros({0}, kiln::int32));  // [0 2 4 6 8]
/// \endcode
template <class Start, class Limit, class Delta, class Body, class... Vars>
  requires detail::loop_index<Start> && detail::loop_index<Limit> && detail::loop_index<Delta>
auto for_range(const Start& start, const Limit& limit, const Delta& delta, Body body_fn, const loop_options& options,
               const Vars&... vars) {
  return detail::counted_loop(detail::index_tensor(start), detail::index_tensor(limit), detail::index_tensor(delta), body_fn,
                              options, vars...);
}

/// `for i in range(start, limit, delta)` as a graph loop; a zero `delta` raises
/// kiln::invalid_argument_error.
/// \code kiln::for_range(10, 0, -2, [](const kiln::tensor& i) { kiln::print(i); });  // 10 8 6 4 2 \endcode
template <class Start, class Limit, class Delta, class Body, class... Vars>
  requires detail::loop_index<Start> && detail::loop_index<Limit> && detail::loop_index<Delta> &&
           detail::plain_loop_variables<Vars...>
auto for_range(const Start& start, const Limit& limit, const Delta& delta, Body body_fn, const Vars&... vars) {
  return for_range(start, limit, delta, std::move(body_fn), loop_options{}, vars...);
}
}  // namespace kiln
// ----- end kiln/trace/control_flow.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_CONTROL_FLOW_HPP

namespace kiln::detail {

/// Adds the floating-point variables graph `g` reads to `out`, each once, in order of
/// first read.
inline void add_variables_read(const graph& g, std::vector<std::tuple<const void*, dtype, shape>>& out) {
  for (const node& n : g.nodes()) {
    if (n.kind() != node_kind::special) continue;
    for (const auto& [name, branch] : n.special().subgraphs()) add_variables_read(*branch, out);  // cond, while
    const auto* read = n.special().as<read_variable_op>();
    if (!read || !is_floating(read->state()->type())) continue;
    const void* id = read->state().get();
    if (std::ranges::none_of(out, [&](const auto& v) { return std::get<0>(v) == id; }))
      out.emplace_back(id, read->state()->type(), read->state()->dims());
  }
}

/// The vector-Jacobian product of graph `g`, run on `args`: the gradients of the sum
/// of each floating-point output times its gradient in `output_grads`, with respect
/// to each of `sources` (tensors among `args`, or values they were made from), then
/// to each of `variables` (its reads in `g`); zeros where unconnected, and `connected`,
/// if given, tells which were. It replays `g` under a tape into the trace in progress:
/// how backward passes are traced.
template <class>
std::vector<tensor> vector_jacobian_product(const graph& g, std::span<const tensor> args, const std::vector<tensor>& sources,
                                            std::span<const tensor> output_grads,
                                            const std::vector<std::tuple<const void*, dtype, shape>>& variables,
                                            std::vector<bool>* connected) {
  gradient_tape tape;
  for (const tensor& x : sources) tape.watch(x);
  tensor target;  // sum of output * its gradient, in float64 so that outputs of mixed dtypes add up
  std::size_t k = 0;
  for (const tensor& y : replay(g, args))
    if (is_floating(y.dtype())) target = sum_defined(target, kiln::cast(kiln::reduce_sum(y * output_grads[k++]), float64));
  std::vector<tensor> grads = tape.gradients_with_variables(target, sources, variables);
  if (connected) {
    connected->clear();
    for (const tensor& grad : grads) connected->push_back(grad.defined());
  }
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) continue;
    if (i < sources.size()) {
      grads[i] = zeros_shaped_like(sources[i]);
    } else {
      const auto& [id, t, s] = variables[i - sources.size()];
      grads[i] = zero_filled("gradient", s, t, kiln::device::cpu);
    }
  }
  return grads;
}

/// The floating-point tensors of `values`.
inline std::vector<tensor> floating_only(std::span<const tensor> values) {
  std::vector<tensor> out;
  for (const tensor& x : values)
    if (is_floating(x.dtype())) out.push_back(x);
  return out;
}

/// The backward pass of one trace.
template <class>
struct call_backward {
  struct body {
    std::shared_ptr<const graph> forward;
    std::vector<std::tuple<const void*, dtype, shape>> variables;
    // Which gradients the target reaches, as the trace of the backward pass found:
    // the others are given back undefined, as TensorFlow gives None for them.
    std::shared_ptr<std::vector<bool>> connected;

    /// The gradients of the floating-point `inputs`, then of each variable read, given
    /// one gradient per floating-point output.
    std::vector<tensor> operator()(const std::vector<tensor>& inputs, const std::vector<tensor>& output_grads) const {
      return vector_jacobian_product(*forward, inputs, floating_only(inputs), output_grads, variables, connected.get());
    }
  };
  mutable kiln::function<body> fn;  // a call traces on a new signature
  std::shared_ptr<std::vector<bool>> connected;

  /// The gradients of a call: undefined for the sources the target does not reach.
  std::vector<tensor> operator()(std::span<const tensor> in, std::span<const tensor> dys) const {
    std::vector<tensor> grads = fn(std::vector<tensor>(in.begin(), in.end()), std::vector<tensor>(dys.begin(), dys.end()));
    for (std::size_t i = 0; i < grads.size() && i < connected->size(); ++i)
      if (!(*connected)[i]) grads[i] = tensor();
    return grads;
  }
};

/// Records a call of `c` on the tapes of this thread, describing `c`'s backward pass
/// on its first call under a tape.
template <class Lazy>
void record_function_call(const concrete_state& c, std::span<const tensor> inputs, std::span<const tensor> outputs) {
  using backward_t = call_backward<Lazy>;  // dependent, so that nothing here compiles before a tape is made
  std::call_once(c.backward_once, [&] {
    auto call = std::make_shared<differentiable_call>();
    add_variables_read(c.graph, call->variables);
    // The backward pass keeps a copy of the graph, so that it outlives the function.
    auto connected = std::make_shared<std::vector<bool>>();
    auto backward = std::make_shared<backward_t>(backward_t{
        kiln::function(typename backward_t::body{std::make_shared<const graph>(c.graph), call->variables, connected},
                       function_options{.name = c.name + "_grad"}),
        connected});
    call->self = backward;
    call->backward = [](const void* self, std::span<const tensor> in, std::span<const tensor> dys) {
      return (*static_cast<const backward_t*>(self))(in, dys);
    };
    c.backward = std::move(call);
  });
  record_call_on_active_tapes(c.backward, inputs, outputs);
}

/// A `cond` node recorded while a tape records in its trace: its backward pass is a
/// `cond` on the same predicate whose branches are the vector-Jacobian products of the
/// two branches, each with respect to every floating-point value the node captured
/// (zeros for those its branch does not read) and every variable the branches read.
struct cond_backward {
  tensor pred;
  cond_branches branches;
  std::vector<std::tuple<const void*, dtype, shape>> variables;
};

template <class Lazy>
void record_cond_on_tapes(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                          std::span<const tensor> outputs) {
  auto state = std::make_shared<cond_backward>(cond_backward{pred, std::move(branches), {}});
  add_variables_read(state->branches.then_graph, state->variables);
  add_variables_read(state->branches.else_graph, state->variables);
  auto call = std::make_shared<differentiable_call>();
  call->variables = state->variables;
  call->self = state;
  // Its branches are traced here and the node recorded through the program's cond
  // recorder (detail::cond_tracer_hook), not through kiln::cond: a program that makes
  // tapes but traces no cond of its own compiles none of the cond machinery.
  call->backward = [](const void* self, std::span<const tensor> captured, std::span<const tensor> dys) {
    const auto& c = *static_cast<const cond_backward*>(self);
    const std::vector<tensor> sources = floating_only(captured);
    auto branch = [&](const graph& g, const std::vector<int>& picks) {
      return [&](std::span<const tensor>) {
        std::vector<tensor> args;
        for (int k : picks) args.push_back(captured[std::size_t(k)]);
        return vector_jacobian_product<Lazy>(g, args, sources, dys, c.variables);
      };
    };
    trace_context* trace = trace_context::current();
    if (!trace) {  // a node run eagerly (a call with effects under an eager tape)
      return truth_of(c.pred, "cond") ? branch(c.branches.then_graph, c.branches.then_args)({})
                                      : branch(c.branches.else_graph, c.branches.else_args)({});
    }
    const cond_tracer record = cond_tracer_hook().load(std::memory_order_relaxed);
    if (!record)  // a cond node comes from a traced cond, which sets the recorder
      throw internal_error("cond: the gradient of a cond node is traced where no cond was");
    traced_subgraph then_graph, else_graph;
    trace_subgraph(branch(c.branches.then_graph, c.branches.then_args), std::span<const tensor_spec>(), then_graph);
    trace_subgraph(branch(c.branches.else_graph, c.branches.else_args), std::span<const tensor_spec>(), else_graph);
    return record(*trace, c.pred, then_graph, else_graph);
  };
  record_call_on_active_tapes(call, captures, outputs);
}

/// A loop traced through the program's loop tracer (detail::loop_tracer_hook) on
/// `leaves`, whose first is a counter of kiln's own; `arrays` holds each leaf's
/// tensor_array, or null. `condition` and `body` take the leaves; `body` gives the next
/// ones (after the stop flag when `breaks`); `restart` takes the leaves the loop enters
/// with once a tensor_array first written in the body has settled its element shape.
/// Run eagerly where no trace is in progress. How the gradient of a `while` node
/// traces its loops without instantiating kiln::while_loop: a program that makes tapes
/// but traces no loop of its own compiles none of the loop machinery, and one that
/// traces loops but makes no tape compiles none of this.
template <class Condition, class Body, class Restart>
std::vector<tensor> trace_loop_on_leaves(const loop_options& options, std::vector<tensor> leaves,
                                         std::vector<const tensor_array*> arrays, bool breaks, Condition condition,
                                         Body body, Restart restart) {
  trace_context* trace = trace_context::current();
  if (!trace) {  // a node run eagerly (a call with effects under an eager tape): a C++ loop
    for (;;) {
      if (!truth_of(condition(leaves), "while_loop")) return leaves;
      std::vector<tensor> next = body(leaves);
      if (breaks) {
        if (truth_of(next.front(), "break_if")) return leaves;
        next.erase(next.begin());
      }
      leaves = std::move(next);
    }
  }
  struct calls_on_leaves : loop_calls {
    Condition& condition;
    Body& body;
    Restart& restart;
    calls_on_leaves(Condition& c, Body& b, Restart& r)
        : loop_calls{[](loop_calls& self, std::span<const tensor> l) { return of(self).condition(l); },
                     [](loop_calls& self, std::span<const tensor> l) { return of(self).body(l); },
                     [](loop_calls& self, std::span<const tensor> l) { of(self).restart(l); }},
          condition(c),
          body(b),
          restart(r) {}
    static calls_on_leaves& of(loop_calls& self) { return static_cast<calls_on_leaves&>(self); }
  } calls(condition, body, restart);
  const loop_tracer trace_loop = loop_tracer_hook().load(std::memory_order_relaxed);
  if (!trace_loop)  // a while node comes from a traced loop, which sets the tracer
    throw internal_error("while_loop: the gradient of a while node is traced where no loop was");
  std::vector<std::optional<shape>> invariants = loop_invariants(arrays, options, 1);
  std::vector<value_spec> specs = loop_specs(leaves, invariants, 1);
  return trace_loop(*trace, 1, options, std::move(leaves), std::move(arrays), std::move(specs), std::move(invariants),
                    breaks, calls);
}

/// A `while` node recorded while a tape records in its trace (TensorFlow's while_v2
/// gradient, with kiln's value-semantics tensor arrays as the accumulators): its
/// backward pass runs the loop again, stacking each iteration's loop variables in
/// tensor arrays and counting the iterations, then walks the iterations back in a
/// second loop, in which each step is the vector-Jacobian product of the body at the
/// stacked variables. That loop carries the gradients of the loop variables and sums
/// those of the body's captures and of the variables the body reads. The condition
/// gives a bool, so what only it captures gets zeros. A body that ends in break_if
/// stops the recomputed loop the same way.
///
/// A loop variable whose shape changes from one iteration to the next (a shape
/// invariant, or a tensor_array with dynamic_size) cannot be stacked: a tensor array's
/// elements share one shape. The walk back then recomputes each iteration's variables
/// from the loop's initial ones, in a loop of its own with the original loop's shape
/// invariants: memory stays that of one iteration, time grows with the square of the
/// iteration count.
struct loop_backward {
  int vars = 0, cond_captures = 0;
  bool breaks = false;
  bool reshaped = false;  // some loop variable changes shape from one iteration to the next
  graph cond_graph, body_graph;
  std::vector<std::tuple<const void*, dtype, shape>> variables;

  template <class>
  std::vector<tensor> operator()(std::span<const tensor> inputs, std::span<const tensor> dys) const {
    const auto n = std::size_t(vars), body_start = n + std::size_t(cond_captures);
    const std::vector<tensor> initial(inputs.begin(), inputs.begin() + std::ptrdiff_t(n));
    const std::vector<tensor> cond_captured(inputs.begin() + std::ptrdiff_t(n), inputs.begin() + std::ptrdiff_t(body_start));
    const std::vector<tensor> captures(inputs.begin() + std::ptrdiff_t(body_start), inputs.end());
    auto with = [](std::vector<tensor> head, std::span<const tensor> tail) {
      head.insert(head.end(), tail.begin(), tail.end());
      return head;
    };
    // The shapes the body takes its loop variables in: the original loop's shape
    // invariants, which the recomputing loops keep when shapes change, and the walk
    // back for the gradients of the floating-point ones.
    loop_options relaxed, relaxed_gradients;
    if (reshaped) {
      for (std::size_t k = 0; k < n; ++k) {
        const shape& s = body_graph.node_at(body_graph.arguments()[k]).shape();
        relaxed.shape_invariants.emplace_back(s);
        if (is_floating(initial[k].dtype())) relaxed_gradients.shape_invariants.emplace_back(s);
      }
    }
    auto body_results = [&](std::span<const tensor> v) {
      return replay(body_graph, with(std::vector<tensor>(v.begin(), v.end()), captures));
    };
    auto never_restarts = [](std::span<const tensor>) {};
    // The forward loop again, counting its iterations and, when shapes stay, keeping
    // the loop variables of every iteration that went on: leaves [i, variables...,
    // stacks...]. A body that ends in break_if gives its condition first: the
    // iteration that breaks keeps the values it started with, so it is left out of the
    // walk back (its write to the stacks is dropped with the rest of its values).
    std::vector<tensor_array> stacks;
    if (!reshaped)
      for (const tensor& x : initial)
        stacks.emplace_back(x.dtype(), std::int64_t(0), tensor_array_options{.dynamic_size = true});
    std::vector<tensor> leaves = with({kiln::constant(std::int32_t(0))}, initial);
    std::vector<const tensor_array*> arrays(leaves.size(), nullptr);
    for (const tensor_array& s : stacks) {
      leaves.push_back(s.elements());
      arrays.push_back(&s);
    }
    const std::vector<tensor> recomputed = trace_loop_on_leaves(
        relaxed, std::move(leaves), std::move(arrays), breaks,
        [&](std::span<const tensor> l) {
          const std::span<const tensor> v = l.subspan(1, n);
          return replay(cond_graph, with(std::vector<tensor>(v.begin(), v.end()), cond_captured))[0];
        },
        [&](std::span<const tensor> l) {
          const tensor& i = l[0];
          const std::span<const tensor> v = l.subspan(1, n);
          std::vector<tensor> out = body_results(v);
          std::vector<tensor> next;
          if (breaks) {
            next.push_back(out.front());
            out.erase(out.begin());
          }
          next.push_back(i + 1);
          next.insert(next.end(), out.begin(), out.end());
          for (std::size_t k = 0; k < stacks.size(); ++k)
            next.push_back(stacks[k].with_elements(l[1 + n + k]).write(i, v[k]).elements());
          return next;
        },
        [&](std::span<const tensor> l) {
          for (std::size_t k = 0; k < stacks.size(); ++k) stacks[k] = stacks[k].with_elements(l[1 + n + k]);
        });
    const tensor& count = recomputed[0];
    std::vector<tensor_array> states;
    for (std::size_t k = 0; k < stacks.size(); ++k) states.push_back(stacks[k].with_elements(recomputed[1 + n + k]));
    // The loop variables iteration `i` began with. Every iteration before the
    // counted ones went on, so the recomputing loop needs no condition but the count.
    auto state_at = [&](const tensor& i) {
      if (!reshaped) {
        std::vector<tensor> state;
        for (const tensor_array& s : states) state.push_back(s.read(i));
        return state;
      }
      std::vector<tensor> out = trace_loop_on_leaves(
          relaxed, with({kiln::constant(std::int32_t(0))}, initial), std::vector<const tensor_array*>(n + 1), false,
          [&](std::span<const tensor> l) { return l[0] < i; },
          [&](std::span<const tensor> l) {
            std::vector<tensor> next = body_results(l.subspan(1));
            if (breaks) next.erase(next.begin());
            next.insert(next.begin(), l[0] + 1);
            return next;
          },
          never_restarts);
      out.erase(out.begin());
      return out;
    };
    // The iterations backwards: the gradient of each step's variables from the
    // next's. Leaves [j, gradients of the variables, of the captures, of the
    // variables read].
    std::vector<tensor> walk = {kiln::constant(std::int32_t(0))};
    walk.insert(walk.end(), dys.begin(), dys.end());
    const std::size_t captured_at = walk.size();
    for (const tensor& c : floating_only(captures)) walk.push_back(zeros_shaped_like(c));
    for (const auto& [id, t, s] : variables) walk.push_back(zero_filled("gradient", s, t, kiln::device::cpu));
    const std::size_t walk_leaves = walk.size();
    const std::vector<tensor> walked = trace_loop_on_leaves(
        relaxed_gradients, std::move(walk), std::vector<const tensor_array*>(walk_leaves), false,
        [&](std::span<const tensor> l) { return l[0] < count; },
        [&](std::span<const tensor> l) {
          const std::vector<tensor> args = with(state_at(count - 1 - l[0]), captures);
          const std::vector<tensor> g(l.begin() + 1, l.begin() + std::ptrdiff_t(captured_at));
          const std::vector<tensor> step = vector_jacobian_product<void>(body_graph, args, floating_only(args), g, variables);
          std::vector<tensor> next{l[0] + 1};
          std::size_t k = 0;
          for (std::size_t m = 1; m < captured_at; ++m) next.push_back(step[k++]);
          for (std::size_t m = captured_at; m < l.size(); ++m) next.push_back(l[m] + step[k++]);
          return next;
        },
        never_restarts);
    // One gradient per floating-point input of the node, then per variable read.
    std::vector<tensor> out(walked.begin() + 1, walked.begin() + std::ptrdiff_t(captured_at));
    for (const tensor& c : cond_captured)
      if (is_floating(c.dtype())) out.push_back(zeros_shaped_like(c));
    out.insert(out.end(), walked.begin() + std::ptrdiff_t(captured_at), walked.end());
    return out;
  }
};

template <class Lazy>
void record_loop_on_tapes(const while_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs) {
  auto state = std::make_shared<loop_backward>(
      loop_backward{op.loop_variables(), op.cond_captures(), op.breaks(), false, op.cond_graph(), op.body_graph(), {}});
  for (std::size_t k = 0; k < outputs.size(); ++k) state->reshaped |= outputs[k].shape() != inputs[k].shape();
  add_variables_read(state->body_graph, state->variables);
  auto call = std::make_shared<differentiable_call>();
  call->variables = state->variables;
  call->self = state;
  call->backward = [](const void* self, std::span<const tensor> in, std::span<const tensor> dys) {
    return static_cast<const loop_backward*>(self)->template operator()<Lazy>(in, dys);
  };
  record_call_on_active_tapes(call, inputs, outputs);
}

}  // namespace kiln::detail
// ----- end kiln/autodiff/function_gradient.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_AUTODIFF_FUNCTION_GRADIENT_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_EFFECTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_EFFECTS_HPP
// ----- begin kiln/trace/effects.hpp -----
/// \file
/// State and effects (API.md section 4): `kiln::variable`, `kiln::print` and
/// `kiln::host_callback`. Outside a trace they act at once; while tracing they
/// record their special op (kiln/exec/effects.hpp) so that they act at every run.

#include <concepts>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>


namespace kiln {
namespace detail {
template <class>
struct saved_function_io;
}  // namespace detail

/// Mutable state shared by every copy of the handle: a tensor whose dtype and shape
/// are fixed at creation. Usable wherever a tensor is (`v * x`, `1 + v`). Inside a
/// kiln::function, reads and writes run at every call, in program order; a variable
/// may be created during the first trace only, and must outlive it (keep it in
/// state the callable captured), else the call raises kiln::value_error.
/// \code
/// kiln::variable v(1.f);
/// v.assign_add(kiln::constant(2.f));  // v is now 3
/// kiln::tensor y = v * 2.f;            // 6
/// \endcode
class variable {
 public:
  /// An empty handle, for state filled on first use: `if (!c.v) c.v = kiln::variable(0);`.
  variable() = default;
  /// A variable holding `initial`. While tracing, `initial` may be symbolic: the
  /// variable then takes its value when the function first runs. (The members that
  /// write are templates, as op functions are, so that the kernels of the arithmetic
  /// assignments compile only where a program writes a variable.)
  template <class = void>
  explicit variable(const tensor& initial, std::string name = "Variable") {
    if (!initial.defined()) throw invalid_argument_error("variable: the initial value is an empty tensor");
    handle_ = std::make_shared<handle>();
    handle_->state = std::make_shared<detail::variable_state>(std::move(name), initial.dtype(), initial.shape());
    detail::trace_context* trace = detail::trace_context::current();
    if (trace) trace->note_created_variable(handle_);
    if (initial.is_symbolic()) {
      record_write(detail::assign_mode::initialize, initial);
    } else {
      handle_->state->update([&](const tensor&) { return initial; });
    }
  }
  /// A scalar variable: `kiln::variable v(0)`, `kiln::variable w(1.5f, "w")`.
  template <class T>
    requires std::is_arithmetic_v<T>
  explicit variable(T initial, std::string name = "Variable") : variable(kiln::constant(initial), std::move(name)) {}

  /// True when the handle holds a variable.
  explicit operator bool() const { return handle_ != nullptr; }

  /// The current value (while tracing, a read that runs at every call). The gradient
  /// tapes recording on this thread watch the value read.
  tensor read_value() const {
    const auto& s = state();
    detail::trace_context* trace = detail::trace_context::current();
    tensor value = trace ? trace->record_special(std::make_shared<detail::read_variable_op>(s), {}, {{s->type(), s->dims()}})[0]
                         : s->read();
    if (detail::recording_tapes() > 0) detail::variable_read_hook().load(std::memory_order_relaxed)(identity(), value);
    return value;
  }
  /// The value, as a tensor: what makes a variable usable wherever a tensor is.
  operator tensor() const { return read_value(); }

  /// Sets the value to `x` (same dtype and shape, else kiln::invalid_argument_error); returns it.
  template <class = void>
  tensor assign(const tensor& x) const { return write(detail::assign_mode::assign, x); }
  /// Adds `x` to the value; returns the new value.
  template <class = void>
  tensor assign_add(const tensor& x) const { return write(detail::assign_mode::add, x); }
  /// Subtracts `x` from the value; returns the new value.
  template <class = void>
  tensor assign_sub(const tensor& x) const { return write(detail::assign_mode::subtract, x); }
  template <class T>
    requires std::is_arithmetic_v<T>
  tensor assign(T x) const { return assign(scalar(x)); }
  template <class T>
    requires std::is_arithmetic_v<T>
  tensor assign_add(T x) const { return assign_add(scalar(x)); }
  template <class T>
    requires std::is_arithmetic_v<T>
  tensor assign_sub(T x) const { return assign_sub(scalar(x)); }

  kiln::dtype dtype() const { return state()->type(); }
  const kiln::shape& shape() const { return state()->dims(); }
  const std::string& name() const { return state()->name(); }

  /// What identifies the variable in a kiln::function signature: every copy of a
  /// handle is the same variable.
  const void* identity() const { return state().get(); }

 private:
  // What the caller's copies share: a variable created while tracing must keep one
  // alive after the trace (the graph holds the state itself, not this).
  struct handle {
    std::shared_ptr<detail::variable_state> state;
  };
  // A loaded function's variables (kiln/saved_function.hpp) are handles on the states
  // its graphs read and write.
  template <class>
  friend struct detail::saved_function_io;
  explicit variable(std::shared_ptr<detail::variable_state> s)
      : handle_(std::make_shared<handle>(handle{std::move(s)})) {}

  const std::shared_ptr<detail::variable_state>& state() const {
    if (!handle_) throw value_error("variable: the handle is empty (default-constructed)");
    return handle_->state;
  }
  template <class T>
  tensor scalar(T x) const {
    return kiln::constant(x, state()->type());
  }
  template <class = void>
  tensor write(detail::assign_mode mode, const tensor& x) const {
    const auto& s = state();
    if (!x.defined()) throw invalid_argument_error("variable: cannot assign an empty tensor to " + s->label());
    if (detail::trace_context::current() || x.is_symbolic()) return record_write(mode, x);
    return detail::assign_variable_op(s, mode).apply(x);
  }
  template <class = void>
  tensor record_write(detail::assign_mode mode, const tensor& x) const {
    const auto& s = state();
    detail::trace_context* trace = detail::trace_context::current();
    if (!trace) throw type_error("variable: a symbolic tensor was used outside the trace that made it");
    auto op = std::make_shared<detail::assign_variable_op>(s, mode);
    s->check(op->name(), x);  // at trace time, as the op would at run time
    const tensor inputs[] = {x};
    return trace->record_special(std::move(op), inputs, {{s->type(), s->dims()}})[0];
  }

  std::shared_ptr<handle> handle_;
};

/// Prints its arguments, separated by spaces, then a newline, to
/// config::print_stream(), as tf.print does: strings as they are, tensors as their
/// values (`1`, `[1 2 3]`, `[[1 2] [3 4]]`). Outside a function it prints at once;
/// inside one it prints at every call (a C++ `std::cout` there prints only while tracing).
/// \code kiln::print("Executed with", kiln::constant({1, 2}));  // Executed with [1 2] \endcode
template <class... Args>
void print(const Args&... args) {
  std::vector<detail::print_piece> pieces;
  std::vector<tensor> inputs;
  (detail::add_print_piece(args, pieces, inputs), ...);
  if (detail::trace_context* trace = detail::trace_context::current()) {
    trace->record_special(std::make_shared<detail::print_op>(std::move(pieces)), inputs, {});
    return;
  }
  std::vector<const tensor*> in;
  for (const tensor& t : inputs) in.push_back(&t);
  detail::write_print_line(detail::print_line(pieces, in));
}

namespace detail {
// The callback's results as a list: nothing, one tensor, or a tuple of tensors.
template <class R>
std::vector<tensor> callback_results(R&& r) {
  using U = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<U, tensor>) {
    return {std::forward<R>(r)};
  } else {
    return std::apply([](auto&&... t) { return std::vector<tensor>{tensor(t)...}; }, std::forward<R>(r));
  }
}
}  // namespace detail

/// Runs C++ function `fn` on concrete tensors at every execution (TensorFlow's
/// tf.py_function): `fn` takes one `const kiln::tensor&` per input and returns
/// nothing (empty `out_specs`), a tensor (one spec) or a tuple of tensors. Returns
/// one tensor per spec; results that do not match `out_specs` raise
/// kiln::invalid_argument_error.
/// \code
/// std::vector<kiln::tensor> seen;
/// kiln::host_callback([&](const kiln::tensor& x) { seen.push_back(x); }, {}, kiln::constant(1.f));
/// \endcode
template <class F, class... Inputs>
std::vector<tensor> host_callback(F fn, const std::vector<tensor_spec>& out_specs, const Inputs&... inputs) {
  static_assert((std::is_convertible_v<const Inputs&, tensor> && ...), "kiln::host_callback: the inputs are tensors");
  using R = std::invoke_result_t<F&, decltype((void(inputs), std::declval<const tensor&>()))...>;
  auto call = [fn = std::move(fn)](std::span<const tensor* const> in) mutable -> std::vector<tensor> {
    return [&]<std::size_t... I>(std::index_sequence<I...>) -> std::vector<tensor> {
      if constexpr (std::is_void_v<R>) {
        fn(*in[I]...);
        return {};
      } else {
        return detail::callback_results(fn(*in[I]...));
      }
    }(std::index_sequence_for<Inputs...>{});
  };
  std::vector<std::pair<dtype, shape>> results;
  for (const tensor_spec& s : out_specs) results.emplace_back(s.dtype, s.shape);
  auto op = std::make_shared<detail::host_callback_op>(std::move(call), std::move(results));
  const tensor args[] = {tensor(inputs)..., tensor()};
  std::span<const tensor> in(args, sizeof...(Inputs));
  if (detail::trace_context* trace = detail::trace_context::current()) return trace->record_special(op, in, op->results());
  std::vector<const tensor*> pointers;
  for (const tensor& t : in) {
    t.require_value("host_callback");
    pointers.push_back(&t);
  }
  return op->run(pointers);
}

}  // namespace kiln
// ----- end kiln/trace/effects.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_EFFECTS_HPP
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

/// What a typed loop body returns to stop early (kiln::break_if): the condition, and
/// the values to go on with.
template <class P, class Tuple>
struct break_result {
  P stop;
  Tuple next;
};
template <class R>
struct is_break : std::false_type {};
template <class P, class Tuple>
struct is_break<break_result<P, Tuple>> : std::true_type {};
/// Whether a body's result stops on a symbolic condition.
template <class R>
inline constexpr bool stops_lazily = false;
template <class P, class Tuple>
inline constexpr bool stops_lazily<break_result<P, Tuple>> = lazy<P>;

/// A loop body's next values as a tuple, with or without kiln::break_if.
template <class R>
auto next_values(R&& r) {
  if constexpr (is_break<std::remove_cvref_t<R>>::value)
    return as_tuple(std::forward<R>(r).next);
  else
    return as_tuple(std::forward<R>(r));
}

inline void run_steps(const std::vector<step>& steps, frame f) {
  for (const step& s : steps) s.run(s.data.get(), f);
}

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
  static void run(const void* data, frame f) {
    const auto& c = *static_cast<const cond_step*>(data);
    run_steps(*static_cast<const bool*>(f[c.pred]) ? c.then_steps : c.else_steps, f);
  }
  static void describe(const void* data, description_sink& sink) { sink.control_flow(*static_cast<const cond_step*>(data)); }
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
  static void run(const void* data, frame f) {
    const auto& l = *static_cast<const loop_step*>(data);
    for (;;) {
      run_steps(l.cond_steps, f);
      if (!*static_cast<const bool*>(f[l.pred])) return;
      run_steps(l.body_steps, f);
      if (l.stop >= 0 && *static_cast<const bool*>(f[l.stop])) return;
      for (const copy& c : l.copies) std::memcpy(f[c.to], f[c.from], c.bytes);
    }
  }
  static void describe(const void* data, description_sink& sink) { sink.control_flow(*static_cast<const loop_step*>(data)); }
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
  return typed::break_result<P, std::tuple<Next...>>{pred, std::tuple<Next...>(next...)};
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
      return typed::break_result<decltype(r.stop), decltype(next)>{r.stop, std::move(next)};
    else
      return next;
  };
  auto out = typed::as_tuple(typed::loop<true>(cond_fn, body, fixed<std::int32_t>(0), vars...));
  return typed::unwrap(std::apply([](auto&&, auto&&... rest) { return std::tuple{std::move(rest)...}; }, std::move(out)));
}

}  // namespace kiln
// ----- end kiln/typed/control_flow.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_CONTROL_FLOW_HPP

namespace kiln {

/// A variable whose element type and shape are compile-time, for functions called with
/// `fixed` arguments (API.md section 4). Copies share the value. Inside a typed trace
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

/// A step reading the variable into slot `slot`, or writing slot `slot` to it; holds
/// the state, so the trace keeps the variable alive.
template <class V, bool Write>
struct variable_access {
  std::shared_ptr<variable_state<V>> target;
  int slot;
  variable_access(std::shared_ptr<variable_state<V>> t, int s) : target(std::move(t)), slot(s) {}
  static void run(const void* data, frame f) {
    const auto& a = *static_cast<const variable_access*>(data);
    if constexpr (Write)
      std::memcpy(a.target->value.data(), f[a.slot], bytes_of<V>);
    else
      std::memcpy(f[a.slot], a.target->value.data(), bytes_of<V>);
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& a = *static_cast<const variable_access*>(data);
    if constexpr (Write)
      sink.effect("AssignVariableOp", true, {sink.value(a.slot, V::dims_type::values)}, {{V::dtype, V::shape()}});
    else
      sink.bind(a.slot, sink.effect("ReadVariableOp", false, {}, {{V::dtype, V::shape()}})[0]);
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

  /// The value at this point of every run of the trace.
  symbol_type read_value() const {
    typed::recorder& r = recorder_for("read_value");
    const int out = r.add_slot(typed::bytes_of<value_type>);
    r.push(typed::step_of(std::make_unique<const typed::variable_access<value_type, false>>(state_, out)));
    return symbol_type(out);
  }
  /// Writes `x` (a typed operand of this type) and gives the value written.
  template <class X>
    requires typed::operand<X>
  symbol_type assign(const X& x) {
    recorder_for("assign");
    const symbol_type written(typed::expression_of<T, false>(x));
    typed::current_recorder().push(
        typed::step_of(std::make_unique<const typed::variable_access<value_type, true>>(state_, written.slot())));
    return written;
  }
  /// Adds `x` to the value and gives the sum.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_add(const X& x) {
    recorder_for("assign_add");
    return assign(read_value() + x);
  }
  /// Subtracts `x` from the value and gives the difference.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_sub(const X& x) {
    recorder_for("assign_sub");
    return assign(read_value() - x);
  }

 private:
  using state = typed::variable_state<value_type>;
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
  static void run(const void* data, frame f) {
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
  static void describe(const void* data, description_sink& sink) {
    std::vector<int> inputs;
    for (const input& i : static_cast<const print_step*>(data)->inputs) inputs.push_back(sink.value(i.slot, i.shape.dims()));
    sink.effect("PrintV2", true, std::move(inputs), {});
  }
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
/// results written to the slots `out`.
template <class F, class R, class... In>
struct callback_step {
  static constexpr std::size_t results = result_count<R>;
  mutable F fn;  // a callback may keep state of its own, as a C++ function may
  std::array<int, sizeof...(In)> in;
  std::array<int, results> out;
  static void run(const void* data, frame f) {
    const auto& c = *static_cast<const callback_step*>(data);
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
    const std::vector<int> ids = sink.effect("HostCallback", true, {nodes.begin(), nodes.end()}, specs);
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
    auto data = std::make_unique<step_t>(step_t{std::move(fn), {typed::slot_of(inputs)...}, {}});
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
// ----- end kiln/typed/effects.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_EFFECTS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRACE_RANDOM_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRACE_RANDOM_HPP
// ----- begin kiln/trace/random.hpp -----
/// \file
/// Random numbers (API.md section 1, `random::uniform`), stateful as TensorFlow's:
/// every draw, eager or in a graph, gives new numbers, and the sequence of draws is
/// reproducible from seeds. Eagerly a draw fills a tensor at once; while tracing it
/// records a special op that draws again at every run of the graph, instead of a
/// constant drawn once at trace time. `random::generator` is tf.random.Generator;
/// `random::stateless_uniform` is the pure function of a seed.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace kiln {
namespace detail {

/// splitmix64's finalizer: a bijection of 64-bit words in which every input bit
/// reaches every output bit (how seeds are spread into keys).
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return z ^ (z >> 31);
}

/// The next number of splitmix64, a 64-bit generator whose state is `state`, and
/// which the call advances: where kiln needs a stream of numbers, not a distribution
/// (shuffling a dataset's buffer, spreading seeds).
constexpr std::uint64_t splitmix64(std::uint64_t& state) { return mix64(state += 0x9E3779B97F4A7C15u); }

/// A seed for an unseeded random call: distinct per call and per process run. A run
/// is told apart by the clocks at the first call and by where the address space put
/// this function's counter (randomized per run), not by std::random_device: <random>
/// costs every file that includes kiln a tenth of a second to parse.
inline std::uint64_t fresh_seed() {
  static std::atomic<std::uint64_t> next{
      std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      std::uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) ^
      (std::uint64_t(reinterpret_cast<std::uintptr_t>(&next)) << 16)};
  std::uint64_t state = next.fetch_add(0x9E3779B97F4A7C15u, std::memory_order_relaxed);
  return splitmix64(state);
}

/// What one uniform draw makes: a checked shape, dtype and bounds.
struct uniform_spec {
  shape dims;
  dtype type;
  double minval;
  std::optional<double> maxval;

  /// The contract's errors for a dtype, shape or bounds a draw cannot take. (A
  /// template, as `draw` is, so that the bounds' checks compile only in programs that draw.)
  template <class = void>
  void check() const {
    if (!is_floating(type) && !is_integer(type))
      throw type_error("random::uniform: dtype must be int32, int64, float32 or float64, got " + std::string(name(type)));
    if (is_integer(type) && !maxval)
      throw invalid_argument_error("random::uniform: an integer dtype (" + std::string(name(type)) +
                                   ") needs an explicit maxval");
    require_fully_defined("random::uniform", dims);
    visit_dtype(type, [&]<class T>() { (void)bounds<T>(); });
  }

  /// A fresh tensor of numbers drawn from stream `stream` of Philox keyed by `key`.
  /// (This and every function that draws is a template, as op functions are, so that
  /// the fill kernels compile only in programs that draw.)
  template <class = void>
  tensor draw(std::uint64_t key, std::uint64_t stream) const {
    tensor out(type, dims);
    visit_dtype(type, [&]<class T>() {
      if constexpr ((std::is_integral_v<T> && !std::is_same_v<T, bool>) || std::is_floating_point_v<T>) {
        auto [lo, hi] = bounds<T>();
        uniform_fill(out.view().as<T>(), out.size(), key, stream, lo, hi);
      }
    });
    return out;
  }

 private:
  template <class T>
  std::pair<T, T> bounds() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      T lo = integer_bound<T>(minval, "minval", type), hi = integer_bound<T>(*maxval, "maxval", type);
      if (!(lo < hi))
        throw invalid_argument_error("random::uniform: maxval " + std::to_string(hi) + " must be greater than minval " +
                                     std::to_string(lo));
      return {lo, hi};
    } else if constexpr (std::is_floating_point_v<T>) {
      T lo = T(minval), hi = T(maxval.value_or(1));
      if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi))
        throw invalid_argument_error("random::uniform: the bounds must be finite with minval < maxval, got minval " +
                                     describe_value(lo) + " and maxval " + describe_value(hi));
      return {lo, hi};
    } else {
      return {};
    }
  }
};

/// The process's random state: the global seed (random::set_seed), the counter that
/// gives ops without a seed of their own one under a global seed, and how many draws
/// each seeded eager op has made (its next stream).
struct random_state {
  std::mutex mutex;
  std::optional<std::uint64_t> global_seed;
  std::uint64_t next_op_seed = 0;
  std::map<std::uint64_t, std::uint64_t> eager_draws;

  static random_state& get() {
    static random_state s;
    return s;
  }

  /// The Philox key of an op with seed `op_seed` under the global seed, TensorFlow's
  /// rules: an op seed alone keys the op; a global seed gives each op without one a
  /// seed of its own in creation order, so a program draws the same numbers at every
  /// run; with neither the key is fresh.
  std::uint64_t key_for(std::optional<std::uint64_t> op_seed) {
    std::lock_guard lock(mutex);
    if (!global_seed) return op_seed ? *op_seed : fresh_seed();
    const std::uint64_t op = op_seed ? *op_seed : next_op_seed++;
    return mix64(*global_seed ^ mix64(op + 0x9E3779B97F4A7C15u));
  }
  /// The stream of the next eager draw with key `key`.
  std::uint64_t next_eager_stream(std::uint64_t key) {
    std::lock_guard lock(mutex);
    return eager_draws[key]++;
  }
};

/// The state of a random::generator, shared by its copies and the graphs that draw
/// from it: a key and the next stream.
struct generator_state {
  std::atomic<std::uint64_t> key;
  std::atomic<std::uint64_t> next_stream{0};
  explicit generator_state(std::uint64_t k) : key(k) {}
  std::pair<std::uint64_t, std::uint64_t> take() { return {key.load(), next_stream.fetch_add(1)}; }
};

/// A random draw in a graph (`RandomUniform`): each run takes the next stream of its
/// own key, or of its generator's state. Never folded or merged, as a special op.
class random_uniform_op final : public special_op {
 public:
  template <class = void>
  random_uniform_op(uniform_spec spec, std::uint64_t key)
      : special_op(std::type_identity<random_uniform_op>()), spec_(std::move(spec)), key_(key) {}
  template <class = void>
  random_uniform_op(uniform_spec spec, std::shared_ptr<generator_state> generator)
      : special_op(std::type_identity<random_uniform_op>()), spec_(std::move(spec)), generator_(std::move(generator)) {}

  std::string_view name() const { return generator_ ? "StatefulUniform" : "RandomUniform"; }
  // A generator's draw advances state that later draws see, so it runs even when
  // its numbers are not needed, in program order; an op's own counter does not.
  bool has_effects() const { return generator_ != nullptr; }
  template <class = void>
  tensor run(std::span<const tensor* const>) const {
    auto [key, stream] = generator_ ? generator_->take() : std::pair{key_, next_stream_.fetch_add(1)};
    return spec_.draw(key, stream);
  }
  std::vector<std::pair<dtype, shape>> results() const { return {{spec_.type, spec_.dims}}; }
  /// What it draws, and from which key (its own, when it has no generator).
  const uniform_spec& spec() const { return spec_; }
  std::uint64_t key() const { return key_; }
  const std::shared_ptr<generator_state>& generator() const { return generator_; }

 private:
  uniform_spec spec_;
  std::uint64_t key_ = 0;
  mutable std::atomic<std::uint64_t> next_stream_{0};
  std::shared_ptr<generator_state> generator_;
};

/// Records `op` in the trace in progress and returns its symbolic result.
inline tensor record_random(std::shared_ptr<const random_uniform_op> op, trace_context& trace) {
  return trace.record_special(op, {}, op->results())[0];
}

}  // namespace detail

namespace random {

/// Sets the global seed, as tf.random.set_seed: from then on the sequence of numbers
/// that random::uniform draws, eagerly and in functions traced afterwards, is the same
/// at every run of the program. Setting it again starts the sequences over.
/// \code kiln::random::set_seed(1234); \endcode
inline void set_seed(std::uint64_t seed) {
  detail::random_state& s = detail::random_state::get();
  std::lock_guard lock(s.mutex);
  s.global_seed = seed;
  s.next_op_seed = 0;
  s.eager_draws.clear();
}

/// Numbers drawn uniformly from [minval, maxval) (maxval defaults to 1 for floats
/// and must be given for integers). Stateful, as tf.random.uniform: every call draws
/// new numbers, and inside a kiln::function every run of the graph does. With a
/// `seed` (and random::set_seed) the sequence of draws is the same at every run of the
/// program, whatever the thread count. Bounds must be finite with minval < maxval, and
/// whole numbers within range for integer dtypes (as doubles, so int64 bounds beyond
/// 2^53 are not exact); else kiln::invalid_argument_error.
/// \code kiln::random::uniform({10, 10}, -1, 2, kiln::int32);
/// kiln::random::uniform({5}, 0, 1, kiln::float32, 42);  // the same first 5 numbers at every run \endcode
template <class = void>
tensor uniform(const shape& s, double minval = 0, std::optional<double> maxval = std::nullopt, dtype t = float32,
               std::optional<std::uint64_t> seed = std::nullopt) {
  detail::uniform_spec spec{s, t, minval, maxval};
  spec.check();
  detail::random_state& state = detail::random_state::get();
  const std::uint64_t key = state.key_for(seed);
  if (detail::trace_context* trace = detail::trace_context::current())
    return detail::record_random(std::make_shared<const detail::random_uniform_op>(std::move(spec), key), *trace);
  return spec.draw(key, seed ? state.next_eager_stream(key) : 0);
}

/// Numbers drawn uniformly from [minval, maxval) as a pure function of `seed`, shape
/// and dtype, as tf.random.stateless_uniform: the same arguments give the same numbers.
/// \code kiln::random::stateless_uniform({3}, 7);  // three floats, the same every call \endcode
template <class = void>
tensor stateless_uniform(const shape& s, std::uint64_t seed, double minval = 0, std::optional<double> maxval = std::nullopt,
                         dtype t = float32) {
  detail::uniform_spec spec{s, t, minval, maxval};
  spec.check();
  return spec.draw(seed, 0);
}

/// A random number generator with its own state, as tf.random.Generator: each draw
/// advances the state, so draws differ, and copies share it. Inside a kiln::function a
/// draw happens at every run, in program order, from the state at that moment.
/// \code
/// auto g = kiln::random::generator::from_seed(1);
/// kiln::tensor a = g.uniform({2, 3});
/// kiln::tensor b = g.uniform({2, 3});  // new numbers
/// g.reset_from_seed(1);                // a's numbers come again
/// \endcode
class generator {
 public:
  /// A generator whose draws depend on `seed` only.
  static generator from_seed(std::uint64_t seed) { return generator(seed); }
  /// A generator seeded from the operating system.
  static generator from_non_deterministic_state() { return generator(detail::fresh_seed()); }

  /// Starts the sequence of `seed` over, for this generator and its copies.
  void reset_from_seed(std::uint64_t seed) {
    state_->key = seed;
    state_->next_stream = 0;
  }

  /// Numbers drawn uniformly from [minval, maxval), as random::uniform.
  template <class = void>
  tensor uniform(const shape& s, double minval = 0, std::optional<double> maxval = std::nullopt, dtype t = float32) {
    detail::uniform_spec spec{s, t, minval, maxval};
    spec.check();
    if (detail::trace_context* trace = detail::trace_context::current())
      return detail::record_random(std::make_shared<const detail::random_uniform_op>(std::move(spec), state_), *trace);
    auto [key, stream] = state_->take();
    return spec.draw(key, stream);
  }

 private:
  explicit generator(std::uint64_t seed) : state_(std::make_shared<detail::generator_state>(seed)) {}
  std::shared_ptr<detail::generator_state> state_;
};

}  // namespace random
}  // namespace kiln
// ----- end kiln/trace/random.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRACE_RANDOM_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TYPED_GRAPH_HPP
#define KILN_SINGLE_INCLUDE_KILN_TYPED_GRAPH_HPP
// ----- begin kiln/typed/graph.hpp -----
/// \file
/// The graph of a typed trace (typed::concrete_function::graph()): the kiln::graph the
/// runtime tier traces from the same callable, built from the trace's steps, each of
/// which describes itself to a `typed::description_sink` (kiln/typed/expr.hpp). An
/// expression gives one op node per op (broadcasts are implicit, as in the runtime
/// tier), a kernel step the node of its op, a `cond` or loop step a `cond` or `while`
/// node whose branches or condition and body are graphs of their own (values they read
/// from outside are their placeholders and the node's inputs), and effects the runtime
/// tier's effect nodes. It comes with kiln/kiln.hpp: kiln/fixed.hpp has no kiln::graph.

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>


namespace kiln {
namespace typed {

/// A node of a typed trace's graph that stands for a step with effects or graphs of
/// its own: it has the runtime tier's name for it (`cond`, `while`, `PrintV2`, ...),
/// and its branches or body as subgraphs, but runs only as part of its trace.
class described_op final : public special_op {
 public:
  using labelled_graphs = std::vector<std::pair<std::string, std::shared_ptr<const graph>>>;
  described_op(std::string name, bool effects, labelled_graphs subgraphs = {})
      : special_op(std::type_identity<described_op>()), name_(std::move(name)), effects_(effects),
        subgraphs_(std::move(subgraphs)) {}
  std::string_view name() const { return name_; }
  bool has_effects() const { return effects_; }
  std::vector<tensor> run(std::span<const tensor* const>) const {
    throw unavailable_error("kiln: node " + name_ +
                            " of a typed trace's graph describes a step of the trace; call the function to run it");
  }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const {
    std::vector<std::pair<std::string, const graph*>> out;
    for (const auto& [label, g] : subgraphs_) out.emplace_back(label, g.get());
    return out;
  }

 private:
  std::string name_;
  bool effects_;
  labelled_graphs subgraphs_;
};

/// Builds the graph of a typed trace, or of one of its branches or loop bodies (then
/// `outer` is the graph that runs it). A template only so that a program compiles it
/// where it asks for a typed trace's graph (its table of the registry's ops cost every
/// source file including kiln/kiln.hpp about 0.9 s); `graph_writer` names it.
template <class>
class basic_graph_writer final : public description_sink {
 public:
  explicit basic_graph_writer(basic_graph_writer* outer = nullptr) : outer_(outer) {}

  /// The graph of trace `t`, whose typed arguments are `fixed` values of types `Fixed`.
  template <class... Fixed, class R>
  static kiln::graph graph_of(const trace<R>& t) {
    basic_graph_writer w;
    int slot = 0;
    ((w.bind(slot, w.graph_.add_placeholder(t.argument_names[std::size_t(slot)], Fixed::dtype, Fixed::shape())), ++slot),
     ...);
    w.add_steps(t.steps);
    if constexpr (!std::is_void_v<R>) {
      // The results' nodes first, then their Identity nodes, as the runtime tier adds them.
      std::vector<int> results;
      w.add_results(*t.result, results);
      for (int id : results) w.graph_.add_output(id);
    }
    return std::move(w.graph_);
  }

  void add_steps(const std::vector<step>& steps) {
    for (const step& s : steps) s.describe(s.data.get(), *this);
  }

  // ---- description_sink ----------------------------------------------------------------

  int value(int slot, std::span<const std::int64_t> dims) override {
    const int id = value(slot);
    const kiln::node& n = graph_.node_at(id);
    if (std::ranges::equal(n.shape().dims(), dims)) return id;
    // A reshaped symbolic value is a view of its slot: its reshape node appears where
    // it is first read with the new dims.
    const kiln::shape s = kiln::shape(dims);
    const auto key = std::pair{slot, s.str()};
    if (auto it = views_.find(key); it != views_.end()) return it->second;
    return views_[key] = graph_.add_op(ops::reshape{s}, {id}, n.dtype(), s);
  }
  void bind(int slot, int node_id) override { slots_[slot] = node_id; }
  int op(std::string_view name, const void* op, std::span<const int> inputs, kiln::dtype t,
         std::span<const std::int64_t> dims) override {
    return graph_.add_op(registry_op(name, op), {inputs.begin(), inputs.end()}, t, kiln::shape(dims));
  }
  int constant(kiln::dtype t, std::span<const std::int64_t> dims, const void* data) override {
    tensor value(t, kiln::shape(dims));
    std::memcpy(value.view().data, data, std::size_t(value.shape().num_elements()) * size_of(t));
    return graph_.add_constant(value);
  }
  std::vector<int> effect(std::string_view name, bool writes, std::vector<int> inputs,
                          const std::vector<std::pair<kiln::dtype, kiln::shape>>& results) override {
    return add_special(std::string(name), writes, std::move(inputs), results);
  }

  void control_flow(const cond_step& c) override {
    basic_graph_writer then_branch(this), else_branch(this);
    for (auto [branch, steps] : {std::pair{&then_branch, &c.then_steps}, std::pair{&else_branch, &c.else_steps}}) {
      branch->add_steps(*steps);
      for (int slot : c.results) branch->graph_.add_output(branch->value(slot));
    }
    std::vector<int> inputs{value(c.pred)};
    inputs.insert(inputs.end(), then_branch.captures_.begin(), then_branch.captures_.end());
    inputs.insert(inputs.end(), else_branch.captures_.begin(), else_branch.captures_.end());
    const auto results = then_branch.output_specs();
    const bool effects = then_branch.graph_.has_effects() || else_branch.graph_.has_effects();
    bind_results(c.results, add_special("cond", effects, std::move(inputs), results,
                                        {{"then", then_branch.finish()}, {"else", else_branch.finish()}}));
  }

  void control_flow(const loop_step& l) override {
    basic_graph_writer cond(this), body(this);
    std::vector<int> inputs, variables;
    std::vector<std::pair<kiln::dtype, kiln::shape>> results;
    for (const loop_step::copy& c : l.copies) {
      const int initial = value(c.to);
      const kiln::node& n = graph_.node_at(initial);
      for (basic_graph_writer* w : {&cond, &body}) w->bind(c.to, w->graph_.add_placeholder(n.name(), n.dtype(), n.shape()));
      inputs.push_back(initial);
      variables.push_back(c.to);
      results.emplace_back(n.dtype(), n.shape());
    }
    cond.add_steps(l.cond_steps);
    cond.graph_.add_output(cond.value(l.pred));
    body.add_steps(l.body_steps);
    if (l.stop >= 0) body.graph_.add_output(body.value(l.stop));  // the stop flag leads, as in the runtime tier
    for (const loop_step::copy& c : l.copies) body.graph_.add_output(body.value(c.from));
    inputs.insert(inputs.end(), cond.captures_.begin(), cond.captures_.end());
    inputs.insert(inputs.end(), body.captures_.begin(), body.captures_.end());
    const bool effects = cond.graph_.has_effects() || body.graph_.has_effects();
    bind_results(variables, add_special("while", effects, std::move(inputs), results,
                                        {{"cond", cond.finish()}, {"body", body.finish()}}));
  }

 private:
  /// The node holding slot `slot`'s value here: a placeholder for a value of an
  /// enclosing graph, which becomes an input of the node that runs this one.
  int value(int slot) {
    if (auto it = slots_.find(slot); it != slots_.end()) return it->second;
    if (!outer_) throw internal_error("kiln: graph(): slot " + std::to_string(slot) + " of a typed trace is read before it is written");
    const int from = outer_->value(slot);
    const kiln::node& n = outer_->graph_.node_at(from);
    const int id = graph_.add_placeholder(n.name(), n.dtype(), n.shape());
    captures_.push_back(from);
    return slots_[slot] = id;
  }

  /// Adds the nodes of the trace's result `r` (C++ values as constants) to `ids`.
  template <class R>
  void add_results(const R& r, std::vector<int>& ids) {
    if constexpr (lazy<R>)
      ids.push_back(expression_of<void, false>(r).describe(*this));
    else if constexpr (fixed_value<R>)
      ids.push_back(constant(R::dtype, R::dims_type::values, r.data()));
    else if constexpr (requires { std::tuple_size<R>::value; } && !std::is_array_v<R>)
      std::apply([&](const auto&... e) { (add_results(e, ids), ...); }, r);
    else if constexpr (has_dtype<R>)
      ids.push_back(graph_.add_constant(kiln::constant(r)));
  }

  template <class Slots>
  void bind_results(const Slots& slots, const std::vector<int>& ids) {
    std::size_t k = 0;
    for (int slot : slots) bind(slot, ids[k++]);
  }

  /// The registry op named `name`, copied from `op`.
  static ops::any_op registry_op(std::string_view name, const void* op) {
    using copy = ops::any_op (*)(const void*);
    static constexpr auto table = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
      return std::array<std::pair<std::string_view, copy>, sizeof...(Ops)>{
          std::pair<std::string_view, copy>{Ops::name, [](const void* p) { return ops::any_op(*static_cast<const Ops*>(p)); }}...};
    }(static_cast<ops::all_ops*>(nullptr));
    for (const auto& [op_name, make] : table)
      if (op_name == name) return make(op);
    throw internal_error("kiln: graph(): no op named " + std::string(name) + " in the registry");
  }
  std::vector<int> add_special(std::string name, bool effects, std::vector<int> inputs,
                               const std::vector<std::pair<kiln::dtype, kiln::shape>>& results,
                               described_op::labelled_graphs subgraphs = {}) {
    return graph_.add_special(std::make_shared<const described_op>(std::move(name), effects, std::move(subgraphs)),
                              std::move(inputs), results);
  }
  std::vector<std::pair<kiln::dtype, kiln::shape>> output_specs() const {
    std::vector<std::pair<kiln::dtype, kiln::shape>> specs;
    for (int id : graph_.outputs()) specs.emplace_back(graph_.node_at(id).dtype(), graph_.node_at(id).shape());
    return specs;
  }
  std::shared_ptr<const graph> finish() { return std::make_shared<const graph>(std::move(graph_)); }

  basic_graph_writer* outer_;
  kiln::graph graph_;
  std::map<int, int> slots_;   // slot -> node
  std::map<std::pair<int, std::string>, int> views_;  // (slot, dims) -> its reshape node
  std::vector<int> captures_;  // the outer nodes this graph's capture placeholders stand for
};

}  // namespace typed
}  // namespace kiln
// ----- end kiln/typed/graph.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TYPED_GRAPH_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DATA_DATASET_HPP
#define KILN_SINGLE_INCLUDE_KILN_DATA_DATASET_HPP
// ----- begin kiln/data/dataset.hpp -----
/// \file
/// `kiln::data::dataset`, a small tf.data: a pipeline of elements (each a tuple of
/// tensors) built from sources (`range`, `from_tensor_slices`, `from_tensors`,
/// `from_generator`) and transformations (`map`, `batch`, `shuffle`, `prefetch`,
/// `take`). Outside a function it is a C++ range; inside one, `kiln::for_each` and
/// `dataset::reduce` record one `ReduceDataset` node whose body is traced once, as
/// AutoGraph turns `for x in dataset` into `dataset.reduce`, instead of unrolling.
///
/// A dataset reaches a graph through its *handle*, an int64 scalar naming its
/// pipeline in a registry of live pipelines (TensorFlow's variant tensor): a dataset
/// argument of a kiln::function is keyed by its element spec and its handle becomes
/// an argument of the graph, so a trace runs on whichever dataset a call passes.

#include <concepts>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <ostream>
#include <ranges>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_DATA_COMPONENTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_DATA_COMPONENTS_HPP
// ----- begin kiln/data/components.hpp -----
/// \file
/// How C++ values become a dataset element's components, and how a function takes an
/// element's components as separate arguments (`fn(x, y)` for a two-component element).

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#ifndef KILN_SINGLE_INCLUDE_KILN_DATA_PIPELINE_HPP
#define KILN_SINGLE_INCLUDE_KILN_DATA_PIPELINE_HPP
// ----- begin kiln/data/pipeline.hpp -----
/// \file
/// What a dataset is made of: elements, one pass over them (`element_iterator`), the
/// stages of a pipeline (`dataset_stage`) and the registry of live pipelines that
/// dataset handles name (TensorFlow's variant tensors).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>


namespace kiln::detail {

/// One element of a dataset: its components, in order.
using dataset_element = std::vector<tensor>;

/// "(int32 (), float32 (2,))", as errors show an element spec.
inline std::string components_text(std::span<const tensor_spec> specs) {
  std::vector<value_spec> v;
  for (const tensor_spec& s : specs) v.emplace_back(s.dtype, s.shape);
  return specs_text(v);
}

/// Raises kiln::invalid_argument_error unless `element` fits `spec`, naming both.
inline void check_element(std::string_view stage, const dataset_element& element, std::span<const tensor_spec> spec) {
  bool fits = element.size() == spec.size();
  for (std::size_t k = 0; fits && k < spec.size(); ++k) fits = spec[k].accepts(element[k].dtype(), element[k].shape());
  if (!fits)
    throw invalid_argument_error(std::string(stage) + ": an element is " + specs_text(specs_of(element)) +
                                 " but the dataset's element spec is " + components_text(spec));
}

/// Raises kiln::invalid_argument_error naming op `op` unless the elements of spec
/// `got`, of the dataset or iterator (`what`) a node was given when it runs, fit the
/// spec `traced` that the node was traced for.
inline void check_traced_spec(std::string_view op, std::string_view what, std::span<const tensor_spec> got,
                              std::span<const tensor_spec> traced) {
  bool fits = got.size() == traced.size();
  for (std::size_t k = 0; fits && k < got.size(); ++k)
    fits = got[k].dtype == traced[k].dtype && traced[k].shape.accepts(got[k].shape);
  if (!fits)
    throw invalid_argument_error(std::string(op) + ": the " + std::string(what) + "'s elements are " + components_text(got) +
                                 " but the function was traced for " + components_text(traced));
}

/// One pass over a dataset: pulls its elements in order. Holds any callable that
/// gives the next element, or nothing at the end of the pass. Type-erased through
/// function pointers rather than virtual functions, for special_op's reason.
class element_iterator {
 public:
  template <class Next>
    requires std::is_invocable_r_v<std::optional<dataset_element>, Next&>
  explicit element_iterator(Next next)
      : state_(new Next(std::move(next)), [](void* p) { delete static_cast<Next*>(p); }),
        next_([](void* p) -> std::optional<dataset_element> { return (*static_cast<Next*>(p))(); }) {}
  /// The next element, or nothing at the end of the pass.
  std::optional<dataset_element> next() { return next_(state_.get()); }

 private:
  std::unique_ptr<void, void (*)(void*)> state_;
  std::optional<dataset_element> (*next_)(void*);
};

/// One stage of a pipeline: a source, or a transformation of the stage before it.
/// Immutable once built, so every copy of a dataset and every graph shares it; each
/// pass has its own element_iterator. A derived stage defines `iterate()` and passes
/// `std::type_identity<itself>` to this base (a table entry, as special_op does).
class dataset_stage {
 public:
  dataset_stage(const dataset_stage&) = delete;
  dataset_stage& operator=(const dataset_stage&) = delete;

  /// TensorFlow's name of the stage's op: `RangeDataset`, `MapDataset`, ...
  const std::string& kind() const { return kind_; }
  /// One spec per component; `none` dims (or an unknown rank) where elements differ.
  const std::vector<tensor_spec>& element_spec() const { return spec_; }
  /// Starts a pass over the elements.
  element_iterator iterate() const { return iterate_(*this); }
  /// True when a pass calls C++ code that may have effects (a generator), so that a
  /// graph runs its loop even when no output needs it, as TensorFlow keeps a
  /// py_function.
  bool has_effects() const { return effects_; }

 protected:
  template <class Stage>
  dataset_stage(std::type_identity<Stage>, std::string kind, std::vector<tensor_spec> spec, bool effects)
      : kind_(std::move(kind)), spec_(std::move(spec)), effects_(effects),
        iterate_([](const dataset_stage& s) { return static_cast<const Stage&>(s).iterate(); }) {}
  // Owners hold the derived type (std::make_shared), so no virtual destructor.
  ~dataset_stage() = default;

 private:
  std::string kind_;
  std::vector<tensor_spec> spec_;
  bool effects_;
  element_iterator (*iterate_)(const dataset_stage&);
};

/// The objects that handles name (a dataset's pipeline, an iterator's state), as
/// TensorFlow's variant and resource tensors do: a handle's value is its key here.
/// Weak, so that a handle never keeps an object alive; a graph node holds the object
/// it was traced with itself.
template <class T>
class handle_registry {
 public:
  static handle_registry& get() {
    static handle_registry r;
    return r;
  }
  /// Registers `object` and returns its key.
  std::int64_t add(const std::shared_ptr<T>& object) {
    std::lock_guard lock(mutex_);
    std::erase_if(objects_, [](const auto& entry) { return entry.second.expired(); });
    objects_.emplace(next_key_, object);
    return next_key_++;
  }
  /// The object that `handle` names; kiln::invalid_argument_error naming op `op`
  /// and the kind of object (`what`) when it is gone.
  std::shared_ptr<T> find(const tensor& handle, std::string_view op, std::string_view what) {
    const std::int64_t key = handle.item<std::int64_t>();
    std::lock_guard lock(mutex_);
    auto it = objects_.find(key);
    std::shared_ptr<T> object = it == objects_.end() ? nullptr : it->second.lock();
    if (!object)
      throw invalid_argument_error(std::string(op) + ": " + std::string(what) + " handle " + std::to_string(key) +
                                   " names no live " + std::string(what) + "; keep a " + std::string(what) +
                                   " alive while a function runs on it");
    return object;
  }

 private:
  std::mutex mutex_;
  std::map<std::int64_t, std::weak_ptr<T>> objects_;
  std::int64_t next_key_ = 1;
};
/// The live pipelines, which dataset handles name.
using dataset_registry = handle_registry<const dataset_stage>;

/// `TensorSpec(shape=(), dtype=tf.int64, name=None)` for one component, a tuple of
/// them for several: an element spec as TensorFlow's DatasetSpec and IteratorSpec show it.
inline std::string element_spec_text(std::span<const tensor_spec> spec) {
  if (spec.size() == 1) return spec[0].str();
  std::string s = "(";
  for (std::size_t k = 0; k < spec.size(); ++k) s += (k ? ", " : "") + spec[k].str();
  return s + ")";
}

/// A C++ `for`'s pass over a dataset, handing out its elements as `Element`: a
/// std::vector of tensors, or a std::array of as many as every element has. Made
/// outside a trace only (see dataset::begin).
template <class Element>
class element_cursor {
 public:
  using value_type = Element;
  using difference_type = std::ptrdiff_t;
  element_cursor() = default;
  /// Starts a pass over `stage`'s elements; kiln::type_error inside a trace.
  explicit element_cursor(const dataset_stage& stage) {
    if (trace_context::current())
      throw type_error("a C++ for over a kiln::data::dataset inside a kiln::function would read the dataset once, "
                       "while tracing, and unroll its elements into the graph; use kiln::for_each(ds, body, vars...) or "
                       "ds.reduce(initial, fn), which become one ReduceDataset node that runs at every call");
    init_scope eager;
    pass_ = std::make_shared<element_iterator>(stage.iterate());
    ++*this;
  }
  const Element& operator*() const { return *current_; }
  const Element* operator->() const { return &*current_; }
  element_cursor& operator++() {
    init_scope eager;
    std::optional<dataset_element> e = pass_->next();
    if (!e) {
      current_.reset();
    } else if constexpr (std::is_same_v<Element, dataset_element>) {
      current_ = std::move(*e);
    } else {
      current_.emplace();
      std::move(e->begin(), e->end(), current_->begin());  // the dataset_of checked the component count
    }
    return *this;
  }
  void operator++(int) { ++*this; }
  bool operator==(std::default_sentinel_t) const { return !current_; }

 private:
  std::shared_ptr<element_iterator> pass_;
  std::optional<Element> current_;
};

}  // namespace kiln::detail
// ----- end kiln/data/pipeline.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DATA_PIPELINE_HPP

namespace kiln::detail {

/// The component tensors of `value`: a tensor, or a tuple, pair, array or vector of
/// them; C++ numbers become tensors of `spec`'s dtypes when a spec is given.
template <class V>
void append_components(const V& value, dataset_element& out, std::span<const tensor_spec> spec) {
  using U = std::remove_cvref_t<V>;
  if constexpr (std::is_same_v<U, tensor>) {
    out.push_back(value);
  } else if constexpr (std::is_arithmetic_v<U>) {
    const std::size_t k = out.size();
    out.push_back(k < spec.size() ? kiln::constant(value, spec[k].dtype) : kiln::constant(value));
  } else {
    static_assert(is_tuple_like<U>::value || is_vector<U>::value,
                  "a dataset element is a tensor, a C++ number, or a tuple, pair, array or vector of those");
    for_each_element(value, [&](const auto& e) { append_components(e, out, spec); });
  }
}
template <class V>
dataset_element components_of(const V& value, std::span<const tensor_spec> spec = {}) {
  dataset_element out;
  append_components(value, out, spec);
  return out;
}

/// How many element components kiln passes to a function as separate arguments.
inline constexpr std::size_t max_components = 8;
// A class rather than an alias that drops its argument: nvcc's host code loses the
// pack of `alias<I>...` when the alias does not depend on I.
template <std::size_t>
struct component_argument {
  using type = const tensor&;
};

/// Calls a function with the components of an element as separate arguments:
/// `fn(before..., components..., after...)`, for whichever component counts `fn`
/// accepts (a C++ call's arity is fixed; an element's is not until run time).
template <class Fn, class Before, class After>
struct component_call;
template <class Fn, class... Before, class... After>
struct component_call<Fn, std::tuple<Before...>, std::tuple<After...>> {
  /// Whether `fn` takes elements of `N` components.
  template <std::size_t N>
  static constexpr bool accepts = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::is_invocable_v<Fn&, const Before&..., typename component_argument<I>::type..., const After&...>;
  }(std::make_index_sequence<N>{});

  // The smallest component count `fn` takes (0 for none): it gives the result type.
  template <std::size_t N = 1>
  static constexpr std::size_t first_accepted() {
    if constexpr (N > max_components) return 0;
    else if constexpr (accepts<N>) return N;
    else return first_accepted<N + 1>();
  }
  static constexpr std::size_t arity = first_accepted();
  static_assert(arity != 0, "kiln::data: the function must take the components of a dataset element as separate "
                            "kiln::tensor arguments (at most 8), with the loop or reduce state around them");
  using result = decltype([]<std::size_t... I>(std::index_sequence<I...>) {
    return std::type_identity<std::invoke_result_t<Fn&, const Before&..., typename component_argument<I>::type..., const After&...>>{};
  }(std::make_index_sequence<arity>{}));
  using type = typename result::type;

  /// The component counts `fn` takes, as messages list them: "1", "1 or 2".
  static std::string accepted_counts() {
    std::string s;
    [&]<std::size_t... N>(std::index_sequence<N...>) {
      ((accepts<N + 1> ? (void)(s += (s.empty() ? "" : " or ") + std::to_string(N + 1)) : void()), ...);
    }(std::make_index_sequence<max_components>{});
    return s;
  }

  /// Raises kiln::value_error unless `fn` accepts `count` components, naming both.
  static void check(std::size_t count, std::string_view who) {
    bool ok = false;
    [&]<std::size_t... N>(std::index_sequence<N...>) { ((ok = ok || (count == N + 1 && accepts<N + 1>)), ...); }(
        std::make_index_sequence<max_components>{});
    if (!ok)
      throw value_error(std::string(who) + ": the function takes " + accepted_counts() +
                        " tensor(s) per element, but the dataset's elements have " + std::to_string(count));
  }

  /// `fn(before..., element[0], ..., after...)`; check() tells beforehand whether
  /// `fn` takes the element's component count.
  template <std::size_t N = 1>
  static type call(Fn& fn, std::span<const tensor> element, const Before&... before, const After&... after) {
    if constexpr (N > max_components) {
      throw internal_error("kiln::data: an element of " + std::to_string(element.size()) + " components");
    } else {
      if constexpr (accepts<N>) {
        if (element.size() == N)
          return [&]<std::size_t... I>(std::index_sequence<I...>) -> type {
            return fn(before..., element[I]..., after...);
          }(std::make_index_sequence<N>{});
      }
      return call<N + 1>(fn, element, before..., after...);
    }
  }
};

}  // namespace kiln::detail
// ----- end kiln/data/components.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DATA_COMPONENTS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DATA_REDUCE_HPP
#define KILN_SINGLE_INCLUDE_KILN_DATA_REDUCE_HPP
// ----- begin kiln/data/reduce.hpp -----
/// \file
/// The ReduceDataset op and the fold behind `kiln::for_each(ds, ...)` and
/// `dataset::reduce`: eagerly a C++ loop over the elements, while tracing one node
/// whose body is traced once, as AutoGraph turns `for x in dataset` into a reduce.

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>


namespace kiln::detail {

/// The loop of a ReduceDataset node: inputs are the dataset's handle, the loop
/// state's initial values, then the tensors the body captured. The body graph takes
/// an element's components, the state and the captures, and gives the next state.
/// The pipeline comes from the handle at every run, so a trace given a dataset as an
/// argument runs on the dataset of each call; the op also holds the pipeline it was
/// traced with, which keeps a dataset made or captured while tracing alive. Its
/// members are templates, as subgraph's are.
class reduce_dataset_op final : public special_op {
 public:
  template <class = void>
  reduce_dataset_op(std::shared_ptr<const dataset_stage> traced, int state_size, graph body)
      : special_op(std::type_identity<reduce_dataset_op>()), traced_(std::move(traced)), state_size_(state_size),
        body_(std::move(body)),
        effects_(body_.traced().has_effects() || traced_->has_effects()) {}
  std::string_view name() const { return "ReduceDataset"; }
  bool has_effects() const { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const { return {{"body", &body_.traced()}}; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const std::shared_ptr<const dataset_stage> stage = dataset_registry::get().find(*in[0], "ReduceDataset", "dataset");
    check_traced_spec(name(), "dataset", stage->element_spec(), traced_->element_spec());
    const std::size_t components = traced_->element_spec().size(), n = std::size_t(state_size_);
    // The body's arguments: an element's components, the state, the captures.
    std::vector<tensor> args(components);
    for (std::size_t k = 1; k < in.size(); ++k) args.push_back(*in[k]);
    element_iterator pass = stage->iterate();
    while (std::optional<dataset_element> e = pass.next()) {
      for (std::size_t k = 0; k < components; ++k) args[k] = std::move((*e)[k]);
      std::vector<tensor> next = body_.run(args);
      for (std::size_t k = 0; k < n; ++k) args[components + k] = std::move(next[k]);
    }
    return {args.begin() + std::ptrdiff_t(components), args.begin() + std::ptrdiff_t(components + n)};
  }

 private:
  std::shared_ptr<const dataset_stage> traced_;
  int state_size_;
  subgraph body_;
  bool effects_;
};

/// The parameters of a function traced for an element of `spec`: `args_0`, ...
inline std::vector<tensor_spec> element_parameters(std::span<const tensor_spec> spec) {
  std::vector<tensor_spec> out;
  for (std::size_t k = 0; k < spec.size(); ++k) out.emplace_back(spec[k].shape, spec[k].dtype, "args_" + std::to_string(k));
  return out;
}

/// As tf.data's reduce: a loop variable that the body makes less specific (a dim, or
/// the rank, that depends on the elements) takes the body's spec, and the body is
/// traced again for it; returns whether one did. Anything else is left for
/// check_loop_specs to reject.
inline bool relax_loop_specs(std::vector<value_spec>& specs, std::span<const value_spec> got) {
  bool relaxed = false;
  for (std::size_t k = 0; k < specs.size() && k < got.size(); ++k)
    if (got[k].first == specs[k].first && got[k].second != specs[k].second && got[k].second.accepts(specs[k].second)) {
      specs[k].second = got[k].second;
      relaxed = true;
    }
  return relaxed;
}

/// Runs `invoke(element, state)` over the elements of dataset `ds` (a
/// kiln::data::dataset) from `initial`, each result the next state (nothing when the
/// state is empty); `loop` names the loop in errors. Eagerly a C++ loop; while
/// tracing, one ReduceDataset node whose body is `invoke` traced once.
template <class Dataset, class State, class Invoke>
State fold_dataset(const Dataset& ds, State initial, Invoke invoke, std::string_view loop) {
  constexpr bool stateless = std::tuple_size_v<State> == 0;
  std::vector<tensor> initial_leaves = leaves_of(initial);
  std::vector<value_spec> specs = specs_of(initial_leaves);
  trace_context* trace = trace_context::current();
  if (!trace) {
    State current = std::move(initial);
    for (const auto& e : ds) {
      if constexpr (stateless) invoke(e, current);
      else current = next_state(current, leaves_of(invoke(e, current)), specs, {}, 0, loop);
    }
    return current;
  }
  const std::size_t components = ds.element_spec().size();
  traced_subgraph body;
  auto trace_body = [&] {
    std::vector<tensor_spec> params = element_parameters(ds.element_spec());
    for (std::size_t k = 0; k < initial_leaves.size(); ++k)
      params.emplace_back(specs[k].second, specs[k].first, parameter_name(initial_leaves[k]));
    body = {};
    trace_subgraph(
        [&](std::span<const tensor> p) {
          const tensor* next = p.data() + components;
          const State state = rebuild_output(initial, next);
          if constexpr (stateless) {
            invoke(p.first(components), state);
            return std::tuple<>{};
          } else {
            return invoke(p.first(components), state);
          }
        },
        std::span<const tensor_spec>(params), body);
  };
  trace_body();
  while (relax_loop_specs(specs, body.outputs)) trace_body();
  check_loop_specs(body.outputs, specs, {}, 0, loop);
  std::vector<tensor> inputs{ds.handle()};
  inputs.insert(inputs.end(), initial_leaves.begin(), initial_leaves.end());
  inputs.insert(inputs.end(), body.captures.begin(), body.captures.end());
  auto op = std::make_shared<reduce_dataset_op>(ds.pipeline(), int(initial_leaves.size()), std::move(body.g));
  std::vector<tensor> out = trace->record_special(std::move(op), inputs, specs);
  const tensor* next = out.data();
  return rebuild_output(initial, next);
}

}  // namespace kiln::detail
// ----- end kiln/data/reduce.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DATA_REDUCE_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DATA_STAGES_HPP
#define KILN_SINGLE_INCLUDE_KILN_DATA_STAGES_HPP
// ----- begin kiln/data/stages.hpp -----
/// \file
/// The stages of a dataset pipeline: the sources (`range`, `from_tensor_slices`,
/// `from_tensors`, `from_generator`) and the transformations (`map`, `batch`,
/// `shuffle`, `take`, `prefetch`), each one pass at a time.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>


namespace kiln::detail {

/// The pass of a stage whose elements are computed from their position.
template <class Element>
element_iterator indexed_elements(std::int64_t count, Element element) {
  return element_iterator([count, element = std::move(element), position = std::int64_t(0)]() mutable {
    return position < count ? std::optional<dataset_element>(element(position++)) : std::nullopt;
  });
}

/// `dataset::range`: int64 scalars start, start + delta, ... up to limit (excluded).
class range_stage final : public dataset_stage {
 public:
  template <class = void>
  range_stage(std::int64_t start, std::int64_t limit, std::int64_t delta)
      : dataset_stage(std::type_identity<range_stage>(), "RangeDataset", {tensor_spec(shape{}, int64)}, false),
        start_(start), delta_(delta) {
    if (delta == 0) throw invalid_argument_error("dataset::range: delta must not be 0");
    // Python's range length: ceil((limit - start) / delta), at least 0.
    const std::int64_t span = delta > 0 ? limit - start : start - limit;
    const std::int64_t step = delta > 0 ? delta : -delta;
    count_ = span <= 0 ? 0 : (span + step - 1) / step;
  }
  template <class = void>
  element_iterator iterate() const {
    return indexed_elements(count_, [start = start_, delta = delta_](std::int64_t i) {
      return dataset_element{kiln::constant(start + i * delta)};
    });
  }

 private:
  std::int64_t start_, delta_, count_ = 0;
};

/// The spec of one slice along the first dim of each of `components`, which must
/// be eager tensors of rank 1 or more that agree in their first dim.
inline std::vector<tensor_spec> slice_spec(std::span<const tensor> components) {
  if (components.empty()) throw value_error("dataset::from_tensor_slices: give at least one tensor");
  std::vector<tensor_spec> out;
  for (const tensor& c : components) {
    c.require_value("dataset::from_tensor_slices");
    if (c.rank() < 1) throw value_error("dataset::from_tensor_slices: slicing needs tensors of rank 1 or more, got a scalar");
    if (c.shape()[0] != components[0].shape()[0])
      throw value_error("dataset::from_tensor_slices: the components must have the same first dim, got " +
                        components[0].shape().str() + " and " + c.shape().str());
    out.emplace_back(shape(c.shape().dims().subspan(1)), c.dtype());
  }
  return out;
}

/// `dataset::from_tensor_slices`: element i is slice i of every component. Its
/// members are templates, as op functions are: they run x[i].
class slices_stage final : public dataset_stage {
 public:
  template <class = void>
  explicit slices_stage(std::vector<tensor> components)
      : dataset_stage(std::type_identity<slices_stage>(), "TensorSliceDataset", slice_spec(components), false),
        count_(components[0].shape()[0]),
        components_(std::move(components)) {}
  template <class = void>
  element_iterator iterate() const {
    return indexed_elements(count_, [this](std::int64_t i) {
      dataset_element e;
      for (const tensor& c : components_) e.push_back(c[i]);
      return e;
    });
  }

 private:
  std::int64_t count_;
  std::vector<tensor> components_;
};

/// `dataset::from_tensors`: one element, the components themselves.
class tensors_stage final : public dataset_stage {
 public:
  template <class = void>
  explicit tensors_stage(std::vector<tensor> components)
      : dataset_stage(std::type_identity<tensors_stage>(), "TensorDataset", spec_of(components), false),
        components_(std::move(components)) {}
  template <class = void>
  element_iterator iterate() const {
    return indexed_elements(1, [this](std::int64_t) { return components_; });
  }

 private:
  static std::vector<tensor_spec> spec_of(std::span<const tensor> components) {
    if (components.empty()) throw value_error("dataset::from_tensors: give at least one tensor");
    std::vector<tensor_spec> out;
    for (const tensor& c : components) {
      c.require_value("dataset::from_tensors");
      out.emplace_back(c.shape(), c.dtype());
    }
    return out;
  }
  std::vector<tensor> components_;
};

/// `dataset::from_generator`: each pass calls `start()` for a fresh source of
/// elements and checks each against the output specs.
class generator_stage final : public dataset_stage {
 public:
  using next_element = std::function<std::optional<dataset_element>()>;
  template <class = void>
  generator_stage(std::function<next_element()> start, std::vector<tensor_spec> spec)
      : dataset_stage(std::type_identity<generator_stage>(), "FlatMapDataset", std::move(spec), true),
        start_(std::move(start)) {
    if (element_spec().empty()) throw value_error("dataset::from_generator: give at least one output spec");
  }
  template <class = void>
  element_iterator iterate() const {
    return element_iterator([source = start_(), this] {
      std::optional<dataset_element> e = source();
      if (e) check_element("dataset::from_generator", *e, element_spec());
      return e;
    });
  }

 private:
  std::function<next_element()> start_;
};

/// A transformation: a stage that reads the elements of `input`.
class transform_stage : public dataset_stage {
 protected:
  /// A stage with effects when its input has them or `effects`.
  template <class Stage>
  transform_stage(std::type_identity<Stage> self, std::string kind, std::vector<tensor_spec> spec,
                  std::shared_ptr<const dataset_stage> input, bool effects = false)
      : dataset_stage(self, std::move(kind), std::move(spec), effects || input->has_effects()), input_(std::move(input)) {}

  /// A pass whose elements are `step(input pass)`, pulled one output at a time.
  template <class Step>
  element_iterator transformed(Step step) const {
    return element_iterator(
        [input = input_->iterate(), step = std::move(step)]() mutable -> std::optional<dataset_element> {
          return step(input);
        });
  }
  const std::shared_ptr<const dataset_stage>& input() const { return input_; }

 private:
  std::shared_ptr<const dataset_stage> input_;
};

/// `dataset::map`: each element through a function traced once into a subgraph. Its
/// members are templates, as subgraph's are: they optimize and run a graph.
class map_stage final : public transform_stage {
 public:
  template <class = void>
  map_stage(std::shared_ptr<const dataset_stage> input, graph fn, std::vector<tensor_spec> spec)
      : transform_stage(std::type_identity<map_stage>(), "MapDataset", std::move(spec), std::move(input),
                        fn.has_effects()),
        fn_(std::move(fn)) {}
  template <class = void>
  element_iterator iterate() const {
    return transformed([this](element_iterator& in) -> std::optional<dataset_element> {
      std::optional<dataset_element> e = in.next();
      if (!e) return std::nullopt;
      return fn_.run(*e);
    });
  }

 private:
  subgraph fn_;
};

/// `dataset::batch`: `size` consecutive elements stacked along a new first dim; the
/// last batch may be smaller unless `drop_remainder`. Its members are templates, as
/// op functions are: they run stack.
class batch_stage final : public transform_stage {
 public:
  template <class = void>
  batch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t size, bool drop_remainder)
      : transform_stage(std::type_identity<batch_stage>(), "BatchDataset",
                        batched_spec(input->element_spec(), size, drop_remainder), input),
        size_(size),
        drop_remainder_(drop_remainder) {}
  template <class = void>
  element_iterator iterate() const {
    return transformed([this](element_iterator& in) -> std::optional<dataset_element> {
      std::vector<dataset_element> rows;
      while (std::int64_t(rows.size()) < size_) {
        std::optional<dataset_element> e = in.next();
        if (!e) break;
        rows.push_back(std::move(*e));
      }
      if (rows.empty() || (drop_remainder_ && std::int64_t(rows.size()) < size_)) return std::nullopt;
      dataset_element batch;
      for (std::size_t k = 0; k < rows[0].size(); ++k) {
        std::vector<tensor> column;
        for (const dataset_element& row : rows) {
          if (row[k].shape() != rows[0][k].shape())
            throw invalid_argument_error("dataset::batch: cannot batch component " + std::to_string(k) +
                                         " of shapes " + rows[0][k].shape().str() + " and " + row[k].shape().str() +
                                         " (map the elements to one shape first)");
          column.push_back(row[k]);
        }
        batch.push_back(kiln::stack(column));
      }
      return batch;
    });
  }

 private:
  static std::vector<tensor_spec> batched_spec(std::vector<tensor_spec> spec, std::int64_t size, bool drop_remainder) {
    if (size <= 0) throw invalid_argument_error("dataset::batch: batch_size must be positive, got " + std::to_string(size));
    for (tensor_spec& s : spec) {
      if (!s.shape.has_known_rank()) continue;
      shape batched{drop_remainder ? size : none};
      for (std::int64_t d : s.shape.dims()) batched.push_back(d);
      s.shape = batched;
    }
    return spec;
  }
  std::int64_t size_;
  bool drop_remainder_;
};

/// `dataset::shuffle`: TensorFlow's buffer shuffle: fill a buffer of `buffer_size`
/// elements, then repeatedly hand out a random one and refill its place. Each pass
/// draws from its own stream (the pass number mixed into the seed), so passes differ
/// and the sequence of passes is the same at every run of a program.
class shuffle_stage final : public transform_stage {
 public:
  template <class = void>
  shuffle_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size, std::uint64_t seed,
                bool reshuffle_each_iteration)
      : transform_stage(std::type_identity<shuffle_stage>(), "ShuffleDataset", input->element_spec(), input),
        buffer_size_(buffer_size), seed_(seed),
        reshuffle_(reshuffle_each_iteration) {
    if (buffer_size <= 0)
      throw invalid_argument_error("dataset::shuffle: buffer_size must be positive, got " + std::to_string(buffer_size));
  }
  template <class = void>
  element_iterator iterate() const {
    const std::uint64_t pass = reshuffle_ ? passes_.fetch_add(1) : 0;
    // The index is taken by modulo of splitmix64's numbers, so the order is the same
    // on every platform and standard library (a std:: distribution's is not).
    std::uint64_t state = seed_ + pass * 0xD1B54A32D192ED03u;
    return transformed([this, state, buffer = std::vector<dataset_element>()](
                           element_iterator& in) mutable -> std::optional<dataset_element> {
      while (std::int64_t(buffer.size()) < buffer_size_) {
        std::optional<dataset_element> e = in.next();
        if (!e) break;
        buffer.push_back(std::move(*e));
      }
      if (buffer.empty()) return std::nullopt;
      const std::size_t pick = std::size_t(splitmix64(state) % buffer.size());
      std::swap(buffer[pick], buffer.back());
      dataset_element out = std::move(buffer.back());
      buffer.pop_back();
      return out;
    });
  }

 private:
  std::int64_t buffer_size_;
  std::uint64_t seed_;
  bool reshuffle_;
  mutable std::atomic<std::uint64_t> passes_{0};
};

/// `dataset::shard`: every `num_shards`-th element from element `index`.
class shard_stage final : public transform_stage {
 public:
  template <class = void>
  shard_stage(std::shared_ptr<const dataset_stage> input, std::int64_t num_shards, std::int64_t index)
      : transform_stage(std::type_identity<shard_stage>(), "ShardDataset", input->element_spec(), input),
        num_shards_(num_shards), index_(index) {
    if (num_shards <= 0)
      throw invalid_argument_error("dataset::shard: num_shards must be positive, got " + std::to_string(num_shards));
    if (index < 0 || index >= num_shards)
      throw invalid_argument_error("dataset::shard: index must be in [0, " + std::to_string(num_shards) + "), got " +
                                   std::to_string(index));
  }
  template <class = void>
  element_iterator iterate() const {
    return transformed([num_shards = num_shards_, index = index_, position = std::int64_t(0)](element_iterator& in) mutable {
      std::optional<dataset_element> e;
      // The elements before this shard's next one are read and dropped.
      while ((e = in.next()) && position++ % num_shards != index) {
      }
      return e;
    });
  }

 private:
  std::int64_t num_shards_, index_;
};

/// `dataset::take`: the first `count` elements (all of them for a negative count).
class take_stage final : public transform_stage {
 public:
  template <class = void>
  take_stage(std::shared_ptr<const dataset_stage> input, std::int64_t count)
      : transform_stage(std::type_identity<take_stage>(), "TakeDataset", input->element_spec(), input), count_(count) {}
  template <class = void>
  element_iterator iterate() const {
    return transformed([count = count_, taken = std::int64_t(0)](element_iterator& in) mutable {
      if (count >= 0 && taken >= count) return std::optional<dataset_element>();
      ++taken;
      return in.next();
    });
  }

 private:
  std::int64_t count_;
};

/// `dataset::prefetch`: the elements of its input, unchanged. kiln produces elements
/// on the thread that consumes them, so prefetching has nothing to overlap with; the
/// stage keeps pipelines written for TensorFlow as they are.
class prefetch_stage final : public transform_stage {
 public:
  template <class = void>
  prefetch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size)
      : transform_stage(std::type_identity<prefetch_stage>(), "PrefetchDataset", input->element_spec(), input) {
    if (buffer_size < 0)
      throw invalid_argument_error("dataset::prefetch: buffer_size must be 0 or more, got " + std::to_string(buffer_size));
  }
  template <class = void>
  element_iterator iterate() const { return input()->iterate(); }
};

}  // namespace kiln::detail
// ----- end kiln/data/stages.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DATA_STAGES_HPP

namespace kiln::data {
class dataset;
template <std::size_t N>
class dataset_of;
class iterator;
template <std::size_t N>
class iterator_of;
}  // namespace kiln::data

namespace kiln::detail {
/// How many components the elements made from a C++ `V` have, when the type says:
/// one for a tensor or a number, a tuple's size; 0 (known at run time only) for a vector.
template <class V>
constexpr std::size_t arity_of() {
  using U = std::remove_cvref_t<V>;
  if constexpr (is_tuple_like<U>::value) return std::tuple_size_v<U>;
  else if constexpr (is_vector<U>::value) return 0;
  else return 1;
}
/// A dataset whose elements have `N` components (data::dataset_of), or any number (data::dataset) for 0.
template <std::size_t N>
struct dataset_for_arity {
  using type = data::dataset_of<N>;
};
template <>
struct dataset_for_arity<0> {
  using type = data::dataset;
};
template <std::size_t N>
using dataset_for = typename dataset_for_arity<N>::type;
}  // namespace kiln::detail

namespace kiln::data {

/// A tf.data pipeline: a value (copies share one immutable pipeline) whose elements
/// are tuples of tensors, described by `element_spec()`. Iterate it with a C++ `for`
/// outside a function; inside one, `kiln::for_each(ds, ...)` and `ds.reduce(...)`
/// become one `ReduceDataset` node (a C++ `for` there raises kiln::type_error: it
/// would read the dataset once, while tracing). As a kiln::function argument it is
/// keyed by its element spec: datasets of one spec share a trace, and each call runs
/// on its own. Where the element's component count is known from the C++ types
/// (`range`, `from_tensor_slices` of a tuple, `map` returning a tuple, ...) the
/// factories return a `dataset_of<N>`, whose elements are `std::array`s of tensors, so
/// structured bindings work; a `dataset` holds either, its elements `std::vector`s.
/// \code
/// auto ds = kiln::data::dataset::range(10).map([](auto x) { return x * 2; }).batch(4);
/// for (const auto& element : ds) std::cout << element[0] << "\n";  // [0 2 4 6], [8 10 12 14], [16 18]
/// auto pairs = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})});
/// for (auto [x, y] : pairs) std::cout << x << " " << y << "\n";
/// \endcode
class dataset {
 public:
  /// An element: one tensor per component.
  using element = detail::dataset_element;

  /// int64 scalars `start, start + delta, ...` up to `limit` (excluded), as
  /// tf.data.Dataset.range; a zero `delta` raises kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(1, 8, 3);  // 1, 4, 7 \endcode
  template <class = void>
  static dataset_of<1> range(std::int64_t start, std::int64_t limit, std::int64_t delta = 1);
  /// `0, 1, ..., limit - 1`.
  /// \code kiln::data::dataset::range(5);  // 0, 1, 2, 3, 4 \endcode
  template <class = void>
  static dataset_of<1> range(std::int64_t limit);

  /// One element per index of the first dim: element `i` holds `c[i]` of every
  /// component `c` (a tensor, or a tuple, pair, array or vector of tensors, which
  /// must agree in their first dim).
  /// \code
  /// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})});
  /// // (1, 3.f), (2, 4.f)
  /// \endcode
  template <class Components>
  static detail::dataset_for<detail::arity_of<Components>()> from_tensor_slices(const Components& components) {
    return detail::dataset_for<detail::arity_of<Components>()>(
        dataset(std::make_shared<detail::slices_stage>(detail::components_of(components))));
  }

  /// One element: the components themselves (a tensor, or a tuple, pair, array or
  /// vector of tensors), as tf.data.Dataset.from_tensors.
  /// \code kiln::data::dataset::from_tensors(kiln::constant({1, 2, 3}));  // one element, [1 2 3] \endcode
  template <class Components>
  static detail::dataset_for<detail::arity_of<Components>()> from_tensors(const Components& components) {
    return detail::dataset_for<detail::arity_of<Components>()>(
        dataset(std::make_shared<detail::tensors_stage>(detail::components_of(components))));
  }

  /// Elements that C++ code makes at run time, as tf.data.Dataset.from_generator:
  /// each pass calls `generator()`, which returns either a range of elements (a
  /// std::vector) or a callable giving one std::optional element per call, empty at
  /// the end. An element is a tensor, a C++ number, or a tuple of those; C++ numbers
  /// take the dtypes of `output_specs`. Elements that do not fit the specs raise
  /// kiln::invalid_argument_error. Inside a function the generator runs at every
  /// call, never at trace time.
  /// \code
  /// auto ds = kiln::data::dataset::from_generator(
  ///     [] { return std::vector<std::pair<int, int>>{{1, 1}, {2, 3}}; },
  ///     {kiln::tensor_spec({}, kiln::int32), kiln::tensor_spec({}, kiln::int32)});
  /// \endcode
  template <class Generator>
  static auto from_generator(Generator generator, std::vector<tensor_spec> output_specs) {
    using R = std::invoke_result_t<Generator&>;
    using item = decltype([] {
      if constexpr (std::is_invocable_v<R&>) return std::type_identity<typename std::invoke_result_t<R&>::value_type>{};
      else return std::type_identity<typename R::value_type>{};
    }());
    using result = detail::dataset_for<detail::arity_of<typename item::type>()>;
    auto start = [generator = std::move(generator), specs = output_specs]() mutable -> detail::generator_stage::next_element {
      if constexpr (std::is_invocable_v<R&>) {
        return [source = generator(), specs]() mutable -> std::optional<element> {
          auto e = source();
          if (!e) return std::nullopt;
          return detail::components_of(*e, specs);
        };
      } else {
        return [items = std::make_shared<const R>(generator()), index = std::size_t(0), specs]() mutable
               -> std::optional<element> {
          if (index == items->size()) return std::nullopt;
          return detail::components_of((*items)[index++], specs);
        };
      }
    };
    return result(dataset(std::make_shared<detail::generator_stage>(std::move(start), std::move(output_specs))));
  }

  /// from_generator with elements of dtypes `output_types` and any shapes, as
  /// `from_generator(gen, (tf.int32, tf.int32))`.
  /// \code kiln::data::dataset::from_generator([] { return std::vector<int>{1, 2}; }, {kiln::int32}); \endcode
  template <class Generator>
  static auto from_generator(Generator generator, const std::vector<dtype>& output_types) {
    std::vector<tensor_spec> specs;
    for (dtype t : output_types) specs.emplace_back(unknown_rank, t);
    return from_generator(std::move(generator), std::move(specs));
  }

  /// Each element through `fn(components...)`, which returns a tensor or a tuple of
  /// tensors. `fn` is traced once, here, into a graph that runs per element (C++
  /// side effects in it happen once); it may use eager tensors it captures, not
  /// symbolic ones of a function being traced.
  /// \code auto squares = kiln::data::dataset::range(4).map([](auto x) { return x * x; });  // 0, 1, 4, 9 \endcode
  template <class Fn>
  auto map(Fn fn) const {
    using call = detail::component_call<Fn, std::tuple<>, std::tuple<>>;
    using result = detail::dataset_for<detail::arity_of<typename call::type>()>;
    static_assert(!std::is_void_v<typename call::type>, "dataset::map: the function must return a tensor or a tuple of tensors");
    call::check(element_spec().size(), "dataset::map");
    init_scope outside_any_trace;  // the pipeline holds values, not symbols of the trace in progress
    detail::traced_subgraph traced;
    const std::vector<tensor_spec> params = detail::element_parameters(element_spec());
    detail::trace_subgraph([&](std::span<const tensor> p) { return call::call(fn, p); }, std::span<const tensor_spec>(params),
                           traced);
    if (traced.outputs.empty()) throw value_error("dataset::map: the function must return at least one tensor");
    std::vector<tensor_spec> spec;
    for (const auto& [type, dims] : traced.outputs) spec.emplace_back(dims, type);
    return result(dataset(std::make_shared<detail::map_stage>(stage_, std::move(traced.g), std::move(spec))));
  }

  /// `batch_size` consecutive elements stacked along a new first dim; the last batch
  /// is smaller unless `drop_remainder` (then the batch dim of the spec is known).
  /// A batch_size below 1 raises kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(5).batch(2);  // [0 1], [2 3], [4] \endcode
  template <class = void>
  dataset batch(std::int64_t batch_size, bool drop_remainder = false) const {
    return dataset(std::make_shared<detail::batch_stage>(stage_, batch_size, drop_remainder));
  }

  /// The elements in random order, from a buffer of `buffer_size` (TensorFlow's
  /// algorithm). With a `seed` the order is the same at every run of the program;
  /// with `reshuffle_each_iteration` each pass (each epoch, each function call)
  /// draws a new order, reproducibly.
  /// \code kiln::data::dataset::range(10).shuffle(10, 42); \endcode
  template <class = void>
  dataset shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const {
    return dataset(std::make_shared<detail::shuffle_stage>(stage_, buffer_size, seed ? *seed : detail::fresh_seed(),
                                                           reshuffle_each_iteration));
  }

  /// The same elements: kiln makes elements on the thread that consumes them, so
  /// there is nothing to prefetch; kept so that TensorFlow pipelines read the same.
  /// \code kiln::data::dataset::range(4).prefetch(1); \endcode
  template <class = void>
  dataset prefetch(std::int64_t buffer_size) const {
    return dataset(std::make_shared<detail::prefetch_stage>(stage_, buffer_size));
  }

  /// The first `count` elements (all of them for a negative count).
  /// \code kiln::data::dataset::range(10).take(3);  // 0, 1, 2 \endcode
  template <class = void>
  dataset take(std::int64_t count) const { return dataset(std::make_shared<detail::take_stage>(stage_, count)); }

  /// Every `num_shards`-th element from element `index`, as tf.data.Dataset.shard:
  /// how each worker reads its part of the data. `num_shards` must be positive and
  /// `index` in [0, num_shards), else kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(10).shard(3, 1);  // 1, 4, 7 \endcode
  template <class = void>
  dataset shard(std::int64_t num_shards, std::int64_t index) const {
    return dataset(std::make_shared<detail::shard_stage>(stage_, num_shards, index));
  }

  /// One spec per component of an element.
  /// \code kiln::data::dataset::range(3).element_spec()[0].dtype == kiln::int64 \endcode
  const std::vector<tensor_spec>& element_spec() const { return stage_->element_spec(); }

  /// Folds the elements into a state, as tf.data.Dataset.reduce: `fn(state,
  /// components...)` gives the next state, which must keep its dtypes and shapes.
  /// Inside a function this is one `ReduceDataset` node.
  /// \code kiln::data::dataset::range(5).reduce(kiln::constant(std::int64_t(0)), [](auto s, auto x) { return s + x; });  // 10 \endcode
  template <class State, class Fn>
  auto reduce(const State& initial, Fn fn) const {
    using S = detail::output_t<State>;
    using call = detail::component_call<Fn, std::tuple<S>, std::tuple<>>;
    call::check(element_spec().size(), "dataset::reduce");
    auto invoke = [&fn](std::span<const tensor> e, const std::tuple<S>& s) { return call::call(fn, e, std::get<0>(s)); };
    return std::get<0>(detail::fold_dataset(*this, std::tuple<S>{detail::as_output(initial)}, invoke, "dataset::reduce"));
  }

  /// A C++ `for`'s pass over the elements: each a std::vector of its components.
  using const_iterator = detail::element_cursor<element>;
  /// Starts a pass over the elements, outside a function only: inside one being
  /// traced, the loop would read the dataset at trace time and unroll, and a later
  /// call with another dataset of the same spec would reuse that unrolled graph;
  /// there kiln::for_each or reduce() make one ReduceDataset node instead.
  /// \code for (const auto& e : kiln::data::dataset::range(3)) std::cout << e[0];  // tensors 0, 1, 2 \endcode
  const_iterator begin() const { return const_iterator(*stage_); }
  std::default_sentinel_t end() const { return {}; }

  /// An iterator over the elements (TensorFlow's `iter(ds)`): each get_next() gives
  /// the next element, also inside a function, where it is a node that advances at
  /// every call. (Defined in kiln/data/iterator.hpp.)
  /// \code
  /// kiln::data::iterator it = kiln::data::dataset::range(3).make_iterator();
  /// kiln::tensor first = it.get_next()[0];  // 0
  /// \endcode
  iterator make_iterator() const;

  /// The int64 scalar naming the pipeline at run time; symbolic inside a function
  /// that takes the dataset as an argument.
  const tensor& handle() const { return handle_; }
  /// Appends the element spec to a kiln::function's cache key.
  void append_spec_key(std::vector<std::uint64_t>& key) const {
    key.push_back(element_spec().size());
    for (const tensor_spec& s : element_spec()) detail::add_shape(key, s.dtype, s.shape);
  }
  /// This dataset, reached through `handle` (a function's placeholder for it).
  dataset with_handle(const tensor& handle) const {
    dataset d = *this;
    d.handle_ = handle;
    return d;
  }
  /// The pipeline as traced: what a ReduceDataset node keeps.
  const std::shared_ptr<const detail::dataset_stage>& pipeline() const { return stage_; }
  /// How a function's signature shows a dataset argument, as TensorFlow does:
  /// `DatasetSpec(TensorSpec(shape=(), dtype=tf.int64, name=None), TensorShape([]))`.
  /// \code kiln::data::dataset::range(3).signature_text(); \endcode
  std::string signature_text() const { return "DatasetSpec(" + detail::element_spec_text(element_spec()) + ", TensorShape([]))"; }

  /// `<RangeDataset shapes: (), types: int64>`, `<FlatMapDataset shapes: ((), ()),
  /// types: (int32, int32)>`: TensorFlow's text, with kiln's dtype names.
  friend std::ostream& operator<<(std::ostream& os, const dataset& d) {
    const auto& spec = d.element_spec();
    auto list = [&](auto text_of) {
      if (spec.size() == 1) return text_of(spec[0]);
      std::string s = "(";
      for (std::size_t k = 0; k < spec.size(); ++k) s += (k ? ", " : "") + text_of(spec[k]);
      return s + ")";
    };
    return os << "<" << d.stage_->kind() << " shapes: " << list([](const tensor_spec& s) { return s.shape.str(); })
              << ", types: " << list([](const tensor_spec& s) { return std::string(name(s.dtype)); }) << ">";
  }

 private:
  explicit dataset(std::shared_ptr<const detail::dataset_stage> stage)
      : stage_(std::move(stage)), handle_(kiln::constant(detail::dataset_registry::get().add(stage_))) {}

  std::shared_ptr<const detail::dataset_stage> stage_;
  tensor handle_;
};

/// A dataset whose elements have `N` components, known from the C++ types that made
/// it: its elements are `std::array<kiln::tensor, N>`, so a C++ `for` can bind them
/// (`for (auto [x, y] : ds)`), and the transformations that keep the component count
/// give a `dataset_of<N>` again. It is a kiln::data::dataset wherever one is taken.
/// \code
/// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3, 4})}).batch(2);
/// for (auto [x, y] : ds) std::cout << x + y << "\n";  // [4 6]
/// \endcode
template <std::size_t N>
class dataset_of : public dataset {
  static_assert(N > 0, "kiln::data::dataset_of: a dataset element has at least one component");

 public:
  /// An element: its `N` components.
  using element = std::array<tensor, N>;

  /// `d`, whose elements must have `N` components, else kiln::value_error.
  /// \code kiln::data::dataset_of<1> ds(kiln::data::dataset(kiln::data::dataset::range(3))); \endcode
  explicit dataset_of(dataset d) : dataset(std::move(d)) {
    if (element_spec().size() != N)
      throw value_error("kiln::data::dataset_of<" + std::to_string(N) + ">: the dataset's elements have " +
                        std::to_string(element_spec().size()) + " components");
  }

  /// As dataset::batch.
  template <class = void>
  dataset_of batch(std::int64_t batch_size, bool drop_remainder = false) const {
    return dataset_of(dataset::batch(batch_size, drop_remainder));
  }
  /// As dataset::shuffle.
  template <class = void>
  dataset_of shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                     bool reshuffle_each_iteration = true) const {
    return dataset_of(dataset::shuffle(buffer_size, seed, reshuffle_each_iteration));
  }
  /// As dataset::prefetch.
  template <class = void>
  dataset_of prefetch(std::int64_t buffer_size) const { return dataset_of(dataset::prefetch(buffer_size)); }
  /// As dataset::take.
  template <class = void>
  dataset_of take(std::int64_t count) const { return dataset_of(dataset::take(count)); }
  /// As dataset::shard.
  template <class = void>
  dataset_of shard(std::int64_t num_shards, std::int64_t index) const { return dataset_of(dataset::shard(num_shards, index)); }

  /// A C++ `for`'s pass over the elements, as dataset::begin.
  using const_iterator = detail::element_cursor<element>;
  const_iterator begin() const { return const_iterator(*pipeline()); }
  std::default_sentinel_t end() const { return {}; }
  /// As dataset::make_iterator, its elements `std::array`s (kiln/data/iterator.hpp).
  iterator_of<N> make_iterator() const;

  /// This dataset, reached through `handle` (a function's placeholder for it).
  dataset_of with_handle(const tensor& handle) const { return dataset_of(dataset::with_handle(handle)); }
};

// dataset's members that give a dataset_of, which is complete only here.
template <class>
dataset_of<1> dataset::range(std::int64_t start, std::int64_t limit, std::int64_t delta) {
  return dataset_of<1>(dataset(std::make_shared<detail::range_stage>(start, limit, delta)));
}
template <class>
dataset_of<1> dataset::range(std::int64_t limit) {
  return range(0, limit);
}

}  // namespace kiln::data

namespace kiln {

/// `for element in dataset` with loop variables: `body(components..., vars...)` gives
/// the next values (one value, or a std::tuple for several; nothing when there are
/// no loop variables). Returns the final values like kiln::for_range. Inside a
/// function it is one `ReduceDataset` node whose body is traced once, as AutoGraph
/// turns the loop into `dataset.reduce`. A loop variable whose shape the body makes
/// less specific (it depends on elements of unknown shape) takes that shape, as in
/// tf.data; any other change of dtype or shape raises kiln::value_error naming both
/// specs.
/// \code
/// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({1, 5})});
/// kiln::tensor loss = kiln::for_each(ds, [](auto x, auto y, auto loss) { return loss + kiln::abs(y - x); },
///                                    kiln::constant(0));  // 3
/// \endcode
template <class Body, class... Vars>
auto for_each(const data::dataset& ds, Body body, const Vars&... vars) {
  using state = std::tuple<detail::output_t<Vars>...>;
  using call = detail::component_call<Body, std::tuple<>, state>;
  call::check(ds.element_spec().size(), "for_each");
  auto invoke = [&body](std::span<const tensor> e, const state& s) {
    return std::apply([&](const auto&... v) { return call::call(body, e, v...); }, s);
  };
  auto out = detail::fold_dataset(ds, state{detail::as_output(vars)...}, invoke, "for_each");
  if constexpr (sizeof...(Vars) > 0) return detail::loop_result(std::move(out));
}

/// `for element in values` over a C++ range: a C++ loop, which unrolls while tracing
/// (AutoGraph's loop over Python data). `body(element parts..., vars...)`, a tuple or
/// pair element passed as its parts, gives the next values as for a dataset.
/// \code
/// std::vector<std::pair<int, int>> data{{1, 1}, {2, 3}};
/// kiln::for_each(data, [](int x, int y, auto loss) { return loss + (y - x); }, kiln::constant(0));  // 1
/// \endcode
template <std::ranges::input_range Range, class Body, class... Vars>
  requires(!std::derived_from<std::remove_cvref_t<Range>, data::dataset>)
auto for_each(const Range& values, Body body, const Vars&... vars) {
  using state = std::tuple<detail::output_t<Vars>...>;
  state current{detail::as_output(vars)...};
  std::vector<detail::value_spec> specs = detail::specs_of(detail::leaves_of(current));
  for (const auto& value : values) {
    auto step = [&](const auto&... parts) {
      return std::apply([&](const auto&... v) { return body(parts..., v...); }, current);
    };
    auto call = [&] {
      if constexpr (detail::is_tuple_like<std::remove_cvref_t<decltype(value)>>::value) return std::apply(step, value);
      else return step(value);
    };
    if constexpr (sizeof...(Vars) == 0) call();
    else current = detail::next_state(current, detail::leaves_of(call()), specs, {}, 0, "for_each");
  }
  if constexpr (sizeof...(Vars) > 0) return detail::loop_result(std::move(current));
}

}  // namespace kiln
// ----- end kiln/data/dataset.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DATA_DATASET_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DATA_ITERATOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_DATA_ITERATOR_HPP
// ----- begin kiln/data/iterator.hpp -----
/// \file
/// `kiln::data::iterator`, TensorFlow's `iter(dataset)`: one pass over a dataset that
/// every `get_next()` advances, eagerly and inside functions. There, as in
/// TensorFlow, the iterator is a resource (a handle naming its state) and get_next an
/// `IteratorGetNext` node with effects, so it advances at every call of the graph,
/// and an iterator passed as a function argument is keyed by its element spec.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace kiln::detail {

/// What a kiln::data::iterator's copies share: a pass over a dataset's elements and
/// the spec they have.
class iterator_state {
 public:
  // The pass starts outside any trace: a source may run C++ code and ops (a generator).
  explicit iterator_state(std::shared_ptr<const dataset_stage> stage)
      : stage_(std::move(stage)), pass_([&] {
          init_scope eager;
          return stage_->iterate();
        }()) {}

  /// The next element, or nothing past the end; one caller at a time.
  std::optional<dataset_element> next() {
    std::lock_guard lock(mutex_);
    init_scope eager;  // a pass may run ops (a map's function)
    return pass_.next();
  }
  const std::vector<tensor_spec>& element_spec() const { return stage_->element_spec(); }

 private:
  std::shared_ptr<const dataset_stage> stage_;  // a pass reads its stages
  std::mutex mutex_;
  element_iterator pass_;
};

/// The live iterators, which iterator handles name.
using iterator_registry = handle_registry<iterator_state>;

/// The element `state` gives next, or kiln::out_of_range_error past the end (as
/// TensorFlow's OutOfRangeError: "End of sequence").
inline dataset_element next_element(iterator_state& state, std::string_view who) {
  std::optional<dataset_element> e = state.next();
  if (!e) throw out_of_range_error(std::string(who) + ": End of sequence");
  return std::move(*e);
}

/// `it.get_next()` inside a function: its input is the iterator's handle, its results
/// the element's components. The iterator comes from the handle at every run (an
/// iterator argument gives another one at each call); the op also holds the one it
/// was traced with, which keeps an iterator captured while tracing alive.
class iterator_get_next_op final : public special_op {
 public:
  explicit iterator_get_next_op(std::shared_ptr<iterator_state> traced)
      : special_op(std::type_identity<iterator_get_next_op>()), traced_(std::move(traced)) {}
  std::string_view name() const { return "IteratorGetNext"; }
  /// It advances the iterator: never pruned, in program order with other effects.
  bool has_effects() const { return true; }
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const std::shared_ptr<iterator_state> state = iterator_registry::get().find(*in[0], name(), "iterator");
    check_traced_spec(name(), "iterator", state->element_spec(), traced_->element_spec());
    return next_element(*state, name());
  }

 private:
  std::shared_ptr<iterator_state> traced_;
};

}  // namespace kiln::detail

namespace kiln::data {

/// TensorFlow's `iter(ds)`: a pass over a dataset that each get_next() advances.
/// Copies share the pass. Inside a kiln::function, get_next() is a node that advances
/// the iterator at every call (the guides' `good_consume_next`); as a function
/// argument an iterator is keyed by its element spec, so iterators of one spec share
/// a trace. Past the end, get_next() raises kiln::out_of_range_error, eagerly and
/// when a graph runs.
/// \code
/// kiln::data::iterator it = kiln::data::dataset::from_tensor_slices(kiln::constant({1, 2, 3})).make_iterator();
/// kiln::function consume([](const kiln::data::iterator& i) { kiln::print("Value:", i.get_next()[0]); });
/// consume(it);  // Value: 1
/// consume(it);  // Value: 2
/// \endcode
class iterator {
 public:
  /// An iterator over nothing; get_next() raises kiln::value_error.
  iterator() = default;
  /// A new pass over `ds` (what dataset::make_iterator gives).
  explicit iterator(const dataset& ds)
      : state_(std::make_shared<detail::iterator_state>(ds.pipeline())),
        handle_(kiln::constant(detail::iterator_registry::get().add(state_))) {}

  /// The next element, one tensor per component; inside a function being traced, an
  /// `IteratorGetNext` node's symbolic results. kiln::out_of_range_error past the end.
  dataset::element get_next() const {
    if (!state_) throw value_error("kiln::data::iterator: get_next on an iterator over nothing (default-constructed)");
    if (detail::trace_context* trace = detail::trace_context::current()) {
      std::vector<std::pair<dtype, shape>> results;
      for (const tensor_spec& s : element_spec()) results.emplace_back(s.dtype, s.shape);
      const tensor inputs[] = {handle_};
      return trace->record_special(std::make_shared<detail::iterator_get_next_op>(state_), inputs, results);
    }
    if (handle_.is_symbolic())
      throw type_error("kiln::data::iterator: an iterator a function received was used outside the trace that made it");
    return detail::next_element(*state_, "kiln::data::iterator::get_next");
  }

  /// One spec per component of an element.
  const std::vector<tensor_spec>& element_spec() const {
    if (!state_) throw value_error("kiln::data::iterator: an iterator over nothing (default-constructed) has no element spec");
    return state_->element_spec();
  }

  /// The int64 scalar naming the iterator at run time; symbolic inside a function
  /// that takes the iterator as an argument.
  const tensor& handle() const { return handle_; }
  /// Appends what keys an iterator argument to a kiln::function's cache key: that it
  /// is an iterator, and its element spec.
  void append_spec_key(std::vector<std::uint64_t>& key) const {
    key.push_back(~std::uint64_t(element_spec().size()));  // unlike a dataset's first word
    for (const tensor_spec& s : element_spec()) detail::add_shape(key, s.dtype, s.shape);
  }
  /// This iterator, reached through `handle` (a function's placeholder for it).
  iterator with_handle(const tensor& handle) const {
    iterator i = *this;
    i.handle_ = handle;
    return i;
  }
  /// How a function's signature shows an iterator argument, as TensorFlow does:
  /// `IteratorSpec(TensorSpec(shape=(), dtype=tf.int32, name=None),)`.
  std::string signature_text() const { return "IteratorSpec(" + detail::element_spec_text(element_spec()) + ",)"; }

 private:
  std::shared_ptr<detail::iterator_state> state_;
  tensor handle_;
};

/// An iterator over a dataset_of<N>: its elements are `std::array`s of `N` tensors.
/// \code
/// auto it = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3, 4})}).make_iterator();
/// auto [x, y] = it.get_next();  // 1, 3
/// \endcode
template <std::size_t N>
class iterator_of : public iterator {
 public:
  iterator_of() = default;
  explicit iterator_of(const dataset_of<N>& ds) : iterator(ds) {}
  /// As iterator::get_next.
  std::array<tensor, N> get_next() const {
    dataset::element e = iterator::get_next();
    std::array<tensor, N> out;
    std::move(e.begin(), e.end(), out.begin());  // the dataset_of checked the component count
    return out;
  }
  /// As iterator::with_handle.
  iterator_of with_handle(const tensor& handle) const {
    iterator_of i = *this;
    static_cast<iterator&>(i) = iterator::with_handle(handle);
    return i;
  }
};

/// `it.get_next()`, as TensorFlow's `next(it)`.
/// \code kiln::tensor x = kiln::data::get_next(kiln::data::dataset::range(2).make_iterator())[0];  // 0 \endcode
template <class Iterator>
  requires std::derived_from<Iterator, iterator>
auto get_next(const Iterator& it) {
  return it.get_next();
}

inline iterator dataset::make_iterator() const { return iterator(*this); }

template <std::size_t N>
iterator_of<N> dataset_of<N>::make_iterator() const {
  return iterator_of<N>(*this);
}

}  // namespace kiln::data
// ----- end kiln/data/iterator.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DATA_ITERATOR_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_TRAIN_OPTIMIZERS_HPP
#define KILN_SINGLE_INCLUDE_KILN_TRAIN_OPTIMIZERS_HPP
// ----- begin kiln/train/optimizers.hpp -----
/// \file
/// Keras' optimizers: `kiln::optimizers::sgd` and `adam`, with Keras' arguments and
/// update rules. `apply_gradients(grads, vars)` updates each variable from its
/// gradient (eagerly, or as variable writes of the function being traced), creating
/// the optimizer's slot variables (momentums, Adam's moments) on first use, as Keras
/// does: inside a kiln::function traced before, that creation is the singleton-
/// variable kiln::value_error, and one function (or concrete function) per optimizer
/// is the way around it. An optimizer makes its `iterations` variable when it is
/// made, so one made inside a function must outlive the trace, as variables must. The members that run ops are templates, as op functions are,
/// so that a program compiles them only where it trains.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>


namespace kiln::optimizers {

/// Options of kiln::optimizers::sgd (Keras' `SGD`).
struct sgd_options {
  double learning_rate = 0.01;
  double momentum = 0.0;  ///< 0 for plain gradient descent; in [0, 1]
  bool nesterov = false;
};

/// Options of kiln::optimizers::adam (Keras' `Adam`).
struct adam_options {
  double learning_rate = 1e-3;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
};

namespace detail {

/// What every optimizer has: the step count and, per variable, its slot variables.
class optimizer_state {
 public:
  /// `v.assign_add(delta)` with the same bits, written as an assignment of the sum so
  /// that in a kiln::function the sum fuses into the pass that computes `delta`
  /// (an assign_add is a pass of its own over the variable).
  template <class = void>
  static void add_to(const variable& v, const tensor& delta) {
    v.assign(v.read_value() + delta);
  }

  /// The steps applied so far: an int64 scalar variable, as Keras' `iterations`.
  const variable& iterations() const { return iterations_; }

 protected:
  // Constructors are templates, as op functions are: they make a variable.
  // As Keras makes `iterations` when an optimizer is made: an optimizer made while a
  // function is traced creates a variable there, so that one made at every call (a
  // local of the callable), even plain SGD, is the singleton-variable kiln::value_error.
  template <class = void>
  explicit optimizer_state(std::string name)
      : name_(std::move(name)), iterations_(kiln::constant(std::int64_t{0}), name_ + "/iterations") {}

  /// The (gradient, variable) pairs to update: those with a gradient, every pair
  /// checked before any variable changes. Raises kiln::invalid_argument_error for lists
  /// of different lengths or a gradient whose dtype or shape is not its variable's (a
  /// scalar gradient would otherwise broadcast over the variable, silently; Keras 2.12
  /// lets it), and kiln::value_error when no variable has a gradient, as Keras does.
  template <class = void>
  std::vector<std::pair<tensor, variable>> pairs(const std::vector<tensor>& grads, const std::vector<variable>& vars) const {
    if (grads.size() != vars.size())
      throw invalid_argument_error(name_ + ".apply_gradients: " + std::to_string(grads.size()) + " gradients for " +
                                   std::to_string(vars.size()) + " variables");
    std::vector<std::pair<tensor, variable>> out;
    for (std::size_t k = 0; k < vars.size(); ++k) {
      if (!grads[k].defined()) continue;  // Keras skips a variable without a gradient
      if (!is_floating(vars[k].dtype()))
        throw type_error(name_ + ".apply_gradients: variable '" + vars[k].name() + "' is " +
                         std::string(kiln::name(vars[k].dtype())) + "; optimizers update floating-point variables");
      const tensor& g = grads[k];
      // A gradient being traced may have dims known only when the graph runs.
      const bool fits = g.is_symbolic() ? vars[k].shape().is_compatible_with(g.shape()) : vars[k].shape().accepts(g.shape());
      if (g.dtype() != vars[k].dtype() || !fits)
        throw invalid_argument_error(name_ + ".apply_gradients: the gradient of variable '" + vars[k].name() + "' (" +
                                     std::string(kiln::name(vars[k].dtype())) + " " + vars[k].shape().str() + ") is " +
                                     std::string(kiln::name(g.dtype())) + " " + g.shape().str());
      out.emplace_back(grads[k], vars[k]);
    }
    if (out.empty() && !vars.empty())
      throw value_error(name_ + ".apply_gradients: no gradients provided for any variable");
    return out;
  }

  /// The `count` slot variables of `v` (zeros of its dtype and shape), created on the
  /// first call for `v`. Created while tracing a function traced before, they make
  /// the call raise the singleton-variable kiln::value_error, as in TensorFlow.
  template <class = void>
  const std::vector<variable>& slots(const variable& v, const std::vector<std::string>& kinds) {
    for (auto& [identity, vars] : slots_)
      if (identity == v.identity()) return vars;
    std::vector<variable> made;
    for (const std::string& kind : kinds)
      made.emplace_back(kiln::zeros(v.shape(), v.dtype()), name_ + "/" + v.name() + "/" + kind);
    slots_.emplace_back(v.identity(), std::move(made));
    return slots_.back().second;
  }

  /// `x` as a scalar of dtype `t` (Keras casts its hyperparameters to the variable's dtype).
  template <class = void>
  static tensor scalar(double x, dtype t) {
    return kiln::constant(x, t);
  }

  std::string name_;
  variable iterations_;

 private:
  std::vector<std::pair<const void*, std::vector<variable>>> slots_;
};

}  // namespace detail

/// Gradient descent with optional (Nesterov) momentum, as Keras' `SGD`:
/// `v -= lr * g`, or with momentum `m = momentum * m - lr * g; v += m`
/// (`v += momentum * m - lr * g` with Nesterov).
/// \code
/// kiln::variable w(2.f);
/// kiln::optimizers::sgd opt({.learning_rate = 0.1});
/// opt.apply_gradients({kiln::constant(1.f)}, {w});  // w is 1.9
/// \endcode
class sgd : public detail::optimizer_state {
 public:
  template <class = void>
  explicit sgd(sgd_options options = {}) : optimizer_state("SGD"), options_(options) {
    if (options.momentum < 0 || options.momentum > 1)
      throw invalid_argument_error("SGD: momentum must be in [0, 1], got " + std::to_string(options.momentum));
  }
  const sgd_options& options() const { return options_; }

  /// Updates each variable from its gradient (variables without one are skipped), then
  /// counts the step; inside a kiln::function, as writes of the function.
  template <class = void>
  void apply_gradients(const std::vector<tensor>& grads, const std::vector<variable>& vars) {
    for (const auto& [g, v] : pairs(grads, vars)) {
      const tensor lr = scalar(options_.learning_rate, v.dtype());
      if (options_.momentum == 0) {
        add_to(v, -g * lr);
        continue;
      }
      const tensor momentum = scalar(options_.momentum, v.dtype());
      const variable& m = slots(v, {"momentum"})[0];
      const tensor velocity = m.assign(-g * lr + m.read_value() * momentum);
      add_to(v, options_.nesterov ? -g * lr + velocity * momentum : velocity);
    }
    iterations_.assign_add(std::int64_t{1});
  }

 private:
  sgd_options options_;
};

/// Adam, as Keras' `Adam`: with step `t` (iterations + 1),
/// `m += (g - m) * (1 - beta_1)`, `u += (g² - u) * (1 - beta_2)`,
/// `v -= m * lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) / (sqrt(u) + epsilon)`.
/// \code
/// std::vector<kiln::variable> vars{kiln::variable(kiln::constant({1.f, 2.f}))};
/// kiln::optimizers::adam opt({.learning_rate = 1e-2});
/// kiln::gradient_tape tape;
/// kiln::tensor loss = kiln::reduce_sum(vars[0] * vars[0]);
/// opt.apply_gradients(tape.gradient(loss, vars), vars);
/// \endcode
class adam : public detail::optimizer_state {
 public:
  template <class = void>
  explicit adam(adam_options options = {}) : optimizer_state("Adam"), options_(options) {}
  const adam_options& options() const { return options_; }

  /// As sgd::apply_gradients.
  template <class = void>
  void apply_gradients(const std::vector<tensor>& grads, const std::vector<variable>& vars) {
    for (const auto& [g, v] : pairs(grads, vars)) {
      const dtype t = v.dtype();
      const tensor one = scalar(1, t), beta_1 = scalar(options_.beta_1, t), beta_2 = scalar(options_.beta_2, t);
      const tensor step = kiln::cast(iterations_.read_value() + std::int64_t{1}, t);
      const tensor beta_1_power = kiln::pow(beta_1, step), beta_2_power = kiln::pow(beta_2, step);
      const std::vector<variable>& moments = slots(v, {"m", "v"});
      const tensor m_old = moments[0].read_value(), u_old = moments[1].read_value();
      // Keras subtracts the betas from 1 in double (Python floats), then casts.
      const tensor m = moments[0].assign(m_old + (g - m_old) * scalar(1 - options_.beta_1, t));
      const tensor u = moments[1].assign(u_old + (kiln::square(g) - u_old) * scalar(1 - options_.beta_2, t));
      const tensor alpha = scalar(options_.learning_rate, t) * kiln::sqrt(one - beta_2_power) / (one - beta_1_power);
      v.assign(v.read_value() - m * alpha / (kiln::sqrt(u) + scalar(options_.epsilon, t)));
    }
    iterations_.assign_add(std::int64_t{1});
  }

 private:
  adam_options options_;
};

}  // namespace kiln::optimizers
// ----- end kiln/train/optimizers.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_TRAIN_OPTIMIZERS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_KERNELS_HPP
#define KILN_SINGLE_INCLUDE_KILN_KERNELS_HPP
// ----- begin kiln/kernels.hpp -----
/// \file
/// Separate compilation: kiln's kernels and heavy runtime functions compiled once per
/// program rather than once per source file.
///
/// Header-only, every source file that runs ops compiles the kernels of every op it
/// can reach, for every dtype and backend: running a kiln::function reaches them all,
/// about 3 MB of machine code and minutes of -O3 per source file. A program of many
/// source files can compile them in one place instead: define
/// `KILN_SEPARATE_COMPILATION` in every source file, so that kiln only declares them,
/// and compile them in one source file that also defines `KILN_LIBRARY_SOURCE` and
/// instantiates the kernels with `KILN_INSTANTIATE_KERNELS(list)`, where `list` is one
/// of the op lists of kiln/ops/registry.hpp (several source files may share the lists).
/// Such a file, compiled with the same flags as the rest of the program, is three
/// lines: `#define KILN_LIBRARY_SOURCE`, `#include <kiln/kiln.hpp>` and
/// `KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS)`. The CMake function
/// `kiln_add_library(<target>)` (cmake/kiln_library.cmake) writes and builds such a
/// library, one source file per op family so that they compile side by side,
/// and defines `KILN_SEPARATE_COMPILATION` for whatever links it. Results are the same
/// either way: the same code is compiled, in fewer places.

#include <span>


// An op's kernels are reached through two templates: eager execution on one backend
// (kiln::detail::execute picks it from the inputs' device) and the entry points a
// graph plan calls; its gradient formula through a third.
#define KILN_DETAIL_RUN_ON(prefix, tag, op)                                                                \
  prefix template ::kiln::tensor kiln::detail::run_on<::kiln::backend::tag, ::kiln::ops::op>(              \
      const ::kiln::ops::op&, std::span<const ::kiln::tensor* const>);
#if KILN_HAS_THRUST
#define KILN_DETAIL_RUN_ON_THRUST(prefix, op) KILN_DETAIL_RUN_ON(prefix, thrust_backend, op)
#else
#define KILN_DETAIL_RUN_ON_THRUST(prefix, op)
#endif
#define KILN_DETAIL_KERNELS_OF(prefix, op)                                                                 \
  KILN_DETAIL_RUN_ON(prefix, cpu_backend, op)                                                              \
  KILN_DETAIL_RUN_ON_THRUST(prefix, op)                                                                    \
  prefix template ::kiln::detail::exec::op_entry kiln::detail::exec::entry_for<::kiln::ops::op>(           \
      const ::kiln::ops::op&, ::kiln::dtype, ::kiln::dtype);                                               \
  prefix template void kiln::detail::backward_of<::kiln::ops::op>(                                         \
      const ::kiln::ops::any_op&, std::span<const ::kiln::tensor>, const ::kiln::tensor&,                  \
      const ::kiln::tensor&, std::span<::kiln::tensor>);
#define KILN_DETAIL_EXTERN_KERNELS_OF(op) KILN_DETAIL_KERNELS_OF(extern, op)
// Instantiating the kernels also registers them, so that graphs of a program linking
// them reach every op, whether the program calls it or not.
#define KILN_DETAIL_INSTANTIATE_KERNELS_OF(op) \
  KILN_DETAIL_KERNELS_OF(, op)                  \
  template const bool kiln::detail::kernels_registered<::kiln::ops::op>;

/// Compiles, in this source file, the kernels of every op of `list` (an X-macro of
/// kiln/ops/registry.hpp: KILN_ALL_OPS, KILN_UNARY_OPS, KILN_BINARY_OPS, ...).
/// For example `KILN_INSTANTIATE_KERNELS(KILN_REDUCTION_OPS)`, at namespace scope.
#define KILN_INSTANTIATE_KERNELS(list) list(KILN_DETAIL_INSTANTIATE_KERNELS_OF)

#if defined(KILN_SEPARATE_COMPILATION)
KILN_ALL_OPS(KILN_DETAIL_EXTERN_KERNELS_OF)
#endif

// The runtime's function templates that a program with kiln::function calls on tensors,
// gradient tapes, optimizers or random draws instantiates (templates so that a program
// without them compiles none of them): under separate compilation, compiled once, in
// the source file that defines KILN_LIBRARY_SOURCE.
#define KILN_DETAIL_RUNTIME_TEMPLATES(prefix)                                                                      \
  prefix template void kiln::detail::record_loop_on_tapes<void>(const ::kiln::detail::while_op&,                  \
                                                                std::span<const ::kiln::tensor>,                  \
                                                                std::span<const ::kiln::tensor>);                 \
  prefix template void kiln::detail::record_special_on_tapes<void>(const ::kiln::node&,                           \
                                                                   std::span<const ::kiln::tensor>, std::size_t,  \
                                                                   std::size_t);                                  \
  prefix template void kiln::detail::record_cond_on_tapes<void>(const ::kiln::tensor&, ::kiln::detail::cond_branches, \
                                                                std::span<const ::kiln::tensor>,                  \
                                                                std::span<const ::kiln::tensor>);                 \
  prefix template void kiln::detail::record_function_call<void>(const ::kiln::detail::concrete_state&,            \
                                                                std::span<const ::kiln::tensor>,                  \
                                                                std::span<const ::kiln::tensor>);                 \
  prefix template std::vector<::kiln::tensor> kiln::detail::vector_jacobian_product<void>(                        \
      const ::kiln::graph&, std::span<const ::kiln::tensor>, const std::vector<::kiln::tensor>&,                   \
      std::span<const ::kiln::tensor>, const std::vector<std::tuple<const void*, ::kiln::dtype, ::kiln::shape>>&,  \
      std::vector<bool>*);                                                                                         \
  prefix template std::vector<::kiln::tensor> kiln::detail::replay<void>(const ::kiln::graph&,                    \
                                                                         std::span<const ::kiln::tensor>);        \
  prefix template std::vector<::kiln::tensor> kiln::detail::loop_backward::operator()<void>(                      \
      std::span<const ::kiln::tensor>, std::span<const ::kiln::tensor>) const;                                    \
  prefix template void kiln::detail::register_tape_ops(::kiln::detail::tape_ops);                                  \
  prefix template std::vector<::kiln::tensor> kiln::detail::trace_while_loop<void>(                               \
      ::kiln::detail::trace_context&, std::size_t, const ::kiln::loop_options&, std::vector<::kiln::tensor>,      \
      std::vector<const ::kiln::tensor_array*>, std::vector<::kiln::detail::value_spec>,                          \
      std::vector<std::optional<::kiln::shape>>, bool, ::kiln::detail::loop_calls&);                              \
  prefix template std::vector<::kiln::tensor> kiln::detail::record_cond<void>(                                    \
      ::kiln::detail::trace_context&, const ::kiln::tensor&, ::kiln::detail::traced_subgraph&,                    \
      ::kiln::detail::traced_subgraph&);                                                                          \
  prefix template void kiln::optimizers::sgd::apply_gradients<void>(const std::vector<::kiln::tensor>&,             \
                                                                    const std::vector<::kiln::variable>&);         \
  prefix template void kiln::optimizers::adam::apply_gradients<void>(const std::vector<::kiln::tensor>&,            \
                                                                     const std::vector<::kiln::variable>&);        \
  prefix template ::kiln::tensor kiln::detail::shift_of<void>(const ::kiln::tensor&, ::kiln::reduction_axes);     \
  prefix template ::kiln::tensor kiln::reduce_logsumexp<void>(const ::kiln::tensor&, ::kiln::reduction_axes, bool); \
  prefix template ::kiln::tensor kiln::softmax<void>(const ::kiln::tensor&, std::int64_t);                        \
  prefix template ::kiln::tensor kiln::log_softmax<void>(const ::kiln::tensor&, std::int64_t);                    \
  prefix template ::kiln::tensor kiln::sparse_softmax_cross_entropy<void>(const ::kiln::tensor&,                  \
                                                                          const ::kiln::tensor&);                 \
  prefix template ::kiln::tensor kiln::random::uniform<void>(const ::kiln::shape&, double, std::optional<double>, \
                                                             ::kiln::dtype, std::optional<std::uint64_t>);  \
  prefix template class kiln::detail::basic_graph_executor<void>;                                                \
  prefix template std::vector<::kiln::tensor> kiln::gradient_tape::gradients_of<void>(                            \
      const ::kiln::tensor&, const std::vector<::kiln::tensor>&,                                                   \
      const std::vector<std::tuple<const void*, ::kiln::dtype, ::kiln::shape>>*);                                 \
  prefix template std::vector<::kiln::tensor> kiln::gradient_tape::gradients_with_variables<void>(                \
      const ::kiln::tensor&, std::vector<::kiln::tensor>,                                                          \
      const std::vector<std::tuple<const void*, ::kiln::dtype, ::kiln::shape>>&);                                 \
  prefix template void kiln::detail::concrete_state::compile<void>();                                             \
  prefix template void kiln::detail::concrete_state::run<void>(const ::kiln::detail::call_signature&,             \
                                                               std::vector<::kiln::tensor>&) const;               \
  prefix template void kiln::detail::function_state::check_input_signature<void>(                                 \
      ::kiln::detail::call_signature&, const std::vector<::kiln::tensor_spec>&) const;                             \
  prefix template void kiln::detail::function_state::throw_input_signature_mismatch<void>(                        \
      const ::kiln::detail::call_signature&, const std::vector<::kiln::tensor_spec>&);                             \
  prefix template std::shared_ptr<const ::kiln::detail::concrete_state>                                           \
  kiln::detail::function_state::find_or_trace<void>(                                                              \
      ::kiln::detail::call_signature&,                                                                             \
      std::shared_ptr<::kiln::detail::concrete_state> (*)(void*, const ::kiln::detail::call_signature&), void*);  \
  prefix template std::shared_ptr<::kiln::detail::concrete_state> kiln::detail::function_state::start_trace<void>( \
      const ::kiln::detail::call_signature&, ::kiln::detail::argument_texts, ::kiln::detail::trace_context&,      \
      std::vector<::kiln::tensor>&) const;                                                                         \
  prefix template void kiln::detail::function_state::add_output<void>(                                            \
      ::kiln::detail::concrete_state&, ::kiln::detail::trace_context&, const ::kiln::tensor&);                    \
  prefix template void kiln::detail::function_state::finish_trace<void>(::kiln::detail::concrete_state&,          \
                                                                        ::kiln::detail::trace_context&);           \
  prefix template bool kiln::detail::function_state::asks_for_specs<void>(const ::kiln::detail::call_signature&); \
  prefix template std::shared_ptr<::kiln::detail::concrete_state> kiln::detail::function_state::known_trace<void>( \
      const ::kiln::detail::call_signature&) const;                                                                \
  prefix template bool kiln::detail::function_state::same_structure_and_dtypes<void>(                             \
      const ::kiln::detail::concrete_state&, const ::kiln::detail::call_signature&);                              \
  prefix template std::shared_ptr<::kiln::detail::concrete_state>                                                 \
  kiln::detail::function_state::most_specific_trace_accepting<void>(const ::kiln::detail::call_signature&) const; \
  prefix template void kiln::detail::function_state::relax<void>(::kiln::detail::call_signature&);                \
  prefix template void kiln::detail::function_state::check_created_variables<void>(                               \
      const ::kiln::detail::trace_context&) const;
// The runtime's one function that is not a template (format_values) is declared
// KILN_LIBRARY_INLINE instead
// (kiln/config.hpp).
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_SOURCE)
KILN_DETAIL_RUNTIME_TEMPLATES()
#elif defined(KILN_SEPARATE_COMPILATION)
KILN_DETAIL_RUNTIME_TEMPLATES(extern)
#endif
// ----- end kiln/kernels.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_KERNELS_HPP
// ----- end kiln/kiln.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_KILN_HPP

#pragma once
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

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"

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

#pragma once
/// \file
/// `kiln::fixed<T, Dims...>`: a tensor whose element type and shape are part of its
/// type, the values of the compile-time tier. It owns its data,
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

#include "kiln/core/allocator.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/print.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/factories.hpp"

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

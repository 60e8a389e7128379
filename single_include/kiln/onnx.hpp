// kiln single header, generated from include/kiln/onnx.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_ONNX_HPP
#define KILN_SINGLE_INCLUDE_KILN_ONNX_HPP
// ----- begin kiln/onnx.hpp -----
/// \file
/// ONNX export: a traced function written as an ONNX model, for other runtimes
/// (onnxruntime, TensorRT, ...) to run (docs/onnx_export.md).
///
/// An optional part of kiln, outside kiln/kiln.hpp: it builds the model with ONNX's
/// own protobuf schema (Debian `libonnx-dev`, `libprotobuf-dev`), so a program that
/// includes it links the CMake target `kiln::onnx`.
///
/// \code
/// kiln::variable w(kiln::ones({3, 2}), "w"), b(kiln::zeros({2}), "b");
/// kiln::function dense([&](const kiln::tensor& x) { return kiln::relu(kiln::matmul(x, w) + b); });
/// kiln::onnx::export_model(dense.get_concrete_function(kiln::tensor_spec({kiln::none, 3}, kiln::float32)),
///                          "dense.onnx");
/// \endcode
///
/// Variables are written as initializers holding their current values (ONNX has no
/// state); `cond` becomes `If` and `while` becomes `Loop`; `kiln::print` nodes are left
/// out (no ONNX op writes to the console). A node that ONNX cannot express (a variable
/// assignment, a random draw, a host callback, ...) raises kiln::unavailable_error
/// naming the node and its op.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// What the CMake target of Debian's libonnx-dev defines, for builds without it: ONNX's
// classes in namespace ::onnx, from its schema with the ML extensions.
#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/onnx_pb.h>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
// ----- begin kiln/io/special_ops.hpp -----
/// \file
/// The special ops that files and other runtimes know: the one list that kiln::save,
/// kiln::load and kiln::onnx look a special node up in, by the op names its nodes take.
/// Each op says itself how it is saved, rebuilt, lowered to ONNX or refused (the members
/// kiln::special_op lists); a consumer finds the op's entry by name and calls it, so no
/// consumer names an op. A new special op is its own file and one entry here; an op
/// missing here is refused by name ("cannot save yet", "has no ONNX operator").
/// An optional part's header: it includes the ops' headers that kiln/kiln.hpp does not.

#include <string_view>
#include <type_traits>
#include <unordered_map>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
// ----- begin kiln/exec/collective_op.hpp -----
/// \file
/// The special op of collectives across ranks (kiln/distributed.hpp: `kiln::all_reduce`,
/// `all_gather`, `broadcast`, `reduce_scatter`), and the hook through which it reaches
/// the transport. A collective node holds what it does (its kind, reduce op, root and
/// group) and takes its tensors as inputs; when it runs it hands them to the engine that
/// kiln/distribute/ installs (MPI for host tensors, NCCL for device ones). This header
/// holds no transport code and needs no MPI, so that the consumers of graphs that must
/// recognise the node (saved functions) include it alone, and a program built without
/// the distributed component that meets such a node says what it lacks.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_ERROR_HPP
// ----- begin kiln/core/error.hpp -----
/// \file
/// The exception hierarchy: one kind per class of TensorFlow error, all derived from kiln::error.

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
#ifndef KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_CORE_TENSOR_HPP
// ----- begin kiln/core/tensor.hpp -----
/// \file
/// `kiln::tensor`: the runtime-typed tensor. Eager tensors own a
/// shared immutable buffer; symbolic tensors (inside a trace) carry a dtype, a
/// possibly partial shape and a handle to the graph value they stand for.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

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

// Separate compilation (kiln/separate_compilation.hpp). Header-only, every source file compiles
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
#include <atomic>
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
    if (bytes >= cache_threshold) live_large_bytes_.fetch_add(round_up(bytes), std::memory_order_relaxed);
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
    if (bytes >= cache_threshold) live_large_bytes_.fetch_sub(round_up(bytes), std::memory_order_relaxed);
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
  /// The bytes of blocks of cache_threshold or more handed out and not yet given back:
  /// what large tensors and workspaces hold (tests and benchmarks read it).
  std::size_t live_large_bytes() const { return live_large_bytes_.load(std::memory_order_relaxed); }

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
  std::atomic<std::size_t> live_large_bytes_{0};
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

  /// Whether this tensor is the only holder of its buffer: no other tensor, copy or
  /// view sees it, so the graph that owns this tensor may write the buffer in place.
  bool sole_owner() const { return buffer_ && buffer_.use_count() == 1; }
  /// How many elements the buffer holds from this tensor's first on: its size, or
  /// more for a view of the start of a larger buffer (a grown tensor_array's).
  std::int64_t buffer_capacity() const { return buffer_ ? buffer_->count() - offset_ : 0; }

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
#include <charconv>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_ANY_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_ANY_OP_HPP
// ----- begin kiln/ops/any_op.hpp -----
/// \file
/// `kiln::ops::any_op`: any op of the registry, as graph nodes and the op table
/// (kiln/ops/op_table.hpp) hold it.

#include <array>
#include <atomic>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_REGISTRY_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_REGISTRY_HPP
// ----- begin kiln/ops/registry.hpp -----
/// \file
/// The op registry: every op type, one row each, in one Boost.Mp11 list per family
/// (the families of the one op list, kiln/ops/op_list.hpp).
/// Graphs store an op as an `ops::any_op` over these lists, and the cross-backend suite
/// walks them; calling an op without its row stops at `ops::registered`'s `static_assert`.

#include <boost/mp11/list.hpp>

#include <string_view>
#include <type_traits>

#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_ACTIVATIONS_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_ACTIVATIONS_HPP
// ----- begin kiln/ops/activations.hpp -----
/// \file
/// The activations of neural-network layers beside relu, sigmoid and tanh (kiln/ops/
/// elementwise.hpp): gelu (exact and tanh approximation), softplus, silu, elu,
/// leaky_relu, and erf, which exact gelu and its gradient are written with. Each is
/// one elementwise functor (scalars, xsimd batches, Thrust device code) with its
/// gradient formula beside it, computing what TensorFlow 2.12's kernels and
/// `tf.nn` functions compute.

#include <span>
#include <string_view>
#include <tuple>

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
/// dtypes whose kernels an elementwise op compiles here (kiln/ops/op_table.hpp).
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
/// input is symbolic), or run. (A template on nothing: kiln/fixed.hpp alone has no
/// tracer to define tracing().)
template <class = void>
rule_errors rule_errors_for(std::span<const tensor* const> in) {
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
/// so that a program compiles the kernels of the ops it calls (kiln/ops/op_table.hpp).
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
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_OP_HPP
// ----- begin kiln/ops/op.hpp -----
/// \file
/// What every op definition provides, and the rules shared between op families.
///
/// An op is a type in kiln::ops holding its attributes, with
/// - `static constexpr std::string_view name`: the op's name in graphs and errors;
/// - `static constexpr std::string_view onnx_name`, when the op is one ONNX operator
///   (kiln/onnx.hpp's exporter writes it; the others it lowers in its own way);
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
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_OP_LIST_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_OP_LIST_HPP
// ----- begin kiln/ops/op_list.hpp -----
/// \file
/// The one op list: every op type of kiln::ops, one entry each, as X-macros that the
/// code which must name every op expands instead of repeating the names. The
/// elementwise ops with a public function of their own are entries `F(public_name, op)`,
/// and from them come the op families `F(op)` below, the public functions of both tiers
/// (on kiln::tensor: kiln/ops/elementwise.hpp and kiln/ops/activations.hpp; on typed
/// operands: kiln/typed/ops.hpp) and their operators. The families give the registry's
/// type lists (kiln/ops/registry.hpp), the kernels a compiled library instantiates
/// (kiln/separate_compilation.hpp), and the files cmake/kiln_library.cmake compiles them in. A test
/// of the ops folder fails when the CMake file's families drift from these, and the
/// fuzzer's programs (test/fuzz/program.hpp) fail to compile when an op listed here is
/// neither one of their steps nor one they name as left out.
///
/// A new elementwise op is its struct in kiln::ops (its name, its ONNX name when it is
/// one ONNX operator, its rules, functor and gradient), one entry in one list here (and
/// in KILN_OPERATORS if it has an operator), and its line in the fuzzer's programs.
/// Ops with attributes (`cast`, `gelu`, `elu`, `leaky_relu`) and `where` have
/// hand-written functions, which take more than operands.

/// The elementwise ops of kiln/ops/elementwise.hpp whose function takes one operand:
/// `F(public_name, op)`, the function `kiln::public_name(x)` in both tiers running
/// `kiln::ops::op`.
///
/// | function | computes |
/// |---|---|
/// | `negative(x)`, also `-x` | elementwise negation |
/// | `abs(x)` | absolute value |
/// | `exp(x)` | e to the x, for floats |
/// | `log(x)` | natural logarithm, for floats |
/// | `sqrt(x)` | square root, for floats |
/// | `square(x)` | `x * x` |
/// | `tanh(x)` | hyperbolic tangent, for floats |
/// | `sigmoid(x)` | `1 / (1 + exp(-x))`, for floats |
/// | `relu(x)` | `maximum(x, 0)` |
/// | `logical_not(b)` | negation of a bool tensor |
///
/// \code
/// const kiln::tensor x = kiln::constant({-1.f, 4.f});
/// const kiln::tensor y = kiln::sqrt(kiln::abs(x));  // [1 2]
/// const auto z = kiln::relu(-kiln::fixed<float, 2>{1.f, -2.f});  // [0 2]
/// \endcode
#define KILN_MATH_UNARY_FUNCTIONS(F)                                                                             \
  F(negative, negate) F(abs, abs) F(exp, exp) F(log, log) F(sqrt, sqrt) F(square, square) F(tanh, tanh)        \
  F(sigmoid, sigmoid) F(relu, relu) F(logical_not, logical_not)

/// The activations of kiln/ops/activations.hpp whose function takes one operand, for
/// floats: `F(public_name, op)` as KILN_MATH_UNARY_FUNCTIONS.
///
/// | function | computes |
/// |---|---|
/// | `erf(x)` | the Gauss error function (`tf.math.erf`) |
/// | `softplus(x)` | `log(exp(x) + 1)`, without overflow |
/// | `silu(x)` | `x * sigmoid(x)` (swish) |
///
/// \code
/// const kiln::tensor y = kiln::softplus(kiln::constant({0.f}));  // [0.693147]
/// \endcode
#define KILN_ACTIVATION_FUNCTIONS(F) F(erf, erf) F(softplus, softplus) F(silu, silu)

/// Every elementwise op whose function takes one operand.
#define KILN_UNARY_FUNCTIONS(F) KILN_MATH_UNARY_FUNCTIONS(F) KILN_ACTIVATION_FUNCTIONS(F)

/// The elementwise ops whose function takes two operands: `F(public_name, op)`, the
/// function `kiln::public_name(x, y)` in both tiers running `kiln::ops::op`, operands
/// broadcast together; a C++ scalar on either side takes the other operand's dtype.
///
/// | function | computes |
/// |---|---|
/// | `add(x, y)`, also `x + y` | sum; concatenates string tensors |
/// | `subtract(x, y)`, also `x - y` | difference |
/// | `multiply(x, y)`, also `x * y` | product |
/// | `divide(x, y)`, also `x / y` | true division (integers give float64) |
/// | `floordiv(x, y)` | division rounding down: `floordiv(7, -2)` is -4 |
/// | `floormod(x, y)`, also `x % y` | the remainder, with the divisor's sign |
/// | `pow(x, y)` | x to the power y |
/// | `maximum(x, y)`, `minimum(x, y)` | the larger, the smaller value |
/// | `equal(x, y)`, also `x == y`; `not_equal`, `!=` | comparison, giving bools |
/// | `less`, `<`; `less_equal`, `<=`; `greater`, `>`; `greater_equal`, `>=` | comparison, giving bools |
/// | `logical_and(a, b)`, `logical_or(a, b)` | on bool tensors |
///
/// \code
/// const kiln::tensor x = kiln::constant({7, -7});
/// const kiln::tensor q = kiln::floordiv(x, 2), r = x % 2;  // [3 -4], [1 1]
/// const kiln::tensor m = kiln::maximum(x, 0);               // [7 0]
/// const auto s = kiln::pow(kiln::fixed<double, 2>{2.0, 3.0}, 2.0);  // [4 9]
/// \endcode
#define KILN_BINARY_FUNCTIONS(F)                                                                                 \
  F(add, add) F(subtract, subtract) F(multiply, multiply) F(divide, divide) F(floordiv, floordiv)              \
  F(floormod, floormod) F(pow, pow) F(maximum, maximum) F(minimum, minimum) F(equal, equal)                    \
  F(not_equal, not_equal) F(less, less) F(less_equal, less_equal) F(greater, greater)                          \
  F(greater_equal, greater_equal) F(logical_and, logical_and) F(logical_or, logical_or)

/// The binary operators of both tiers, `F(symbol, public_name)`: `x symbol y` is
/// `kiln::public_name(x, y)`, with a C++ scalar on either side (unary `-x` is
/// `kiln::negative(x)`).
/// \code
/// const kiln::tensor x = kiln::constant({1.f, 2.f});
/// const kiln::tensor y = (x * 2.f + 1.f) / x;                     // [3 2.5]
/// const auto b = kiln::fixed<int, 2>{1, 2} >= kiln::fixed<int, 2>{2, 2};  // [false true]
/// \endcode
#define KILN_OPERATORS(F)                                                                                        \
  F(+, add) F(-, subtract) F(*, multiply) F(/, divide) F(%, floormod) F(==, equal) F(!=, not_equal) F(<, less)  \
  F(<=, less_equal) F(>, greater) F(>=, greater_equal)

// `F(op)` for each entry `F(public_name, op)` of a function list: the list is expanded
// with `F KILN_DETAIL_OP_OF` for its `F`, which leaves `F (op)`, called once the
// expansion is rescanned.
#define KILN_DETAIL_OP_OF(public_name, op) (op)
#define KILN_DETAIL_RESCAN(...) __VA_ARGS__
#define KILN_DETAIL_OPS_OF(FUNCTIONS, F) KILN_DETAIL_RESCAN(FUNCTIONS(F KILN_DETAIL_OP_OF))

// The op families: `F(op)` once per op type of kiln::ops, for code that must name every
// op (kiln/separate_compilation.hpp declares and instantiates each op's kernels family by family).

/// The elementwise ops with one input (`cast` included).
#define KILN_UNARY_OPS(F) \
  KILN_DETAIL_OPS_OF(KILN_UNARY_FUNCTIONS, F) F(cast) F(gelu) F(elu) F(leaky_relu)
/// The elementwise ops with two or three inputs.
#define KILN_BINARY_OPS(F) KILN_DETAIL_OPS_OF(KILN_BINARY_FUNCTIONS, F) F(where) F(relu_grad)
/// The shape ops.
#define KILN_SHAPE_OPS(F)                                                                                        \
  F(reshape) F(transpose) F(concat) F(stack) F(gather) F(unsorted_segment_sum) F(index) F(slice) F(shape_of)     \
  F(set_item) F(pad_rows) F(crop_or_pad)
/// The reductions.
#define KILN_REDUCTION_OPS(F) F(reduce_sum) F(reduce_mean) F(reduce_max) F(reduce_min) F(argmax)
/// Linear algebra and NN ops: products, convolution, pooling and the ops pooling's
/// gradients run.
#define KILN_LINALG_OPS(F) \
  F(matmul) F(conv2d) F(max_pool) F(avg_pool) F(max_pool_grad) F(max_pool_grad_grad) F(avg_pool_grad)
/// Every op kiln defines.
#define KILN_ALL_OPS(F) KILN_UNARY_OPS(F) KILN_BINARY_OPS(F) KILN_SHAPE_OPS(F) KILN_REDUCTION_OPS(F) KILN_LINALG_OPS(F)
// ----- end kiln/ops/op_list.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_OP_LIST_HPP

namespace kiln::ops {

using dtypes::all;
using dtypes::floating;
using dtypes::numeric;
inline constexpr dtype_set numeric_and_string = numeric | dtype_set{string};
inline constexpr dtype_set logical{bool_};

// ---- unary ------------------------------------------------------------------
struct negate : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "neg";
  static constexpr std::string_view onnx_name = "Neg";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::neg(a); }
  template <class G> void gradient(G& g) const { g.give(0, -g.dy()); }
};
struct abs : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "abs";
  static constexpr std::string_view onnx_name = "Abs";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::abs(a); }
  /// dy * sign(x), 0 at 0 as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct exp : elementwise_op<1, floating> {
  static constexpr std::string_view name = "exp";
  static constexpr std::string_view onnx_name = "Exp";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::exp(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * g.y()); }
};
struct log : elementwise_op<1, floating> {
  static constexpr std::string_view name = "log";
  static constexpr std::string_view onnx_name = "Log";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::log(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() / g.x(0)); }
};
struct sqrt : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sqrt";
  static constexpr std::string_view onnx_name = "Sqrt";
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
  static constexpr std::string_view onnx_name = "Tanh";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::tanh(a); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy() * (1.0 - g.y() * g.y())); }
};
struct sigmoid : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sigmoid";
  static constexpr std::string_view onnx_name = "Sigmoid";
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
  static constexpr std::string_view onnx_name = "Not";
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
  static constexpr std::string_view onnx_name = "Sub";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::sub(a, b); }
  template <class G> void gradient(G& g) const { g.give(0, g.dy()), g.give(1, -g.dy()); }
};
struct multiply : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "mul";
  static constexpr std::string_view onnx_name = "Mul";
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
  static constexpr std::string_view onnx_name = "Pow";
  static constexpr bool integer_exponent = true;  // a negative integer exponent is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::pow(a, b); }
  /// As TensorFlow: the exponent's gradient is 0 where the base is not positive.
  template <class G> void gradient(G& g) const;
};
struct maximum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "maximum";
  static constexpr std::string_view onnx_name = "Max";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::max(a, b); }
  /// dy goes to the first operand where it is the larger or they tie (the one the
  /// result is), as TensorFlow.
  template <class G> void gradient(G& g) const;
};
struct minimum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "minimum";
  static constexpr std::string_view onnx_name = "Min";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::min(a, b); }
  template <class G> void gradient(G& g) const;
};
struct less : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less";
  static constexpr std::string_view onnx_name = "Less";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a < b; }
};
struct less_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less_equal";
  static constexpr std::string_view onnx_name = "LessOrEqual";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a <= b; }
};
struct greater : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater";
  static constexpr std::string_view onnx_name = "Greater";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a > b; }
};
struct greater_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater_equal";
  static constexpr std::string_view onnx_name = "GreaterOrEqual";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a >= b; }
};
struct equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "equal";
  static constexpr std::string_view onnx_name = "Equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a == b; }
};
struct not_equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "not_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a != b; }
};
/// relu's gradient (TensorFlow's ReluGrad): `dy` (operand 1) where relu's result `y`
/// (operand 0) is positive, else 0. One op, so that it runs SIMD where `where` on the
/// bool of `greater` would run element by element.
struct relu_grad : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu_grad";
  template <class T> KILN_HOST_DEVICE T operator()(T y, T dy) const { return math::select(y > T(0), dy, T(0)); }
  /// Linear in dy, with the same selection; y only selects.
  template <class G> void gradient(G& g) const { g.give(1, G::run(relu_grad{}, g.x(0), g.dy())); }
};
struct logical_and : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_and";
  static constexpr std::string_view onnx_name = "And";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
struct logical_or : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_or";
  static constexpr std::string_view onnx_name = "Or";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};

// ---- ternary ----------------------------------------------------------------
/// `where(cond, a, b)`: a bool condition choosing between two values of one dtype.
struct where : elementwise_op<3, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "select";
  static constexpr std::string_view onnx_name = "Where";
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
  g.give(0, G::run(relu_grad{}, g.y(), g.dy()));
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

/// Whether an op's second integer operand may make it undefined: a divisor (zero is
/// refused) or an exponent (a negative one is).
template <class Op>
concept checks_integer_operand = requires { Op::integer_divisor; } || requires { Op::integer_exponent; };

/// Whether `y`, the second operand of `Op`, is an integer it refuses.
template <checks_integer_operand Op, class T>
constexpr bool refused_integer_operand(T y) {
  if constexpr (requires { Op::integer_divisor; }) return y == T(0);
  else return y < T(0);
}

/// The error of `Op` for a second integer operand it refuses.
template <checks_integer_operand Op>
[[noreturn]] KILN_COLD KILN_NOINLINE void throw_refused_integer_operand() {
  throw invalid_argument_error(std::string(Op::name) + (requires { Op::integer_divisor; }
                                                            ? ": integer division by zero"
                                                            : ": integers to negative integer powers are not allowed"));
}

/// Rejects integer division by zero and integers to negative powers before a kernel
/// runs, as TensorFlow does (and as C++ must: both are undefined behaviour).
template <elementwise Op>
  requires checks_integer_operand<Op>
void check_values(const Op&, std::span<const tensor* const> in) {
  const tensor& y = *in[1];
  if (!is_integer(y.dtype()) || y.size() == 0) return;
  bool bad = visit_dtype(y.dtype(), [&]<class T>() {
    if constexpr (math::is_signed_integer<T>) {
      std::vector<T> copied;
      const T* p = y.device() == device::cpu ? y.data<T>() : (copied = y.to_vector<T>()).data();
      for (std::int64_t i = 0, n = y.size(); i < n; ++i)
        if (refused_integer_operand<Op>(p[i])) return true;
    }
    return false;
  });
  if (bad) throw_refused_integer_operand<Op>();
}

}  // namespace kiln::ops

namespace kiln {

// The functions of the one op list (kiln/ops/op_list.hpp, where they are documented):
// each builds its op and hands it to detail::apply, and takes a C++ scalar on either
// side of a binary op, converted to the tensor operand's dtype. Every op function is a
// template, even where nothing is deduced, so that its body, and with it the op's
// kernels, is compiled only in programs that call it. (kiln/ops/activations.hpp
// expands the unary one for its ops.)
#define KILN_DETAIL_TENSOR_UNARY_FUNCTION(fn, op)                                    \
  template <class = void>                                                            \
  tensor fn(const tensor& x) { return detail::apply(ops::op{}, x); }
#define KILN_DETAIL_TENSOR_BINARY_FUNCTION(fn, op)                                   \
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
KILN_MATH_UNARY_FUNCTIONS(KILN_DETAIL_TENSOR_UNARY_FUNCTION)
KILN_BINARY_FUNCTIONS(KILN_DETAIL_TENSOR_BINARY_FUNCTION)
#undef KILN_DETAIL_TENSOR_BINARY_FUNCTION

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

#define KILN_DETAIL_TENSOR_OPERATOR(sym, fn)                                         \
  template <class = void>                                                            \
  tensor operator sym(const tensor& x, const tensor& y) { return fn(x, y); }        \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const tensor& x, const S& y) { return fn(x, y); }              \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const S& x, const tensor& y) { return fn(x, y); }
KILN_OPERATORS(KILN_DETAIL_TENSOR_OPERATOR)
#undef KILN_DETAIL_TENSOR_OPERATOR

}  // namespace kiln
// ----- end kiln/ops/elementwise.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_ELEMENTWISE_HPP

namespace kiln::ops {

/// The Gauss error function, as `tf.math.erf`.
struct erf : elementwise_op<1, floating> {
  static constexpr std::string_view name = "erf";
  static constexpr std::string_view onnx_name = "Erf";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::erf(a); }
  /// dy * 2 / sqrt(pi) * exp(-x^2).
  template <class G> void gradient(G& g) const {
    const auto x = g.x(0);
    g.give(0, g.dy() * 1.1283791670955126 * G::run(exp{}, -(x * x)));
  }
};

/// `x * P(X <= x)` for a standard normal X (`tf.nn.gelu`): exactly, with erf, or with
/// the tanh approximation when `approximate`.
struct gelu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "gelu";
  bool approximate = false;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"approximate", &gelu::approximate}}; }
  constexpr gelu() = default;
  constexpr explicit gelu(bool tanh_approximation) : approximate(tanh_approximation) {}
  constexpr bool operator==(const gelu&) const = default;
  // TensorFlow's constants and operation order: x / sqrt(2) (not a product), and
  // sqrt(2 / pi) * (x + 0.044715 * x^3).
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    if (approximate) return T(0.5) * x * (T(1) + math::tanh(T(0.7978845608028654) * (x + T(0.044715) * (x * x * x))));
    return T(0.5) * x * (T(1) + math::erf(x / T(1.4142135623730951)));
  }
  /// dy * (Phi(x) + x * phi(x)) exactly; the derivative of the tanh form when
  /// approximating.
  template <class G> void gradient(G& g) const;
};

/// `log(exp(x) + 1)`; x itself above -log(epsilon) - 2 and exp(x) below log(epsilon)
/// + 2, as TensorFlow's Softplus kernel, where the sum would lose x's digits.
struct softplus : elementwise_op<1, floating> {
  static constexpr std::string_view name = "softplus";
  static constexpr std::string_view onnx_name = "Softplus";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::softplus(x); }
  /// dy * sigmoid(x).
  template <class G> void gradient(G& g) const;
};

/// `x * sigmoid(x)` (swish), as `tf.nn.silu`.
struct silu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "silu";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return x * (T(1) / (T(1) + math::exp(math::neg(x)))); }
  /// dy * s * (1 + x * (1 - s)) with s = sigmoid(x).
  template <class G> void gradient(G& g) const;
};

/// `x` where positive, else `alpha * (exp(x) - 1)`, as Keras' `elu` (TensorFlow's Elu
/// kernel for alpha 1).
struct elu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "elu";
  double alpha = 1.0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"alpha", &elu::alpha}}; }
  constexpr elu() = default;
  constexpr explicit elu(double a) : alpha(a) {}
  constexpr bool operator==(const elu&) const = default;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    return math::select(x > T(0), x, T(alpha) * (math::exp(x) - T(1)));
  }
  /// dy where x is positive, else dy * (y + alpha).
  template <class G> void gradient(G& g) const;
};

/// `x` where positive, else `alpha * x`, as TensorFlow's LeakyRelu kernel.
struct leaky_relu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "leaky_relu";
  double alpha = 0.3;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"alpha", &leaky_relu::alpha}}; }
  constexpr leaky_relu() = default;
  constexpr explicit leaky_relu(double a) : alpha(a) {}
  constexpr bool operator==(const leaky_relu&) const = default;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::select(x > T(0), x, T(alpha) * x); }
  /// dy where x is positive, else alpha * dy, as TensorFlow's LeakyReluGrad.
  template <class G> void gradient(G& g) const;
};

template <class G>
void gelu::gradient(G& g) const {
  const auto x = g.x(0);
  if (approximate) {
    const double k = 0.7978845608028654, c = 0.044715;
    const auto t = G::run(tanh{}, k * (x + c * (x * x * x)));
    g.give(0, g.dy() * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (k * (1.0 + 3.0 * c * (x * x)))));
  } else {
    const auto cdf = 0.5 * (1.0 + G::run(erf{}, x * 0.7071067811865476));
    const auto pdf = 0.3989422804014327 * G::run(exp{}, -0.5 * (x * x));
    g.give(0, g.dy() * (cdf + x * pdf));
  }
}

template <class G>
void softplus::gradient(G& g) const {
  g.give(0, g.dy() * G::run(sigmoid{}, g.x(0)));
}

template <class G>
void silu::gradient(G& g) const {
  const auto x = g.x(0), s = G::run(sigmoid{}, x);
  g.give(0, g.dy() * (s * (1.0 + x * (1.0 - s))));
}

template <class G>
void elu::gradient(G& g) const {
  const auto positive = G::run(greater{}, g.x(0), g.x(0).scalar(0));
  g.give(0, G::run(where{}, positive, g.dy(), g.dy() * (g.y() + alpha)));
}

template <class G>
void leaky_relu::gradient(G& g) const {
  const auto positive = G::run(greater{}, g.x(0), g.x(0).scalar(0));
  g.give(0, G::run(where{}, positive, g.dy(), g.dy() * alpha));
}

}  // namespace kiln::ops

namespace kiln {

// erf, softplus and silu: the functions of the one op list (kiln/ops/op_list.hpp,
// where they are documented), as kiln/ops/elementwise.hpp writes them.
KILN_ACTIVATION_FUNCTIONS(KILN_DETAIL_TENSOR_UNARY_FUNCTION)
#undef KILN_DETAIL_TENSOR_UNARY_FUNCTION

/// `kiln::gelu(x)`: the Gaussian error linear unit, `x * Phi(x)`; `kiln::gelu(x, true)`
/// uses the tanh approximation (`tf.nn.gelu(x, approximate=True)`).
/// \code kiln::gelu(kiln::constant({-1.f, 0.f, 1.f})); // [-0.158655 0 0.841345] \endcode
template <class = void>
tensor gelu(const tensor& x, bool approximate = false) { return detail::apply(ops::gelu(approximate), x); }

/// `kiln::elu(x, alpha = 1)`: x where positive, else `alpha * (exp(x) - 1)`.
template <class = void>
tensor elu(const tensor& x, double alpha = 1.0) { return detail::apply(ops::elu(alpha), x); }

/// `kiln::leaky_relu(x, alpha = 0.3)`: x where positive, else `alpha * x` (Keras'
/// default slope; `tf.nn.leaky_relu`'s is 0.2).
/// \code kiln::leaky_relu(kiln::constant({-2.f, 3.f})); // [-0.6 3] \endcode
template <class = void>
tensor leaky_relu(const tensor& x, double alpha = 0.3) { return detail::apply(ops::leaky_relu(alpha), x); }

}  // namespace kiln
// ----- end kiln/ops/activations.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_ACTIVATIONS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_LINALG_HPP
// ----- begin kiln/ops/linalg.hpp -----
/// \file
/// Linear algebra and NN ops: `matmul` (2-D and batched, batch dims broadcast) and
/// `conv2d` (NHWC input, HWIO filters, strides, VALID or SAME padding).

#include <array>
#include <string_view>
#include <utility>

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
#include <cstring>
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
  static constexpr std::string_view onnx_name = "Concat";
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
  static constexpr std::string_view onnx_name = "Gather";
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
  /// The result written into the buffer of `x`, the first input, when no one else
  /// holds it (a graph's value that no later node reads: a loop that accumulates rows
  /// in a tensor_array writes each row, where a copy per row made it quadratic); else,
  /// or for a string tensor or one off the CPU, a copy as evaluate() makes. `in[1]`
  /// and `in[2]` are the index and the value.
  template <class = void>
  tensor evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const;
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
  /// The result in the buffer of `x`, the first input, when no one else holds it:
  /// its spare room if it has enough, else a new buffer with room for twice the rows,
  /// so that a tensor_array grown a row at a time in a loop costs amortized O(1) per
  /// row (a copy per row made it quadratic); else as evaluate().
  template <class = void>
  tensor evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const;
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

template <class>
tensor ops::set_item::evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const {
  const tensor& value = *in[2];
  if (x.dtype() == string || x.device() != device::cpu || value.device() != device::cpu || !x.sole_owner()) {
    const tensor* rest[] = {&x, in[1], in[2]};
    return evaluate(rest);
  }
  const std::size_t row_bytes = std::size_t(value.size()) * size_of(value.dtype());
  std::memcpy(static_cast<char*>(x.raw_data()) + std::size_t(scalar_index(*in[1])) * row_bytes, value.raw_data(), row_bytes);
  return std::move(x);
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

template <class>
tensor ops::pad_rows::evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const {
  const std::int64_t rows = scalar_index(*in[1]), have = x.shape()[0];
  if (rows <= have) return std::move(x);
  if (x.dtype() == string || x.device() != device::cpu || !x.sole_owner()) {
    const tensor* rest[] = {&x, in[1]};
    return evaluate(rest);
  }
  kiln::shape grown = x.shape();
  grown[0] = rows;
  const std::int64_t row = have > 0 ? x.size() / have : grown.num_elements() / rows;
  const std::size_t element = size_of(x.dtype());
  tensor out = std::move(x);
  if (out.buffer_capacity() < rows * row) {
    kiln::shape room = grown;
    room[0] = std::max(rows, 2 * have);
    tensor bigger(out.dtype(), room);
    std::memcpy(bigger.raw_data(), out.raw_data(), std::size_t(out.size()) * element);
    out = bigger.share(out.shape());
  }
  std::memset(static_cast<char*>(out.raw_data()) + std::size_t(have * row) * element, 0,
              std::size_t((rows - have) * row) * element);
  return out.share(grown);
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
  static constexpr std::string_view onnx_name = "MatMul";
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
#ifndef KILN_SINGLE_INCLUDE_KILN_OPS_POOLING_HPP
#define KILN_SINGLE_INCLUDE_KILN_OPS_POOLING_HPP
// ----- begin kiln/ops/pooling.hpp -----
/// \file
/// Pooling ops over NHWC images, as TensorFlow's: `max_pool` and `avg_pool` (windows,
/// strides, VALID or SAME padding), and the ops their gradients run:
/// `max_pool_grad` (TensorFlow's MaxPoolGrad: each window's gradient goes to the
/// first of its largest elements, in row-major order), `max_pool_grad_grad` (its
/// gradient: what the first largest element of each window receives) and
/// `avg_pool_grad` (each window's gradient shared by the elements it averages; with
/// SAME padding a window averages its elements inside the image only, as
/// TensorFlow's AvgPool).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>


namespace kiln::ops {

/// The window, strides and padding of a pooling op (its attributes).
struct pool_window {
  std::int64_t window_h = 2, window_w = 2;
  std::int64_t stride_h = 2, stride_w = 2;
  padding pad = padding::valid;

  constexpr bool operator==(const pool_window&) const = default;

  /// The pooled shape of NHWC input `x`, or why there is none.
  constexpr shape_result pooled_shape(const shape& x) const {
    if (window_h < 1 || window_w < 1) return {{}, "the window must be at least 1 x 1"};
    if (stride_h < 1 || stride_w < 1) return {{}, "strides must be >= 1"};
    if (!x.has_known_rank()) return {shape(unknown_rank)};
    if (x.rank() != 4) return {{}, "the input must have rank 4 (NHWC)"};
    if (pad == padding::valid && ((x[1] != none && x[1] < window_h) || (x[2] != none && x[2] < window_w)))
      return {{}, "VALID padding needs the input to be at least as large as the window"};
    return {shape{x[0], conv_output_dim(x[1], window_h, stride_h, pad).out, conv_output_dim(x[2], window_w, stride_w, pad).out,
                  x[3]}};
  }
  /// The shape of an input gradient (the input's, operand 0) for an output gradient
  /// (operand 1) that must have the pooled shape.
  constexpr shape_result input_gradient_shape(std::span<const shape> in) const {
    const shape_result pooled = pooled_shape(in[0]);
    if (!pooled.ok()) return pooled;
    if (!in[1].is_compatible_with(pooled.value)) return {{}, "the gradient must have the pooled input's shape"};
    return {in[0]};
  }
};

/// The attributes of pooling op `Op` (a pool_window), as saved graphs list them.
template <class Op>
constexpr auto pool_attribute_fields() {
  return std::tuple{attribute{"window_h", &Op::window_h}, attribute{"window_w", &Op::window_w},
                    attribute{"stride_h", &Op::stride_h}, attribute{"stride_w", &Op::stride_w},
                    attribute{"padding", &Op::pad}};
}

/// Float inputs of one dtype, as TensorFlow's pooling ops and their gradients take.
constexpr dtype_result pooled_dtype(std::span<const dtype> in) {
  for (dtype t : in)
    if (t != in[0]) return {in[0], "operands must have the same dtype"};
  if (!dtypes::floating.contains(in[0])) return {in[0], "dtype not supported (pooling takes float32 or float64)"};
  return {in[0]};
}

/// The largest element of each window (TensorFlow's MaxPool).
struct max_pool : pool_window {
  static constexpr std::string_view name = "max_pool";
  static constexpr int arity = 1;
  static constexpr auto attribute_fields() { return pool_attribute_fields<max_pool>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return pooled_shape(in[0]); }
  constexpr bool operator==(const max_pool&) const = default;
  /// Each window's gradient to the first of its largest elements (max_pool_grad).
  template <class G> void gradient(G& g) const;
};

/// The mean of each window's elements inside the image (TensorFlow's AvgPool).
struct avg_pool : pool_window {
  static constexpr std::string_view name = "avg_pool";
  static constexpr int arity = 1;
  static constexpr auto attribute_fields() { return pool_attribute_fields<avg_pool>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return pooled_shape(in[0]); }
  constexpr bool operator==(const avg_pool&) const = default;
  /// Each window's gradient shared by its elements (avg_pool_grad).
  template <class G> void gradient(G& g) const;
};

/// The input gradient of max_pool at input `x` (operand 0) for the output gradient
/// `dy` (operand 1): zeros but at each window's first largest element, which receives
/// the window's gradient (summed where windows overlap).
struct max_pool_grad : pool_window {
  static constexpr std::string_view name = "max_pool_grad";
  static constexpr int arity = 2;
  static constexpr auto attribute_fields() { return pool_attribute_fields<max_pool_grad>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return input_gradient_shape(in); }
  constexpr bool operator==(const max_pool_grad&) const = default;
  /// Linear in dy, whose gradient is max_pool_grad_grad; x only picks the elements.
  template <class G> void gradient(G& g) const;
};

/// For input `x` (operand 0) and a gradient `d` of x's shape (operand 1), each
/// window's value of `d` at the window's first largest element of `x`: the gradient of
/// max_pool_grad with respect to its output gradient.
struct max_pool_grad_grad : pool_window {
  static constexpr std::string_view name = "max_pool_grad_grad";
  static constexpr int arity = 2;
  static constexpr auto attribute_fields() { return pool_attribute_fields<max_pool_grad_grad>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (!in[1].is_compatible_with(in[0])) return {{}, "the gradient must have the input's shape"};
    return pooled_shape(in[0]);
  }
  constexpr bool operator==(const max_pool_grad_grad&) const = default;
  template <class G> void gradient(G& g) const;
};

/// The input gradient of avg_pool for the output gradient `dy` (operand 1); input `x`
/// (operand 0) gives the shape only.
struct avg_pool_grad : pool_window {
  static constexpr std::string_view name = "avg_pool_grad";
  static constexpr int arity = 2;
  static constexpr auto attribute_fields() { return pool_attribute_fields<avg_pool_grad>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return input_gradient_shape(in); }
  constexpr bool operator==(const avg_pool_grad&) const = default;
  /// Linear in dy: its gradient is avg_pool of the incoming gradient.
  template <class G> void gradient(G& g) const;
};

template <class G>
void max_pool::gradient(G& g) const {
  g.give(0, G::run(max_pool_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void avg_pool::gradient(G& g) const {
  g.give(0, G::run(avg_pool_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void max_pool_grad::gradient(G& g) const {
  g.give(1, G::run(max_pool_grad_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void max_pool_grad_grad::gradient(G& g) const {
  g.give(1, G::run(max_pool_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void avg_pool_grad::gradient(G& g) const {
  g.give(1, G::run(avg_pool{*this}, g.dy()));
}

/// The sizes of one pooling call, shared by every backend's kernels: input dims
/// (batch, in_h, in_w, channels), output dims, the window, strides and the padding
/// before the first row and column. Window (oy, ox) covers input rows
/// [oy * stride_h - pad_top, + window_h) and columns likewise, cut to the image.
struct pool_geometry {
  std::int64_t batch = 0, in_h = 0, in_w = 0, channels = 0, out_h = 0, out_w = 0;
  std::int64_t window_h = 1, window_w = 1, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;

  constexpr pool_geometry() = default;
  constexpr pool_geometry(const pool_window& p, const shape& x)
      : batch(x[0]), in_h(x[1]), in_w(x[2]), channels(x[3]), window_h(p.window_h), window_w(p.window_w),
        stride_h(p.stride_h), stride_w(p.stride_w) {
    const conv_dim h = conv_output_dim(in_h, window_h, stride_h, p.pad), w = conv_output_dim(in_w, window_w, stride_w, p.pad);
    out_h = h.out, out_w = w.out, pad_top = h.pad_before, pad_left = w.pad_before;
  }
  /// The first input row of output row `oy`'s windows and one past their last.
  KILN_HOST_DEVICE constexpr std::int64_t row_begin(std::int64_t oy) const {
    const std::int64_t r = oy * stride_h - pad_top;
    return r < 0 ? 0 : r;
  }
  KILN_HOST_DEVICE constexpr std::int64_t row_end(std::int64_t oy) const {
    const std::int64_t r = oy * stride_h - pad_top + window_h;
    return r > in_h ? in_h : r;
  }
  KILN_HOST_DEVICE constexpr std::int64_t column_begin(std::int64_t ox) const {
    const std::int64_t c = ox * stride_w - pad_left;
    return c < 0 ? 0 : c;
  }
  KILN_HOST_DEVICE constexpr std::int64_t column_end(std::int64_t ox) const {
    const std::int64_t c = ox * stride_w - pad_left + window_w;
    return c > in_w ? in_w : c;
  }
  /// The first and one past the last output row whose windows hold input row `iy`.
  KILN_HOST_DEVICE constexpr std::int64_t first_row_holding(std::int64_t iy) const {
    const std::int64_t from = iy + pad_top - window_h + 1;  // oy * stride_h > this - 1
    return from <= 0 ? 0 : (from + stride_h - 1) / stride_h;
  }
  KILN_HOST_DEVICE constexpr std::int64_t rows_holding_end(std::int64_t iy) const {
    const std::int64_t last = (iy + pad_top) / stride_h + 1;
    return last < out_h ? last : out_h;
  }
  KILN_HOST_DEVICE constexpr std::int64_t first_column_holding(std::int64_t ix) const {
    const std::int64_t from = ix + pad_left - window_w + 1;
    return from <= 0 ? 0 : (from + stride_w - 1) / stride_w;
  }
  KILN_HOST_DEVICE constexpr std::int64_t columns_holding_end(std::int64_t ix) const {
    const std::int64_t last = (ix + pad_left) / stride_w + 1;
    return last < out_w ? last : out_w;
  }
  /// Whether the windows tile the input: each element in exactly one window.
  constexpr bool tiles() const {
    return stride_h == window_h && stride_w == window_w && pad_top == 0 && pad_left == 0 && out_h * window_h == in_h &&
           out_w * window_w == in_w;
  }
  /// The offset of element (b, iy, ix, c) of the input.
  KILN_HOST_DEVICE constexpr std::int64_t input_offset(std::int64_t b, std::int64_t iy, std::int64_t ix, std::int64_t c) const {
    return ((b * in_h + iy) * in_w + ix) * channels + c;
  }
  /// The offset of element (b, oy, ox, c) of the output.
  KILN_HOST_DEVICE constexpr std::int64_t output_offset(std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) const {
    return ((b * out_h + oy) * out_w + ox) * channels + c;
  }

  /// The input offset of the first largest element of channel `c` of window (b, oy,
  /// ox) of `x` (in row-major order; a NaN counts as the largest, as it propagates).
  template <class T>
  KILN_HOST_DEVICE std::int64_t argmax(const T* x, std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) const {
    std::int64_t best = -1;
    T top = T(0);
    for (std::int64_t iy = row_begin(oy); iy < row_end(oy); ++iy)
      for (std::int64_t ix = column_begin(ox); ix < column_end(ox); ++ix) {
        const std::int64_t at = input_offset(b, iy, ix, c);
        const T v = x[at];
        if (best < 0 || (top == top && (v > top || v != v))) best = at, top = v;
      }
    return best;
  }
  /// How many input elements window (oy, ox) covers (inside the image).
  KILN_HOST_DEVICE constexpr std::int64_t window_count(std::int64_t oy, std::int64_t ox) const {
    return (row_end(oy) - row_begin(oy)) * (column_end(ox) - column_begin(ox));
  }
};

}  // namespace kiln::ops

namespace kiln {

namespace detail {
/// The pool_window of a pooling function's arguments; sizes below 1 are the op's rule
/// errors.
template <class = void>
ops::pool_window pool_window_of(std::string_view fn, const int_list& ksize, const int_list& strides,
                                       std::string_view padding) {
  auto pair = [&](const int_list& v, const char* what) {
    if (v.size() == 1) return std::pair{v[0], v[0]};
    if (v.size() == 2) return std::pair{v[0], v[1]};
    if (v.size() == 4 && v[0] == 1 && v[3] == 1) return std::pair{v[1], v[2]};
    throw value_error(std::string(fn) + ": " + what + " must be 1, 2 or 4 ints (4 as [1, h, w, 1]), got " + v.str());
  };
  ops::pool_window p;
  std::tie(p.window_h, p.window_w) = pair(ksize, "ksize");
  std::tie(p.stride_h, p.stride_w) = pair(strides, "strides");
  if (padding != "VALID" && padding != "SAME")
    throw value_error(std::string(fn) + ": padding must be \"VALID\" or \"SAME\", got \"" + std::string(padding) + "\"");
  p.pad = parse_padding(padding);
  return p;
}
}  // namespace detail

/// The largest value of each `ksize` window of an NHWC input, moved by `strides`, with
/// "VALID" or "SAME" padding (TensorFlow's tf.nn.max_pool2d). `ksize` and `strides`
/// are one int, two (height, width) or four (TensorFlow's NHWC form). Its gradient
/// goes to the first largest element of each window, as TensorFlow's.
/// \code kiln::max_pool2d(kiln::ones({1, 4, 4, 3}), 2, 2, "VALID").shape() == kiln::shape{1, 2, 2, 3} \endcode
template <class = void>
tensor max_pool2d(const tensor& input, const int_list& ksize, const int_list& strides, std::string_view padding) {
  const ops::pool_window p = detail::pool_window_of("max_pool2d", ksize, strides, padding);
  return detail::apply(ops::max_pool{p}, input);
}

/// max_pool2d with square windows and equal strides.
template <class = void>
tensor max_pool2d(const tensor& input, std::int64_t ksize, std::int64_t stride, std::string_view padding) {
  return max_pool2d(input, int_list{ksize}, int_list{stride}, padding);
}

/// The mean of each `ksize` window of an NHWC input (tf.nn.avg_pool2d); with "SAME"
/// padding a window averages the elements inside the image only.
/// \code kiln::avg_pool2d(kiln::ones({1, 4, 4, 3}), 3, 1, "SAME").shape() == kiln::shape{1, 4, 4, 3} \endcode
template <class = void>
tensor avg_pool2d(const tensor& input, const int_list& ksize, const int_list& strides, std::string_view padding) {
  const ops::pool_window p = detail::pool_window_of("avg_pool2d", ksize, strides, padding);
  return detail::apply(ops::avg_pool{p}, input);
}

/// avg_pool2d with square windows and equal strides.
template <class = void>
tensor avg_pool2d(const tensor& input, std::int64_t ksize, std::int64_t stride, std::string_view padding) {
  return avg_pool2d(input, int_list{ksize}, int_list{stride}, padding);
}

}  // namespace kiln
// ----- end kiln/ops/pooling.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_POOLING_HPP
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
  static constexpr std::string_view onnx_name = "ReduceSum";
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
  static constexpr std::string_view onnx_name = "ReduceMean";
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
  static constexpr std::string_view onnx_name = "ReduceMax";
  static constexpr reduction_kind kind = reduction_kind::max;
  using reduction_op::reduction_op;
  template <class G> void gradient(G& g) const { g.give(0, extreme_gradient(g)); }
};
/// Smallest element; NaN wins over any number.
struct reduce_min : reduction_op {
  static constexpr std::string_view name = "reduce_min";
  static constexpr std::string_view onnx_name = "ReduceMin";
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

namespace kiln::ops {

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

}  // namespace kiln
// ----- end kiln/ops/any_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_OPS_ANY_OP_HPP

namespace kiln {

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
///
/// A derived op also says how the consumers of graphs treat it, each a member they
/// look up by the op's name, so that no consumer enumerates the ops (kiln/io/special_ops.hpp
/// lists those that files know):
/// - `static op_names()`: the names its nodes take (one per kind it has);
/// - saving (kiln/saved_function.hpp): `template <class Out> void save(Out&) const`
///   writes its attributes, `template <class In> static std::shared_ptr<const special_op>
///   load(In&)` checks them against the node and rebuilds it; or `static constexpr
///   std::string_view save_refusal`, why it cannot be saved;
/// - ONNX (kiln/onnx.hpp): `template <class Onnx, class Graph> std::vector<std::string>
///   to_onnx(Onnx&, Graph&, const node&, const graph&, const std::vector<std::string>&) const`
///   emits its nodes, or `static constexpr std::string_view onnx_refusal` says why not;
/// - gradients: an entry of special_gradients() (kiln/graph/special_gradients.hpp),
///   registered by the layer that differentiates it.
/// `Out`, `In` and `Onnx` are the consumers' types, so an op's header names no JSON or
/// protocol buffer, and a program that saves nothing compiles none of it. An op without
/// a member is refused by its name ("cannot save yet", "has no ONNX operator") or has
/// no gradient.
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
  const tensor& value() const {
    static const tensor none;
    return value_ ? *value_ : none;
  }
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
  // Behind a pointer: only constants hold one, and a node of a large graph is copied by
  // every pass (a tensor in place made a node 2.5 times larger).
  std::shared_ptr<const tensor> value_;
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

  /// Makes room for `n` nodes, as a pass that rebuilds a graph of n nodes does.
  /// \code
  /// kiln::graph g;
  /// g.reserve(2);
  /// g.add_output(g.add_placeholder("x", kiln::float32, kiln::shape{}));
  /// \endcode
  void reserve(std::size_t n) { nodes_.reserve(n); }

  int add_placeholder(const std::string& name, kiln::dtype t, const kiln::shape& s) {
    int id = add(node_kind::placeholder, name, {}, t, s);
    arguments_.push_back(id);
    return id;
  }
  int add_constant(const tensor& value) {
    int id = add(node_kind::constant, "Const", {}, value.dtype(), value.shape());
    nodes_[id].value_ = std::make_shared<const tensor>(value);
    return id;
  }
  /// A constant holding the value of constant node `n` of another graph (the value is shared).
  int add_constant(const node& n) {
    int id = add(node_kind::constant, "Const", {}, n.dtype(), n.shape());
    nodes_[std::size_t(id)].value_ = n.value_;
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
  KILN_LIBRARY_INLINE std::vector<int> add_special(std::shared_ptr<const special_op> op, std::vector<int> inputs,
                                                   const std::vector<std::pair<kiln::dtype, kiln::shape>>& results);
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

  KILN_LIBRARY_INLINE int add(node_kind kind, const std::string& base, std::vector<int> inputs, kiln::dtype t, const kiln::shape& s);
  // TensorFlow's naming: the first `add`, then `add_1`, `add_2`, ..., skipping a name
  // given before. Which names were given is known without a set of every name, which
  // would cost each node of a large graph a lookup in a table as large: a base's
  // suffixes count up, so `b_k` (k in digits) was given as a suffixed name exactly when
  // base `b` has handed out k; a bare base is given once and remembered.
  KILN_LIBRARY_INLINE std::string unique_name(const std::string& base);
  // Whether `name` is `b_k` (k digits, no leading zero) handed out by base b.
  bool suffixed(std::string_view name) const {
    const std::size_t underscore = name.rfind('_');
    if (underscore == std::string_view::npos || underscore + 1 == name.size() || name[underscore + 1] == '0') return false;
    std::int64_t k = 0;
    const auto [end, ec] = std::from_chars(name.data() + underscore + 1, name.data() + name.size(), k);
    if (ec != std::errc() || end != name.data() + name.size()) return false;
    const auto it = next_suffix_.find(name.substr(0, underscore));
    return it != next_suffix_.end() && k < it->second;
  }

  std::vector<node> nodes_;
  std::vector<int> arguments_;
  std::vector<int> outputs_;
  std::map<std::string, int, std::less<>> next_suffix_;  ///< per base: the next suffix to try (one entry per base)
  std::set<std::string, std::less<>> bare_names_;        ///< the names given without a suffix
};

// Compiled once in a compiled kiln (KILN_LIBRARY_INLINE, kiln/config.hpp): every
// program that traces builds graphs with them.
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::vector<int> graph::add_special(std::shared_ptr<const special_op> op, std::vector<int> inputs,
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

KILN_LIBRARY_INLINE int graph::add(node_kind kind, const std::string& base, std::vector<int> inputs, kiln::dtype t,
                                   const kiln::shape& s) {
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

KILN_LIBRARY_INLINE std::string graph::unique_name(const std::string& base) {
  int& next = next_suffix_[base];
  if (next == 0) {
    next = 1;
    if (!suffixed(base)) {
      bare_names_.insert(base);
      return base;
    }
  }
  for (;; ++next) {
    std::string candidate = base + "_" + std::to_string(next);
    if (!bare_names_.contains(candidate) && !suffixed(candidate)) {
      ++next;
      return candidate;
    }
  }
}
#endif

}  // namespace kiln
// ----- end kiln/graph/graph.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_GRAPH_GRAPH_HPP

namespace kiln {

/// How `kiln::all_reduce` and `kiln::reduce_scatter` combine the ranks' values:
/// TensorFlow's `tf.distribute.ReduceOp` (sum, mean) and the collectives' max and min.
/// \code kiln::reduce_op op = kiln::reduce_op::mean; \endcode
enum class reduce_op : unsigned char { sum, mean, max, min };

/// `sum`, `mean`, `max`, `min`.
/// \code kiln::name(kiln::reduce_op::max) == "max" \endcode
inline std::string_view name(reduce_op op) {
  static constexpr std::string_view names[] = {"sum", "mean", "max", "min"};
  return names[int(op)];
}

}  // namespace kiln

namespace kiln::detail {

/// What a collective does with its tensors.
enum class collective_kind : unsigned char {
  all_reduce,      ///< every rank gets the reduction of every rank's tensors
  all_gather,      ///< every rank gets every rank's tensor, stacked along axis 0 in rank order
  broadcast,       ///< every rank gets the root's tensor
  reduce_scatter,  ///< rank r gets block r (along axis 0) of the reduction
  reduce,          ///< the root gets the reduction, the others zeros (broadcast's gradient)
};

/// The graph op of each kind, as a graph listing shows it (TensorFlow's collective ops'
/// names; `CollectiveReduce` is NCCL's `Reduce`, which TensorFlow's graphs call
/// NcclReduce).
inline std::string_view collective_op_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastV2",
                                               "CollectiveReduceScatterV2", "CollectiveReduce"};
  return names[int(kind)];
}
/// The function of each kind, as messages name it.
inline std::string_view collective_api_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"kiln::all_reduce", "kiln::all_gather", "kiln::broadcast",
                                               "kiln::reduce_scatter", "kiln::broadcast's gradient"};
  return names[int(kind)];
}

/// A collective as a node holds it.
struct collective_spec {
  collective_kind kind = collective_kind::all_reduce;
  reduce_op op = reduce_op::sum;  ///< all_reduce, reduce_scatter, reduce
  int root = 0;                   ///< broadcast, reduce: the rank (in the group) whose tensor counts
  /// The group: the world ranks of its members in the group's rank order; empty for
  /// every rank of the world.
  std::vector<int> members;
  /// The transport's state of the group (kiln/distribute/): set for a collective the
  /// program made, null for one loaded from a file, whose group `members` finds.
  std::shared_ptr<void> group;
  /// Where the program calls it (a hash of its source file, line and column, and the
  /// line): ranks that reach a collective from different places have lost step, since
  /// every rank runs the same program.
  std::uint64_t site = 0;
  std::uint32_t line = 0;
};

/// The `site` of a collective called at `file`, `line`, `column`.
inline std::uint64_t collective_site(std::string_view file, std::uint32_t line, std::uint32_t column) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (char c : file) hash = (hash ^ std::uint8_t(c)) * 1099511628211ull;
  for (std::uint32_t v : {line, column})
    for (int b = 0; b < 4; ++b) hash = (hash ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return hash;
}

/// Why a collective cannot take its inputs: nothing, or which rule they break.
struct collective_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks the dtype and shape of a collective's inputs (one tensor, or several of one
/// dtype for an all_reduce) in a group of `group_size` ranks, and gives the results'
/// shapes in `results`. Partial shapes pass when some shape of them would.
/// (A template on nothing, compiled only where a program uses it.)
template <class = void>
collective_failure check_collective(const collective_spec& s, std::span<const std::pair<dtype, shape>> inputs,
                                    int group_size, std::vector<std::pair<dtype, shape>>* results = nullptr) {
  const std::string who(collective_api_name(s.kind));
  auto fail = [&](collective_failure::kind_t kind, const std::string& problem) {
    return collective_failure{kind, who + ": " + problem};
  };
  if (inputs.empty()) return fail(collective_failure::wrong_shape, "no tensors given");
  if (s.kind != collective_kind::all_reduce && inputs.size() != 1)
    return fail(collective_failure::wrong_shape, "takes one tensor, got " + std::to_string(inputs.size()));
  const dtype t = inputs[0].first;
  for (const auto& [type, dims] : inputs)
    if (type != t)
      return fail(collective_failure::wrong_dtype, "the tensors of one all_reduce share a dtype, got " +
                                                       std::string(name(t)) + " and " + std::string(name(type)));
  const bool reduces = s.kind == collective_kind::all_reduce || s.kind == collective_kind::reduce_scatter ||
                       s.kind == collective_kind::reduce;
  if (reduces && !dtypes::numeric.contains(t))
    return fail(collective_failure::wrong_dtype, "reduce_op::" + std::string(name(s.op)) +
                                                     " needs int32, int64, float32 or float64 tensors, got " +
                                                     std::string(name(t)));
  if (s.kind == collective_kind::reduce && !is_floating(t))
    return fail(collective_failure::wrong_dtype, "takes float32 or float64 tensors, got " + std::string(name(t)));
  if ((s.kind == collective_kind::broadcast || s.kind == collective_kind::reduce) &&
      (s.root < 0 || s.root >= group_size))
    return fail(collective_failure::wrong_shape, "root " + std::to_string(s.root) + " is not a rank of a group of " +
                                                     std::to_string(group_size));
  const shape& first = inputs[0].second;
  if (s.kind == collective_kind::all_gather || s.kind == collective_kind::reduce_scatter) {
    if (first.has_known_rank() && first.rank() == 0)
      return fail(collective_failure::wrong_shape, "needs a tensor of rank 1 or more (it works along axis 0), got a scalar");
    if (s.kind == collective_kind::reduce_scatter && first.has_known_rank() && first[0] != none &&
        first[0] % group_size != 0)
      return fail(collective_failure::wrong_shape, "the first dim of shape " + first.str() +
                                                       " does not divide into " + std::to_string(group_size) +
                                                       " equal blocks, one per rank");
  }
  if (results) {
    results->clear();
    for (const auto& [type, dims] : inputs) {
      shape out = dims;
      if (dims.has_known_rank() && dims.rank() > 0 && dims[0] != none) {
        std::vector<std::int64_t> d(dims.begin(), dims.end());
        if (s.kind == collective_kind::all_gather) d[0] *= group_size;
        if (s.kind == collective_kind::reduce_scatter) d[0] /= group_size;
        out = shape(std::span<const std::int64_t>(d));
      }
      results->emplace_back(type, out);
    }
  }
  return {};
}

class collective_op;

/// Where collectives run: the transport that kiln/distribute/ installs when a program
/// includes kiln/distributed.hpp (null otherwise).
struct collective_engine {
  /// Runs `op` on eager inputs and writes one tensor per result into `results`.
  void (*run)(const collective_op& op, std::span<const tensor* const> inputs, std::span<tensor> results) = nullptr;
  /// The number of ranks of a group (`members` empty: the world).
  int (*group_size)(const std::vector<int>& members) = nullptr;
};
inline std::atomic<const collective_engine*>& collective_engine_slot() {
  static std::atomic<const collective_engine*> engine{nullptr};
  return engine;
}

/// What a program without the distributed component says when it meets a collective.
[[noreturn]] inline void throw_no_collective_engine(std::string_view where, std::string_view op) {
  throw unavailable_error(std::string(where) + std::string(op) +
                          " is a collective across ranks, which needs kiln's distributed component: "
                          "#include <kiln/distributed.hpp> and link the CMake target kiln::distributed");
}

/// A collective across ranks: its inputs are the tensors it combines, its results one per
/// input. It has effects: every rank must run the same collectives in the same order, so
/// they run in program order and are never pruned, folded or merged.
class collective_op final : public special_op {
 public:
  explicit collective_op(collective_spec spec) : special_op(std::type_identity<collective_op>()), spec_(std::move(spec)) {}
  std::string_view name() const { return collective_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine("", name());
    std::vector<tensor> out(in.size());
    engine->run(*this, in, out);
    return out;
  }
  const collective_spec& spec() const { return spec_; }

  static std::array<std::string_view, 5> op_names() {
    return {collective_op_name(collective_kind::all_reduce), collective_op_name(collective_kind::all_gather),
            collective_op_name(collective_kind::broadcast), collective_op_name(collective_kind::reduce_scatter),
            collective_op_name(collective_kind::reduce)};
  }
  /// Saved as what it does; the kind is in the op's name, the group is its world ranks
  /// (empty: the world).
  template <class Out>
  void save(Out& out) const {
    out.set("reduce", std::string(kiln::name(spec_.op)));
    out.set("root", spec_.root);
    out.set("members", spec_.members);
    out.set("site", spec_.site);
    out.set("line", spec_.line);
  }
  /// Rebuilt only where the distributed component runs collectives, which tells the
  /// size of its group.
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    collective_kind kind = collective_kind::all_reduce;
    for (auto k : {collective_kind::all_reduce, collective_kind::all_gather, collective_kind::broadcast,
                   collective_kind::reduce_scatter, collective_kind::reduce})
      if (collective_op_name(k) == in.op()) kind = k;
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine(in.context(), in.op());
    collective_spec spec{kind, reduce_op::sum, in.integer("root", 0, INT32_MAX), {}, nullptr, in.unsigned_integer("site"),
                         std::uint32_t(in.integer("line", 0, INT32_MAX))};
    const std::string reduce = in.text("reduce");
    bool known = false;
    for (auto o : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min})
      if (kiln::name(o) == reduce) spec.op = o, known = true;
    if (!known) in.fail("unknown reduce op \"" + reduce + "\"");
    for (int m : in.integers("members", 0, INT32_MAX)) spec.members.push_back(m);
    std::vector<std::pair<dtype, shape>> given, made;
    for (int k = 0; k < in.input_count(); ++k) given.emplace_back(in.input(k).dtype(), in.input(k).shape());
    int size = 0;
    try {
      size = engine->group_size(spec.members);
    } catch (const error& e) {
      in.fail(e.what());
    }
    if (collective_failure f = check_collective(spec, given, size, &made)) in.fail(f.message);
    in.expect_results(made);
    return std::make_shared<collective_op>(std::move(spec));
  }

 private:
  collective_spec spec_;
};

}  // namespace kiln::detail
// ----- end kiln/exec/collective_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
// ----- begin kiln/exec/summary_op.hpp -----
/// \file
/// The special op of TensorBoard summaries (kiln/summary.hpp), and the hook through
/// which it reaches a writer. A summary node holds what it writes (its kind, tag,
/// description and the kind's parameter) and takes its value and step as inputs; when
/// it runs it looks up the default writer of the calling thread, so that a function
/// traced, or saved and loaded, without a writer writes to whichever writer is the
/// default at each call. The writers themselves (event files, protocol buffers, PNG)
/// live in kiln/io/summary/, above this layer: they fill the hook, so that this header
/// (which saved functions, ONNX export and training loops include to recognise or
/// write summaries) carries none of their code.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>


namespace kiln::detail {

/// What a summary shows in TensorBoard: a curve of scalars, a histogram, text or images.
enum class summary_kind : unsigned char { scalar, histogram, text, image };

/// The graph op of each kind, as a graph listing shows it.
inline std::string_view summary_op_name(summary_kind kind) {
  switch (kind) {
    case summary_kind::histogram: return "WriteHistogramSummary";
    case summary_kind::text: return "WriteTextSummary";
    case summary_kind::image: return "WriteImageSummary";
    default: return "WriteScalarSummary";
  }
}

/// What a summary writes besides its value and step.
struct summary_spec {
  summary_kind kind = summary_kind::scalar;
  std::string tag;          ///< the name TensorBoard shows
  std::string description;  ///< shown beside the plot (Markdown); may be empty
  int parameter = 0;        ///< histogram: the bucket count; image: max_outputs; otherwise 0
};

/// Why a summary cannot take a value or a step: nothing, or which rule it breaks.
struct summary_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks a summary's value (`value_type`, `value_shape`) and step against what its
/// kind takes. Partial shapes (None dims, unknown rank) pass when a value of some
/// fitting shape would: the node checks the concrete shapes again when it runs.
/// (Messages are made only on failure: a node runs this at every call. Like the other
/// functions here, a template on nothing, compiled only where a program uses it.)
template <class = void>
summary_failure check_summary_inputs(const summary_spec& s, dtype value_type, const shape& value_shape,
                                            dtype step_type, const shape& step_shape) {
  auto fail = [&](summary_failure::kind_t kind, const std::string& problem) {
    static constexpr std::string_view kinds[] = {"scalar", "histogram", "text", "image"};
    return summary_failure{kind, "kiln::summary::" + std::string(kinds[int(s.kind)]) + " '" + s.tag + "': " + problem};
  };
  auto value = [&] { return std::string(name(value_type)) + " " + value_shape.str(); };
  if (step_type != int32 && step_type != int64)
    return fail(summary_failure::wrong_dtype, "the step must be an int32 or int64 scalar, got " +
                                                  std::string(name(step_type)) + " " + step_shape.str());
  if (step_shape.has_known_rank() && step_shape.rank() != 0)
    return fail(summary_failure::wrong_shape, "the step must be a scalar, got shape " + step_shape.str());
  switch (s.kind) {
    case summary_kind::scalar:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the value must be numeric, got " + value());
      if (value_shape.has_known_rank() && value_shape.rank() != 0)
        return fail(summary_failure::wrong_shape, "the value must be a scalar, got shape " + value_shape.str());
      break;
    case summary_kind::histogram:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the values must be numeric, got " + value());
      break;
    case summary_kind::text:
      if (value_type != string)
        return fail(summary_failure::wrong_dtype, "the value must be a string tensor, got " + value());
      break;
    case summary_kind::image:
      if (value_type == string || value_type == bool_)
        return fail(summary_failure::wrong_dtype,
                    "the images must be float32 or float64 (in [0, 1]) or int32 or int64 (in [0, 255]), got " + value());
      if (value_shape.has_known_rank()) {
        if (value_shape.rank() != 4)
          return fail(summary_failure::wrong_shape,
                      "the images must be of rank 4 (count, height, width, channels), got shape " + value_shape.str());
        const std::int64_t channels = value_shape[3];
        if (channels != none && (channels < 1 || channels > 4))
          return fail(summary_failure::wrong_shape,
                      "the images must have 1 (gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA) channels, got shape " +
                          value_shape.str());
        if (value_shape[1] == 0 || value_shape[2] == 0)
          return fail(summary_failure::wrong_shape,
                      "an image must be at least 1 pixel high and wide, got shape " + value_shape.str());
      }
      break;
  }
  return {};
}

/// Raises the error of `f`: kiln::type_error for a dtype and kiln::value_error for a
/// shape (as TensorFlow's summaries raise, eagerly and while tracing), or
/// kiln::invalid_argument_error for a shape found wrong only when a graph runs.
template <class = void>
[[noreturn]] void throw_summary_failure(const summary_failure& f, bool running_graph) {
  if (running_graph) throw invalid_argument_error(f.message);
  if (f.kind == summary_failure::wrong_dtype) throw type_error(f.message);
  throw value_error(f.message);
}

/// Where summaries go: a writer, reached through a function pointer that the writer
/// sets (kiln/io/summary/writer.hpp), so that code below it writes without its code.
struct summary_target {
  /// Writes `value` as summary `spec` at `step`; returns whether it wrote. A value the
  /// writer cannot show (an integer pixel outside [0, 255], a NaN in a histogram)
  /// raises kiln::invalid_argument_error.
  bool (*write)(summary_target& self, const summary_spec& spec, const tensor& value, std::int64_t step) = nullptr;
  /// Writes a serialized GraphDef (TensorBoard's graph view).
  void (*write_graph)(summary_target& self, std::string_view graph_def) = nullptr;
  /// Hands what is queued to the file.
  void (*flush)(summary_target& self) = nullptr;
};

/// This thread's default writer (null when none): what kiln::summary::file_writer's
/// as_default() sets for its lifetime, as tf.summary's default writer is per thread.
inline summary_target*& default_summary_target() {
  thread_local summary_target* target = nullptr;
  return target;
}

/// How code below kiln/summary.hpp (a training loop given a log directory) opens a
/// writer on a directory: `summary_file_opener<>::open(logdir)`, a shared
/// summary_target. Declared here, defined by kiln/summary.hpp; such code names it as a
/// defaulted template argument and checks that it is complete where it is
/// instantiated, as concrete_function::save does with saved_function_io, so that a
/// program that never includes kiln/summary.hpp compiles none of the writer, and one
/// that asks for a log directory without it gets a compile error that says so:
/// \code
/// template <class Opener = kiln::detail::summary_file_opener<>>
/// std::shared_ptr<kiln::detail::summary_target> open_log(const std::filesystem::path& logdir) {
///   if constexpr (requires { Opener::open(logdir); })
///     return Opener::open(logdir);
///   else
///     static_assert(sizeof(Opener*) == 0, "a log directory needs #include <kiln/summary.hpp>");
/// }
/// \endcode
template <class = void>
struct summary_file_opener;

/// The hook for training loops (kiln::fit): writes each (tag, value) pair as a scalar
/// summary at `step` to `target` (a writer, from summary_file_opener or the thread's
/// default one when null); returns false when there is no writer. Tags are as tf.keras' TensorBoard callback
/// names them (`epoch_loss`, `epoch_accuracy`) by the caller's choice.
/// \code
/// const std::pair<std::string, double> logs[] = {{"epoch_loss", 0.25}, {"epoch_accuracy", 0.9}};
/// kiln::detail::write_scalar_summaries(logs, 3);  // false: no default writer here
/// \endcode
template <class = void>
bool write_scalar_summaries(std::span<const std::pair<std::string, double>> values, std::int64_t step,
                            summary_target* target = nullptr) {
  if (!target) target = default_summary_target();
  if (!target) return false;
  for (const auto& [tag, v] : values) {
    tensor t(float64, shape{});
    *static_cast<double*>(t.raw_data()) = v;
    target->write(*target, summary_spec{summary_kind::scalar, tag, {}, 0}, t, step);
  }
  return true;
}

/// The step of a summary as an integer: an int32 or int64 scalar (checked before).
template <class = void>
std::int64_t summary_step(const tensor& step) {
  if (step.device() != device::cpu) return summary_step(step.to(device::cpu));
  return step.dtype() == int32 ? std::int64_t(*static_cast<const std::int32_t*>(step.raw_data()))
                               : *static_cast<const std::int64_t*>(step.raw_data());
}

/// Writes a summary to the default writer at every run: its inputs are the value and
/// the step, its one result a bool scalar, true when it wrote (false without a writer).
class summary_op final : public special_op {
 public:
  template <class = void>
  explicit summary_op(summary_spec spec) : special_op(std::type_identity<summary_op>()), spec_(std::move(spec)) {
    for (int k = 0; k < 2; ++k) {
      written_[k] = tensor(bool_, shape{});
      *static_cast<bool*>(written_[k].raw_data()) = k == 1;
    }
  }
  std::string_view name() const { return summary_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  tensor run(std::span<const tensor* const> in) const {
    summary_target* target = default_summary_target();
    if (!target) return written_[0];
    const tensor& value = *in[0];
    const tensor& step = *in[1];
    if (summary_failure f = check_summary_inputs(spec_, value.dtype(), value.shape(), step.dtype(), step.shape()))
      throw_summary_failure(f, true);  // (only a shape the trace left partial can fail here)
    return written_[target->write(*target, spec_, value, summary_step(step)) ? 1 : 0];
  }
  const summary_spec& spec() const { return spec_; }

  static std::array<std::string_view, 4> op_names() {
    return {summary_op_name(summary_kind::scalar), summary_op_name(summary_kind::histogram),
            summary_op_name(summary_kind::text), summary_op_name(summary_kind::image)};
  }
  /// Saved as what it writes besides its inputs; the kind is in the op's name, the
  /// writer is the loading program's default one.
  template <class Out>
  void save(Out& out) const {
    out.set("tag", spec_.tag);
    out.set("description", spec_.description);
    out.set("parameter", spec_.parameter);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    summary_kind kind = summary_kind::scalar;
    for (auto k : {summary_kind::scalar, summary_kind::histogram, summary_kind::text, summary_kind::image})
      if (summary_op_name(k) == in.op()) kind = k;
    summary_spec spec{kind, in.text("tag"), in.text("description"), in.integer("parameter", 0, INT32_MAX)};
    if (in.input_count() != 2) in.fail(in.op() + " takes two inputs, a value and a step");
    const node &value = in.input(0), &step = in.input(1);
    if (summary_failure f = check_summary_inputs(spec, value.dtype(), value.shape(), step.dtype(), step.shape()))
      in.fail(f.message);
    in.expect_results({{bool_, shape{}}});
    return std::make_shared<summary_op>(std::move(spec));
  }
  /// What TensorBoard's graph shows of it: its tag.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("tag", spec_.tag);
  }
  static constexpr std::string_view onnx_refusal = "writes a TensorBoard summary; an ONNX model writes no files";

 private:
  summary_spec spec_;
  tensor written_[2];  // false, true: results shared by every run, allocated once
};

}  // namespace kiln::detail
// ----- end kiln/exec/summary_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#include "kiln/kiln.hpp"

namespace kiln::detail {

/// Every special op that a saved function or an ONNX model may meet.
using known_special_ops = boost::mp11::mp_list<read_variable_op, assign_variable_op, print_op, host_callback_op,
                                               cond_op, while_op, random_uniform_op, summary_op, collective_op>;

/// A consumer's table of the known special ops: `Entry::template of<Op>()` for each op
/// of known_special_ops, under each name in `Op::op_names()`. Made on first use.
template <class Entry>
const std::unordered_map<std::string_view, Entry>& special_op_table() {
  static const std::unordered_map<std::string_view, Entry> table = [] {
    std::unordered_map<std::string_view, Entry> t;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          for (std::string_view name : Op::op_names()) t.emplace(name, Entry::template of<Op>());
        });
    return t;
  }();
  return table;
}

/// The entry of the special op named `name` in a consumer's table, or null for an op
/// that known_special_ops does not list.
template <class Entry>
const Entry* special_op_entry(std::string_view name) {
  const auto& table = special_op_table<Entry>();
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace kiln::detail
// ----- end kiln/io/special_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
#include "kiln/kiln.hpp"

namespace kiln::onnx {

/// The newest ONNX operator set the exporter writes, and its default (ONNX 1.23).
inline constexpr std::int64_t newest_opset = 28;
/// The oldest ONNX operator set the exporter writes (ONNX 1.16, onnxruntime 1.17): every
/// operator it uses means the same from here to newest_opset.
inline constexpr std::int64_t oldest_opset = 21;

/// The ONNX IR version that a model of operator set `opset` declares, as ONNX releases
/// pair them (oldest_opset to newest_opset).
/// \code static_assert(kiln::onnx::ir_version_of(21) == 10); \endcode
constexpr std::int64_t ir_version_of(std::int64_t opset) {
  return opset <= 22 ? 10 : opset == 23 ? 11 : opset == 24 ? 12 : opset <= 27 ? 13 : 14;
}

/// How to export: the operator set to write, for consumers older than newest_opset.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::onnx::export_model(f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32)), "f.onnx",
///                          {.opset = kiln::onnx::oldest_opset});
/// \endcode
struct export_options {
  std::int64_t opset = newest_opset;
};

inline ::onnx::TensorProto to_tensor(const tensor& value, const std::string& name = "");

namespace detail {

using kiln::detail::variable_state;
using ::onnx::AttributeProto;
using ::onnx::GraphProto;
using ::onnx::NodeProto;
using ::onnx::TensorProto;

inline TensorProto::DataType element_type(kiln::dtype t) {
  switch (t) {
    case kiln::bool_:
      return TensorProto::BOOL;
    case kiln::int32:
      return TensorProto::INT32;
    case kiln::int64:
      return TensorProto::INT64;
    case kiln::float32:
      return TensorProto::FLOAT;
    case kiln::float64:
      return TensorProto::DOUBLE;
    default:
      return TensorProto::STRING;
  }
}

/// `v`'s dtype and shape as an ONNX value, with `None` dims left unnamed.
inline void set_type(::onnx::ValueInfoProto& v, kiln::dtype t, const kiln::shape& s) {
  auto* tensor_type = v.mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(element_type(t));
  if (!s.has_known_rank()) return;
  auto* dims = tensor_type->mutable_shape();
  for (std::int64_t d : s) {
    auto* dim = dims->add_dim();
    if (d != none) dim->set_dim_value(d);
  }
}

/// A kiln shape or int_list as the int64 list ONNX takes.
template <class Range>
std::vector<std::int64_t> ints(const Range& r) {
  return std::vector<std::int64_t>(r.begin(), r.end());
}

/// The ONNX operator of an op that maps to one (its `onnx_name`, kiln/ops/op.hpp), or
/// "" for an op that the exporter lowers in its own way.
template <class Op>
inline constexpr std::string_view onnx_name_of = [] {
  if constexpr (requires { Op::onnx_name; })
    return std::string_view(Op::onnx_name);
  else
    return std::string_view();
}();

/// Builds one ONNX model from a concrete function: the main graph, and the branch and
/// body graphs of its conditionals and loops, which read the values of the graphs
/// around them by name, as ONNX allows.
class exporter {
 public:
  ::onnx::ModelProto model(const concrete_function& f, std::int64_t opset_version) {
    if (opset_version < oldest_opset || opset_version > newest_opset)
      throw invalid_argument_error("kiln::onnx::export_model: opset " + std::to_string(opset_version) +
                                   " is outside the opsets kiln writes, " + std::to_string(oldest_opset) + " to " +
                                   std::to_string(newest_opset));
    ::onnx::ModelProto m;
    m.set_ir_version(ir_version_of(opset_version));
    m.set_producer_name("kiln");
    m.set_producer_version(std::to_string(KILN_VERSION_MAJOR) + "." + std::to_string(KILN_VERSION_MINOR) + "." +
                           std::to_string(KILN_VERSION_PATCH));
    auto* opset = m.add_opset_import();
    opset->set_domain("");
    opset->set_version(opset_version);
    main_ = m.mutable_graph();
    main_->set_name("kiln_function");

    const kiln::graph& g = f.graph();
    // Inputs are named as the function's arguments (its `arg_names` option, else x0,
    // x1, ...), outputs as kiln names them; every other value after its node, made
    // unique across the model.
    for (int id : g.arguments()) used_.insert(g.node_at(id).name());
    for (int id : g.outputs()) used_.insert(g.node_at(id).name());
    std::vector<std::string> args;
    for (int id : g.arguments()) {
      const node& p = g.node_at(id);
      auto* input = main_->add_input();
      input->set_name(p.name());
      set_type(*input, p.dtype(), p.shape());
      args.push_back(p.name());
    }
    const std::vector<std::string> outputs = emit(*main_, g, args, /*outer_names=*/true);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const node& o = g.node_at(g.outputs()[k]);
      auto* output = main_->add_output();
      output->set_name(outputs[k]);
      set_type(*output, o.dtype(), o.shape());
    }
    return m;
  }

 private:
  GraphProto* main_ = nullptr;
  std::unordered_set<std::string> used_;
  std::unordered_map<const variable_state*, std::string> variables_;

 public:
  // (What a special op's to_onnx, beside the op, builds its nodes with.)
  /// `base`, or `base_1`, `base_2`, ...: the first that no value of the model has.
  std::string fresh(const std::string& base) {
    if (used_.insert(base).second) return base;
    for (int k = 1;; ++k)
      if (std::string name = base + "_" + std::to_string(k); used_.insert(name).second) return name;
  }

  /// A value known when exporting, as an initializer of the main graph (which the
  /// graphs inside it see too).
  std::string constant(const tensor& t, const std::string& base = "const") {
    const std::string name = fresh(base);
    *main_->add_initializer() = to_tensor(t, name);
    return name;
  }
  std::string int64s(std::span<const std::int64_t> values) {
    return constant(kiln::constant(std::vector<std::int64_t>(values.begin(), values.end()),
                                   kiln::shape{std::int64_t(values.size())}));
  }
  std::string int64s(std::initializer_list<std::int64_t> values) {
    return int64s(std::span(values.begin(), values.size()));
  }
  std::string constant_bool(bool v, const std::string& base) { return constant(kiln::constant(v), base); }
  /// Variable `v`'s current value, as one initializer however often it is read.
  std::string variable(const std::shared_ptr<variable_state>& v) {
    auto [it, fresh_variable] = variables_.emplace(v.get(), std::string());
    if (fresh_variable) it->second = constant(v->read(), v->name());
    return it->second;
  }
  static void set_type(::onnx::ValueInfoProto& v, kiln::dtype t, const kiln::shape& s) { detail::set_type(v, t, s); }

  /// Adds node `op_type` to `g`, with `outputs` outputs named after `output_base`.
  NodeProto& add(GraphProto& g, std::string_view op_type, std::vector<std::string> inputs,
                 const std::string& output_base, int outputs = 1) {
    NodeProto& n = *g.add_node();
    n.set_op_type(std::string(op_type));
    n.set_name(fresh(output_base + "/" + std::string(op_type)));
    for (std::string& in : inputs) n.add_input(std::move(in));
    for (int k = 0; k < outputs; ++k) n.add_output(fresh(output_base));
    return n;
  }
  /// Adds node `op_type` to `g` and returns its one output.
  std::string value(GraphProto& g, std::string_view op_type, std::vector<std::string> inputs,
                    const std::string& output_base) {
    return add(g, op_type, std::move(inputs), output_base).output(0);
  }
  static void attribute(NodeProto& n, const std::string& name, std::int64_t v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::INT);
    a.set_i(v);
  }
  static void attribute(NodeProto& n, const std::string& name, float v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::FLOAT);
    a.set_f(v);
  }
  static void attribute(NodeProto& n, const std::string& name, std::span<const std::int64_t> v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::INTS);
    for (std::int64_t x : v) a.add_ints(x);
  }
  static void attribute(NodeProto& n, const std::string& name, const std::string& v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::STRING);
    a.set_s(v);
  }
  static GraphProto& graph_attribute(NodeProto& n, const std::string& name) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::GRAPH);
    GraphProto& g = *a.mutable_g();
    g.set_name(n.name() + "/" + name);
    return g;
  }
  std::string cast(GraphProto& g, const std::string& x, kiln::dtype to, const std::string& base) {
    NodeProto& n = add(g, "Cast", {x}, base);
    attribute(n, "to", std::int64_t(element_type(to)));
    return n.output(0);
  }

  [[noreturn]] static void unavailable(const node& n, const std::string& why) {
    const std::string op = n.name() == n.op() ? "" : " (" + std::string(n.op()) + ")";
    throw unavailable_error("kiln::onnx::export_model: node " + n.name() + op + " " + why);
  }

  /// Emits the nodes of `kg` into `g`, its arguments being the values `args`; returns
  /// the names of its outputs. The main graph's outputs keep kiln's names
  /// (`outer_names`); a branch's or body's are fresh.
  std::vector<std::string> emit(GraphProto& g, const kiln::graph& kg, const std::vector<std::string>& args,
                                bool outer_names = false) {
    std::vector<std::string> names(kg.nodes().size());
    for (std::size_t k = 0; k < args.size(); ++k) names[std::size_t(kg.arguments()[k])] = args[k];
    for (std::size_t id = 0; id < kg.nodes().size(); ++id) {
      const node& n = kg.nodes()[id];
      std::vector<std::string> in;
      for (int i : n.input_ids()) {
        if (names[std::size_t(i)].empty()) unavailable(n, "reads a value that has no ONNX counterpart");
        in.push_back(names[std::size_t(i)]);
      }
      switch (n.kind()) {
        case node_kind::placeholder:
        case node_kind::result:  // named by its special node
          break;
        case node_kind::constant:
          names[id] = constant(n.value(), n.name());
          break;
        case node_kind::identity: {
          NodeProto& out = add(g, "Identity", in, n.name());
          if (outer_names) out.set_output(0, n.name());
          names[id] = out.output(0);
          break;
        }
        case node_kind::op:
          names[id] = ops::visit([&](const auto& op) { return emit_op(g, op, n, kg, in); }, n.operation());
          break;
        case node_kind::special: {
          std::vector<std::string> results = emit_special(g, n, kg, in);
          for (std::size_t k = 0; k < results.size(); ++k) names[id + k] = std::move(results[k]);
          break;
        }
      }
    }
    std::vector<std::string> outputs;
    for (int id : kg.outputs()) outputs.push_back(names[std::size_t(id)]);
    return outputs;
  }

  template <class Op>
  std::string emit_op(GraphProto& g, const Op& op, const node& n, const kiln::graph& kg,
                      const std::vector<std::string>& in) {
    const std::string& base = n.name();
    const auto input = [&](std::size_t k) -> const node& { return kg.node_at(n.input_ids()[k]); };
    const kiln::dtype type = input(0).dtype();
    if constexpr (std::is_same_v<Op, ops::add>) {
      return value(g, type == kiln::string ? "StringConcat" : "Add", in, base);
    } else if constexpr (std::is_same_v<Op, ops::relu>) {
      if (is_floating(type)) return value(g, "Relu", in, base);
      return value(g, "Max", {in[0], constant(kiln::zeros({}, type))}, base);
    } else if constexpr (std::is_same_v<Op, ops::relu_grad>) {  // Where(y > 0, dy, 0)
      const std::string zero = constant(kiln::zeros({}, type));
      return value(g, "Where", {value(g, "Greater", {in[0], zero}, base), in[1], zero}, base);
    } else if constexpr (std::is_same_v<Op, ops::gelu>) {
      NodeProto& r = add(g, "Gelu", in, base);
      if (op.approximate) attribute(r, "approximate", std::string("tanh"));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::elu> || std::is_same_v<Op, ops::leaky_relu>) {
      NodeProto& r = add(g, std::is_same_v<Op, ops::elu> ? "Elu" : "LeakyRelu", in, base);
      attribute(r, "alpha", float(op.alpha));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::silu>) {  // ONNX's Swish is newer than oldest_opset
      return value(g, "Mul", {in[0], value(g, "Sigmoid", in, base)}, base);
    } else if constexpr (std::is_same_v<Op, ops::square>) {
      return value(g, "Mul", {in[0], in[0]}, base);
    } else if constexpr (std::is_same_v<Op, ops::not_equal>) {
      return value(g, "Not", {value(g, "Equal", in, base)}, base);
    } else if constexpr (std::is_same_v<Op, ops::cast>) {
      return cast(g, in[0], op.to, base);
    } else if constexpr (std::is_same_v<Op, ops::divide>) {
      if (is_floating(type)) return value(g, "Div", in, base);
      // Integers divide as float64, as TensorFlow's `/`.
      return value(g, "Div", {cast(g, in[0], float64, base), cast(g, in[1], float64, base)}, base);
    } else if constexpr (std::is_same_v<Op, ops::floordiv>) {
      if (is_floating(type)) return value(g, "Floor", {value(g, "Div", in, base)}, base);
      // a - floormod(a, b) is a multiple of b, so ONNX's truncating Div is exact on it.
      NodeProto& mod = add(g, "Mod", in, base);
      attribute(mod, "fmod", std::int64_t(0));
      return value(g, "Div", {value(g, "Sub", {in[0], mod.output(0)}, base), in[1]}, base);
    } else if constexpr (std::is_same_v<Op, ops::floormod>) {
      NodeProto& mod = add(g, "Mod", in, base);
      if (!is_floating(type)) {
        attribute(mod, "fmod", std::int64_t(0));  // integers: the divisor's sign, as floormod
        return mod.output(0);
      }
      // fmod, then moved into the divisor's sign, as kiln's floormod computes it.
      attribute(mod, "fmod", std::int64_t(1));
      const std::string r = mod.output(0), zero = constant(kiln::zeros({}, type));
      const std::string nonzero = value(g, "Not", {value(g, "Equal", {r, zero}, base)}, base);
      const std::string signs_differ =
          value(g, "Xor", {value(g, "Less", {r, zero}, base), value(g, "Less", {in[1], zero}, base)}, base);
      return value(g, "Where", {value(g, "And", {nonzero, signs_differ}, base), value(g, "Add", {r, in[1]}, base), r},
                   base);
    } else if constexpr (!onnx_name_of<Op>.empty() && (std::is_base_of_v<ops::reduction_op, Op>)) {
      NodeProto& r = add(g, onnx_name_of<Op>, {in[0]}, base);
      if (!op.axis.all()) r.add_input(int64s(ints(op.axis.list())));
      attribute(r, "keepdims", std::int64_t(op.keepdims));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::argmax>) {
      return argmax(g, op, n, input(0), in[0]);
    } else if constexpr (std::is_same_v<Op, ops::gather> || std::is_same_v<Op, ops::concat>) {
      NodeProto& c = add(g, onnx_name_of<Op>, in, base);
      attribute(c, "axis", op.axis);
      return c.output(0);
    } else if constexpr (!onnx_name_of<Op>.empty()) {
      return value(g, onnx_name_of<Op>, in, base);
    } else if constexpr (std::is_same_v<Op, ops::reshape>) {
      NodeProto& r = add(g, "Reshape", {in[0], int64s(ints(op.new_shape))}, base);
      // A 0 in kiln's shape is an empty dim, not ONNX's "copy the input's dim".
      bool has_zero = false;
      for (std::int64_t d : op.new_shape) has_zero = has_zero || d == 0;
      if (has_zero) attribute(r, "allowzero", std::int64_t(1));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::transpose>) {
      NodeProto& t = add(g, "Transpose", in, base);
      if (!op.perm.empty()) attribute(t, "perm", ints(op.perm));
      return t.output(0);
    } else if constexpr (std::is_same_v<Op, ops::stack>) {
      const std::string axis = int64s({op.axis});
      std::vector<std::string> rows;
      for (const std::string& x : in) rows.push_back(value(g, "Unsqueeze", {x, axis}, base));
      NodeProto& c = add(g, "Concat", rows, base);
      attribute(c, "axis", op.axis);
      return c.output(0);
    } else if constexpr (std::is_same_v<Op, ops::index>) {
      NodeProto& r = add(g, "Gather", {in[0], constant(kiln::constant(op.i))}, base);
      attribute(r, "axis", std::int64_t(0));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::slice>) {
      std::vector<std::int64_t> ends, axes;
      for (int d = 0; d < op.begin.size(); ++d) {
        ends.push_back(op.size[d] == -1 ? std::numeric_limits<std::int64_t>::max() : op.begin[d] + op.size[d]);
        axes.push_back(d);
      }
      return value(g, "Slice", {in[0], int64s(ints(op.begin)), int64s(ends), int64s(axes)}, base);
    } else if constexpr (std::is_same_v<Op, ops::shape_of>) {
      return cast(g, value(g, "Shape", in, base), int32, base);
    } else if constexpr (std::is_same_v<Op, ops::set_item>) {
      // ScatterND with one index [[i]] and one update, the new row.
      const std::string i = input(1).dtype() == int64 ? in[1] : cast(g, in[1], int64, base);
      const std::string index = value(g, "Reshape", {i, int64s({1, 1})}, base);
      const std::string row = value(g, "Unsqueeze", {in[2], int64s({0})}, base);
      return value(g, "ScatterND", {in[0], index, row}, base);
    } else if constexpr (std::is_same_v<Op, ops::pad_rows>) {
      // Pads the first dim at its end with max(rows - dim 0, 0) rows of zeros.
      const std::string rows = input(1).dtype() == int64 ? in[1] : cast(g, in[1], int64, base);
      const std::string first = value(g, "Slice", {value(g, "Shape", {in[0]}, base), int64s({0}), int64s({1})}, base);
      const std::string missing =
          value(g, "Max", {value(g, "Sub", {value(g, "Reshape", {rows, int64s({1})}, base), first}, base), int64s({0})},
                base);
      NodeProto& pads = add(g, "Concat", {int64s({0}), missing}, base);
      attribute(pads, "axis", std::int64_t(0));
      return value(g, "Pad", {in[0], pads.output(0), "", int64s({0})}, base);
    } else if constexpr (std::is_same_v<Op, ops::crop_or_pad>) {
      // The window [start, start + like's dims) of x, where start = offset + align *
      // (x's dims - like's): x padded with the zeros the window needs before and
      // after it, then sliced.
      const std::string x_dims = value(g, "Shape", {in[0]}, base), out_dims = value(g, "Shape", {in[1]}, base);
      const std::string spare = value(g, "Sub", {x_dims, out_dims}, base);
      const std::string moved = value(g, "Mul", {int64s(ints(op.align)), spare}, base);
      const std::string start = value(g, "Add", {int64s(ints(op.offset)), moved}, base);
      const std::string before = value(g, "Max", {value(g, "Neg", {start}, base), int64s({0})}, base);
      const std::string end = value(g, "Add", {start, out_dims}, base);
      const std::string after = value(g, "Max", {value(g, "Sub", {end, x_dims}, base), int64s({0})}, base);
      NodeProto& pads = add(g, "Concat", {before, after}, base);
      attribute(pads, "axis", std::int64_t(0));
      const std::string padded = value(g, "Pad", {in[0], pads.output(0)}, base);
      const std::string from = value(g, "Add", {start, before}, base), to = value(g, "Add", {end, before}, base);
      return value(g, "Slice", {padded, from, to}, base);
    } else if constexpr (std::is_same_v<Op, ops::unsorted_segment_sum>) {
      return segment_sum(g, op, n, input(0), input(1), in);
    } else if constexpr (std::is_same_v<Op, ops::conv2d>) {
      if (!is_floating(type))
        unavailable(n, "convolves " + std::string(name(type)) + " values; ONNX's Conv takes floats");
      // ONNX convolves NCHW inputs with OIHW filters; kiln's are NHWC and HWIO.
      NodeProto& x = add(g, "Transpose", {in[0]}, base);
      attribute(x, "perm", std::vector<std::int64_t>{0, 3, 1, 2});
      NodeProto& w = add(g, "Transpose", {in[1]}, base);
      attribute(w, "perm", std::vector<std::int64_t>{3, 2, 0, 1});
      NodeProto& c = add(g, "Conv", {x.output(0), w.output(0)}, base);
      attribute(c, "strides", std::vector<std::int64_t>{op.stride_h, op.stride_w});
      // SAME pads the odd element at the end, as TensorFlow does: SAME_UPPER.
      attribute(c, "auto_pad", std::string(op.pad == ops::padding::same ? "SAME_UPPER" : "VALID"));
      NodeProto& y = add(g, "Transpose", {c.output(0)}, base);
      attribute(y, "perm", std::vector<std::int64_t>{0, 2, 3, 1});
      return y.output(0);
    } else if constexpr (std::is_same_v<Op, ops::max_pool> || std::is_same_v<Op, ops::avg_pool>) {
      // NCHW as Conv; SAME_UPPER as conv2d, and an average over the elements inside
      // the image only (count_include_pad 0), as TensorFlow's AvgPool.
      constexpr bool average = std::is_same_v<Op, ops::avg_pool>;
      NodeProto& x = add(g, "Transpose", {in[0]}, base);
      attribute(x, "perm", std::vector<std::int64_t>{0, 3, 1, 2});
      NodeProto& p = add(g, average ? "AveragePool" : "MaxPool", {x.output(0)}, base);
      attribute(p, "kernel_shape", std::vector<std::int64_t>{op.window_h, op.window_w});
      attribute(p, "strides", std::vector<std::int64_t>{op.stride_h, op.stride_w});
      attribute(p, "auto_pad", std::string(op.pad == ops::padding::same ? "SAME_UPPER" : "VALID"));
      if constexpr (average) attribute(p, "count_include_pad", std::int64_t(0));
      NodeProto& y = add(g, "Transpose", {p.output(0)}, base);
      attribute(y, "perm", std::vector<std::int64_t>{0, 2, 3, 1});
      return y.output(0);
    } else {
      unavailable(n, "has no ONNX operator");
    }
  }

  std::string argmax(GraphProto& g, const ops::argmax& op, const node& n, const node& x, const std::string& in) {
    const std::string& base = n.name();
    if (!op.axis.all() && op.axis.list().size() == 1) {
      NodeProto& a = add(g, "ArgMax", {in}, base);
      attribute(a, "axis", op.axis.list()[0]);
      attribute(a, "keepdims", std::int64_t(op.keepdims));
      return a.output(0);
    }
    if (!op.axis.all() && !(x.shape().has_known_rank() && op.axis.list().size() == x.shape().rank()))
      unavailable(n, "reduces " + op.axis.list().str() + "; ONNX's ArgMax reduces one axis or all");
    // Over every element: ArgMax of the flattened input, in row-major order as kiln counts.
    NodeProto& a = add(g, "ArgMax", {value(g, "Reshape", {in, int64s({-1})}, base)}, base);
    attribute(a, "axis", std::int64_t(0));
    attribute(a, "keepdims", std::int64_t(0));
    if (!op.keepdims) return a.output(0);
    if (!x.shape().has_known_rank()) unavailable(n, "keeps the dims of an input whose rank is unknown");
    return value(g, "Reshape", {a.output(0), int64s(std::vector<std::int64_t>(std::size_t(x.shape().rank()), 1))},
                 base);
  }

  /// ScatterND adding the slices of `data` into zeros, one row per segment and one more
  /// that the negative ids (which kiln drops) go to, sliced off at the end. The dims the
  /// ids index move to the front first, and the segments' dim to `axis` after.
  std::string segment_sum(GraphProto& g, const ops::unsorted_segment_sum& op, const node& n, const node& data,
                          const node& ids, const std::vector<std::string>& in) {
    const std::string& base = n.name();
    if (!data.shape().has_known_rank() || !ids.shape().has_known_rank())
      unavailable(n, "has inputs of unknown rank, which ONNX's ScatterND needs");
    const std::int64_t rank = data.shape().rank(), id_rank = ids.shape().rank(), axis = op.axis;
    std::vector<std::int64_t> to_front, to_axis;
    for (std::int64_t d = axis; d < axis + id_rank; ++d) to_front.push_back(d);
    for (std::int64_t d = 0; d < rank; ++d)
      if (d < axis || d >= axis + id_rank) to_front.push_back(d);
    for (std::int64_t d = 1; d <= axis; ++d) to_axis.push_back(d);
    to_axis.push_back(0);
    for (std::int64_t d = axis + 1; d < rank - id_rank + 1; ++d) to_axis.push_back(d);

    NodeProto& moved = add(g, "Transpose", {in[0]}, base);
    attribute(moved, "perm", to_front);
    const std::string segments = constant(kiln::constant(op.num_segments), base + "/segments");
    const std::string id = ids.dtype() == int64 ? in[1] : cast(g, in[1], int64, base);
    const std::string zero = constant(kiln::constant(std::int64_t(0)));
    const std::string kept = value(g, "Where", {value(g, "Less", {id, zero}, base), segments, id}, base);
    const std::string indices = value(g, "Unsqueeze", {kept, int64s({-1})}, base);
    // Zeros of shape (num_segments + 1,) + the dims of data that the ids do not index.
    NodeProto& rest = add(g, "Shape", {moved.output(0)}, base);
    attribute(rest, "start", id_rank);
    NodeProto& dims = add(g, "Concat", {int64s({op.num_segments + 1}), rest.output(0)}, base);
    attribute(dims, "axis", std::int64_t(0));
    NodeProto& zeros = add(g, "ConstantOfShape", {dims.output(0)}, base);
    AttributeProto& fill = *zeros.add_attribute();
    fill.set_name("value");
    fill.set_type(AttributeProto::TENSOR);
    *fill.mutable_t() = to_tensor(kiln::zeros({1}, data.dtype()));
    NodeProto& sums = add(g, "ScatterND", {zeros.output(0), indices, moved.output(0)}, base);
    attribute(sums, "reduction", std::string("add"));
    const std::string kept_sums =
        value(g, "Slice", {sums.output(0), int64s({0}), int64s({op.num_segments}), int64s({0})}, base);
    NodeProto& result = add(g, "Transpose", {kept_sums}, base);
    attribute(result, "perm", to_axis);
    return result.output(0);
  }

  /// How the exporter reaches a special op (an entry of detail::special_op_table): its
  /// `to_onnx`, or why ONNX cannot express it.
  struct special_lowering {
    /// Whether `op` is this op (another kind of special op may take the same name).
    bool (*is)(const special_op& op) = nullptr;
    /// The op's nodes, and the names of its results.
    std::vector<std::string> (*lower)(exporter& e, GraphProto& g, const node& n, const kiln::graph& kg,
                                      const std::vector<std::string>& in) = nullptr;
    std::string_view refusal;  ///< the op's `onnx_refusal`, or empty

    template <class Op>
    static special_lowering of() {
      special_lowering l;
      l.is = [](const special_op& op) { return op.as<Op>() != nullptr; };
      if constexpr (requires { Op::onnx_refusal; }) {
        l.refusal = Op::onnx_refusal;
      } else if constexpr (requires { &Op::template to_onnx<exporter, GraphProto>; }) {
        l.lower = [](exporter& e, GraphProto& g, const node& n, const kiln::graph& kg,
                     const std::vector<std::string>& in) { return n.special().as<Op>()->to_onnx(e, g, n, kg, in); };
      }
      return l;
    }
  };

  // The op's own to_onnx, found by its name (kiln/io/special_ops.hpp).
  std::vector<std::string> emit_special(GraphProto& g, const node& n, const kiln::graph& kg,
                                        const std::vector<std::string>& in) {
    const special_lowering* entry = kiln::detail::special_op_entry<special_lowering>(n.special().name());
    if (!entry || !entry->is(n.special())) unavailable(n, "has no ONNX operator");
    if (!entry->refusal.empty()) unavailable(n, std::string(entry->refusal));
    if (!entry->lower) unavailable(n, "has no ONNX operator");
    return entry->lower(*this, g, n, kg, in);
  }

  /// A branch of `If`: its arguments are the captures `picks` of the `cond` node.
  void branch(GraphProto& b, const kiln::graph& kg, const std::vector<int>& picks, const std::vector<std::string>& in) {
    std::vector<std::string> args;
    for (int k : picks) args.push_back(in[std::size_t(k) + 1]);
    const std::vector<std::string> outputs = emit(b, kg, args);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const node& o = kg.node_at(kg.outputs()[k]);
      auto* out = b.add_output();
      out->set_name(outputs[k]);
      set_type(*out, o.dtype(), o.shape());
    }
  }
};

}  // namespace detail

/// `value` as an ONNX tensor named `name` (an initializer, or test data in ONNX's
/// `input_0.pb` layout): numbers as raw little-endian bytes, strings one by one.
/// \code ::onnx::TensorProto p = kiln::onnx::to_tensor(kiln::constant({1.f, 2.f}), "x"); \endcode
inline ::onnx::TensorProto to_tensor(const tensor& value, const std::string& name) {
  const tensor t = value.device() == device::cpu ? value : value.to(device::cpu);
  ::onnx::TensorProto p;
  p.set_name(name);
  p.set_data_type(detail::element_type(t.dtype()));
  for (std::int64_t d : t.shape()) p.add_dims(d);
  if (t.dtype() == kiln::string) {
    for (const std::string& s : t.to_vector<std::string>()) p.add_string_data(s);
  } else {
    p.set_raw_data(static_cast<const char*>(t.raw_data()), std::size_t(t.size()) * std::size_t(size_of(t.dtype())));
  }
  return p;
}

/// `f`'s graph as an ONNX model (of `options.opset`, newest_opset unless told), its
/// variables' current values as initializers. Raises kiln::unavailable_error naming the
/// first node that ONNX cannot express, kiln::invalid_argument_error for an opset outside
/// oldest_opset to newest_opset.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return kiln::tanh(x) * 2; });
/// ::onnx::ModelProto m = kiln::onnx::to_model(f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32)));
/// \endcode
inline ::onnx::ModelProto to_model(const concrete_function& f, const export_options& options = {}) {
  return detail::exporter().model(f, options.opset);
}

/// Writes `f` as an ONNX model to `path` (see to_model).
/// \code
/// kiln::function f([](const kiln::tensor& x) { return kiln::tanh(x) * 2; });
/// kiln::onnx::export_model(f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32)), "f.onnx");
/// \endcode
inline void export_model(const concrete_function& f, const std::filesystem::path& path,
                         const export_options& options = {}) {
  const ::onnx::ModelProto m = to_model(f, options);
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  if (!os || !m.SerializeToOstream(&os))
    throw invalid_argument_error("kiln::onnx::export_model: cannot write " + path.string());
}

}  // namespace kiln::onnx
// ----- end kiln/onnx.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_ONNX_HPP

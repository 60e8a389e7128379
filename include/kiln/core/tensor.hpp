#pragma once
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

#include "kiln/config.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/storage.hpp"

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
  KILN_LIBRARY_INLINE tensor to(kiln::device d) const;

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
  tensor share(const kiln::shape& s, std::int64_t offset = 0) const& {
    tensor t = *this;
    return std::move(t).share(s, offset);
  }
  /// The same, taking this tensor's hold on the buffer (no count to change: a loop
  /// that grows an array by a row per iteration reshapes it each time).
  tensor share(const kiln::shape& s, std::int64_t offset = 0) && {
    shape_ = s;
    offset_ += offset;
    return std::move(*this);
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

#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE tensor tensor::to(kiln::device d) const {
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
#endif

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

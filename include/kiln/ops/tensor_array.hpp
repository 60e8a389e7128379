#pragma once
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

#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/shape_ops.hpp"

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
  KILN_LIBRARY_INLINE tensor_array(kiln::dtype type, std::int64_t size, tensor_array_options options = {});
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
  KILN_LIBRARY_INLINE tensor stack() const;

  /// The number of elements, when it is known without running a graph: it is not
  /// for a size given as a symbolic tensor, nor inside a function after a write to
  /// an array with dynamic_size; then kiln::value_error, and size_tensor() tells it.
  /// \code kiln::tensor_array(kiln::float32, 10).size() == 10; \endcode
  KILN_LIBRARY_INLINE std::int64_t size() const;
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
  KILN_LIBRARY_INLINE bool unwritten() const;

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
  KILN_LIBRARY_INLINE tensor_array with_elements(tensor elements) const;
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
  KILN_LIBRARY_INLINE shape element_shape() const;
  // An eager index past the end of an array of known size (a write only when it cannot
  // grow): out_of_range_error with TensorFlow's message. A symbolic index is checked
  // by gather and set_item when the graph runs.
  KILN_LIBRARY_INLINE void check_eager_index(const tensor& i, bool writing) const;
  // An array of size 0 stacks to an empty tensor even though nothing was written.
  KILN_LIBRARY_INLINE void require_written(const char* what) const;

  kiln::dtype type_;
  std::int64_t size_;  ///< kiln::none when known only when the graph runs
  bool dynamic_size_;
  tensor size_tensor_;  ///< the symbolic size of an unwritten array whose size_ is none
  tensor elements_;
};

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE tensor_array::tensor_array(kiln::dtype type, std::int64_t size, tensor_array_options options)
    : type_(type), size_(size), dynamic_size_(options.dynamic_size), elements_(kiln::zeros({0}, type)) {
  if (size < 0)
    throw invalid_argument_error("tensor_array: the size must not be negative, got " + std::to_string(size));
}

KILN_LIBRARY_INLINE tensor tensor_array::stack() const {
  require_written("stack");
  return elements_;
}

KILN_LIBRARY_INLINE std::int64_t tensor_array::size() const {
  if (size_ == none)
    throw value_error("tensor_array.size: the number of elements is known only when the graph runs; use size_tensor()");
  return size_;
}

KILN_LIBRARY_INLINE bool tensor_array::unwritten() const {
  return (size_ != 0 || dynamic_size_) && elements_.rank() == 1 && elements_.shape()[0] == 0;
}

KILN_LIBRARY_INLINE tensor_array tensor_array::with_elements(tensor elements) const {
  tensor_array out = *this;
  out.elements_ = std::move(elements);
  if (!out.unwritten()) {
    out.size_ = out.elements_.shape()[0];
    out.size_tensor_ = tensor();
  }
  return out;
}

KILN_LIBRARY_INLINE shape tensor_array::element_shape() const { return shape(elements_.shape().dims().subspan(1)); }

KILN_LIBRARY_INLINE void tensor_array::check_eager_index(const tensor& i, bool writing) const {
  if (detail::tracing() || i.is_symbolic() || size_ == none || i.rank() != 0 ||
      (i.dtype() != int32 && i.dtype() != int64))
    return;
  const std::int64_t index = ops::scalar_index(i);
  if (index >= 0 && (index < size_ || (writing && dynamic_size_))) return;
  throw out_of_range_error(writing ? "tensor_array.write: Tried to write to index " + std::to_string(index) +
                                         " but array is not resizeable and size is: " + std::to_string(size_)
                                   : "tensor_array.read: Tried to read from index " + std::to_string(index) +
                                         " but array size is: " + std::to_string(size_));
}

KILN_LIBRARY_INLINE void tensor_array::require_written(const char* what) const {
  if (unwritten() && size_ != 0)
    throw value_error(std::string("tensor_array.") + what + ": no element of this array of size " +
                      (size_ == none ? std::string("None") : std::to_string(size_)) +
                      " was written, so its element shape is unknown");
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

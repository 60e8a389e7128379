#pragma once
/// \file
/// `kiln::tensor_array`: a fixed number of tensors of one dtype and shape, written
/// one at a time, usually in a loop, and stacked at the end (TensorFlow's
/// TensorArray). It is a value: `write` returns the updated array and leaves the
/// one it was called on as it was, so that it can be a loop variable. It holds one
/// tensor of shape `(size,) + element shape`, created at the first write, whose
/// value gives the element shape; until then it holds an empty `(0,)` tensor.

#include <concepts>
#include <cstdint>
#include <string>

#include "kiln/ops/factories.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln {

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
  tensor_array(kiln::dtype type, std::int64_t size) : type_(type), size_(size), elements_(kiln::zeros({0}, type)) {
    if (size < 0) throw invalid_argument_error("tensor_array: the size must not be negative, got " + std::to_string(size));
  }

  /// The array with element `i` (an int32 or int64 scalar, or a C++ integer) set to
  /// `value`, which must have the array's dtype and the shape of earlier writes.
  /// \code states = states.write(i, state); \endcode
  tensor_array write(const tensor& i, const tensor& value) const {
    if (value.dtype() != type_)
      throw type_error("tensor_array.write: the array holds " + std::string(name(type_)) + " elements, got a " +
                       std::string(name(value.dtype())) + " value");
    tensor_array out = *this;
    if (unwritten()) {
      shape full{size_};
      for (std::int64_t d : value.shape()) full.push_back(d);
      out.elements_ = kiln::zeros(full, type_, value.device());
    } else if (value.shape() != element_shape()) {
      throw value_error("tensor_array.write: the array holds elements of shape " + element_shape().str() +
                        ", got a value of shape " + value.shape().str());
    }
    out.elements_ = kiln::set_item(out.elements_, i, value);
    return out;
  }
  template <std::integral I>
  tensor_array write(I i, const tensor& value) const {
    return write(kiln::constant(std::int64_t(i)), value);
  }

  /// Element `i` (an int32 or int64 scalar, or a C++ integer); an element not yet
  /// written reads as zeros.
  /// \code tensor last = states.read(states.size() - 1); \endcode
  tensor read(const tensor& i) const {
    require_written("read");
    return kiln::gather(elements_, i);
  }
  template <std::integral I>
  tensor read(I i) const {
    return read(kiln::constant(std::int64_t(i)));
  }

  /// All elements in one tensor of shape `(size,) + element shape`.
  /// \code tensor all = states.stack(); \endcode
  tensor stack() const {
    require_written("stack");
    return elements_;
  }

  /// The number of elements.
  /// \code states.size() == 10; \endcode
  std::int64_t size() const { return size_; }
  /// The elements' dtype.
  /// \code states.dtype() == kiln::float32; \endcode
  kiln::dtype dtype() const { return type_; }

  /// Whether no element has been written yet (so the element shape is not known).
  /// \code kiln::tensor_array(kiln::int32, 2).unwritten() == true; \endcode
  bool unwritten() const { return size_ > 0 && elements_.rank() == 1 && elements_.shape()[0] == 0; }

  /// The tensor that holds the elements: how loops and functions carry the array.
  /// \code const kiln::tensor& t = states.elements(); \endcode
  const tensor& elements() const { return elements_; }
  /// The same array holding `elements` instead (of the same dtype and size).
  /// \code auto next = states.with_elements(t); \endcode
  tensor_array with_elements(tensor elements) const {
    tensor_array out = *this;
    out.elements_ = std::move(elements);
    return out;
  }

 private:
  shape element_shape() const { return shape(elements_.shape().dims().subspan(1)); }
  void require_written(const char* what) const {
    if (unwritten())
      throw value_error(std::string("tensor_array.") + what + ": no element of this array of size " +
                        std::to_string(size_) + " was written, so its element shape is unknown");
  }

  kiln::dtype type_;
  std::int64_t size_;
  tensor elements_;
};

}  // namespace kiln

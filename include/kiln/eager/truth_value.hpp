#pragma once
/// \file
/// `kiln::tensor::operator bool`: the truth value of an eager tensor, as Python's
/// `bool(t)` gives it for an eager `tf.Tensor`, and the error that tells a C++ `if`
/// on a symbolic tensor apart from a graph condition.

#include <string>
#include <type_traits>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

/// The truth of a one-element tensor: a bool's value, a number other than zero, a
/// string that is not empty. A symbolic tensor has no value to test: a C++ `if` or
/// `while` on one raises kiln::type_error pointing to kiln::cond and kiln::while_loop;
/// more than one element (or none) raises kiln::value_error.
/// \code if (kiln::constant(3) > 2) std::cout << "more\n";  // eager: reads the value \endcode
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE tensor::operator bool() const {
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
#endif  // KILN_DEFINE_LIBRARY

}  // namespace kiln


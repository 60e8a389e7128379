#pragma once
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

}  // namespace kiln

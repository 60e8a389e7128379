#pragma once
/// \file
/// The exception hierarchy: one kind per class of TensorFlow error, all derived from kiln::error.

#include <stdexcept>
#include <string>

#include "kiln/config.hpp"

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
[[noreturn]] KILN_LIBRARY_INLINE void rethrow_with_prefix(const std::string& prefix);
#if KILN_DEFINE_LIBRARY
[[noreturn]] KILN_LIBRARY_INLINE void rethrow_with_prefix(const std::string& prefix) {
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
#endif
}  // namespace detail

}  // namespace kiln

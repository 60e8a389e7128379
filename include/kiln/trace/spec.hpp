#pragma once
/// \file
/// `kiln::tensor_spec`: an argument described by dtype and (possibly partial) shape.

#include <ostream>
#include <string>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"

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

}  // namespace kiln

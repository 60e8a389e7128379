#pragma once
/// \file
/// `kiln::tensor_spec`: an argument described by dtype and (possibly partial) shape.

#include <ostream>
#include <sstream>
#include <string>
#include <vector>

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

namespace detail {
/// What a trace was made for, in both tiers, kept in parts: its text is written only
/// where a program shows it (pretty_printed_concrete_signatures, a concrete function
/// printed), so a file that never shows a signature does not compile the writing.
struct trace_signature {
  std::string name;
  std::vector<std::string> arg_names;
  std::vector<std::string> bound_text;  ///< per argument: its bound C++ value's text, or empty
  std::vector<tensor_spec> inputs;      ///< one per tensor argument (leaf), named
  std::vector<tensor_spec> outputs;     ///< none for a function that returns nothing

  /// `double(a)` or `pow(a, b=2)`.
  std::string header() const {
    std::string s = name + "(";
    for (std::size_t i = 0; i < arg_names.size(); ++i) {
      if (i) s += ", ";
      s += arg_names[i];
      if (i < bound_text.size() && !bound_text[i].empty()) s += "=" + bound_text[i];
    }
    return s + ")";
  }
  /// The header with the Args/Returns block, as TensorFlow prints a signature.
  std::string signature_text() const {
    std::ostringstream os;
    os << header() << "\n";
    if (!inputs.empty()) os << "  Args:\n";
    for (const tensor_spec& in : inputs) os << "    " << in.name << ": " << signature_entry(in.dtype, in.shape) << "\n";
    os << "  Returns:\n";
    if (outputs.empty()) os << "    None\n";
    for (const tensor_spec& out : outputs) os << "    " << signature_entry(out.dtype, out.shape) << "\n";
    return os.str();
  }
};
}  // namespace detail

}  // namespace kiln

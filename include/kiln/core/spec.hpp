#pragma once
/// \file
/// `kiln::tensor_spec`: an argument described by dtype and (possibly partial) shape.

#include <concepts>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

namespace detail {
/// "float32 Tensor, shape=(2, 3)": a value of dtype `t` and shape `s` as a function's
/// signature shows it.
KILN_COLD KILN_LIBRARY_INLINE std::string signature_entry(dtype t, const shape& s);
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
  KILN_LIBRARY_INLINE bool accepts(kiln::dtype t, const kiln::shape& s) const;
  bool operator==(const tensor_spec&) const = default;

  /// TensorFlow's text: `TensorSpec(shape=(None,), dtype=tf.int32, name=None)`.
  KILN_LIBRARY_INLINE std::string str() const;
};

KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor_spec& s);

namespace detail {
/// Writes a nested structure as TensorFlow's signatures show it, its leaves numbered
/// in order: `(<1>, (<2>, <3>))`, `[<1>, <2>]`, `(<1>,)`.
/// \code
/// kiln::detail::structure_text s;
/// s.open(false); s.leaf(); s.next(); s.leaf(); s.close(false, 2);  // s.text == "(<1>, <2>)"
/// \endcode
struct structure_text {
  std::string text;
  int leaves = 0;
  KILN_LIBRARY_INLINE void leaf();
  /// A tuple `(`, or a list `[`.
  KILN_LIBRARY_INLINE void open(bool list);
  KILN_LIBRARY_INLINE void next();
  /// Closes what open() opened, around `count` elements (a tuple of one is `(<1>,)`).
  KILN_LIBRARY_INLINE void close(bool list, std::size_t count);
};

/// What a trace was made for, in both tiers, kept in parts: its text is written only
/// where a program shows it (pretty_printed_concrete_signatures, a concrete function
/// printed), so a file that never shows a signature does not compile the writing.
struct trace_signature {
  std::string name;
  std::vector<std::string> arg_names;
  std::vector<std::string> bound_text;  ///< per argument: its bound C++ value's text, or empty
  /// Per argument: the structure of its tensors (`(<1>, <2>)`), empty for one tensor or none.
  std::vector<std::string> arg_structure;
  std::vector<tensor_spec> inputs;      ///< one per tensor argument (leaf), named
  std::vector<int> input_arg;           ///< the argument each input belongs to
  /// Per input: how the signature shows it when not as a tensor (a dataset's
  /// `DatasetSpec(...)`), else empty. May be shorter than `inputs`.
  std::vector<std::string> input_text;
  std::vector<tensor_spec> outputs;     ///< none for a function that returns nothing
  /// The structure of the outputs (`(<1>, <2>)`); empty for one tensor or for nothing.
  std::string output_structure;

  /// `double(a)` or `pow(a, b=2)`.
  KILN_LIBRARY_INLINE std::string header() const;
  /// The header with the Args/Returns block, as TensorFlow prints a signature; a
  /// structure is shown with a line per leaf below it.
  KILN_LIBRARY_INLINE std::string signature_text() const;
};
}  // namespace detail

// ---- the compile-time tier's values, as the runtime tier tells them apart ----------

template <class T, std::int64_t... Dims>
class fixed;  // kiln/typed/fixed.hpp
struct typed_expression;  // kiln/typed/expr.hpp

namespace typed {

template <class X>
struct is_fixed : std::false_type {};
template <class T, std::int64_t... D>
struct is_fixed<fixed<T, D...>> : std::true_type {};
/// Whether `X` (without cv or reference) is a `kiln::fixed`.
template <class X>
concept fixed_value = is_fixed<std::remove_cvref_t<X>>::value;

/// A symbolic value or expression of the compile-time tier.
template <class X>
concept lazy = std::derived_from<std::remove_cvref_t<X>, typed_expression>;

/// What typed ops take: `fixed` values, symbolic values and expressions.
template <class X>
concept operand = fixed_value<X> || lazy<X>;
}  // namespace typed

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string signature_entry(dtype t, const shape& s) {
  std::string text(name(t));
  text += " Tensor, shape=";
  text += s.str();
  return text;
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE bool tensor_spec::accepts(kiln::dtype t, const kiln::shape& s) const {
  return t == dtype && shape.accepts(s);
}

KILN_LIBRARY_INLINE std::string tensor_spec::str() const {
  return "TensorSpec(shape=" + shape.str() + ", dtype=tf." + std::string(kiln::name(dtype)) +
         ", name=" + (name.empty() ? std::string("None") : "'" + name + "'") + ")";
}

KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor_spec& s) { return os << s.str(); }

}  // namespace kiln

namespace kiln::detail {

KILN_LIBRARY_INLINE void structure_text::leaf() {
  text += '<';
  text += std::to_string(++leaves);
  text += '>';
}

KILN_LIBRARY_INLINE void structure_text::open(bool list) { text += list ? '[' : '('; }

KILN_LIBRARY_INLINE void structure_text::next() { text += ", "; }

KILN_LIBRARY_INLINE void structure_text::close(bool list, std::size_t count) {
  if (!list && count == 1) text += ',';
  text += list ? ']' : ')';
}

KILN_LIBRARY_INLINE std::string trace_signature::header() const {
  std::string s = name + "(";
  for (std::size_t i = 0; i < arg_names.size(); ++i) {
    if (i) s += ", ";
    s += arg_names[i];
    if (i < bound_text.size() && !bound_text[i].empty()) s += "=" + bound_text[i];
  }
  return s + ")";
}

KILN_LIBRARY_INLINE std::string trace_signature::signature_text() const {
  std::ostringstream os;
  os << header() << "\n";
  if (!inputs.empty()) os << "  Args:\n";
  auto input_entry = [&](std::size_t k) {
    return k < input_text.size() && !input_text[k].empty() ? input_text[k]
                                                           : signature_entry(inputs[k].dtype, inputs[k].shape);
  };
  for (std::size_t a = 0; a < arg_names.size(); ++a) {
    std::vector<std::size_t> leaves;
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (k < input_arg.size() && input_arg[k] == int(a)) leaves.push_back(k);
    if (leaves.empty()) continue;
    const std::string& structure = a < arg_structure.size() ? arg_structure[a] : std::string();
    if (structure.empty()) {
      for (std::size_t k : leaves) os << "    " << arg_names[a] << ": " << input_entry(k) << "\n";
    } else {
      os << "    " << arg_names[a] << ": " << structure << "\n";
      for (std::size_t j = 0; j < leaves.size(); ++j)
        os << "      <" << j + 1 << ">: " << input_entry(leaves[j]) << "\n";
    }
  }
  os << "  Returns:\n";
  if (!output_structure.empty()) {
    os << "    " << output_structure << "\n";
    for (std::size_t j = 0; j < outputs.size(); ++j)
      os << "      <" << j + 1 << ">: " << signature_entry(outputs[j].dtype, outputs[j].shape) << "\n";
  } else if (outputs.empty()) {
    os << "    NoneTensorSpec()\n";
  } else {
    for (const tensor_spec& out : outputs) os << "    " << signature_entry(out.dtype, out.shape) << "\n";
  }
  return os.str();
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

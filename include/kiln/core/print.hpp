#pragma once
/// \file
/// Printing tensors as TensorFlow does. `std::cout << x` writes what Python's
/// `print(x)` shows for an eager `tf.Tensor`, with `tensor(` for `tf.Tensor(`: the
/// values as NumPy's `str()` lays out an array, then the shape and dtype.
/// `detail::format_values` gives the values alone, as `tf.print` writes them.
/// Both share one layout engine (which elements show, where rows and lines break)
/// and differ only in how one element is written.
/// Formatting is optimized for size (KILN_COLD): writing text is never the hot path,
/// and every program that prints compiles it.

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <mutex>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/symbol.hpp"
#include "kiln/config.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

class variable;

namespace config {
namespace detail {
KILN_LIBRARY_INLINE std::atomic<std::ostream*>& print_stream_slot();
}  // namespace detail
/// Where kiln::print writes: standard error unless set, as tf.print. The stream must
/// outlive its use.
/// \code std::ostringstream captured; kiln::config::set_print_stream(captured); \endcode
KILN_LIBRARY_INLINE void set_print_stream(std::ostream& os);
/// The stream kiln::print writes to.
KILN_LIBRARY_INLINE std::ostream& print_stream();

namespace detail {
KILN_LIBRARY_INLINE std::atomic<std::ostream*>& warning_stream_slot();
}  // namespace detail
/// Where kiln writes its warnings (a function that retraces often): standard error
/// unless set, as TensorFlow's logging; null silences them. The stream must outlive
/// its use.
/// \code kiln::config::set_warning_stream(nullptr); \endcode
KILN_LIBRARY_INLINE void set_warning_stream(std::ostream* os);
/// The stream kiln's warnings go to, or null when they are silenced.
KILN_LIBRARY_INLINE std::ostream* warning_stream();
}  // namespace config

namespace detail {

// ---- one number as text ----------------------------------------------------------

/// The two decimal notations: positional (`12.5`) and scientific (`1.25e+01`).
enum class notation { positional, scientific };

/// How trailing zeros of a fraction are trimmed (the `trim` modes of NumPy's Dragon4).
enum class trim_mode {
  keep,        ///< keep every digit and the point: `1.50`, `1.e-05`
  keep_point,  ///< drop trailing zeros, keep the point: `1.5`, `2.`
  one_zero,    ///< drop trailing zeros but one: `1.5`, `2.0`
  no_point,    ///< drop trailing zeros and a bare point: `1.5`, `2`
};

/// Number of fraction digits in a number's text (`"1.25e+01"` has 2).
KILN_COLD KILN_LIBRARY_INLINE int fraction_digits(std::string_view text);

// The printer holds floating-point elements as doubles, which hold float32 values
// exactly, and a flag `single` for float32, whose digits and comparisons NumPy takes
// in float32: one copy of the number code serves both types.

/// `x` with the fewest fraction digits that read back as the same value of its type
/// (float32 when `single`), but at least `min_fraction` and at most `max_fraction` of
/// them, rounded from the exact binary value: the digits NumPy's Dragon4 prints in
/// its "unique" mode.
/// \code kiln::detail::shortest_digits(2.2f, true, kiln::detail::notation::positional, 0, 8) == "2.2" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string shortest_digits(double x, bool single, notation n, int min_fraction = 0,
                                             int max_fraction = std::numeric_limits<int>::max());

/// `text` (as shortest_digits writes it) with its fraction trimmed as `mode` says.
/// \code kiln::detail::trimmed("2", kiln::detail::trim_mode::one_zero) == "2.0" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string trimmed(std::string_view text, trim_mode mode);

/// Python's `repr` of a bytes object, which NumPy prints for each element of a
/// TensorFlow string tensor: `b'aa'`, `b"it's"`, `b'\xff\n'`.
KILN_COLD KILN_LIBRARY_INLINE std::string python_bytes_repr(std::string_view bytes);

/// A string escaped as TensorFlow's C++ runtime escapes it for tf.print (C escapes,
/// octal for other control characters, bytes of UTF-8 sequences kept as they are).
/// \code kiln::detail::c_escaped("a\"b\n") == "a\\\"b\\n" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string c_escaped(std::string_view text);

/// A floating-point element as NumPy's `str()` writes a scalar, which TensorFlow
/// prints for a rank-0 tensor: as Python writes floats (`2.2`, `20.0`, `1e+16`,
/// `1.5e-05`, `nan`, `-inf`) at the element type's own precision.
/// \code kiln::detail::numpy_real_text(2.2f, true) == "2.2" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string numpy_real_text(double x, bool single);

/// A floating-point element as tf.print writes it (TensorFlow's C++ text): 6
/// significant digits (15 for float64) when those read back exactly, else 9 (17):
/// `0.405638`, `0.666458249`.
/// \code kiln::detail::tf_print_real_text(0.5, false) == "0.5" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string tf_print_real_text(double x, bool single);

// ---- the elements of an array ------------------------------------------------------

/// `text` right-aligned in `width` columns.
KILN_COLD KILN_LIBRARY_INLINE std::string padded_left(std::string text, std::size_t width);

/// The texts NumPy's FloatingFormat gives the elements `values` of one array (float32
/// values when `single`) in its default mode (at most 8 fraction digits, only as many
/// as needed): one notation for all (scientific when the largest magnitude is >= 1e8,
/// the smallest non-zero < 1e-4, or their ratio > 1000), all padded to one width, the
/// points aligned.
/// \code kiln::detail::numpy_float_texts({1.5, 2.}, true) == std::vector<std::string>{"1.5", "2. "} \endcode
KILN_COLD KILN_LIBRARY_INLINE std::vector<std::string> numpy_float_texts(const std::vector<double>& values, bool single);

/// The shown elements of an array, copied out of its data: doubles for float32 and
/// float64, 64-bit integers for bool and the integer dtypes, views for strings. What
/// the one dtype-specific part of the printer (format_values_of) hands the rest.
struct element_values {
  dtype type;
  std::vector<double> reals;
  std::vector<std::int64_t> integers;
  std::vector<std::string_view> strings;
  /// How a string element is written (set by the copy of string elements, so that a
  /// program that prints no strings does not compile the escaping).
  std::string (*string_text)(std::string_view, bool numpy) = nullptr;

  KILN_LIBRARY_INLINE std::size_t size() const;
  /// Element `i` as NumPy's `str()` writes a scalar (`numpy`: `2`, `True`, `b'aa'`,
  /// `2.2`), else as tf.print writes it (`2`, `1`, `"aa"`, `2.2`).
  KILN_LIBRARY_INLINE KILN_COLD std::string text(std::size_t i, bool numpy) const;
};

/// String element `x` as NumPy's `str()` writes it (`b'aa'`), else as tf.print
/// does (`"aa"`).
KILN_COLD KILN_LIBRARY_INLINE std::string string_element_text(std::string_view x, bool numpy);

/// The texts NumPy gives the elements of one array: integers right-aligned to a
/// shared width, bools as ` True`/`False`, floats by numpy_float_texts, strings as
/// Python bytes, unpadded.
KILN_COLD KILN_LIBRARY_INLINE std::vector<std::string> numpy_element_texts(const element_values& v);

// ---- layout ------------------------------------------------------------------------

/// The value styles of format_values.
enum class value_style {
  numpy,          ///< NumPy's `str()`, as TensorFlow's eager `print(x)` shows values
  tf_print,       ///< tf.print: every axis longer than 6 shows its 3 first and last items
  tf_print_line,  ///< tf.print with nested rows on one line: `[[1 2] [3 4]]`
};

/// How the values of an array are laid out: which elements show and where rows and
/// lines break.
struct value_layout {
  std::int64_t edge_items = 3;   ///< items shown at each end of a summarized axis
  bool summarize = false;        ///< axes longer than 2 * edge_items show only their ends, around `...`
  std::size_t line_width = 0;    ///< the last axis wraps lines longer than this; 0 never wraps
  bool single_line = false;      ///< nested rows separated by a space instead of line breaks
};

/// The layout of an array of shape `s` in `style`: NumPy wraps lines at 75 columns
/// and shows `...` only past 1000 elements; the tf.print styles never wrap and
/// always summarize.
KILN_COLD KILN_LIBRARY_INLINE value_layout layout_of(const shape& s, value_style style);

/// Whether `layout` shows only the ends of an axis of `length` items.
KILN_LIBRARY_INLINE bool summarized(std::int64_t length, const value_layout& layout);

/// The row-major flat indices of the elements `layout` shows of a tensor of shape `s`,
/// in the order they are written.
KILN_COLD KILN_LIBRARY_INLINE std::vector<std::int64_t> shown_indices(const shape& s, const value_layout& layout);

/// Writes the texts of the shown elements (in shown_indices order) as nested rows:
/// NumPy's `_formatArray`, which is also the layout of TensorFlow's C++ printer once
/// line wrapping is off.
class array_writer {
 public:
  array_writer(const shape& s, const std::vector<std::string>& items, const value_layout& layout)
      : shape_(s), items_(items), layout_(layout) {}

  KILN_LIBRARY_INLINE KILN_COLD std::string write();

 private:
  KILN_LIBRARY_INLINE KILN_COLD void block(int axis, std::size_t indent, std::int64_t width);

  // Appends `word`, first breaking the line when wrapping is on and the word would
  // pass `width` (a line holding only its indent never breaks).
  KILN_LIBRARY_INLINE KILN_COLD void add_word(std::string_view word, std::int64_t width, std::size_t indent);

  const shape& shape_;
  const std::vector<std::string>& items_;
  value_layout layout_;
  std::size_t next_ = 0;
  std::string out_;
};

// ---- whole tensors -----------------------------------------------------------------

/// The shown elements `v` of an array of shape `s` in `style` (format_values_of).
KILN_COLD KILN_LIBRARY_INLINE std::string format_elements(const element_values& v, const shape& s, value_style style);

/// The values of a row-major array of `T` of shape `s` in `style`. NumPy style pads
/// elements to a shared width, wraps lines at 75 columns and shows `...` only past
/// 1000 elements; the tf.print styles write each element unpadded. Only the copy of
/// the shown elements depends on `T`.
/// \code
/// const float data[] = {1.5f, 2.f};
/// kiln::detail::format_values_of(data, kiln::shape{2}, kiln::detail::value_style::numpy) == "[1.5 2. ]";
/// \endcode
template <class T>
KILN_COLD std::string format_values_of(const T* data, const shape& s, value_style style) {
  element_values v{dtype_of<T>, {}, {}, {}, {}};
  if constexpr (std::is_same_v<T, std::string>) v.string_text = string_element_text;
  for (std::int64_t i : shown_indices(s, layout_of(s, style))) {
    if constexpr (std::is_floating_point_v<T>)
      v.reals.push_back(data[i]);
    else if constexpr (std::is_same_v<T, std::string>)
      v.strings.push_back(data[i]);
    else
      v.integers.push_back(data[i]);
  }
  return format_elements(v, s, style);
}

/// The values of eager tensor `x` (copied from the GPU if there) in `style`.
/// \code kiln::detail::format_values(kiln::constant({1.5f, 2.f}), kiln::detail::value_style::numpy) == "[1.5 2. ]" \endcode
KILN_LIBRARY_INLINE std::string format_values(const tensor& x, value_style style);
#if KILN_DEFINE_LIBRARY
KILN_COLD KILN_LIBRARY_INLINE std::string format_values(const tensor& x, value_style style) {
  x.require_value("print");
  const tensor host = x.device() == kiln::device::cpu ? x : x.to(kiln::device::cpu);
  return visit_dtype(host.dtype(), [&]<class T>() {
    return format_values_of(static_cast<const T*>(host.raw_data()), host.shape(), style);  // checked above
  });
}
#endif

/// The values of eager tensor `x` as tf.print writes them (used by kiln::print):
/// `1`, `[1 2 3]`, `[[1 2] [3 4]]` with `single_line`, else each nested row on its
/// own line as TensorFlow writes it. Strings are quoted (`"a"`), bools are `1`/`0`.
/// tf.print writes a lone scalar string argument raw (`a`), which is the caller's
/// business. Symbolic tensors raise kiln::type_error.
/// \code kiln::detail::format_values(kiln::range(10), true) == "[0 1 2 ... 7 8 9]" \endcode
KILN_COLD KILN_LIBRARY_INLINE std::string format_values(const tensor& x, bool single_line);

/// One piece of a print: a text, or the input whose values are printed there.
struct print_piece {
  std::string text;
  int input = -1;
};

/// The line kiln::print writes for `pieces` and eager `inputs`, as tf.print writes
/// it: pieces separated by spaces, scalar strings raw, other tensors as their values.
KILN_LIBRARY_INLINE std::string print_line(std::span<const print_piece> pieces, std::span<const tensor* const> inputs);

/// Writes `line` whole to config::print_stream(), so that lines from several threads
/// do not interleave.
KILN_LIBRARY_INLINE void write_print_line(const std::string& line);

/// One argument of kiln::print as a piece of the line: C++ strings and numbers are
/// texts fixed now; tensors (and variables) are inputs printed when the print runs.
template <class T>
void add_print_piece(const T& x, std::vector<print_piece>& pieces, std::vector<tensor>& inputs) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    pieces.push_back({std::string(std::string_view(x)), -1});
  } else if constexpr (std::is_same_v<U, tensor> || std::is_same_v<U, variable> || std::is_convertible_v<const U&, tensor>) {
    pieces.push_back({{}, int(inputs.size())});
    inputs.push_back(tensor(x));
  } else {
    static_assert(std::is_arithmetic_v<U>, "kiln::print takes tensors, variables, C++ strings and C++ numbers");
    if constexpr (std::is_same_v<U, bool>) {
      pieces.push_back({x ? "True" : "False", -1});
    } else if constexpr (std::is_integral_v<U>) {
      pieces.push_back({std::to_string(x), -1});
    } else {
      std::ostringstream os;
      os << x;
      pieces.push_back({os.str(), -1});
    }
  }
}

}  // namespace detail

namespace detail {
/// Writes an eager value as `tensor(values, shape=..., dtype=...)`, values laid out
/// over several lines starting on a line of their own.
KILN_COLD KILN_LIBRARY_INLINE std::ostream& write_eager(std::ostream& os, std::string values, const shape& s, dtype t);
}  // namespace detail

/// Writes `x` as Python's `print` writes an eager `tf.Tensor`, with `tensor(` for
/// `tf.Tensor(`: `tensor([4 1], shape=(2,), dtype=int32)`, `tensor(2.2, shape=(),
/// dtype=float32)`, `tensor(b'aa', shape=(), dtype=string)`; values laid out over
/// several lines start on a line of their own. A symbolic tensor prints as
/// TensorFlow prints one while tracing, with its graph value's name:
/// `Tensor("x:0", shape=(None,), dtype=int32)`. GPU tensors print their values.
/// \code std::cout << kiln::constant({{1, 2}, {3, 4}});  // tensor(\n[[1 2]\n [3 4]], shape=(2, 2), dtype=int32) \endcode
KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor& x);

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::config::detail {

KILN_LIBRARY_INLINE std::atomic<std::ostream*>& print_stream_slot() {
  static std::atomic<std::ostream*> stream{&std::cerr};
  return stream;
}

}  // namespace kiln::config::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void set_print_stream(std::ostream& os) { detail::print_stream_slot() = &os; }

KILN_LIBRARY_INLINE std::ostream& print_stream() { return *detail::print_stream_slot().load(); }

}  // namespace kiln::config

namespace kiln::config::detail {

KILN_LIBRARY_INLINE std::atomic<std::ostream*>& warning_stream_slot() {
  static std::atomic<std::ostream*> stream{&std::cerr};
  return stream;
}

}  // namespace kiln::config::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void set_warning_stream(std::ostream* os) { detail::warning_stream_slot() = os; }

KILN_LIBRARY_INLINE std::ostream* warning_stream() { return detail::warning_stream_slot().load(); }

}  // namespace kiln::config

namespace kiln::detail {

KILN_LIBRARY_INLINE int fraction_digits(std::string_view text) {
  std::size_t point = text.find('.');
  if (point == std::string_view::npos) return 0;
  std::size_t end = std::min(text.find('e'), text.size());
  return static_cast<int>(end - point - 1);
}

KILN_LIBRARY_INLINE std::string shortest_digits(double x, bool single, notation n, int min_fraction, int max_fraction) {
  // Enough for any double: fixed notation of the extremes needs about 330 characters.
  char buffer[512];
  auto write = [&](std::chars_format format, auto... precision) {
    auto written = single ? std::to_chars(buffer, buffer + sizeof buffer, float(x), format, precision...)
                          : std::to_chars(buffer, buffer + sizeof buffer, x, format, precision...);
    if (written.ec != std::errc{}) throw internal_error("shortest_digits: the number does not fit the buffer");
    return std::string(buffer, written.ptr);
  };
  // The shortest digits that read back, in scientific notation. In positional notation
  // they are placed around the point, zeros filling up to it: to_chars' own fixed
  // notation would write every digit of the exact binary value left of the point
  // (float32 123456789 as `123456792`, where NumPy writes `123456790`).
  std::string text = write(std::chars_format::scientific);
  if (n == notation::positional) {
    const std::size_t e = text.find('e');
    const bool negative = text[0] == '-';
    std::string digits = text.substr(negative ? 1 : 0, e - (negative ? 1 : 0));
    std::erase(digits, '.');
    const int exponent = std::stoi(text.substr(e + 1));
    std::string whole, fraction;
    if (exponent < 0) {
      whole = "0";
      fraction = std::string(std::size_t(-exponent - 1), '0') + digits;
    } else if (std::size_t(exponent) + 1 >= digits.size()) {
      whole = digits + std::string(std::size_t(exponent) + 1 - digits.size(), '0');
    } else {
      whole = digits.substr(0, std::size_t(exponent) + 1);
      fraction = digits.substr(std::size_t(exponent) + 1);
    }
    text = (negative ? "-" : "") + whole + (fraction.empty() ? "" : "." + fraction);
  }
  const int fraction = fraction_digits(text);
  const int wanted = std::clamp(fraction, min_fraction, max_fraction);
  if (wanted == fraction) return text;
  // More or fewer digits than the shortest: rounded from the exact binary value.
  return write(n == notation::positional ? std::chars_format::fixed : std::chars_format::scientific, wanted);
}

KILN_LIBRARY_INLINE std::string trimmed(std::string_view text, trim_mode mode) {
  std::size_t e = std::min(text.find('e'), text.size());
  std::string mantissa(text.substr(0, e));
  if (mantissa.find('.') == std::string::npos) {
    mantissa += '.';
  } else if (mode != trim_mode::keep) {
    while (mantissa.back() == '0') mantissa.pop_back();
  }
  if (mode == trim_mode::one_zero && mantissa.back() == '.') mantissa += '0';
  if (mode == trim_mode::no_point && mantissa.back() == '.') mantissa.pop_back();
  return mantissa.append(text.substr(e));
}

KILN_LIBRARY_INLINE std::string python_bytes_repr(std::string_view bytes) {
  bool has_single = bytes.find('\'') != std::string_view::npos;
  bool has_double = bytes.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out = "b";
  out += quote;
  for (char c : bytes) {
    auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u >= 0x7f) {
      constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

KILN_LIBRARY_INLINE std::string c_escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\'':
        out += "\\'";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += '\\';
          out += char('0' + (u >> 6));
          out += char('0' + ((u >> 3) & 7));
          out += char('0' + (u & 7));
        } else {
          out += c;
        }
    }
  }
  return out;
}

KILN_LIBRARY_INLINE std::string numpy_real_text(double x, bool single) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // NumPy compares in long double, so float32 1e-4 (just below 1e-4) is scientific.
  long double magnitude = std::fabs(static_cast<long double>(x));
  if (x == 0 || (magnitude < 1e16L && magnitude >= 1e-4L))
    return trimmed(shortest_digits(x, single, notation::positional), trim_mode::one_zero);
  return trimmed(shortest_digits(x, single, notation::scientific), trim_mode::no_point);
}

KILN_LIBRARY_INLINE std::string tf_print_real_text(double x, bool single) {
  if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
  char buffer[64];
  auto write = [&](int digits) {
    return single ? std::to_chars(buffer, buffer + sizeof buffer, float(x), std::chars_format::general, digits)
                  : std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::general, digits);
  };
  auto written = write(single ? 6 : 15);
  auto reads_back = [&](auto value) {
    std::from_chars(buffer, written.ptr, value);
    return value == decltype(value)(x);
  };
  if (!(single ? reads_back(0.f) : reads_back(0.))) written = write(single ? 9 : 17);
  return std::string(buffer, written.ptr);
}

KILN_LIBRARY_INLINE std::string padded_left(std::string text, std::size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

KILN_LIBRARY_INLINE std::vector<std::string> numpy_float_texts(const std::vector<double>& values, bool single) {
  constexpr int max_fraction = 8;
  bool any_finite = false, any_nonzero = false, any_special = false, negative_infinity = false;
  double largest = 0, smallest = std::numeric_limits<double>::infinity();
  for (double v : values) {
    if (!std::isfinite(v)) {
      any_special = true;
      negative_infinity = negative_infinity || (std::isinf(v) && v < 0);
      continue;
    }
    any_finite = true;
    if (v != 0) {
      any_nonzero = true;
      largest = std::max(largest, std::fabs(v));
      smallest = std::min(smallest, std::fabs(v));
    }
  }
  // NumPy compares in the array's own type: float32 1e-4 is not below float(1e-4). A
  // quotient of floats rounded to double, then to float, is the float quotient.
  auto in_type = [single](double v) { return single ? double(float(v)) : v; };
  bool scientific =
      any_nonzero && (largest >= in_type(1e8) || smallest < in_type(1e-4) || in_type(largest / smallest) > 1000);
  notation n = scientific ? notation::scientific : notation::positional;

  // A first pass over the finite values fixes the digits and widths all share.
  std::vector<std::string> texts(values.size());
  std::size_t int_width = 0, fraction_width = 0, exponent_digits = 0;
  int shared_fraction = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    texts[i] = trimmed(shortest_digits(values[i], single, n, 0, max_fraction), trim_mode::keep_point);
    std::size_t point = texts[i].find('.'), e = std::min(texts[i].find('e'), texts[i].size());
    int_width = std::max(int_width, point);
    shared_fraction = std::max(shared_fraction, int(e - point - 1));
    if (scientific) exponent_digits = std::max(exponent_digits, texts[i].size() - e - 2);
  }
  // Right of the point: the fraction, or in scientific notation also `e+XX`.
  if (any_finite)
    fraction_width = scientific ? std::size_t(shared_fraction) + 2 + exponent_digits : std::size_t(shared_fraction);
  if (any_special) {
    // "nan", "inf" or "-inf" must fit in the shared width, of which the point and
    // the right part take fraction_width + 1.
    std::size_t widest = negative_infinity ? 4 : 3;
    if (widest > fraction_width + 1) int_width = std::max(int_width, widest - fraction_width - 1);
  }
  const std::size_t width = int_width + 1 + fraction_width;

  for (std::size_t i = 0; i < values.size(); ++i) {
    double v = values[i];
    std::string& text = texts[i];
    if (std::isnan(v)) {
      text = "nan";
    } else if (std::isinf(v)) {
      text = v < 0 ? "-inf" : "inf";
    } else if (scientific) {
      // Every mantissa gets the shared number of digits, rounded from the exact value.
      text = trimmed(shortest_digits(v, single, n, shared_fraction, shared_fraction), trim_mode::keep);
      std::size_t digits_at = text.find('e') + 2;
      if (text.size() - digits_at < exponent_digits)
        text.insert(digits_at, exponent_digits - (text.size() - digits_at), '0');
    } else {
      text.append(fraction_width - (text.size() - text.find('.') - 1), ' ');
    }
    text = padded_left(std::move(text), width);
  }
  return texts;
}

KILN_LIBRARY_INLINE std::size_t element_values::size() const { return reals.size() + integers.size() + strings.size(); }

KILN_LIBRARY_INLINE std::string element_values::text(std::size_t i, bool numpy) const {
  if (is_floating(type))
    return numpy ? numpy_real_text(reals[i], type == float32) : tf_print_real_text(reals[i], type == float32);
  if (type == string) return string_text(strings[i], numpy);
  if (type == bool_) return integers[i] ? (numpy ? "True" : "1") : (numpy ? "False" : "0");
  return std::to_string(integers[i]);
}

KILN_LIBRARY_INLINE std::string string_element_text(std::string_view x, bool numpy) {
  return numpy ? python_bytes_repr(x) : "\"" + c_escaped(x) + "\"";
}

KILN_LIBRARY_INLINE std::vector<std::string> numpy_element_texts(const element_values& v) {
  if (is_floating(v.type)) return numpy_float_texts(v.reals, v.type == float32);
  std::vector<std::string> texts;
  std::size_t width = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    texts.push_back(v.type == bool_ ? (v.integers[i] ? " True" : "False") : v.text(i, true));
    if (v.type != string) width = std::max(width, texts.back().size());
  }
  for (std::string& text : texts) text = padded_left(std::move(text), width);
  return texts;
}

KILN_LIBRARY_INLINE value_layout layout_of(const shape& s, value_style style) {
  value_layout layout;
  const bool numpy = style == value_style::numpy;
  layout.summarize = numpy ? s.num_elements() > 1000 : true;
  layout.line_width = numpy ? 75 : 0;
  layout.single_line = style == value_style::tf_print_line;
  return layout;
}

KILN_LIBRARY_INLINE bool summarized(std::int64_t length, const value_layout& layout) {
  return layout.summarize && length > 2 * layout.edge_items;
}

KILN_LIBRARY_INLINE std::vector<std::int64_t> shown_indices(const shape& s, const value_layout& layout) {
  const int rank = s.rank();
  std::vector<std::int64_t> indices;
  if (s.num_elements() == 0) return indices;
  const auto strides = row_major_strides(s);
  std::vector<std::int64_t> at(std::size_t(rank), 0);  // an odometer over the shown positions
  for (;;) {
    std::int64_t flat = 0;
    for (int axis = 0; axis < rank; ++axis) flat += at[std::size_t(axis)] * strides[axis];
    indices.push_back(flat);
    int axis = rank - 1;
    for (; axis >= 0; --axis) {
      std::int64_t& c = at[std::size_t(axis)];
      if (++c == layout.edge_items && summarized(s[axis], layout)) c = s[axis] - layout.edge_items;
      if (c < s[axis]) break;
      c = 0;
    }
    if (axis < 0) return indices;
  }
}

KILN_LIBRARY_INLINE std::string array_writer::write() {
  // A row's first line starts with the brackets it opens and its other lines with
  // an indent as wide: one column per bracket.
  block(0, layout_.single_line ? 0 : 1, static_cast<std::int64_t>(layout_.line_width));
  return std::move(out_);
}

KILN_LIBRARY_INLINE void array_writer::block(int axis, std::size_t indent, std::int64_t width) {
  const std::int64_t length = shape_[axis];
  const bool cut = summarized(length, layout_);
  const std::int64_t shown = cut ? 2 * layout_.edge_items : length;
  out_ += '[';
  if (axis == shape_.rank() - 1) {
    // The closing bracket takes one column of the line.
    for (std::int64_t k = 0; k < shown; ++k) {
      if (k > 0) out_ += ' ';
      if (cut && k == layout_.edge_items) {
        add_word("...", width - 1, indent);
        out_ += ' ';
      }
      add_word(items_[next_++], width - 1, indent);
    }
  } else {
    auto next_row = [&] {
      if (layout_.single_line)
        out_ += ' ';
      else
        out_.append(std::size_t(shape_.rank() - axis - 1), '\n').append(indent, ' ');
    };
    for (std::int64_t k = 0; k < shown; ++k) {
      if (k > 0) next_row();
      if (cut && k == layout_.edge_items) {
        out_ += "...";
        next_row();
      }
      block(axis + 1, layout_.single_line ? indent : indent + 1, width - 1);
    }
  }
  out_ += ']';
}

KILN_LIBRARY_INLINE void array_writer::add_word(std::string_view word, std::int64_t width, std::size_t indent) {
  if (layout_.line_width > 0) {
    const std::size_t line_start = out_.rfind('\n') + 1;  // npos + 1 == 0
    const std::size_t line = out_.size() - line_start;
    if (std::int64_t(line + word.size()) > width && line > indent) {
      while (out_.size() > line_start && out_.back() == ' ') out_.pop_back();
      out_.append(1, '\n').append(indent, ' ');
    }
  }
  out_ += word;
}

KILN_LIBRARY_INLINE std::string format_elements(const element_values& v, const shape& s, value_style style) {
  const bool numpy = style == value_style::numpy;
  if (s.rank() == 0) return v.text(0, numpy);
  if (v.size() == 0) return "[]";
  std::vector<std::string> texts;
  if (numpy) {
    texts = numpy_element_texts(v);
  } else {
    for (std::size_t i = 0; i < v.size(); ++i) texts.push_back(v.text(i, false));
  }
  return array_writer(s, texts, layout_of(s, style)).write();
}

KILN_LIBRARY_INLINE std::string format_values(const tensor& x, bool single_line) {
  return format_values(x, single_line ? value_style::tf_print_line : value_style::tf_print);
}

KILN_LIBRARY_INLINE std::string print_line(std::span<const print_piece> pieces, std::span<const tensor* const> inputs) {
  std::string line;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    if (k) line += ' ';
    const print_piece& p = pieces[k];
    if (p.input < 0) {
      line += p.text;
      continue;
    }
    const tensor& x = *inputs[std::size_t(p.input)];
    if (x.dtype() == string && x.rank() == 0)
      line += x.to(device::cpu).data<std::string>()[0];
    else
      line += format_values(x, false);
  }
  return line + '\n';
}

KILN_LIBRARY_INLINE void write_print_line(const std::string& line) {
  static std::mutex m;
  std::lock_guard lock(m);
  config::print_stream() << line << std::flush;
}

KILN_LIBRARY_INLINE std::ostream& write_eager(std::ostream& os, std::string values, const shape& s, dtype t) {
  if (values.find('\n') != std::string::npos) values.insert(0, "\n");
  return os << "tensor(" << values << ", shape=" << s << ", dtype=" << t << ")";
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE std::ostream& operator<<(std::ostream& os, const tensor& x) {
  if (!x.defined()) return os << "tensor(<undefined>)";
  if (x.is_symbolic())
    return os << "Tensor(\"" << detail::value_name(*x.symbol()) << "\", shape=" << x.shape() << ", dtype=" << x.dtype()
              << ")";
  return detail::write_eager(os, detail::format_values(x, detail::value_style::numpy), x.shape(), x.dtype());
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

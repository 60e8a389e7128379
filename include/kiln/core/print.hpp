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
inline std::atomic<std::ostream*>& print_stream_slot() {
  static std::atomic<std::ostream*> stream{&std::cerr};
  return stream;
}
}  // namespace detail
/// Where kiln::print writes: standard error unless set, as tf.print. The stream must
/// outlive its use.
/// \code std::ostringstream captured; kiln::config::set_print_stream(captured); \endcode
inline void set_print_stream(std::ostream& os) { detail::print_stream_slot() = &os; }
/// The stream kiln::print writes to.
inline std::ostream& print_stream() { return *detail::print_stream_slot().load(); }
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
KILN_COLD inline int fraction_digits(std::string_view text) {
  std::size_t point = text.find('.');
  if (point == std::string_view::npos) return 0;
  std::size_t end = std::min(text.find('e'), text.size());
  return static_cast<int>(end - point - 1);
}

/// `x` with the fewest fraction digits that read back as the same `T`, but at least
/// `min_fraction` and at most `max_fraction` of them, rounded from the exact binary
/// value: the digits NumPy's Dragon4 prints in its "unique" mode.
/// \code kiln::detail::shortest_digits(2.2f, kiln::detail::notation::positional, 0, 8) == "2.2" \endcode
template <class T>
KILN_COLD std::string shortest_digits(T x, notation n, int min_fraction = 0, int max_fraction = std::numeric_limits<int>::max()) {
  const std::chars_format format = n == notation::positional ? std::chars_format::fixed : std::chars_format::scientific;
  // Enough for any double: fixed notation of the extremes needs about 330 characters.
  char buffer[512];
  auto written = std::to_chars(buffer, buffer + sizeof buffer, x, format);
  int fraction = fraction_digits(std::string_view(buffer, std::size_t(written.ptr - buffer)));
  int wanted = std::clamp(fraction, min_fraction, max_fraction);
  if (written.ec == std::errc{} && wanted != fraction) written = std::to_chars(buffer, buffer + sizeof buffer, x, format, wanted);
  if (written.ec != std::errc{}) throw internal_error("shortest_digits: the number does not fit the buffer");
  return std::string(buffer, written.ptr);
}

/// `text` (as shortest_digits writes it) with its fraction trimmed as `mode` says.
/// \code kiln::detail::trimmed("2", kiln::detail::trim_mode::one_zero) == "2.0" \endcode
KILN_COLD inline std::string trimmed(std::string_view text, trim_mode mode) {
  std::size_t e = std::min(text.find('e'), text.size());
  std::string mantissa(text.substr(0, e));
  if (mantissa.find('.') == std::string::npos) {
    mantissa += '.';
  } else if (mode != trim_mode::keep) {
    while (mantissa.back() == '0') mantissa.pop_back();
  }
  if (mode == trim_mode::one_zero && mantissa.back() == '.') mantissa += '0';
  if (mode == trim_mode::no_point && mantissa.back() == '.') mantissa.pop_back();
  return mantissa + std::string(text.substr(e));
}

/// Python's `repr` of a bytes object, which NumPy prints for each element of a
/// TensorFlow string tensor: `b'aa'`, `b"it's"`, `b'\xff\n'`.
KILN_COLD inline std::string python_bytes_repr(std::string_view bytes) {
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

/// A string escaped as TensorFlow's C++ runtime escapes it for tf.print (C escapes,
/// octal for other control characters, bytes of UTF-8 sequences kept as they are).
/// \code kiln::detail::c_escaped("a\"b\n") == "a\\\"b\\n" \endcode
KILN_COLD inline std::string c_escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\'': out += "\\'"; break;
      case '\\': out += "\\\\"; break;
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

/// One element as NumPy's `str()` writes a scalar, which TensorFlow prints for a
/// rank-0 tensor: `2`, `True`, `b'aa'`, and floats as Python writes them (`2.2`,
/// `20.0`, `1e+16`, `1.5e-05`, `nan`, `-inf`) at the element type's own precision.
template <class T>
KILN_COLD std::string numpy_scalar_text(const T& x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x ? "True" : "False";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return python_bytes_repr(x);
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(x);
  } else {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    // NumPy compares in long double, so float32 1e-4 (just below 1e-4) is scientific.
    long double magnitude = std::fabs(static_cast<long double>(x));
    if (x == 0 || (magnitude < 1e16L && magnitude >= 1e-4L))
      return trimmed(shortest_digits(x, notation::positional), trim_mode::one_zero);
    return trimmed(shortest_digits(x, notation::scientific), trim_mode::no_point);
  }
}

/// One element as tf.print writes it (TensorFlow's C++ text): integers, bools as
/// `1`/`0`, strings quoted and escaped, floats with 6 significant digits (15 for
/// float64) when those read back exactly, else 9 (17): `0.405638`, `0.666458249`.
template <class T>
KILN_COLD std::string tf_print_text(const T& x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x ? "1" : "0";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "\"" + c_escaped(x) + "\"";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(x);
  } else {
    if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
    constexpr int short_digits = std::numeric_limits<T>::digits10;
    constexpr int long_digits = std::is_same_v<T, float> ? short_digits + 3 : short_digits + 2;
    char buffer[64];
    auto written = std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::general, short_digits);
    T back{};
    std::from_chars(buffer, written.ptr, back);
    if (back != x) written = std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::general, long_digits);
    return std::string(buffer, written.ptr);
  }
}

// ---- the elements of an array, NumPy style -------------------------------------------

/// `text` right-aligned in `width` columns.
KILN_COLD inline std::string padded_left(std::string text, std::size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

/// The texts NumPy's FloatingFormat gives the elements `values` of one array in its
/// default mode (at most 8 fraction digits, only as many as needed): one notation
/// for all (scientific when the largest magnitude is >= 1e8, the smallest non-zero
/// < 1e-4, or their ratio > 1000), all padded to one width, the points aligned.
/// \code kiln::detail::numpy_float_texts<float>({1.5f, 2.f}) == std::vector<std::string>{"1.5", "2. "} \endcode
template <class T>
KILN_COLD std::vector<std::string> numpy_float_texts(const std::vector<T>& values) {
  constexpr int max_fraction = 8;
  bool any_finite = false, any_nonzero = false, any_special = false, negative_infinity = false;
  T largest = 0, smallest = std::numeric_limits<T>::infinity();
  for (T v : values) {
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
  // NumPy compares in the array's own type: float32 1e-4 is not below T(1e-4).
  bool scientific =
      any_nonzero && (largest >= T(1e8) || smallest < T(1e-4) || largest / smallest > T(1000));
  notation n = scientific ? notation::scientific : notation::positional;

  // A first pass over the finite values fixes the digits and widths all share.
  std::vector<std::string> texts(values.size());
  std::size_t int_width = 0, fraction_width = 0, exponent_digits = 0;
  int shared_fraction = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    texts[i] = trimmed(shortest_digits(values[i], n, 0, max_fraction), trim_mode::keep_point);
    std::size_t point = texts[i].find('.'), e = std::min(texts[i].find('e'), texts[i].size());
    int_width = std::max(int_width, point);
    shared_fraction = std::max(shared_fraction, int(e - point - 1));
    if (scientific) exponent_digits = std::max(exponent_digits, texts[i].size() - e - 2);
  }
  // Right of the point: the fraction, or in scientific notation also `e+XX`.
  if (any_finite) fraction_width = scientific ? std::size_t(shared_fraction) + 2 + exponent_digits : std::size_t(shared_fraction);
  if (any_special) {
    // "nan", "inf" or "-inf" must fit in the shared width, of which the point and
    // the right part take fraction_width + 1.
    std::size_t widest = negative_infinity ? 4 : 3;
    if (widest > fraction_width + 1) int_width = std::max(int_width, widest - fraction_width - 1);
  }
  const std::size_t width = int_width + 1 + fraction_width;

  for (std::size_t i = 0; i < values.size(); ++i) {
    T v = values[i];
    if (std::isnan(v)) {
      texts[i] = padded_left("nan", width);
    } else if (std::isinf(v)) {
      texts[i] = padded_left(v < 0 ? "-inf" : "inf", width);
    } else if (scientific) {
      // Every mantissa gets the shared number of digits, rounded from the exact value.
      std::string text = trimmed(shortest_digits(v, n, shared_fraction, shared_fraction), trim_mode::keep);
      std::size_t digits_at = text.find('e') + 2;
      if (text.size() - digits_at < exponent_digits) text.insert(digits_at, exponent_digits - (text.size() - digits_at), '0');
      texts[i] = padded_left(std::move(text), width);
    } else {
      std::string& text = texts[i];
      std::size_t point = text.find('.');
      text.append(fraction_width - (text.size() - point - 1), ' ');
      text = padded_left(std::move(text), width);
    }
  }
  return texts;
}

/// The texts NumPy gives the elements `values` of one array: integers right-aligned
/// to a shared width, bools as ` True`/`False`, floats by numpy_float_texts, strings
/// as Python bytes, unpadded.
template <class T>
KILN_COLD std::vector<std::string> numpy_element_texts(const std::vector<T>& values) {
  if constexpr (std::is_floating_point_v<T>) {
    return numpy_float_texts(values);
  } else {
    std::vector<std::string> texts;
    texts.reserve(values.size());
    std::size_t width = 0;
    for (const T& v : values) {
      if constexpr (std::is_same_v<T, bool>)
        texts.emplace_back(v ? " True" : "False");
      else
        texts.push_back(numpy_scalar_text(v));
      if constexpr (std::is_integral_v<T>) width = std::max(width, texts.back().size());
    }
    for (std::string& text : texts) text = padded_left(std::move(text), width);
    return texts;
  }
}

// ---- layout ------------------------------------------------------------------------

/// How the values of an array are laid out: which elements show and where rows and
/// lines break.
struct value_layout {
  std::int64_t edge_items = 3;   ///< items shown at each end of a summarized axis
  bool summarize = false;        ///< axes longer than 2 * edge_items show only their ends, around `...`
  std::size_t line_width = 0;    ///< the last axis wraps lines longer than this; 0 never wraps
  bool single_line = false;      ///< nested rows separated by a space instead of line breaks
};

/// Whether `layout` shows only the ends of an axis of `length` items.
inline bool summarized(std::int64_t length, const value_layout& layout) {
  return layout.summarize && length > 2 * layout.edge_items;
}

/// The row-major flat indices of the elements `layout` shows of a tensor of shape `s`,
/// in the order they are written.
KILN_COLD inline std::vector<std::int64_t> shown_indices(const shape& s, const value_layout& layout) {
  const int rank = s.rank();
  const auto strides = row_major_strides(s);
  std::vector<std::vector<std::int64_t>> positions(static_cast<std::size_t>(rank));
  std::size_t count = 1;
  for (int axis = 0; axis < rank; ++axis) {
    auto& p = positions[std::size_t(axis)];
    if (summarized(s[axis], layout)) {
      for (std::int64_t i = 0; i < layout.edge_items; ++i) p.push_back(i);
      for (std::int64_t i = s[axis] - layout.edge_items; i < s[axis]; ++i) p.push_back(i);
    } else {
      for (std::int64_t i = 0; i < s[axis]; ++i) p.push_back(i);
    }
    count *= p.size();
  }
  std::vector<std::int64_t> indices;
  if (count == 0) return indices;
  indices.reserve(count);
  std::vector<std::size_t> at(std::size_t(rank), 0);  // an odometer over the shown positions
  for (std::size_t k = 0; k < count; ++k) {
    std::int64_t flat = 0;
    for (int axis = 0; axis < rank; ++axis) flat += positions[std::size_t(axis)][at[std::size_t(axis)]] * strides[axis];
    indices.push_back(flat);
    for (int axis = rank - 1; axis >= 0; --axis) {
      if (++at[std::size_t(axis)] < positions[std::size_t(axis)].size()) break;
      at[std::size_t(axis)] = 0;
    }
  }
  return indices;
}

/// Writes the texts of the shown elements (in shown_indices order) as nested rows:
/// NumPy's `_formatArray`, which is also the layout of TensorFlow's C++ printer once
/// line wrapping is off.
class array_writer {
 public:
  array_writer(const shape& s, const std::vector<std::string>& items, const value_layout& layout)
      : shape_(s), items_(items), layout_(layout) {}

  KILN_COLD std::string write() {
    next_ = 0;
    // The indent stands in for the opening bracket, which replaces it at the end.
    return block(0, layout_.single_line ? "" : " ", static_cast<std::int64_t>(layout_.line_width));
  }

 private:
  KILN_COLD std::string block(int axis, const std::string& indent, std::int64_t width) {
    const std::int64_t length = shape_[axis];
    const bool cut = summarized(length, layout_);
    const std::int64_t shown = cut ? 2 * layout_.edge_items : length;
    std::string text;
    if (axis == shape_.rank() - 1) {
      // The closing bracket takes one column of the line.
      std::string line = indent;
      for (std::int64_t k = 0; k < shown; ++k) {
        if (k > 0) line += ' ';
        if (cut && k == layout_.edge_items) {
          add_word(text, line, "...", width - 1, indent);
          line += ' ';
        }
        add_word(text, line, items_[next_++], width - 1, indent);
      }
      text += line;
    } else {
      const std::string inner_indent = layout_.single_line ? indent : indent + ' ';
      const std::string separator =
          layout_.single_line ? std::string(" ") : std::string(std::size_t(shape_.rank() - axis - 1), '\n');
      for (std::int64_t k = 0; k < shown; ++k) {
        if (k > 0) text += separator;
        if (cut && k == layout_.edge_items) text += indent + "..." + separator;
        text += indent + block(axis + 1, inner_indent, width - 1);
      }
    }
    return "[" + text.substr(indent.size()) + "]";
  }

  // Appends `word` to `line`, first moving a full line into `text` when wrapping is on
  // and the word would pass `width` (a line holding only the indent never wraps).
  KILN_COLD void add_word(std::string& text, std::string& line, std::string_view word, std::int64_t width,
                const std::string& indent) const {
    bool wrap = layout_.line_width > 0 && std::int64_t(line.size() + word.size()) > width && line.size() > indent.size();
    if (wrap) {
      line.erase(line.find_last_not_of(' ') + 1);
      text += line + '\n';
      line = indent;
    }
    line += word;
  }

  const shape& shape_;
  const std::vector<std::string>& items_;
  value_layout layout_;
  std::size_t next_ = 0;
};

// ---- whole tensors -----------------------------------------------------------------

/// The value styles of format_values.
enum class value_style {
  numpy,          ///< NumPy's `str()`, as TensorFlow's eager `print(x)` shows values
  tf_print,       ///< tf.print: every axis longer than 6 shows its 3 first and last items
  tf_print_line,  ///< tf.print with nested rows on one line: `[[1 2] [3 4]]`
};

/// The values of a row-major array of `T` of shape `s` in `style`. NumPy style pads
/// elements to a shared width, wraps lines at 75 columns and shows `...` only past
/// 1000 elements; the tf.print styles write each element unpadded.
/// \code
/// const float data[] = {1.5f, 2.f};
/// kiln::detail::format_values_of(data, kiln::shape{2}, kiln::detail::value_style::numpy) == "[1.5 2. ]";
/// \endcode
template <class T>
KILN_COLD std::string format_values_of(const T* data, const shape& s, value_style style) {
  const bool numpy = style == value_style::numpy;
  if (s.rank() == 0) return numpy ? numpy_scalar_text(data[0]) : tf_print_text(data[0]);
  if (s.num_elements() == 0) return std::string("[]");
  value_layout layout;
  layout.summarize = numpy ? s.num_elements() > 1000 : true;
  layout.line_width = numpy ? 75 : 0;
  layout.single_line = style == value_style::tf_print_line;
  std::vector<T> shown;
  for (std::int64_t i : shown_indices(s, layout)) shown.push_back(data[i]);
  std::vector<std::string> texts;
  if (numpy) {
    texts = numpy_element_texts(shown);
  } else {
    for (const T& v : shown) texts.push_back(tf_print_text(v));
  }
  return array_writer(s, texts, layout).write();
}

/// The values of eager tensor `x` (copied from the GPU if there) in `style`.
/// \code kiln::detail::format_values(kiln::constant({1.5f, 2.f}), kiln::detail::value_style::numpy) == "[1.5 2. ]" \endcode
KILN_LIBRARY_INLINE std::string format_values(const tensor& x, value_style style);
#if KILN_DEFINE_LIBRARY
KILN_COLD KILN_LIBRARY_INLINE std::string format_values(const tensor& x, value_style style) {
  x.require_value("print");
  const tensor host = x.device() == kiln::device::cpu ? x : x.to(kiln::device::cpu);
  return visit_dtype(host.dtype(), [&]<class T>() {
    return format_values_of(host.template data<T>(), host.shape(), style);
  });
}
#endif

/// The values of eager tensor `x` as tf.print writes them (used by kiln::print):
/// `1`, `[1 2 3]`, `[[1 2] [3 4]]` with `single_line`, else each nested row on its
/// own line as TensorFlow writes it. Strings are quoted (`"a"`), bools are `1`/`0`.
/// tf.print writes a lone scalar string argument raw (`a`), which is the caller's
/// business. Symbolic tensors raise kiln::type_error.
/// \code kiln::detail::format_values(kiln::range(10), true) == "[0 1 2 ... 7 8 9]" \endcode
KILN_COLD inline std::string format_values(const tensor& x, bool single_line) {
  return format_values(x, single_line ? value_style::tf_print_line : value_style::tf_print);
}

/// One piece of a print: a text, or the input whose values are printed there.
struct print_piece {
  std::string text;
  int input = -1;
};

/// The line kiln::print writes for `pieces` and eager `inputs`, as tf.print writes
/// it: pieces separated by spaces, scalar strings raw, other tensors as their values.
inline std::string print_line(std::span<const print_piece> pieces, std::span<const tensor* const> inputs) {
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

/// Writes `line` whole to config::print_stream(), so that lines from several threads
/// do not interleave.
inline void write_print_line(const std::string& line) {
  static std::mutex m;
  std::lock_guard lock(m);
  config::print_stream() << line << std::flush;
}

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
KILN_COLD inline std::ostream& write_eager(std::ostream& os, std::string values, const shape& s, dtype t) {
  if (values.find('\n') != std::string::npos) values.insert(0, "\n");
  return os << "tensor(" << values << ", shape=" << s << ", dtype=" << t << ")";
}
}  // namespace detail

/// Writes `x` as Python's `print` writes an eager `tf.Tensor`, with `tensor(` for
/// `tf.Tensor(`: `tensor([4 1], shape=(2,), dtype=int32)`, `tensor(2.2, shape=(),
/// dtype=float32)`, `tensor(b'aa', shape=(), dtype=string)`; values laid out over
/// several lines start on a line of their own. A symbolic tensor prints as
/// TensorFlow prints one while tracing, with its graph value's name:
/// `Tensor("x:0", shape=(None,), dtype=int32)`. GPU tensors print their values.
/// \code std::cout << kiln::constant({{1, 2}, {3, 4}});  // tensor(\n[[1 2]\n [3 4]], shape=(2, 2), dtype=int32) \endcode
inline std::ostream& operator<<(std::ostream& os, const tensor& x) {
  if (!x.defined()) return os << "tensor(<undefined>)";
  if (x.is_symbolic())
    return os << "Tensor(\"" << x.symbol()->name << "\", shape=" << x.shape() << ", dtype=" << x.dtype() << ")";
  return detail::write_eager(os, detail::format_values(x, detail::value_style::numpy), x.shape(), x.dtype());
}

}  // namespace kiln

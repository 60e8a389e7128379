// kiln single header, generated from include/kiln/saved_function.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_SAVED_FUNCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_SAVED_FUNCTION_HPP
// ----- begin kiln/saved_function.hpp -----
/// \file
/// Saved functions: a traced function written to a file, and loaded and run by
/// another program without its callable (docs/saved_function_format.md).
///
/// An optional part of kiln, outside kiln/kiln.hpp: it needs nlohmann/json
/// (Debian `nlohmann-json3-dev`), whose CBOR codec reads and writes the file.
///
/// \code
/// kiln::variable w(kiln::ones({3, 2}), "w"), b(kiln::zeros({2}), "b");
/// kiln::function dense([&](const kiln::tensor& x) { return kiln::relu(kiln::matmul(x, w) + b); });
/// kiln::save(dense, "dense.kiln", kiln::tensor_spec({kiln::none, 3}, kiln::float32));
/// kiln::loaded_function served = kiln::load("dense.kiln");  // in another program
/// kiln::tensor y = served(kiln::ones({2, 3}));
/// \endcode
///
/// The loader checks what it reads before using it: a file that is truncated,
/// corrupted (every file carries a checksum), written by a newer kiln, names an op this
/// kiln does not have, or holds a node whose dtype or shape its op's rules do not give,
/// raises kiln::value_error (kiln::unavailable_error for a newer format or an unknown
/// op) naming the file and the problem.

#include <filesystem>
#include <span>
#include <tuple>
#include <vector>

#include "kiln/kiln.hpp"
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_FORMAT_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_FORMAT_HPP
// ----- begin kiln/io/saved_function/format.hpp -----
/// \file
/// The saved-function format's constants (docs/saved_function_format.md), the checksum
/// that tells a corrupted file from a good one, and the loader's error. Also decides
/// whether the reader and writer are compiled here or only declared (a source file
/// compiled against a kiln library that holds them).

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>


// A source file compiled against a compiled kiln whose library holds the reader and
// writer (KILN_LIBRARY_HAS_SAVED_FUNCTIONS, kiln/separate_compilation.hpp) declares them only, and
// parses neither their code nor nlohmann/json.
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_HAS_SAVED_FUNCTIONS) && !defined(KILN_LIBRARY_SOURCE)
#define KILN_DETAIL_SAVED_FUNCTION_CODE 0
#else
#define KILN_DETAIL_SAVED_FUNCTION_CODE 1
#endif

namespace kiln::detail {

/// The format this kiln writes, and the newest it reads.
inline constexpr int saved_format_version = 1;
inline constexpr std::string_view saved_format_name = "kiln.saved_function";

/// What a saved file starts with, before the length of its header.
inline constexpr std::string_view saved_magic = "KILNSAVE";

/// A 64-bit checksum of `parts`, in order: what tells a corrupted file from a good one.
/// Four lanes of 8-byte words, each step a bijection of the lane (xor, multiply by an
/// odd number, xor-shift), so that any one changed bit changes the sum, at memory speed.
inline std::uint64_t saved_checksum(std::initializer_list<std::span<const std::uint8_t>> parts) {
  std::uint64_t lanes[4] = {0x9E3779B97F4A7C15u, 0xC2B2AE3D27D4EB4Fu, 0x165667B19E3779F9u, 0x27D4EB2F165667C5u};
  const auto mix = [](std::uint64_t h, std::uint64_t w) {
    h = (h ^ w) * 0x9FB21C651E98DF25u;
    return h ^ (h >> 29);
  };
  std::uint64_t length = 0;
  for (std::span<const std::uint8_t> part : parts) {
    length += part.size();
    std::size_t i = 0;
    for (; i + 32 <= part.size(); i += 32)
      for (int k = 0; k < 4; ++k) {
        std::uint64_t word;
        std::memcpy(&word, part.data() + i + 8 * std::size_t(k), 8);
        lanes[k] = mix(lanes[k], word);
      }
    for (; i < part.size(); ++i) lanes[0] = mix(lanes[0], part[i]);
  }
  std::uint64_t h = length;
  for (std::uint64_t lane : lanes) h = mix(h, lane);
  return h;
}

/// What the loader raises: the file, then the problem.
[[noreturn]] inline void bad_saved_file(const std::string& path, const std::string& problem) {
  throw value_error("kiln::load: " + path + ": " + problem);
}

}  // namespace kiln::detail
// ----- end kiln/io/saved_function/format.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_FORMAT_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_CHECKED_READER_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_CHECKED_READER_HPP
// ----- begin kiln/io/saved_function/checked_reader.hpp -----
/// \file
/// Reading a saved file without trusting it: CBOR parsed with a bound on its nesting,
/// and accessors that check each JSON value's type and range, so that a corrupted
/// or hostile file raises kiln::value_error naming the file rather than reading garbage.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kiln/kiln.hpp"

#if KILN_DETAIL_SAVED_FUNCTION_CODE
#include <nlohmann/json.hpp>

namespace kiln::detail {

/// How deep a saved file's CBOR may nest: kiln's own format needs a few levels per
/// nested conditional or loop. A deeper document is refused while it is read, before
/// the reader's recursion (one stack frame per level) could overflow the stack.
inline constexpr std::size_t saved_max_nesting = 512;

/// Reads CBOR as nlohmann's own reader builds a document, stopping at a nesting
/// deeper than saved_max_nesting; `too_deep` tells that case from malformed bytes.
class bounded_cbor_reader : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
 public:
  explicit bounded_cbor_reader(nlohmann::json& root) : json_sax_dom_parser(root) {}
  bool start_object(std::size_t n) { return deeper() && json_sax_dom_parser::start_object(n); }
  bool start_array(std::size_t n) { return deeper() && json_sax_dom_parser::start_array(n); }
  bool end_object() {
    --depth_;
    return json_sax_dom_parser::end_object();
  }
  bool end_array() {
    --depth_;
    return json_sax_dom_parser::end_array();
  }
  bool too_deep() const { return too_deep_; }

 private:
  bool deeper() {
    too_deep_ = ++depth_ > saved_max_nesting;
    return !too_deep_;
  }
  std::size_t depth_ = 0;
  bool too_deep_ = false;
};

/// Reads what the loader must not trust: each accessor checks the JSON type and
/// range, so a corrupted file raises value_error rather than reading garbage.
class saved_reader {
 public:
  explicit saved_reader(std::string path) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& problem) const { bad_saved_file(path_, problem); }

  const nlohmann::json& at(const nlohmann::json& j, std::string_view key) const {
    if (!j.is_object()) fail("expected an object where " + std::string(key) + " is read");
    auto it = j.find(key);
    if (it == j.end()) fail("missing \"" + std::string(key) + "\"");
    return *it;
  }
  std::int64_t integer(const nlohmann::json& j, std::string_view what, std::int64_t low, std::int64_t high) const {
    if (!j.is_number_integer()) fail(std::string(what) + " is not an integer");
    if (j.is_number_unsigned() && j.get<std::uint64_t>() > std::uint64_t(high))
      fail(std::string(what) + " is " + std::to_string(j.get<std::uint64_t>()) + ", above " + std::to_string(high));
    const std::int64_t v = j.get<std::int64_t>();
    if (v < low || v > high)
      fail(std::string(what) + " is " + std::to_string(v) + ", outside [" + std::to_string(low) + ", " +
           std::to_string(high) + "]");
    return v;
  }
  std::uint64_t unsigned_at(const nlohmann::json& j, std::string_view key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_number_unsigned()) fail(std::string(key) + " is not an unsigned integer");
    return v.get<std::uint64_t>();
  }
  double number_at(const nlohmann::json& j, std::string_view key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_number()) fail(std::string(key) + " is not a number");
    return v.get<double>();
  }
  int integer_at(const nlohmann::json& j, std::string_view key, int low, int high) const {
    return int(integer(at(j, key), key, low, high));
  }
  bool boolean_at(const nlohmann::json& j, std::string_view key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_boolean()) fail(std::string(key) + " is not a boolean");
    return v.get<bool>();
  }
  /// The CBOR document `bytes` (`what` in errors); nested deeper than
  /// saved_max_nesting, or malformed, it fails.
  nlohmann::json cbor(std::span<const std::uint8_t> bytes, std::string_view what) const {
    nlohmann::json document;
    bounded_cbor_reader reader(document);
    if (!nlohmann::json::sax_parse(bytes, &reader, nlohmann::json::input_format_t::cbor)) {
      if (reader.too_deep())
        fail(std::string(what) + " nests deeper than " + std::to_string(saved_max_nesting) +
             " levels, more than a kiln saved function ever does");
      fail(std::string(what) + " is not valid CBOR");
    }
    return document;
  }
  std::string text(const nlohmann::json& j, std::string_view what) const {
    if (!j.is_string()) fail(std::string(what) + " is not a string");
    return j.get<std::string>();
  }
  std::string text_at(const nlohmann::json& j, std::string_view key) const { return text(at(j, key), key); }
  const nlohmann::json& array_at(const nlohmann::json& j, std::string_view key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_array()) fail(std::string(key) + " is not a list");
    return v;
  }

  kiln::dtype dtype_of(const nlohmann::json& j) const {
    const std::string n = text(j, "a dtype");
    for (int t = 0; t < dtype_count; ++t)
      if (name(kiln::dtype(t)) == n) return kiln::dtype(t);
    fail("unknown dtype \"" + n + "\"");
  }
  /// A shape, possibly partial (`None` dims are -1, an unknown rank is null).
  kiln::shape shape_of(const nlohmann::json& j) const {
    if (j.is_null()) return kiln::shape(unknown_rank);
    if (!j.is_array()) fail("a shape is neither a list nor null");
    if (j.size() > std::size_t(max_rank))
      fail("a shape has " + std::to_string(j.size()) + " dims, more than kiln's " + std::to_string(max_rank));
    kiln::shape s;
    for (const auto& d : j) s.push_back(integer(d, "a dim", none, std::int64_t(1) << 48));
    if (!s.count_fits()) fail("shape " + s.str() + " has too many elements");
    return s;
  }
  int_list ints_of(const nlohmann::json& j) const {
    if (!j.is_array() || j.size() > std::size_t(max_rank)) fail("an integer list is malformed");
    int_list l;
    for (const auto& v : j) l.push_back(integer(v, "a list item", -(std::int64_t(1) << 48), std::int64_t(1) << 48));
    return l;
  }

 private:
  std::string path_;
};

}  // namespace kiln::detail
#endif
// ----- end kiln/io/saved_function/checked_reader.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_CHECKED_READER_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_JSON_CODECS_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_JSON_CODECS_HPP
// ----- begin kiln/io/saved_function/json_codecs.hpp -----
/// \file
/// Values as a saved function's model holds them: shapes, tensors (their elements stored
/// after the model) and the attributes of registry ops (from each op's
/// `attribute_fields`).

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/mp11/algorithm.hpp>


#if KILN_DETAIL_SAVED_FUNCTION_CODE
namespace kiln::detail {

inline nlohmann::json shape_to_json(const shape& s) {
  if (!s.has_known_rank()) return nullptr;
  return nlohmann::json(std::vector<std::int64_t>(s.begin(), s.end()));
}

/// A tensor as the model describes it; its elements go to the end of `data` (strings
/// stay in the model), as the file stores them after the model: weights are copied
/// once, not parsed.
inline nlohmann::json tensor_to_json(const tensor& value, std::vector<std::uint8_t>& data) {
  const tensor t = value.device() == device::cpu ? value : value.to(device::cpu);
  nlohmann::json j{{"dtype", std::string(name(t.dtype()))}, {"shape", shape_to_json(t.shape())}};
  if (t.dtype() == string) {
    j["strings"] = t.to_vector<std::string>();
  } else {
    const auto* bytes = static_cast<const std::uint8_t*>(t.raw_data());
    const std::size_t count = std::size_t(t.size()) * std::size_t(size_of(t.dtype()));
    j["offset"] = data.size();
    j["bytes"] = count;
    data.insert(data.end(), bytes, bytes + count);
  }
  return j;
}

inline tensor tensor_from_json(const saved_reader& r, const nlohmann::json& j, std::span<const std::uint8_t> data) {
  const kiln::dtype type = r.dtype_of(r.at(j, "dtype"));
  const kiln::shape dims = r.shape_of(r.at(j, "shape"));
  if (!dims.is_fully_defined()) r.fail("a stored value has the partial shape " + dims.str());
  // Sizes are checked against what the file holds before anything is allocated.
  const std::int64_t elements = dims.num_elements();
  if (type == string) {
    const nlohmann::json& strings = r.array_at(j, "strings");
    if (std::int64_t(strings.size()) != elements)
      r.fail("a string value does not have its " + std::to_string(elements) + " elements");
    tensor t(type, dims);
    auto* out = static_cast<std::string*>(t.raw_data());
    for (std::size_t k = 0; k < strings.size(); ++k) out[k] = r.text(strings[k], "a string element");
    return t;
  }
  const std::size_t expected = std::size_t(elements) * std::size_t(size_of(type));
  const std::uint64_t offset = r.unsigned_at(j, "offset"), count = r.unsigned_at(j, "bytes");
  if (count != expected)
    r.fail("a " + std::string(name(type)) + " " + dims.str() + " value has " + std::to_string(count) +
           " bytes instead of " + std::to_string(expected));
  if (offset > data.size() || count > data.size() - offset)
    r.fail("a value's bytes [" + std::to_string(offset) + ", +" + std::to_string(count) + ") lie outside the file's " +
           std::to_string(data.size()) + " bytes of data");
  const std::span<const std::uint8_t> bytes = data.subspan(offset, count);
  if (type == bool_)
    for (std::uint8_t b : bytes)
      if (b > 1) r.fail("a bool value holds a byte that is neither 0 nor 1");
  tensor t(type, dims);
  if (expected) std::memcpy(t.raw_data(), bytes.data(), expected);
  return t;
}

// ---- op attributes ---------------------------------------------------------------

inline nlohmann::json attribute_to_json(const kiln::dtype& v) { return std::string(name(v)); }
inline nlohmann::json attribute_to_json(const kiln::shape& v) { return shape_to_json(v); }
inline nlohmann::json attribute_to_json(const int_list& v) { return std::vector<std::int64_t>(v.begin(), v.end()); }
inline nlohmann::json attribute_to_json(std::int64_t v) { return v; }
inline nlohmann::json attribute_to_json(bool v) { return v; }
inline nlohmann::json attribute_to_json(double v) { return v; }
inline nlohmann::json attribute_to_json(const reduction_axes& v) {
  return v.all() ? nlohmann::json(nullptr) : attribute_to_json(v.list());
}
inline nlohmann::json attribute_to_json(ops::padding v) { return v == ops::padding::same ? "same" : "valid"; }

inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, kiln::dtype& v) { v = r.dtype_of(j); }
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, kiln::shape& v) { v = r.shape_of(j); }
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, int_list& v) { v = r.ints_of(j); }
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, std::int64_t& v) {
  v = r.integer(j, "an attribute", -(std::int64_t(1) << 48), std::int64_t(1) << 48);
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, bool& v) {
  if (!j.is_boolean()) r.fail("a boolean attribute is not a boolean");
  v = j.get<bool>();
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, double& v) {
  if (!j.is_number()) r.fail("a number attribute is not a number");
  v = j.get<double>();
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, reduction_axes& v) {
  v = j.is_null() ? reduction_axes() : reduction_axes(r.ints_of(j));
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, ops::padding& v) {
  const std::string p = r.text(j, "a padding");
  if (p != "same" && p != "valid") r.fail("unknown padding \"" + p + "\"");
  v = p == "same" ? ops::padding::same : ops::padding::valid;
}

template <class Op>
concept has_attribute_fields = requires {
  Op::attribute_fields();
};

template <class Op>
nlohmann::json attributes_to_json(const Op& op) {
  nlohmann::json j = nlohmann::json::object();
  if constexpr (has_attribute_fields<Op>)
    std::apply([&](const auto&... a) { ((j[std::string(a.name)] = attribute_to_json(op.*a.member)), ...); },
               Op::attribute_fields());
  return j;
}

/// Op `name` of the registry with the attributes in `j`, or raises naming the op.
inline ops::any_op op_from_json(const saved_reader& r, const std::string& name, const nlohmann::json& j) {
  std::optional<ops::any_op> found;
  boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, ops::all_ops>>(
      [&]<class Op>(std::type_identity<Op>) {
        if (found || Op::name != name) return;
        Op op{};
        if constexpr (has_attribute_fields<Op>)
          std::apply([&](const auto&... a) { (attribute_from_json(r, r.at(j, a.name), op.*a.member), ...); },
                     Op::attribute_fields());
        found = ops::any_op(op);
      });
  if (!found)
    throw unavailable_error("kiln::load: " + r.path() + ": unknown op \"" + name +
                            "\" (written by a kiln with ops this one does not have)");
  return *found;
}

}  // namespace kiln::detail
#endif
// ----- end kiln/io/saved_function/json_codecs.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_JSON_CODECS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_SAVED_FUNCTION_IO_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_SAVED_FUNCTION_IO_HPP
// ----- begin kiln/io/saved_function/saved_function_io.hpp -----
/// \file
/// detail::saved_function_io, which writes and reads saved functions: the friend of the
/// types whose insides a saved function holds. Declared here; its writer is defined in
/// kiln/io/saved_function/writer.hpp, its reader in kiln/io/saved_function/reader.hpp,
/// or, for a program compiled against a kiln library that holds them, in the library.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#if KILN_DETAIL_SAVED_FUNCTION_CODE
#endif

namespace kiln {

class loaded_function;

namespace detail {

#if KILN_DETAIL_SAVED_FUNCTION_CODE
/// Writes and reads saved functions (the friend of the types whose insides a saved
/// function holds).
template <class>
struct saved_function_io {
  using json = nlohmann::json;

  // ---- writing (kiln/io/saved_function/writer.hpp) ----------------------------------

  struct writer;
  static json function(writer& w, const concrete_function& f);
  static void save(std::span<const concrete_function> functions, const std::filesystem::path& path);
  static void save(const concrete_function& f, const std::filesystem::path& path) { save(std::span(&f, 1), path); }

  // ---- reading (kiln/io/saved_function/reader.hpp) ----------------------------------

  static constexpr int deepest_nesting = 64;  // of conditionals and loops, against a hostile file

  struct loader;
  static std::vector<std::uint8_t> read_file(const std::string& path);
  static loaded_function load(const std::filesystem::path& file);
  static std::shared_ptr<concrete_state> concrete(const saved_reader& r, loader& l, const json& f);
  static kiln::variable variable_of(std::shared_ptr<variable_state> s) { return kiln::variable(std::move(s)); }
  static const concrete_state& state_of(const concrete_function& f) { return *f.state_; }
};

#else
/// Writes and reads saved functions: compiled in kiln's library (KILN_LIBRARY_HAS_SAVED_FUNCTIONS).
template <class>
struct saved_function_io {
  static void save(std::span<const concrete_function> functions, const std::filesystem::path& path);
  static void save(const concrete_function& f, const std::filesystem::path& path);
  static loaded_function load(const std::filesystem::path& file);
  static const concrete_state& state_of(const concrete_function& f);
};
#endif

}  // namespace detail
}  // namespace kiln
// ----- end kiln/io/saved_function/saved_function_io.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_SAVED_FUNCTION_IO_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_LOADED_FUNCTION_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_LOADED_FUNCTION_HPP
// ----- begin kiln/io/saved_function/loaded_function.hpp -----
/// \file
/// kiln::loaded_function: what kiln::load gives back.

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>


namespace kiln {

/// A function loaded from a file that kiln::save wrote: its concrete functions (one
/// per saved signature) and the variables they use, runnable with kiln::tensor
/// arguments, without the callable that was traced.
/// \code
/// kiln::loaded_function f = kiln::load("model.kiln");
/// std::cout << f.pretty_printed_concrete_signatures() << "\n";
/// kiln::tensor y = f(kiln::ones({2, 3}));
/// \endcode
class loaded_function {
 public:
  /// Runs the first concrete function whose signature accepts the arguments; one
  /// output is returned as is, use call_flat for several.
  template <class... Args>
  tensor operator()(const Args&... args) const {
    return select({&static_cast<const tensor&>(args)...})(args...);
  }
  /// Runs the first concrete function whose signature accepts the arguments and
  /// returns every output.
  template <class... Args>
  std::vector<tensor> call_flat(const Args&... args) const {
    return select({&static_cast<const tensor&>(args)...}).call_flat(args...);
  }
  /// The concrete functions, in the order they were saved.
  const std::vector<concrete_function>& concrete_functions() const { return functions_; }
  /// The signatures, in the format of kiln::function::pretty_printed_concrete_signatures.
  std::string pretty_printed_concrete_signatures() const {
    std::string s;
    for (const concrete_function& f : functions_) {
      const std::string text = detail::saved_function_io<>::state_of(f).signature_text();
      if (!s.empty()) s += "\n\n";
      s.append(text, 0, text.size() - 1);
    }
    return s;
  }
  /// The variables the functions read and write, with their current values: reading
  /// and assigning them works as on the variables of the program that saved them.
  const std::vector<kiln::variable>& variables() const { return variables_; }
  /// The variable named `name`, or kiln::value_error.
  const kiln::variable& variable(std::string_view name) const {
    for (const kiln::variable& v : variables_)
      if (v.name() == name) return v;
    throw value_error("loaded_function has no variable named '" + std::string(name) + "'");
  }

 private:
  friend struct detail::saved_function_io<>;
  const concrete_function& select(std::initializer_list<const tensor*> args) const {
    for (const concrete_function& f : functions_) {
      const auto& specs = f.structured_input_signature();
      if (specs.size() != args.size()) continue;
      bool ok = true;
      std::size_t k = 0;
      for (const tensor* t : args) ok = ok && specs[k++].accepts(t->dtype(), t->shape());
      if (ok) return f;
    }
    std::string given;
    for (const tensor* t : args)
      given += (given.empty() ? "" : ", ") + std::string(name(t->dtype())) + " " + t->shape().str();
    throw invalid_argument_error("loaded_function: no saved signature accepts (" + given + "); it has:\n" +
                                 pretty_printed_concrete_signatures());
  }
  std::vector<concrete_function> functions_;
  std::vector<kiln::variable> variables_;
};

}  // namespace kiln
// ----- end kiln/io/saved_function/loaded_function.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_LOADED_FUNCTION_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_WRITER_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_WRITER_HPP
// ----- begin kiln/io/saved_function/writer.hpp -----
/// \file
/// Writing saved functions: the model (each concrete function's graph, the variables
/// and generators they use) as CBOR, the tensors' elements after it.

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_SPECIAL_ATTRIBUTES_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_SPECIAL_ATTRIBUTES_HPP
// ----- begin kiln/io/saved_function/special_attributes.hpp -----
/// \file
/// Special ops in a saved function: what an op's `save(out)` writes its attributes
/// through, what its `load(in)` reads them and the node it rebuilds from, and the entry
/// by which the writer and the reader find both from the op's name
/// (kiln/io/special_ops.hpp). The ops themselves name no JSON: they call the members
/// below, which keep each key's JSON type as the format has it
/// (docs/saved_function_format.md).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
// ----- begin kiln/io/special_ops.hpp -----
/// \file
/// The special ops that files and other runtimes know: the one list that kiln::save,
/// kiln::load, kiln::onnx and TensorBoard's graph look a special node up in. Each op says
/// itself how it is saved, rebuilt, lowered to ONNX or refused, and what TensorBoard
/// shows of it (the members kiln::special_op lists); a consumer finds the op's entry (by
/// the op's kind, or by the name its nodes take when it loads a file) and calls it, so no
/// consumer names an op. A new special op is its own file and one entry here; an op
/// missing here is refused by name ("cannot save yet", "has no ONNX operator").
/// An optional part's header: it includes the ops' headers that kiln/kiln.hpp does not.

#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
// ----- begin kiln/exec/collective_op.hpp -----
/// \file
/// The special op of collectives across ranks (kiln/distributed.hpp: `kiln::all_reduce`,
/// `all_gather`, `broadcast`, `reduce_scatter`), and the hook through which it reaches
/// the transport. A collective node holds what it does (its kind, reduce op, root and
/// group) and takes its tensors as inputs; when it runs it hands them to the engine that
/// kiln/distribute/ installs (MPI for host tensors, NCCL for device ones). This header
/// holds no transport code and needs no MPI, so that the consumers of graphs that must
/// recognise the node (saved functions) include it alone, and a program built without
/// the distributed component that meets such a node says what it lacks.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace kiln {

/// How `kiln::all_reduce` and `kiln::reduce_scatter` combine the ranks' values:
/// TensorFlow's `tf.distribute.ReduceOp` (sum, mean) and the collectives' max and min.
/// \code kiln::reduce_op op = kiln::reduce_op::mean; \endcode
enum class reduce_op : unsigned char { sum, mean, max, min };

/// `sum`, `mean`, `max`, `min`.
/// \code kiln::name(kiln::reduce_op::max) == "max" \endcode
inline std::string_view name(reduce_op op) {
  static constexpr std::string_view names[] = {"sum", "mean", "max", "min"};
  return names[int(op)];
}

}  // namespace kiln

namespace kiln::detail {

/// What a collective does with its tensors.
enum class collective_kind : unsigned char {
  all_reduce,      ///< every rank gets the reduction of every rank's tensors
  all_gather,      ///< every rank gets every rank's tensor, stacked along axis 0 in rank order
  broadcast,       ///< every rank gets the root's tensor
  reduce_scatter,  ///< rank r gets block r (along axis 0) of the reduction
  reduce,          ///< the root gets the reduction, the others zeros (broadcast's gradient)
};

/// The graph op of each kind, as a graph listing shows it (TensorFlow's collective ops'
/// names; `CollectiveReduce` is NCCL's `Reduce`, which TensorFlow's graphs call
/// NcclReduce).
inline std::string_view collective_op_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastV2",
                                               "CollectiveReduceScatterV2", "CollectiveReduce"};
  return names[int(kind)];
}
/// The function of each kind, as messages name it.
inline std::string_view collective_api_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"kiln::all_reduce", "kiln::all_gather", "kiln::broadcast",
                                               "kiln::reduce_scatter", "kiln::broadcast's gradient"};
  return names[int(kind)];
}

/// A collective as a node holds it.
struct collective_spec {
  collective_kind kind = collective_kind::all_reduce;
  reduce_op op = reduce_op::sum;  ///< all_reduce, reduce_scatter, reduce
  int root = 0;                   ///< broadcast, reduce: the rank (in the group) whose tensor counts
  /// The group: the world ranks of its members in the group's rank order; empty for
  /// every rank of the world.
  std::vector<int> members;
  /// The transport's state of the group (kiln/distribute/): set for a collective the
  /// program made, null for one loaded from a file, whose group `members` finds.
  std::shared_ptr<void> group;
  /// Where the program calls it (a hash of its source file, line and column, and the
  /// line): ranks that reach a collective from different places have lost step, since
  /// every rank runs the same program.
  std::uint64_t site = 0;
  std::uint32_t line = 0;
};

/// The `site` of a collective called at `file`, `line`, `column`.
inline std::uint64_t collective_site(std::string_view file, std::uint32_t line, std::uint32_t column) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (char c : file) hash = (hash ^ std::uint8_t(c)) * 1099511628211ull;
  for (std::uint32_t v : {line, column})
    for (int b = 0; b < 4; ++b) hash = (hash ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return hash;
}

/// Why a collective cannot take its inputs: nothing, or which rule they break.
struct collective_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks the dtype and shape of a collective's inputs (one tensor, or several of one
/// dtype for an all_reduce) in a group of `group_size` ranks, and gives the results'
/// shapes in `results`. Partial shapes pass when some shape of them would.
/// (A template on nothing, compiled only where a program uses it.)
template <class = void>
collective_failure check_collective(const collective_spec& s, std::span<const std::pair<dtype, shape>> inputs,
                                    int group_size, std::vector<std::pair<dtype, shape>>* results = nullptr) {
  const std::string who(collective_api_name(s.kind));
  auto fail = [&](collective_failure::kind_t kind, const std::string& problem) {
    return collective_failure{kind, who + ": " + problem};
  };
  if (inputs.empty()) return fail(collective_failure::wrong_shape, "no tensors given");
  if (s.kind != collective_kind::all_reduce && inputs.size() != 1)
    return fail(collective_failure::wrong_shape, "takes one tensor, got " + std::to_string(inputs.size()));
  const dtype t = inputs[0].first;
  for (const auto& [type, dims] : inputs)
    if (type != t)
      return fail(collective_failure::wrong_dtype, "the tensors of one all_reduce share a dtype, got " +
                                                       std::string(name(t)) + " and " + std::string(name(type)));
  const bool reduces = s.kind == collective_kind::all_reduce || s.kind == collective_kind::reduce_scatter ||
                       s.kind == collective_kind::reduce;
  if (reduces && !dtypes::numeric.contains(t))
    return fail(collective_failure::wrong_dtype, "reduce_op::" + std::string(name(s.op)) +
                                                     " needs int32, int64, float32 or float64 tensors, got " +
                                                     std::string(name(t)));
  if (s.kind == collective_kind::reduce && !is_floating(t))
    return fail(collective_failure::wrong_dtype, "takes float32 or float64 tensors, got " + std::string(name(t)));
  if ((s.kind == collective_kind::broadcast || s.kind == collective_kind::reduce) &&
      (s.root < 0 || s.root >= group_size))
    return fail(collective_failure::wrong_shape, "root " + std::to_string(s.root) + " is not a rank of a group of " +
                                                     std::to_string(group_size));
  const shape& first = inputs[0].second;
  if (s.kind == collective_kind::all_gather || s.kind == collective_kind::reduce_scatter) {
    if (first.has_known_rank() && first.rank() == 0)
      return fail(collective_failure::wrong_shape, "needs a tensor of rank 1 or more (it works along axis 0), got a scalar");
    if (s.kind == collective_kind::reduce_scatter && first.has_known_rank() && first[0] != none &&
        first[0] % group_size != 0)
      return fail(collective_failure::wrong_shape, "the first dim of shape " + first.str() +
                                                       " does not divide into " + std::to_string(group_size) +
                                                       " equal blocks, one per rank");
  }
  if (results) {
    results->clear();
    for (const auto& [type, dims] : inputs) {
      shape out = dims;
      if (dims.has_known_rank() && dims.rank() > 0 && dims[0] != none) {
        std::vector<std::int64_t> d(dims.begin(), dims.end());
        if (s.kind == collective_kind::all_gather) d[0] *= group_size;
        if (s.kind == collective_kind::reduce_scatter) d[0] /= group_size;
        out = shape(std::span<const std::int64_t>(d));
      }
      results->emplace_back(type, out);
    }
  }
  return {};
}

class collective_op;

/// Where collectives run: the transport that kiln/distribute/ installs when a program
/// includes kiln/distributed.hpp (null otherwise).
struct collective_engine {
  /// Runs `op` on eager inputs and writes one tensor per result into `results`.
  void (*run)(const collective_op& op, std::span<const tensor* const> inputs, std::span<tensor> results) = nullptr;
  /// The number of ranks of a group (`members` empty: the world).
  int (*group_size)(const std::vector<int>& members) = nullptr;
};
inline std::atomic<const collective_engine*>& collective_engine_slot() {
  static std::atomic<const collective_engine*> engine{nullptr};
  return engine;
}

/// What a program without the distributed component says when it meets a collective.
[[noreturn]] inline void throw_no_collective_engine(std::string_view where, std::string_view op) {
  throw unavailable_error(std::string(where) + std::string(op) +
                          " is a collective across ranks, which needs kiln's distributed component: "
                          "#include <kiln/distributed.hpp> and link the CMake target kiln::distributed");
}

/// A collective across ranks: its inputs are the tensors it combines, its results one per
/// input. It has effects: every rank must run the same collectives in the same order, so
/// they run in program order and are never pruned, folded or merged.
class collective_op final : public special_op {
 public:
  explicit collective_op(collective_spec spec) : special_op(std::type_identity<collective_op>()), spec_(std::move(spec)) {}
  std::string_view name() const { return collective_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine("", name());
    std::vector<tensor> out(in.size());
    engine->run(*this, in, out);
    return out;
  }
  const collective_spec& spec() const { return spec_; }

  static std::array<std::string_view, 5> op_names() {
    return {collective_op_name(collective_kind::all_reduce), collective_op_name(collective_kind::all_gather),
            collective_op_name(collective_kind::broadcast), collective_op_name(collective_kind::reduce_scatter),
            collective_op_name(collective_kind::reduce)};
  }
  /// Saved as what it does; the kind is in the op's name, the group is its world ranks
  /// (empty: the world).
  template <class Out>
  void save(Out& out) const {
    out.set("reduce", std::string(kiln::name(spec_.op)));
    out.set("root", spec_.root);
    out.set("members", spec_.members);
    out.set("site", spec_.site);
    out.set("line", spec_.line);
  }
  /// Rebuilt only where the distributed component runs collectives, which tells the
  /// size of its group.
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    collective_kind kind = collective_kind::all_reduce;
    for (auto k : {collective_kind::all_reduce, collective_kind::all_gather, collective_kind::broadcast,
                   collective_kind::reduce_scatter, collective_kind::reduce})
      if (collective_op_name(k) == in.op()) kind = k;
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine(in.context(), in.op());
    collective_spec spec{kind, reduce_op::sum, in.integer("root", 0, INT32_MAX), {}, nullptr, in.unsigned_integer("site"),
                         std::uint32_t(in.integer("line", 0, INT32_MAX))};
    const std::string reduce = in.text("reduce");
    bool known = false;
    for (auto o : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min})
      if (kiln::name(o) == reduce) spec.op = o, known = true;
    if (!known) in.fail("unknown reduce op \"" + reduce + "\"");
    for (int m : in.integers("members", 0, INT32_MAX)) spec.members.push_back(m);
    std::vector<std::pair<dtype, shape>> given, made;
    for (int k = 0; k < in.input_count(); ++k) given.emplace_back(in.input(k).dtype(), in.input(k).shape());
    int size = 0;
    try {
      size = engine->group_size(spec.members);
    } catch (const error& e) {
      in.fail(e.what());
    }
    if (collective_failure f = check_collective(spec, given, size, &made)) in.fail(f.message);
    in.expect_results(made);
    return std::make_shared<collective_op>(std::move(spec));
  }
  static constexpr std::string_view onnx_refusal =
      "exchanges tensors with other processes (a collective); an ONNX model runs in one";

 private:
  collective_spec spec_;
};

}  // namespace kiln::detail
// ----- end kiln/exec/collective_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
// ----- begin kiln/exec/summary_op.hpp -----
/// \file
/// The special op of TensorBoard summaries (kiln/summary.hpp), and the hook through
/// which it reaches a writer. A summary node holds what it writes (its kind, tag,
/// description and the kind's parameter) and takes its value and step as inputs; when
/// it runs it looks up the default writer of the calling thread, so that a function
/// traced, or saved and loaded, without a writer writes to whichever writer is the
/// default at each call. The writers themselves (event files, protocol buffers, PNG)
/// live in kiln/io/summary/, above this layer: they fill the hook, so that this header
/// (which saved functions, ONNX export and training loops include to recognise or
/// write summaries) carries none of their code.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>


namespace kiln::detail {

/// What a summary shows in TensorBoard: a curve of scalars, a histogram, text or images.
enum class summary_kind : unsigned char { scalar, histogram, text, image };

/// The graph op of each kind, as a graph listing shows it.
inline std::string_view summary_op_name(summary_kind kind) {
  switch (kind) {
    case summary_kind::histogram: return "WriteHistogramSummary";
    case summary_kind::text: return "WriteTextSummary";
    case summary_kind::image: return "WriteImageSummary";
    default: return "WriteScalarSummary";
  }
}

/// What a summary writes besides its value and step.
struct summary_spec {
  summary_kind kind = summary_kind::scalar;
  std::string tag;          ///< the name TensorBoard shows
  std::string description;  ///< shown beside the plot (Markdown); may be empty
  int parameter = 0;        ///< histogram: the bucket count; image: max_outputs; otherwise 0
};

/// Why a summary cannot take a value or a step: nothing, or which rule it breaks.
struct summary_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks a summary's value (`value_type`, `value_shape`) and step against what its
/// kind takes. Partial shapes (None dims, unknown rank) pass when a value of some
/// fitting shape would: the node checks the concrete shapes again when it runs.
/// (Messages are made only on failure: a node runs this at every call. Like the other
/// functions here, a template on nothing, compiled only where a program uses it.)
template <class = void>
summary_failure check_summary_inputs(const summary_spec& s, dtype value_type, const shape& value_shape,
                                            dtype step_type, const shape& step_shape) {
  auto fail = [&](summary_failure::kind_t kind, const std::string& problem) {
    static constexpr std::string_view kinds[] = {"scalar", "histogram", "text", "image"};
    return summary_failure{kind, "kiln::summary::" + std::string(kinds[int(s.kind)]) + " '" + s.tag + "': " + problem};
  };
  auto value = [&] { return std::string(name(value_type)) + " " + value_shape.str(); };
  if (step_type != int32 && step_type != int64)
    return fail(summary_failure::wrong_dtype, "the step must be an int32 or int64 scalar, got " +
                                                  std::string(name(step_type)) + " " + step_shape.str());
  if (step_shape.has_known_rank() && step_shape.rank() != 0)
    return fail(summary_failure::wrong_shape, "the step must be a scalar, got shape " + step_shape.str());
  switch (s.kind) {
    case summary_kind::scalar:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the value must be numeric, got " + value());
      if (value_shape.has_known_rank() && value_shape.rank() != 0)
        return fail(summary_failure::wrong_shape, "the value must be a scalar, got shape " + value_shape.str());
      break;
    case summary_kind::histogram:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the values must be numeric, got " + value());
      break;
    case summary_kind::text:
      if (value_type != string)
        return fail(summary_failure::wrong_dtype, "the value must be a string tensor, got " + value());
      break;
    case summary_kind::image:
      if (value_type == string || value_type == bool_)
        return fail(summary_failure::wrong_dtype,
                    "the images must be float32 or float64 (in [0, 1]) or int32 or int64 (in [0, 255]), got " + value());
      if (value_shape.has_known_rank()) {
        if (value_shape.rank() != 4)
          return fail(summary_failure::wrong_shape,
                      "the images must be of rank 4 (count, height, width, channels), got shape " + value_shape.str());
        const std::int64_t channels = value_shape[3];
        if (channels != none && (channels < 1 || channels > 4))
          return fail(summary_failure::wrong_shape,
                      "the images must have 1 (gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA) channels, got shape " +
                          value_shape.str());
        if (value_shape[1] == 0 || value_shape[2] == 0)
          return fail(summary_failure::wrong_shape,
                      "an image must be at least 1 pixel high and wide, got shape " + value_shape.str());
      }
      break;
  }
  return {};
}

/// Raises the error of `f`: kiln::type_error for a dtype and kiln::value_error for a
/// shape (as TensorFlow's summaries raise, eagerly and while tracing), or
/// kiln::invalid_argument_error for a shape found wrong only when a graph runs.
template <class = void>
[[noreturn]] void throw_summary_failure(const summary_failure& f, bool running_graph) {
  if (running_graph) throw invalid_argument_error(f.message);
  if (f.kind == summary_failure::wrong_dtype) throw type_error(f.message);
  throw value_error(f.message);
}

/// Where summaries go: a writer, reached through a function pointer that the writer
/// sets (kiln/io/summary/writer.hpp), so that code below it writes without its code.
struct summary_target {
  /// Writes `value` as summary `spec` at `step`; returns whether it wrote. A value the
  /// writer cannot show (an integer pixel outside [0, 255], a NaN in a histogram)
  /// raises kiln::invalid_argument_error.
  bool (*write)(summary_target& self, const summary_spec& spec, const tensor& value, std::int64_t step) = nullptr;
  /// Writes a serialized GraphDef (TensorBoard's graph view).
  void (*write_graph)(summary_target& self, std::string_view graph_def) = nullptr;
  /// Hands what is queued to the file.
  void (*flush)(summary_target& self) = nullptr;
};

/// This thread's default writer (null when none): what kiln::summary::file_writer's
/// as_default() sets for its lifetime, as tf.summary's default writer is per thread.
inline summary_target*& default_summary_target() {
  thread_local summary_target* target = nullptr;
  return target;
}

/// How code below kiln/summary.hpp (a training loop given a log directory) opens a
/// writer on a directory: `summary_file_opener<>::open(logdir)`, a shared
/// summary_target. Declared here, defined by kiln/summary.hpp; such code names it as a
/// defaulted template argument and checks that it is complete where it is
/// instantiated, as concrete_function::save does with saved_function_io, so that a
/// program that never includes kiln/summary.hpp compiles none of the writer, and one
/// that asks for a log directory without it gets a compile error that says so:
/// \code
/// template <class Opener = kiln::detail::summary_file_opener<>>
/// std::shared_ptr<kiln::detail::summary_target> open_log(const std::filesystem::path& logdir) {
///   if constexpr (requires { Opener::open(logdir); })
///     return Opener::open(logdir);
///   else
///     static_assert(sizeof(Opener*) == 0, "a log directory needs #include <kiln/summary.hpp>");
/// }
/// \endcode
template <class = void>
struct summary_file_opener;

/// The hook for training loops (kiln::fit): writes each (tag, value) pair as a scalar
/// summary at `step` to `target` (a writer, from summary_file_opener or the thread's
/// default one when null); returns false when there is no writer. Tags are as tf.keras' TensorBoard callback
/// names them (`epoch_loss`, `epoch_accuracy`) by the caller's choice.
/// \code
/// const std::pair<std::string, double> logs[] = {{"epoch_loss", 0.25}, {"epoch_accuracy", 0.9}};
/// kiln::detail::write_scalar_summaries(logs, 3);  // false: no default writer here
/// \endcode
template <class = void>
bool write_scalar_summaries(std::span<const std::pair<std::string, double>> values, std::int64_t step,
                            summary_target* target = nullptr) {
  if (!target) target = default_summary_target();
  if (!target) return false;
  for (const auto& [tag, v] : values) {
    tensor t(float64, shape{});
    *static_cast<double*>(t.raw_data()) = v;
    target->write(*target, summary_spec{summary_kind::scalar, tag, {}, 0}, t, step);
  }
  return true;
}

/// The step of a summary as an integer: an int32 or int64 scalar (checked before).
template <class = void>
std::int64_t summary_step(const tensor& step) {
  if (step.device() != device::cpu) return summary_step(step.to(device::cpu));
  return step.dtype() == int32 ? std::int64_t(*static_cast<const std::int32_t*>(step.raw_data()))
                               : *static_cast<const std::int64_t*>(step.raw_data());
}

/// Writes a summary to the default writer at every run: its inputs are the value and
/// the step, its one result a bool scalar, true when it wrote (false without a writer).
class summary_op final : public special_op {
 public:
  template <class = void>
  explicit summary_op(summary_spec spec) : special_op(std::type_identity<summary_op>()), spec_(std::move(spec)) {
    for (int k = 0; k < 2; ++k) {
      written_[k] = tensor(bool_, shape{});
      *static_cast<bool*>(written_[k].raw_data()) = k == 1;
    }
  }
  std::string_view name() const { return summary_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  tensor run(std::span<const tensor* const> in) const {
    summary_target* target = default_summary_target();
    if (!target) return written_[0];
    const tensor& value = *in[0];
    const tensor& step = *in[1];
    if (summary_failure f = check_summary_inputs(spec_, value.dtype(), value.shape(), step.dtype(), step.shape()))
      throw_summary_failure(f, true);  // (only a shape the trace left partial can fail here)
    return written_[target->write(*target, spec_, value, summary_step(step)) ? 1 : 0];
  }
  const summary_spec& spec() const { return spec_; }

  static std::array<std::string_view, 4> op_names() {
    return {summary_op_name(summary_kind::scalar), summary_op_name(summary_kind::histogram),
            summary_op_name(summary_kind::text), summary_op_name(summary_kind::image)};
  }
  /// Saved as what it writes besides its inputs; the kind is in the op's name, the
  /// writer is the loading program's default one.
  template <class Out>
  void save(Out& out) const {
    out.set("tag", spec_.tag);
    out.set("description", spec_.description);
    out.set("parameter", spec_.parameter);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    summary_kind kind = summary_kind::scalar;
    for (auto k : {summary_kind::scalar, summary_kind::histogram, summary_kind::text, summary_kind::image})
      if (summary_op_name(k) == in.op()) kind = k;
    summary_spec spec{kind, in.text("tag"), in.text("description"), in.integer("parameter", 0, INT32_MAX)};
    if (in.input_count() != 2) in.fail(in.op() + " takes two inputs, a value and a step");
    const node &value = in.input(0), &step = in.input(1);
    if (summary_failure f = check_summary_inputs(spec, value.dtype(), value.shape(), step.dtype(), step.shape()))
      in.fail(f.message);
    in.expect_results({{bool_, shape{}}});
    return std::make_shared<summary_op>(std::move(spec));
  }
  /// What TensorBoard's graph shows of it: its tag.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("tag", spec_.tag);
  }
  static constexpr std::string_view onnx_refusal = "writes a TensorBoard summary; an ONNX model writes no files";

 private:
  summary_spec spec_;
  tensor written_[2];  // false, true: results shared by every run, allocated once
};

}  // namespace kiln::detail
// ----- end kiln/exec/summary_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#include "kiln/kiln.hpp"

namespace kiln::detail {

/// Every special op that a saved function, an ONNX model or TensorBoard's graph may meet.
using known_special_ops =
    boost::mp11::mp_list<read_variable_op, assign_variable_op, print_op, host_callback_op, cond_op, while_op,
                         random_uniform_op, summary_op, collective_op, reduce_dataset_op, iterator_get_next_op,
                         typed::described_op>;

/// A consumer's entry for one op of known_special_ops, and how to tell that op.
template <class Entry>
struct known_special_op {
  bool (*is)(const special_op& op);  ///< whether `op` is this kind of op
  Entry entry;
};

/// A consumer's entries: `Entry::template of<Op>()` for each op of known_special_ops, in
/// its order. Made on first use.
template <class Entry>
const std::vector<known_special_op<Entry>>& special_op_entries() {
  static const std::vector<known_special_op<Entry>> entries = [] {
    std::vector<known_special_op<Entry>> e;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          e.push_back({[](const special_op& op) { return op.as<Op>() != nullptr; }, Entry::template of<Op>()});
        });
    return e;
  }();
  return entries;
}

/// The entry of `op`'s kind, or null for a kind that known_special_ops does not list.
/// By kind rather than by name: a typed trace's graph describes its steps with the
/// runtime tier's names (typed::described_op).
template <class Entry>
const Entry* special_op_entry(const special_op& op) {
  for (const known_special_op<Entry>& k : special_op_entries<Entry>())
    if (k.is(op)) return &k.entry;
  return nullptr;
}

/// The entry of the op whose nodes take the name `name` (`Op::op_names()`), as a file
/// names it, or null for a name that no op of known_special_ops takes.
template <class Entry>
const Entry* special_op_entry(std::string_view name) {
  static const std::unordered_map<std::string_view, const Entry*> by_name = [] {
    std::unordered_map<std::string_view, const Entry*> t;
    std::size_t k = 0;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          for (std::string_view n : Op::op_names()) t.emplace(n, &special_op_entries<Entry>()[k].entry);
          ++k;
        });
    return t;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

}  // namespace kiln::detail
// ----- end kiln/io/special_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP

#if KILN_DETAIL_SAVED_FUNCTION_CODE
namespace kiln::detail {

/// A special op's attributes being written: one JSON object of the model. `Writer`
/// writes the graphs, variables and generators they refer to.
template <class Writer>
class special_attributes_out {
 public:
  special_attributes_out(Writer& w, nlohmann::json& j) : w_(w), j_(j) {}
  /// A number, a bool, a string or a list of numbers.
  template <class V>
  void set(std::string_view key, const V& v) {
    j_[std::string(key)] = v;
  }
  void set_null(std::string_view key) { j_[std::string(key)] = nullptr; }
  void set_dtype(std::string_view key, kiln::dtype t) { j_[std::string(key)] = std::string(name(t)); }
  void set_shape(std::string_view key, const kiln::shape& s) { j_[std::string(key)] = shape_to_json(s); }
  /// A graph the op runs, written as a function's graph is.
  void set_graph(std::string_view key, const kiln::graph& g) { j_[std::string(key)] = w_.graph(g); }
  /// A variable, by its place among the file's variables (written once).
  void set_variable(std::string_view key, const std::shared_ptr<variable_state>& v) {
    j_[std::string(key)] = w_.variable_id(v);
  }
  /// A generator, by its place among the file's generators (written once).
  void set_generator(std::string_view key, const std::shared_ptr<generator_state>& g) {
    j_[std::string(key)] = w_.generator_id(g);
  }
  /// A list of `count` objects, item `k` written by `fill(item, k)`.
  template <class Fill>
  void set_items(std::string_view key, std::size_t count, Fill fill) {
    nlohmann::json list = nlohmann::json::array();
    for (std::size_t k = 0; k < count; ++k) {
      nlohmann::json item = nlohmann::json::object();
      special_attributes_out out(w_, item);
      fill(out, k);
      list.push_back(std::move(item));
    }
    j_[std::string(key)] = std::move(list);
  }

 private:
  Writer& w_;
  nlohmann::json& j_;
};

/// A special node being read back: its op name, attributes, inputs and declared
/// results, each read value checked (a bad one raises kiln::value_error naming the
/// file). `Loader` reads the graphs, variables and generators it refers to.
template <class Loader>
class special_attributes_in {
 public:
  using results_t = std::vector<std::pair<kiln::dtype, kiln::shape>>;

  special_attributes_in(Loader& l, const std::string& where, const std::string& op, const nlohmann::json& j,
                        const kiln::graph& g, const std::vector<int>& inputs, const results_t& results, int depth)
      : l_(l), where_(where), op_(op), j_(j), g_(g), inputs_(inputs), results_(results), depth_(depth) {}

  /// The op's name in the file (which of its kinds it is).
  const std::string& op() const { return op_; }
  /// Raises kiln::value_error naming the file, the node and `problem`.
  [[noreturn]] void fail(const std::string& problem) const { l_.r.fail(where_ + ": " + problem); }
  /// What an error raised here for the node starts with (`kiln::load: <file>: node <k>: `).
  std::string context() const { return "kiln::load: " + l_.r.path() + ": " + where_ + ": "; }

  std::string text(std::string_view key) const { return l_.r.text_at(j_, key); }
  int integer(std::string_view key, int low, int high) const { return l_.r.integer_at(j_, key, low, high); }
  std::uint64_t unsigned_integer(std::string_view key) const { return l_.r.unsigned_at(j_, key); }
  double number(std::string_view key) const { return l_.r.number_at(j_, key); }
  bool boolean(std::string_view key) const { return l_.r.boolean_at(j_, key); }
  bool is_null(std::string_view key) const { return l_.r.at(j_, key).is_null(); }
  kiln::dtype dtype(std::string_view key) const { return l_.r.dtype_of(l_.r.at(j_, key)); }
  kiln::shape shape(std::string_view key) const { return l_.r.shape_of(l_.r.at(j_, key)); }
  /// A list of integers, each in [low, high].
  std::vector<int> integers(std::string_view key, int low, int high) const {
    std::vector<int> out;
    for (const nlohmann::json& v : l_.r.array_at(j_, key)) out.push_back(int(l_.r.integer(v, key, low, high)));
    return out;
  }
  /// The objects of list `key`, each read as this node's attributes are.
  std::vector<special_attributes_in> items(std::string_view key) const {
    std::vector<special_attributes_in> out;
    for (const nlohmann::json& item : l_.r.array_at(j_, key)) {
      out.push_back(*this);
      out.back().j_ = std::cref(item);
    }
    return out;
  }
  /// A graph the op runs, read and checked as a function's graph is, one level deeper.
  kiln::graph graph(std::string_view key) const { return l_.graph(l_.r.at(j_, key), depth_ + 1); }
  std::shared_ptr<variable_state> variable(std::string_view key) const {
    return l_.variables[std::size_t(l_.r.integer_at(j_, key, 0, int(l_.variables.size()) - 1))];
  }
  std::shared_ptr<generator_state> generator(std::string_view key) const {
    const int g = l_.r.integer_at(j_, key, 0, int(l_.generators.size()) - 1);
    return l_.generators[std::size_t(g)];
  }

  int input_count() const { return int(inputs_.size()); }
  /// The node of the enclosing graph that gives input `k`.
  const node& input(int k) const { return g_.node_at(inputs_[std::size_t(k)]); }
  /// Fails unless the node's declared results are the dtypes the op gives and shapes
  /// that accept those it gives (the plan takes them from the node).
  void expect_results(const results_t& given) const { l_.check_results(where_, results_, given); }
  /// Fails unless argument `k` of `sub` accepts node `in` of the enclosing graph.
  void check_argument(const kiln::graph& sub, std::size_t k, const node& in) const { l_.check_argument(where_, sub, k, in); }
  /// The dtypes and shapes of `sub`'s outputs from `first` on.
  static results_t outputs_of(const kiln::graph& sub, std::size_t first = 0) { return Loader::outputs_of(sub, first); }

 private:
  Loader& l_;
  const std::string& where_;
  const std::string& op_;
  std::reference_wrapper<const nlohmann::json> j_;
  const kiln::graph& g_;
  const std::vector<int>& inputs_;
  const results_t& results_;
  int depth_;
};

/// How the writer and the reader of saved functions reach a special op (an entry of
/// special_op_entries): its `save` and `load`, or why it cannot be saved.
template <class Writer, class Loader>
struct saved_special_op {
  void (*save)(special_attributes_out<Writer>& out, const special_op& op) = nullptr;
  std::shared_ptr<const special_op> (*load)(special_attributes_in<Loader>& in) = nullptr;
  std::string_view refusal;  ///< why it cannot be saved (`save_refusal`), or empty

  template <class Op>
  static saved_special_op of() {
    saved_special_op e;
    if constexpr (requires { Op::save_refusal; }) {
      e.refusal = Op::save_refusal;
    } else {
      e.save = [](special_attributes_out<Writer>& out, const special_op& op) { op.as<Op>()->save(out); };
      e.load = [](special_attributes_in<Loader>& in) { return Op::load(in); };
    }
    return e;
  }
};

}  // namespace kiln::detail
#endif
// ----- end kiln/io/saved_function/special_attributes.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_SPECIAL_ATTRIBUTES_HPP

#if KILN_DETAIL_SAVED_FUNCTION_CODE
namespace kiln::detail {

template <class T>
struct saved_function_io<T>::writer {
  json variables = json::array();
  std::unordered_map<const variable_state*, int> variable_ids;
  json generators = json::array();
  std::unordered_map<const generator_state*, int> generator_ids;
  std::vector<std::uint8_t> data;  ///< the elements of every tensor, stored after the model

  int generator_id(const std::shared_ptr<generator_state>& g) {
    auto [it, fresh] = generator_ids.emplace(g.get(), int(generators.size()));
    if (fresh) generators.push_back(json{{"key", g->key.load()}, {"next_stream", g->next_stream.load()}});
    return it->second;
  }

  int variable_id(const std::shared_ptr<variable_state>& v) {
    auto [it, fresh] = variable_ids.emplace(v.get(), int(variables.size()));
    if (fresh) {
      // Undefined for a variable created while tracing and not yet run: its graph's
      // InitializeVariableOp sets it on the first run, after loading as before.
      tensor value = v->update([](const tensor& t) { return t; });
      variables.push_back(json{{"name", v->name()},
                               {"dtype", std::string(name(v->type()))},
                               {"shape", shape_to_json(v->dims())},
                               {"value", value.defined() ? tensor_to_json(value, data) : json(nullptr)}});
    }
    return it->second;
  }

  // The op's own save(), found by its kind (kiln/io/special_ops.hpp).
  json special(const node& n) {
    const special_op& s = n.special();
    const auto* entry = special_op_entry<saved_special_op<writer, loader>>(s);
    if (!entry)
      throw unavailable_error("kiln::save: node " + n.name() + " is a " + std::string(s.name()) +
                              ", which kiln cannot save yet");
    if (!entry->refusal.empty())
      throw unavailable_error("kiln::save: node " + n.name() + " " + std::string(entry->refusal));
    json j = json::object();
    special_attributes_out<writer> out(*this, j);
    entry->save(out, s);
    return j;
  }

  static std::string_view kind_name(node_kind k) {
    switch (k) {
      case node_kind::placeholder:
        return "placeholder";
      case node_kind::constant:
        return "constant";
      case node_kind::op:
        return "op";
      case node_kind::special:
        return "special";
      case node_kind::result:
        return "result";
      default:
        return "identity";
    }
  }

  json graph(const kiln::graph& g) {
    json nodes = json::array();
    for (const node& n : g.nodes()) {
      json j{{"kind", kind_name(n.kind())}, {"inputs", std::vector<int>(n.input_ids().begin(), n.input_ids().end())}};
      switch (n.kind()) {
        case node_kind::placeholder:
          j["name"] = n.name();
          j["dtype"] = std::string(name(n.dtype()));
          j["shape"] = shape_to_json(n.shape());
          break;
        case node_kind::constant:
          j["value"] = tensor_to_json(n.value(), data);
          break;
        case node_kind::op:
          j["op"] = std::string(n.op());
          j["attributes"] = ops::visit([](const auto& op) { return attributes_to_json(op); }, n.operation());
          j["dtype"] = std::string(name(n.dtype()));
          j["shape"] = shape_to_json(n.shape());
          break;
        case node_kind::special: {
          j["op"] = std::string(n.op());
          j["special"] = special(n);
          json results = json::array();
          const int id = int(g.nodes().index_of(n));
          for (int k = 0; k < n.result_count(); ++k) {
            const node& r = g.node_at(id + k);
            results.push_back(json{{"dtype", std::string(name(r.dtype()))}, {"shape", shape_to_json(r.shape())}});
          }
          j["results"] = std::move(results);
          break;
        }
        default:
          break;
      }
      nodes.push_back(std::move(j));
    }
    return json{{"nodes", std::move(nodes)}};
  }
};

template <class T>
auto saved_function_io<T>::function(writer& w, const concrete_function& f) -> json {
  const concrete_state& s = *f.state_;
  json inputs = json::array(), outputs = json::array();
  for (const tensor_spec& in : s.inputs)
    inputs.push_back(
        json{{"name", in.name}, {"dtype", std::string(name(in.dtype))}, {"shape", shape_to_json(in.shape)}});
  for (const tensor_spec& out : s.outputs)
    outputs.push_back(
        json{{"name", out.name}, {"dtype", std::string(name(out.dtype))}, {"shape", shape_to_json(out.shape)}});
  return json{{"name", s.name},
              {"arg_names", s.arg_names},
              {"bound_text", s.bound_text},
              {"input_arg", s.input_arg},
              {"arg_structure", s.arg_structure},
              {"input_text", s.input_text},
              {"inputs", std::move(inputs)},
              {"outputs", std::move(outputs)},
              {"output_structure", s.output_structure},
              {"returns_void", s.returns_void},
              {"graph", w.graph(s.graph)}};
}

template <class T>
void saved_function_io<T>::save(std::span<const concrete_function> functions, const std::filesystem::path& path) {
  if (functions.empty()) throw invalid_argument_error("kiln::save: no concrete function to save to " + path.string());
  writer w;
  json list = json::array();
  for (const concrete_function& f : functions) list.push_back(function(w, f));
  const json model{
      {"functions", std::move(list)}, {"variables", std::move(w.variables)}, {"generators", std::move(w.generators)}};
  std::vector<std::uint8_t> bytes = json::to_cbor(model);
  const std::uint64_t checksum = saved_checksum({bytes, w.data});
  const json header{{"format", std::string(saved_format_name)},
                    {"version", saved_format_version},
                    {"checksum", checksum},
                    {"data_bytes", w.data.size()},
                    {"model", json::binary(std::move(bytes))}};
  const std::vector<std::uint8_t> head = json::to_cbor(header);
  std::array<char, 8> length{};
  for (std::size_t k = 0; k < 8; ++k) length[k] = char((std::uint64_t(head.size()) >> (8 * k)) & 0xFF);
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  os.write(saved_magic.data(), std::streamsize(saved_magic.size()));
  os.write(length.data(), 8);
  os.write(reinterpret_cast<const char*>(head.data()), std::streamsize(head.size()));
  os.write(reinterpret_cast<const char*>(w.data.data()), std::streamsize(w.data.size()));
  if (!os) throw invalid_argument_error("kiln::save: cannot write " + path.string());
}

}  // namespace kiln::detail
#endif
// ----- end kiln/io/saved_function/writer.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_WRITER_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_READER_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_READER_HPP
// ----- begin kiln/io/saved_function/reader.hpp -----
/// \file
/// Reading saved functions: every value checked before it is used (the file, its
/// checksum, each node's dtype and shape against its op's rules), so that a bad file
/// raises a kiln error naming it.

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>


#if KILN_DETAIL_SAVED_FUNCTION_CODE
namespace kiln::detail {

template <class T>
struct saved_function_io<T>::loader {
  const saved_reader& r;
  std::span<const std::uint8_t> data;  ///< the tensors' elements, after the model
  std::vector<std::shared_ptr<variable_state>> variables;
  std::vector<std::shared_ptr<generator_state>> generators;

  using results_t = std::vector<std::pair<kiln::dtype, kiln::shape>>;

  // What a special op's results must be for the plan, which takes their dtypes and
  // shapes from the node, to read what the op makes: the dtype the op gives, and a
  // shape that accepts the one it gives (the same shape when fully defined).
  void check_results(const std::string& where, const results_t& declared, const results_t& given) const {
    if (declared.size() != given.size())
      r.fail(where + " has " + std::to_string(declared.size()) + " results, but its op gives " +
             std::to_string(given.size()));
    for (std::size_t k = 0; k < given.size(); ++k)
      if (declared[k].first != given[k].first || !declared[k].second.accepts(given[k].second))
        r.fail(where + ": result " + std::to_string(k) + " is " + std::string(name(declared[k].first)) + " " +
               declared[k].second.str() + " in the file, but its op gives " + std::string(name(given[k].first)) +
               " " + given[k].second.str());
  }
  // The argument `k` of subgraph `sub` receives node `in` of the outer graph.
  void check_argument(const std::string& where, const kiln::graph& sub, std::size_t k, const node& in) const {
    const node& p = sub.node_at(sub.arguments()[k]);
    if (p.dtype() != in.dtype() || !p.shape().accepts(in.shape()))
      r.fail(where + ": argument " + std::to_string(k) + " of a subgraph is " + std::string(name(p.dtype())) + " " +
             p.shape().str() + ", but receives " + std::string(name(in.dtype())) + " " + in.shape().str());
  }
  static results_t outputs_of(const kiln::graph& sub, std::size_t first = 0) {
    results_t out;
    for (std::size_t k = first; k < sub.outputs().size(); ++k) {
      const node& o = sub.node_at(sub.outputs()[k]);
      out.emplace_back(o.dtype(), o.shape());
    }
    return out;
  }

  // The op's own load(), found by its name (kiln/io/special_ops.hpp).
  std::shared_ptr<const special_op> special(const std::string& where, const std::string& op, const json& j,
                                            const kiln::graph& g, const std::vector<int>& inputs,
                                            const results_t& results, int depth) {
    const auto* entry = special_op_entry<saved_special_op<writer, loader>>(op);
    if (!entry || !entry->load) throw unavailable_error("kiln::load: " + r.path() + ": unknown special op \"" + op + "\"");
    special_attributes_in<loader> in(*this, where, op, j, g, inputs, results, depth);
    return entry->load(in);
  }

  kiln::graph graph(const json& j, int depth) {
    if (depth > deepest_nesting) r.fail("conditionals and loops nest deeper than " + std::to_string(deepest_nesting));
    kiln::graph g;
    const json& nodes = r.array_at(j, "nodes");
    std::vector<bool> has_value;
    for (std::size_t id = 0; id < nodes.size(); ++id) {
      const json& n = nodes[id];
      const std::string kind = r.text_at(n, "kind");
      const std::string where = "node " + std::to_string(id);
      std::vector<int> inputs;
      for (const json& in : r.array_at(n, "inputs")) {
        const int k = int(r.integer(in, "an input", 0, std::int64_t(id) - 1));
        if (!has_value[std::size_t(k)]) r.fail(where + " reads node " + std::to_string(k) + ", which has no value");
        inputs.push_back(k);
      }
      auto input_types = [&] {
        std::pair<std::vector<kiln::dtype>, std::vector<kiln::shape>> t;
        for (int k : inputs) {
          t.first.push_back(g.node_at(k).dtype());
          t.second.push_back(g.node_at(k).shape());
        }
        return t;
      };
      const std::size_t before = g.nodes().size();
      if (before != id) r.fail(where + " follows a special op that has more results");
      if (kind == "placeholder") {
        if (!inputs.empty()) r.fail(where + ": a placeholder has no inputs");
        g.add_placeholder(r.text_at(n, "name"), r.dtype_of(r.at(n, "dtype")), r.shape_of(r.at(n, "shape")));
      } else if (kind == "constant") {
        if (!inputs.empty()) r.fail(where + ": a constant has no inputs");
        g.add_constant(tensor_from_json(r, r.at(n, "value"), data));
      } else if (kind == "op") {
        const std::string name = r.text_at(n, "op");
        const ops::any_op op = op_from_json(r, name, r.at(n, "attributes"));
        const kiln::dtype type = r.dtype_of(r.at(n, "dtype"));
        const kiln::shape dims = r.shape_of(r.at(n, "shape"));
        const auto [dtypes, shapes] = input_types();
        const bool arity_ok = ops::visit([&](const auto& o) { return arity_accepts(o, int(inputs.size())); }, op);
        if (!arity_ok) r.fail(where + " (" + name + ") has " + std::to_string(inputs.size()) + " inputs");
        // The op's rules through pointers: this check is compiled once, not once per op
        // of the registry.
        const void* self = op.address();
        const op_rules* rules = ops::visit([](const auto& o) { return &rules_of<std::decay_t<decltype(o)>>; }, op);
        dtype_result dt;
        shape_result sh;
        try {  // (a rule may raise, on attributes no trace would make)
          dt = rules->result_dtype(self, dtypes);
          sh = rules->result_shape(self, shapes);
        } catch (const error& e) {
          r.fail(where + " (" + name + "): " + e.what());
        }
        if (!dt.ok() || !sh.ok() || dt.value != type || !(sh.value == dims))
          r.fail(where + " (" + name + ") is " + std::string(kiln::name(type)) + " " + dims.str() +
                 " in the file, but its op gives " +
                 (dt.ok() && sh.ok() ? std::string(kiln::name(dt.value)) + " " + sh.value.str()
                                     : std::string(dt.ok() ? sh.failure : dt.failure)) +
                 " for its inputs");
        g.add_op(op, inputs, type, dims);
      } else if (kind == "special") {
        std::vector<std::pair<kiln::dtype, kiln::shape>> results;
        for (const json& res : r.array_at(n, "results"))
          results.emplace_back(r.dtype_of(r.at(res, "dtype")), r.shape_of(r.at(res, "shape")));
        auto op = special(where, r.text_at(n, "op"), r.at(n, "special"), g, inputs, results, depth);
        g.add_special(std::move(op), inputs, results);
        if (g.nodes().size() - before > nodes.size() - id) r.fail(where + " has more results than nodes follow it");
        for (std::size_t k = before + 1; k < g.nodes().size(); ++k)
          if (r.text_at(nodes[k], "kind") != "result")
            r.fail("node " + std::to_string(k) + " should be a result of node " + std::to_string(id));
        const bool valued = !results.empty();
        has_value.push_back(valued);
        for (std::size_t k = before + 1; k < g.nodes().size(); ++k) has_value.push_back(true);
        id = g.nodes().size() - 1;
        continue;
      } else if (kind == "identity") {
        if (inputs.size() != 1) r.fail(where + ": an output reads one node");
        g.add_output(inputs[0]);
      } else if (kind == "result") {
        r.fail(where + " is a result that follows no special op");
      } else {
        r.fail(where + " is of unknown kind \"" + kind + "\"");
      }
      has_value.push_back(true);
    }
    return g;
  }


  // The rules index their inputs by position, so a count the op does not take must
  // stop here.
  template <class Op>
  static bool arity_accepts(const Op&, int inputs) {
    return Op::arity == ops::variadic ? inputs >= 1 : inputs == Op::arity;
  }
};

// The bytes of the regular file at `path`: a directory, a device or a file the
// stream cannot size (whose tellg() may say 2^63 - 1) is refused by name, never
// allocated for.
template <class T>
std::vector<std::uint8_t> saved_function_io<T>::read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw invalid_argument_error("kiln::load: cannot open " + path + ": no such file");
  if (!std::filesystem::is_regular_file(path, ec))
    throw invalid_argument_error("kiln::load: " + path + " is not a regular file" +
                                 (ec ? " (" + ec.message() + ")" : std::string()));
  std::ifstream is(path, std::ios::binary | std::ios::ate);
  if (!is) throw invalid_argument_error("kiln::load: cannot open " + path);
  const std::streamoff size = is.tellg();
  const std::uintmax_t on_disk = std::filesystem::file_size(path, ec);
  if (size < 0 || ec || std::uintmax_t(size) != on_disk ||
      std::uintmax_t(size) > std::vector<std::uint8_t>().max_size())
    throw invalid_argument_error("kiln::load: cannot tell the size of " + path);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  is.seekg(0);
  is.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!is) throw invalid_argument_error("kiln::load: cannot read " + path);
  return bytes;
}

template <class T>
std::shared_ptr<concrete_state> saved_function_io<T>::concrete(const saved_reader& r, loader& l, const json& f) {
  auto c = std::make_shared<concrete_state>();
  c->name = r.text_at(f, "name");
  for (const json& a : r.array_at(f, "arg_names")) c->arg_names.push_back(r.text(a, "an argument name"));
  for (const json& b : r.array_at(f, "bound_text")) c->bound_text.push_back(r.text(b, "a bound argument"));
  const int args = int(c->arg_names.size());
  for (const json& a : r.array_at(f, "input_arg"))
    c->input_arg.push_back(int(r.integer(a, "an input's argument", 0, args - 1)));
  // How the signature shows structures and datasets: absent from older files.
  if (f.contains("arg_structure"))
    for (const json& a : r.array_at(f, "arg_structure")) c->arg_structure.push_back(r.text(a, "an argument's structure"));
  if (f.contains("input_text"))
    for (const json& t : r.array_at(f, "input_text")) c->input_text.push_back(r.text(t, "an input's text"));
  if (f.contains("output_structure")) c->output_structure = r.text_at(f, "output_structure");
  for (const json& in : r.array_at(f, "inputs"))
    c->inputs.emplace_back(r.shape_of(r.at(in, "shape")), r.dtype_of(r.at(in, "dtype")), r.text_at(in, "name"));
  for (const json& out : r.array_at(f, "outputs"))
    c->outputs.emplace_back(r.shape_of(r.at(out, "shape")), r.dtype_of(r.at(out, "dtype")), r.text_at(out, "name"));
  c->returns_void = r.boolean_at(f, "returns_void");
  if (c->returns_void && !c->outputs.empty()) r.fail(c->name + " returns nothing but lists outputs");
  c->graph = l.graph(r.at(f, "graph"), 0);
  const kiln::graph& g = c->graph;
  if (g.arguments().size() != c->inputs.size() || c->input_arg.size() != c->inputs.size())
    r.fail(c->name + " has " + std::to_string(c->inputs.size()) + " inputs but its graph takes " +
           std::to_string(g.arguments().size()));
  for (std::size_t i = 0; i < c->inputs.size(); ++i) {
    const node& p = g.node_at(g.arguments()[i]);
    if (p.dtype() != c->inputs[i].dtype || !(p.shape() == c->inputs[i].shape))
      r.fail(c->name + ": input " + c->inputs[i].name + " does not match its placeholder");
  }
  if (g.outputs().size() != c->outputs.size()) r.fail(c->name + ": its outputs do not match its graph's");
  for (const kiln::node& n : g.nodes())
    if (n.kind() == node_kind::op) (void)kernels_of(n.operation());  // unavailable_error names an op without kernels
  kiln::init_scope outside_every_trace;
  c->compile();
  return c;
}

template <class T>
loaded_function saved_function_io<T>::load(const std::filesystem::path& file) {
  const saved_reader r(file.string());
  const std::vector<std::uint8_t> bytes = read_file(r.path());
  const std::span<const std::uint8_t> file_bytes(bytes);
  const std::size_t prefix = saved_magic.size() + 8;
  if (bytes.size() < prefix || std::memcmp(bytes.data(), saved_magic.data(), saved_magic.size()) != 0)
    r.fail("not a kiln saved function (it does not start with " + std::string(saved_magic) + ")");
  std::uint64_t head_size = 0;
  for (std::size_t k = 0; k < 8; ++k) head_size |= std::uint64_t(bytes[saved_magic.size() + k]) << (8 * k);
  if (head_size > bytes.size() - prefix) r.fail("truncated (its header is cut short)");
  const std::span<const std::uint8_t> data = file_bytes.subspan(prefix + head_size);
  try {
    const json header = r.cbor(file_bytes.subspan(prefix, head_size), "the header");
    if (!header.is_object() || !header.contains("format") || header["format"] != saved_format_name)
      r.fail("not a kiln saved function");
    // Any version above this kiln's, however large, is a newer format, not a bad file.
    const json& version = r.at(header, "version");
    if (version.is_number_unsigned() && version.get<std::uint64_t>() > std::uint64_t(saved_format_version))
      throw unavailable_error("kiln::load: " + r.path() + ": written in format version " +
                              std::to_string(version.get<std::uint64_t>()) + ", newer than this kiln reads (" +
                              std::to_string(saved_format_version) + ")");
    (void)r.integer(version, "version", 1, saved_format_version);
    if (r.unsigned_at(header, "data_bytes") != data.size())
      r.fail("truncated or padded (" + std::to_string(data.size()) + " bytes of data instead of " +
             std::to_string(r.unsigned_at(header, "data_bytes")) + ")");
    const json& model_bytes = r.at(header, "model");
    if (!model_bytes.is_binary()) r.fail("the model is not bytes");
    if (r.unsigned_at(header, "checksum") != saved_checksum({model_bytes.get_binary(), data}))
      r.fail("corrupted (its checksum does not match its contents)");
    // Read as a span, as the header is: each input type compiles its own CBOR reader.
    const json model = r.cbor(std::span<const std::uint8_t>(model_bytes.get_binary()), "the model");
    loader l{r, data, {}, {}};
    for (const json& v : r.array_at(model, "variables")) {
      auto state = std::make_shared<variable_state>(r.text_at(v, "name"), r.dtype_of(r.at(v, "dtype")),
                                                    r.shape_of(r.at(v, "shape")));
      const json& value = r.at(v, "value");
      if (!value.is_null()) {
        tensor t = tensor_from_json(r, value, data);
        if (t.dtype() != state->type() || !state->dims().accepts(t.shape()))
          r.fail("variable '" + state->name() + "' holds a " + std::string(name(t.dtype())) + " " + t.shape().str() +
                 " value, but is " + std::string(name(state->type())) + " " + state->dims().str());
        state->update([&](const tensor&) { return t; });
      }
      l.variables.push_back(std::move(state));
    }
    for (const json& g : r.array_at(model, "generators")) {
      l.generators.push_back(std::make_shared<generator_state>(r.unsigned_at(g, "key")));
      l.generators.back()->next_stream = r.unsigned_at(g, "next_stream");
    }
    loaded_function f;
    for (const json& fn : r.array_at(model, "functions")) f.functions_.emplace_back(concrete(r, l, fn));
    if (f.functions_.empty()) r.fail("no functions");
    for (auto& v : l.variables) f.variables_.push_back(variable_of(v));
    return f;
  } catch (const json::exception& e) {
    r.fail(std::string("truncated or malformed (") + e.what() + ")");
  }
}


}  // namespace kiln::detail
#endif
// ----- end kiln/io/saved_function/reader.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SAVED_FUNCTION_READER_HPP

namespace kiln {

/// Writes `f` (its graph, the constants it captured and the current values of the
/// variables it uses) to `path`. A graph that calls back into C++ (host_callback)
/// cannot be saved: kiln::unavailable_error says so.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::save(f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)), "f.kiln");
/// \endcode
inline void save(const concrete_function& f, const std::filesystem::path& path) {
  detail::saved_function_io<>::save(f, path);
}

/// Writes several concrete functions, which share their variables, to one file.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::save(std::vector{f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)),
///                        f.get_concrete_function(kiln::tensor_spec({}, kiln::int32))}, "f.kiln");
/// \endcode
inline void save(std::span<const concrete_function> functions, const std::filesystem::path& path) {
  detail::saved_function_io<>::save(functions, path);
}

/// Traces `f` for each signature in `signatures` (a spec or tensor for a function of
/// one argument, a std::tuple of them for several) and writes them to one file.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::save(f, "f.kiln", kiln::tensor_spec({kiln::none}, kiln::float32), kiln::tensor_spec({}, kiln::int32));
/// \endcode
template <class F, class... Signatures>
void save(function<F>& f, const std::filesystem::path& path, const Signatures&... signatures) {
  auto one = [&]<class S>(const S& s) -> concrete_function {
    if constexpr (detail::is_tuple_like<S>::value)
      return std::apply([&](const auto&... a) { return concrete_function(f.get_concrete_function(a...)); }, s);
    else
      return f.get_concrete_function(s);
  };
  const std::vector<concrete_function> functions{one(signatures)...};
  save(std::span<const concrete_function>(functions), path);
}

/// Reads a file that kiln::save wrote. The ops of its graphs must have kernels in this
/// program: a program that never calls an op itself links kiln's kernels
/// (kiln_add_library, or KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS) in one source file),
/// or kiln::unavailable_error names the op.
/// \code kiln::loaded_function f = kiln::load("f.kiln"); \endcode
inline loaded_function load(const std::filesystem::path& path) { return detail::saved_function_io<>::load(path); }

}  // namespace kiln

// A compiled kiln whose library compiled the reader and writer (kiln/separate_compilation.hpp)
// defines KILN_LIBRARY_HAS_SAVED_FUNCTIONS for its users: they only declare them.
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_HAS_SAVED_FUNCTIONS)
#if defined(KILN_LIBRARY_SOURCE)
template struct kiln::detail::saved_function_io<void>;
#else
extern template struct kiln::detail::saved_function_io<void>;
#endif
#endif
// ----- end kiln/saved_function.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_SAVED_FUNCTION_HPP

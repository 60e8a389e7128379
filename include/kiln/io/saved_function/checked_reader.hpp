#pragma once
/// \file
/// Reading a saved file without trusting it: CBOR parsed with a bound on its nesting,
/// and accessors that check each JSON value's type and range, so that a corrupted
/// or hostile file raises kiln::value_error naming the file rather than reading garbage.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kiln/io/saved_function/format.hpp"
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

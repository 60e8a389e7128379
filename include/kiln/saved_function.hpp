#pragma once
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

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

// A source file compiled against a compiled kiln whose library holds the reader and
// writer (KILN_LIBRARY_HAS_SAVED_FUNCTIONS, kiln/separate_compilation.hpp) declares them only, and
// parses neither their code nor nlohmann/json.
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_HAS_SAVED_FUNCTIONS) && !defined(KILN_LIBRARY_SOURCE)
#define KILN_DETAIL_SAVED_FUNCTION_CODE 0
#else
#define KILN_DETAIL_SAVED_FUNCTION_CODE 1
#endif

#include <boost/mp11/algorithm.hpp>
#if KILN_DETAIL_SAVED_FUNCTION_CODE
#include <nlohmann/json.hpp>
#endif

#include "kiln/kiln.hpp"
#include "kiln/exec/summary_op.hpp"  // (not in kiln.hpp: the optional kiln/summary.hpp writes summaries)
#include "kiln/exec/collective_op.hpp"  // (not in kiln.hpp: the optional kiln/distributed.hpp runs collectives)

namespace kiln {

class loaded_function;

namespace detail {

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

#if KILN_DETAIL_SAVED_FUNCTION_CODE
// ---- values as JSON ----------------------------------------------------------------

inline nlohmann::json shape_to_json(const shape& s) {
  if (!s.has_known_rank()) return nullptr;
  return nlohmann::json(std::vector<std::int64_t>(s.begin(), s.end()));
}

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

/// Writes and reads saved functions (the friend of the types whose insides a saved
/// function holds).
template <class>
struct saved_function_io {
  using json = nlohmann::json;

  // ---- writing ---------------------------------------------------------------------

  struct writer {
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

    json special(const node& n) {
      const special_op& s = n.special();
      json j = json::object();
      if (auto* read = s.as<read_variable_op>()) {
        j["variable"] = variable_id(read->state());
      } else if (auto* write = s.as<assign_variable_op>()) {
        j["variable"] = variable_id(write->state());
      } else if (auto* print = s.as<print_op>()) {
        json pieces = json::array();
        for (const print_piece& p : print->pieces()) pieces.push_back(json{{"text", p.text}, {"input", p.input}});
        j["pieces"] = std::move(pieces);
      } else if (auto* c = s.as<cond_op>()) {
        j = json{{"then", graph(c->then_graph())},
                 {"then_args", c->then_args()},
                 {"else", graph(c->else_graph())},
                 {"else_args", c->else_args()}};
      } else if (auto* w = s.as<while_op>()) {
        j = json{{"loop_vars", w->loop_variables()},
                 {"cond", graph(w->cond_graph())},
                 {"cond_captures", w->cond_captures()},
                 {"body", graph(w->body_graph())},
                 {"breaks", w->breaks()}};
      } else if (auto* draw = s.as<random_uniform_op>()) {
        // A draw keyed by its own seed starts its sequence over in the loaded function,
        // as a fresh trace would; a generator's draws go on from its state when saved.
        const uniform_spec& u = draw->spec();
        j = json{{"dtype", std::string(name(u.type))},
                 {"shape", shape_to_json(u.dims)},
                 {"minval", u.minval},
                 {"maxval", u.maxval ? json(*u.maxval) : json(nullptr)}};
        if (draw->generator())
          j["generator"] = generator_id(draw->generator());
        else
          j["key"] = draw->key();
      } else if (auto* summary = s.as<summary_op>()) {
        // The kind is in the op's name; the writer is the loading program's default one.
        const summary_spec& spec = summary->spec();
        j = json{{"tag", spec.tag}, {"description", spec.description}, {"parameter", spec.parameter}};
      } else if (auto* c = s.as<collective_op>()) {
        // The kind is in the op's name; the group is its world ranks (empty: the world).
        const collective_spec& spec = c->spec();
        j = json{{"reduce", std::string(kiln::name(spec.op))}, {"root", spec.root}, {"members", spec.members},
                 {"site", spec.site}, {"line", spec.line}};
      } else if (s.as<host_callback_op>()) {
        throw unavailable_error("kiln::save: node " + n.name() +
                                " calls back into C++ (host_callback), which a saved function cannot hold");
      } else {
        throw unavailable_error("kiln::save: node " + n.name() + " is a " + std::string(s.name()) +
                                ", which kiln cannot save yet");
      }
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
        json j{{"kind", kind_name(n.kind())}, {"inputs", n.input_ids()}};
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
            const int id = int(&n - g.nodes().data());
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

  static json function(writer& w, const concrete_function& f) {
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

  static void save(std::span<const concrete_function> functions, const std::filesystem::path& path) {
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
  static void save(const concrete_function& f, const std::filesystem::path& path) { save(std::span(&f, 1), path); }

  // ---- reading ---------------------------------------------------------------------

  static constexpr int deepest_nesting = 64;  // of conditionals and loops, against a hostile file

  struct loader {
    const saved_reader& r;
    std::span<const std::uint8_t> data;  ///< the tensors' elements, after the model
    std::vector<std::shared_ptr<variable_state>> variables;
    std::vector<std::shared_ptr<generator_state>> generators;

    std::shared_ptr<variable_state> variable_at(const json& j) const {
      return variables[std::size_t(r.integer_at(j, "variable", 0, int(variables.size()) - 1))];
    }

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

    std::shared_ptr<const special_op> special(const std::string& where, const std::string& op, const json& j,
                                              const kiln::graph& g, const std::vector<int>& inputs,
                                              const results_t& results, int depth) {
      const int count = int(inputs.size());
      auto input = [&](int k) -> const node& { return g.node_at(inputs[std::size_t(k)]); };
      if (op == "ReadVariableOp") {
        auto v = variable_at(j);
        check_results(where, results, {{v->type(), v->dims()}});
        if (count != 0) r.fail(where + ": " + op + " takes no inputs");
        return std::make_shared<read_variable_op>(std::move(v));
      }
      for (auto mode : {assign_mode::assign, assign_mode::add, assign_mode::subtract, assign_mode::initialize}) {
        if (assign_variable_op(nullptr, mode).name() != op) continue;
        auto v = variable_at(j);
        check_results(where, results, {{v->type(), v->dims()}});
        if (count != 1) r.fail(where + ": " + op + " takes one input");
        return std::make_shared<assign_variable_op>(std::move(v), mode);
      }
      std::optional<distribution> drawn;
      bool stateful = false;
      for (distribution d : {distribution::uniform, distribution::normal, distribution::truncated_normal})
        if (const auto names = random_op_names(d); op == names.first || op == names.second)
          drawn = d, stateful = op == names.second;
      if (drawn) {
        uniform_spec u{r.shape_of(r.at(j, "shape")), r.dtype_of(r.at(j, "dtype")), r.number_at(j, "minval"), std::nullopt,
                       *drawn};
        if (!r.at(j, "maxval").is_null()) u.maxval = r.number_at(j, "maxval");
        try {
          u.check();
        } catch (const error& e) {
          r.fail(where + ": " + e.what());
        }
        check_results(where, results, {{u.type, u.dims}});
        if (count != 0) r.fail(where + ": " + op + " takes no inputs");
        if (!stateful) return std::make_shared<random_uniform_op>(std::move(u), r.unsigned_at(j, "key"));
        const int g = r.integer_at(j, "generator", 0, int(generators.size()) - 1);
        return std::make_shared<random_uniform_op>(std::move(u), generators[std::size_t(g)]);
      }
      if (op == "PrintV2") {
        std::vector<print_piece> pieces;
        for (const json& p : r.array_at(j, "pieces"))
          pieces.push_back({r.text_at(p, "text"), r.integer_at(p, "input", -1, count - 1)});
        check_results(where, results, {});
        return std::make_shared<print_op>(std::move(pieces));
      }
      for (auto kind : {summary_kind::scalar, summary_kind::histogram, summary_kind::text, summary_kind::image}) {
        if (summary_op_name(kind) != op) continue;
        summary_spec spec{kind, r.text_at(j, "tag"), r.text_at(j, "description"), r.integer_at(j, "parameter", 0, INT32_MAX)};
        if (count != 2) r.fail(where + ": " + op + " takes two inputs, a value and a step");
        if (summary_failure f = check_summary_inputs(spec, input(0).dtype(), input(0).shape(), input(1).dtype(), input(1).shape()))
          r.fail(where + ": " + f.message);
        check_results(where, results, {{bool_, shape{}}});
        return std::make_shared<summary_op>(std::move(spec));
      }
      for (auto kind : {collective_kind::all_reduce, collective_kind::all_gather, collective_kind::broadcast,
                        collective_kind::reduce_scatter, collective_kind::reduce}) {
        if (collective_op_name(kind) != op) continue;
        const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
        if (!engine) throw_no_collective_engine("kiln::load: " + r.path() + ": " + where + ": ", op);
        collective_spec spec{kind, reduce_op::sum, r.integer_at(j, "root", 0, INT32_MAX), {}, nullptr,
                             r.unsigned_at(j, "site"), std::uint32_t(r.integer_at(j, "line", 0, INT32_MAX))};
        const std::string reduce = r.text_at(j, "reduce");
        bool known = false;
        for (auto o : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min})
          if (kiln::name(o) == reduce) spec.op = o, known = true;
        if (!known) r.fail(where + ": unknown reduce op \"" + reduce + "\"");
        for (const json& m : r.array_at(j, "members")) spec.members.push_back(int(r.integer(m, "members", 0, INT32_MAX)));
        std::vector<std::pair<kiln::dtype, kiln::shape>> given, made;
        for (int k = 0; k < count; ++k) given.emplace_back(input(k).dtype(), input(k).shape());
        int size = 0;
        try {
          size = engine->group_size(spec.members);
        } catch (const error& e) {
          r.fail(where + ": " + e.what());
        }
        if (collective_failure f = check_collective(spec, given, size, &made)) r.fail(where + ": " + f.message);
        check_results(where, results, made);
        return std::make_shared<collective_op>(std::move(spec));
      }
      if (op == "cond") {
        if (count < 1 || input(0).dtype() != bool_) r.fail(where + ": a cond's first input is its bool predicate");
        auto branch = [&](std::string_view graph_key, std::string_view args_key) {
          kiln::graph sub = graph(r.at(j, graph_key), depth + 1);
          std::vector<int> picks;
          for (const json& k : r.array_at(j, args_key)) picks.push_back(int(r.integer(k, args_key, 0, count - 2)));
          if (picks.size() != sub.arguments().size()) r.fail(where + ": a branch's arguments do not match its graph");
          for (std::size_t k = 0; k < picks.size(); ++k) check_argument(where, sub, k, input(picks[k] + 1));
          check_results(where, results, outputs_of(sub));
          return std::pair{std::move(sub), std::move(picks)};
        };
        auto [then_graph, then_args] = branch("then", "then_args");
        auto [else_graph, else_args] = branch("else", "else_args");
        return std::make_shared<cond_op>(std::move(then_graph), std::move(then_args), std::move(else_graph),
                                         std::move(else_args));
      }
      if (op == "while") {
        const int vars = r.integer_at(j, "loop_vars", 0, count);
        const int captures = r.integer_at(j, "cond_captures", 0, count - vars);
        const bool breaks = r.boolean_at(j, "breaks");
        kiln::graph cond = graph(r.at(j, "cond"), depth + 1), body = graph(r.at(j, "body"), depth + 1);
        if (int(cond.arguments().size()) != vars + captures || cond.outputs().size() != 1 ||
            cond.node_at(cond.outputs()[0]).dtype() != bool_)
          r.fail(where + ": a loop's condition does not match its loop variables");
        if (int(body.arguments().size()) != count - captures || int(body.outputs().size()) != vars + (breaks ? 1 : 0))
          r.fail(where + ": a loop's body does not match its loop variables");
        if (breaks && body.node_at(body.outputs()[0]).dtype() != bool_)
          r.fail(where + ": a loop body's break_if flag is not bool");
        for (int k = 0; k < vars + captures; ++k) check_argument(where, cond, std::size_t(k), input(k));
        for (int k = 0; k < count - captures; ++k)
          check_argument(where, body, std::size_t(k), input(k < vars ? k : k + captures));
        // What the body gives must be what it and the condition take next.
        const results_t next = outputs_of(body, breaks ? 1 : 0);
        for (int k = 0; k < vars; ++k) {
          const node& p = body.node_at(body.arguments()[std::size_t(k)]);
          const node& c = cond.node_at(cond.arguments()[std::size_t(k)]);
          if (p.dtype() != next[std::size_t(k)].first || !p.shape().accepts(next[std::size_t(k)].second) ||
              !c.shape().accepts(next[std::size_t(k)].second))
            r.fail(where + ": loop variable " + std::to_string(k) + " changes from one iteration to the next");
        }
        results_t loop_vars;
        for (int k = 0; k < vars; ++k)
          loop_vars.emplace_back(body.node_at(body.arguments()[std::size_t(k)]).dtype(),
                                 body.node_at(body.arguments()[std::size_t(k)]).shape());
        check_results(where, results, loop_vars);
        return std::make_shared<while_op>(vars, std::move(cond), captures, std::move(body), breaks);
      }
      throw unavailable_error("kiln::load: " + r.path() + ": unknown special op \"" + op + "\"");
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
          g.add_op(op, std::move(inputs), type, dims);
        } else if (kind == "special") {
          std::vector<std::pair<kiln::dtype, kiln::shape>> results;
          for (const json& res : r.array_at(n, "results"))
            results.emplace_back(r.dtype_of(r.at(res, "dtype")), r.shape_of(r.at(res, "shape")));
          auto op = special(where, r.text_at(n, "op"), r.at(n, "special"), g, inputs, results, depth);
          g.add_special(std::move(op), std::move(inputs), results);
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
  };

  // The rules index their inputs by position, so a count the op does not take must
  // stop here.
  template <class Op>
  static bool arity_accepts(const Op&, int inputs) {
    return Op::arity == ops::variadic ? inputs >= 1 : inputs == Op::arity;
  }

  // The bytes of the regular file at `path`: a directory, a device or a file the
  // stream cannot size (whose tellg() may say 2^63 - 1) is refused by name, never
  // allocated for.
  static std::vector<std::uint8_t> read_file(const std::string& path) {
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

  static loaded_function load(const std::filesystem::path& file);

  static std::shared_ptr<concrete_state> concrete(const saved_reader& r, loader& l, const json& f) {
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

#if KILN_DETAIL_SAVED_FUNCTION_CODE
namespace detail {

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

}  // namespace detail
#endif

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

#pragma once
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

#include "kiln/io/saved_function/json_codecs.hpp"
#include "kiln/io/saved_function/special_attributes.hpp"
#include "kiln/io/saved_function/loaded_function.hpp"
#include "kiln/io/saved_function/saved_function_io.hpp"

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

#pragma once
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

#include "kiln/io/saved_function/json_codecs.hpp"
#include "kiln/io/saved_function/special_attributes.hpp"
#include "kiln/io/saved_function/saved_function_io.hpp"

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

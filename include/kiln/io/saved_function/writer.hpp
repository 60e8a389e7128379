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

#include "kiln/exec/collective_op.hpp"  // (not in kiln.hpp: the optional kiln/distributed.hpp runs collectives)
#include "kiln/exec/summary_op.hpp"  // (not in kiln.hpp: the optional kiln/summary.hpp writes summaries)
#include "kiln/io/saved_function/json_codecs.hpp"
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

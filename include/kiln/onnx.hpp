#pragma once
/// \file
/// ONNX export: a traced function written as an ONNX model, for other runtimes
/// (onnxruntime, TensorRT, ...) to run (docs/onnx_export.md).
///
/// An optional part of kiln, outside kiln/kiln.hpp: it builds the model with ONNX's
/// own protobuf schema (Debian `libonnx-dev`, `libprotobuf-dev`), so a program that
/// includes it links the CMake target `kiln::onnx`.
///
/// \code
/// kiln::variable w(kiln::ones({3, 2}), "w"), b(kiln::zeros({2}), "b");
/// kiln::function dense([&](const kiln::tensor& x) { return kiln::relu(kiln::matmul(x, w) + b); });
/// kiln::onnx::export_model(dense.get_concrete_function(kiln::tensor_spec({kiln::none, 3}, kiln::float32)),
///                          "dense.onnx");
/// \endcode
///
/// Variables are written as initializers holding their current values (ONNX has no
/// state); `cond` becomes `If` and `while` becomes `Loop`; `kiln::print` nodes are left
/// out (no ONNX op writes to the console). A node that ONNX cannot express (a variable
/// assignment, a random draw, a host callback, ...) raises kiln::unavailable_error
/// naming the node and its op.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

// What the CMake target of Debian's libonnx-dev defines, for builds without it: ONNX's
// classes in namespace ::onnx, from its schema with the ML extensions.
#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/onnx_pb.h>

// kiln.hpp first: the single header of this optional part then inlines only what
// kiln.hpp does not hold (scripts/amalgamate.py).
#include "kiln/kiln.hpp"
#include "kiln/io/special_ops.hpp"

namespace kiln::onnx {

/// The newest ONNX operator set the exporter writes, and its default (ONNX 1.23).
inline constexpr std::int64_t newest_opset = 28;
/// The oldest ONNX operator set the exporter writes (ONNX 1.16, onnxruntime 1.17): every
/// operator it uses means the same from here to newest_opset.
inline constexpr std::int64_t oldest_opset = 21;

/// The ONNX IR version that a model of operator set `opset` declares, as ONNX releases
/// pair them (oldest_opset to newest_opset).
/// \code static_assert(kiln::onnx::ir_version_of(21) == 10); \endcode
constexpr std::int64_t ir_version_of(std::int64_t opset) {
  return opset <= 22 ? 10 : opset == 23 ? 11 : opset == 24 ? 12 : opset <= 27 ? 13 : 14;
}

/// How to export: the operator set to write, for consumers older than newest_opset.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::onnx::export_model(f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32)), "f.onnx",
///                          {.opset = kiln::onnx::oldest_opset});
/// \endcode
struct export_options {
  std::int64_t opset = newest_opset;
};

inline ::onnx::TensorProto to_tensor(const tensor& value, const std::string& name = "");

namespace detail {

using kiln::detail::variable_state;
using ::onnx::AttributeProto;
using ::onnx::GraphProto;
using ::onnx::NodeProto;
using ::onnx::TensorProto;

inline TensorProto::DataType element_type(kiln::dtype t) {
  switch (t) {
    case kiln::bool_:
      return TensorProto::BOOL;
    case kiln::int32:
      return TensorProto::INT32;
    case kiln::int64:
      return TensorProto::INT64;
    case kiln::float32:
      return TensorProto::FLOAT;
    case kiln::float64:
      return TensorProto::DOUBLE;
    default:
      return TensorProto::STRING;
  }
}

/// `v`'s dtype and shape as an ONNX value, with `None` dims left unnamed.
inline void set_type(::onnx::ValueInfoProto& v, kiln::dtype t, const kiln::shape& s) {
  auto* tensor_type = v.mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(element_type(t));
  if (!s.has_known_rank()) return;
  auto* dims = tensor_type->mutable_shape();
  for (std::int64_t d : s) {
    auto* dim = dims->add_dim();
    if (d != none) dim->set_dim_value(d);
  }
}

/// A kiln shape or int_list as the int64 list ONNX takes.
template <class Range>
std::vector<std::int64_t> ints(const Range& r) {
  return std::vector<std::int64_t>(r.begin(), r.end());
}

/// The ONNX operator of an op that maps to one (its `onnx_name`, kiln/ops/op.hpp), or
/// "" for an op that the exporter lowers in its own way.
template <class Op>
inline constexpr std::string_view onnx_name_of = [] {
  if constexpr (requires { Op::onnx_name; })
    return std::string_view(Op::onnx_name);
  else
    return std::string_view();
}();

/// Builds one ONNX model from a concrete function: the main graph, and the branch and
/// body graphs of its conditionals and loops, which read the values of the graphs
/// around them by name, as ONNX allows.
class exporter {
 public:
  ::onnx::ModelProto model(const concrete_function& f, std::int64_t opset_version) {
    if (opset_version < oldest_opset || opset_version > newest_opset)
      throw invalid_argument_error("kiln::onnx::export_model: opset " + std::to_string(opset_version) +
                                   " is outside the opsets kiln writes, " + std::to_string(oldest_opset) + " to " +
                                   std::to_string(newest_opset));
    ::onnx::ModelProto m;
    m.set_ir_version(ir_version_of(opset_version));
    m.set_producer_name("kiln");
    m.set_producer_version(std::to_string(KILN_VERSION_MAJOR) + "." + std::to_string(KILN_VERSION_MINOR) + "." +
                           std::to_string(KILN_VERSION_PATCH));
    auto* opset = m.add_opset_import();
    opset->set_domain("");
    opset->set_version(opset_version);
    main_ = m.mutable_graph();
    main_->set_name("kiln_function");

    const kiln::graph& g = f.graph();
    // Inputs are named as the function's arguments (its `arg_names` option, else x0,
    // x1, ...), outputs as kiln names them; every other value after its node, made
    // unique across the model.
    for (int id : g.arguments()) used_.insert(g.node_at(id).name());
    for (int id : g.outputs()) used_.insert(g.node_at(id).name());
    std::vector<std::string> args;
    for (int id : g.arguments()) {
      const node& p = g.node_at(id);
      auto* input = main_->add_input();
      input->set_name(p.name());
      set_type(*input, p.dtype(), p.shape());
      args.push_back(p.name());
    }
    const std::vector<std::string> outputs = emit(*main_, g, args, /*outer_names=*/true);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const node& o = g.node_at(g.outputs()[k]);
      auto* output = main_->add_output();
      output->set_name(outputs[k]);
      set_type(*output, o.dtype(), o.shape());
    }
    return m;
  }

 private:
  GraphProto* main_ = nullptr;
  std::unordered_set<std::string> used_;
  std::unordered_map<const variable_state*, std::string> variables_;

 public:
  // (What a special op's to_onnx, beside the op, builds its nodes with.)
  /// `base`, or `base_1`, `base_2`, ...: the first that no value of the model has.
  std::string fresh(const std::string& base) {
    if (used_.insert(base).second) return base;
    for (int k = 1;; ++k)
      if (std::string name = base + "_" + std::to_string(k); used_.insert(name).second) return name;
  }

  /// A value known when exporting, as an initializer of the main graph (which the
  /// graphs inside it see too).
  std::string constant(const tensor& t, const std::string& base = "const") {
    const std::string name = fresh(base);
    *main_->add_initializer() = to_tensor(t, name);
    return name;
  }
  std::string int64s(std::span<const std::int64_t> values) {
    return constant(kiln::constant(std::vector<std::int64_t>(values.begin(), values.end()),
                                   kiln::shape{std::int64_t(values.size())}));
  }
  std::string int64s(std::initializer_list<std::int64_t> values) {
    return int64s(std::span(values.begin(), values.size()));
  }
  std::string constant_bool(bool v, const std::string& base) { return constant(kiln::constant(v), base); }
  /// Variable `v`'s current value, as one initializer however often it is read.
  std::string variable(const std::shared_ptr<variable_state>& v) {
    auto [it, fresh_variable] = variables_.emplace(v.get(), std::string());
    if (fresh_variable) it->second = constant(v->read(), v->name());
    return it->second;
  }
  static void set_type(::onnx::ValueInfoProto& v, kiln::dtype t, const kiln::shape& s) { detail::set_type(v, t, s); }

  /// Adds node `op_type` to `g`, with `outputs` outputs named after `output_base`.
  NodeProto& add(GraphProto& g, std::string_view op_type, std::vector<std::string> inputs,
                 const std::string& output_base, int outputs = 1) {
    NodeProto& n = *g.add_node();
    n.set_op_type(std::string(op_type));
    n.set_name(fresh(output_base + "/" + std::string(op_type)));
    for (std::string& in : inputs) n.add_input(std::move(in));
    for (int k = 0; k < outputs; ++k) n.add_output(fresh(output_base));
    return n;
  }
  /// Adds node `op_type` to `g` and returns its one output.
  std::string value(GraphProto& g, std::string_view op_type, std::vector<std::string> inputs,
                    const std::string& output_base) {
    return add(g, op_type, std::move(inputs), output_base).output(0);
  }
  static void attribute(NodeProto& n, const std::string& name, std::int64_t v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::INT);
    a.set_i(v);
  }
  static void attribute(NodeProto& n, const std::string& name, float v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::FLOAT);
    a.set_f(v);
  }
  static void attribute(NodeProto& n, const std::string& name, std::span<const std::int64_t> v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::INTS);
    for (std::int64_t x : v) a.add_ints(x);
  }
  static void attribute(NodeProto& n, const std::string& name, const std::string& v) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::STRING);
    a.set_s(v);
  }
  static GraphProto& graph_attribute(NodeProto& n, const std::string& name) {
    AttributeProto& a = *n.add_attribute();
    a.set_name(name);
    a.set_type(AttributeProto::GRAPH);
    GraphProto& g = *a.mutable_g();
    g.set_name(n.name() + "/" + name);
    return g;
  }
  std::string cast(GraphProto& g, const std::string& x, kiln::dtype to, const std::string& base) {
    NodeProto& n = add(g, onnx_name_of<ops::cast>, {x}, base);
    attribute(n, "to", std::int64_t(element_type(to)));
    return n.output(0);
  }

  [[noreturn]] static void unavailable(const node& n, const std::string& why) {
    const std::string op = n.name() == n.op() ? "" : " (" + std::string(n.op()) + ")";
    throw unavailable_error("kiln::onnx::export_model: node " + n.name() + op + " " + why);
  }

  /// Emits the nodes of `kg` into `g`, its arguments being the values `args`; returns
  /// the names of its outputs. The main graph's outputs keep kiln's names
  /// (`outer_names`); a branch's or body's are fresh.
  std::vector<std::string> emit(GraphProto& g, const kiln::graph& kg, const std::vector<std::string>& args,
                                bool outer_names = false) {
    std::vector<std::string> names(kg.nodes().size());
    for (std::size_t k = 0; k < args.size(); ++k) names[std::size_t(kg.arguments()[k])] = args[k];
    for (std::size_t id = 0; id < kg.nodes().size(); ++id) {
      const node& n = kg.nodes()[id];
      std::vector<std::string> in;
      for (int i : n.input_ids()) {
        if (names[std::size_t(i)].empty()) unavailable(n, "reads a value that has no ONNX counterpart");
        in.push_back(names[std::size_t(i)]);
      }
      switch (n.kind()) {
        case node_kind::placeholder:
        case node_kind::result:  // named by its special node
          break;
        case node_kind::constant:
          names[id] = constant(n.value(), n.name());
          break;
        case node_kind::identity: {
          NodeProto& out = add(g, "Identity", in, n.name());
          if (outer_names) out.set_output(0, n.name());
          names[id] = out.output(0);
          break;
        }
        case node_kind::op:
          names[id] = ops::visit([&](const auto& op) { return emit_op(g, op, n, kg, in); }, n.operation());
          break;
        case node_kind::special: {
          std::vector<std::string> results = emit_special(g, n, kg, in);
          for (std::size_t k = 0; k < results.size(); ++k) names[id + k] = std::move(results[k]);
          break;
        }
      }
    }
    std::vector<std::string> outputs;
    for (int id : kg.outputs()) outputs.push_back(names[std::size_t(id)]);
    return outputs;
  }

  /// Op `op`'s ONNX nodes; returns the value of its result. An op lowered its own way
  /// comes first, by its type, and spells its own operator as its `onnx_name`; then the
  /// ops that are their `onnx_name` alone, attributes aside (the reductions' axes, an
  /// axis), so that no op with a lowering of its own falls to them and loses its
  /// attributes.
  template <class Op>
  std::string emit_op(GraphProto& g, const Op& op, const node& n, const kiln::graph& kg,
                      const std::vector<std::string>& in) {
    const std::string& base = n.name();
    const auto input = [&](std::size_t k) -> const node& { return kg.node_at(n.input_ids()[k]); };
    const kiln::dtype type = input(0).dtype();
    if constexpr (std::is_same_v<Op, ops::add>) {
      return value(g, type == kiln::string ? "StringConcat" : onnx_name_of<Op>, in, base);
    } else if constexpr (std::is_same_v<Op, ops::relu>) {
      if (is_floating(type)) return value(g, onnx_name_of<Op>, in, base);
      return value(g, "Max", {in[0], constant(kiln::zeros({}, type))}, base);
    } else if constexpr (std::is_same_v<Op, ops::relu_grad>) {  // Where(y > 0, dy, 0)
      const std::string zero = constant(kiln::zeros({}, type));
      return value(g, "Where", {value(g, "Greater", {in[0], zero}, base), in[1], zero}, base);
    } else if constexpr (std::is_same_v<Op, ops::gelu>) {
      NodeProto& r = add(g, onnx_name_of<Op>, in, base);
      if (op.approximate) attribute(r, "approximate", std::string("tanh"));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::elu> || std::is_same_v<Op, ops::leaky_relu>) {
      NodeProto& r = add(g, onnx_name_of<Op>, in, base);
      attribute(r, "alpha", float(op.alpha));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::silu>) {  // ONNX's Swish is newer than oldest_opset
      return value(g, "Mul", {in[0], value(g, "Sigmoid", in, base)}, base);
    } else if constexpr (std::is_same_v<Op, ops::square>) {
      return value(g, "Mul", {in[0], in[0]}, base);
    } else if constexpr (std::is_same_v<Op, ops::not_equal>) {
      return value(g, "Not", {value(g, "Equal", in, base)}, base);
    } else if constexpr (std::is_same_v<Op, ops::cast>) {
      return cast(g, in[0], op.to, base);
    } else if constexpr (std::is_same_v<Op, ops::divide>) {
      if (is_floating(type)) return value(g, onnx_name_of<Op>, in, base);
      // Integers divide as float64, as TensorFlow's `/`.
      return value(g, onnx_name_of<Op>, {cast(g, in[0], float64, base), cast(g, in[1], float64, base)}, base);
    } else if constexpr (std::is_same_v<Op, ops::floordiv>) {
      if (is_floating(type)) return value(g, "Floor", {value(g, "Div", in, base)}, base);
      // a - floormod(a, b) is a multiple of b, so ONNX's truncating Div is exact on it.
      NodeProto& mod = add(g, "Mod", in, base);
      attribute(mod, "fmod", std::int64_t(0));
      return value(g, "Div", {value(g, "Sub", {in[0], mod.output(0)}, base), in[1]}, base);
    } else if constexpr (std::is_same_v<Op, ops::floormod>) {
      NodeProto& mod = add(g, "Mod", in, base);
      if (!is_floating(type)) {
        attribute(mod, "fmod", std::int64_t(0));  // integers: the divisor's sign, as floormod
        return mod.output(0);
      }
      // fmod, then moved into the divisor's sign, as kiln's floormod computes it.
      attribute(mod, "fmod", std::int64_t(1));
      const std::string r = mod.output(0), zero = constant(kiln::zeros({}, type));
      const std::string nonzero = value(g, "Not", {value(g, "Equal", {r, zero}, base)}, base);
      const std::string signs_differ =
          value(g, "Xor", {value(g, "Less", {r, zero}, base), value(g, "Less", {in[1], zero}, base)}, base);
      return value(g, "Where", {value(g, "And", {nonzero, signs_differ}, base), value(g, "Add", {r, in[1]}, base), r},
                   base);
    } else if constexpr (std::is_same_v<Op, ops::argmax>) {
      return argmax(g, op, n, input(0), in[0]);
    } else if constexpr (std::is_same_v<Op, ops::reshape>) {
      NodeProto& r = add(g, onnx_name_of<Op>, {in[0], int64s(ints(op.new_shape))}, base);
      // A 0 in kiln's shape is an empty dim, not ONNX's "copy the input's dim".
      bool has_zero = false;
      for (std::int64_t d : op.new_shape) has_zero = has_zero || d == 0;
      if (has_zero) attribute(r, "allowzero", std::int64_t(1));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::transpose>) {
      NodeProto& t = add(g, onnx_name_of<Op>, in, base);
      if (!op.perm.empty()) attribute(t, "perm", ints(op.perm));
      return t.output(0);
    } else if constexpr (std::is_same_v<Op, ops::stack>) {
      const std::string axis = int64s({op.axis});
      std::vector<std::string> rows;
      for (const std::string& x : in) rows.push_back(value(g, "Unsqueeze", {x, axis}, base));
      NodeProto& c = add(g, "Concat", rows, base);
      attribute(c, "axis", op.axis);
      return c.output(0);
    } else if constexpr (std::is_same_v<Op, ops::index>) {
      NodeProto& r = add(g, onnx_name_of<Op>, {in[0], constant(kiln::constant(op.i))}, base);
      attribute(r, "axis", std::int64_t(0));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::slice>) {
      std::vector<std::int64_t> ends, axes;
      for (int d = 0; d < op.begin.size(); ++d) {
        ends.push_back(op.size[d] == -1 ? std::numeric_limits<std::int64_t>::max() : op.begin[d] + op.size[d]);
        axes.push_back(d);
      }
      return value(g, onnx_name_of<Op>, {in[0], int64s(ints(op.begin)), int64s(ends), int64s(axes)}, base);
    } else if constexpr (std::is_same_v<Op, ops::shape_of>) {
      return cast(g, value(g, onnx_name_of<Op>, in, base), int32, base);
    } else if constexpr (std::is_same_v<Op, ops::set_item>) {
      // ScatterND with one index [[i]] and one update, the new row.
      const std::string i = input(1).dtype() == int64 ? in[1] : cast(g, in[1], int64, base);
      const std::string index = value(g, "Reshape", {i, int64s({1, 1})}, base);
      const std::string row = value(g, "Unsqueeze", {in[2], int64s({0})}, base);
      return value(g, "ScatterND", {in[0], index, row}, base);
    } else if constexpr (std::is_same_v<Op, ops::pad_rows>) {
      // Pads the first dim at its end with max(rows - dim 0, 0) rows of zeros.
      const std::string rows = input(1).dtype() == int64 ? in[1] : cast(g, in[1], int64, base);
      const std::string first = value(g, "Slice", {value(g, "Shape", {in[0]}, base), int64s({0}), int64s({1})}, base);
      const std::string missing =
          value(g, "Max", {value(g, "Sub", {value(g, "Reshape", {rows, int64s({1})}, base), first}, base), int64s({0})},
                base);
      NodeProto& pads = add(g, "Concat", {int64s({0}), missing}, base);
      attribute(pads, "axis", std::int64_t(0));
      return value(g, "Pad", {in[0], pads.output(0), "", int64s({0})}, base);
    } else if constexpr (std::is_same_v<Op, ops::crop_or_pad>) {
      // The window [start, start + like's dims) of x, where start = offset + align *
      // (x's dims - like's): x padded with the zeros the window needs before and
      // after it, then sliced.
      const std::string x_dims = value(g, "Shape", {in[0]}, base), out_dims = value(g, "Shape", {in[1]}, base);
      const std::string spare = value(g, "Sub", {x_dims, out_dims}, base);
      const std::string moved = value(g, "Mul", {int64s(ints(op.align)), spare}, base);
      const std::string start = value(g, "Add", {int64s(ints(op.offset)), moved}, base);
      const std::string before = value(g, "Max", {value(g, "Neg", {start}, base), int64s({0})}, base);
      const std::string end = value(g, "Add", {start, out_dims}, base);
      const std::string after = value(g, "Max", {value(g, "Sub", {end, x_dims}, base), int64s({0})}, base);
      NodeProto& pads = add(g, "Concat", {before, after}, base);
      attribute(pads, "axis", std::int64_t(0));
      const std::string padded = value(g, "Pad", {in[0], pads.output(0)}, base);
      const std::string from = value(g, "Add", {start, before}, base), to = value(g, "Add", {end, before}, base);
      return value(g, "Slice", {padded, from, to}, base);
    } else if constexpr (std::is_same_v<Op, ops::unsorted_segment_sum>) {
      return segment_sum(g, op, n, input(0), input(1), in);
    } else if constexpr (std::is_same_v<Op, ops::conv2d>) {
      if (!is_floating(type))
        unavailable(n, "convolves " + std::string(name(type)) + " values; ONNX's Conv takes floats");
      // ONNX convolves NCHW inputs with OIHW filters; kiln's are NHWC and HWIO.
      NodeProto& x = add(g, "Transpose", {in[0]}, base);
      attribute(x, "perm", std::vector<std::int64_t>{0, 3, 1, 2});
      NodeProto& w = add(g, "Transpose", {in[1]}, base);
      attribute(w, "perm", std::vector<std::int64_t>{3, 2, 0, 1});
      NodeProto& c = add(g, onnx_name_of<Op>, {x.output(0), w.output(0)}, base);
      attribute(c, "strides", std::vector<std::int64_t>{op.stride_h, op.stride_w});
      // SAME pads the odd element at the end, as TensorFlow does: SAME_UPPER.
      attribute(c, "auto_pad", std::string(op.pad == ops::padding::same ? "SAME_UPPER" : "VALID"));
      NodeProto& y = add(g, "Transpose", {c.output(0)}, base);
      attribute(y, "perm", std::vector<std::int64_t>{0, 2, 3, 1});
      return y.output(0);
    } else if constexpr (std::is_same_v<Op, ops::max_pool> || std::is_same_v<Op, ops::avg_pool>) {
      // NCHW as Conv; SAME_UPPER as conv2d, and an average over the elements inside
      // the image only (count_include_pad 0), as TensorFlow's AvgPool.
      constexpr bool average = std::is_same_v<Op, ops::avg_pool>;
      NodeProto& x = add(g, "Transpose", {in[0]}, base);
      attribute(x, "perm", std::vector<std::int64_t>{0, 3, 1, 2});
      NodeProto& p = add(g, onnx_name_of<Op>, {x.output(0)}, base);
      attribute(p, "kernel_shape", std::vector<std::int64_t>{op.window_h, op.window_w});
      attribute(p, "strides", std::vector<std::int64_t>{op.stride_h, op.stride_w});
      attribute(p, "auto_pad", std::string(op.pad == ops::padding::same ? "SAME_UPPER" : "VALID"));
      if constexpr (average) attribute(p, "count_include_pad", std::int64_t(0));
      NodeProto& y = add(g, "Transpose", {p.output(0)}, base);
      attribute(y, "perm", std::vector<std::int64_t>{0, 2, 3, 1});
      return y.output(0);
    } else if constexpr (!onnx_name_of<Op>.empty() && std::is_base_of_v<ops::reduction_op, Op>) {
      NodeProto& r = add(g, onnx_name_of<Op>, {in[0]}, base);
      if (!op.axis.all()) r.add_input(int64s(ints(op.axis.list())));
      attribute(r, "keepdims", std::int64_t(op.keepdims));
      return r.output(0);
    } else if constexpr (std::is_same_v<Op, ops::gather> || std::is_same_v<Op, ops::concat>) {
      NodeProto& c = add(g, onnx_name_of<Op>, in, base);
      attribute(c, "axis", op.axis);
      return c.output(0);
    } else if constexpr (!onnx_name_of<Op>.empty()) {
      return value(g, onnx_name_of<Op>, in, base);
    } else {
      unavailable(n, "has no ONNX operator");
    }
  }

  std::string argmax(GraphProto& g, const ops::argmax& op, const node& n, const node& x, const std::string& in) {
    const std::string& base = n.name();
    if (!op.axis.all() && op.axis.list().size() == 1) {
      NodeProto& a = add(g, onnx_name_of<ops::argmax>, {in}, base);
      attribute(a, "axis", op.axis.list()[0]);
      attribute(a, "keepdims", std::int64_t(op.keepdims));
      return a.output(0);
    }
    if (!op.axis.all() && !(x.shape().has_known_rank() && op.axis.list().size() == x.shape().rank()))
      unavailable(n, "reduces " + op.axis.list().str() + "; ONNX's ArgMax reduces one axis or all");
    // Over every element: ArgMax of the flattened input, in row-major order as kiln counts.
    NodeProto& a = add(g, onnx_name_of<ops::argmax>, {value(g, "Reshape", {in, int64s({-1})}, base)}, base);
    attribute(a, "axis", std::int64_t(0));
    attribute(a, "keepdims", std::int64_t(0));
    if (!op.keepdims) return a.output(0);
    if (!x.shape().has_known_rank()) unavailable(n, "keeps the dims of an input whose rank is unknown");
    return value(g, "Reshape", {a.output(0), int64s(std::vector<std::int64_t>(std::size_t(x.shape().rank()), 1))},
                 base);
  }

  /// ScatterND adding the slices of `data` into zeros, one row per segment and one more
  /// that the negative ids (which kiln drops) go to, sliced off at the end. The dims the
  /// ids index move to the front first, and the segments' dim to `axis` after.
  std::string segment_sum(GraphProto& g, const ops::unsorted_segment_sum& op, const node& n, const node& data,
                          const node& ids, const std::vector<std::string>& in) {
    const std::string& base = n.name();
    if (!data.shape().has_known_rank() || !ids.shape().has_known_rank())
      unavailable(n, "has inputs of unknown rank, which ONNX's ScatterND needs");
    const std::int64_t rank = data.shape().rank(), id_rank = ids.shape().rank(), axis = op.axis;
    std::vector<std::int64_t> to_front, to_axis;
    for (std::int64_t d = axis; d < axis + id_rank; ++d) to_front.push_back(d);
    for (std::int64_t d = 0; d < rank; ++d)
      if (d < axis || d >= axis + id_rank) to_front.push_back(d);
    for (std::int64_t d = 1; d <= axis; ++d) to_axis.push_back(d);
    to_axis.push_back(0);
    for (std::int64_t d = axis + 1; d < rank - id_rank + 1; ++d) to_axis.push_back(d);

    NodeProto& moved = add(g, "Transpose", {in[0]}, base);
    attribute(moved, "perm", to_front);
    const std::string segments = constant(kiln::constant(op.num_segments), base + "/segments");
    const std::string id = ids.dtype() == int64 ? in[1] : cast(g, in[1], int64, base);
    const std::string zero = constant(kiln::constant(std::int64_t(0)));
    const std::string kept = value(g, "Where", {value(g, "Less", {id, zero}, base), segments, id}, base);
    const std::string indices = value(g, "Unsqueeze", {kept, int64s({-1})}, base);
    // Zeros of shape (num_segments + 1,) + the dims of data that the ids do not index.
    NodeProto& rest = add(g, "Shape", {moved.output(0)}, base);
    attribute(rest, "start", id_rank);
    NodeProto& dims = add(g, "Concat", {int64s({op.num_segments + 1}), rest.output(0)}, base);
    attribute(dims, "axis", std::int64_t(0));
    NodeProto& zeros = add(g, "ConstantOfShape", {dims.output(0)}, base);
    AttributeProto& fill = *zeros.add_attribute();
    fill.set_name("value");
    fill.set_type(AttributeProto::TENSOR);
    *fill.mutable_t() = to_tensor(kiln::zeros({1}, data.dtype()));
    NodeProto& sums = add(g, "ScatterND", {zeros.output(0), indices, moved.output(0)}, base);
    attribute(sums, "reduction", std::string("add"));
    const std::string kept_sums =
        value(g, "Slice", {sums.output(0), int64s({0}), int64s({op.num_segments}), int64s({0})}, base);
    NodeProto& result = add(g, "Transpose", {kept_sums}, base);
    attribute(result, "perm", to_axis);
    return result.output(0);
  }

  /// How the exporter reaches a special op (an entry of detail::special_op_entries): its
  /// `to_onnx`, or why ONNX cannot express it.
  struct special_lowering {
    /// The op's nodes, and the names of its results.
    std::vector<std::string> (*lower)(exporter& e, GraphProto& g, const node& n, const kiln::graph& kg,
                                      const std::vector<std::string>& in) = nullptr;
    std::string_view refusal;  ///< the op's `onnx_refusal`, or empty

    template <class Op>
    static special_lowering of() {
      special_lowering l;
      if constexpr (requires { Op::onnx_refusal; }) {
        l.refusal = Op::onnx_refusal;
      } else if constexpr (requires { &Op::template to_onnx<exporter, GraphProto>; }) {
        l.lower = [](exporter& e, GraphProto& g, const node& n, const kiln::graph& kg,
                     const std::vector<std::string>& in) { return n.special().as<Op>()->to_onnx(e, g, n, kg, in); };
      }
      return l;
    }
  };

  // The op's own to_onnx, found by its kind (kiln/io/special_ops.hpp).
  std::vector<std::string> emit_special(GraphProto& g, const node& n, const kiln::graph& kg,
                                        const std::vector<std::string>& in) {
    const special_lowering* entry = kiln::detail::special_op_entry<special_lowering>(n.special());
    if (!entry) unavailable(n, "has no ONNX operator");
    if (!entry->refusal.empty()) unavailable(n, std::string(entry->refusal));
    if (!entry->lower) unavailable(n, "has no ONNX operator");
    return entry->lower(*this, g, n, kg, in);
  }

  /// A branch of `If`: its arguments are the captures `picks` of the `cond` node.
  void branch(GraphProto& b, const kiln::graph& kg, const std::vector<int>& picks, const std::vector<std::string>& in) {
    std::vector<std::string> args;
    for (int k : picks) args.push_back(in[std::size_t(k) + 1]);
    const std::vector<std::string> outputs = emit(b, kg, args);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const node& o = kg.node_at(kg.outputs()[k]);
      auto* out = b.add_output();
      out->set_name(outputs[k]);
      set_type(*out, o.dtype(), o.shape());
    }
  }
};

}  // namespace detail

/// `value` as an ONNX tensor named `name` (an initializer, or test data in ONNX's
/// `input_0.pb` layout): numbers as raw little-endian bytes, strings one by one.
/// \code ::onnx::TensorProto p = kiln::onnx::to_tensor(kiln::constant({1.f, 2.f}), "x"); \endcode
inline ::onnx::TensorProto to_tensor(const tensor& value, const std::string& name) {
  const tensor t = value.device() == device::cpu ? value : value.to(device::cpu);
  ::onnx::TensorProto p;
  p.set_name(name);
  p.set_data_type(detail::element_type(t.dtype()));
  for (std::int64_t d : t.shape()) p.add_dims(d);
  if (t.dtype() == kiln::string) {
    for (const std::string& s : t.to_vector<std::string>()) p.add_string_data(s);
  } else {
    p.set_raw_data(static_cast<const char*>(t.raw_data()), std::size_t(t.size()) * std::size_t(size_of(t.dtype())));
  }
  return p;
}

/// `f`'s graph as an ONNX model (of `options.opset`, newest_opset unless told), its
/// variables' current values as initializers. Raises kiln::unavailable_error naming the
/// first node that ONNX cannot express, kiln::invalid_argument_error for an opset outside
/// oldest_opset to newest_opset.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return kiln::tanh(x) * 2; });
/// ::onnx::ModelProto m = kiln::onnx::to_model(f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32)));
/// \endcode
inline ::onnx::ModelProto to_model(const concrete_function& f, const export_options& options = {}) {
  return detail::exporter().model(f, options.opset);
}

/// Writes `f` as an ONNX model to `path` (see to_model).
/// \code
/// kiln::function f([](const kiln::tensor& x) { return kiln::tanh(x) * 2; });
/// kiln::onnx::export_model(f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32)), "f.onnx");
/// \endcode
inline void export_model(const concrete_function& f, const std::filesystem::path& path,
                         const export_options& options = {}) {
  const ::onnx::ModelProto m = to_model(f, options);
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  if (!os || !m.SerializeToOstream(&os))
    throw invalid_argument_error("kiln::onnx::export_model: cannot write " + path.string());
}

}  // namespace kiln::onnx

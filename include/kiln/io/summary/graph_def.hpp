#pragma once
/// \file
/// A kiln::graph as a TensorFlow `GraphDef` (tensorflow/core/framework/graph.proto,
/// node_def.proto, attr_value.proto, function.proto), for TensorBoard's graph view.
///
/// Each node is a `NodeDef` named as in kiln's listing, with kiln's op names
/// (`add`, `matmul`, `ReadVariableOp`, `cond`, `while`, ...), its inputs (a further
/// result of a special op is `name:k`, TensorFlow's spelling of output k, so `Result`
/// nodes are not nodes of their own) and attributes: `_output_shapes` (what
/// TensorBoard draws on the edges), `dtype` and `shape` of placeholders, `dtype` and
/// `value` of constants, `T` (the first input's dtype) of ops, the op's own
/// attributes (`axis`, `perm`, `to`, ...), the variable a variable op reads or writes
/// (`shared_name`) and a summary's `tag`. Effects (variable writes, prints,
/// summaries, callbacks) take a control input (`^name`) from the effect before them:
/// the program order the executor keeps, drawn as TensorFlow draws its automatic
/// control dependencies. The branches of a `cond` and the condition and body of a
/// `while` are functions of the graph's library (`FunctionDef`s, named after their
/// node and label), which the node names in its `then_branch`/`else_branch` or
/// `cond`/`body` attribute, as TensorFlow's `If` and `While` nodes do.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/graph/graph.hpp"
#include "kiln/io/special_ops.hpp"
#include "kiln/io/summary/events.hpp"
#include "kiln/io/summary/protobuf.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln::detail {

// ---- AttrValue ----------------------------------------------------------------------

/// The writers of `AttrValue`s (`attr_writer`, the one specialization): a template on
/// nothing, as the rest of this header, so that a program compiles them only where it
/// writes a graph.
template <class Unused>
struct basic_attr_writer {
  using event_encoder = basic_event_encoder<Unused>;

  /// One `AttrValue` (as the value of a NodeDef's attr map entry `key`).
  template <class F>
  static void write_attr(proto::writer& w, std::string_view key, F&& value);
  static void write_type_attr(proto::writer& w, std::string_view key, dtype t);
  static void write_string_attr(proto::writer& w, std::string_view key, std::string_view s);
  static void write_ints_attr(proto::writer& w, std::string_view key, std::span<const std::int64_t> values);
  static void write_shapes_attr(proto::writer& w, std::string_view key, std::span<const shape> shapes);
  static void write_function_attr(proto::writer& w, std::string_view key, std::string_view function);

  /// An op's own attribute (one of the types of its `attribute_fields()`).
  static void write_op_attr(proto::writer& w, std::string_view key, dtype v);
  static void write_op_attr(proto::writer& w, std::string_view key, const shape& v);
  static void write_op_attr(proto::writer& w, std::string_view key, const int_list& v);
  static void write_op_attr(proto::writer& w, std::string_view key, std::int64_t v);
  static void write_op_attr(proto::writer& w, std::string_view key, double v);
  static void write_op_attr(proto::writer& w, std::string_view key, bool v);
  static void write_op_attr(proto::writer& w, std::string_view key, const reduction_axes& v);
  static void write_op_attr(proto::writer& w, std::string_view key, ops::padding v);

  template <class Op>
  static void write_op_attrs(proto::writer& w, const Op& op);
};
using attr_writer = basic_attr_writer<void>;

template <class Unused>
template <class F>
void basic_attr_writer<Unused>::write_attr(proto::writer& w, std::string_view key, F&& value) {
  w.message(5, [&](proto::writer& entry) {  // NodeDef.attr (map<string, AttrValue>)
    entry.string(1, key);
    entry.message(2, value);
  });
}

template <class Unused>
void basic_attr_writer<Unused>::write_type_attr(proto::writer& w, std::string_view key, dtype t) {
  write_attr(w, key, [&](proto::writer& a) { a.varint(6, event_encoder::tensorflow_dtype(t)); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_string_attr(proto::writer& w, std::string_view key, std::string_view s) {
  write_attr(w, key, [&](proto::writer& a) { a.bytes(2, s); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_ints_attr(proto::writer& w, std::string_view key,
                                                std::span<const std::int64_t> values) {
  write_attr(w, key, [&](proto::writer& a) {
    a.message(1, [&](proto::writer& list) {  // AttrValue.list
      if (values.empty()) return;
      list.message(3, [&](proto::writer& packed) {  // ListValue.i, packed
        for (std::int64_t v : values) packed.raw_varint(std::uint64_t(v));
      });
    });
  });
}

template <class Unused>
void basic_attr_writer<Unused>::write_shapes_attr(proto::writer& w, std::string_view key,
                                                  std::span<const shape> shapes) {
  write_attr(w, key, [&](proto::writer& a) {
    a.message(1, [&](proto::writer& list) {
      for (const shape& s : shapes) event_encoder::write_tensor_shape(list, 7, s);  // ListValue.shape
    });
  });
}

template <class Unused>
void basic_attr_writer<Unused>::write_function_attr(proto::writer& w, std::string_view key, std::string_view function) {
  write_attr(w, key, [&](proto::writer& a) { a.message(10, [&](proto::writer& f) { f.string(1, function); }); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, dtype v) {
  write_type_attr(w, key, v);
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, const shape& v) {
  write_attr(w, key, [&](proto::writer& a) { event_encoder::write_tensor_shape(a, 7, v); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, const int_list& v) {
  write_ints_attr(w, key, std::span<const std::int64_t>(v.begin(), v.end()));
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, std::int64_t v) {
  write_attr(w, key, [&](proto::writer& a) { a.varint(3, v); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, double v) {
  write_attr(w, key, [&](proto::writer& a) { a.float32(4, float(v)); });  // AttrValue.f is a float
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, bool v) {
  write_attr(w, key, [&](proto::writer& a) { a.boolean(5, v); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, const reduction_axes& v) {
  if (v.all())
    write_string_attr(w, key, "all");
  else
    write_op_attr(w, key, v.list());
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, ops::padding v) {
  write_string_attr(w, key, v == ops::padding::same ? "SAME" : "VALID");
}

template <class Unused>
template <class Op>
void basic_attr_writer<Unused>::write_op_attrs(proto::writer& w, const Op& op) {
  if constexpr (requires { Op::attribute_fields(); })
    std::apply([&](const auto&... a) { (write_op_attr(w, a.name, op.*a.member), ...); }, Op::attribute_fields());
}

// ---- GraphDef -----------------------------------------------------------------------

/// How the graph writer reaches a special op (an entry of special_op_entries): the string
/// attributes the op's `describe(out)` gives TensorBoard (`shared_name`, `tag`), if any.
struct tensorboard_special_op {
  void (*describe)(proto::writer& d, const special_op& op) = nullptr;

  template <class Op>
  static tensorboard_special_op of() {
    struct out {
      proto::writer& d;
      void set_text(std::string_view key, std::string_view value) { attr_writer::write_string_attr(d, key, value); }
    };
    tensorboard_special_op e;
    e.describe = [](proto::writer& d, const special_op& op) {
      if constexpr (requires(out& o) { std::declval<const Op&>().describe(o); })
        if (const Op* o = op.as<Op>()) {
          out attributes{d};
          o->describe(attributes);
        }
    };
    return e;
  }
};

/// Writes graphs as `NodeDef`s, and their subgraphs as `FunctionDef`s into `library`
/// (`graph_def_writer`, the one specialization: a template on nothing, compiled only
/// where a program writes a graph).
template <class Unused>
class basic_graph_def_writer {
 public:
  /// The serialized `GraphDef` of `g`, its conditionals' and loops' graphs as functions.
  /// \code
  /// kiln::function f([](const kiln::tensor& x) { return x * 2 + 1; });
  /// std::string bytes = kiln::detail::graph_def_writer::graph_def_of(f.get_concrete_function(kiln::constant(1.f)).graph());
  /// \endcode
  static std::string graph_def_of(const graph& g) { return basic_graph_def_writer().graph_def(g); }


  /// The serialized `GraphDef` of `g`.
  std::string graph_def(const graph& g) {
    std::string out;
    proto::writer w(out);
    write_nodes(w, 1, g, false);  // GraphDef.node
    if (!library_.empty()) {
      const std::size_t at = w.begin_message(2);  // GraphDef.library (FunctionDefLibrary)
      out += library_;
      w.end_message(at);
    }
    return out;
  }

 private:
  using attrs = basic_attr_writer<Unused>;
  using event_encoder = basic_event_encoder<Unused>;

  // How a node's output is named: in a graph `name` (output 0) or `name:k`; in a
  // function body `name:output:k`, and an argument by its name alone.
  static std::string reference(const graph& g, int id, bool in_function) {
    const node& n = g.node_at(id);
    std::string base = n.name();
    int k = 0;
    if (n.kind() == node_kind::result) {
      k = 1;
      while (id - k >= 0 && g.node_at(id - k).kind() == node_kind::result) ++k;
      base = g.node_at(id - k).name();
    }
    if (!in_function) return k == 0 ? base : base + ":" + std::to_string(k);
    if (n.kind() == node_kind::placeholder) return base;
    return base + ":output:" + std::to_string(k);
  }

  static std::string label_attr(const std::string& label) {
    return label == "then" || label == "else" ? label + "_branch" : label;
  }

  void write_nodes(proto::writer& w, int field, const graph& g, bool in_function) {
    std::string previous_effect;
    const auto& nodes = g.nodes();
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const node& n = nodes[i];
      if (n.kind() == node_kind::result) continue;                    // output k of its special node
      if (in_function && n.kind() == node_kind::placeholder) continue;  // an argument of the function
      w.message(field, [&](proto::writer& d) {
        d.string(1, n.name());
        d.string(2, n.op());
        for (int in : n.input_ids()) d.string(3, reference(g, in, in_function));
        const bool effect = n.kind() == node_kind::special && n.special().has_effects();
        if (effect && !previous_effect.empty()) d.string(3, "^" + previous_effect);
        std::vector<shape> shapes;
        switch (n.kind()) {
          case node_kind::placeholder:
            attrs::write_type_attr(d, "dtype", n.dtype());
            attrs::write_op_attr(d, "shape", n.shape());
            shapes.push_back(n.shape());
            break;
          case node_kind::constant:
            attrs::write_type_attr(d, "dtype", n.dtype());
            attrs::write_attr(d, "value", [&](proto::writer& a) { event_encoder::write_tensor_proto(a, 8, n.value()); });
            shapes.push_back(n.shape());
            break;
          case node_kind::op:
            attrs::write_type_attr(d, "T", n.input_ids().empty() ? n.dtype() : g.node_at(n.input_ids()[0]).dtype());
            ops::visit([&](const auto& op) { attrs::write_op_attrs(d, op); }, n.operation());
            shapes.push_back(n.shape());
            break;
          case node_kind::identity:
            attrs::write_type_attr(d, "T", n.dtype());
            shapes.push_back(n.shape());
            break;
          default: {  // special
            const special_op& s = n.special();
            if (n.result_count() > 0) attrs::write_type_attr(d, "dtype", n.dtype());
            for (int k = 0; k < n.result_count(); ++k) shapes.push_back(nodes[i + std::size_t(k)].shape());
            if (const auto* entry = special_op_entry<tensorboard_special_op>(s)) entry->describe(d, s);
            for (const auto& [label, sub] : s.subgraphs())
              attrs::write_function_attr(d, label_attr(label), add_function(*sub, n.name() + "_" + label));
            break;
          }
        }
        attrs::write_shapes_attr(d, "_output_shapes", shapes);
        if (effect) previous_effect = n.name();
      });
    }
  }

  // Adds `g` to the library as a function named after `base`; returns its name.
  std::string add_function(const graph& g, const std::string& base) {
    const std::string name = base + "_" + std::to_string(function_count_++);
    std::string def;
    proto::writer w(def);
    w.message(1, [&](proto::writer& signature) {  // FunctionDef.signature (OpDef)
      signature.string(1, name);
      for (int id : g.arguments())
        signature.message(2, [&](proto::writer& arg) {  // input_arg (ArgDef)
          arg.string(1, g.node_at(id).name());
          arg.varint(3, event_encoder::tensorflow_dtype(g.node_at(id).dtype()));
        });
      for (std::size_t k = 0; k < g.outputs().size(); ++k)
        signature.message(3, [&](proto::writer& arg) {  // output_arg
          arg.string(1, "output_" + std::to_string(k));
          arg.varint(3, event_encoder::tensorflow_dtype(g.node_at(g.outputs()[k]).dtype()));
        });
    });
    write_nodes(w, 3, g, true);  // FunctionDef.node_def (after the nested functions it adds)
    for (std::size_t k = 0; k < g.outputs().size(); ++k)
      w.message(4, [&](proto::writer& ret) {  // FunctionDef.ret (map<string, string>)
        ret.string(1, "output_" + std::to_string(k));
        ret.string(2, reference(g, g.outputs()[k], true));
      });
    proto::writer library(library_);
    library.bytes(1, def);  // FunctionDefLibrary.function
    return name;
  }

  std::string library_;
  int function_count_ = 0;
};

using graph_def_writer = basic_graph_def_writer<void>;

}  // namespace kiln::detail

#pragma once
/// \file
/// `kiln::graph`: the runtime IR a trace produces. A graph is a list of nodes in
/// execution order; each node is a placeholder (an argument), a constant (a value
/// captured at trace time), an op of the registry, or the Identity that marks an
/// output. Nodes refer to their inputs by index; names are unique within a graph
/// and are what a listing or Graphviz shows.

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {

namespace detail {
template <class List>
struct variant_of;
template <class... Ops>
struct variant_of<ops::type_list<Ops...>> {
  using type = std::variant<Ops...>;
};
}  // namespace detail

namespace ops {
/// Any op of the registry, as a graph node stores it.
using any_op = typename detail::variant_of<all_ops>::type;
}  // namespace ops

/// What a graph node is.
enum class node_kind : unsigned char {
  placeholder,  ///< an argument of the function
  constant,     ///< a value captured while tracing
  op,           ///< an op of the registry
  identity,     ///< an output of the function
};

/// One node of a kiln::graph.
/// \code for (const kiln::node& n : g.nodes()) std::cout << n.name() << " = " << n.op() << "\n"; \endcode
class node {
 public:
  /// Unique within its graph: the argument name, or the op's name with a suffix (`add_1`).
  const std::string& name() const { return name_; }
  /// The op: `Placeholder`, `Const`, `Identity`, or a registry op such as `add`.
  std::string_view op() const {
    switch (kind_) {
      case node_kind::placeholder: return "Placeholder";
      case node_kind::constant: return "Const";
      case node_kind::identity: return "Identity";
      default: return std::visit([](const auto& o) { return std::string_view(std::decay_t<decltype(o)>::name); }, op_);
    }
  }
  /// Names of the nodes whose outputs this node reads, in order.
  const std::vector<std::string>& inputs() const { return input_names_; }
  kiln::dtype dtype() const { return dtype_; }
  /// Possibly partial (`None` dims) when the function accepts several shapes.
  const kiln::shape& shape() const { return shape_; }

  node_kind kind() const { return kind_; }
  /// Indices (into graph::nodes()) of the inputs.
  const std::vector<int>& input_ids() const { return input_ids_; }
  const ops::any_op& operation() const { return op_; }
  /// The captured value of a constant node.
  const tensor& value() const { return value_; }

 private:
  friend class graph;
  std::string name_;
  node_kind kind_ = node_kind::op;
  ops::any_op op_;
  std::vector<int> input_ids_;
  std::vector<std::string> input_names_;
  kiln::dtype dtype_ = float32;
  kiln::shape shape_;
  tensor value_;
};

/// A traced computation: nodes in execution order, the arguments and the outputs.
/// \code
/// auto g = f.get_concrete_function(kiln::constant(1)).graph();
/// for (const auto& n : g.nodes()) std::cout << n.op() << "\n";  // Placeholder, add, Identity
/// \endcode
class graph {
 public:
  const std::vector<node>& nodes() const { return nodes_; }
  /// Node indices of the placeholders, in argument order.
  const std::vector<int>& arguments() const { return arguments_; }
  /// Node indices of the Identity nodes, in output order.
  const std::vector<int>& outputs() const { return outputs_; }

  int add_placeholder(const std::string& name, kiln::dtype t, const kiln::shape& s) {
    int id = add(node_kind::placeholder, name, {}, t, s);
    arguments_.push_back(id);
    return id;
  }
  int add_constant(const tensor& value) {
    int id = add(node_kind::constant, "Const", {}, value.dtype(), value.shape());
    nodes_[id].value_ = value;
    return id;
  }
  int add_op(const ops::any_op& op, std::vector<int> inputs, kiln::dtype t, const kiln::shape& s) {
    std::string base(std::visit([](const auto& o) { return std::string_view(std::decay_t<decltype(o)>::name); }, op));
    int id = add(node_kind::op, base, std::move(inputs), t, s);
    nodes_[id].op_ = op;
    return id;
  }
  int add_output(int source) {
    int id = add(node_kind::identity, "Identity", {source}, nodes_[source].dtype_, nodes_[source].shape_);
    outputs_.push_back(id);
    return id;
  }

  /// The graph in Graphviz's dot language: one box per node, labelled `name\nop`.
  std::string to_dot() const {
    std::ostringstream os;
    os << "digraph kiln {\n  node [shape=box, fontname=\"monospace\"];\n";
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const node& n = nodes_[i];
      os << "  n" << i << " [label=\"" << n.name() << "\\n" << n.op() << " " << name(n.dtype()) << " " << n.shape().str()
         << "\"];\n";
      for (int in : n.input_ids()) os << "  n" << in << " -> n" << i << ";\n";
    }
    os << "}\n";
    return os.str();
  }

 private:
  int add(node_kind kind, const std::string& base, std::vector<int> inputs, kiln::dtype t, const kiln::shape& s) {
    node n;
    n.kind_ = kind;
    n.name_ = unique_name(base);
    for (int in : inputs) n.input_names_.push_back(nodes_.at(std::size_t(in)).name_);
    n.input_ids_ = std::move(inputs);
    n.dtype_ = t;
    n.shape_ = s;
    nodes_.push_back(std::move(n));
    return int(nodes_.size()) - 1;
  }
  // TensorFlow's naming: the first `add`, then `add_1`, `add_2`, ...
  std::string unique_name(const std::string& base) {
    int& count = name_counts_[base];
    std::string candidate = count == 0 ? base : base + "_" + std::to_string(count);
    ++count;
    while (name_counts_.count(candidate) && candidate != base) candidate = base + "_" + std::to_string(count++);
    if (candidate != base) name_counts_[candidate] = 1;
    return candidate;
  }

  std::vector<node> nodes_;
  std::vector<int> arguments_;
  std::vector<int> outputs_;
  std::unordered_map<std::string, int> name_counts_;
};

}  // namespace kiln

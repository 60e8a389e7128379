#pragma once
/// \file
/// `kiln::graph`: the runtime IR a trace produces. A graph is a list of nodes in
/// execution order; each node is a placeholder (an argument), a constant (a value
/// captured at trace time), an op of the registry, a special op (a variable read or
/// write, a print, a host callback, a conditional, a loop: kiln/exec/effects.hpp and
/// kiln/exec/control_flow.hpp), or the Identity that marks an output. A special op
/// with several results is followed by one `Result` node per result after the first.
/// Nodes refer to their inputs by index; names are unique within a graph and are
/// what a listing or Graphviz shows.

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <compare>
#include <functional>
#include <cstddef>
#include <iterator>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/shared_blocks.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/any_op.hpp"
#include "kiln/ops/registry.hpp"

namespace kiln {

class graph;

/// An op that is not a pure function of its inputs or that runs graphs of its own:
/// variable reads and writes, prints, host callbacks, conditionals and loops. The
/// same object runs eagerly and as a graph node. Effects run in program order and
/// are never pruned, folded or merged.
///
/// A derived op defines `name()`, `has_effects()`, `run(inputs)` (returning a tensor,
/// or a vector of tensors when it has other than one result) and optionally
/// `subgraphs()`, and passes `std::type_identity<itself>` to this base. Calls reach
/// them through a table of function pointers made where the op is constructed, not
/// through virtual functions: a compiler treats every override of a virtual function
/// as reachable wherever the base is used, so each program that ran any graph, or
/// just freed a tensor, would compile the loops, conditionals and datasets too.
///
/// A derived op also says how the consumers of graphs treat it, each a member they
/// look up by the op's kind (a file's reader, by its name), so that no consumer
/// enumerates the ops (kiln/io/special_ops.hpp lists those that files know):
/// - `static op_names()`: the names its nodes take (one per kind it has; none for an op
///   named as another, which no file holds);
/// - saving (kiln/saved_function.hpp): `template <class Out> void save(Out&) const`
///   writes its attributes, `template <class In> static std::shared_ptr<const special_op>
///   load(In&)` checks them against the node and rebuilds it; or `static constexpr
///   std::string_view save_refusal`, why it cannot be saved;
/// - ONNX (kiln/onnx.hpp): `template <class Onnx, class Graph> std::vector<std::string>
///   to_onnx(Onnx&, Graph&, const node&, const graph&, const std::vector<std::string>&) const`
///   emits its nodes, or `static constexpr std::string_view onnx_refusal` says why not;
/// - TensorBoard's graph (kiln/summary.hpp): `template <class Out> void describe(Out&) const`
///   gives the node's text attributes (`out.set_text(key, value)`), if it has any;
/// - gradients: an entry of special_gradients() (kiln/graph/special_gradients.hpp),
///   registered by the layer that differentiates it.
/// `Out`, `In` and `Onnx` are the consumers' types, so an op's header names no JSON or
/// protocol buffer, and a program that saves nothing compiles none of it. An op without
/// a member is refused by its name ("cannot save yet", "has no ONNX operator") or has
/// no gradient.
class special_op {
 public:
  /// The op as a graph listing shows it: `ReadVariableOp`, `PrintV2`, `cond`, `while`.
  KILN_LIBRARY_INLINE std::string_view name() const;
  /// True when running it does more than compute its results (a write, a print, a
  /// callback), so that it runs even when no output needs it.
  KILN_LIBRARY_INLINE bool has_effects() const;
  /// Runs on eager inputs and writes one tensor per result into `results`.
  KILN_LIBRARY_INLINE void run(std::span<const tensor* const> inputs, std::span<tensor> results) const;
  /// The graphs it runs, labelled (`then`, `else`, `cond`, `body`), for to_dot().
  KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> subgraphs() const;
  /// This op as an `Op`, or null when it is another kind of special op.
  template <class Op>
  const Op* as() const {
    return table_ == &table_of<Op> ? static_cast<const Op*>(this) : nullptr;
  }

 protected:
  template <class Op>
  explicit special_op(std::type_identity<Op>) : table_(&table_of<Op>) {}
  special_op(const special_op&) = default;
  special_op& operator=(const special_op&) = default;
  // Owners hold the derived type (std::make_shared), so no virtual destructor.
  ~special_op() = default;

 private:
  // An op's run() returns its one result as a tensor, so that no vector is allocated
  // for it, or a vector of its results (empty when it has none).
  KILN_LIBRARY_INLINE static void deliver(tensor result, std::span<tensor> results, const special_op& op);
  KILN_LIBRARY_INLINE static void deliver(std::vector<tensor> out, std::span<tensor> results, const special_op& op);
  [[noreturn]] static void wrong_count(const special_op& op, std::size_t gave, std::size_t expected) {
    throw internal_error(std::string(op.name()) + " gave " + std::to_string(gave) + " results instead of " +
                         std::to_string(expected));
  }
  struct operations {
    std::string_view (*name)(const special_op&);
    bool (*has_effects)(const special_op&);
    void (*run)(const special_op&, std::span<const tensor* const>, std::span<tensor>);
    std::vector<std::pair<std::string, const graph*>> (*subgraphs)(const special_op&);
  };
  template <class Op>
  static constexpr operations table_of{
      [](const special_op& op) { return std::string_view(static_cast<const Op&>(op).name()); },
      [](const special_op& op) { return static_cast<const Op&>(op).has_effects(); },
      [](const special_op& op, std::span<const tensor* const> in, std::span<tensor> results) {
        deliver(static_cast<const Op&>(op).run(in), results, op);
      },
      [](const special_op& op) -> std::vector<std::pair<std::string, const graph*>> {
        // (Op's own subgraphs(), not this base's, which would call itself)
        if constexpr (!std::is_same_v<decltype(&Op::subgraphs), decltype(&special_op::subgraphs)>)
          return static_cast<const Op&>(op).subgraphs();
        else
          return {};
      }};
  const operations* table_;
};

/// What a graph node is.
enum class node_kind : unsigned char {
  placeholder,  ///< an argument of the function
  constant,     ///< a value captured while tracing
  op,           ///< an op of the registry
  special,      ///< a special_op; the node's value is its first result
  result,       ///< a further result of the special node just before it
  identity,     ///< an output of the function
};

namespace detail {

/// A node's input ids: up to three in the node itself (every op of an elementwise
/// chain), more on the heap. A std::vector made an allocation per traced op, and one
/// per op again for each graph the optimizer rebuilt.
class node_inputs {
 public:
  node_inputs() = default;
  explicit node_inputs(std::span<const int> ids) : size_(std::uint32_t(ids.size())) {
    if (ids.size() > inline_count) heap_.reset(new int[ids.size()]);
    std::copy(ids.begin(), ids.end(), data());
  }
  node_inputs(const node_inputs& other) : node_inputs(other.view()) {}
  node_inputs(node_inputs&& other) noexcept
      : heap_(std::move(other.heap_)), size_(std::exchange(other.size_, 0)) {
    std::copy(std::begin(other.inline_), std::end(other.inline_), inline_);
  }
  node_inputs& operator=(node_inputs other) noexcept {
    heap_.swap(other.heap_);
    std::swap(size_, other.size_);
    std::swap(inline_, other.inline_);
    return *this;
  }
  ~node_inputs() = default;

  std::span<const int> view() const { return {size_ > inline_count ? heap_.get() : inline_, size_}; }

 private:
  static constexpr std::size_t inline_count = 3;
  int* data() { return size_ > inline_count ? heap_.get() : inline_; }
  std::unique_ptr<int[]> heap_;
  std::uint32_t size_ = 0;
  int inline_[inline_count] = {};
};

}  // namespace detail

/// One node of a kiln::graph.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x + 1; });
/// const kiln::graph g = f.get_concrete_function(kiln::constant(1)).graph();
/// for (const kiln::node& n : g.nodes()) std::cout << n.name() << " = " << n.op() << "\n";
/// \endcode
class node {
 public:
  /// Unique within its graph: the argument name, or the op's name with a suffix (`add_1`).
  const std::string& name() const { return name_; }
  /// The op: `Placeholder`, `Const`, `Identity`, `Result`, a special op such as
  /// `cond`, or a registry op such as `add`.
  KILN_LIBRARY_INLINE std::string_view op() const;
  /// Names of the nodes whose outputs this node reads, in order (read from its graph,
  /// which must be alive).
  KILN_LIBRARY_INLINE std::vector<std::string> inputs() const;
  kiln::dtype dtype() const { return dtype_; }
  /// Possibly partial (`None` dims) when the function accepts several shapes.
  const kiln::shape& shape() const { return shape_; }

  node_kind kind() const { return kind_; }
  /// Indices (into graph::nodes()) of the inputs.
  std::span<const int> input_ids() const { return input_ids_.view(); }
  const ops::any_op& operation() const { return op_; }
  /// The captured value of a constant node.
  KILN_LIBRARY_INLINE const tensor& value() const;
  /// The op of a special node.
  KILN_LIBRARY_INLINE const special_op& special() const;
  /// How many results a special node has (its own value and the Result nodes after it).
  int result_count() const { return result_count_; }

 private:
  friend class graph;
  KILN_LIBRARY_INLINE std::shared_ptr<const special_op> special_op_ptr() const;

  // The members in an order that leaves no padding: a graph of 10^5 ops holds twice as
  // many nodes, and its trace's time grows with the memory it first touches.
  std::string name_;
  ops::any_op op_;
  detail::node_inputs input_ids_;
  // The graph that holds the node, where inputs() finds its inputs' names (a graph
  // keeps it current when it is copied or moved): a name per input in every node made
  // two allocations per traced op.
  const graph* graph_ = nullptr;
  kiln::shape shape_;
  // A constant's value (a tensor) or a special node's op, the one a node's kind holds;
  // behind a pointer: a tensor in place made a node 2.5 times larger.
  std::shared_ptr<const void> held_;
  int result_count_ = 1;
  node_kind kind_ = node_kind::op;
  kiln::dtype dtype_ = float32;
};

/// The nodes of a graph in execution order, as kiln::graph::nodes() gives them: a
/// random-access range of nodes held in blocks that never move. A graph grows a node
/// at a time while it is traced; in one array it was copied into arrays twice as large
/// as it grew, which touched about three times the memory its nodes need (a graph of
/// 10^5 ops spent a sixth of its trace in first touches of fresh pages).
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x + 1; });
/// const kiln::graph g = f.get_concrete_function(kiln::constant(1)).graph();
/// const kiln::node_list& nodes = g.nodes();
/// std::cout << nodes.size() << " nodes, the last " << nodes.back().name() << "\n";  // 4 nodes, the last Identity
/// \endcode
class node_list {
 public:
  /// A const random-access iterator over the nodes.
  class iterator {
   public:
    using iterator_concept = std::random_access_iterator_tag;
    using iterator_category = std::random_access_iterator_tag;
    using value_type = node;
    using difference_type = std::ptrdiff_t;
    using pointer = const node*;
    using reference = const node&;

    iterator() = default;
    reference operator*() const { return (*list_)[i_]; }
    pointer operator->() const { return &(*list_)[i_]; }
    reference operator[](difference_type k) const { return (*list_)[std::size_t(difference_type(i_) + k)]; }
    iterator& operator++() { return ++i_, *this; }
    iterator operator++(int) { return {list_, i_++}; }
    iterator& operator--() { return --i_, *this; }
    iterator operator--(int) { return {list_, i_--}; }
    iterator& operator+=(difference_type k) { return i_ = std::size_t(difference_type(i_) + k), *this; }
    iterator& operator-=(difference_type k) { return *this += -k; }
    friend iterator operator+(iterator it, difference_type k) { return it += k; }
    friend iterator operator+(difference_type k, iterator it) { return it += k; }
    friend iterator operator-(iterator it, difference_type k) { return it -= k; }
    friend difference_type operator-(const iterator& a, const iterator& b) {
      return difference_type(a.i_) - difference_type(b.i_);
    }
    friend bool operator==(const iterator& a, const iterator& b) { return a.i_ == b.i_; }
    friend auto operator<=>(const iterator& a, const iterator& b) { return a.i_ <=> b.i_; }

   private:
    friend class node_list;
    iterator(const node_list* list, std::size_t i) : list_(list), i_(i) {}
    const node_list* list_ = nullptr;
    std::size_t i_ = 0;
  };

  node_list() = default;
  node_list(const node_list& other) {
    for (const node& n : other) push_back(n);
  }
  node_list(node_list&& other) noexcept
      : blocks_(std::move(other.blocks_)), size_(std::exchange(other.size_, 0)) {}
  node_list& operator=(node_list other) noexcept {
    blocks_.swap(other.blocks_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~node_list() {
    for (std::size_t i = 0; i < size_; ++i) std::destroy_at(&edit(i));
    for (node* block : blocks_) std::allocator<node>().deallocate(block, block_size);
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const node& operator[](std::size_t i) const { return blocks_[i >> block_bits][i & (block_size - 1)]; }
  const node& front() const { return (*this)[0]; }
  const node& back() const { return (*this)[size_ - 1]; }
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size_}; }
  /// The position of node `n`, which must be one of these (a search over the blocks,
  /// for the rare consumer that holds a node but not its index).
  std::size_t index_of(const node& n) const {
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      if (std::less_equal<>()(blocks_[b], &n) && std::less<>()(&n, blocks_[b] + block_size))
        return (b << block_bits) + std::size_t(&n - blocks_[b]);
    throw internal_error("node_list: node " + n.name() + " is not one of this graph's");
  }

 private:
  friend class graph;
  static constexpr std::size_t block_bits = 10;
  static constexpr std::size_t block_size = std::size_t(1) << block_bits;

  node& edit(std::size_t i) { return blocks_[i >> block_bits][i & (block_size - 1)]; }
  void push_back(node n) {
    if (size_ == blocks_.size() * block_size) blocks_.push_back(std::allocator<node>().allocate(block_size));
    std::construct_at(&blocks_.back()[size_ & (block_size - 1)], std::move(n));
    ++size_;
  }
  void reserve(std::size_t n) { blocks_.reserve((n + block_size - 1) / block_size); }

  std::vector<node*> blocks_;
  std::size_t size_ = 0;
};

/// A traced computation: nodes in execution order, the arguments and the outputs.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x + 1; });
/// auto g = f.get_concrete_function(kiln::constant(1)).graph();
/// for (const auto& n : g.nodes()) std::cout << n.op() << "\n";  // Placeholder, add, Identity
/// \endcode
class graph {
 public:
  graph() = default;
  KILN_LIBRARY_INLINE graph(const graph& other);
  KILN_LIBRARY_INLINE graph(graph&& other) noexcept;
  KILN_LIBRARY_INLINE graph& operator=(graph other) noexcept;
  ~graph() = default;

  const node_list& nodes() const { return nodes_; }
  /// Node `id` (an index into nodes()).
  KILN_LIBRARY_INLINE const node& node_at(int id) const;
  /// Node indices of the placeholders, in argument order.
  const std::vector<int>& arguments() const { return arguments_; }
  /// Node indices of the Identity nodes, in output order.
  const std::vector<int>& outputs() const { return outputs_; }

  /// Makes room for `n` nodes, as a pass that rebuilds a graph of n nodes does.
  /// \code
  /// kiln::graph g;
  /// g.reserve(2);
  /// g.add_output(g.add_placeholder("x", kiln::float32, kiln::shape{}));
  /// \endcode
  KILN_LIBRARY_INLINE void reserve(std::size_t n);

  KILN_LIBRARY_INLINE int add_placeholder(const std::string& name, kiln::dtype t, const kiln::shape& s);
  KILN_LIBRARY_INLINE int add_constant(const tensor& value);
  /// A constant holding the value of constant node `n` of another graph (the value is shared).
  KILN_LIBRARY_INLINE int add_constant(const node& n);
  KILN_LIBRARY_INLINE int add_op(const ops::any_op& op, std::span<const int> inputs, kiln::dtype t, const kiln::shape& s);
  /// Adds special op `op` with one result per entry of `results`; returns the nodes
  /// that hold them (the special node, then its Result nodes), none when it has no
  /// results (the node then has no value).
  KILN_LIBRARY_INLINE std::vector<int> add_special(std::shared_ptr<const special_op> op, std::span<const int> inputs,
                                                   const std::vector<std::pair<kiln::dtype, kiln::shape>>& results);
  /// Copies special node `id` of graph `from` (and its Result nodes) with `inputs`.
  KILN_LIBRARY_INLINE std::vector<int> add_special_like(const graph& from, int id, std::span<const int> inputs);
  /// True when some special node has effects (its graph must run even for no output).
  KILN_LIBRARY_INLINE bool has_effects() const;
  /// Per node, whether running the graph needs it: an output, a special node with
  /// effects, or an input of a needed node. What is not needed is pruned when the
  /// graph runs.
  /// \code
  /// kiln::function f([](const kiln::tensor& x) { kiln::exp(x); return x + 1; });
  /// const kiln::graph g = f.get_concrete_function(kiln::constant(1.f)).graph();
  /// g.needed_nodes();  // 0 for the exp, 1 for the rest
  /// \endcode
  KILN_LIBRARY_INLINE std::vector<char> needed_nodes() const;
  KILN_LIBRARY_INLINE int add_output(int source);

  /// The graph in Graphviz's dot language: one box per node, labelled `name\nop`;
  /// the branches and bodies of conditionals and loops as nested clusters.
  template <class = void>
  std::string to_dot() const {
    std::ostringstream os;
    os << "digraph kiln {\n  node [shape=box, fontname=\"monospace\"];\n";
    write_dot(os, "n", "  ");
    os << "}\n";
    return os.str();
  }

 private:
  template <class = void>
  void write_dot(std::ostringstream& os, const std::string& prefix, const std::string& indent) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const node& n = nodes_[i];
      os << indent << prefix << i << " [label=\"" << n.name() << "\\n" << n.op() << " " << name(n.dtype()) << " "
         << n.shape().str() << "\"];\n";
      for (int in : n.input_ids()) os << indent << prefix << in << " -> " << prefix << i << ";\n";
      if (n.kind_ != node_kind::special) continue;
      for (const auto& [label, sub] : n.special().subgraphs()) {
        const std::string inner = prefix + std::to_string(i) + "_" + label + "_";
        os << indent << "subgraph cluster_" << inner << " {\n" << indent << "  label=\"" << n.name() << " " << label
           << "\";\n";
        sub->write_dot(os, inner, indent + "  ");
        os << indent << "}\n";
      }
    }
  }

  KILN_LIBRARY_INLINE void adopt_nodes();
  KILN_LIBRARY_INLINE int add(node_kind kind, const std::string& base, std::span<const int> inputs, kiln::dtype t,
                              const kiln::shape& s);
  // TensorFlow's naming: the first `add`, then `add_1`, `add_2`, ..., skipping a name
  // given before. Which names were given is known without a set of every name, which
  // would cost each node of a large graph a lookup in a table as large: a base's
  // suffixes count up, so `b_k` (k in digits) was given as a suffixed name exactly when
  // base `b` has handed out k; a bare base is given once and remembered.
  KILN_LIBRARY_INLINE std::string unique_name(const std::string& base);
  // Whether `name` is `b_k` (k digits, no leading zero) handed out by base b.
  KILN_LIBRARY_INLINE bool suffixed(std::string_view name) const;

  node_list nodes_;
  std::vector<int> arguments_;
  std::vector<int> outputs_;
  std::map<std::string, int, std::less<>> next_suffix_;  ///< per base: the next suffix to try (one entry per base)
  std::set<std::string, std::less<>> bare_names_;        ///< the names given without a suffix
  detail::shared_blocks<tensor, 32> constants_;  ///< the captured values of add_constant()
};

// Compiled once in a compiled kiln (KILN_LIBRARY_INLINE, kiln/config.hpp): every
// program that traces builds graphs with them.
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::vector<int> graph::add_special(std::shared_ptr<const special_op> op, std::span<const int> inputs,
                                                       const std::vector<std::pair<kiln::dtype, kiln::shape>>& results) {
  const std::string base(op->name());
  int id = add(node_kind::special, base, inputs, results.empty() ? bool_ : results[0].first,
               results.empty() ? kiln::shape{} : results[0].second);
  nodes_.edit(std::size_t(id)).held_ = std::move(op);
  nodes_.edit(std::size_t(id)).result_count_ = int(results.size());
  std::vector<int> ids;
  if (!results.empty()) ids.push_back(id);
  const int reads[] = {id};
  for (std::size_t k = 1; k < results.size(); ++k)
    ids.push_back(add(node_kind::result, nodes_[std::size_t(id)].name_ + ":" + std::to_string(k), reads, results[k].first,
                      results[k].second));
  return ids;
}

KILN_LIBRARY_INLINE int graph::add(node_kind kind, const std::string& base, std::span<const int> inputs, kiln::dtype t,
                                   const kiln::shape& s) {
  node n;
  n.kind_ = kind;
  n.name_ = unique_name(base);
  for (int in : inputs)
    if (in < 0 || std::size_t(in) >= nodes_.size())
      throw internal_error("graph: node " + n.name_ + " reads node " + std::to_string(in) + " of " +
                           std::to_string(nodes_.size()));
  n.input_ids_ = detail::node_inputs(inputs);
  n.graph_ = this;
  n.dtype_ = t;
  n.shape_ = s;
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

KILN_LIBRARY_INLINE std::vector<std::string> node::inputs() const {
  std::vector<std::string> names;
  names.reserve(input_ids().size());
  for (int in : input_ids()) names.push_back(graph_->node_at(in).name());
  return names;
}

KILN_LIBRARY_INLINE std::string graph::unique_name(const std::string& base) {
  int& next = next_suffix_[base];
  if (next == 0) {
    next = 1;
    if (!suffixed(base)) {
      bare_names_.insert(base);
      return base;
    }
  }
  // (A candidate `base_next` is never one of base's own suffixed names, which are below next.)
  for (;; ++next) {
    std::string candidate = base + "_" + std::to_string(next);
    if (!bare_names_.contains(candidate)) {
      ++next;
      return candidate;
    }
  }
}
#endif

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE std::string_view special_op::name() const { return table_->name(*this); }

KILN_LIBRARY_INLINE bool special_op::has_effects() const { return table_->has_effects(*this); }

KILN_LIBRARY_INLINE void special_op::run(std::span<const tensor* const> inputs, std::span<tensor> results) const {
  table_->run(*this, inputs, results);
}

KILN_LIBRARY_INLINE std::vector<std::pair<std::string, const graph*>> special_op::subgraphs() const {
  return table_->subgraphs(*this);
}

KILN_LIBRARY_INLINE void special_op::deliver(tensor result, std::span<tensor> results, const special_op& op) {
  if (results.size() != 1) wrong_count(op, 1, results.size());
  results[0] = std::move(result);
}

KILN_LIBRARY_INLINE void special_op::deliver(std::vector<tensor> out, std::span<tensor> results, const special_op& op) {
  if (out.size() != results.size()) wrong_count(op, out.size(), results.size());
  std::move(out.begin(), out.end(), results.begin());
}

KILN_LIBRARY_INLINE std::string_view node::op() const {
  switch (kind_) {
    case node_kind::placeholder:
      return "Placeholder";
    case node_kind::constant:
      return "Const";
    case node_kind::identity:
      return "Identity";
    case node_kind::result:
      return "Result";
    case node_kind::special:
      return special().name();
    default:
      return ops::name_of(op_);
  }
}

KILN_LIBRARY_INLINE const tensor& node::value() const {
  static const tensor none;
  return kind_ == node_kind::constant && held_ ? *static_cast<const tensor*>(held_.get()) : none;
}

KILN_LIBRARY_INLINE const special_op& node::special() const { return *static_cast<const special_op*>(held_.get()); }

KILN_LIBRARY_INLINE std::shared_ptr<const special_op> node::special_op_ptr() const {
  return std::static_pointer_cast<const special_op>(held_);
}

KILN_LIBRARY_INLINE graph::graph(const graph& other)
    : nodes_(other.nodes_),
      arguments_(other.arguments_),
      outputs_(other.outputs_),
      next_suffix_(other.next_suffix_),
      bare_names_(other.bare_names_) {
  adopt_nodes();
}

KILN_LIBRARY_INLINE graph::graph(graph&& other) noexcept
    : nodes_(std::move(other.nodes_)),
      arguments_(std::move(other.arguments_)),
      outputs_(std::move(other.outputs_)),
      next_suffix_(std::move(other.next_suffix_)),
      bare_names_(std::move(other.bare_names_)),
      constants_(std::move(other.constants_)) {
  adopt_nodes();
}

KILN_LIBRARY_INLINE graph& graph::operator=(graph other) noexcept {
  std::swap(nodes_, other.nodes_);
  std::swap(constants_, other.constants_);
  arguments_.swap(other.arguments_);
  outputs_.swap(other.outputs_);
  next_suffix_.swap(other.next_suffix_);
  bare_names_.swap(other.bare_names_);
  adopt_nodes();
  return *this;
}

KILN_LIBRARY_INLINE const node& graph::node_at(int id) const { return nodes_[std::size_t(id)]; }

KILN_LIBRARY_INLINE void graph::reserve(std::size_t n) { nodes_.reserve(n); }

KILN_LIBRARY_INLINE int graph::add_placeholder(const std::string& name, kiln::dtype t, const kiln::shape& s) {
  int id = add(node_kind::placeholder, name, {}, t, s);
  arguments_.push_back(id);
  return id;
}

KILN_LIBRARY_INLINE int graph::add_constant(const tensor& value) {
  int id = add(node_kind::constant, "Const", {}, value.dtype(), value.shape());
  nodes_.edit(std::size_t(id)).held_ = constants_.make(value);
  return id;
}

KILN_LIBRARY_INLINE int graph::add_constant(const node& n) {
  int id = add(node_kind::constant, "Const", {}, n.dtype(), n.shape());
  nodes_.edit(std::size_t(id)).held_ = n.held_;
  return id;
}

KILN_LIBRARY_INLINE int graph::add_op(const ops::any_op& op, std::span<const int> inputs, kiln::dtype t,
                                      const kiln::shape& s) {
  std::string base(ops::name_of(op));
  int id = add(node_kind::op, base, inputs, t, s);
  nodes_.edit(std::size_t(id)).op_ = op;
  return id;
}

KILN_LIBRARY_INLINE std::vector<int> graph::add_special_like(const graph& from, int id, std::span<const int> inputs) {
  const node& n = from.node_at(id);
  std::vector<std::pair<kiln::dtype, kiln::shape>> specs;
  if (n.result_count_ > 0) specs.emplace_back(n.dtype_, n.shape_);
  for (int k = 1; k < n.result_count_; ++k) {
    const node& r = from.node_at(id + k);
    specs.emplace_back(r.dtype_, r.shape_);
  }
  return add_special(n.special_op_ptr(), inputs, specs);
}

KILN_LIBRARY_INLINE bool graph::has_effects() const {
  for (const node& n : nodes_)
    if (n.kind_ == node_kind::special && n.special().has_effects()) return true;
  return false;
}

KILN_LIBRARY_INLINE std::vector<char> graph::needed_nodes() const {
  std::vector<char> needed(nodes_.size(), 0);
  for (int out : outputs_) needed[std::size_t(out)] = 1;
  // A node's readers come after it, so one pass back settles each node before it is reached.
  for (std::size_t id = nodes_.size(); id-- > 0;) {
    const node& n = nodes_[id];
    if (n.kind_ == node_kind::special && n.special().has_effects()) needed[id] = 1;
    if (needed[id])
      for (int in : n.input_ids()) needed[std::size_t(in)] = 1;
  }
  return needed;
}

KILN_LIBRARY_INLINE int graph::add_output(int source) {
  const int inputs[] = {source};
  const node& read = nodes_[std::size_t(source)];
  int id = add(node_kind::identity, "Identity", inputs, read.dtype_, read.shape_);
  outputs_.push_back(id);
  return id;
}

KILN_LIBRARY_INLINE void graph::adopt_nodes() {
  for (std::size_t i = 0; i < nodes_.size(); ++i) nodes_.edit(i).graph_ = this;
}

KILN_LIBRARY_INLINE bool graph::suffixed(std::string_view name) const {
  const std::size_t underscore = name.rfind('_');
  if (underscore == std::string_view::npos || underscore + 1 == name.size() || name[underscore + 1] == '0')
    return false;
  std::int64_t k = 0;
  const auto [end, ec] = std::from_chars(name.data() + underscore + 1, name.data() + name.size(), k);
  if (ec != std::errc() || end != name.data() + name.size()) return false;
  const auto it = next_suffix_.find(name.substr(0, underscore));
  return it != next_suffix_.end() && k < it->second;
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

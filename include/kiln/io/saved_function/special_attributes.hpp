#pragma once
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

#include "kiln/io/saved_function/json_codecs.hpp"
#include "kiln/io/special_ops.hpp"

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

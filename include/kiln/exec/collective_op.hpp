#pragma once
/// \file
/// The special op of collectives across ranks (kiln/distributed.hpp: `kiln::all_reduce`,
/// `all_gather`, `broadcast`, `reduce_scatter`), and the hook through which it reaches
/// the transport. A collective node holds what it does (its kind, reduce op, root and
/// group) and takes its tensors as inputs; when it runs it hands them to the engine that
/// kiln/distribute/ installs (MPI for host tensors, NCCL for device ones). This header
/// holds no transport code and needs no MPI, so that the consumers of graphs that must
/// recognise the node (saved functions) include it alone, and a program built without
/// the distributed component that meets such a node says what it lacks.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/graph/graph.hpp"

namespace kiln {

/// How `kiln::all_reduce` and `kiln::reduce_scatter` combine the ranks' values:
/// TensorFlow's `tf.distribute.ReduceOp` (sum, mean) and the collectives' max and min.
/// \code kiln::reduce_op op = kiln::reduce_op::mean; \endcode
enum class reduce_op : unsigned char { sum, mean, max, min };

/// `sum`, `mean`, `max`, `min`.
/// \code kiln::name(kiln::reduce_op::max) == "max" \endcode
inline std::string_view name(reduce_op op) {
  static constexpr std::string_view names[] = {"sum", "mean", "max", "min"};
  return names[int(op)];
}

}  // namespace kiln

namespace kiln::detail {

/// What a collective does with its tensors.
enum class collective_kind : unsigned char {
  all_reduce,      ///< every rank gets the reduction of every rank's tensors
  all_gather,      ///< every rank gets every rank's tensor, stacked along axis 0 in rank order
  broadcast,       ///< every rank gets the root's tensor
  reduce_scatter,  ///< rank r gets block r (along axis 0) of the reduction
  reduce,          ///< the root gets the reduction, the others zeros (broadcast's gradient)
};

/// The graph op of each kind, as a graph listing shows it (TensorFlow's collective ops'
/// names; `CollectiveReduce` is NCCL's `Reduce`, which TensorFlow's graphs call
/// NcclReduce).
inline std::string_view collective_op_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastV2",
                                               "CollectiveReduceScatterV2", "CollectiveReduce"};
  return names[int(kind)];
}
/// The function of each kind, as messages name it.
inline std::string_view collective_api_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"kiln::all_reduce", "kiln::all_gather", "kiln::broadcast",
                                               "kiln::reduce_scatter", "kiln::broadcast's gradient"};
  return names[int(kind)];
}

/// A collective as a node holds it.
struct collective_spec {
  collective_kind kind = collective_kind::all_reduce;
  reduce_op op = reduce_op::sum;  ///< all_reduce, reduce_scatter, reduce
  int root = 0;                   ///< broadcast, reduce: the rank (in the group) whose tensor counts
  /// The group: the world ranks of its members in the group's rank order; empty for
  /// every rank of the world.
  std::vector<int> members;
  /// The transport's state of the group (kiln/distribute/): set for a collective the
  /// program made, null for one loaded from a file, whose group `members` finds.
  std::shared_ptr<void> group;
  /// Where the program calls it (a hash of its source file, line and column, and the
  /// line): ranks that reach a collective from different places have lost step, since
  /// every rank runs the same program.
  std::uint64_t site = 0;
  std::uint32_t line = 0;
};

/// The `site` of a collective called at `file`, `line`, `column`.
inline std::uint64_t collective_site(std::string_view file, std::uint32_t line, std::uint32_t column) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (char c : file) hash = (hash ^ std::uint8_t(c)) * 1099511628211ull;
  for (std::uint32_t v : {line, column})
    for (int b = 0; b < 4; ++b) hash = (hash ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return hash;
}

/// Why a collective cannot take its inputs: nothing, or which rule they break.
struct collective_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks the dtype and shape of a collective's inputs (one tensor, or several of one
/// dtype for an all_reduce) in a group of `group_size` ranks, and gives the results'
/// shapes in `results`. Partial shapes pass when some shape of them would.
/// (A template on nothing, compiled only where a program uses it.)
template <class = void>
collective_failure check_collective(const collective_spec& s, std::span<const std::pair<dtype, shape>> inputs,
                                    int group_size, std::vector<std::pair<dtype, shape>>* results = nullptr) {
  const std::string who(collective_api_name(s.kind));
  auto fail = [&](collective_failure::kind_t kind, const std::string& problem) {
    return collective_failure{kind, who + ": " + problem};
  };
  if (inputs.empty()) return fail(collective_failure::wrong_shape, "no tensors given");
  if (s.kind != collective_kind::all_reduce && inputs.size() != 1)
    return fail(collective_failure::wrong_shape, "takes one tensor, got " + std::to_string(inputs.size()));
  const dtype t = inputs[0].first;
  for (const auto& [type, dims] : inputs)
    if (type != t)
      return fail(collective_failure::wrong_dtype, "the tensors of one all_reduce share a dtype, got " +
                                                       std::string(name(t)) + " and " + std::string(name(type)));
  const bool reduces = s.kind == collective_kind::all_reduce || s.kind == collective_kind::reduce_scatter ||
                       s.kind == collective_kind::reduce;
  if (reduces && !dtypes::numeric.contains(t))
    return fail(collective_failure::wrong_dtype, "reduce_op::" + std::string(name(s.op)) +
                                                     " needs int32, int64, float32 or float64 tensors, got " +
                                                     std::string(name(t)));
  if (s.kind == collective_kind::reduce && !is_floating(t))
    return fail(collective_failure::wrong_dtype, "takes float32 or float64 tensors, got " + std::string(name(t)));
  if ((s.kind == collective_kind::broadcast || s.kind == collective_kind::reduce) &&
      (s.root < 0 || s.root >= group_size))
    return fail(collective_failure::wrong_shape, "root " + std::to_string(s.root) + " is not a rank of a group of " +
                                                     std::to_string(group_size));
  const shape& first = inputs[0].second;
  if (s.kind == collective_kind::all_gather || s.kind == collective_kind::reduce_scatter) {
    if (first.has_known_rank() && first.rank() == 0)
      return fail(collective_failure::wrong_shape, "needs a tensor of rank 1 or more (it works along axis 0), got a scalar");
    if (s.kind == collective_kind::reduce_scatter && first.has_known_rank() && first[0] != none &&
        first[0] % group_size != 0)
      return fail(collective_failure::wrong_shape, "the first dim of shape " + first.str() +
                                                       " does not divide into " + std::to_string(group_size) +
                                                       " equal blocks, one per rank");
  }
  if (results) {
    results->clear();
    for (const auto& [type, dims] : inputs) {
      shape out = dims;
      if (dims.has_known_rank() && dims.rank() > 0 && dims[0] != none) {
        std::vector<std::int64_t> d(dims.begin(), dims.end());
        if (s.kind == collective_kind::all_gather) d[0] *= group_size;
        if (s.kind == collective_kind::reduce_scatter) d[0] /= group_size;
        out = shape(std::span<const std::int64_t>(d));
      }
      results->emplace_back(type, out);
    }
  }
  return {};
}

class collective_op;

/// Where collectives run: the transport that kiln/distribute/ installs when a program
/// includes kiln/distributed.hpp (null otherwise).
struct collective_engine {
  /// Runs `op` on eager inputs and writes one tensor per result into `results`.
  void (*run)(const collective_op& op, std::span<const tensor* const> inputs, std::span<tensor> results) = nullptr;
  /// The number of ranks of a group (`members` empty: the world).
  int (*group_size)(const std::vector<int>& members) = nullptr;
};
inline std::atomic<const collective_engine*>& collective_engine_slot() {
  static std::atomic<const collective_engine*> engine{nullptr};
  return engine;
}

/// What a program without the distributed component says when it meets a collective.
[[noreturn]] inline void throw_no_collective_engine(std::string_view where, std::string_view op) {
  throw unavailable_error(std::string(where) + std::string(op) +
                          " is a collective across ranks, which needs kiln's distributed component: "
                          "#include <kiln/distributed.hpp> and link the CMake target kiln::distributed");
}

/// A collective across ranks: its inputs are the tensors it combines, its results one per
/// input. It has effects: every rank must run the same collectives in the same order, so
/// they run in program order and are never pruned, folded or merged.
class collective_op final : public special_op {
 public:
  explicit collective_op(collective_spec spec) : special_op(std::type_identity<collective_op>()), spec_(std::move(spec)) {}
  std::string_view name() const { return collective_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine("", name());
    std::vector<tensor> out(in.size());
    engine->run(*this, in, out);
    return out;
  }
  const collective_spec& spec() const { return spec_; }

  static std::array<std::string_view, 5> op_names() {
    return {collective_op_name(collective_kind::all_reduce), collective_op_name(collective_kind::all_gather),
            collective_op_name(collective_kind::broadcast), collective_op_name(collective_kind::reduce_scatter),
            collective_op_name(collective_kind::reduce)};
  }
  /// Saved as what it does; the kind is in the op's name, the group is its world ranks
  /// (empty: the world).
  template <class Out>
  void save(Out& out) const {
    out.set("reduce", std::string(kiln::name(spec_.op)));
    out.set("root", spec_.root);
    out.set("members", spec_.members);
    out.set("site", spec_.site);
    out.set("line", spec_.line);
  }
  /// Rebuilt only where the distributed component runs collectives, which tells the
  /// size of its group.
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    collective_kind kind = collective_kind::all_reduce;
    for (auto k : {collective_kind::all_reduce, collective_kind::all_gather, collective_kind::broadcast,
                   collective_kind::reduce_scatter, collective_kind::reduce})
      if (collective_op_name(k) == in.op()) kind = k;
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine(in.context(), in.op());
    collective_spec spec{kind, reduce_op::sum, in.integer("root", 0, INT32_MAX), {}, nullptr, in.unsigned_integer("site"),
                         std::uint32_t(in.integer("line", 0, INT32_MAX))};
    const std::string reduce = in.text("reduce");
    bool known = false;
    for (auto o : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min})
      if (kiln::name(o) == reduce) spec.op = o, known = true;
    if (!known) in.fail("unknown reduce op \"" + reduce + "\"");
    for (int m : in.integers("members", 0, INT32_MAX)) spec.members.push_back(m);
    std::vector<std::pair<dtype, shape>> given, made;
    for (int k = 0; k < in.input_count(); ++k) given.emplace_back(in.input(k).dtype(), in.input(k).shape());
    int size = 0;
    try {
      size = engine->group_size(spec.members);
    } catch (const error& e) {
      in.fail(e.what());
    }
    if (collective_failure f = check_collective(spec, given, size, &made)) in.fail(f.message);
    in.expect_results(made);
    return std::make_shared<collective_op>(std::move(spec));
  }
  static constexpr std::string_view onnx_refusal =
      "exchanges tensors with other processes (a collective); an ONNX model runs in one";

 private:
  collective_spec spec_;
};

}  // namespace kiln::detail

// kiln single header, generated from include/kiln/onnx.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_ONNX_HPP
#define KILN_SINGLE_INCLUDE_KILN_ONNX_HPP
// ----- begin kiln/onnx.hpp -----
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
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
// ----- begin kiln/io/special_ops.hpp -----
/// \file
/// The special ops that files and other runtimes know: the one list that kiln::save,
/// kiln::load, kiln::onnx and TensorBoard's graph look a special node up in. Each op says
/// itself how it is saved, rebuilt, lowered to ONNX or refused, and what TensorBoard
/// shows of it (the members kiln::special_op lists); a consumer finds the op's entry (by
/// the op's kind, or by the name its nodes take when it loads a file) and calls it, so no
/// consumer names an op. A new special op is its own file and one entry here; an op
/// missing here is refused by name ("cannot save yet", "has no ONNX operator").
/// An optional part's header: it includes the ops' headers that kiln/kiln.hpp does not.

#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
// ----- begin kiln/exec/collective_op.hpp -----
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
// ----- end kiln/exec/collective_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
// ----- begin kiln/exec/summary_op.hpp -----
/// \file
/// The special op of TensorBoard summaries (kiln/summary.hpp), and the hook through
/// which it reaches a writer. A summary node holds what it writes (its kind, tag,
/// description and the kind's parameter) and takes its value and step as inputs; when
/// it runs it looks up the default writer of the calling thread, so that a function
/// traced, or saved and loaded, without a writer writes to whichever writer is the
/// default at each call. The writers themselves (event files, protocol buffers, PNG)
/// live in kiln/io/summary/, above this layer: they fill the hook, so that this header
/// (which saved functions, ONNX export and training loops include to recognise or
/// write summaries) carries none of their code.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>


namespace kiln::detail {

/// What a summary shows in TensorBoard: a curve of scalars, a histogram, text or images.
enum class summary_kind : unsigned char { scalar, histogram, text, image };

/// The graph op of each kind, as a graph listing shows it.
inline std::string_view summary_op_name(summary_kind kind) {
  switch (kind) {
    case summary_kind::histogram: return "WriteHistogramSummary";
    case summary_kind::text: return "WriteTextSummary";
    case summary_kind::image: return "WriteImageSummary";
    default: return "WriteScalarSummary";
  }
}

/// What a summary writes besides its value and step.
struct summary_spec {
  summary_kind kind = summary_kind::scalar;
  std::string tag;          ///< the name TensorBoard shows
  std::string description;  ///< shown beside the plot (Markdown); may be empty
  int parameter = 0;        ///< histogram: the bucket count; image: max_outputs; otherwise 0
};

/// Why a summary cannot take a value or a step: nothing, or which rule it breaks.
struct summary_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks a summary's value (`value_type`, `value_shape`) and step against what its
/// kind takes. Partial shapes (None dims, unknown rank) pass when a value of some
/// fitting shape would: the node checks the concrete shapes again when it runs.
/// (Messages are made only on failure: a node runs this at every call. Like the other
/// functions here, a template on nothing, compiled only where a program uses it.)
template <class = void>
summary_failure check_summary_inputs(const summary_spec& s, dtype value_type, const shape& value_shape,
                                            dtype step_type, const shape& step_shape) {
  auto fail = [&](summary_failure::kind_t kind, const std::string& problem) {
    static constexpr std::string_view kinds[] = {"scalar", "histogram", "text", "image"};
    return summary_failure{kind, "kiln::summary::" + std::string(kinds[int(s.kind)]) + " '" + s.tag + "': " + problem};
  };
  auto value = [&] { return std::string(name(value_type)) + " " + value_shape.str(); };
  if (step_type != int32 && step_type != int64)
    return fail(summary_failure::wrong_dtype, "the step must be an int32 or int64 scalar, got " +
                                                  std::string(name(step_type)) + " " + step_shape.str());
  if (step_shape.has_known_rank() && step_shape.rank() != 0)
    return fail(summary_failure::wrong_shape, "the step must be a scalar, got shape " + step_shape.str());
  switch (s.kind) {
    case summary_kind::scalar:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the value must be numeric, got " + value());
      if (value_shape.has_known_rank() && value_shape.rank() != 0)
        return fail(summary_failure::wrong_shape, "the value must be a scalar, got shape " + value_shape.str());
      break;
    case summary_kind::histogram:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the values must be numeric, got " + value());
      break;
    case summary_kind::text:
      if (value_type != string)
        return fail(summary_failure::wrong_dtype, "the value must be a string tensor, got " + value());
      break;
    case summary_kind::image:
      if (value_type == string || value_type == bool_)
        return fail(summary_failure::wrong_dtype,
                    "the images must be float32 or float64 (in [0, 1]) or int32 or int64 (in [0, 255]), got " + value());
      if (value_shape.has_known_rank()) {
        if (value_shape.rank() != 4)
          return fail(summary_failure::wrong_shape,
                      "the images must be of rank 4 (count, height, width, channels), got shape " + value_shape.str());
        const std::int64_t channels = value_shape[3];
        if (channels != none && (channels < 1 || channels > 4))
          return fail(summary_failure::wrong_shape,
                      "the images must have 1 (gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA) channels, got shape " +
                          value_shape.str());
        if (value_shape[1] == 0 || value_shape[2] == 0)
          return fail(summary_failure::wrong_shape,
                      "an image must be at least 1 pixel high and wide, got shape " + value_shape.str());
      }
      break;
  }
  return {};
}

/// Raises the error of `f`: kiln::type_error for a dtype and kiln::value_error for a
/// shape (as TensorFlow's summaries raise, eagerly and while tracing), or
/// kiln::invalid_argument_error for a shape found wrong only when a graph runs.
template <class = void>
[[noreturn]] void throw_summary_failure(const summary_failure& f, bool running_graph) {
  if (running_graph) throw invalid_argument_error(f.message);
  if (f.kind == summary_failure::wrong_dtype) throw type_error(f.message);
  throw value_error(f.message);
}

/// Where summaries go: a writer, reached through a function pointer that the writer
/// sets (kiln/io/summary/writer.hpp), so that code below it writes without its code.
struct summary_target {
  /// Writes `value` as summary `spec` at `step`; returns whether it wrote. A value the
  /// writer cannot show (an integer pixel outside [0, 255], a NaN in a histogram)
  /// raises kiln::invalid_argument_error.
  bool (*write)(summary_target& self, const summary_spec& spec, const tensor& value, std::int64_t step) = nullptr;
  /// Writes a serialized GraphDef (TensorBoard's graph view).
  void (*write_graph)(summary_target& self, std::string_view graph_def) = nullptr;
  /// Hands what is queued to the file.
  void (*flush)(summary_target& self) = nullptr;
};

/// This thread's default writer (null when none): what kiln::summary::file_writer's
/// as_default() sets for its lifetime, as tf.summary's default writer is per thread.
inline summary_target*& default_summary_target() {
  thread_local summary_target* target = nullptr;
  return target;
}

/// How code below kiln/summary.hpp (a training loop given a log directory) opens a
/// writer on a directory: `summary_file_opener<>::open(logdir)`, a shared
/// summary_target. Declared here, defined by kiln/summary.hpp; such code names it as a
/// defaulted template argument and checks that it is complete where it is
/// instantiated, as concrete_function::save does with saved_function_io, so that a
/// program that never includes kiln/summary.hpp compiles none of the writer, and one
/// that asks for a log directory without it gets a compile error that says so:
/// \code
/// template <class Opener = kiln::detail::summary_file_opener<>>
/// std::shared_ptr<kiln::detail::summary_target> open_log(const std::filesystem::path& logdir) {
///   if constexpr (requires { Opener::open(logdir); })
///     return Opener::open(logdir);
///   else
///     static_assert(sizeof(Opener*) == 0, "a log directory needs #include <kiln/summary.hpp>");
/// }
/// \endcode
template <class = void>
struct summary_file_opener;

/// The hook for training loops (kiln::fit): writes each (tag, value) pair as a scalar
/// summary at `step` to `target` (a writer, from summary_file_opener or the thread's
/// default one when null); returns false when there is no writer. Tags are as tf.keras' TensorBoard callback
/// names them (`epoch_loss`, `epoch_accuracy`) by the caller's choice.
/// \code
/// const std::pair<std::string, double> logs[] = {{"epoch_loss", 0.25}, {"epoch_accuracy", 0.9}};
/// kiln::detail::write_scalar_summaries(logs, 3);  // false: no default writer here
/// \endcode
template <class = void>
bool write_scalar_summaries(std::span<const std::pair<std::string, double>> values, std::int64_t step,
                            summary_target* target = nullptr) {
  if (!target) target = default_summary_target();
  if (!target) return false;
  for (const auto& [tag, v] : values) {
    tensor t(float64, shape{});
    *static_cast<double*>(t.raw_data()) = v;
    target->write(*target, summary_spec{summary_kind::scalar, tag, {}, 0}, t, step);
  }
  return true;
}

/// The step of a summary as an integer: an int32 or int64 scalar (checked before).
template <class = void>
std::int64_t summary_step(const tensor& step) {
  if (step.device() != device::cpu) return summary_step(step.to(device::cpu));
  return step.dtype() == int32 ? std::int64_t(*static_cast<const std::int32_t*>(step.raw_data()))
                               : *static_cast<const std::int64_t*>(step.raw_data());
}

/// Writes a summary to the default writer at every run: its inputs are the value and
/// the step, its one result a bool scalar, true when it wrote (false without a writer).
class summary_op final : public special_op {
 public:
  template <class = void>
  explicit summary_op(summary_spec spec) : special_op(std::type_identity<summary_op>()), spec_(std::move(spec)) {
    for (int k = 0; k < 2; ++k) {
      written_[k] = tensor(bool_, shape{});
      *static_cast<bool*>(written_[k].raw_data()) = k == 1;
    }
  }
  std::string_view name() const { return summary_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  tensor run(std::span<const tensor* const> in) const {
    summary_target* target = default_summary_target();
    if (!target) return written_[0];
    const tensor& value = *in[0];
    const tensor& step = *in[1];
    if (summary_failure f = check_summary_inputs(spec_, value.dtype(), value.shape(), step.dtype(), step.shape()))
      throw_summary_failure(f, true);  // (only a shape the trace left partial can fail here)
    return written_[target->write(*target, spec_, value, summary_step(step)) ? 1 : 0];
  }
  const summary_spec& spec() const { return spec_; }

  static std::array<std::string_view, 4> op_names() {
    return {summary_op_name(summary_kind::scalar), summary_op_name(summary_kind::histogram),
            summary_op_name(summary_kind::text), summary_op_name(summary_kind::image)};
  }
  /// Saved as what it writes besides its inputs; the kind is in the op's name, the
  /// writer is the loading program's default one.
  template <class Out>
  void save(Out& out) const {
    out.set("tag", spec_.tag);
    out.set("description", spec_.description);
    out.set("parameter", spec_.parameter);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    summary_kind kind = summary_kind::scalar;
    for (auto k : {summary_kind::scalar, summary_kind::histogram, summary_kind::text, summary_kind::image})
      if (summary_op_name(k) == in.op()) kind = k;
    summary_spec spec{kind, in.text("tag"), in.text("description"), in.integer("parameter", 0, INT32_MAX)};
    if (in.input_count() != 2) in.fail(in.op() + " takes two inputs, a value and a step");
    const node &value = in.input(0), &step = in.input(1);
    if (summary_failure f = check_summary_inputs(spec, value.dtype(), value.shape(), step.dtype(), step.shape()))
      in.fail(f.message);
    in.expect_results({{bool_, shape{}}});
    return std::make_shared<summary_op>(std::move(spec));
  }
  /// What TensorBoard's graph shows of it: its tag.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("tag", spec_.tag);
  }
  static constexpr std::string_view onnx_refusal = "writes a TensorBoard summary; an ONNX model writes no files";

 private:
  summary_spec spec_;
  tensor written_[2];  // false, true: results shared by every run, allocated once
};

}  // namespace kiln::detail
// ----- end kiln/exec/summary_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#include "kiln/kiln.hpp"

namespace kiln::detail {

/// Every special op that a saved function, an ONNX model or TensorBoard's graph may meet.
using known_special_ops =
    boost::mp11::mp_list<read_variable_op, assign_variable_op, print_op, host_callback_op, cond_op, while_op,
                         random_uniform_op, summary_op, collective_op, reduce_dataset_op, iterator_get_next_op,
                         typed::described_op>;

/// A consumer's entry for one op of known_special_ops, and how to tell that op.
template <class Entry>
struct known_special_op {
  bool (*is)(const special_op& op);  ///< whether `op` is this kind of op
  Entry entry;
};

/// A consumer's entries: `Entry::template of<Op>()` for each op of known_special_ops, in
/// its order. Made on first use.
template <class Entry>
const std::vector<known_special_op<Entry>>& special_op_entries() {
  static const std::vector<known_special_op<Entry>> entries = [] {
    std::vector<known_special_op<Entry>> e;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          e.push_back({[](const special_op& op) { return op.as<Op>() != nullptr; }, Entry::template of<Op>()});
        });
    return e;
  }();
  return entries;
}

/// The entry of `op`'s kind, or null for a kind that known_special_ops does not list.
/// By kind rather than by name: a typed trace's graph describes its steps with the
/// runtime tier's names (typed::described_op).
template <class Entry>
const Entry* special_op_entry(const special_op& op) {
  for (const known_special_op<Entry>& k : special_op_entries<Entry>())
    if (k.is(op)) return &k.entry;
  return nullptr;
}

/// The entry of the op whose nodes take the name `name` (`Op::op_names()`), as a file
/// names it, or null for a name that no op of known_special_ops takes.
template <class Entry>
const Entry* special_op_entry(std::string_view name) {
  static const std::unordered_map<std::string_view, const Entry*> by_name = [] {
    std::unordered_map<std::string_view, const Entry*> t;
    std::size_t k = 0;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          for (std::string_view n : Op::op_names()) t.emplace(n, &special_op_entries<Entry>()[k].entry);
          ++k;
        });
    return t;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

}  // namespace kiln::detail
// ----- end kiln/io/special_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP

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
// ----- end kiln/onnx.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_ONNX_HPP

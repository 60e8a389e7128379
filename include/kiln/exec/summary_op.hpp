#pragma once
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

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/graph/graph.hpp"

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

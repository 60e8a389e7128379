#pragma once
/// \file
/// TensorBoard summaries, as tf.summary: scalars, histograms, text and images written
/// to event files that TensorBoard reads, from eager code and from inside a
/// kiln::function, where a summary is an effect that writes at every call, in program
/// order with prints and variable writes.
///
/// \code
/// auto writer = kiln::summary::create_file_writer("logs/run1");
/// auto scope = writer.as_default();                 // the default writer until scope ends
/// kiln::variable w(kiln::ones({3}), "w");
/// kiln::function step([&](const kiln::tensor& x) {
///   kiln::tensor loss = kiln::reduce_sum(kiln::square(w * x));
///   kiln::summary::scalar("loss", loss, 7);          // at every call
///   kiln::summary::histogram("w", w, 7);
///   return loss;
/// });
/// step(kiln::constant({1.f, 2.f, 3.f}));
/// kiln::summary::text("note", "hello", 0);         // eagerly: written at once
/// \endcode
/// then `tensorboard --logdir logs`.
///
/// An optional part of kiln, outside kiln/kiln.hpp (it needs nothing beyond kiln's own
/// dependencies: the protocol buffers, the TFRecord framing and its CRC32C, and the PNG
/// encoder are kiln/io/summary/'s). Differences from TensorFlow: the default
/// writer is looked up when a summary node runs rather than when it is traced, so a
/// function traced without a writer writes when called under one, and a function saved
/// with summaries and loaded by another program writes to that program's default
/// writer; a summary returns a bool tensor (true when it wrote); integer images hold
/// values in [0, 255] (kiln has no uint8); a flush does not wait for the disk (fsync).
/// docs/design_notes.md, "TensorBoard summaries", has the rest.

#include <chrono>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/exec/summary_op.hpp"
#include "kiln/io/summary/events.hpp"
#include "kiln/io/summary/graph_def.hpp"
#include "kiln/io/summary/writer.hpp"

namespace kiln::summary {

/// A summary's step: a C++ integer, an int32 or int64 scalar tensor (which may be
/// symbolic inside a function), or a kiln::variable holding one, such as an optimizer's
/// `iterations()` (read when the summary runs).
/// \code
/// kiln::optimizers::sgd opt({.learning_rate = 0.1});
/// kiln::summary::step_value a = 3, b = kiln::constant(std::int64_t(4)), c = opt.iterations();
/// \endcode
class step_value {
 public:
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  step_value(I step) : value_(kiln::constant(static_cast<std::int64_t>(step))) {}
  step_value(const tensor& step) : value_(step) {}
  step_value(const variable& step) : value_(step.read_value()) {}
  const tensor& get() const { return value_; }

 private:
  tensor value_;
};

/// Options of kiln::summary::histogram, as tf.summary.histogram's arguments.
struct histogram_options {
  int buckets = 30;         ///< equal-width buckets between the least and greatest value (0: none)
  std::string description{};  ///< shown beside the plot (Markdown)
};

/// Options of kiln::summary::image, as tf.summary.image's arguments.
struct image_options {
  int max_outputs = 3;      ///< at most this many of the batch's images are written
  std::string description{};  ///< shown beside the images (Markdown)
};

namespace detail {
/// How the summary functions write (`summary_writes`, the one specialization): a
/// template on nothing, compiled only where a program writes summaries.
template <class Unused>
struct basic_summary_writes {
  // Records a summary node while tracing, or writes at once.
  static tensor write(kiln::detail::summary_spec spec, const tensor& value, const step_value& step);
};
using summary_writes = basic_summary_writes<void>;

template <class Unused>
tensor basic_summary_writes<Unused>::write(kiln::detail::summary_spec spec, const tensor& value,
                                           const step_value& step) {
  const tensor& s = step.get();
  if (!value.defined() || !s.defined())
    throw invalid_argument_error("kiln::summary: '" + spec.tag + "' was given an empty tensor as its " +
                                 (value.defined() ? "step" : "value"));
  if (kiln::detail::summary_failure f = kiln::detail::check_summary_inputs(spec, value.dtype(), value.shape(), s.dtype(), s.shape()))
    kiln::detail::throw_summary_failure(f, false);
  if (kiln::detail::trace_context* trace = kiln::detail::trace_context::current()) {
    const tensor inputs[] = {value, s};
    return trace->record_special(std::make_shared<kiln::detail::summary_op>(std::move(spec)), inputs,
                                 {{bool_, shape{}}})[0];
  }
  value.require_value("kiln::summary");
  s.require_value("kiln::summary");
  kiln::detail::summary_target* target = kiln::detail::default_summary_target();
  const bool written = target && target->write(*target, spec, value, kiln::detail::summary_step(s));
  return kiln::constant(written);
}
}  // namespace detail

/// Writes a scalar (any numeric dtype, written as float32) to the default writer, as
/// tf.summary.scalar; TensorBoard plots the values of one `name` against their steps.
/// Returns a bool scalar: true when written, false when there is no default writer.
/// A value or step of the wrong dtype raises kiln::type_error, of the wrong shape
/// kiln::value_error.
/// \code
/// kiln::summary::scalar("loss", 0.25, 10);
/// kiln::summary::scalar("accuracy", kiln::constant(0.5f), kiln::constant(10));
/// \endcode
template <class Unused = void>
tensor scalar(std::string_view name, const tensor& value, const step_value& step, std::string_view description = {}) {
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::scalar, std::string(name), std::string(description), 0}, value, step);
}
template <class T>
  requires std::is_arithmetic_v<T>
tensor scalar(std::string_view name, T value, const step_value& step, std::string_view description = {}) {
  return scalar(name, kiln::constant(value), step, description);
}

/// Writes the histogram of a tensor's values (any shape, any numeric dtype), as
/// tf.summary.histogram: `buckets` rows of (left edge, right edge, count), computed
/// as TensorBoard computes them, shown by its Histograms and Distributions dashboards.
/// A NaN or infinity among the values raises kiln::invalid_argument_error when written.
/// \code kiln::summary::histogram("weights", kiln::random::uniform({100}, -1, 1), 0, {.buckets = 10}); \endcode
template <class Unused = void>
tensor histogram(std::string_view name, const tensor& values, const step_value& step, histogram_options options = {}) {
  if (options.buckets < 0)
    throw value_error("kiln::summary::histogram '" + std::string(name) + "': buckets must be >= 0, got " +
                      std::to_string(options.buckets));
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::histogram, std::string(name), std::move(options.description), options.buckets},
      values, step);
}

/// Writes a string tensor as text, as tf.summary.text: a scalar is one paragraph
/// (Markdown), a vector or matrix a table.
/// \code kiln::summary::text("config", "learning rate: 0.01", 0); \endcode
template <class Unused = void>
tensor text(std::string_view name, const tensor& value, const step_value& step, std::string_view description = {}) {
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::text, std::string(name), std::string(description), 0}, value, step);
}
template <class = void>
tensor text(std::string_view name, std::string_view value, const step_value& step, std::string_view description = {}) {
  return text(name, kiln::constant(std::string(value)), step, description);
}

/// Writes images, as tf.summary.image: a rank-4 tensor (count, height, width,
/// channels; 1 channel: gray, 2: gray and alpha, 3: RGB, 4: RGBA), float32 or float64
/// in [0, 1] (scaled and clamped as tf.image.convert_image_dtype does) or int32 or
/// int64 in [0, 255] (kiln has no uint8; another value raises
/// kiln::invalid_argument_error when written); the first `max_outputs` images are
/// written as PNGs.
/// \code kiln::summary::image("samples", kiln::zeros({2, 28, 28, 1}), 0, {.max_outputs = 2}); \endcode
template <class Unused = void>
tensor image(std::string_view name, const tensor& images, const step_value& step, image_options options = {}) {
  if (options.max_outputs < 0)
    throw value_error("kiln::summary::image '" + std::string(name) + "': max_outputs must be >= 0, got " +
                      std::to_string(options.max_outputs));
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::image, std::string(name), std::move(options.description), options.max_outputs},
      images, step);
}

/// Writes a graph to the default writer, for TensorBoard's graph view: its nodes,
/// ops, attributes and shapes, the branches and bodies of `cond` and `while` nodes
/// as functions of its library (kiln/io/summary/graph_def.hpp), as tf.summary.graph
/// and tf.summary.trace_export show a tf.function's graph. Returns false when there
/// is no default writer.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2 + 1; });
/// kiln::summary::graph(f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)));
/// \endcode
template <class Unused = void>
bool graph(const kiln::graph& g) {
  kiln::detail::summary_target* target = kiln::detail::default_summary_target();
  if (!target) return false;
  target->write_graph(*target, kiln::detail::basic_graph_def_writer<Unused>::graph_def_of(g));
  return true;
}
/// The graph of a concrete function (of either tier).
template <class Function>
  requires requires(const Function& f) { f.graph(); }
bool graph(const Function& f) {
  return graph(kiln::graph(f.graph()));
}

class file_writer;
template <class = void>
file_writer create_file_writer(const std::filesystem::path& logdir, writer_options options = {});

/// While it lives, its writer is the default writer of the thread that made it (as
/// `with writer.as_default():`); then the one before is again, and the writer is
/// flushed. It cannot be copied or moved, so scopes end in the reverse order of their
/// start, on their thread.
class default_writer_scope {
 public:
  default_writer_scope(const default_writer_scope&) = delete;
  default_writer_scope& operator=(const default_writer_scope&) = delete;
  ~default_writer_scope() {
    kiln::detail::default_summary_target() = previous_;
    try {
      writer_->flush_file();
    } catch (...) {  // (a destructor does not throw; flush() reports a failed write)
    }
  }

 private:
  friend class file_writer;
template <class = void>
file_writer create_file_writer(const std::filesystem::path& logdir, writer_options options = {});
  explicit default_writer_scope(std::shared_ptr<kiln::detail::event_file_writer> w)
      : writer_(std::move(w)), previous_(kiln::detail::default_summary_target()) {
    kiln::detail::default_summary_target() = writer_.get();
  }
  std::shared_ptr<kiln::detail::event_file_writer> writer_;
  kiln::detail::summary_target* previous_;
};

/// A writer of one event file in a log directory (tf.summary.SummaryWriter). Copies
/// share the file; the last one to go flushes and closes it.
/// \code
/// kiln::summary::file_writer writer = kiln::summary::create_file_writer("logs");
/// {
///   auto scope = writer.as_default();
///   kiln::summary::scalar("x", 1, 0);
/// }
/// writer.flush();
/// \endcode
class file_writer {
 public:
  /// Makes this the default writer of this thread until the returned scope ends.
  [[nodiscard]] default_writer_scope as_default() const { return default_writer_scope(state_); }
  /// Writes the queued events to the file.
  void flush() const { state_->flush_file(); }
  /// The log directory, and the event file in it.
  const std::filesystem::path& logdir() const { return state_->logdir(); }
  const std::filesystem::path& path() const { return state_->path(); }

 private:
  template <class>
  friend file_writer create_file_writer(const std::filesystem::path&, writer_options);
  explicit file_writer(std::shared_ptr<kiln::detail::event_file_writer> s) : state_(std::move(s)) {}
  std::shared_ptr<kiln::detail::event_file_writer> state_;
};

/// A writer of a new event file in `logdir` (created if missing), as
/// tf.summary.create_file_writer; a directory or file that cannot be created raises
/// kiln::invalid_argument_error.
/// \code auto writer = kiln::summary::create_file_writer("logs/train"); \endcode
template <class>
file_writer create_file_writer(const std::filesystem::path& logdir, writer_options options) {
  return file_writer(std::make_shared<kiln::detail::event_file_writer>(logdir, std::move(options)));
}

/// Writes the default writer's queued events to its file (tf.summary.flush); false
/// when there is no default writer.
/// \code kiln::summary::flush(); \endcode
template <class = void>
bool flush() {
  kiln::detail::summary_target* target = kiln::detail::default_summary_target();
  if (target) target->flush(*target);
  return target != nullptr;
}

}  // namespace kiln::summary

namespace kiln::detail {
/// How code below this header (a training loop given a log directory) opens a writer
/// (declared in kiln/exec/summary_op.hpp).
template <class T>
struct summary_file_opener {
  static std::shared_ptr<summary_target> open(const std::filesystem::path& logdir) {
    return std::make_shared<event_file_writer>(logdir, summary::writer_options{});
  }
  /// kiln::fit's log: the values of `logs` named with `prefix` (none, or "val_") as
  /// `epoch_<name>` scalars at the epoch's index, Keras' TensorBoard callback's tags.
  template <class Logs>
  static void write_epoch_logs(summary_target& target, const Logs& logs, std::string_view prefix) {
    std::vector<std::pair<std::string, double>> values;
    for (const auto& [name, v] : logs.values)
      if (name.starts_with("val_") == !prefix.empty()) values.emplace_back("epoch_" + name.substr(prefix.size()), v);
    write_scalar_summaries(values, logs.epoch, &target);
  }
};
}  // namespace kiln::detail

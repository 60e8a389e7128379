#pragma once
/// \file
/// `kiln::fit`, Keras' `model.fit`: epochs over a dataset of (x, y) batches, each
/// batch through one traced train step (the forward pass, the loss, its gradients and
/// the optimizer's update in one kiln::function), the validation data through one
/// traced test step, Keras-style progress lines, callbacks that log or stop training,
/// and the history of the losses and metrics.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

#include "kiln/autodiff/tape.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/models/layers.hpp"
#include "kiln/train/replicas.hpp"
#include "kiln/trace/function.hpp"

namespace kiln {

/// A metric as fit keeps it: any metric of kiln::metrics taking `(y_true, y_pred)`
/// (copies share the metric's state, so the caller's object sees the updates).
/// \code kiln::metric m = kiln::metrics::sparse_categorical_accuracy(); \endcode
class metric {
 public:
  template <class M>
    requires requires(M& m, const tensor& t) {
      m.update_state(t, t);
      m.result();
      m.reset_state();
      m.name();
    }
  metric(M m) : self_(std::make_shared<model<M>>(std::move(m))) {}
  KILN_LIBRARY_INLINE void update_state(const tensor& y_true, const tensor& y_pred) const;
  tensor result() const { return self_->result(); }
  KILN_LIBRARY_INLINE void reset_state() const;
  std::string name() const { return self_->name(); }

 private:
  struct concept_ {
    virtual ~concept_() = default;
    virtual void update_state(const tensor&, const tensor&) = 0;
    virtual tensor result() = 0;
    virtual void reset_state() = 0;
    virtual std::string name() const = 0;
  };
  template <class M>
  struct model final : concept_ {
    M m;
    explicit model(M x) : m(std::move(x)) {}
    void update_state(const tensor& t, const tensor& p) override { m.update_state(t, p); }
    tensor result() override { return m.result(); }
    void reset_state() override { m.reset_state(); }
    std::string name() const override { return std::string(m.name()); }
  };
  std::shared_ptr<concept_> self_;
};

/// What a callback sees at the end of an epoch: its index (from 0) and the values
/// of the epoch (`loss`, the metrics, and `val_` ones with validation data).
struct epoch_logs {
  int epoch = 0;
  std::map<std::string, double> values;
  KILN_LIBRARY_INLINE double loss() const;
};

/// Called at the end of every epoch; returning false stops training (Keras'
/// `model.stop_training = True`).
using epoch_callback = std::function<bool(const epoch_logs&)>;

/// Options of kiln::fit, Keras' names.
struct fit_options {
  int epochs = 1;
  /// Batches of (x, y) to evaluate after each epoch.
  std::optional<data::dataset> validation_data = std::nullopt;
  /// 0: silent; 1: a progress bar on a terminal (a line per epoch otherwise); 2: a
  /// line per epoch.
  int verbose = 1;
  std::vector<metric> metrics{};
  std::vector<epoch_callback> callbacks{};
  /// Where the progress goes.
  std::ostream* stream = nullptr;
  /// Whether progress lines show times (off for output compared byte for byte).
  bool timing = true;
  /// Keras' TensorBoard callback: when set, each epoch's loss and metrics are written as
  /// scalar summaries (`epoch_loss`, `epoch_<metric>`, at the epoch's index) to
  /// `log_dir/train`, and the validation ones to `log_dir/validation`, for
  /// `tensorboard --logdir <log_dir>`. Needs `#include <kiln/summary.hpp>`; without it,
  /// fit raises kiln::unavailable_error.
  std::optional<std::filesystem::path> log_dir = std::nullopt;
};

/// What fit returns: per epoch, the training loss (the batch losses' mean, weighted
/// by batch size, as Keras averages them) and every other value of epoch_logs.
struct history {
  std::vector<double> loss;
  std::vector<double> val_loss;
  /// Every value by name, per epoch: "loss", "val_loss", the metrics' names and "val_" ones.
  std::map<std::string, std::vector<double>> values;
  KILN_LIBRARY_INLINE int epochs() const;
};

namespace detail {

/// `model(x, {.training})` for a layer, `model(x)` for a callable that takes no options.
template <class Model>
tensor call_model(Model& model, const tensor& x, bool training) {
  if constexpr (std::is_invocable_r_v<tensor, Model&, const tensor&, layers::call_options>)
    return model(x, layers::call_options{.training = training});
  else if constexpr (std::is_invocable_r_v<tensor, Model&, const tensor&, bool>)
    return model(x, training);
  else
    return model(x);
}

/// Whether progress may redraw one line (the stream is a terminal's stdout).
KILN_LIBRARY_INLINE bool stdout_is_terminal(const std::ostream& os);

/// Keras' number format in progress lines: 4 decimals, or scientific below 1e-3.
KILN_LIBRARY_INLINE std::string progress_value(double v);

/// Keras' duration format: "12s", "85ms", "640us".
KILN_LIBRARY_INLINE std::string progress_time(double seconds);

/// A float scalar's value as a double.
KILN_LIBRARY_INLINE double scalar_value(const tensor& t);

// Defined by kiln/summary.hpp (declared in kiln/exec/summary_op.hpp, outside kiln.hpp).
template <class>
struct summary_file_opener;

/// What fit does with a log_dir: a function that writes an epoch's values, as Keras'
/// TensorBoard callback does (kiln/summary.hpp's writers on `log_dir/train` and, when
/// asked, `log_dir/validation`). Through summary_file_opener, so that a program without
/// kiln/summary.hpp compiles none of the writer.
template <class Opener = summary_file_opener<void>>
std::function<void(const epoch_logs&)> fit_logger(const std::filesystem::path& log_dir, bool validation) {
  if constexpr (requires { Opener::open(log_dir); }) {
    auto train = Opener::open(log_dir / "train");
    auto val = validation ? Opener::open(log_dir / "validation") : nullptr;
    return [train, val](const epoch_logs& logs) {
      Opener::write_epoch_logs(*train, logs, "");
      if (val) Opener::write_epoch_logs(*val, logs, "val_");
    };
  } else {
    throw unavailable_error("fit: writing to log_dir " + log_dir.string() +
                            " needs TensorBoard summaries: #include <kiln/summary.hpp>");
  }
}

/// A running mean weighted by batch size.
struct weighted_mean {
  double total = 0, count = 0;
  KILN_LIBRARY_INLINE void add(double v, double n);
  KILN_LIBRARY_INLINE double value() const;
};

}  // namespace detail

/// Trains `model` on `dataset` (batches of (x, y)) for `options.epochs` epochs: each
/// batch runs one traced train step, `loss_fn(y, model(x, {.training = true}))`
/// differentiated with respect to `model.trainable_variables()` and applied by
/// `optimizer`; the validation data runs one traced test step. The model is built by
/// the first trace, its layers keep their variables. Returns the history.
/// \code
/// kiln::layers::sequential model({kiln::layers::dense(8, {.activation = kiln::relu}), kiln::layers::dense(1)});
/// kiln::optimizers::adam opt({.learning_rate = 0.01});
/// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::ones({64, 2}), kiln::zeros({64, 1})}).batch(16);
/// kiln::history h = kiln::fit(model, kiln::losses::mean_squared_error<>, opt, ds, {.epochs = 2, .verbose = 0});
/// \endcode
template <class Model, class Loss, class Optimizer>
history fit(Model& model, Loss loss_fn, Optimizer& optimizer, const data::dataset& dataset, fit_options options = {}) {
  using clock = std::chrono::steady_clock;
  std::ostream& out = options.stream ? *options.stream : std::cout;
  if (dataset.element_spec().size() != 2)
    throw invalid_argument_error("fit: the dataset's elements must be (x, y) pairs, got " +
                                 std::to_string(dataset.element_spec().size()) + " components");
  if (options.epochs < 0) throw invalid_argument_error("fit: epochs must not be negative");
  std::vector<metric> metrics = options.metrics;
  // Under a data-parallel strategy's scope (kiln/train/replicas.hpp): every rank starts
  // from the root's weights, which needs the model built before the first step traces;
  // gradients are averaged over the ranks; reports are the ranks' means; rank 0 logs.
  const detail::replica_context* replicas = detail::current_replica_context();
  if (replicas) {
    for (const auto& batch : dataset) {
      detail::call_model(model, batch[0], false);
      break;
    }
    if constexpr (requires { model.variables(); })
      replicas->broadcast_variables(replicas->self, model.variables());
    else
      replicas->broadcast_variables(replicas->self, model.trainable_variables());
  }

  kiln::function train_step([&](const tensor& x, const tensor& y) {
    gradient_tape tape;
    const tensor prediction = detail::call_model(model, x, true);
    const tensor loss = loss_fn(y, prediction);
    const std::vector<variable> vars = model.trainable_variables();
    std::vector<tensor> grads = tape.gradient(loss, vars);
    if (replicas) grads = replicas->average_gradients(replicas->self, grads);
    optimizer.apply_gradients(grads, vars);
    for (const metric& m : metrics) m.update_state(y, prediction);
    return loss;
  });
  kiln::function test_step([&](const tensor& x, const tensor& y) {
    const tensor prediction = detail::call_model(model, x, false);
    for (const metric& m : metrics) m.update_state(y, prediction);
    return loss_fn(y, prediction);
  });

  const std::function<void(const epoch_logs&)> log =
      options.log_dir && (!replicas || replicas->writes_files())
          ? detail::fit_logger(*options.log_dir, options.validation_data.has_value())
          : nullptr;

  const bool bar = options.verbose == 1 && detail::stdout_is_terminal(out);
  history h;
  std::optional<std::int64_t> steps_per_epoch;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    if (options.verbose) out << "Epoch " << epoch + 1 << "/" << options.epochs << "\n" << std::flush;
    for (const metric& m : metrics) m.reset_state();
    detail::weighted_mean loss;
    std::int64_t steps = 0;
    const auto start = clock::now();
    epoch_logs logs{epoch, {}};
    for (const auto& batch : dataset) {
      const tensor& x = batch[0];
      const tensor& y = batch[1];
      const double n = x.rank() > 0 ? double(x.shape()[0]) : 1.0;
      loss.add(detail::scalar_value(train_step(x, y)), n);
      ++steps;
      if (bar) {
        const std::string total = steps_per_epoch ? std::to_string(*steps_per_epoch) : "Unknown";
        std::string line = std::to_string(steps) + "/" + total;
        if (steps_per_epoch) {
          const int done = int(30 * steps / std::max<std::int64_t>(*steps_per_epoch, 1));
          line += " [" + std::string(std::size_t(std::max(done - 1, 0)), '=') + (done >= 30 ? "=" : ">") +
                  std::string(std::size_t(30 - std::max(done, 1)), '.') + "]";
        }
        // "\033[K" clears what a longer line drawn before left on the right.
        out << "\r" << line << " - loss: " << detail::progress_value(loss.value()) << "\033[K" << std::flush;
      }
    }
    steps_per_epoch = steps;
    const double seconds = std::chrono::duration<double>(clock::now() - start).count();
    logs.values["loss"] = loss.value();
    for (const metric& m : metrics) logs.values[m.name()] = detail::scalar_value(m.result());
    if (options.validation_data) {
      for (const metric& m : metrics) m.reset_state();
      detail::weighted_mean val;
      for (const auto& batch : *options.validation_data) {
        const double n = batch[0].rank() > 0 ? double(batch[0].shape()[0]) : 1.0;
        val.add(detail::scalar_value(test_step(batch[0], batch[1])), n);
      }
      logs.values["val_loss"] = val.value();
      for (const metric& m : metrics) logs.values["val_" + m.name()] = detail::scalar_value(m.result());
    }
    if (replicas) {
      std::vector<double> values;
      for (const auto& [name, v] : logs.values) values.push_back(v);
      replicas->mean(replicas->self, values);
      std::size_t k = 0;
      for (auto& [name, v] : logs.values) v = values[k++];
    }

    std::string line = std::to_string(steps) + "/" + std::to_string(steps);
    if (bar) line += " [" + std::string(30, '=') + "]";
    if (options.timing)
      line += bar ? " - " + detail::progress_time(seconds) + " " + detail::progress_time(seconds / double(std::max<std::int64_t>(steps, 1))) + "/step"
                  : " - " + detail::progress_time(seconds);
    const auto value_text = [&](const std::string& name) { return " - " + name + ": " + detail::progress_value(logs.values.at(name)); };
    line += value_text("loss");
    for (const metric& m : metrics) line += value_text(m.name());
    if (options.validation_data) {
      line += value_text("val_loss");
      for (const metric& m : metrics) line += value_text("val_" + m.name());
    }
    if (options.timing && !bar)
      line += " - " + detail::progress_time(seconds / double(std::max<std::int64_t>(steps, 1))) + "/step";
    if (options.verbose) out << (bar ? "\r" : "") << line << (bar ? "\033[K\n" : "\n") << std::flush;

    h.loss.push_back(logs.values["loss"]);
    if (options.validation_data) h.val_loss.push_back(logs.values["val_loss"]);
    for (const auto& [name, v] : logs.values) h.values[name].push_back(v);
    if (log) log(logs);
    bool go_on = true;
    for (const epoch_callback& c : options.callbacks) go_on = c(logs) && go_on;
    if (!go_on) break;
  }
  return h;
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE void metric::update_state(const tensor& y_true, const tensor& y_pred) const {
  self_->update_state(y_true, y_pred);
}

KILN_LIBRARY_INLINE void metric::reset_state() const { self_->reset_state(); }

KILN_LIBRARY_INLINE double epoch_logs::loss() const { return values.at("loss"); }

KILN_LIBRARY_INLINE int history::epochs() const { return int(loss.size()); }

}  // namespace kiln

namespace kiln::detail {

KILN_LIBRARY_INLINE bool stdout_is_terminal(const std::ostream& os) {
#if __has_include(<unistd.h>)
  return &os == &std::cout && ::isatty(1) == 1;
#else
  (void)os;
  return false;
#endif
}

KILN_LIBRARY_INLINE std::string progress_value(double v) {
  std::ostringstream s;
  if (v != 0 && std::abs(v) < 1e-3)
    s << std::scientific << std::setprecision(4) << v;
  else
    s << std::fixed << std::setprecision(4) << v;
  return s.str();
}

KILN_LIBRARY_INLINE std::string progress_time(double seconds) {
  if (seconds >= 1) return std::to_string(std::int64_t(std::llround(seconds))) + "s";
  if (seconds >= 1e-3) return std::to_string(std::int64_t(std::llround(seconds * 1e3))) + "ms";
  return std::to_string(std::int64_t(std::llround(seconds * 1e6))) + "us";
}

KILN_LIBRARY_INLINE double scalar_value(const tensor& t) {
  return t.dtype() == float64 ? t.item<double>() : double(t.item<float>());
}

KILN_LIBRARY_INLINE void weighted_mean::add(double v, double n) { total += v * n, count += n; }

KILN_LIBRARY_INLINE double weighted_mean::value() const { return count ? total / count : 0.0; }

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

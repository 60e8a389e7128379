#pragma once
/// \file
/// Keras' metrics (`tf.keras.metrics`): stateful averages whose state is two
/// variables (a total and a count), so that `update_state` inside a kiln::function
/// adds to them at every call, as in a Keras train step. The variables are made when
/// the metric is, outside any trace, so a metric may be updated by any number of
/// functions; copies of a metric share its state. (Constructors are templates on
/// nothing, as op functions are: making variables compiles the code that writes them,
/// which only programs that make a metric should pay for.)

#include <string>
#include <utility>
#include <vector>

#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/trace/effects.hpp"

namespace kiln::metrics {

/// The (weighted) mean of every value given to `update_state` since the last
/// `reset_state`, as Keras' `Mean`; `result()` is 0 before any update.
/// \code
/// kiln::metrics::mean m;
/// m.update_state(kiln::constant({1.f, 3.f}));
/// m.result();  // 2
/// \endcode
class mean {
 public:
  template <class = void>
  explicit mean(std::string name = "mean")
      : name_(std::move(name)),
        total_(kiln::zeros({}, float32), name_ + "/total"),
        count_(kiln::zeros({}, float32), name_ + "/count") {}

  /// Adds `values` (any shape, any numeric dtype) to the average.
  template <class = void>
  void update_state(const tensor& values) {
    const tensor v = values.dtype() == float32 ? values : cast(values, float32);
    total_.assign_add(reduce_sum(v));
    // A partial shape's count is known when the graph runs: the sum of ones of v's shape.
    const tensor count = v.shape().is_fully_defined() ? kiln::constant(float(v.shape().num_elements()))
                                                       : reduce_sum(where(v == v, kiln::constant(1.f), 1.f));
    count_.assign_add(count);
  }
  /// The average so far (0 when nothing was added, as Keras' divide_no_nan).
  template <class = void>
  tensor result() const {
    const tensor count = count_.read_value();
    return where(count > 0.f, total_.read_value() / maximum(count, 1.f), 0.f);
  }
  /// Starts over.
  template <class = void>
  void reset_state() {
    total_.assign(0.f);
    count_.assign(0.f);
  }
  const std::string& name() const { return name_; }
  /// The state: the total, then the count.
  KILN_LIBRARY_INLINE std::vector<variable> variables() const;

 private:
  std::string name_;
  variable total_, count_;
};

/// The fraction of predictions on the right side of `threshold` (0.5) for 0/1
/// targets, as Keras' `BinaryAccuracy`: each sample's mean over the last axis, averaged.
/// \code
/// kiln::metrics::binary_accuracy acc;
/// acc.update_state(kiln::constant({{1.f}, {0.f}}), kiln::constant({{0.9f}, {0.7f}}));  // 0.5
/// \endcode
class binary_accuracy {
 public:
  template <class = void>
  explicit binary_accuracy(double threshold = 0.5, std::string name = "binary_accuracy")
      : threshold_(threshold), mean_(std::move(name)) {}
  template <class = void>
  void update_state(const tensor& y_true, const tensor& y_pred) {
    const tensor predicted = cast(y_pred > threshold_, y_pred.dtype());
    const tensor truth = y_true.dtype() == y_pred.dtype() ? y_true : cast(y_true, y_pred.dtype());
    mean_.update_state(reduce_mean(cast(equal(truth, predicted), float32), -1));
  }
  template <class = void>
  tensor result() const { return mean_.result(); }
  template <class = void>
  void reset_state() { mean_.reset_state(); }
  const std::string& name() const { return mean_.name(); }
  std::vector<variable> variables() const { return mean_.variables(); }

 private:
  double threshold_;
  mean mean_;
};

/// The fraction of samples whose largest prediction is at their integer label, as
/// Keras' `SparseCategoricalAccuracy` (labels of the predictions' rank end in a dim of 1).
/// \code
/// kiln::metrics::sparse_categorical_accuracy acc;
/// acc.update_state(kiln::constant({1, 0}), kiln::constant({{0.1f, 0.9f}, {0.2f, 0.8f}}));  // 0.5
/// \endcode
class sparse_categorical_accuracy {
 public:
  template <class = void>
  explicit sparse_categorical_accuracy(std::string name = "sparse_categorical_accuracy") : mean_(std::move(name)) {}
  template <class = void>
  void update_state(const tensor& labels, const tensor& y_pred) {
    tensor l = labels;
    if (l.shape().has_known_rank() && y_pred.shape().has_known_rank() && l.rank() == y_pred.rank() && l.rank() > 0)
      l = reshape(l, shape(std::span<const std::int64_t>(l.shape().begin(), std::size_t(l.rank() - 1))));
    const tensor predicted = argmax(y_pred, -1);
    mean_.update_state(cast(equal(cast(l, predicted.dtype()), predicted), float32));
  }
  template <class = void>
  tensor result() const { return mean_.result(); }
  template <class = void>
  void reset_state() { mean_.reset_state(); }
  const std::string& name() const { return mean_.name(); }
  std::vector<variable> variables() const { return mean_.variables(); }

 private:
  mean mean_;
};

}  // namespace kiln::metrics

#if KILN_DEFINE_LIBRARY
namespace kiln::metrics {

KILN_LIBRARY_INLINE std::vector<variable> mean::variables() const { return {total_, count_}; }

}  // namespace kiln::metrics
#endif  // KILN_DEFINE_LIBRARY

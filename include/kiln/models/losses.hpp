#pragma once
/// \file
/// Keras' losses (`tf.keras.losses`), as functions of `(y_true, y_pred)` giving what
/// the loss classes give with their default reduction, `SUM_OVER_BATCH_SIZE`: each
/// sample's loss (the mean over the last axis for the elementwise losses), averaged
/// over the batch. Written with the registry's ops, so they run eagerly and in graphs
/// and have the gradients those ops give; the probability forms clip as Keras' backend
/// does (epsilon 1e-7).

#include <cstdint>
#include <string>

#include "kiln/ops/activations.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::losses {

/// Options of the cross-entropies: whether `y_pred` holds logits rather than
/// probabilities (Keras' `from_logits`).
struct crossentropy_options {
  bool from_logits = false;
};
/// Options of `huber`: where the loss turns from quadratic to linear.
struct huber_options {
  double delta = 1.0;
};

namespace detail {
/// Keras' backend epsilon, what probabilities are clipped to.
inline constexpr double epsilon = 1e-7;

/// The terms the losses share (`loss_terms`, the one specialization): a template on
/// nothing, compiled only where a program computes a loss.
template <class Unused>
struct basic_loss_terms {
  /// `y_true` as `y_pred`'s dtype (Keras casts the targets), after checking both are
  /// floating-point tensors (`fn` names the loss).
  static tensor targets_like(std::string_view fn, const tensor& y_true, const tensor& y_pred);
  /// `x` clipped to [lo, hi].
  static tensor clip(const tensor& x, double lo, double hi);
  /// Keras' SUM_OVER_BATCH_SIZE of per-sample losses: their mean.
  static tensor batch_mean(const tensor& per_sample);
};
using loss_terms = basic_loss_terms<void>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
tensor basic_loss_terms<Unused>::targets_like(std::string_view fn, const tensor& y_true, const tensor& y_pred) {
  kiln::detail::require_floating(fn, y_pred);
  return y_true.dtype() == y_pred.dtype() ? y_true : cast(y_true, y_pred.dtype());
}

template <class Unused>
tensor basic_loss_terms<Unused>::clip(const tensor& x, double lo, double hi) {
  return minimum(maximum(x, lo), hi);
}

template <class Unused>
tensor basic_loss_terms<Unused>::batch_mean(const tensor& per_sample) {
  return reduce_mean(per_sample);
}
#endif

}  // namespace detail

/// `mean(square(y_pred - y_true), axis=-1)`, averaged over the batch (Keras' `MeanSquaredError`).
/// \code kiln::losses::mean_squared_error(kiln::constant({{0.f, 1.f}}), kiln::constant({{1.f, 1.f}}));  // 0.5 \endcode
template <class Unused = void>
tensor mean_squared_error(const tensor& y_true, const tensor& y_pred) {
  using terms = detail::basic_loss_terms<Unused>;
  const tensor t = terms::targets_like("losses::mean_squared_error", y_true, y_pred);
  return terms::batch_mean(reduce_mean(square(y_pred - t), -1));
}

/// `mean(abs(y_pred - y_true), axis=-1)`, averaged over the batch (Keras' `MeanAbsoluteError`).
/// \code kiln::losses::mean_absolute_error(kiln::constant({{0.f, 1.f}}), kiln::constant({{1.f, 3.f}}));  // 1.5 \endcode
template <class Unused = void>
tensor mean_absolute_error(const tensor& y_true, const tensor& y_pred) {
  using terms = detail::basic_loss_terms<Unused>;
  const tensor t = terms::targets_like("losses::mean_absolute_error", y_true, y_pred);
  return terms::batch_mean(reduce_mean(abs(y_pred - t), -1));
}

/// Keras' `Huber`: `0.5 * e^2` where `|e| <= delta`, else `delta * |e| - 0.5 * delta^2`,
/// with `e = y_pred - y_true`, the mean over the last axis averaged over the batch.
/// \code kiln::losses::huber(kiln::constant({{0.f}}), kiln::constant({{3.f}}), {.delta = 1.0});  // 2.5 \endcode
template <class Unused = void>
tensor huber(const tensor& y_true, const tensor& y_pred, huber_options options = {}) {
  using terms = detail::basic_loss_terms<Unused>;
  const tensor t = terms::targets_like("losses::huber", y_true, y_pred);
  const tensor e = y_pred - t, a = abs(e);
  const tensor per_element = where(a <= options.delta, 0.5 * square(e), options.delta * a - 0.5 * options.delta * options.delta);
  return terms::batch_mean(reduce_mean(per_element, -1));
}

/// Keras' `BinaryCrossentropy`: from probabilities (clipped to [1e-7, 1 - 1e-7]) or,
/// with `from_logits`, as `tf.nn.sigmoid_cross_entropy_with_logits`
/// (`max(x, 0) - x * z + log(1 + exp(-|x|))`); the mean over the last axis, averaged
/// over the batch.
/// \code kiln::losses::binary_crossentropy(kiln::constant({{1.f}}), kiln::constant({{0.f}}), {.from_logits = true});  // log 2 \endcode
template <class Unused = void>
tensor binary_crossentropy(const tensor& y_true, const tensor& y_pred, crossentropy_options options = {}) {
  using terms = detail::basic_loss_terms<Unused>;
  const tensor z = terms::targets_like("losses::binary_crossentropy", y_true, y_pred);
  tensor per_element;
  if (options.from_logits) {
    per_element = relu(y_pred) - y_pred * z + softplus(-abs(y_pred));
  } else {
    const tensor p = terms::clip(y_pred, detail::epsilon, 1 - detail::epsilon);
    per_element = -(z * log(p + detail::epsilon) + (1.0 - z) * log(1.0 - p + detail::epsilon));
  }
  return terms::batch_mean(reduce_mean(per_element, -1));
}

/// Keras' `CategoricalCrossentropy` of one-hot (or soft) targets over the last axis:
/// `-sum(y_true * log(p))` with `p` the predictions normalized to sum 1 and clipped,
/// or `log_softmax(y_pred)` with `from_logits`; averaged over the batch.
/// \code kiln::losses::categorical_crossentropy(kiln::constant({{0.f, 1.f}}), kiln::constant({{0.5f, 0.5f}}));  // log 2 \endcode
template <class Unused = void>
tensor categorical_crossentropy(const tensor& y_true, const tensor& y_pred, crossentropy_options options = {}) {
  using terms = detail::basic_loss_terms<Unused>;
  const tensor t = terms::targets_like("losses::categorical_crossentropy", y_true, y_pred);
  tensor log_p;
  if (options.from_logits) {
    log_p = log_softmax(y_pred);
  } else {
    const tensor normalized = y_pred / reduce_sum(y_pred, -1, true);
    log_p = log(terms::clip(normalized, detail::epsilon, 1 - detail::epsilon));
  }
  return terms::batch_mean(-reduce_sum(t * log_p, -1));
}

/// Keras' `SparseCategoricalCrossentropy`: integer class labels against predictions
/// over the last axis (logits with `from_logits`, else probabilities, clipped and
/// taken as log-probabilities); labels of the predictions' rank end in a dim of 1,
/// which is dropped, as Keras does. A label outside the classes raises
/// kiln::invalid_argument_error.
/// \code
/// kiln::losses::sparse_categorical_crossentropy(kiln::constant({1}), kiln::constant({{0.f, 0.f}}), {.from_logits = true});  // log 2
/// \endcode
template <class Unused = void>
tensor sparse_categorical_crossentropy(const tensor& labels, const tensor& y_pred, crossentropy_options options = {}) {
  using terms = detail::basic_loss_terms<Unused>;
  kiln::detail::require_floating("losses::sparse_categorical_crossentropy", y_pred);
  tensor l = labels;
  if (l.shape().has_known_rank() && y_pred.shape().has_known_rank() && l.rank() == y_pred.rank() && l.rank() > 0)
    l = reshape(l, shape(std::span<const std::int64_t>(l.shape().begin(), std::size_t(l.rank() - 1))));
  if (is_floating(l.dtype())) l = cast(l, int64);  // Keras casts float labels to integers
  const tensor logits = options.from_logits ? y_pred : log(terms::clip(y_pred, detail::epsilon, 1 - detail::epsilon));
  return terms::batch_mean(sparse_softmax_cross_entropy(l, logits));
}

}  // namespace kiln::losses

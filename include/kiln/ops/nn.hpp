#pragma once
/// \file
/// What classifiers need: `softmax`, `log_softmax`, `reduce_logsumexp` and the
/// softmax cross-entropy with integer labels, as TensorFlow's `tf.nn` functions. Each
/// is written with the registry's ops (max-shifted for stability, as TensorFlow's
/// kernels are), so it runs on every backend, eagerly and in graphs, fuses with its
/// neighbours and has the gradient those ops give; no kernel of its own.

#include <cstdint>
#include <limits>
#include <string>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln {

KILN_LIBRARY_INLINE tensor stop_gradient(const tensor& x);  // kiln/autodiff/tape.hpp

namespace detail {

/// Raises kiln::type_error unless `x` holds floating-point values (`fn` names the function).
KILN_LIBRARY_INLINE void require_floating(std::string_view fn, const tensor& x);

/// The softmax family's functions (`nn_functions`, the one specialization): a template
/// on nothing, so that a file compiles them only where it calls them, and a compiled
/// kiln compiles them all with one explicit instantiation
/// (kiln/separate_compilation.hpp). The public functions below forward to them.
template <class Unused>
struct basic_nn_functions {
  /// The largest element along `axis` (kept as size 1), 0 where it is not finite (an
  /// axis of -inf only), and cut off from gradient tapes: what stable softmaxes
  /// subtract, as TensorFlow's reduce_logsumexp does.
  static tensor shift_of(const tensor& x, reduction_axes axis);
  static tensor reduce_logsumexp(const tensor& x, reduction_axes axis, bool keepdims);
  static tensor softmax(const tensor& logits, std::int64_t axis);
  static tensor log_softmax(const tensor& logits, std::int64_t axis);
  static tensor sparse_softmax_cross_entropy(const tensor& labels, const tensor& logits);
};
using nn_functions = basic_nn_functions<void>;

}  // namespace detail

/// log(sum(exp(x))) over `axis` (every axis by default), computed without overflow.
/// \code kiln::reduce_logsumexp(kiln::constant({0.f, 0.f}));  // log 2 = 0.6931472 \endcode
template <class Unused = void>
tensor reduce_logsumexp(const tensor& x, reduction_axes axis = {}, bool keepdims = false) {
  return detail::basic_nn_functions<Unused>::reduce_logsumexp(x, axis, keepdims);
}

/// exp(x) / sum(exp(x)) along `axis` (the last by default), as tf.nn.softmax.
/// \code kiln::softmax(kiln::constant({1.0, 1.0}));  // [0.5 0.5] \endcode
template <class Unused = void>
tensor softmax(const tensor& logits, std::int64_t axis = -1) {
  return detail::basic_nn_functions<Unused>::softmax(logits, axis);
}

/// log(softmax(logits)) along `axis` (the last by default), computed without
/// overflow or log(0), as tf.nn.log_softmax.
/// \code kiln::log_softmax(kiln::constant({0.f, 0.f}));  // [-0.6931472 -0.6931472] \endcode
template <class Unused = void>
tensor log_softmax(const tensor& logits, std::int64_t axis = -1) {
  return detail::basic_nn_functions<Unused>::log_softmax(logits, axis);
}

/// The cross-entropy of softmax(logits) against class indices, one loss per label, as
/// tf.nn.sparse_softmax_cross_entropy_with_logits: `logits` is (..., classes) of
/// float32 or float64, `labels` int32 or int64 of the leading dims. A label outside
/// [0, classes) raises kiln::invalid_argument_error when it is used, eagerly or in a graph.
/// \code
/// auto loss = kiln::sparse_softmax_cross_entropy(kiln::constant({1}), kiln::constant({{0.f, 0.f}}));  // [0.6931472]
/// \endcode
template <class Unused = void>
tensor sparse_softmax_cross_entropy(const tensor& labels, const tensor& logits) {
  return detail::basic_nn_functions<Unused>::sparse_softmax_cross_entropy(labels, logits);
}

#if KILN_DEFINE_LIBRARY
template <class Unused>
tensor detail::basic_nn_functions<Unused>::shift_of(const tensor& x, reduction_axes axis) {
  const tensor m = stop_gradient(reduce_max(x, axis, true));
  return where(abs(m) < std::numeric_limits<double>::infinity(), m, 0.0);
}

template <class Unused>
tensor detail::basic_nn_functions<Unused>::reduce_logsumexp(const tensor& x, reduction_axes axis, bool keepdims) {
  detail::require_floating("reduce_logsumexp", x);
  const tensor m = shift_of(x, axis);
  const tensor kept = log(reduce_sum(exp(x - m), axis, true)) + m;
  return keepdims ? kept : reduce_sum(kept, axis, false);  // drops the size-1 dims
}

template <class Unused>
tensor detail::basic_nn_functions<Unused>::softmax(const tensor& logits, std::int64_t axis) {
  detail::require_floating("softmax", logits);
  const tensor e = exp(logits - shift_of(logits, reduction_axes{axis}));
  return e / reduce_sum(e, reduction_axes{axis}, true);
}

template <class Unused>
tensor detail::basic_nn_functions<Unused>::log_softmax(const tensor& logits, std::int64_t axis) {
  detail::require_floating("log_softmax", logits);
  const tensor shifted = logits - shift_of(logits, reduction_axes{axis});
  return shifted - log(reduce_sum(exp(shifted), reduction_axes{axis}, true));
}

template <class Unused>
tensor detail::basic_nn_functions<Unused>::sparse_softmax_cross_entropy(const tensor& labels, const tensor& logits) {
  detail::require_floating("sparse_softmax_cross_entropy", logits);
  if (!labels.defined() || !is_integer(labels.dtype()))
    throw type_error("sparse_softmax_cross_entropy: labels are int32 or int64 class indices, got " +
                     std::string(labels.defined() ? name(labels.dtype()) : "an empty tensor"));
  const shape& s = logits.shape();
  if (!s.has_known_rank() || s.rank() < 1 || s[s.rank() - 1] == none)
    throw value_error("sparse_softmax_cross_entropy: logits need a known last dim (the classes), got " + s.str());
  const std::int64_t classes = s[s.rank() - 1];
  const tensor class_ids = cast(range(classes), labels.dtype());
  // Gathering the labels from the class ids checks each against the classes (the
  // gather's own index check, eager or in a graph) and gives the labels themselves.
  const tensor checked = gather(class_ids, labels);
  shape column = labels.shape();
  column.push_back(1);
  const tensor one_hot = cast(equal(reshape(checked, column), class_ids), logits.dtype());
  return -reduce_sum(one_hot * log_softmax(logits, -1), -1);
}
#endif

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE void require_floating(std::string_view fn, const tensor& x) {
  if (!x.defined()) throw invalid_argument_error(std::string(fn) + ": the tensor is empty (default-constructed)");
  if (!is_floating(x.dtype()))
    throw type_error(std::string(fn) + ": takes float32 or float64 values, got " + std::string(name(x.dtype())));
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

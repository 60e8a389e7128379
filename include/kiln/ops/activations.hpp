#pragma once
/// \file
/// The activations of neural-network layers beside relu, sigmoid and tanh (kiln/ops/
/// elementwise.hpp): gelu (exact and tanh approximation), softplus, silu, elu,
/// leaky_relu, and erf, which exact gelu and its gradient are written with. Each is
/// one elementwise functor (scalars, xsimd batches, Thrust device code) with its
/// gradient formula beside it, computing what TensorFlow 2.12's kernels and
/// `tf.nn` functions compute.

#include <span>
#include <string_view>
#include <tuple>

#include "kiln/ops/elementwise.hpp"

namespace kiln::ops {

/// The Gauss error function, as `tf.math.erf`.
struct erf : elementwise_op<1, floating> {
  static constexpr std::string_view name = "erf";
  static constexpr std::string_view onnx_name = "Erf";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::erf(a); }
  /// dy * 2 / sqrt(pi) * exp(-x^2).
  template <class G> void gradient(G& g) const {
    const auto x = g.x(0);
    g.give(0, g.dy() * 1.1283791670955126 * G::run(exp{}, -(x * x)));
  }
};

/// `x * P(X <= x)` for a standard normal X (`tf.nn.gelu`): exactly, with erf, or with
/// the tanh approximation when `approximate`.
struct gelu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "gelu";
  static constexpr std::string_view onnx_name = "Gelu";
  bool approximate = false;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"approximate", &gelu::approximate}}; }
  constexpr gelu() = default;
  constexpr explicit gelu(bool tanh_approximation) : approximate(tanh_approximation) {}
  constexpr bool operator==(const gelu&) const = default;
  // TensorFlow's constants and operation order: x / sqrt(2) (not a product), and
  // sqrt(2 / pi) * (x + 0.044715 * x^3).
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    if (approximate) return T(0.5) * x * (T(1) + math::tanh(T(0.7978845608028654) * (x + T(0.044715) * (x * x * x))));
    return T(0.5) * x * (T(1) + math::erf(x / T(1.4142135623730951)));
  }
  /// dy * (Phi(x) + x * phi(x)) exactly; the derivative of the tanh form when
  /// approximating.
  template <class G> void gradient(G& g) const;
};

/// `log(exp(x) + 1)`; x itself above -log(epsilon) - 2 and exp(x) below log(epsilon)
/// + 2, as TensorFlow's Softplus kernel, where the sum would lose x's digits.
struct softplus : elementwise_op<1, floating> {
  static constexpr std::string_view name = "softplus";
  static constexpr std::string_view onnx_name = "Softplus";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::softplus(x); }
  /// dy * sigmoid(x).
  template <class G> void gradient(G& g) const;
};

/// `x * sigmoid(x)` (swish), as `tf.nn.silu`.
struct silu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "silu";
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return x * (T(1) / (T(1) + math::exp(math::neg(x)))); }
  /// dy * s * (1 + x * (1 - s)) with s = sigmoid(x).
  template <class G> void gradient(G& g) const;
};

/// `x` where positive, else `alpha * (exp(x) - 1)`, as Keras' `elu` (TensorFlow's Elu
/// kernel for alpha 1).
struct elu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "elu";
  static constexpr std::string_view onnx_name = "Elu";
  double alpha = 1.0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"alpha", &elu::alpha}}; }
  constexpr elu() = default;
  constexpr explicit elu(double a) : alpha(a) {}
  constexpr bool operator==(const elu&) const = default;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const {
    return math::select(x > T(0), x, T(alpha) * (math::exp(x) - T(1)));
  }
  /// dy where x is positive, else dy * (y + alpha).
  template <class G> void gradient(G& g) const;
};

/// `x` where positive, else `alpha * x`, as TensorFlow's LeakyRelu kernel.
struct leaky_relu : elementwise_op<1, floating> {
  static constexpr std::string_view name = "leaky_relu";
  static constexpr std::string_view onnx_name = "LeakyRelu";
  double alpha = 0.3;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"alpha", &leaky_relu::alpha}}; }
  constexpr leaky_relu() = default;
  constexpr explicit leaky_relu(double a) : alpha(a) {}
  constexpr bool operator==(const leaky_relu&) const = default;
  template <class T> KILN_HOST_DEVICE T operator()(T x) const { return math::select(x > T(0), x, T(alpha) * x); }
  /// dy where x is positive, else alpha * dy, as TensorFlow's LeakyReluGrad.
  template <class G> void gradient(G& g) const;
};

template <class G>
void gelu::gradient(G& g) const {
  const auto x = g.x(0);
  if (approximate) {
    const double k = 0.7978845608028654, c = 0.044715;
    const auto t = G::run(tanh{}, k * (x + c * (x * x * x)));
    g.give(0, g.dy() * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (k * (1.0 + 3.0 * c * (x * x)))));
  } else {
    const auto cdf = 0.5 * (1.0 + G::run(erf{}, x * 0.7071067811865476));
    const auto pdf = 0.3989422804014327 * G::run(exp{}, -0.5 * (x * x));
    g.give(0, g.dy() * (cdf + x * pdf));
  }
}

template <class G>
void softplus::gradient(G& g) const {
  g.give(0, g.dy() * G::run(sigmoid{}, g.x(0)));
}

template <class G>
void silu::gradient(G& g) const {
  const auto x = g.x(0), s = G::run(sigmoid{}, x);
  g.give(0, g.dy() * (s * (1.0 + x * (1.0 - s))));
}

template <class G>
void elu::gradient(G& g) const {
  const auto positive = G::run(greater{}, g.x(0), g.x(0).scalar(0));
  g.give(0, G::run(where{}, positive, g.dy(), g.dy() * (g.y() + alpha)));
}

template <class G>
void leaky_relu::gradient(G& g) const {
  const auto positive = G::run(greater{}, g.x(0), g.x(0).scalar(0));
  g.give(0, G::run(where{}, positive, g.dy(), g.dy() * alpha));
}

}  // namespace kiln::ops

namespace kiln {

// erf, softplus and silu: the functions of the one op list (kiln/ops/op_list.hpp,
// where they are documented), as kiln/ops/elementwise.hpp writes them.
KILN_ACTIVATION_FUNCTIONS(KILN_DETAIL_TENSOR_UNARY_FUNCTION)
#undef KILN_DETAIL_TENSOR_UNARY_FUNCTION

/// `kiln::gelu(x)`: the Gaussian error linear unit, `x * Phi(x)`; `kiln::gelu(x, true)`
/// uses the tanh approximation (`tf.nn.gelu(x, approximate=True)`).
/// \code kiln::gelu(kiln::constant({-1.f, 0.f, 1.f})); // [-0.158655 0 0.841345] \endcode
template <class = void>
tensor gelu(const tensor& x, bool approximate = false) { return detail::apply(ops::gelu(approximate), x); }

/// `kiln::elu(x, alpha = 1)`: x where positive, else `alpha * (exp(x) - 1)`.
template <class = void>
tensor elu(const tensor& x, double alpha = 1.0) { return detail::apply(ops::elu(alpha), x); }

/// `kiln::leaky_relu(x, alpha = 0.3)`: x where positive, else `alpha * x` (Keras'
/// default slope; `tf.nn.leaky_relu`'s is 0.2).
/// \code kiln::leaky_relu(kiln::constant({-2.f, 3.f})); // [-0.6 3] \endcode
template <class = void>
tensor leaky_relu(const tensor& x, double alpha = 0.3) { return detail::apply(ops::leaky_relu(alpha), x); }

}  // namespace kiln

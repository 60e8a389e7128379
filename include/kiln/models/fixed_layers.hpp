#pragma once
/// \file
/// Compile-time checked models: Keras' dense layer for the compile-time tier
/// (`kiln::layers::fixed_dense<Units>`), and `kiln::layers::fixed_sequential`, which
/// builds a stack of them for an input type. A runtime `layers::dense(16)` takes its
/// units when the program runs; a typed layer has them in its type, so that the shape
/// of every weight and every result is known to the compiler. A layer is described
/// first (its units, activation, initializers, name) and built for its input type:
/// the kernel of `fixed_dense<16>` fed `fixed<float, 8, 64>` is a
/// `fixed_variable<float, 64, 16>`. A built layer fed an input of another shape or
/// element type is a compile error naming the layer, whose "In instantiation of"
/// lines give the type it was built for and the input's.
///
/// A model's forward pass applies its layers one after the other in one expression
/// (a fold over the built layers' types, which change from layer to layer), so that
/// inside a typed function each layer's elementwise tail (bias, activation) fuses
/// with the matmul that follows, as in the same model written with raw typed ops.
///
/// Only class templates: a file compiles a typed layer only where it makes one. The
/// header needs the compile-time tier alone (kiln/fixed.hpp).

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kiln/typed/control_flow.hpp"
#include "kiln/typed/effects.hpp"
#include "kiln/typed/unfused_ops.hpp"
#include "kiln/typed/ops.hpp"

namespace kiln::layers {

/// Activations of typed layers, as types (a typed layer's activation is part of its
/// type, as its units are): `linear` (none), `relu`, `tanh`, `sigmoid`, `gelu`,
/// `silu`, `softplus`. Any type whose call operator takes a typed operand works too.
namespace fixed_activations {
struct linear {
  template <class X>
  X operator()(const X& x) const {
    return x;
  }
};
#define KILN_FIXED_ACTIVATION(fn)      \
  struct fn {                          \
    template <class X>                 \
    auto operator()(const X& x) const { \
      return kiln::fn(x);              \
    }                                  \
  };
KILN_FIXED_ACTIVATION(relu)
KILN_FIXED_ACTIVATION(tanh)
KILN_FIXED_ACTIVATION(sigmoid)
KILN_FIXED_ACTIVATION(gelu)
KILN_FIXED_ACTIVATION(silu)
KILN_FIXED_ACTIVATION(softplus)
#undef KILN_FIXED_ACTIVATION
}  // namespace fixed_activations

/// Options of a typed dense layer: its name (in the variables' names,
/// `name/kernel`), whether it has a bias, and the seed of its kernel's
/// Glorot-uniform draw (Keras' default initializer; the bias starts at zero).
struct fixed_dense_options {
  std::string name = "dense";
  bool use_bias = true;
  std::uint64_t seed = 0;
};

template <class T, std::int64_t In, std::int64_t Units, class Activation>
class built_fixed_dense;

/// A densely connected layer whose units are in its type (Keras' `Dense` for the
/// compile-time tier): `activation(x · kernel + bias)` over the last dim of `x`. It is
/// a description until built for an input type, by `fixed_sequential` or by
/// `build<X>()`; the built layer holds the weights as fixed_variables.
/// \code
/// kiln::layers::fixed_dense<16, kiln::layers::fixed_activations::relu> d({.name = "hidden", .seed = 1});
/// auto built = d.build<kiln::fixed<float, 8, 4>>();  // kernel: fixed_variable<float, 4, 16>
/// kiln::function f([&](const auto& x) { return built(x); });
/// kiln::fixed<float, 8, 16> y = f(kiln::fixed<float, 8, 4>::ones());
/// \endcode
template <std::int64_t Units, class Activation = fixed_activations::linear>
class fixed_dense {
  static_assert(Units > 0, "kiln::layers::fixed_dense: the units must be positive");

 public:
  static constexpr std::int64_t units = Units;
  explicit fixed_dense(fixed_dense_options options = {}, Activation activation = {})
      : options_(std::move(options)), activation_(activation) {}

  /// The layer built for inputs of `fixed` type `X` (rank 1 or more, a floating
  /// element type): its kernel is `In x Units` for X's last dim In.
  template <class X>
  auto build() const {
    using V = typed::value_of<X>;
    using T = typename V::value_type;
    static_assert(std::is_floating_point_v<T>, "kiln::layers::fixed_dense: the input's element type must be float or double");
    static_assert(V::rank >= 1, "kiln::layers::fixed_dense: the input must have rank 1 or more");
    return built_fixed_dense<T, V::dims_type::inner, Units, Activation>(options_, activation_);
  }

 private:
  fixed_dense_options options_;
  Activation activation_;
};

/// A typed dense layer built for inputs whose last dim is `In` and whose elements are
/// `T`: its kernel and bias are fixed_variables of shapes (In, Units) and (Units).
/// Called inside a typed function it reads them at every call; on `fixed` values
/// outside one, it computes at once from their values.
template <class T, std::int64_t In, std::int64_t Units, class Activation>
class built_fixed_dense {
 public:
  using kernel_type = fixed_variable<T, In, Units>;
  using bias_type = fixed_variable<T, Units>;

  built_fixed_dense(const fixed_dense_options& options, Activation activation)
      : kernel_(glorot_uniform(options.seed), options.name + "/kernel"),
        bias_(typename bias_type::value_type(), options.name + "/bias"),
        name_(options.name),
        use_bias_(options.use_bias),
        activation_(activation) {}

  const std::string& name() const { return name_; }
  const kernel_type& kernel() const { return kernel_; }
  const bias_type& bias() const { return bias_; }
  kernel_type& kernel() { return kernel_; }
  bias_type& bias() { return bias_; }

  /// `activation(x · kernel + bias)`. An input whose element type is not `T` or whose
  /// last dim is not `In` is a compile error naming the layer; the instantiation lines
  /// above it show this type (the shape it was built for) and the input's.
  template <typed::operand X>
  auto operator()(const X& x) const {
    using V = typed::value_of<X>;
    static_assert(std::is_same_v<typename V::value_type, T>,
                  "kiln::layers::fixed_dense: the input's element type is not the one the layer was built for");
    static_assert(V::rank >= 1 && V::dims_type::inner == In,
                  "kiln::layers::fixed_dense: the input's last dim is not the one the layer was built for");
    if constexpr (!std::is_same_v<typename V::value_type, T> || V::rank < 1 || V::dims_type::inner != In) {
      return typed::rule_error{};
    } else if constexpr (typed::eager<X>) {
      auto y = kiln::matmul(x, kernel_.value());
      return use_bias_ ? activation_(y + bias_.value()) : activation_(y + T(0));
    } else {
      auto y = kiln::matmul(x, kernel_.read_value());
      // (no branch on use_bias in the trace: without one, the bias stays zero)
      return activation_(y + bias_.read_value());
    }
  }

 private:
  /// Keras' Glorot-uniform kernel: uniform in +-sqrt(6 / (In + Units)), seeded.
  static typename kernel_type::value_type glorot_uniform(std::uint64_t seed) {
    const T limit = T(std::sqrt(6.0 / double(In + Units)));
    return kernel_type::value_type::uniform(seed, -limit, limit);
  }

  kernel_type kernel_;
  bias_type bias_;
  std::string name_;
  bool use_bias_;
  Activation activation_;
};

namespace detail {
/// Descriptions `first, rest...` built one after the other from input type `X`.
template <class X>
std::tuple<> build_stack() {
  return {};
}
template <class X, class First, class... Rest>
auto build_stack(const First& first, const Rest&... rest) {
  auto built = first.template build<X>();
  using output = typed::value_of<decltype(built(std::declval<const X&>()))>;
  return std::tuple_cat(std::tuple<decltype(built)>(std::move(built)), build_stack<output>(rest...));
}
}  // namespace detail

/// A stack of typed layers built for input type `X` (Keras' `Sequential` for the
/// compile-time tier): each layer's weights take their shapes from the type the layer
/// before gives. Made by `fixed_sequential<X>(layers...)`.
template <class X, class... Built>
class fixed_model {
 public:
  using input_type = X;
  explicit fixed_model(std::tuple<Built...> layers) : layers_(std::move(layers)) {}

  /// The layers applied in order: one expression in a typed trace.
  template <typed::operand Y>
  auto operator()(const Y& x) const {
    return std::apply([&](const auto&... l) { return apply_all(x, l...); }, layers_);
  }
  /// Layer `I`, built (its weights: `layer<0>().kernel()`).
  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers_);
  }
  template <std::size_t I>
  const auto& layer() const {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size = sizeof...(Built);

 private:
  template <class Y>
  static auto apply_all(const Y& x) {
    return x;
  }
  template <class Y, class First, class... Rest>
  static auto apply_all(const Y& x, const First& first, const Rest&... rest) {
    auto y = first(x);
    if constexpr (std::is_same_v<decltype(y), typed::rule_error>)
      return y;  // (that layer's static_assert said why; the rest would only repeat it)
    else
      return apply_all(y, rest...);
  }

  std::tuple<Built...> layers_;
};

/// The typed layers `layers...` built one after the other for inputs of `fixed` type
/// `X`, as a typed model; the weights' shapes follow from X.
/// \code
/// namespace L = kiln::layers;
/// auto mlp = L::fixed_sequential<kiln::fixed<float, 8, 64>>(
///     L::fixed_dense<32, L::fixed_activations::relu>({.name = "dense", .seed = 1}),
///     L::fixed_dense<32, L::fixed_activations::relu>({.name = "dense_1", .seed = 2}),
///     L::fixed_dense<10>({.name = "dense_2", .seed = 3}));
/// kiln::function forward([&](const auto& x) { return mlp(x); });
/// kiln::fixed<float, 8, 10> logits = forward(kiln::fixed<float, 8, 64>::ones());
/// \endcode
template <class X, class... Layers>
auto fixed_sequential(const Layers&... layers) {
  static_assert(typed::fixed_value<X>, "kiln::layers::fixed_sequential: the input type must be a kiln::fixed");
  return [&]<class... Built>(std::tuple<Built...> built) {
    return fixed_model<X, Built...>(std::move(built));
  }(detail::build_stack<X>(layers...));
}

}  // namespace kiln::layers

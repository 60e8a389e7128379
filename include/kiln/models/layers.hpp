#pragma once
/// \file
/// Keras' layers for the runtime tier (`kiln::layers`, `tf.keras.layers`): dense,
/// conv2d, max_pooling2d, average_pooling2d, flatten, dropout, batch_normalization,
/// layer_normalization, embedding and sequential, with Keras' arguments, defaults,
/// weight names and formulas. A layer is built on its first call from the input's
/// shape, as Keras builds one: inside a kiln::function that is the first trace, whose
/// variables the layer keeps (the singleton rule of kiln::function holds). A layer is
/// a handle: copies share the weights, as Python names share a layer, which is how a
/// `sequential` holds the layers given to it. Each layer is a kiln::module whose
/// variables are its weights in Keras' order (kernel before bias).
///
/// A layer checks its input: a rank it does not take or a last dim other than the
/// one it was built for raises kiln::value_error naming the layer and both shapes.
///
/// What runs ops or makes variables (a layer's state, its constructors, its call) is
/// a template on nothing, as op functions are: a file that includes kiln compiles a
/// layer only where it makes one.

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/models/initializers.hpp"
#include "kiln/models/module.hpp"
#include "kiln/ops/activations.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/pooling.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/trace/random.hpp"

namespace kiln::layers {

/// How a layer is called: `training` turns on dropout and batch statistics.
struct call_options {
  bool training = false;
};

/// A layer's activation: a kiln function (`kiln::relu`, `kiln::gelu`, `kiln::softmax`,
/// ...), Keras' name of one (`"relu"`), any callable on a tensor, or none (linear).
/// \code kiln::layers::activation a = kiln::sigmoid; a(kiln::constant({0.f}));  // [0.5] \endcode
class activation {
 public:
  activation() = default;
  activation(tensor (*f)(const tensor&)) : unary_(f) {}
  /// `kiln::gelu` (exact unless given `"gelu_tanh"` by name).
  activation(tensor (*f)(const tensor&, bool)) : with_flag_(f) {}
  /// `kiln::elu` (alpha 1) and `kiln::leaky_relu` (alpha 0.3), with their default slopes.
  activation(tensor (*f)(const tensor&, double)) : with_number_(f) {}
  /// `kiln::softmax` over the last axis.
  activation(tensor (*f)(const tensor&, std::int64_t)) : with_axis_(f) {}
  /// Keras' names: linear, relu, sigmoid, tanh, softmax, softplus, silu (swish), gelu,
  /// elu, exponential; another name is a kiln::value_error.
  template <class = void>
  activation(const char* keras_name) : activation(by_name(keras_name)) {}
  template <class = void>
  activation(const std::string& keras_name) : activation(by_name(keras_name)) {}
  /// Any callable from a tensor to a tensor.
  template <class F>
    requires(std::is_invocable_r_v<tensor, F&, const tensor&> && !std::is_pointer_v<std::decay_t<F>> &&
             !std::is_convertible_v<F, std::string>)
  activation(F f) : custom_(std::move(f)) {}

  /// `f(x)`; `x` itself for none.
  template <class = void>
  tensor operator()(const tensor& x) const {
    if (unary_) return unary_(x);
    if (with_flag_) return with_flag_(x, false);
    if (with_number_) return with_number_(x, with_number_ == &kiln::leaky_relu<> ? 0.3 : 1.0);
    if (with_axis_) return with_axis_(x, -1);
    if (custom_) return custom_(x);
    return x;
  }
  /// True unless linear.
  KILN_LIBRARY_INLINE explicit operator bool() const;

 private:
  template <class = void>
  static activation by_name(std::string_view n) {
    if (n == "linear" || n.empty()) return {};
    if (n == "relu") return &kiln::relu<>;
    if (n == "sigmoid") return &kiln::sigmoid<>;
    if (n == "tanh") return &kiln::tanh<>;
    if (n == "softplus") return &kiln::softplus<>;
    if (n == "silu" || n == "swish") return &kiln::silu<>;
    if (n == "exponential") return &kiln::exp<>;
    if (n == "gelu") return &kiln::gelu<>;
    if (n == "elu") return &kiln::elu<>;
    if (n == "softmax") return &kiln::softmax<>;
    throw value_error("layers::activation: unknown activation \"" + std::string(n) + "\"");
  }
  tensor (*unary_)(const tensor&) = nullptr;
  tensor (*with_flag_)(const tensor&, bool) = nullptr;
  tensor (*with_number_)(const tensor&, double) = nullptr;
  tensor (*with_axis_)(const tensor&, std::int64_t) = nullptr;
  std::function<tensor(const tensor&)> custom_;
};

/// A window or stride of two dims: `3` is 3 x 3, `{3, 2}` 3 high and 2 wide.
struct size2 {
  std::int64_t h = 1, w = 1;
  size2(std::int64_t both) : h(both), w(both) {}
  size2(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  bool operator==(const size2&) const = default;
};

namespace detail {

/// `base`, `base_1`, `base_2`, ...: Keras' unique layer names, one count per base name
/// in the program.
KILN_LIBRARY_INLINE std::string unique_name(std::string_view base);

/// What every layer keeps, shared by its copies: its name, whether it is built, its
/// weights (each with whether training updates it) and the input it was built for.
struct layer_state {
  std::string name;
  bool built = false;
  std::vector<std::pair<variable, bool>> weights;
  /// The rank an input must have (0: any), or at least (`min_rank`).
  int rank = 0, min_rank = 0;
  /// The last dim of the input the layer was built for (none: not checked).
  std::int64_t last_dim = none;
  /// The dtype the weights were made in.
  dtype type = float32;
  /// Whether inputs are cast to `type` (not ids, nor what a sequential passes on).
  bool casts_input = true;

  explicit layer_state(std::string n) : name(std::move(n)) {}
  layer_state(const layer_state&) = delete;
  layer_state& operator=(const layer_state&) = delete;
  virtual ~layer_state() = default;

  /// What the layer's name and "(shape)" say in errors.
  KILN_LIBRARY_INLINE std::string expected_shape() const;
  [[noreturn]] void reject(const tensor& x, const std::string& why) const {
    throw value_error("layer " + name + ": " + why + ": expected an input of shape " + expected_shape() + ", got " +
                      x.shape().str());
  }
  /// Checks `x` against the layer's input spec, builds the layer on its first call.
  KILN_LIBRARY_INLINE void prepare(const tensor& x);
  /// The known last dim of `x`, which the weights' shapes need.
  KILN_LIBRARY_INLINE std::int64_t known_last_dim(const tensor& x);
  /// `x` in the weights' dtype (Keras casts the inputs of its layers).
  template <class = void>
  tensor as_input(const tensor& x) const { return !casts_input || x.dtype() == type ? x : cast(x, type); }
  /// Makes weight `weight_name` (named `<layer>/<weight>`), initial value from `init`.
  template <class = void>
  variable add_weight(std::string_view weight_name, const shape& s, const initializer& init, bool trainable = true) {
    variable v(init(s, type), name + "/" + std::string(weight_name));
    weights.emplace_back(v, trainable);
    return v;
  }
  KILN_LIBRARY_INLINE const variable& weight(std::size_t i, std::string_view what) const;

  virtual void build(const tensor& x) = 0;
  virtual tensor call(const tensor& x, const call_options& options) = 0;
  /// Reports what the layer holds beyond its weights (sequential's layers).
  virtual void visit_more(kiln::detail::member_visitor&) const {}
};

}  // namespace detail

/// Any layer: a handle on a layer's state (what `sequential` holds). Calling it
/// builds the layer on the first call, then applies it.
class layer : public module {
 public:
  /// A handle on no layer.
  layer() = default;

  /// The layer applied to `x` (`{.training = true}` for dropout's and batch
  /// normalization's training behaviour).
  template <class = void>
  tensor operator()(const tensor& x, call_options options = {}) const {
    detail::layer_state& s = state();
    s.prepare(x);
    return s.call(s.as_input(x), options);
  }
  /// Whether the layer has been called (and so has its weights).
  KILN_LIBRARY_INLINE bool built() const;
  /// The weights in Keras' order, trainable or not.
  std::vector<variable> weights() const { return variables(); }
  KILN_LIBRARY_INLINE void visit_members(kiln::detail::member_visitor& v) const override;
  /// The state's identity: copies of a layer share it.
  const void* identity() const { return state_.get(); }

 protected:
  explicit layer(std::shared_ptr<detail::layer_state> s) : module(s->name), state_(std::move(s)) {}
  KILN_LIBRARY_INLINE detail::layer_state& state() const;
  std::shared_ptr<detail::layer_state> state_;
};

// ---- dense -------------------------------------------------------------------------

/// Options of layers::dense (Keras' `Dense`).
struct dense_options {
  layers::activation activation{};
  bool use_bias = true;
  initializer kernel_initializer = initializers::glorot_uniform{};
  initializer bias_initializer = initializers::zeros{};
  std::string name{};
};

namespace detail {
template <class = void>
struct dense_state final : layer_state {
  std::int64_t units;
  dense_options options;
  dense_state(std::int64_t u, dense_options o);
  void build(const tensor& x) override;
  tensor call(const tensor& x, const call_options&) override;
};
}  // namespace detail

/// A densely connected layer, `activation(x @ kernel + bias)` over the last axis
/// (Keras' `Dense`; glorot_uniform kernel, zero bias).
/// \code
/// kiln::layers::dense d(16, {.activation = kiln::relu});
/// kiln::tensor y = d(kiln::ones({4, 3}));  // (4, 16); d.kernel() is (3, 16)
/// \endcode
class dense : public layer {
 public:
  template <class = void>
  explicit dense(std::int64_t units, dense_options options = {})
      : layer(std::make_shared<detail::dense_state<>>(units, std::move(options))) {}
  KILN_LIBRARY_INLINE const variable& kernel() const;
  KILN_LIBRARY_INLINE const variable& bias() const;
};

// ---- conv2d ------------------------------------------------------------------------

/// Options of layers::conv2d (Keras' `Conv2D`, channels last).
struct conv2d_options {
  size2 strides = 1;
  std::string padding = "valid";  ///< "valid" or "same"
  layers::activation activation{};
  bool use_bias = true;
  initializer kernel_initializer = initializers::glorot_uniform{};
  initializer bias_initializer = initializers::zeros{};
  std::string name{};
};

namespace detail {
/// "VALID" or "SAME" from Keras' lower-case spelling; anything else is a kiln::value_error.
KILN_LIBRARY_INLINE std::string padding_of(const std::string& layer, const std::string& p);

template <class = void>
struct conv2d_state final : layer_state {
  std::int64_t filters;
  size2 window;
  conv2d_options options;
  std::string padding;
  conv2d_state(std::int64_t f, size2 k, conv2d_options o);
  void build(const tensor& x) override;
  tensor call(const tensor& x, const call_options&) override;
};
}  // namespace detail

/// A 2-D convolution over NHWC inputs with HWIO kernels (Keras' `Conv2D`).
/// \code
/// kiln::layers::conv2d c(100, 3);  // 100 filters of 3 x 3
/// kiln::tensor y = c(kiln::ones({1, 8, 8, 3}));  // (1, 6, 6, 100)
/// \endcode
class conv2d : public layer {
 public:
  template <class = void>
  conv2d(std::int64_t filters, size2 kernel_size, conv2d_options options = {})
      : layer(std::make_shared<detail::conv2d_state<>>(filters, kernel_size, std::move(options))) {}
  KILN_LIBRARY_INLINE const variable& kernel() const;
  KILN_LIBRARY_INLINE const variable& bias() const;
};

// ---- pooling -----------------------------------------------------------------------

/// Options of the pooling layers: strides (the pool size when not given) and padding.
struct pooling_options {
  std::optional<size2> strides = std::nullopt;
  std::string padding = "valid";
  std::string name{};
};

namespace detail {
/// A pooling layer: the max_pool or avg_pool op over the pool_size windows, moved by
/// the strides, with Keras' padding.
template <class = void>
struct pooling_state final : layer_state {
  ops::pool_window window;
  bool average;
  pooling_state(size2 pool, pooling_options o, bool avg);
  void build(const tensor& x) override;
  tensor call(const tensor& x, const call_options&) override;
};
}  // namespace detail

/// The largest value of each pool_size window, moved by the strides (the pool size
/// unless given), with "valid" or "same" padding (Keras' `MaxPooling2D`, NHWC).
/// \code kiln::layers::max_pooling2d pool(2);  pool(kiln::ones({1, 4, 4, 3}));  // (1, 2, 2, 3) \endcode
class max_pooling2d : public layer {
 public:
  template <class = void>
  explicit max_pooling2d(size2 pool_size = 2, pooling_options options = {})
      : layer(std::make_shared<detail::pooling_state<>>(pool_size, std::move(options), false)) {}
};

/// The mean of each pool_size window (Keras' `AveragePooling2D`); with "same" padding
/// a window averages its elements inside the input only, as Keras'.
/// \code kiln::layers::average_pooling2d pool(3, {.strides = 1, .padding = "same"});  pool(kiln::ones({1, 4, 4, 3}));  // (1, 4, 4, 3) \endcode
class average_pooling2d : public layer {
 public:
  template <class = void>
  explicit average_pooling2d(size2 pool_size = 2, pooling_options options = {})
      : layer(std::make_shared<detail::pooling_state<>>(pool_size, std::move(options), true)) {}
};

// ---- flatten and dropout -----------------------------------------------------------

namespace detail {
template <class = void>
struct flatten_state final : layer_state {
  explicit flatten_state(std::string n);
  void build(const tensor&) override {}
  tensor call(const tensor& x, const call_options&) override;
};

template <class = void>
struct dropout_state final : layer_state {
  double rate;
  std::optional<std::uint64_t> seed;
  dropout_state(double r, std::optional<std::uint64_t> s, std::string n);
  void build(const tensor&) override {}
  tensor call(const tensor& x, const call_options& options) override;
};
}  // namespace detail

/// Reshapes each sample to one dim (Keras' `Flatten`).
/// \code kiln::layers::flatten f;  f(kiln::ones({2, 3, 4}));  // (2, 12) \endcode
class flatten : public layer {
 public:
  template <class = void>
  explicit flatten(std::string name = {}) : layer(std::make_shared<detail::flatten_state<>>(std::move(name))) {}
};

/// Options of layers::dropout.
struct dropout_options {
  std::optional<std::uint64_t> seed = std::nullopt;
  std::string name{};
};
/// Zeros a `rate` fraction of its input when training and scales the rest by
/// 1 / (1 - rate) (Keras' `Dropout`); the input itself otherwise.
/// \code kiln::layers::dropout drop(0.5);  drop(kiln::ones({4}), {.training = true});  // 0s and 2s \endcode
class dropout : public layer {
 public:
  template <class = void>
  explicit dropout(double rate, dropout_options options = {})
      : layer(std::make_shared<detail::dropout_state<>>(rate, options.seed, std::move(options.name))) {}
};

// ---- normalization -----------------------------------------------------------------

/// Options of layers::batch_normalization (Keras' `BatchNormalization`, last axis).
struct batch_normalization_options {
  double momentum = 0.99;
  double epsilon = 1e-3;
  bool center = true;
  bool scale = true;
  std::string name{};
};
/// Options of layers::layer_normalization (Keras' `LayerNormalization`, last axis).
struct layer_normalization_options {
  double epsilon = 1e-3;
  bool center = true;
  bool scale = true;
  std::string name{};
};

namespace detail {
/// The arithmetic the normalization layers share (`normalization`, the one
/// specialization): a template on nothing, compiled only where a program normalizes.
template <class Unused>
struct basic_normalization {
  /// `(x - mean) / sqrt(var + epsilon) * gamma + beta`, as tf.nn.batch_normalization
  /// computes it: `x * inv + (beta - mean * inv)` with `inv = gamma / sqrt(var + epsilon)`.
  static tensor normalize(const tensor& x, const tensor& mean, const tensor& var, const std::optional<tensor>& gamma,
                          const std::optional<tensor>& beta, double epsilon);
};
using normalization = basic_normalization<void>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
tensor basic_normalization<Unused>::normalize(const tensor& x, const tensor& mean, const tensor& var,
                                              const std::optional<tensor>& gamma, const std::optional<tensor>& beta,
                                              double epsilon) {
  tensor inv = 1.0 / sqrt(var + epsilon);
  if (gamma) inv = inv * *gamma;
  const tensor shift = beta ? *beta - mean * inv : -(mean * inv);
  return x * inv + shift;
}
#endif

template <class Unused = void>
struct batch_normalization_state final : layer_state {
  batch_normalization_options options;
  explicit batch_normalization_state(batch_normalization_options o);
  void build(const tensor& x) override;
  tensor call(const tensor& x, const call_options& call) override;
};

template <class Unused = void>
struct layer_normalization_state final : layer_state {
  layer_normalization_options options;
  explicit layer_normalization_state(layer_normalization_options o);
  void build(const tensor& x) override;
  tensor call(const tensor& x, const call_options&) override;
};
}  // namespace detail

/// Normalizes each feature (the last axis) by the batch's statistics when training,
/// by its moving statistics otherwise, which training updates by variable
/// assignments, also inside a graph (Keras' `BatchNormalization`; weights gamma, beta,
/// moving_mean, moving_variance, the last two not trainable).
/// \code kiln::layers::batch_normalization bn;  bn(kiln::ones({4, 3}), {.training = true}); \endcode
class batch_normalization : public layer {
 public:
  template <class = void>
  explicit batch_normalization(batch_normalization_options options = {})
      : layer(std::make_shared<detail::batch_normalization_state<>>(std::move(options))) {}
};

/// Normalizes each sample over its last axis (Keras' `LayerNormalization`).
/// \code kiln::layers::layer_normalization ln;  ln(kiln::constant({{1.f, 3.f}}));  // about [[-1 1]] \endcode
class layer_normalization : public layer {
 public:
  template <class = void>
  explicit layer_normalization(layer_normalization_options options = {})
      : layer(std::make_shared<detail::layer_normalization_state<>>(std::move(options))) {}
};

// ---- embedding ---------------------------------------------------------------------

/// Options of layers::embedding (Keras' `Embedding`).
struct embedding_options {
  initializer embeddings_initializer = initializers::random_uniform{};
  std::string name{};
};

namespace detail {
template <class = void>
struct embedding_state final : layer_state {
  std::int64_t input_dim, output_dim;
  embedding_options options;
  embedding_state(std::int64_t in, std::int64_t out, embedding_options o);
  void build(const tensor& ids) override;
  tensor call(const tensor& ids, const call_options&) override;
};
}  // namespace detail

/// Rows of a (input_dim, output_dim) table looked up by integer ids (Keras' `Embedding`).
/// \code kiln::layers::embedding e(10, 4);  e(kiln::constant({{1, 2}}));  // (1, 2, 4) \endcode
class embedding : public layer {
 public:
  template <class = void>
  embedding(std::int64_t input_dim, std::int64_t output_dim, embedding_options options = {})
      : layer(std::make_shared<detail::embedding_state<>>(input_dim, output_dim, std::move(options))) {}
  KILN_LIBRARY_INLINE const variable& embeddings() const;
};

// ---- sequential --------------------------------------------------------------------

namespace detail {
template <class = void>
struct sequential_state final : layer_state {
  std::vector<layer> stack;
  sequential_state(std::vector<layer> l, std::string n);
  void build(const tensor&) override {}
  tensor call(const tensor& x, const call_options& options) override;
  void visit_more(kiln::detail::member_visitor& v) const override;
};
}  // namespace detail

/// Layers applied one after the other (Keras' `Sequential`); its variables are its
/// layers', in order.
/// \code
/// kiln::layers::sequential model({kiln::layers::dense(16, {.activation = kiln::relu}), kiln::layers::dense(1)});
/// kiln::tensor y = model(kiln::ones({8, 3}));  // (8, 1)
/// \endcode
class sequential : public layer {
 public:
  template <class = void>
  sequential(std::vector<layer> stack = {}, std::string name = {})
      : layer(std::make_shared<detail::sequential_state<>>(std::move(stack), std::move(name))) {}
  /// Appends `l`.
  template <class = void>
  void add(layer l) { static_cast<detail::sequential_state<>&>(state()).stack.push_back(std::move(l)); }
  /// The layers, in order.
  template <class = void>
  const std::vector<layer>& layers() const { return static_cast<const detail::sequential_state<>&>(state()).stack; }
};

}  // namespace kiln::layers

#if KILN_DEFINE_LIBRARY
namespace kiln::layers {

KILN_LIBRARY_INLINE activation::operator bool() const {
  return unary_ || with_flag_ || with_number_ || with_axis_ || custom_;
}

}  // namespace kiln::layers

namespace kiln::layers::detail {

KILN_LIBRARY_INLINE std::string unique_name(std::string_view base) {
  static std::mutex mutex;
  static std::map<std::string, int, std::less<>> counts;
  std::lock_guard lock(mutex);
  const int n = counts[std::string(base)]++;
  return n ? std::string(base) + "_" + std::to_string(n) : std::string(base);
}

KILN_LIBRARY_INLINE std::string layer_state::expected_shape() const {
  shape s;
  const int r = rank ? rank : std::max(min_rank, 1);
  for (int d = 0; d < r; ++d) s.push_back(none);
  if (r > 0 && last_dim != none) s[r - 1] = last_dim;
  return (rank ? "" : "at least ") + s.str();
}

KILN_LIBRARY_INLINE void layer_state::prepare(const tensor& x) {
  if (!x.defined()) throw invalid_argument_error("layer " + name + ": the input is an empty tensor");
  if (x.shape().has_known_rank()) {
    if (rank && x.rank() != rank) reject(x, "wrong rank");
    if (min_rank && x.rank() < min_rank) reject(x, "wrong rank");
  }
  if (!built) {
    type = is_floating(x.dtype()) ? x.dtype() : float32;
    build(x);
    built = true;
  } else if (last_dim != none && x.shape().has_known_rank() && x.rank() > 0) {
    const std::int64_t got = x.shape()[x.rank() - 1];
    if (got != none && got != last_dim) reject(x, "wrong last dim");
  }
}

KILN_LIBRARY_INLINE std::int64_t layer_state::known_last_dim(const tensor& x) {
  if (!x.shape().has_known_rank() || x.rank() == 0 || x.shape()[x.rank() - 1] == none)
    reject(x, "the last dim must be known to build the layer");
  return x.shape()[x.rank() - 1];
}

KILN_LIBRARY_INLINE const variable& layer_state::weight(std::size_t i, std::string_view what) const {
  if (!built || i >= weights.size())
    throw value_error("layer " + name + ": " + std::string(what) +
                      " does not exist before the layer is built (called)");
  return weights[i].first;
}

}  // namespace kiln::layers::detail

namespace kiln::layers {

KILN_LIBRARY_INLINE bool layer::built() const { return state_ && state_->built; }

KILN_LIBRARY_INLINE void layer::visit_members(kiln::detail::member_visitor& v) const {
  if (!state_) return;
  for (const auto& [w, trainable] : state_->weights) v.variable(w, trainable);
  state_->visit_more(v);
}

KILN_LIBRARY_INLINE detail::layer_state& layer::state() const {
  if (!state_) throw value_error("layer: the handle holds no layer (default-constructed)");
  return *state_;
}

}  // namespace kiln::layers

namespace kiln::layers::detail {

template <class Unused>
dense_state<Unused>::dense_state(std::int64_t u, dense_options o)
    : layer_state(o.name.empty() ? unique_name("dense") : o.name), units(u), options(std::move(o)) {
  if (units <= 0) throw value_error("layer " + name + ": units must be positive, got " + std::to_string(units));
  min_rank = 2;
}

template <class Unused>
void dense_state<Unused>::build(const tensor& x) {
  last_dim = known_last_dim(x);
  add_weight("kernel", {last_dim, units}, options.kernel_initializer);
  if (options.use_bias) add_weight("bias", {units}, options.bias_initializer);
}

template <class Unused>
tensor dense_state<Unused>::call(const tensor& x, const call_options&) {
  tensor y = matmul(x, weights[0].first);
  if (options.use_bias) y = y + weights[1].first;
  return options.activation(y);
}

}  // namespace kiln::layers::detail

namespace kiln::layers {

KILN_LIBRARY_INLINE const variable& dense::kernel() const { return state().weight(0, "kernel"); }

KILN_LIBRARY_INLINE const variable& dense::bias() const { return state().weight(1, "bias"); }

}  // namespace kiln::layers

namespace kiln::layers::detail {

KILN_LIBRARY_INLINE std::string padding_of(const std::string& layer, const std::string& p) {
  if (p == "valid" || p == "VALID") return "VALID";
  if (p == "same" || p == "SAME") return "SAME";
  throw value_error("layer " + layer + ": padding must be \"valid\" or \"same\", got \"" + p + "\"");
}

template <class Unused>
conv2d_state<Unused>::conv2d_state(std::int64_t f, size2 k, conv2d_options o)
    : layer_state(o.name.empty() ? unique_name("conv2d") : o.name),
      filters(f),
      window(k),
      options(std::move(o)),
      padding(padding_of(name, options.padding)) {
  rank = 4;
}

template <class Unused>
void conv2d_state<Unused>::build(const tensor& x) {
  last_dim = known_last_dim(x);
  add_weight("kernel", {window.h, window.w, last_dim, filters}, options.kernel_initializer);
  if (options.use_bias) add_weight("bias", {filters}, options.bias_initializer);
}

template <class Unused>
tensor conv2d_state<Unused>::call(const tensor& x, const call_options&) {
  tensor y = kiln::conv2d(x, weights[0].first, {options.strides.h, options.strides.w}, padding);
  if (options.use_bias) y = y + weights[1].first;
  return options.activation(y);
}

}  // namespace kiln::layers::detail

namespace kiln::layers {

KILN_LIBRARY_INLINE const variable& conv2d::kernel() const { return state().weight(0, "kernel"); }

KILN_LIBRARY_INLINE const variable& conv2d::bias() const { return state().weight(1, "bias"); }

}  // namespace kiln::layers

namespace kiln::layers::detail {

template <class Unused>
pooling_state<Unused>::pooling_state(size2 pool, pooling_options o, bool avg)
    : layer_state(o.name.empty() ? unique_name(avg ? "average_pooling2d" : "max_pooling2d") : o.name), average(avg) {
  rank = 4;
  const size2 strides = o.strides.value_or(pool);
  if (pool.h < 1 || pool.w < 1 || strides.h < 1 || strides.w < 1)
    throw value_error("layer " + name + ": pool_size and strides must be at least 1, got pool_size (" +
                      std::to_string(pool.h) + ", " + std::to_string(pool.w) + ") and strides (" +
                      std::to_string(strides.h) + ", " + std::to_string(strides.w) + ")");
  window.window_h = pool.h, window.window_w = pool.w, window.stride_h = strides.h, window.stride_w = strides.w;
  window.pad = parse_padding(padding_of(name, o.padding));
}

template <class Unused>
void pooling_state<Unused>::build(const tensor& x) {
  const shape& s = x.shape();
  if (window.pad == ops::padding::valid &&
      ((s[1] != none && s[1] < window.window_h) || (s[2] != none && s[2] < window.window_w)))
    reject(x, "\"valid\" padding needs an input at least as large as the pool (" + std::to_string(window.window_h) +
                  " x " + std::to_string(window.window_w) + ")");
}

template <class Unused>
tensor pooling_state<Unused>::call(const tensor& x, const call_options&) {
  return average ? kiln::detail::apply(ops::avg_pool{window}, x) : kiln::detail::apply(ops::max_pool{window}, x);
}

template <class Unused>
flatten_state<Unused>::flatten_state(std::string n) : layer_state(n.empty() ? unique_name("flatten") : std::move(n)) {
  min_rank = 1;
}

template <class Unused>
tensor flatten_state<Unused>::call(const tensor& x, const call_options&) {
  const shape& s = x.shape();
  if (!s.has_known_rank()) reject(x, "the rank must be known");
  std::int64_t rest = 1;
  for (int d = 1; d < s.rank(); ++d) {
    if (s[d] == none) reject(x, "the dims after the first must be known");
    rest *= s[d];
  }
  return reshape(x, {s[0] == none ? -1 : s[0], rest});
}

template <class Unused>
dropout_state<Unused>::dropout_state(double r, std::optional<std::uint64_t> s, std::string n)
    : layer_state(n.empty() ? unique_name("dropout") : std::move(n)), rate(r), seed(s) {
  if (!(rate >= 0 && rate < 1))
    throw value_error("layer " + name + ": rate must be in [0, 1), got " + std::to_string(rate));
}

template <class Unused>
tensor dropout_state<Unused>::call(const tensor& x, const call_options& options) {
  if (!options.training || rate == 0) return x;
  if (!x.shape().is_fully_defined()) reject(x, "dropout needs a fully defined shape");
  // A stateful draw: new numbers at every call, and at every run of a graph.
  const tensor keep = random::uniform(x.shape(), 0, 1, x.dtype(), seed) >= rate;
  return where(keep, x * (1.0 / (1.0 - rate)), 0.0);
}

template <class Unused>
batch_normalization_state<Unused>::batch_normalization_state(batch_normalization_options o)
    : layer_state(o.name.empty() ? unique_name("batch_normalization") : o.name), options(std::move(o)) {
  min_rank = 1;
}

template <class Unused>
void batch_normalization_state<Unused>::build(const tensor& x) {
  last_dim = known_last_dim(x);
  if (options.scale) add_weight("gamma", {last_dim}, initializers::ones{});
  if (options.center) add_weight("beta", {last_dim}, initializers::zeros{});
  add_weight("moving_mean", {last_dim}, initializers::zeros{}, false);
  add_weight("moving_variance", {last_dim}, initializers::ones{}, false);
}

template <class Unused>
tensor batch_normalization_state<Unused>::call(const tensor& x, const call_options& call) {
  std::size_t k = 0;
  std::optional<tensor> gamma, beta;
  if (options.scale) gamma = weights[k++].first.read_value();
  if (options.center) beta = weights[k++].first.read_value();
  const variable& moving_mean = weights[k].first;
  const variable& moving_variance = weights[k + 1].first;
  if (!call.training)
    return basic_normalization<Unused>::normalize(x, moving_mean, moving_variance, gamma, beta, options.epsilon);
  int_list axes;
  for (int d = 0; d + 1 < x.rank(); ++d) axes.push_back(d);
  const tensor mean = reduce_mean(x, axes), var = reduce_mean(square(x - mean), axes);
  // Keras updates the moving statistics as `moving -= (moving - batch) * (1 - momentum)`;
  // for 4-D inputs it runs TensorFlow's fused kernel, whose batch variance for the
  // update is the unbiased one (n / (n - 1)).
  tensor batch_var = var;
  if (x.rank() == 4) {
    std::int64_t n = 1;
    for (int d = 0; d < 3; ++d) n = x.shape()[d] == none ? none : n * x.shape()[d];
    if (n == none) reject(x, "the batch, height and width must be known in training");
    if (n > 1) batch_var = var * (double(n) / double(n - 1));
  }
  const double decay = 1.0 - options.momentum;
  moving_mean.assign_sub((moving_mean.read_value() - stop_gradient(mean)) * decay);
  moving_variance.assign_sub((moving_variance.read_value() - stop_gradient(batch_var)) * decay);
  return basic_normalization<Unused>::normalize(x, mean, var, gamma, beta, options.epsilon);
}

template <class Unused>
layer_normalization_state<Unused>::layer_normalization_state(layer_normalization_options o)
    : layer_state(o.name.empty() ? unique_name("layer_normalization") : o.name), options(std::move(o)) {
  min_rank = 1;
}

template <class Unused>
void layer_normalization_state<Unused>::build(const tensor& x) {
  last_dim = known_last_dim(x);
  if (options.scale) add_weight("gamma", {last_dim}, initializers::ones{});
  if (options.center) add_weight("beta", {last_dim}, initializers::zeros{});
}

template <class Unused>
tensor layer_normalization_state<Unused>::call(const tensor& x, const call_options&) {
  std::size_t k = 0;
  std::optional<tensor> gamma, beta;
  if (options.scale) gamma = weights[k++].first.read_value();
  if (options.center) beta = weights[k++].first.read_value();
  const tensor mean = reduce_mean(x, -1, true), var = reduce_mean(square(x - mean), -1, true);
  return basic_normalization<Unused>::normalize(x, mean, var, gamma, beta, options.epsilon);
}

template <class Unused>
embedding_state<Unused>::embedding_state(std::int64_t in, std::int64_t out, embedding_options o)
    : layer_state(o.name.empty() ? unique_name("embedding") : o.name),
      input_dim(in),
      output_dim(out),
      options(std::move(o)) {
  casts_input = false;
}

template <class Unused>
void embedding_state<Unused>::build(const tensor& ids) {
  if (!is_integer(ids.dtype()))
    throw type_error("layer " + name + ": ids must be int32 or int64, got " + std::string(kiln::name(ids.dtype())));
  type = float32;
  add_weight("embeddings", {input_dim, output_dim}, options.embeddings_initializer);
}

template <class Unused>
tensor embedding_state<Unused>::call(const tensor& ids, const call_options&) {
  if (!is_integer(ids.dtype()))
    throw type_error("layer " + name + ": ids must be int32 or int64, got " + std::string(kiln::name(ids.dtype())));
  return gather(weights[0].first, ids);
}

}  // namespace kiln::layers::detail

namespace kiln::layers {

KILN_LIBRARY_INLINE const variable& embedding::embeddings() const { return state().weight(0, "embeddings"); }

}  // namespace kiln::layers

namespace kiln::layers::detail {

template <class Unused>
sequential_state<Unused>::sequential_state(std::vector<layer> l, std::string n)
    : layer_state(n.empty() ? unique_name("sequential") : std::move(n)), stack(std::move(l)) {
  casts_input = false;  // each layer casts its own input
}

template <class Unused>
tensor sequential_state<Unused>::call(const tensor& x, const call_options& options) {
  tensor y = x;
  for (const layer& l : stack) y = l(y, options);
  return y;
}

template <class Unused>
void sequential_state<Unused>::visit_more(kiln::detail::member_visitor& v) const {
  for (const layer& l : stack) v.submodule(l);
}

}  // namespace kiln::layers::detail
#endif  // KILN_DEFINE_LIBRARY

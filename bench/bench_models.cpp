/// \file
/// Models (kiln/models/): what a layer costs inside a function, a Keras-style CNN
/// training step, and fit's overhead over the bare step loop.
///
/// - `dense_layer` / `dense_by_hand`: a kiln::function calling layers::dense(256,
///   relu) on a 128 x 256 batch, and the same function written with matmul, add and
///   relu on the layer's own variables: the graphs are equal node for node.
/// - `cnn_train_step`: conv2d 3 x 3 x 32 (ReLU), max-pooling 2, flatten, dense 10;
///   a batch of 32 images of 28 x 28 x 1; sparse categorical cross-entropy from
///   logits; Adam. One kiln::function (forward, tape, update), as Keras' train step.
///   peers_models.py times the same step in tf.function and PyTorch eager.
/// - `fit_10_epochs_of_32_batches`: kiln::fit for 10 epochs over 32 batches of a small
///   MLP (verbose 0), and the same step as a kiln::function called by hand over the
///   same batches for 10 epochs, each traced once: the difference is fit's overhead.

#include "bench_support.hpp"

#include <cmath>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace kiln::bench {
namespace {

namespace layers = kiln::layers;

// ---- a layer inside a function --------------------------------------------------------

struct dense_case {
  layers::dense d{256, {.activation = kiln::relu, .kernel_initializer = kiln::initializers::glorot_uniform({.seed = 1})}};
  tensor x = kiln::random::stateless_uniform({128, 256}, 2);
  kiln::function<std::function<tensor(const tensor&)>> with_layer{[this](const tensor& v) { return d(v); }};
  std::optional<kiln::function<std::function<tensor(const tensor&)>>> by_hand;
  dense_case() {
    (void)with_layer(x);
    const variable kernel = d.kernel(), bias = d.bias();
    by_hand.emplace([kernel, bias](const tensor& v) {
      const tensor y = kiln::matmul(v, kernel);
      return kiln::relu(y + bias);
    });
    (void)(*by_hand)(x);
  }
};

// ---- the CNN training step --------------------------------------------------------------

constexpr std::int64_t cnn_batch = 32;

/// Images and labels as formulas peers_models.py evaluates alike.
float pixel(std::int64_t i) { return float(0.5 + 0.5 * std::sin(0.011 * double(i))); }
std::int32_t label(std::int64_t row) { return std::int32_t(row * 3 % 10); }

struct cnn_case {
  layers::sequential model{
      {layers::conv2d(32, 3, {.activation = kiln::relu, .kernel_initializer = kiln::initializers::glorot_uniform({.seed = 1})}),
       layers::max_pooling2d(2), layers::flatten(),
       layers::dense(10, {.kernel_initializer = kiln::initializers::glorot_uniform({.seed = 2})})}};
  kiln::optimizers::adam opt{{.learning_rate = 1e-3}};
  tensor x, y;
  std::unique_ptr<kiln::function<std::function<tensor(const tensor&, const tensor&)>>> step;
  cnn_case() {
    std::vector<float> px(std::size_t(cnn_batch * 28 * 28));
    for (std::size_t i = 0; i < px.size(); ++i) px[i] = pixel(std::int64_t(i));
    std::vector<std::int32_t> lab(cnn_batch);
    for (std::int64_t r = 0; r < cnn_batch; ++r) lab[std::size_t(r)] = label(r);
    x = kiln::constant(px, kiln::shape{cnn_batch, 28, 28, 1});
    y = kiln::constant(lab, kiln::shape{cnn_batch});
    step = std::make_unique<kiln::function<std::function<tensor(const tensor&, const tensor&)>>>(
        [this](const tensor& a, const tensor& b) {
          kiln::gradient_tape tape;
          const tensor loss =
              kiln::losses::sparse_categorical_crossentropy(b, model(a, {.training = true}), {.from_logits = true});
          const std::vector<variable> vars = model.trainable_variables();
          opt.apply_gradients(tape.gradient(loss, vars), vars);
          return loss;
        });
    (void)(*step)(x, y);
  }
};

// ---- fit against the bare loop ---------------------------------------------------------------

struct fit_case {
  layers::sequential model{{layers::dense(64, {.activation = kiln::relu}), layers::dense(10)}};
  kiln::optimizers::sgd opt{{.learning_rate = 0.01}};
  std::optional<kiln::data::dataset> ds;
  static tensor loss(const tensor& y, const tensor& p) {
    return kiln::losses::sparse_categorical_crossentropy(y, p, {.from_logits = true});
  }
  fit_case() {
    const tensor x = kiln::random::stateless_uniform({1024, 32}, 3);
    const tensor y = kiln::cast(kiln::random::stateless_uniform({1024}, 4, 0, 10, kiln::int32), kiln::int32);
    ds.emplace(kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(32));
  }
};

const bool registered = [] {
  for (int threads : {1, 2}) {
    register_case("dense_layer_in_function", "kiln_layer", threads, [threads](benchmark::State& state) {
      kiln::config::set_num_threads(threads);
      dense_case c;
      for (auto _ : state) benchmark::DoNotOptimize(c.with_layer(c.x));
    })->Unit(benchmark::kMicrosecond);
    register_case("dense_layer_in_function", "kiln_by_hand", threads, [threads](benchmark::State& state) {
      kiln::config::set_num_threads(threads);
      dense_case c;
      for (auto _ : state) benchmark::DoNotOptimize((*c.by_hand)(c.x));
    })->Unit(benchmark::kMicrosecond);
    register_case("cnn_train_step", "kiln", threads, [threads](benchmark::State& state) {
      kiln::config::set_num_threads(threads);
      cnn_case c;
      for (auto _ : state) benchmark::DoNotOptimize((*c.step)(c.x, c.y).item<float>());
    })->Unit(benchmark::kMillisecond);
  }
  // Ten epochs per iteration, each way from a fresh trace: fit traces its step once
  // per call, the loop's function once per iteration.
  register_case("fit_10_epochs_of_32_batches", "kiln_fit", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    fit_case c;
    for (auto _ : state)
      benchmark::DoNotOptimize(kiln::fit(c.model, fit_case::loss, c.opt, *c.ds, {.epochs = 10, .verbose = 0}));
  })->Unit(benchmark::kMillisecond);
  register_case("fit_10_epochs_of_32_batches", "kiln_step_loop", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    fit_case c;
    for (auto _ : state) {
      kiln::function step([&](const tensor& x, const tensor& y) {
        kiln::gradient_tape tape;
        const tensor loss = fit_case::loss(y, c.model(x, {.training = true}));
        const std::vector<variable> vars = c.model.trainable_variables();
        c.opt.apply_gradients(tape.gradient(loss, vars), vars);
        return loss;
      });
      std::vector<double> epoch_loss;
      for (int epoch = 0; epoch < 10; ++epoch) {
        double total = 0;
        for (const auto& e : *c.ds) total += step(e[0], e[1]).item<float>();
        epoch_loss.push_back(total);
      }
      benchmark::DoNotOptimize(epoch_loss);
    }
  })->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
}  // namespace kiln::bench

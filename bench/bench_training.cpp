/// \file
/// One training step of an MLP 784 → 256 → 256 → 10 (ReLU), batch 128, float32, mean
/// sparse softmax cross-entropy, Adam: forward, backward and update. `kiln` is one
/// kiln::function with a gradient tape and kiln::optimizers::adam inside, traced
/// before timing; `libtorch` is PyTorch's C++ front-end (autograd, torch::optim::Adam).
/// The Python peers of the same step (PyTorch eager, tf.function with Keras' Adam,
/// jax.jit) are in peers.py, over the same data, weights and hyperparameters.
///
/// Every peer's first two losses are checked against a plain double-precision loop of
/// the same step (the second loss tells that the update is right too). A process that
/// runs one of these benchmarks alone (run.sh's memory pass) reports the peak memory
/// of setting up and training, as the counter `peak_rss_mb`.

#include "bench_support.hpp"

#if __has_include(<nlohmann/json.hpp>)
#include <kiln/saved_function.hpp>
#define KILN_BENCH_HAS_SAVED_FUNCTIONS 1
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#if KILN_BENCH_HAS_OPENBLAS
#include <cblas.h>
#endif
#if KILN_BENCH_HAS_TORCH
#include <torch/torch.h>
#endif

namespace kiln::bench {
namespace {

constexpr std::int64_t batch = 128, classes = 10;
constexpr std::array<std::int64_t, 4> widths = {784, 256, 256, 10};
constexpr int layers = 3;
constexpr double learning_rate = 1e-3, beta_1 = 0.9, beta_2 = 0.999, epsilon = 1e-7;

// The data and the first weights, as formulas that peers.py evaluates alike.
float pixel(std::int64_t i) { return float(0.5 + 0.5 * std::sin(0.013 * double(i))); }
std::int32_t label(std::int64_t row) { return std::int32_t(row * 7 % classes); }
float initial_weight(int layer, std::int64_t i) { return float(0.05 * std::sin(0.37 * double(i) + layer + 1)); }

std::vector<float> pixels() {
  std::vector<float> x(std::size_t(batch * widths[0]));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = pixel(std::int64_t(i));
  return x;
}
std::vector<std::int32_t> labels() {
  std::vector<std::int32_t> y(batch);
  for (std::int64_t r = 0; r < batch; ++r) y[std::size_t(r)] = label(r);
  return y;
}
std::vector<float> initial_weights(int layer) {
  std::vector<float> w(std::size_t(widths[std::size_t(layer)] * widths[std::size_t(layer) + 1]));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = initial_weight(layer, std::int64_t(i));
  return w;
}

/// Where Adam adds epsilon: Keras (kiln, TensorFlow) adds it to sqrt(v) before the
/// bias corrections, PyTorch and Optax after them. Both are "Adam"; they differ in
/// the second step's loss by about 1e-3 here, where many gradients are near epsilon.
enum class adam_epsilon { keras, pytorch };

/// The losses of the first two steps, in double precision with plain loops: forward,
/// the backward pass written out by hand, and Adam's update.
std::array<float, 2> reference_losses(adam_epsilon convention) {
  const std::vector<float> x32 = pixels();
  const std::vector<std::int32_t> y = labels();
  struct layer_state {
    std::vector<double> w, b, mw, vw, mb, vb;
  };
  std::vector<layer_state> net(layers);
  for (int l = 0; l < layers; ++l) {
    const std::vector<float> w = initial_weights(l);
    const auto out = std::size_t(widths[std::size_t(l) + 1]);
    net[std::size_t(l)] = {std::vector<double>(w.begin(), w.end()), std::vector<double>(out), std::vector<double>(w.size()),
                           std::vector<double>(w.size()),           std::vector<double>(out), std::vector<double>(out)};
  }
  std::array<float, 2> losses{};
  for (int step = 1; step <= 2; ++step) {
    // Forward: activations[l] is layer l's input (batch x widths[l]).
    std::vector<std::vector<double>> act(layers + 1);
    act[0].assign(x32.begin(), x32.end());
    for (int l = 0; l < layers; ++l) {
      const std::int64_t in = widths[std::size_t(l)], out = widths[std::size_t(l) + 1];
      const layer_state& s = net[std::size_t(l)];
      std::vector<double>& z = act[std::size_t(l) + 1];
      z.assign(std::size_t(batch * out), 0.0);
      for (std::int64_t r = 0; r < batch; ++r)
        for (std::int64_t j = 0; j < out; ++j) {
          double sum = s.b[std::size_t(j)];
          for (std::int64_t k = 0; k < in; ++k) sum += act[std::size_t(l)][std::size_t(r * in + k)] * s.w[std::size_t(k * out + j)];
          z[std::size_t(r * out + j)] = l + 1 < layers ? std::max(sum, 0.0) : sum;
        }
    }
    // Loss and its gradient with respect to the logits.
    std::vector<double> dz(std::size_t(batch * classes));
    double loss = 0;
    for (std::int64_t r = 0; r < batch; ++r) {
      const double* logits = &act[layers][std::size_t(r * classes)];
      const double top = *std::max_element(logits, logits + classes);
      double total = 0;
      for (std::int64_t c = 0; c < classes; ++c) total += std::exp(logits[c] - top);
      loss += std::log(total) + top - logits[y[std::size_t(r)]];
      for (std::int64_t c = 0; c < classes; ++c)
        dz[std::size_t(r * classes + c)] = (std::exp(logits[c] - top) / total - (c == y[std::size_t(r)])) / double(batch);
    }
    losses[std::size_t(step - 1)] = float(loss / double(batch));
    // Backward and update, last layer first.
    const double correction_1 = 1 - std::pow(beta_1, step), correction_2 = 1 - std::pow(beta_2, step);
    auto adam = [&](double& w, double& m, double& v, double g) {
      m += (g - m) * (1 - beta_1);
      v += (g * g - v) * (1 - beta_2);
      if (convention == adam_epsilon::keras)
        w -= learning_rate * std::sqrt(correction_2) / correction_1 * m / (std::sqrt(v) + epsilon);
      else
        w -= learning_rate * (m / correction_1) / (std::sqrt(v / correction_2) + epsilon);
    };
    for (int l = layers - 1; l >= 0; --l) {
      const std::int64_t in = widths[std::size_t(l)], out = widths[std::size_t(l) + 1];
      layer_state& s = net[std::size_t(l)];
      const std::vector<double>& a = act[std::size_t(l)];
      std::vector<double> da(std::size_t(batch * in), 0.0);
      for (std::int64_t r = 0; r < batch; ++r)
        for (std::int64_t k = 0; k < in; ++k) {
          double sum = 0;
          for (std::int64_t j = 0; j < out; ++j) sum += dz[std::size_t(r * out + j)] * s.w[std::size_t(k * out + j)];
          da[std::size_t(r * in + k)] = a[std::size_t(r * in + k)] > 0 ? sum : 0.0;  // ReLU's gradient
        }
      for (std::int64_t k = 0; k < in; ++k)
        for (std::int64_t j = 0; j < out; ++j) {
          double g = 0;
          for (std::int64_t r = 0; r < batch; ++r) g += a[std::size_t(r * in + k)] * dz[std::size_t(r * out + j)];
          const auto i = std::size_t(k * out + j);
          adam(s.w[i], s.mw[i], s.vw[i], g);
        }
      for (std::int64_t j = 0; j < out; ++j) {
        double g = 0;
        for (std::int64_t r = 0; r < batch; ++r) g += dz[std::size_t(r * out + j)];
        adam(s.b[std::size_t(j)], s.mb[std::size_t(j)], s.vb[std::size_t(j)], g);
      }
      dz = std::move(da);
    }
  }
  return losses;
}

/// A line of /proc/self/status in MiB (VmRSS: resident now, VmHWM: the peak).
double status_mib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;  // in kB
  return 0;
}

/// Runs a peer's step: checks its first two losses, times the rest, and records the
/// peak memory above what the process held before the peer set up its model.
template <class Setup>
void run_training(benchmark::State& state, adam_epsilon convention, Setup&& setup) {
  const double resident_before = status_mib("VmRSS");
  auto step = setup();  // returns a callable that trains one step and returns the loss
  const std::array<float, 2> expected = reference_losses(convention);
  const std::array<float, 2> first = {step(), step()};
  if (!check_close(state, expected.data(), first.data(), 2, 1e-4f)) return;
  for (auto _ : state) benchmark::DoNotOptimize(step());
  state.counters["peak_rss_mb"] = status_mib("VmHWM") - resident_before;
}

/// kiln's model: its data, weights and optimizer, and the step as one kiln::function.
struct kiln_model {
  kiln::tensor x = kiln::constant(pixels(), kiln::shape{batch, widths[0]});
  kiln::tensor y = kiln::constant(labels(), kiln::shape{batch});
  std::vector<kiln::variable> weights;
  kiln::optimizers::adam optimizer{{.learning_rate = learning_rate, .beta_1 = beta_1, .beta_2 = beta_2,
                                    .epsilon = epsilon}};
  kiln::function<std::function<kiln::tensor(const kiln::tensor&, const kiln::tensor&)>> step{
      [this](const kiln::tensor& x, const kiln::tensor& y) {
        kiln::gradient_tape tape;
        kiln::tensor h = x;
        for (int l = 0; l < layers; ++l) {
          h = kiln::matmul(h, weights[std::size_t(2 * l)]) + weights[std::size_t(2 * l + 1)];
          if (l + 1 < layers) h = kiln::relu(h);
        }
        const kiln::tensor loss = kiln::reduce_mean(kiln::sparse_softmax_cross_entropy(y, h));
        optimizer.apply_gradients(tape.gradient(loss, weights), weights);
        return loss;
      }};

  kiln_model() {
    for (int l = 0; l < layers; ++l) {
      const auto [in, out] = std::pair(widths[std::size_t(l)], widths[std::size_t(l) + 1]);
      weights.emplace_back(kiln::constant(initial_weights(l), kiln::shape{in, out}));
      weights.emplace_back(kiln::zeros({out}));
    }
  }
  kiln_model(const kiln_model&) = delete;
};

void register_kiln(const std::string& case_name, int threads) {
  register_case(case_name, "kiln", threads, [threads](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    run_training(state, adam_epsilon::keras, [] {
      auto m = std::make_shared<kiln_model>();
      return [m]() { return m->step(m->x, m->y).item<float>(); };
    });
  });
}

#if KILN_BENCH_HAS_SAVED_FUNCTIONS
/// The step traced (not run: Adam's slots start at their initial values) and saved.
std::filesystem::path saved_step() {
  static const std::filesystem::path file = [] {
    const std::filesystem::path f = std::filesystem::temp_directory_path() / "kiln_bench_train_step.kiln";
    kiln_model m;
    kiln::save(m.step, f, std::tuple{m.x, m.y});
    return f;
  }();
  return file;
}

/// The step loaded from its file (`kiln_loaded`) beside the function it came from
/// (`kiln`), as a case of their own; and loading it: `kiln::load` against reading the
/// file's bytes alone.
void register_saved(int threads) {
  register_kiln("train_step_saved", threads);
  register_case("train_step_saved", "kiln_loaded", threads, [threads](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    run_training(state, adam_epsilon::keras, [] {
      auto step = std::make_shared<kiln::loaded_function>(kiln::load(saved_step()));
      auto data = std::make_shared<std::pair<kiln::tensor, kiln::tensor>>(
          kiln::constant(pixels(), kiln::shape{batch, widths[0]}), kiln::constant(labels(), kiln::shape{batch}));
      return [step, data]() { return (*step)(data->first, data->second).item<float>(); };
    });
  });
  if (threads != 1) return;
  register_case("load_mlp_step", "kiln", 1, [](benchmark::State& state) {
    for (auto _ : state) benchmark::DoNotOptimize(kiln::load(saved_step()));
    state.counters["file_bytes"] = double(std::filesystem::file_size(saved_step()));
  })->Unit(benchmark::kMicrosecond);
  register_case("load_mlp_step", "read_file", 1, [](benchmark::State& state) {
    for (auto _ : state) {
      std::ifstream is(saved_step(), std::ios::binary);
      std::vector<char> bytes(std::filesystem::file_size(saved_step()));
      is.read(bytes.data(), std::streamsize(bytes.size()));
      benchmark::DoNotOptimize(bytes.data());
    }
  })->Unit(benchmark::kMicrosecond);
}
#endif

#if KILN_BENCH_HAS_OPENBLAS
/// A floor under any step of this model on one thread here, not a step: its eight
/// matrix products (forward, then each layer's weight gradient and, but for the first,
/// its input gradient) by OpenBLAS, then Adam's update of every parameter as one SIMD
/// pass; no bias, activation, loss or gradient arithmetic besides. Not on two threads:
/// there OpenBLAS's threads and an OpenMP update contend for the two cores, as
/// PyTorch's do (see torch_py in bench/RESULTS.md).
void register_floor() {
  register_case("train_step_mlp", "floor_openblas", 1, [](benchmark::State& state) {
    openblas_set_num_threads(1);
    struct product {
      std::int64_t m, n, k;
      bool transpose_a, transpose_b;
    };
    const std::array<product, 8> products = {{
        {batch, 256, 784, false, false},  // x w1
        {batch, 256, 256, false, false},  // h1 w2
        {batch, 10, 256, false, false},   // h2 w3
        {256, 10, batch, true, false},    // h2^T g3
        {batch, 256, 10, false, true},    // g3 w3^T
        {256, 256, batch, true, false},   // h1^T g2
        {batch, 256, 256, false, true},   // g2 w2^T
        {784, 256, batch, true, false},   // x^T g1
    }};
    std::int64_t parameters = 0;
    for (int l = 0; l < layers; ++l) parameters += (widths[std::size_t(l)] + 1) * widths[std::size_t(l) + 1];
    const float_buffer a = make_filled(784 * 256, 0.01f), b = make_filled(784 * 256, 0.02f),
                       c = make_filled(784 * 256, 0.f), w = make_filled(parameters, 0.1f),
                       g = make_filled(parameters, 0.01f), m = make_filled(parameters, 0.f),
                       v = make_filled(parameters, 0.f);
    using B = xsimd::batch<float>;
    const B beta1 = B(float(beta_1)), beta2 = B(float(beta_2)), eps = B(float(epsilon)), one = B(1.f);
    std::int64_t t = 0;
    for (auto _ : state) {
      for (const product& p : products)
        cblas_sgemm(CblasRowMajor, p.transpose_a ? CblasTrans : CblasNoTrans, p.transpose_b ? CblasTrans : CblasNoTrans,
                    int(p.m), int(p.n), int(p.k), 1.f, a.get(), int(p.transpose_a ? p.m : p.k), b.get(),
                    int(p.transpose_b ? p.k : p.n), 0.f, c.get(), int(p.n));
      ++t;
      const B rate = B(float(learning_rate * std::sqrt(1 - std::pow(beta_2, t)) / (1 - std::pow(beta_1, t))));
      std::int64_t i = 0;
      for (; i + std::int64_t(B::size) <= parameters; i += B::size) {
        const B gi = B::load_unaligned(g.get() + i);
        const B mi = beta1 * B::load_unaligned(m.get() + i) + (one - beta1) * gi;
        const B vi = beta2 * B::load_unaligned(v.get() + i) + (one - beta2) * gi * gi;
        mi.store_unaligned(m.get() + i);
        vi.store_unaligned(v.get() + i);
        (B::load_unaligned(w.get() + i) - rate * mi / (xsimd::sqrt(vi) + eps)).store_unaligned(w.get() + i);
      }
      for (; i < parameters; ++i) {
        m[i] = float(beta_1) * m[i] + float(1 - beta_1) * g[i];
        v[i] = float(beta_2) * v[i] + float(1 - beta_2) * g[i] * g[i];
        w[i] -= rate.get(0) * m[i] / (std::sqrt(v[i]) + float(epsilon));
      }
      benchmark::DoNotOptimize(c.get());
      benchmark::DoNotOptimize(w.get());
    }
  });
}
#endif

#if KILN_BENCH_HAS_TORCH
void register_libtorch(int threads) {
  register_case("train_step_mlp", "libtorch", threads, [threads](benchmark::State& state) {
    at::set_num_threads(threads);
#if KILN_BENCH_HAS_OPENBLAS
    openblas_set_num_threads(threads);  // torch's matmuls run in it, as in bench_matmul.cpp
#endif
    run_training(state, adam_epsilon::pytorch, [] {
      struct model {
        torch::Tensor x, y;
        std::vector<torch::Tensor> weights;
        std::unique_ptr<torch::optim::Adam> optimizer;
      };
      auto m = std::make_shared<model>();
      m->x = torch::from_blob(pixels().data(), {batch, widths[0]}).clone();
      m->y = torch::from_blob(labels().data(), {batch}, torch::kInt32).to(torch::kInt64);
      for (int l = 0; l < layers; ++l) {
        const auto [in, out] = std::pair(widths[std::size_t(l)], widths[std::size_t(l) + 1]);
        m->weights.push_back(torch::from_blob(initial_weights(l).data(), {in, out}).clone().requires_grad_());
        m->weights.push_back(torch::zeros({out}).requires_grad_());
      }
      m->optimizer = std::make_unique<torch::optim::Adam>(
          m->weights, torch::optim::AdamOptions(learning_rate).betas({beta_1, beta_2}).eps(epsilon));
      return [m] {
        m->optimizer->zero_grad();
        torch::Tensor h = m->x;
        for (int l = 0; l < layers; ++l) {
          h = torch::addmm(m->weights[std::size_t(2 * l + 1)], h, m->weights[std::size_t(2 * l)]);
          if (l + 1 < layers) h = torch::relu(h);
        }
        torch::Tensor loss = torch::nn::functional::cross_entropy(h, m->y);
        loss.backward();
        m->optimizer->step();
        return loss.template item<float>();
      };
    });
  });
}
#endif

const bool registered = [] {
  for (int threads : {1, 2}) {
    register_kiln("train_step_mlp", threads);
#if KILN_BENCH_HAS_SAVED_FUNCTIONS
    register_saved(threads);
#endif
#if KILN_BENCH_HAS_TORCH
    register_libtorch(threads);
#endif
  }
#if KILN_BENCH_HAS_OPENBLAS
  register_floor();
#endif
  return true;
}();

}  // namespace
}  // namespace kiln::bench

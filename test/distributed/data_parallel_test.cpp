// The data_parallel strategy: K Adam steps of the MLP of bench section 15 on N ranks, each
// fed its part of every global batch, give the weights of one process trained on the
// global batches (to 1e-6; the reference is trained in the same process without the
// strategy or any collective); its variables start from the root's; batches split as
// np.array_split; reports are reduced; its scope is what training loops see. On one rank
// the strategy is the optimizer itself, bit for bit.

#include <kiln/distributed.hpp>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "../support/op_check.hpp"
#include "world.hpp"

namespace {

using kiln::testing::require_throws;
using kiln::testing::world;

// The MLP of bench section 15 (784 → 256 → 256 → 10, ReLU, softmax cross-entropy, Adam),
// with the benchmark's first weights and data formulas.
constexpr std::int64_t widths[4] = {784, 256, 256, 10};
constexpr std::int64_t classes = 10;

struct mlp {
  std::vector<kiln::variable> weights;
  kiln::optimizers::adam adam{{.learning_rate = 1e-3}};

  mlp() {
    for (int l = 0; l < 3; ++l) {
      std::vector<float> w(std::size_t(widths[l] * widths[l + 1]));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(0.05 * std::sin(0.37 * double(i) + l + 1));
      weights.emplace_back(kiln::constant(w, kiln::shape{widths[l], widths[l + 1]}), "kernel_" + std::to_string(l));
      weights.emplace_back(kiln::zeros({widths[l + 1]}), "bias_" + std::to_string(l));
    }
  }
  kiln::tensor loss(const kiln::tensor& x, const kiln::tensor& y) const {
    kiln::tensor h = x;
    for (int l = 0; l < 3; ++l) {
      h = kiln::matmul(h, weights[std::size_t(2 * l)]) + weights[std::size_t(2 * l + 1)];
      if (l < 2) h = kiln::relu(h);
    }
    return kiln::reduce_mean(kiln::sparse_softmax_cross_entropy(y, h));
  }
};

kiln::tensor pixels(std::int64_t rows) {
  std::vector<float> x(static_cast<std::size_t>(rows * widths[0]));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(0.5 + 0.5 * std::sin(0.013 * double(i)));
  return kiln::constant(x, kiln::shape{rows, widths[0]});
}
kiln::tensor labels(std::int64_t rows) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) y[std::size_t(r)] = std::int32_t(r * 7 % classes);
  return kiln::constant(y, kiln::shape{rows});
}

double largest_difference(const std::vector<kiln::variable>& a, const std::vector<kiln::variable>& b) {
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const std::vector<float> x = a[k].read_value().to_vector<float>(), y = b[k].read_value().to_vector<float>();
    REQUIRE(x.size() == y.size());
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(x[i] - y[i])));
  }
  return worst;
}

}  // namespace

TEST_CASE("K Adam steps of the MLP on N ranks, each on its rows of the global batch, give one process's weights") {
  constexpr int steps = 3;
  const std::int64_t n = world().size(), global_batch = 16 * n;
  const kiln::tensor x = pixels(global_batch), y = labels(global_batch);

  mlp single;  // one process, the whole global batch, no strategy
  kiln::function single_step([&](const kiln::tensor& xs, const kiln::tensor& ys) {
    kiln::gradient_tape tape;
    const kiln::tensor loss = single.loss(xs, ys);
    single.adam.apply_gradients(tape.gradient(loss, single.weights), single.weights);
    return loss;
  });

  kiln::distribute::data_parallel strategy;
  mlp replica;
  auto optimizer = strategy.optimizer(replica.adam);
  kiln::function replica_step([&](const kiln::tensor& xs, const kiln::tensor& ys) {
    kiln::gradient_tape tape;
    const kiln::tensor loss = replica.loss(xs, ys);
    optimizer.apply_gradients(tape.gradient(loss, replica.weights), replica.weights);
    return loss;
  });

  const kiln::tensor my_x = strategy.split_batch(x), my_y = strategy.split_batch(y);
  CHECK(my_x.shape() == kiln::shape{16, widths[0]});
  for (int k = 0; k < steps; ++k) {
    const float whole = single_step(x, y).item<float>();
    const float mine = replica_step(my_x, my_y).item<float>();
    // The mean of the ranks' losses is the loss of the global batch.
    CHECK(strategy.reduce(kiln::reduce_op::mean, double(mine)) == Approx(double(whole)).epsilon(1e-5));
  }
  CHECK(largest_difference(single.weights, replica.weights) <= 1e-6);
  CHECK(replica.adam.iterations().read_value().item<std::int64_t>() == steps);
  // Every rank holds the same weights, bit for bit.
  for (const kiln::variable& w : replica.weights) {
    const kiln::tensor root = kiln::broadcast(w.read_value(), 0);
    REQUIRE(std::memcmp(root.raw_data(), w.read_value().raw_data(), std::size_t(root.size()) * sizeof(float)) == 0);
  }
}

TEST_CASE("ranks fed by ds.shard(size, rank).batch(b) train as one process on batches of size * b") {
  const std::int64_t n = world().size(), r = world().rank(), batch = 4, rows = 2 * batch * n;
  kiln::distribute::data_parallel strategy;
  auto data = kiln::data::dataset::from_tensor_slices(std::tuple{pixels(rows), labels(rows)});
  mlp single, replica;
  auto optimizer = strategy.optimizer(replica.adam);
  auto train = [](mlp& m, auto&& apply, const kiln::tensor& xs, const kiln::tensor& ys) {
    kiln::gradient_tape tape;
    const kiln::tensor loss = m.loss(xs, ys);
    apply(tape.gradient(loss, m.weights), m.weights);
  };
  for (auto [xs, ys] : data.batch(batch * n))
    train(single, [&](const auto& g, const auto& v) { single.adam.apply_gradients(g, v); }, xs, ys);
  int batches = 0;
  for (const auto& element : data.shard(n, r).batch(batch)) {
    train(replica, [&](const auto& g, const auto& v) { optimizer.apply_gradients(g, v); }, element[0], element[1]);
    ++batches;
  }
  CHECK(batches == 2);
  CHECK(largest_difference(single.weights, replica.weights) <= 1e-6);
}

TEST_CASE("on one rank the strategy's optimizer is the optimizer itself, bit for bit") {
  kiln::distribute::data_parallel_options options;
  options.group = world().split(world().rank());  // a group of one on every rank
  kiln::distribute::data_parallel strategy(options);
  REQUIRE(strategy.size() == 1);
  kiln::variable a(kiln::constant({0.3f, -0.7f}), "a"), b(kiln::constant({0.3f, -0.7f}), "b");
  kiln::optimizers::adam plain({.learning_rate = 0.1}), wrapped({.learning_rate = 0.1});
  auto opt = strategy.optimizer(wrapped);
  for (int k = 0; k < 3; ++k) {
    const kiln::tensor g = kiln::constant({0.5f * float(k + 1), -1.f});
    plain.apply_gradients({g}, {a});
    opt.apply_gradients({g}, {b});
  }
  CHECK(a.read_value().to_vector<float>() == b.read_value().to_vector<float>());
  CHECK(opt.iterations().read_value().item<std::int64_t>() == 3);
}

TEST_CASE("variables start from the root's values: broadcast_variables, or the optimizer on first sight") {
  const int r = world().rank(), n = world().size();
  kiln::distribute::data_parallel strategy({.group = world(), .root = n - 1});
  kiln::variable v(kiln::fill({3}, float(r)), "v"), label(kiln::constant(std::to_string(r)), "label");
  strategy.broadcast_variables({v, label});
  CHECK(v.read_value().to_vector<float>() == std::vector<float>(3, float(n - 1)));
  CHECK(label.read_value().to_vector<std::string>() == std::vector<std::string>{std::to_string(n - 1)});

  kiln::variable w(kiln::constant(float(10 * r)), "w");
  kiln::optimizers::sgd sgd({.learning_rate = 0.5});
  auto opt = strategy.optimizer(sgd);
  // Each rank's gradient is its rank: the average is (n - 1) / 2.
  opt.apply_gradients({kiln::constant(float(r))}, {w});
  CHECK(w.read_value().item<float>() == float(10 * (n - 1)) - 0.5f * float(n - 1) / 2.f);
  opt.apply_gradients({kiln::constant(1.f)}, {w});  // seen: not broadcast again
  CHECK(w.read_value().item<float>() == float(10 * (n - 1)) - 0.5f * float(n - 1) / 2.f - 0.5f);
}

TEST_CASE("a variable first made while a step is traced cannot start from the root's value: a clear error") {
  const int n = world().size();
  kiln::distribute::data_parallel strategy;
  kiln::optimizers::sgd sgd({.learning_rate = 0.1});
  auto opt = strategy.optimizer(sgd);
  kiln::variable late;
  kiln::function step([&](const kiln::tensor& x) {
    if (!late) late = kiln::variable(x * 2.f, "late");
    opt.apply_gradients({kiln::ones_like(x)}, {late});
    return late.read_value();
  });
  if (n == 1) {
    CHECK(step(kiln::constant(1.f)).item<float>() == Approx(1.9f));
  } else {
    require_throws<kiln::value_error>([&] { return step(kiln::constant(1.f)); },
                                      {"data_parallel", "'late'", "create it before the first call"});
  }
}

TEST_CASE("gradients are averaged in buckets of one dtype, undefined ones left alone") {
  const int r = world().rank(), n = world().size();
  kiln::distribute::data_parallel strategy({.group = world(), .bucket_bytes = 16});  // 4 float32 per bucket
  const std::vector<kiln::tensor> grads{kiln::fill({3}, float(r)), kiln::fill({2}, float(2 * r)), kiln::tensor(),
                                        kiln::fill({2}, double(r)), kiln::fill({5}, float(r + 1))};
  const std::vector<kiln::tensor> mean = strategy.average_gradients(grads);
  REQUIRE(mean.size() == grads.size());
  const float m = float(n - 1) / 2.f;
  CHECK(mean[0].to_vector<float>() == std::vector<float>(3, m));
  CHECK(mean[1].to_vector<float>() == std::vector<float>(2, 2 * m));
  CHECK_FALSE(mean[2].defined());
  CHECK(mean[3].to_vector<double>() == std::vector<double>(2, double(n - 1) / 2.0));
  CHECK(mean[4].to_vector<float>() == std::vector<float>(5, m + 1));
}

TEST_CASE("split_batch and rows cut a global batch as np.array_split") {
  const std::int64_t r = world().rank(), n = world().size();
  kiln::distribute::data_parallel strategy;
  // 10 rows: the first 10 % n ranks get one more.
  const std::int64_t base = 10 / n, extra = 10 % n;
  const std::int64_t begin = r * base + std::min(r, extra), count = base + (r < extra ? 1 : 0);
  CHECK(strategy.rows(10) == std::pair{begin, begin + count});
  const kiln::tensor mine = strategy.split_batch(kiln::reshape(kiln::range(20), {10, 2}));
  std::vector<std::int32_t> expected;
  for (std::int64_t i = 2 * begin; i < 2 * (begin + count); ++i) expected.push_back(std::int32_t(i));
  CHECK(mine.to_vector<std::int32_t>() == expected);
  require_throws<kiln::value_error>([&] { return strategy.split_batch(kiln::constant(1.f)); }, {"split_batch", "()"});
}

TEST_CASE("losses and metrics are reduced across ranks for reporting") {
  const int r = world().rank(), n = world().size();
  kiln::distribute::data_parallel strategy;
  CHECK(strategy.reduce(kiln::reduce_op::mean, double(r)) == double(n - 1) / 2.0);
  CHECK(strategy.reduce(kiln::reduce_op::max, kiln::constant(r)).item<int>() == n - 1);
  CHECK(strategy.reduce(kiln::reduce_op::sum, kiln::constant(1.f)).item<float>() == float(n));
}

TEST_CASE("a strategy's scope is what training loops and checkpoints see (kiln/train/replicas.hpp)") {
  const int r = world().rank(), n = world().size();
  CHECK(kiln::detail::current_replica_context() == nullptr);
  kiln::distribute::data_parallel strategy;
  {
    auto scope = strategy.scope();
    const kiln::detail::replica_context* replicas = kiln::detail::current_replica_context();
    REQUIRE(replicas != nullptr);
    CHECK(replicas->rank == r);
    CHECK(replicas->size == n);
    CHECK(replicas->writes_files() == (r == 0));
    double logs[] = {double(r), 1.0};
    replicas->mean(replicas->self, std::span<double>(logs));
    CHECK(logs[0] == double(n - 1) / 2.0);
    CHECK(logs[1] == 1.0);
    const std::vector<kiln::tensor> grads = replicas->average_gradients(replicas->self, {kiln::constant(float(r))});
    CHECK(grads[0].item<float>() == float(n - 1) / 2.f);
    kiln::variable v(kiln::constant(r), "v");
    replicas->broadcast_variables(replicas->self, {v});
    CHECK(v.read_value().item<int>() == 0);
    replicas->barrier(replicas->self);
  }
  CHECK(kiln::detail::current_replica_context() == nullptr);
}

TEST_CASE("fit under a strategy's scope, each rank on its shard, trains as fit in one process on the global batches") {
  const std::int64_t n = world().size(), r = world().rank(), global_batch = 8, rows = 4 * global_batch;
  std::vector<float> xs, ys;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float a = float(std::sin(0.7 * double(i))), b = float(std::cos(0.3 * double(i)));
    xs.insert(xs.end(), {a, b});
    ys.push_back(2.f * a - b + 0.5f);
  }
  const auto data = kiln::data::dataset::from_tensor_slices(
      std::tuple{kiln::constant(xs, kiln::shape{rows, 2}), kiln::constant(ys, kiln::shape{rows, 1})});
  // Seeded: both models start from the same weights on every rank.
  auto make_model = [](std::uint64_t seed) {
    return kiln::layers::sequential(
        {kiln::layers::dense(4, {.activation = kiln::relu, .kernel_initializer = kiln::initializers::glorot_uniform({.seed = seed})}),
         kiln::layers::dense(1, {.kernel_initializer = kiln::initializers::glorot_uniform({.seed = seed + 1})})});
  };
  kiln::layers::sequential single = make_model(1), replica = make_model(1);
  kiln::distribute::data_parallel strategy;
  kiln::optimizers::adam single_adam({.learning_rate = 0.01}), replica_adam({.learning_rate = 0.01});
  const kiln::history expected = kiln::fit(single, kiln::losses::mean_squared_error<>, single_adam,
                                           data.batch(global_batch), {.epochs = 3, .verbose = 0});
  std::ostringstream progress;
  kiln::history h;
  {
    auto scope = strategy.scope();
    h = kiln::fit(replica, kiln::losses::mean_squared_error<>, replica_adam, data.shard(n, r).batch(global_batch / n),
                  {.epochs = 3, .verbose = 2, .stream = &progress, .timing = false});
  }
  CHECK(largest_difference(single.variables(), replica.variables()) <= 1e-6);
  // The reported loss is the ranks' mean of their batches' losses: with equal batches,
  // the global batches' mean loss.
  for (int e = 0; e < 3; ++e) CHECK(h.loss[std::size_t(e)] == Approx(expected.loss[std::size_t(e)]).epsilon(1e-5));
  CHECK(progress.str().find("Epoch 3/3") != std::string::npos);

  // Unseeded, the ranks' models start apart; fit gives them the root's weights first, so
  // that they end equal.
  kiln::layers::sequential unseeded({kiln::layers::dense(4, {.activation = kiln::relu}), kiln::layers::dense(1)});
  kiln::optimizers::sgd sgd({.learning_rate = 0.01});
  {
    auto scope = strategy.scope();
    kiln::fit(unseeded, kiln::losses::mean_squared_error<>, sgd, data.shard(n, r).batch(global_batch / n),
              {.epochs = 1, .verbose = 0});
  }
  std::vector<kiln::variable> roots;
  for (const kiln::variable& v : unseeded.variables()) roots.emplace_back(v.read_value() * 1.f);  // a copy of this rank's values
  strategy.broadcast_variables(roots);
  CHECK(largest_difference(unseeded.variables(), roots) == 0);
}

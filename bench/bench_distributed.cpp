/// \file
/// Data parallelism over MPI (bench/RESULTS.md section 21): a program run under mpirun,
/// one process per rank, since Google Benchmark times one process.
///
///     mpirun -np 2 build-bench/kiln_bench_distributed --rounds 10 --out bench/results/distributed/distributed.json
///
/// 1. The all-reduce (sum) of the MLP's 269,322 float32 gradients (bench section 15):
///    `mpi_allreduce`, a bare MPI_Allreduce of one buffer into another; `kiln`,
///    kiln::all_reduce of a tensor holding the same values (its agreement, the sum in rank
///    order, a fresh result tensor); `kiln_function`, the same collective as a node of a
///    kiln::function. They alternate call by call after a barrier; a call's time is the
///    slowest rank's; the figure is the median over every call of every round.
/// 2. Training: one step of the MLP (batch 128 per rank, Adam, one kiln thread per rank)
///    on rank 0 alone, the other ranks waiting at a barrier, against every rank at once
///    under kiln::distribute::data_parallel (each rank its own 128 samples, gradients
///    averaged); the two alternate round by round. Samples per second are ranks × 128
///    over the median step time. A third phase, every rank training alone at once (no
///    collective), tells what sharing the machine costs apart from the all-reduce.
///
/// Before timing, the data-parallel step is checked: its loss is the mean of the ranks'
/// losses on the same weights, which a step of one rank on the global batch gives.

#include <kiln/distributed.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::int64_t batch = 128, classes = 10, gradients = 269322;
constexpr std::int64_t widths[4] = {784, 256, 256, 10};

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// The slowest rank's time of each call: the element-wise max over the ranks.
std::vector<double> slowest(std::vector<double> times) {
  MPI_Allreduce(MPI_IN_PLACE, times.data(), int(times.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return times;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct mlp {
  std::vector<kiln::variable> weights;
  kiln::optimizers::adam adam{{.learning_rate = 1e-3}};
  mlp() {
    for (int l = 0; l < 3; ++l) {
      std::vector<float> w(static_cast<std::size_t>(widths[l] * widths[l + 1]));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(0.05 * std::sin(0.37 * double(i) + l + 1));
      weights.emplace_back(kiln::constant(w, kiln::shape{widths[l], widths[l + 1]}));
      weights.emplace_back(kiln::zeros({widths[l + 1]}));
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

// Rank `rank`'s samples: rows [rank * batch, (rank + 1) * batch) of one formula.
std::pair<kiln::tensor, kiln::tensor> samples(std::int64_t rank, std::int64_t rows) {
  std::vector<float> x(static_cast<std::size_t>(rows * widths[0]));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = float(0.5 + 0.5 * std::sin(0.013 * double(i + std::size_t(rank * batch * widths[0]))));
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) y[std::size_t(r)] = std::int32_t((r + rank * batch) * 7 % classes);
  return {kiln::constant(x, kiln::shape{rows, widths[0]}), kiln::constant(y, kiln::shape{rows})};
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string out;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--out") out = argv[i + 1];
  }
  kiln::config::set_num_threads(1);
  const auto& world = kiln::distribute::communicator::world();
  const int rank = world.rank(), size = world.size();
  const std::string load_before = load_average();

  // 1. The all-reduce of 269,322 floats.
  std::vector<float> values(gradients), summed(gradients);
  for (std::int64_t i = 0; i < gradients; ++i) values[std::size_t(i)] = float(rank + 1) * 1e-3f * float(i % 97);
  const kiln::tensor grads = kiln::constant(values, kiln::shape{gradients});
  kiln::function reduce([](const kiln::tensor& g) { return kiln::all_reduce(g); });
  // Checked once: each peer gives the sum.
  MPI_Allreduce(values.data(), summed.data(), int(gradients), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const std::vector<float> by_kiln = kiln::all_reduce(grads).to_vector<float>(), by_function = reduce(grads).to_vector<float>();
  for (std::int64_t i = 0; i < gradients; i += 1001)
    if (std::fabs(by_kiln[std::size_t(i)] - summed[std::size_t(i)]) > 1e-6f * std::fabs(summed[std::size_t(i)]) + 1e-9f ||
        by_function[std::size_t(i)] != by_kiln[std::size_t(i)]) {
      std::fprintf(stderr, "rank %d: the sums differ at %lld\n", rank, (long long)i);
      return 1;
    }
  std::vector<double> bare, eager, graph;
  const int calls = 200;
  for (int round = 0; round < rounds; ++round)
    for (int call = 0; call < calls + 10; ++call) {
      world.barrier();
      auto t = clock_type::now();
      MPI_Allreduce(values.data(), summed.data(), int(gradients), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double a = since(t);
      world.barrier();
      t = clock_type::now();
      kiln::tensor e = kiln::all_reduce(grads);
      const double b = since(t);
      world.barrier();
      t = clock_type::now();
      kiln::tensor f = reduce(grads);
      const double c = since(t);
      if (call >= 10) bare.push_back(a), eager.push_back(b), graph.push_back(c);  // (the first calls warm up)
    }
  const double t_bare = median(slowest(bare)), t_eager = median(slowest(eager)), t_graph = median(slowest(graph));

  // 2. Training: rank 0 alone, then every rank together.
  const auto [x_all, y_all] = samples(0, batch * size);
  const auto [x, y] = samples(rank, batch);
  mlp alone_model, replica_model;
  kiln::function alone([&](const kiln::tensor& xs, const kiln::tensor& ys) {
    kiln::gradient_tape tape;
    const kiln::tensor loss = alone_model.loss(xs, ys);
    alone_model.adam.apply_gradients(tape.gradient(loss, alone_model.weights), alone_model.weights);
    return loss;
  });
  kiln::distribute::data_parallel strategy;
  auto optimizer = strategy.optimizer(replica_model.adam);
  kiln::function together([&](const kiln::tensor& xs, const kiln::tensor& ys) {
    kiln::gradient_tape tape;
    const kiln::tensor loss = replica_model.loss(xs, ys);
    optimizer.apply_gradients(tape.gradient(loss, replica_model.weights), replica_model.weights);
    return loss;
  });
  {  // The check: the ranks' first losses average to one process's loss on the global batch.
    mlp reference;
    const double whole = reference.loss(x_all, y_all).item<float>();
    const double mean = strategy.reduce(kiln::reduce_op::mean, double(together(x, y).item<float>()));
    if (std::fabs(mean - whole) > 1e-5 * std::fabs(whole)) {
      std::fprintf(stderr, "the data-parallel loss %.8g is not the global batch's %.8g\n", mean, whole);
      return 1;
    }
  }
  const int steps = 30;
  std::vector<double> one, all, apart;
  (void)alone(x, y);  // traced before timing
  for (int round = 0; round < rounds; ++round) {
    world.barrier();
    if (rank == 0)
      for (int s = 0; s < steps; ++s) {
        const auto t = clock_type::now();
        (void)alone(x, y).item<float>();
        one.push_back(since(t));
      }
    world.barrier();  // the others wait here, sleeping, while rank 0 trains alone
    for (int s = 0; s < steps; ++s) {
      const auto t = clock_type::now();
      (void)together(x, y).item<float>();
      all.push_back(since(t));
    }
    world.barrier();
    for (int s = 0; s < steps; ++s) {
      const auto t = clock_type::now();
      (void)alone(x, y).item<float>();
      apart.push_back(since(t));
    }
  }
  const double t_one = rank == 0 ? median(one) : 0, t_all = median(slowest(all)), t_apart = median(slowest(apart));
  double t_one_shared = t_one;
  MPI_Bcast(&t_one_shared, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const std::string load_after = load_average();

  if (rank == 0) {
    const double one_rate = double(batch) / t_one_shared, all_rate = double(batch * size) / t_all;
    std::printf("ranks: %d, rounds: %d, load before: %s, after: %s\n", size, rounds, load_before.c_str(), load_after.c_str());
    std::printf("all-reduce of %lld float32: MPI_Allreduce %.1f us, kiln::all_reduce %.1f us (%.3fx), in a function %.1f us (%.3fx)\n",
                (long long)gradients, t_bare * 1e6, t_eager * 1e6, t_eager / t_bare, t_graph * 1e6, t_graph / t_bare);
    std::printf("training step, batch %lld per rank: 1 rank %.3f ms (%.0f samples/s), %d ranks %.3f ms (%.0f samples/s): %.2fx;"
                " %d ranks each alone at once %.3f ms\n",
                (long long)batch, t_one_shared * 1e3, one_rate, size, t_all * 1e3, all_rate, all_rate / one_rate, size,
                t_apart * 1e3);
    if (!out.empty()) {
      std::ofstream f(out);
      char text[2048];
      std::snprintf(text, sizeof text,
                    "{\n  \"cpu\": \"%s, %u cores\",\n  \"ranks\": %d,\n  \"rounds\": %d,\n  \"load_before\": \"%s\",\n  \"load_after\": \"%s\",\n"
                    "  \"allreduce_elements\": %lld,\n  \"allreduce_calls\": %zu,\n"
                    "  \"mpi_allreduce_us\": %.3f,\n  \"kiln_all_reduce_us\": %.3f,\n  \"kiln_function_us\": %.3f,\n"
                    "  \"batch_per_rank\": %lld,\n  \"steps\": %zu,\n  \"one_rank_step_ms\": %.4f,\n  \"all_ranks_step_ms\": %.4f,\n"
                    "  \"one_rank_samples_per_s\": %.1f,\n  \"all_ranks_samples_per_s\": %.1f,\n  \"all_ranks_apart_step_ms\": %.4f\n}\n",
                    cpu_model().c_str(), std::thread::hardware_concurrency(), size, rounds, load_before.c_str(),
                    load_after.c_str(), (long long)gradients, bare.size(), t_bare * 1e6,
                    t_eager * 1e6, t_graph * 1e6, (long long)batch, all.size(), t_one_shared * 1e3, t_all * 1e3, one_rate,
                    all_rate, t_apart * 1e3);
      f << text;
    }
  }
  return 0;
}

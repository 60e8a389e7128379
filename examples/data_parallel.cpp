// Data-parallel training: one process per rank, started by an MPI launcher,
//
//   mpirun -np 2 ./data_parallel
//
// Each rank reads its shard of the data, computes gradients on its batches, and the
// strategy's optimizer averages them over the ranks before the update, so every rank
// keeps the same weights: those one process would reach on batches of 2 × 8 samples.
// Rank 0 prints; examples/expected/data_parallel.txt is its output on 2 ranks. Run
// without a launcher, the program is a world of one and trains on all the data alone.

#include <kiln/distributed.hpp>

#include <cstdio>

int main() {
  kiln::distribute::data_parallel strategy;
  const bool printer = strategy.rank() == 0;
  if (printer) std::printf("training on %d ranks\n", strategy.size());

  // 64 samples of y = 3 x0 - 2 x1 + 1, each rank reading every size()-th one.
  std::vector<float> xs, ys;
  for (int i = 0; i < 64; ++i) {
    const float x0 = float(i % 8) / 8.f, x1 = float(i / 8) / 8.f;
    xs.insert(xs.end(), {x0, x1});
    ys.push_back(3.f * x0 - 2.f * x1 + 1.f);
  }
  const auto data = kiln::data::dataset::from_tensor_slices(
      std::tuple{kiln::constant(xs, kiln::shape{64, 2}), kiln::constant(ys, kiln::shape{64})});
  const auto shard = data.shard(strategy.size(), strategy.rank()).batch(8);

  kiln::variable w(kiln::zeros({2}), "w"), b(kiln::zeros({}), "b");
  strategy.broadcast_variables({w, b});  // every rank starts from rank 0's values
  kiln::optimizers::sgd sgd({.learning_rate = 0.5});
  auto optimizer = strategy.optimizer(sgd);  // averages the gradients over the ranks
  kiln::function train_step([&](const kiln::tensor& x, const kiln::tensor& y) {
    kiln::gradient_tape tape;
    const kiln::tensor prediction = kiln::reduce_sum(x * w, 1) + b;
    const kiln::tensor loss = kiln::reduce_mean(kiln::square(prediction - y));
    optimizer.apply_gradients(tape.gradient(loss, std::vector{w, b}), {w, b});
    return loss;
  });

  for (int epoch = 1; epoch <= 20; ++epoch) {
    double total = 0;
    int batches = 0;
    for (auto [x, y] : shard) total += train_step(x, y).item<float>(), ++batches;
    // Each rank saw its own batches: the mean of the ranks' mean losses is the epoch's.
    const double loss = strategy.reduce(kiln::reduce_op::mean, total / batches);
    if (printer && epoch % 5 == 0) std::printf("epoch %2d: loss %.6f\n", epoch, loss);
  }
  const std::vector<float> weights = w.read_value().to_vector<float>();
  if (printer) std::printf("w = [%.4f, %.4f], b = %.4f\n", weights[0], weights[1], b.read_value().item<float>());
  // Every rank holds the same weights, bit for bit.
  const bool same = kiln::all_reduce(kiln::constant(weights == kiln::broadcast(w.read_value(), 0).to_vector<float>() ? 1 : 0),
                                     kiln::reduce_op::min)
                        .item<int>() == 1;
  if (printer) std::printf("the ranks hold the same weights: %s\n", same ? "yes" : "no");
  return 0;
}

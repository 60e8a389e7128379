// A regression trainer as a new user writes a first one: a 1 -> 16 -> 1 MLP (tanh) fits
// y = sin(3x) on 64 points of [-1, 1], with Adam, 20 epochs of 4 mini-batches, each step
// one kiln::function (forward pass, mean squared error, the gradient tape's backward
// pass and Adam's update, traced once); then it saves the prediction function, which a
// program that has only the file can load and call (kiln::load). The same program in
// libtorch is bench/compile/regression_trainer_torch.cpp: bench/compile_times.sh
// compiles the two side by side.

#include <kiln/saved_function.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

int main() {
  std::vector<float> xs, ys;
  for (int i = 0; i < 64; ++i) {
    xs.push_back(-1.f + 2.f * float(i) / 63.f);
    ys.push_back(std::sin(3.f * xs.back()));
  }
  const kiln::tensor x = kiln::constant(xs, kiln::shape{64, 1});
  const kiln::tensor y = kiln::constant(ys, kiln::shape{64, 1});

  kiln::variable w1(kiln::random::uniform({1, 16}, -1, 1, kiln::float32, 1), "w1");
  kiln::variable b1(kiln::zeros({16}), "b1");
  kiln::variable w2(kiln::random::uniform({16, 1}, -0.5, 0.5, kiln::float32, 2), "w2");
  kiln::variable b2(kiln::zeros({1}), "b2");
  const std::vector<kiln::variable> weights = {w1, b1, w2, b2};
  kiln::optimizers::adam optimizer({.learning_rate = 0.05});

  auto model = [&](const kiln::tensor& in) { return kiln::matmul(kiln::tanh(kiln::matmul(in, w1) + b1), w2) + b2; };
  kiln::function train_step([&](const kiln::tensor& xb, const kiln::tensor& yb) {
    kiln::gradient_tape tape;
    const kiln::tensor loss = kiln::reduce_mean(kiln::square(model(xb) - yb));
    optimizer.apply_gradients(tape.gradient(loss, weights), weights);
    return loss;
  });
  kiln::function predict([&](const kiln::tensor& in) { return model(in); });

  for (int epoch = 1; epoch <= 20; ++epoch) {
    float loss = 0;
    for (int batch = 0; batch < 4; ++batch)
      loss += train_step(kiln::slice(x, {16 * batch, 0}, {16, 1}), kiln::slice(y, {16 * batch, 0}, {16, 1})).item<float>();
    if (epoch % 5 == 0) std::printf("epoch %2d  loss %.3f\n", epoch, double(loss / 4));
  }
  const float at_half = predict(kiln::constant(std::vector<float>{0.5f}, kiln::shape{1, 1})).item<float>();
  std::printf("f(0.5) = %.2f (sin(1.5) = %.2f)\n", double(at_half), std::sin(1.5));

  const std::filesystem::path file = std::filesystem::temp_directory_path() / ("kiln_regression_" + std::to_string(::getpid()) + ".kiln");
  kiln::save(predict, file, kiln::tensor_spec({kiln::none, 1}, kiln::float32));
  std::printf("saved predict\n");
  std::filesystem::remove(file);
}

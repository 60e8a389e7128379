// A small model trained end to end with kiln: an MLP (2 -> 16 -> 2, tanh) learns
// which quadrants of the plane hold class 1 (x * y > 0, a problem no linear model
// solves). Each step is one kiln::function: forward pass, softmax cross-entropy,
// the backward pass built by a gradient tape inside the trace, and Adam's update, all
// one optimized graph traced once. The program prints the loss as it falls and stops
// when the training accuracy passes 95 %.
//
// It also logs the loss and the accuracy of every step for TensorBoard, to logs/mlp or
// the directory given as its argument: `tensorboard --logdir logs` plots them. The
// loss is a summary inside the traced step, written at every call at the optimizer's
// step count; the accuracy is written eagerly.

#include <kiln/kiln.hpp>
#include <kiln/summary.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  auto writer = kiln::summary::create_file_writer(argc > 1 ? argv[1] : "logs/mlp");
  auto logging = writer.as_default();

  // 256 points on a jittered grid of [-1, 1]^2, labelled by quadrant.
  std::vector<float> points;
  std::vector<int> labels;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      const float x = -0.95f + 0.125f * float(i) + 0.01f * float((i * 7 + j * 3) % 5);
      const float y = -0.95f + 0.125f * float(j) - 0.01f * float((i * 5 + j) % 3);
      points.insert(points.end(), {x, y});
      labels.push_back(x * y > 0 ? 1 : 0);
    }
  const kiln::tensor features = kiln::constant(points, kiln::shape{256, 2});
  const kiln::tensor classes = kiln::constant(labels, kiln::shape{256});

  // Weights drawn once with fixed seeds, so every run trains the same model.
  kiln::variable w1(kiln::random::uniform({2, 16}, -1, 1, kiln::float32, 1), "w1");
  kiln::variable b1(kiln::zeros({16}), "b1");
  kiln::variable w2(kiln::random::uniform({16, 2}, -1, 1, kiln::float32, 2), "w2");
  kiln::variable b2(kiln::zeros({2}), "b2");
  const std::vector<kiln::variable> weights = {w1, b1, w2, b2};
  kiln::optimizers::adam optimizer({.learning_rate = 0.01});

  auto logits_of = [&](const kiln::tensor& x) { return kiln::matmul(kiln::tanh(kiln::matmul(x, w1) + b1), w2) + b2; };
  kiln::function train_step(
      [&](const kiln::tensor& x, const kiln::tensor& y) {
        kiln::gradient_tape tape;
        kiln::tensor loss = kiln::reduce_mean(kiln::sparse_softmax_cross_entropy(y, logits_of(x)));
        optimizer.apply_gradients(tape.gradient(loss, weights), weights);
        kiln::summary::scalar("loss", loss, optimizer.iterations());
        return loss;
      },
      {.name = "train_step"});
  kiln::function accuracy([&](const kiln::tensor& x, const kiln::tensor& y) {
    return kiln::reduce_mean(kiln::cast(kiln::argmax(logits_of(x), 1) == kiln::cast(y, kiln::int64), kiln::float32));
  });

  for (int step = 1; step <= 500; ++step) {
    const float loss = train_step(features, classes).item<float>();
    const float acc = accuracy(features, classes).item<float>();
    kiln::summary::scalar("accuracy", acc, step);
    if (step % 10 == 0 || acc > 0.95f) std::printf("step %3d  loss %.3f  accuracy %.1f %%\n", step, loss, 100 * acc);
    if (acc > 0.95f) break;
  }
  std::printf("traced train_step %d time(s)\n", train_step.tracing_count());
}

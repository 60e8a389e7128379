// A small model trained end to end with kiln: an MLP (2 -> 16 -> 2, tanh) learns
// which quadrants of the plane hold class 1 (x * y > 0, a problem no linear model
// solves). The model is two kiln::layers::dense in a kiln::layers::sequential; each
// step is one kiln::function: forward pass, Keras' sparse categorical cross-entropy,
// the backward pass built by a gradient tape inside the trace, and Adam's update, all
// one optimized graph traced once (the layers build their weights in that first
// trace). The program prints the loss as it falls and stops when the training
// accuracy passes 95 %.
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

  // Weights drawn with fixed seeds, so every run trains the same model.
  namespace layers = kiln::layers;
  layers::sequential model({
      layers::dense(16, {.activation = kiln::tanh,
                         .kernel_initializer = kiln::initializers::random_uniform({.minval = -1, .maxval = 1, .seed = 1})}),
      layers::dense(2, {.kernel_initializer = kiln::initializers::random_uniform({.minval = -1, .maxval = 1, .seed = 2})}),
  });
  kiln::optimizers::adam optimizer({.learning_rate = 0.01});

  kiln::function train_step(
      [&](const kiln::tensor& x, const kiln::tensor& y) {
        kiln::gradient_tape tape;
        const kiln::tensor loss = kiln::losses::sparse_categorical_crossentropy(y, model(x), {.from_logits = true});
        const std::vector<kiln::variable> weights = model.trainable_variables();
        optimizer.apply_gradients(tape.gradient(loss, weights), weights);
        kiln::summary::scalar("loss", loss, optimizer.iterations());
        return loss;
      },
      {.name = "train_step"});
  kiln::metrics::sparse_categorical_accuracy accuracy;
  kiln::function evaluate([&](const kiln::tensor& x, const kiln::tensor& y) {
    accuracy.reset_state();
    accuracy.update_state(y, model(x));
    return accuracy.result();
  });

  for (int step = 1; step <= 500; ++step) {
    const float loss = train_step(features, classes).item<float>();
    const float acc = evaluate(features, classes).item<float>();
    kiln::summary::scalar("accuracy", acc, step);
    if (step % 10 == 0 || acc > 0.95f) std::printf("step %3d  loss %.3f  accuracy %.1f %%\n", step, loss, 100 * acc);
    if (acc > 0.95f) break;
  }
  std::printf("traced train_step %d time(s)\n", train_step.tracing_count());
  for (const kiln::variable& w : model.trainable_variables()) std::printf("%s %s\n", w.name().c_str(), w.shape().str().c_str());
}

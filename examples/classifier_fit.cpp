// A small classifier trained with kiln::fit, Keras' `model.fit`: three classes of
// points around three centres in the plane (generated here, the same at every run),
// a kiln::layers::sequential of two dense layers, Adam, Keras' sparse categorical
// cross-entropy from logits and the accuracy metric. fit runs one traced train step
// per batch and one traced test step for the validation data, and prints a progress
// line per epoch (a bar that redraws on a terminal). The times are left out here so
// that the output is the same at every run (`.timing = false`).

#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // 300 points: class k around (cos, sin) of 2 pi k / 3, spread by a fixed pattern.
  std::vector<float> points;
  std::vector<int> labels;
  for (int i = 0; i < 300; ++i) {
    const int k = i % 3;
    const double angle = 2.0 * 3.141592653589793 * k / 3.0;
    const double r = 1.1 * std::sin(0.37 * i), t = 0.7 * std::cos(1.13 * i);
    points.push_back(float(std::cos(angle) + r * std::cos(t * 3)));
    points.push_back(float(std::sin(angle) + r * std::sin(t * 3)));
    labels.push_back(k);
  }
  const kiln::tensor x = kiln::constant(points, kiln::shape{300, 2});
  const kiln::tensor y = kiln::constant(labels, kiln::shape{300});
  // The first 240 points train, the last 60 validate.
  auto train = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::slice(x, {0, 0}, {240, -1}), kiln::slice(y, {0}, {240})})
                   .shuffle(240, 1)
                   .batch(32);
  auto validation = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::slice(x, {240, 0}, {60, -1}), kiln::slice(y, {240}, {60})})
                        .batch(32);

  namespace layers = kiln::layers;
  layers::sequential model({
      layers::dense(16, {.activation = kiln::relu, .kernel_initializer = kiln::initializers::glorot_uniform({.seed = 1})}),
      layers::dense(3, {.kernel_initializer = kiln::initializers::glorot_uniform({.seed = 2})}),
  });
  kiln::optimizers::adam optimizer({.learning_rate = 0.02});
  auto loss = [](const kiln::tensor& labels, const kiln::tensor& logits) {
    return kiln::losses::sparse_categorical_crossentropy(labels, logits, {.from_logits = true});
  };

  const kiln::history history = kiln::fit(model, loss, optimizer, train,
                                          {.epochs = 8,
                                           .validation_data = validation,
                                           .metrics = {kiln::metrics::sparse_categorical_accuracy("accuracy")},
                                           .timing = false});
  std::printf("loss went from %.4f to %.4f in %d epochs\n", history.loss.front(), history.loss.back(), history.epochs());
  std::printf("weights: ");
  for (const kiln::variable& w : model.trainable_variables()) std::printf("%s%s ", w.name().c_str(), w.shape().str().c_str());
  std::printf("\n");
}

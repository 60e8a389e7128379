// kiln::fit: one traced train step and one test step, the history (batch losses
// averaged by batch size, as Keras), metrics, validation data, callbacks that stop
// early, and the progress lines.

#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

using kiln::tensor;
namespace layers = kiln::layers;

/// 96 points of two classes, x0 + x1 > 0, and their labels.
std::pair<tensor, tensor> two_classes() {
  std::vector<float> points;
  std::vector<int> labels;
  for (int i = 0; i < 96; ++i) {
    const float a = float((i * 37) % 96) / 48.f - 1.f, b = float((i * 61) % 96) / 48.f - 1.f;
    points.insert(points.end(), {a, b});
    labels.push_back(a + b > 0 ? 1 : 0);
  }
  return {kiln::constant(points, kiln::shape{96, 2}), kiln::constant(labels, kiln::shape{96})};
}

tensor logits_loss(const tensor& y, const tensor& p) {
  return kiln::losses::sparse_categorical_crossentropy(y, p, {.from_logits = true});
}

}  // namespace

TEST_CASE("fit trains a classifier, one trace per step function, and returns the history") {
  const auto [x, y] = two_classes();
  auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(40);  // 40, 40, 16
  layers::sequential model(
      {layers::dense(8, {.activation = kiln::relu, .kernel_initializer = kiln::initializers::glorot_uniform({.seed = 1})}),
       layers::dense(2, {.kernel_initializer = kiln::initializers::glorot_uniform({.seed = 2})})});
  kiln::optimizers::adam opt({.learning_rate = 0.05});
  kiln::metrics::sparse_categorical_accuracy accuracy;
  std::ostringstream progress;
  const kiln::history h = kiln::fit(model, logits_loss, opt, ds,
                                    {.epochs = 20, .validation_data = ds, .metrics = {accuracy}, .stream = &progress});
  REQUIRE(h.epochs() == 20);
  CHECK(h.loss.back() < h.loss.front() / 3);
  CHECK(h.val_loss.size() == 20);
  CHECK(h.values.at("val_sparse_categorical_accuracy").back() > 0.9);
  CHECK(accuracy.result().item<float>() > 0.9f);  // the caller's metric saw the updates
  CHECK(opt.iterations().read_value().item<std::int64_t>() == 60);
  const std::string text = progress.str();
  CHECK(text.find("Epoch 1/20\n3/3 - ") != std::string::npos);
  CHECK(text.find(" - loss: ") != std::string::npos);
  CHECK(text.find(" - val_sparse_categorical_accuracy: ") != std::string::npos);
  CHECK(text.find("/step\n") != std::string::npos);
}

TEST_CASE("fit's epoch loss is the batch losses' mean weighted by batch size, as Keras'") {
  // A model whose loss does not change (a learning rate of 0): each epoch's loss is
  // the loss over all samples.
  const auto [x, y] = two_classes();
  auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(40);
  layers::dense model(2, {.kernel_initializer = kiln::initializers::glorot_uniform({.seed = 3})});
  kiln::optimizers::sgd opt({.learning_rate = 0.0});
  const kiln::history h = kiln::fit(model, logits_loss, opt, ds, {.epochs = 2, .verbose = 0});
  const double whole = logits_loss(y, model(x)).item<float>();
  CHECK(h.loss[0] == Approx(whole).epsilon(1e-6));
  CHECK(h.loss[1] == Approx(whole).epsilon(1e-6));
}

TEST_CASE("a callback sees each epoch's logs and stops training") {
  const auto [x, y] = two_classes();
  auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(32);
  layers::dense model(2);
  kiln::optimizers::sgd opt({.learning_rate = 0.1});
  std::vector<int> seen;
  const kiln::history h = kiln::fit(model, logits_loss, opt, ds,
                                    {.epochs = 10,
                                     .verbose = 0,
                                     .callbacks = {[&](const kiln::epoch_logs& logs) {
                                       seen.push_back(logs.epoch);
                                       CHECK(logs.loss() > 0);
                                       return logs.epoch < 2;
                                     }}});
  CHECK(seen == std::vector<int>{0, 1, 2});
  CHECK(h.epochs() == 3);
}

TEST_CASE("fit's plain progress lines without times, and its errors") {
  const auto [x, y] = two_classes();
  auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(48);
  layers::dense model(2, {.kernel_initializer = kiln::initializers::zeros{}});
  kiln::optimizers::sgd opt({.learning_rate = 0.0});
  std::ostringstream progress;
  (void)kiln::fit(model, logits_loss, opt, ds, {.epochs = 1, .stream = &progress, .timing = false});
  CHECK(progress.str() == "Epoch 1/1\n2/2 - loss: 0.6931\n");  // zero logits: log 2
  CHECK_THROWS_AS(kiln::fit(model, logits_loss, opt, kiln::data::dataset::from_tensor_slices(x), {.verbose = 0}),
                  kiln::invalid_argument_error);
}

TEST_CASE("fit with a log_dir in a program without kiln/summary.hpp says what it needs") {
  const auto [x, y] = two_classes();
  auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(40);
  layers::sequential model({layers::dense(2)});
  kiln::optimizers::sgd opt;
  const auto fit_with_log = [&] { kiln::fit(model, logits_loss, opt, ds, {.verbose = 0, .log_dir = "logs/never"}); };
  CHECK_THROWS_AS(fit_with_log(), kiln::unavailable_error);
  CHECK_THROWS_WITH(fit_with_log(), Catch::Contains("#include <kiln/summary.hpp>"));
  CHECK_FALSE(std::filesystem::exists("logs/never"));
}

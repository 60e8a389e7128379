// Keras' losses and metrics (kiln/models/losses.hpp, metrics.hpp) against the values
// TensorFlow 2.12's classes give on the same inputs (printed by TensorFlow, copied
// here), eagerly and inside a kiln::function.

#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

using kiln::tensor;

const tensor y_true = kiln::constant({{0.f, 1.f, 0.f}, {1.f, 0.f, 0.f}, {0.f, 0.f, 1.f}, {1.f, 1.f, 0.f}});
const tensor y_prob = kiln::constant({{0.1f, 0.7f, 0.2f}, {0.5f, 0.3f, 0.2f}, {0.05f, 0.05f, 0.9f}, {0.9f, 0.99f, 1e-9f}});
const tensor logits = kiln::constant({{1.f, 2.f, -1.f}, {0.5f, -0.5f, 3.f}, {-2.f, 0.f, 2.f}, {4.f, -4.f, 0.f}});
const tensor labels = kiln::constant({1, 0, 2, 1});
const tensor r_true = kiln::constant({{0.5f, -1.f}, {2.f, 3.f}, {-0.2f, 0.1f}});
const tensor r_pred = kiln::constant({{0.f, -0.4f}, {4.5f, 2.f}, {0.3f, 0.f}});

/// The first three rows of `x`.
tensor first3(const tensor& x) { return kiln::slice(x, {0, 0}, {3, -1}); }

struct loss_case {
  std::string name;
  std::function<tensor(const tensor&, const tensor&)> loss;
  tensor a, b;
  double keras;
};

std::vector<loss_case> cases() {
  using namespace kiln::losses;
  return {
      {"mean_squared_error", [](const tensor& t, const tensor& p) { return mean_squared_error(t, p); }, r_true, r_pred,
       1.3533333539962769},
      {"mean_absolute_error", [](const tensor& t, const tensor& p) { return mean_absolute_error(t, p); }, r_true, r_pred,
       0.8666666150093079},
      {"huber", [](const tensor& t, const tensor& p) { return huber(t, p); }, r_true, r_pred, 0.48916664719581604},
      {"huber delta 0.5", [](const tensor& t, const tensor& p) { return huber(t, p, {.delta = 0.5}); }, r_true, r_pred,
       0.3216666579246521},
      {"binary_crossentropy", [](const tensor& t, const tensor& p) { return binary_crossentropy(t, p); }, y_true, y_prob,
       0.19012510776519775},
      {"binary_crossentropy from logits",
       [](const tensor& t, const tensor& p) { return binary_crossentropy(t, p, {.from_logits = true}); }, y_true, logits,
       0.9522202014923096},
      {"categorical_crossentropy", [](const tensor& t, const tensor& p) { return categorical_crossentropy(t, p); },
       first3(y_true), first3(y_prob), 0.3850608766078949},
      {"categorical_crossentropy from logits",
       [](const tensor& t, const tensor& p) { return categorical_crossentropy(t, p, {.from_logits = true}); },
       first3(y_true), first3(logits), 1.0327860116958618},
      {"sparse_categorical_crossentropy",
       [](const tensor& t, const tensor& p) { return sparse_categorical_crossentropy(t, p); }, labels, y_prob,
       0.45045241713523865},
      {"sparse_categorical_crossentropy from logits",
       [](const tensor& t, const tensor& p) { return sparse_categorical_crossentropy(t, p, {.from_logits = true}); },
       labels, logits, 2.7792093753814697},
      {"sparse_categorical_crossentropy, labels (4, 1)",
       [](const tensor& t, const tensor& p) { return sparse_categorical_crossentropy(t, p, {.from_logits = true}); },
       kiln::reshape(labels, {4, 1}), logits, 2.7792093753814697},
  };
}

}  // namespace

TEST_CASE("losses give the Keras classes' values with the default reduction") {
  for (const loss_case& c : cases()) {
    INFO(c.name);
    const tensor eager = c.loss(c.a, c.b);
    REQUIRE(eager.shape() == kiln::shape{});
    REQUIRE(eager.dtype() == kiln::float32);
    CHECK(eager.item<float>() == Approx(c.keras).epsilon(1e-6));
    kiln::function traced(c.loss);
    CHECK(traced(c.a, c.b).item<float>() == Approx(c.keras).epsilon(1e-6));
  }
}

TEST_CASE("losses have gradients: mean squared error's is 2 (p - t) / n") {
  kiln::gradient_tape tape;
  tape.watch(r_pred);
  const tensor g = tape.gradient(kiln::losses::mean_squared_error(r_true, r_pred), r_pred);
  const std::vector<float> t = r_true.to_vector<float>(), p = r_pred.to_vector<float>(), got = g.to_vector<float>();
  for (std::size_t i = 0; i < t.size(); ++i) CHECK(got[i] == Approx(2.0 * (p[i] - t[i]) / 6.0));
  // The cross-entropy from logits has softmax minus the one-hot label as its gradient.
  kiln::gradient_tape tape2;
  const tensor l = kiln::constant({{0.f, 0.f}});
  tape2.watch(l);
  const tensor g2 = tape2.gradient(kiln::losses::sparse_categorical_crossentropy(kiln::constant({1}), l, {.from_logits = true}), l);
  CHECK(g2.to_vector<float>() == std::vector<float>{0.5f, -0.5f});
}

TEST_CASE("losses reject integer predictions and labels outside the classes") {
  CHECK_THROWS_AS(kiln::losses::mean_squared_error(kiln::constant({1}), kiln::constant({2})), kiln::type_error);
  CHECK_THROWS_AS(kiln::losses::sparse_categorical_crossentropy(kiln::constant({3}), kiln::constant({{0.f, 1.f}}),
                                                                {.from_logits = true}),
                  kiln::invalid_argument_error);
}

TEST_CASE("metrics accumulate as Keras' do, eagerly and inside a function") {
  kiln::metrics::binary_accuracy bacc;
  bacc.update_state(y_true, y_prob);
  CHECK(bacc.result().item<float>() == Approx(0.9166666865348816));
  bacc.reset_state();
  CHECK(bacc.result().item<float>() == 0.f);

  kiln::metrics::sparse_categorical_accuracy acc;
  kiln::function update([&](const tensor& l, const tensor& p) {
    acc.update_state(l, p);
    return acc.result();
  });
  CHECK(update(labels, logits).item<float>() == Approx(0.5));
  // Labels of shape (2, 1) and probabilities: 2 right of 2 more, 4 of 6 in all.
  CHECK(update(kiln::reshape(kiln::slice(labels, {0}, {2}), {2, 1}), kiln::slice(y_prob, {0, 0}, {2, -1})).item<float>() ==
        Approx(0.6666666865348816));
  acc.reset_state();
  CHECK(acc.result().item<float>() == 0.f);
  CHECK(update(labels, logits).item<float>() == Approx(0.5));  // the first trace again, from zero

  kiln::metrics::mean m;
  kiln::function add([&](const tensor& x) { m.update_state(x); });
  add(kiln::constant({1.f, 2.f}));
  add(kiln::constant({6.f}));
  CHECK(m.result().item<float>() == Approx(3.0));
  CHECK(m.variables().size() == 2);
}

TEST_CASE("a metric's count follows a batch dim known only when the graph runs") {
  kiln::metrics::mean m;
  kiln::function add([&](const tensor& x) { m.update_state(x); },
                     {.input_signature = std::vector{kiln::tensor_spec({kiln::none}, kiln::float32)}});
  add(kiln::constant({1.f, 2.f, 3.f}));
  add(kiln::constant({7.f}));
  CHECK(m.result().item<float>() == Approx(13.0 / 4));
}

// kiln::layers against Keras 2.12 (keras_fixtures.hpp, written by
// make_keras_fixtures.py): each layer given Keras' weights computes Keras' output
// within 1e-5, eagerly and in a kiln::function that builds it on its first trace;
// batch normalization's training call updates its moving statistics as Keras' does.
// Then the module tree, input checks, dropout and training through layers.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

#include "keras_fixtures.hpp"

namespace {

using kiln::tensor;
namespace layers = kiln::layers;

tensor to_tensor(const keras_fixtures::array<float>& a) { return kiln::constant(a.values, kiln::shape(std::span(a.dims))); }
tensor to_tensor(const keras_fixtures::array<int>& a) {
  std::vector<std::int32_t> v(a.values.begin(), a.values.end());
  return kiln::constant(v, kiln::shape(std::span(a.dims)));
}

void require_close(const tensor& got, const keras_fixtures::array<float>& keras, double tol = 1e-5) {
  REQUIRE(got.shape() == kiln::shape(std::span(keras.dims)));
  const std::vector<float> v = got.to_vector<float>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(double(v[i]) - double(keras.values[i])) <= tol * std::max(1.0, std::abs(double(keras.values[i]))));
  }
}

/// The kiln layer of each fixture, and whether it is called in training mode.
std::pair<layers::layer, bool> layer_for(const std::string& name) {
  if (name == "dense_relu") return {layers::dense(4, {.activation = kiln::relu}), false};
  if (name == "dense_rank3_gelu") return {layers::dense(2, {.activation = kiln::gelu}), false};
  if (name == "conv2d_valid") return {layers::conv2d(3, 3), false};
  if (name == "conv2d_same_strides2_tanh")
    return {layers::conv2d(2, {3, 2}, {.strides = 2, .padding = "same", .activation = kiln::tanh}), false};
  if (name == "max_pooling2d") return {layers::max_pooling2d(2), false};
  if (name == "average_pooling2d") return {layers::average_pooling2d(2), false};
  if (name == "max_pooling2d_same_strides1") return {layers::max_pooling2d(3, {.strides = 1, .padding = "same"}), false};
  if (name == "average_pooling2d_same_strides2x1")
    return {layers::average_pooling2d({2, 3}, {.strides = layers::size2{2, 1}, .padding = "same"}), false};
  if (name == "max_pooling2d_valid_strides3") return {layers::max_pooling2d(2, {.strides = 3}), false};
  if (name == "flatten") return {layers::flatten(), false};
  if (name == "batch_normalization_inference") return {layers::batch_normalization(), false};
  if (name == "batch_normalization_training") return {layers::batch_normalization(), true};
  if (name == "batch_normalization_4d_training") return {layers::batch_normalization({.momentum = 0.9}), true};
  if (name == "layer_normalization") return {layers::layer_normalization(), false};
  if (name == "embedding") return {layers::embedding(7, 3), false};
  FAIL("no kiln layer for fixture " << name);
  return {};
}

void set_weights(const layers::layer& l, const std::vector<keras_fixtures::array<float>>& weights) {
  const std::vector<kiln::variable> vars = l.weights();
  REQUIRE(vars.size() == weights.size());
  for (std::size_t k = 0; k < vars.size(); ++k) vars[k].assign(to_tensor(weights[k]));
}

void check_weights_after(const layers::layer& l, const keras_fixtures::layer_case& c) {
  if (c.weights_after.empty()) return;
  const std::vector<kiln::variable> vars = l.weights();
  for (std::size_t k = 0; k < vars.size(); ++k) {
    INFO("weight " << vars[k].name());
    require_close(vars[k].read_value(), c.weights_after[k]);
  }
}

}  // namespace

TEST_CASE("every layer computes Keras 2.12's output from Keras' weights") {
  for (const keras_fixtures::layer_case& c : keras_fixtures::layer_cases()) {
    INFO("fixture " << c.name);
    const tensor x = c.ids.dims.empty() ? to_tensor(c.input) : to_tensor(c.ids);
    {
      INFO("eagerly");
      auto [l, training] = layer_for(c.name);
      (void)l(x);  // builds
      set_weights(l, c.weights);
      require_close(l(x, {.training = training}), c.output);
      check_weights_after(l, c);
    }
    {
      INFO("in a kiln::function, built by its first trace");
      auto [l, training] = layer_for(c.name);
      kiln::function f([&, training = training](const tensor& v) { return l(v, {.training = training}); });
      (void)f.get_concrete_function(x);
      REQUIRE(l.built());
      set_weights(l, c.weights);  // read by the graph at its first run
      require_close(f(x), c.output);
      check_weights_after(l, c);
      CHECK(f.tracing_count() == 1);
    }
  }
}

TEST_CASE("a layer adds nothing to the graph of the ops it stands for") {
  layers::dense d(3, {.activation = kiln::relu});
  kiln::function with_layer([&](const tensor& x) { return d(x); });
  const tensor x = kiln::ones({2, 4});
  (void)with_layer(x);
  const kiln::variable kernel = d.kernel(), bias = d.bias();
  kiln::function by_hand([&](const tensor& x) {
    const tensor y = kiln::matmul(x, kernel);
    return kiln::relu(y + bias);
  });
  std::vector<std::string> a, b;
  for (const auto& n : with_layer.get_concrete_function(x).graph().nodes()) a.push_back(std::string(n.op()));
  for (const auto& n : by_hand.get_concrete_function(x).graph().nodes()) b.push_back(std::string(n.op()));
  CHECK(a == b);
}

namespace {
struct block : kiln::module {
  KILN_MODULE(block, (layers::dense, hidden), (layers::batch_normalization, norm), (kiln::variable, scale));
  block() : hidden(4, {.activation = kiln::relu}), norm(), scale(kiln::constant(2.f), "scale") {}
  tensor operator()(const tensor& x, bool training = false) const { return norm(hidden(x), {.training = training}) * scale; }
};
struct model : kiln::module {
  KILN_MODULE(model, (block, body), (std::vector<layers::layer>, heads), (int, calls));
  model() : body(), heads{layers::dense(2), layers::dense(1)}, calls(0) {}
  tensor operator()(const tensor& x, bool training = false) const { return heads[1](heads[0](body(x, training))); }
};
}  // namespace

TEST_CASE("a module finds its variables and submodules among its declared members, in order") {
  model m;
  CHECK(m.name() == "model");
  CHECK(m.variables().size() == 1);  // nothing built yet: the scale alone
  (void)m(kiln::ones({3, 5}));
  std::vector<std::string> names;
  for (const kiln::variable& v : m.variables()) names.push_back(v.name());
  const std::string d0 = m.body.hidden.name(), bn = m.body.norm.name(), h0 = m.heads[0].name(), h1 = m.heads[1].name();
  CHECK(names == std::vector<std::string>{d0 + "/kernel", d0 + "/bias", bn + "/gamma", bn + "/beta", bn + "/moving_mean",
                                          bn + "/moving_variance", "scale", h0 + "/kernel", h0 + "/bias", h1 + "/kernel",
                                          h1 + "/bias"});
  CHECK(m.trainable_variables().size() == 9);
  CHECK(m.non_trainable_variables().size() == 2);
  std::vector<std::string> subs;
  for (const kiln::module* s : m.submodules()) subs.push_back(s->name());
  CHECK(subs == std::vector<std::string>{"block", d0, bn, h0, h1});
  // Layer names are unique in the program, as Keras': dense, dense_1, ...
  CHECK(std::set<std::string>{d0, h0, h1}.size() == 3);
  CHECK(d0.starts_with("dense"));
  // A copy of a module shares its layers' weights (layers are handles).
  model copy = m;
  CHECK(copy.variables()[0].identity() == m.variables()[0].identity());
}

TEST_CASE("a layer called with the wrong rank or last dim raises an error naming it and both shapes") {
  layers::dense d(2, {.name = "probe"});
  (void)d(kiln::ones({4, 3}));
  try {
    (void)d(kiln::ones({4, 5}));
    FAIL("no error");
  } catch (const kiln::value_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("probe") && Catch::Contains("(None, 3)") && Catch::Contains("(4, 5)"));
  }
  try {
    (void)d(kiln::ones({3}));
    FAIL("no error");
  } catch (const kiln::value_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("probe") && Catch::Contains("wrong rank") && Catch::Contains("(3,)"));
  }
  layers::conv2d c(2, 3, {.name = "conv"});
  CHECK_THROWS_WITH(c(kiln::ones({2, 5, 5})), Catch::Contains("conv") && Catch::Contains("(None, None, None, None)") &&
                                                  Catch::Contains("(2, 5, 5)"));
  // Inside a function the error comes at trace time, as Keras' does.
  kiln::function f([&](const tensor& x) { return d(x); });
  CHECK_THROWS_AS(f(kiln::ones({1, 7})), kiln::value_error);
  CHECK_THROWS_AS(layers::embedding(3, 2)(kiln::ones({2})), kiln::type_error);
  CHECK_THROWS_AS(layers::dense(0), kiln::value_error);
  CHECK_THROWS_AS(layers::conv2d(1, 2, {.padding = "full"}), kiln::value_error);
  CHECK_THROWS_AS(layers::dense(2).kernel(), kiln::value_error);  // not built
  layers::max_pooling2d pool(3, {.name = "pool"});
  CHECK_THROWS_WITH(pool(kiln::ones({1, 2, 5, 1})),
                    Catch::Contains("pool") && Catch::Contains("3 x 3") && Catch::Contains("(1, 2, 5, 1)"));
  CHECK_THROWS_WITH(layers::average_pooling2d(2, {.strides = 0, .name = "avg"}),
                    Catch::Contains("avg") && Catch::Contains("strides (0, 0)"));
  CHECK_THROWS_AS(layers::max_pooling2d(2, {.padding = "full"}), kiln::value_error);
}

TEST_CASE("dropout drops a rate of its input when training, with new draws at every run") {
  layers::dropout drop(0.25, {.seed = 3});
  const tensor x = kiln::ones({4000});
  CHECK(drop(x).to_vector<float>() == x.to_vector<float>());
  kiln::function f([&](const tensor& v) { return drop(v, {.training = true}); });
  const std::vector<float> a = f(x).to_vector<float>(), b = f(x).to_vector<float>();
  CHECK(a != b);
  std::size_t zeros = 0;
  for (float v : a) {
    CHECK((v == 0.f || v == Approx(1.f / 0.75f)));
    zeros += v == 0.f;
  }
  CHECK(double(zeros) / 4000 == Approx(0.25).margin(0.03));
}

TEST_CASE("a sequential model trains inside one traced step, and keeps its variables on a retrace") {
  kiln::random::set_seed(7);
  layers::sequential net({layers::dense(8, {.activation = kiln::tanh, .kernel_initializer = kiln::initializers::glorot_uniform({.seed = 1})}),
                          layers::dense(1, {.kernel_initializer = kiln::initializers::glorot_uniform({.seed = 2})})});
  kiln::optimizers::adam opt({.learning_rate = 0.05});
  kiln::function step([&](const tensor& x, const tensor& y) {
    kiln::gradient_tape tape;
    const tensor loss = kiln::losses::mean_squared_error(y, net(x, {.training = true}));
    const std::vector<kiln::variable> vars = net.trainable_variables();
    opt.apply_gradients(tape.gradient(loss, vars), vars);
    return loss;
  });
  const tensor x = kiln::reshape(kiln::range(-1.f, 1.f, 0.125f), {16, 1});
  const tensor y = kiln::square(x);
  const float first = step(x, y).item<float>();
  float last = first;
  for (int i = 0; i < 200; ++i) last = step(x, y).item<float>();
  CHECK(last < first / 10);
  CHECK(net.trainable_variables().size() == 4);
  // Another batch size retraces; the layers are built, so no variable is made.
  CHECK_NOTHROW(step(kiln::slice(x, {0, 0}, {8, -1}), kiln::slice(y, {0, 0}, {8, -1})));
  CHECK(step.tracing_count() == 2);
}

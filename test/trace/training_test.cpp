// Gradients of variables, tapes inside kiln::function and Keras' optimizers. Expected
// values come from the update rules written out here in double, independently of
// kiln's ops.

#include "../support/op_check.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

using kiln::testing::require_throws;

float value_of(const kiln::tensor& t) { return t.item<float>(); }

}  // namespace

TEST_CASE("a tape watches the variables read while it records") {
  kiln::variable v(3.f, "v");
  kiln::variable unused(1.f, "unused");
  kiln::gradient_tape tape({.persistent = true});
  kiln::tensor y = v * v + v;  // two reads of one value: dy/dv = 2v + 1
  CHECK(value_of(tape.gradient(y, v)) == 7.f);
  const std::vector<kiln::tensor> both = tape.gradient(y, std::vector{v, unused});
  REQUIRE(both.size() == 2);
  CHECK(value_of(both[0]) == 7.f);
  CHECK_FALSE(both[1].defined());
  CHECK(value_of(tape.gradient(y, unused, kiln::unconnected_gradients::zero)) == 0.f);
}

TEST_CASE("a view of a tensor on a tape (x[i], reshape) adds its gradient once") {
  const kiln::tensor m = kiln::constant({{0.25, -0.75}, {1.0, 2.0}});
  const kiln::tensor x = kiln::constant({0.5, 1.5});
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(m);
  tape.watch(x);
  // The same row read twice: d/dm = 2 on row 0.
  const kiln::tensor twice = kiln::reduce_sum(m[0]) + kiln::reduce_sum(m[0]);
  CHECK(tape.gradient(twice, m).to_vector<double>() == std::vector<double>{2, 2, 0, 0});
  // A row of a reshape of x, whose buffer, dtype and shape are x's own.
  const kiln::tensor row = kiln::reduce_sum(kiln::reshape(x, {1, 2})[0] * 3.0);
  CHECK(tape.gradient(row, x).to_vector<double>() == std::vector<double>{3, 3});
  // A reshape to x's own shape, beside x.
  const kiln::tensor same = kiln::reduce_sum(kiln::reshape(x, {2}) * 3.0 + x);
  CHECK(tape.gradient(same, x).to_vector<double>() == std::vector<double>{4, 4});
}

TEST_CASE("a variable read before the tape exists is not watched") {
  kiln::variable v(2.f);
  kiln::tensor early = v.read_value() * 1.f;
  kiln::gradient_tape tape;
  kiln::tensor y = early * 3.f;
  CHECK_FALSE(tape.gradient(y, v).defined());
}

TEST_CASE("a tape inside a kiln::function adds the backward pass to the graph") {
  kiln::function derivative([](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    tape.watch(x);
    kiln::tensor y = x * x * x + kiln::tanh(x);
    return tape.gradient(y, x);
  });
  const double x = 0.5;
  const double expected = 3 * x * x + (1 - std::tanh(x) * std::tanh(x));
  CHECK(derivative(kiln::constant(x)).item<double>() == Approx(expected).epsilon(1e-12));
  // The same tape eagerly gives the same value.
  kiln::tensor xe = kiln::constant(x);
  kiln::gradient_tape tape;
  tape.watch(xe);
  kiln::tensor ye = xe * xe * xe + kiln::tanh(xe);
  CHECK(tape.gradient(ye, xe).item<double>() == Approx(expected).epsilon(1e-12));
  // One trace; the backward ops are nodes of it.
  CHECK(derivative(kiln::constant(1.5)).item<double>() ==
        Approx(3 * 1.5 * 1.5 + 1 - std::tanh(1.5) * std::tanh(1.5)).epsilon(1e-12));
  CHECK(derivative.tracing_count() == 1);
  const kiln::graph g = derivative.get_concrete_function(kiln::constant(x)).graph();
  int multiplies = 0;
  for (const auto& n : g.nodes()) multiplies += n.op() == "mul";
  CHECK(multiplies > 2);  // x * x * x has two; its gradient adds more
}

TEST_CASE("variables read inside a kiln::function get gradients there, with broadcasting") {
  kiln::variable w(kiln::constant({1.f, 2.f}), "w");
  kiln::function grad_of_w([&](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    kiln::tensor loss = kiln::reduce_sum(kiln::square(w * x - 1.f));  // x: (3, 2) broadcasts against w: (2,)
    return tape.gradient(loss, w);
  });
  const std::vector<float> xs = {1, 2, 3, 4, 5, 6};
  kiln::tensor g = grad_of_w(kiln::constant(xs, kiln::shape{3, 2}));
  // d/dw_j sum_i (w_j x_ij - 1)^2 = sum_i 2 (w_j x_ij - 1) x_ij
  const float wv[] = {1, 2};
  for (int j = 0; j < 2; ++j) {
    double expected = 0;
    for (int i = 0; i < 3; ++i) expected += 2 * (wv[j] * xs[i * 2 + j] - 1) * xs[i * 2 + j];
    CHECK(g.to_vector<float>()[std::size_t(j)] == Approx(expected));
  }
}

TEST_CASE("sgd follows Keras' update rules") {
  const double lr = 0.1, momentum = 0.9;
  for (const bool nesterov : {false, true}) {
    for (const double mom : {0.0, momentum}) {
      kiln::variable w(2.f);
      kiln::optimizers::sgd opt({.learning_rate = lr, .momentum = mom, .nesterov = nesterov});
      double wd = 2, m = 0;
      for (const double g : {1.0, -0.5, 2.0}) {
        opt.apply_gradients({kiln::constant(float(g))}, {w});
        if (mom == 0) {
          wd -= lr * g;
        } else {
          m = mom * m - lr * g;
          wd += nesterov ? mom * m - lr * g : m;
        }
        CHECK(value_of(w.read_value()) == Approx(wd).epsilon(1e-6));
      }
      CHECK(opt.iterations().read_value().item<std::int64_t>() == 3);
    }
  }
}

TEST_CASE("adam follows Keras' update rules") {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-7;
  kiln::variable w(kiln::constant({2.f, -1.f}));
  kiln::optimizers::adam opt({.learning_rate = lr});
  double wd[] = {2, -1}, m[] = {0, 0}, u[] = {0, 0};
  const double grads[][2] = {{1, -3}, {0.5, 0.25}, {-2, 1}};
  for (int t = 1; t <= 3; ++t) {
    opt.apply_gradients({kiln::constant({float(grads[t - 1][0]), float(grads[t - 1][1])})}, {w});
    for (int j = 0; j < 2; ++j) {
      const double g = grads[t - 1][j];
      m[j] += (g - m[j]) * (1 - b1);
      u[j] += (g * g - u[j]) * (1 - b2);
      const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
      wd[j] -= m[j] * alpha / (std::sqrt(u[j]) + eps);
      CHECK(w.read_value().to_vector<float>()[std::size_t(j)] == Approx(wd[j]).epsilon(1e-5));
    }
  }
  CHECK(opt.iterations().read_value().item<std::int64_t>() == 3);
}

TEST_CASE("adam's three steps at learning rate 0.1 agree with TensorFlow 2.12 to 2 ulp, eagerly and in a function") {
  // TensorFlow 2.12.1: w = tf.Variable([1., -2., 3.]); opt = tf.keras.optimizers.Adam(0.1);
  // three times opt.apply_gradients([(tf.constant([.5, -1.5, 2.]) * w, w)]); the bits of w.
  // Keras subtracts the betas from 1 in double: in float32 the result is 2.1e-6 away.
  const std::uint32_t expected[] = {0x3f339b63, 0xc01338ef, 0x402cd317};
  for (const bool in_function : {false, true}) {
    kiln::variable w(kiln::constant({1.f, -2.f, 3.f}));
    kiln::optimizers::adam opt({.learning_rate = 0.1});
    auto step = [&] { opt.apply_gradients({kiln::constant({0.5f, -1.5f, 2.f}) * w}, {w}); };
    kiln::function traced(step);
    for (int i = 0; i < 3; ++i) in_function ? traced() : step();
    const std::vector<float> got = w.read_value().to_vector<float>();
    for (std::size_t j = 0; j < 3; ++j) {
      INFO("in a function: " << in_function << ", element " << j);
      const auto bits = std::int64_t(std::bit_cast<std::uint32_t>(got[j])), want = std::int64_t(expected[j]);
      CHECK(std::abs(bits - want) <= 2);
    }
  }
}

TEST_CASE("an optimizer made inside a function makes its iterations there, as Keras does") {
  // Made at every call, even plain SGD: the singleton-variable error of variables.
  kiln::variable w(1.f);
  kiln::function each_call([&] {
    kiln::optimizers::sgd opt({.learning_rate = 0.1});
    opt.apply_gradients({kiln::constant(1.f)}, {w});
  });
  try {
    each_call();
    FAIL("an optimizer made at every call ran");
  } catch (const kiln::value_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("only supports singleton variables created on the first call"));
  }
  // Made once, by the first trace, and kept: it trains.
  std::optional<kiln::optimizers::sgd> kept;
  kiln::function once([&] {
    if (!kept) kept.emplace(kiln::optimizers::sgd_options{.learning_rate = 0.1});
    kept->apply_gradients({kiln::constant(1.f)}, {w});
    return w.read_value();
  });
  CHECK(value_of(once()) == Approx(0.9));
  CHECK(value_of(once()) == Approx(0.8));
  CHECK(kept->iterations().read_value().item<std::int64_t>() == 2);
}

TEST_CASE("a train step traced once per optimizer, as the seeds show") {
  auto train_step = [](const kiln::variable& w, const kiln::tensor& x, const kiln::tensor& y, auto& optimizer) {
    kiln::gradient_tape tape;
    kiln::tensor loss = kiln::reduce_sum(kiln::square(w * x - y));
    optimizer.apply_gradients(tape.gradient(loss, std::vector{w}), {w});
  };
  const kiln::tensor x = kiln::constant({-1.f}), y = kiln::constant({2.f});

  // Eagerly, then traced: the same values.
  kiln::variable eager_w(2.f), traced_w(2.f);
  kiln::optimizers::sgd eager_opt({.learning_rate = 0.1, .momentum = 0.5}), traced_opt({.learning_rate = 0.1, .momentum = 0.5});
  kiln::function step(train_step);
  for (int i = 0; i < 4; ++i) {
    train_step(eager_w, x, y, eager_opt);
    step(traced_w, x, y, traced_opt);
    CHECK(value_of(traced_w.read_value()) == Approx(value_of(eager_w.read_value())).epsilon(1e-6));
  }
  CHECK(step.tracing_count() == 1);
  CHECK(traced_opt.iterations().read_value().item<std::int64_t>() == 4);

  // A second optimizer would create its slots in a later trace.
  kiln::optimizers::sgd second({.learning_rate = 0.1, .momentum = 0.5});
  try {
    step(traced_w, x, y, second);
    FAIL("a second optimizer's slot variables were created by a later trace");
  } catch (const kiln::value_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("only supports singleton variables created on the first call"));
  }

  // One concrete function per optimizer works: w moves towards y / x = -2.
  kiln::optimizers::adam a({.learning_rate = 0.1}), b({.learning_rate = 0.05});
  kiln::variable w(2.f);
  auto step_a = kiln::function(train_step).get_concrete_function(w, x, y, a);
  auto step_b = kiln::function(train_step).get_concrete_function(w, x, y, b);
  for (int i = 0; i < 10; ++i) (i % 2 == 0 ? step_a : step_b)(w, x, y);
  CHECK(a.iterations().read_value().item<std::int64_t>() == 5);
  CHECK(b.iterations().read_value().item<std::int64_t>() == 5);
  CHECK(value_of(w.read_value()) < 2.f - 0.5f);
}

TEST_CASE("a gradient of another shape than its variable's is refused before any variable changes") {
  // A scalar gradient would broadcast over the variable, silently (Keras 2.12 lets it).
  kiln::variable first(kiln::constant({1.f, 2.f})), second(kiln::constant({1.f, 2.f, 3.f}));
  kiln::optimizers::sgd sgd({.learning_rate = 0.1});
  require_throws<kiln::invalid_argument_error>([&] { sgd.apply_gradients({kiln::constant(1.f)}, {first}); },
                                               {"SGD.apply_gradients", "float32 (2,)", "float32 ()"});
  kiln::optimizers::adam adam({.learning_rate = 0.1});
  require_throws<kiln::invalid_argument_error>([&] { adam.apply_gradients({kiln::constant({1.f})}, {second}); },
                                               {"Adam.apply_gradients", "(3,)", "(1,)"});
  // A good gradient for the first variable and a bad one for the second: nothing moves.
  require_throws<kiln::invalid_argument_error>(
      [&] { adam.apply_gradients({kiln::constant({1.f, 1.f}), kiln::constant({1.f, 1.f})}, {first, second}); },
      {"(3,)", "(2,)"});
  require_throws<kiln::invalid_argument_error>(
      [&] { adam.apply_gradients({kiln::constant({1.f, 1.f}), kiln::constant({1.0, 1.0, 1.0})}, {first, second}); },
      {"float32 (3,)", "float64 (3,)"});
  CHECK(first.read_value().to_vector<float>() == std::vector{1.f, 2.f});
  CHECK(second.read_value().to_vector<float>() == std::vector{1.f, 2.f, 3.f});
  CHECK(adam.iterations().read_value().item<std::int64_t>() == 0);
  CHECK(sgd.iterations().read_value().item<std::int64_t>() == 0);
}

TEST_CASE("a tape asked for the gradient of an empty tensor, or with respect to one, says so") {
  kiln::tensor x = kiln::constant(3.f);
  kiln::variable v(1.f);
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(x);
  kiln::tensor y = x * v;
  require_throws<kiln::invalid_argument_error>([&] { return tape.gradient(kiln::tensor(), x); }, {"target", "empty"});
  require_throws<kiln::invalid_argument_error>([&] { return tape.gradient(y, kiln::tensor()); }, {"source 0", "empty"});
  require_throws<kiln::invalid_argument_error>([&] { return tape.gradient(kiln::tensor(), std::vector{v}); }, {"target", "empty"});
  require_throws<kiln::invalid_argument_error>([&] { return tape.gradient(y, std::vector{kiln::variable()}); },
                                               {"variable", "empty"});
  CHECK(tape.gradient(y, x).item<float>() == 1.f);
}

TEST_CASE("apply_gradients checks its arguments") {
  kiln::variable w(1.f), n(1);
  kiln::optimizers::sgd opt;
  CHECK_THROWS_AS(opt.apply_gradients({kiln::constant(1.f), kiln::constant(1.f)}, {w}), kiln::invalid_argument_error);
  CHECK_THROWS_AS(opt.apply_gradients({kiln::tensor()}, {w}), kiln::value_error);
  CHECK_THROWS_AS(opt.apply_gradients({kiln::constant(1)}, {n}), kiln::type_error);
  CHECK_THROWS_AS(opt.apply_gradients({kiln::constant({1.f, 2.f})}, {w}), kiln::invalid_argument_error);
  CHECK_THROWS_AS(kiln::optimizers::sgd({.momentum = 1.5}), kiln::invalid_argument_error);
}

TEST_CASE("a kiln::function called under a tape is differentiable, its backward pass traced once") {
  // The seeds' "Functions have gradients": tape.gradient(add(v, 1.0), v) is 1.
  kiln::function add([](const kiln::tensor& a, const kiln::tensor& b) { return a + b; }, {.name = "add"});
  kiln::variable v(1.f);
  {
    kiln::gradient_tape tape;
    kiln::tensor result = add(v, kiln::constant(1.f));
    CHECK(value_of(tape.gradient(result, v)) == 1.f);
  }

  // A dense layer's input, weights and a variable it reads, against the formulas.
  kiln::variable scale(2.0, "scale");
  kiln::function layer([&](const kiln::tensor& x, const kiln::tensor& w) { return kiln::tanh(kiln::matmul(x, w)) * scale; },
                       {.name = "layer"});
  const std::vector<double> xv = {0.5, -1.0, 0.25, 2.0}, wv = {0.1, 0.2, -0.3, 0.4};  // x: (2, 2), w: (2, 2)
  for (int round = 0; round < 2; ++round) {
    kiln::tensor x = kiln::constant(xv, kiln::shape{2, 2}), w = kiln::constant(wv, kiln::shape{2, 2});
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(x);
    tape.watch(w);
    kiln::tensor loss = kiln::reduce_sum(layer(x, w) * 3.0);
    const std::vector<double> gx = tape.gradient(loss, x).to_vector<double>();
    const std::vector<double> gw = tape.gradient(loss, w).to_vector<double>();
    const double gs = tape.gradient(loss, scale).item<double>();
    // z = x w, loss = sum(3 * scale * tanh(z)): d loss / d z = 6 (1 - tanh(z)^2).
    auto z = [&](int r, int c) { return xv[std::size_t(r * 2)] * wv[std::size_t(c)] + xv[std::size_t(r * 2 + 1)] * wv[std::size_t(2 + c)]; };
    auto dz = [&](int r, int c) { return 6.0 * (1 - std::tanh(z(r, c)) * std::tanh(z(r, c))); };
    double expected_gs = 0;
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        expected_gs += 3.0 * std::tanh(z(r, c));
        double ex = 0, ew = 0;  // d/dx_rc = sum_j dz_rj w_cj; d/dw_rc = sum_i x_ir dz_ic
        for (int j = 0; j < 2; ++j) ex += dz(r, j) * wv[std::size_t(c * 2 + j)];
        for (int i = 0; i < 2; ++i) ew += xv[std::size_t(i * 2 + r)] * dz(i, c);
        CHECK(gx[std::size_t(r * 2 + c)] == Approx(ex).epsilon(1e-12));
        CHECK(gw[std::size_t(r * 2 + c)] == Approx(ew).epsilon(1e-12));
      }
    CHECK(gs == Approx(expected_gs).epsilon(1e-12));
  }
  CHECK(layer.tracing_count() == 1);
}

TEST_CASE("a tape inside a function differentiates through a function it calls") {
  kiln::function cube([](const kiln::tensor& x) { return x * x * x; }, {.name = "cube"});
  kiln::function slope([&](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    tape.watch(x);
    return tape.gradient(cube(x) + x, x);
  });
  CHECK(value_of(slope(kiln::constant(2.f))) == Approx(3 * 4 + 1));
}

TEST_CASE("nested tapes give second derivatives through a function") {
  kiln::function cube([](const kiln::tensor& x) { return x * x * x; }, {.name = "cube"});
  kiln::tensor x = kiln::constant(1.5);
  kiln::gradient_tape outer;
  outer.watch(x);
  kiln::tensor dy;
  {
    kiln::gradient_tape inner;
    inner.watch(x);
    dy = inner.gradient(cube(x), x);
  }
  CHECK(dy.item<double>() == Approx(3 * 1.5 * 1.5));
  CHECK(outer.gradient(dy, x).item<double>() == Approx(6 * 1.5));
}

TEST_CASE("gradients inside a function equal eager gradients, op for op") {
  // Each formula runs eagerly under a tape and as backward nodes of a trace.
  const std::vector<std::function<kiln::tensor(const kiln::tensor&)>> models = {
      [](const kiln::tensor& x) { return kiln::reduce_max(kiln::square(x), 1); },
      [](const kiln::tensor& x) { return kiln::reduce_min(x * x * 0.5, 0); },
      [](const kiln::tensor& x) { return kiln::concat({kiln::tanh(x), x * 2.0}, 1); },
      [](const kiln::tensor& x) { return kiln::stack({x, kiln::sigmoid(x)}, 0); },
      [](const kiln::tensor& x) { return kiln::slice(kiln::exp(x), {1, 0}, {1, -1}); },
      [](const kiln::tensor& x) { return kiln::matmul(x, kiln::transpose(x)) / kiln::reduce_mean(x * x); },
      [](const kiln::tensor& x) { return kiln::reshape(kiln::maximum(x, 0.25) - kiln::pow(kiln::abs(x) + 1.0, 1.5), {3, 2}); },
  };
  const kiln::tensor x = kiln::constant({{0.5, -1.25, 2.0}, {1.5, 0.75, -0.3}});
  for (std::size_t m = 0; m < models.size(); ++m) {
    INFO("model " << m);
    const auto& f = models[m];
    kiln::gradient_tape tape;
    tape.watch(x);
    const std::vector<double> eager = tape.gradient(f(x), x).to_vector<double>();
    kiln::function traced([&](const kiln::tensor& v) {
      kiln::gradient_tape inner;
      inner.watch(v);
      return inner.gradient(f(v), v);
    });
    const std::vector<double> graph = traced(x).to_vector<double>();
    REQUIRE(graph.size() == eager.size());
    for (std::size_t i = 0; i < eager.size(); ++i) CHECK(graph[i] == Approx(eager[i]).epsilon(1e-14));
  }
}

TEST_CASE("a function with effects called under a tape runs them once, in program order") {
  kiln::variable counter(0.0, "counter"), scale(2.0, "scale");
  kiln::function step([&](const kiln::tensor& x) {
    counter.assign_add(1.0);
    const kiln::tensor before = scale.read_value();
    scale.assign(before * 3.0);
    return x * before * scale.read_value();  // x * 2 * 6
  });
  const kiln::tensor x = kiln::constant(0.5);
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(x);
  const kiln::tensor y = step(x);
  CHECK(y.item<double>() == 6.0);
  CHECK(counter.read_value().item<double>() == 1.0);
  CHECK(scale.read_value().item<double>() == 6.0);
  CHECK(tape.gradient(y, x).item<double>() == 12.0);
  // Two reads of scale feed y: x * 6 through the first, x * 2 through the last.
  CHECK(tape.gradient(y, scale).item<double>() == 4.0);
  step(x);
  CHECK(counter.read_value().item<double>() == 2.0);
  CHECK(step.tracing_count() == 1);
}

TEST_CASE("gradients do not flow through an assignment, as in TensorFlow") {
  const kiln::tensor x = kiln::constant(1.5);
  kiln::variable v(0.0, "v"), w(1.0, "w");
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(x);
  v.assign(x * 3.0);
  w.assign_add(x);
  const kiln::tensor y = v * 2.0 + w * 5.0;
  CHECK(y.item<double>() == 4.5 * 2 + 2.5 * 5);
  CHECK_FALSE(tape.gradient(y, x).defined());
  CHECK(tape.gradient(y, v).item<double>() == 2.0);
  CHECK(tape.gradient(y, w).item<double>() == 5.0);
}

TEST_CASE("gradients flow through kiln::cond, through the branch taken") {
  kiln::variable w(3.0, "w");
  kiln::function slope([&](const kiln::tensor& x) {
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(x);
    // x > 0: w * x * x; else: sin-free -x * 2 (w unused there)
    kiln::tensor y = kiln::cond(x > 0.0, [&] { return w * x * x; }, [&] { return x * -2.0; });
    kiln::tensor z = y * 0.5 + x;
    return std::tuple{tape.gradient(z, x), tape.gradient(z, w, kiln::unconnected_gradients::zero)};
  });
  {
    const auto [dx, dw] = slope(kiln::constant(2.0));
    CHECK(dx.item<double>() == Approx(0.5 * 2 * 3.0 * 2.0 + 1));  // d/dx (w x^2 / 2 + x)
    CHECK(dw.item<double>() == Approx(0.5 * 2.0 * 2.0));           // d/dw (w x^2 / 2)
  }
  {
    const auto [dx, dw] = slope(kiln::constant(-1.5));
    CHECK(dx.item<double>() == Approx(0.5 * -2.0 + 1));
    CHECK(dw.item<double>() == 0.0);
  }
  CHECK(slope.tracing_count() == 1);
}

TEST_CASE("a function with a cond called under an eager tape is differentiated through the branch taken") {
  kiln::variable w(3.0, "w"), calls(0.0, "calls");
  kiln::function pure([&](const kiln::tensor& x) {
    return kiln::cond(x > 0.0, [&] { return w * x * x; }, [&] { return x * -2.0; });
  });
  // Effects make the call run op by op under the tape; the cond runs as one node.
  kiln::function counted([&](const kiln::tensor& x) {
    calls.assign_add(1.0);
    return kiln::cond(x > 0.0, [&] { return w * x * x; }, [&] { return x * -2.0; });
  });
  auto check = [&](auto& f, const char* kind) {
    for (const double at : {2.0, -1.5}) {
      INFO("x = " << at << ", " << kind);
      const kiln::tensor x = kiln::constant(at);
      kiln::gradient_tape tape({.persistent = true});
      tape.watch(x);
      const kiln::tensor y = f(x);
      CHECK(tape.gradient(y, x).item<double>() == Approx(at > 0 ? 2 * 3.0 * at : -2.0));
      const kiln::tensor dw = tape.gradient(y, w, kiln::unconnected_gradients::zero);
      CHECK(dw.item<double>() == Approx(at > 0 ? at * at : 0.0));
    }
  };
  check(pure, "pure");
  check(counted, "with effects");
  CHECK(calls.read_value().item<double>() == 2.0);
}

TEST_CASE("loops: eager, in a function under an eager tape and with a tape inside a function, the same gradient") {
  auto cube = [](const kiln::tensor& x) {
    return std::get<1>(kiln::while_loop([](const kiln::tensor& i, const kiln::tensor&) { return i < 3; },
                                        [&](const kiln::tensor& i, const kiln::tensor& v) { return std::tuple{i + 1, v * x}; },
                                        kiln::constant(0), kiln::constant(1.0)));
  };
  const kiln::tensor x = kiln::constant(1.5);
  const double expected = 3 * 1.5 * 1.5;  // d/dx x³
  {
    kiln::gradient_tape tape;
    tape.watch(x);
    CHECK(tape.gradient(cube(x), x).item<double>() == Approx(expected));
  }
  {
    kiln::function traced(cube);
    kiln::gradient_tape tape;
    tape.watch(x);
    const kiln::tensor y = traced(x);
    CHECK(y.item<double>() == Approx(1.5 * 1.5 * 1.5));
    CHECK(tape.gradient(y, x).item<double>() == Approx(expected));
  }
  kiln::function inside([&](const kiln::tensor& v) {
    kiln::gradient_tape tape;
    tape.watch(v);
    return tape.gradient(cube(v), v);
  });
  CHECK(inside(x).item<double>() == Approx(expected));
}

TEST_CASE("loops: the trip count is the one the values give, zero included") {
  // v is tripled while below 100: d(final)/dx = 3^trips, and trips depends on x.
  kiln::function grad([](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    tape.watch(x);
    auto [trips, v] = kiln::while_loop([](const kiln::tensor&, const kiln::tensor& v) { return v < 100.0; },
                                       [](const kiln::tensor& i, const kiln::tensor& v) { return std::tuple(i + 1, v * 3.0); },
                                       kiln::constant(0), x);
    return std::tuple(trips, tape.gradient(v, x));
  });
  for (const auto& [at, trips] : {std::pair{1.5, 4}, std::pair{50.0, 1}, std::pair{200.0, 0}}) {
    INFO("x = " << at);
    const auto [n, dx] = grad(kiln::constant(at));
    CHECK(n.item<std::int32_t>() == trips);
    CHECK(dx.item<double>() == Approx(std::pow(3.0, trips)));
  }
  CHECK(grad.tracing_count() == 1);
}

TEST_CASE("loops: a recurrent loop's gradients for its inputs, captures, variables and tensor array, as eager") {
  // h = tanh(h * w + x * u * i) for i < 4, each h written to a fixed-size tensor
  // array; loss = sum(stacked h) + sum(last h). w is a variable, u a captured tensor.
  kiln::variable w(kiln::constant({0.5, -0.25}), "w");
  const kiln::tensor u = kiln::constant({0.75, 1.25});
  auto loss_of = [&](const kiln::tensor& x, const kiln::tensor& u) {
    auto [h, rows] = kiln::for_range(
        4,
        [&](const kiln::tensor& i, const kiln::tensor& h, const kiln::tensor_array& a) {
          const kiln::tensor next = kiln::tanh(h * w.read_value() + x * u * kiln::cast(i, kiln::float64));
          return std::tuple(next, a.write(i, next));
        },
        x, kiln::tensor_array(kiln::float64, 4));
    return kiln::reduce_sum(rows.stack()) + kiln::reduce_sum(h);
  };
  auto gradients = [&](const kiln::tensor& x, const kiln::tensor& u) {
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(x);
    tape.watch(u);
    const kiln::tensor loss = loss_of(x, u);
    return std::tuple(loss, tape.gradient(loss, x), tape.gradient(loss, u), tape.gradient(loss, w));
  };
  const kiln::tensor x = kiln::constant({1.0, 2.0});
  const auto [loss, dx, du, dw] = gradients(x, u);
  kiln::function traced(gradients);
  const auto [graph_loss, graph_dx, graph_du, graph_dw] = traced(x, u);
  CHECK(graph_loss.item<double>() == Approx(loss.item<double>()).epsilon(1e-12));
  for (const auto& [graph, eager] : {std::pair{graph_dx, dx}, std::pair{graph_du, du}, std::pair{graph_dw, dw}})
    for (std::int64_t k = 0; k < 2; ++k) CHECK(graph[k].item<double>() == Approx(eager[k].item<double>()).epsilon(1e-12));
  // Central differences of the loss in x, so that the graph's numbers are checked
  // against something other than kiln's gradients.
  for (std::int64_t k = 0; k < 2; ++k) {
    std::vector<double> plus = {1.0, 2.0}, minus = plus;
    plus[std::size_t(k)] += 1e-6;
    minus[std::size_t(k)] -= 1e-6;
    const double numeric = (loss_of(kiln::constant(plus), u).item<double>() -
                            loss_of(kiln::constant(minus), u).item<double>()) / 2e-6;
    CHECK(graph_dx[k].item<double>() == Approx(numeric).epsilon(1e-6));
  }
}

TEST_CASE("loops: a body that ends in break_if is differentiated through the iterations that went on") {
  // v = v * c until v > 10 (then the loop keeps the v that broke) or v >= 100:
  // d(final)/dx = c^trips and d(final)/dc = trips * x * c^(trips - 1), trips counting
  // the iterations that went on.
  auto breaking = [](const kiln::tensor& x, const kiln::tensor& c) {
    return std::get<1>(kiln::while_loop(
        [](const kiln::tensor&, const kiln::tensor& v) { return v < 100.0; },
        [&](const kiln::tensor& i, const kiln::tensor& v) { return kiln::break_if(v > 10.0, i + 1, v * c); },
        kiln::constant(0), x));
  };
  auto gradients = [&](const kiln::tensor& x, const kiln::tensor& c) {
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(x);
    tape.watch(c);
    const kiln::tensor v = breaking(x, c);
    // With no iteration, eager records nothing that reads c (no gradient, as
    // TensorFlow's None) and a graph's loop gives c zeros: ask for zeros in both.
    return std::tuple(v, tape.gradient(v, x), tape.gradient(v, c, kiln::unconnected_gradients::zero));
  };
  kiln::function inside(gradients);
  kiln::function traced(breaking);
  const kiln::tensor c = kiln::constant(3.0);
  for (const auto& [at, trips] : {std::pair{1.5, 2}, std::pair{5.0, 1}, std::pair{20.0, 0}, std::pair{150.0, 0}}) {
    INFO("x = " << at);
    const kiln::tensor x = kiln::constant(at);
    const double value = at * std::pow(3.0, trips), dx = std::pow(3.0, trips),
                 dc = trips * at * std::pow(3.0, trips - 1);
    const auto [eager_v, eager_dx, eager_dc] = gradients(x, c);
    CHECK(eager_v.item<double>() == Approx(value));
    CHECK(eager_dx.item<double>() == Approx(dx));
    CHECK(eager_dc.item<double>() == Approx(dc).margin(1e-12));
    const auto [v, graph_dx, graph_dc] = inside(x, c);
    CHECK(v.item<double>() == Approx(value));
    CHECK(graph_dx.item<double>() == Approx(dx));
    CHECK(graph_dc.item<double>() == Approx(dc).margin(1e-12));
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(x);
    tape.watch(c);
    const kiln::tensor y = traced(x, c);
    CHECK(y.item<double>() == Approx(value));
    CHECK(tape.gradient(y, x).item<double>() == Approx(dx));
    CHECK(tape.gradient(y, c).item<double>() == Approx(dc).margin(1e-12));
  }
  CHECK(inside.tracing_count() == 1);
  CHECK(traced.tracing_count() == 1);
}

namespace {

// d(loss)/dx by kiln's tape eagerly, under a tape around a kiln::function, under a
// tape around a kiln::function with an effect (which the tape then runs op by op: the
// loop's node runs, and is differentiated, eagerly), and from a tape inside a
// kiln::function, each checked against central differences of `loss` in every element
// of x (so that all four are checked against something other than kiln's gradients).
// x is float64.
template <class Loss>
void check_loop_gradient_four_ways(Loss loss, const std::vector<double>& at) {
  const kiln::tensor x = kiln::constant(at);
  kiln::gradient_tape eager_tape;
  eager_tape.watch(x);
  const kiln::tensor eager = eager_tape.gradient(loss(x), x);
  kiln::function traced(loss);
  kiln::gradient_tape tape;
  tape.watch(x);
  const kiln::tensor outside = tape.gradient(traced(x), x);
  kiln::variable calls(0.0, "calls");
  kiln::function counted([&](const kiln::tensor& v) {
    calls.assign_add(1.0);
    return loss(v);
  });
  kiln::gradient_tape effects_tape;
  effects_tape.watch(x);
  const kiln::tensor node_run_eagerly = effects_tape.gradient(counted(x), x);
  kiln::function inside([&](const kiln::tensor& v) {
    kiln::gradient_tape t;
    t.watch(v);
    return t.gradient(loss(v), v);
  });
  const kiln::tensor within = inside(x);
  REQUIRE(eager.shape() == x.shape());
  REQUIRE(outside.shape() == x.shape());
  REQUIRE(node_run_eagerly.shape() == x.shape());
  REQUIRE(within.shape() == x.shape());
  for (std::size_t k = 0; k < at.size(); ++k) {
    INFO("element " << k);
    std::vector<double> plus = at, minus = at;
    plus[k] += 1e-6;
    minus[k] -= 1e-6;
    const kiln::tensor up = loss(kiln::constant(plus)), down = loss(kiln::constant(minus));
    const double numeric = (up.item<double>() - down.item<double>()) / 2e-6;
    const auto i = std::int64_t(k);
    CHECK(eager[i].item<double>() == Approx(numeric).epsilon(1e-6));
    CHECK(outside[i].item<double>() == Approx(eager[i].item<double>()).epsilon(1e-12));
    CHECK(node_run_eagerly[i].item<double>() == Approx(eager[i].item<double>()).epsilon(1e-12));
    CHECK(within[i].item<double>() == Approx(eager[i].item<double>()).epsilon(1e-12));
  }
  CHECK(calls.read_value().item<double>() == 1.0);
  CHECK(traced.tracing_count() == 1);
  CHECK(inside.tracing_count() == 1);
}

}  // namespace

TEST_CASE("loops: gradients through loop variables that change shape, as eager") {
  SECTION("a tensor_array with dynamic_size that grows") {
    check_loop_gradient_four_ways(
        [](const kiln::tensor& x) {
          const kiln::tensor_array rows = kiln::for_range(
              3,
              [&](const kiln::tensor& i, const kiln::tensor_array& a) {
                return a.write(i, x * x * (kiln::cast(i, kiln::float64) + 1.0));
              },
              kiln::tensor_array(kiln::float64, 0, {.dynamic_size = true}));
          return kiln::reduce_sum(rows.stack());
        },
        {1.5, -0.5});
  }
  SECTION("rows appended under a shape invariant, each from all the rows before it") {
    check_loop_gradient_four_ways(
        [](const kiln::tensor& x) {
          const kiln::tensor rows = kiln::for_range(
              3,
              [](const kiln::tensor& i, const kiln::tensor& acc) {
                const kiln::tensor next =
                    kiln::tanh(kiln::reduce_sum(acc, 0, true) * 0.5 + kiln::cast(i, kiln::float64));
                return kiln::concat({acc, next}, 0);
              },
              kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 2}}}, kiln::reshape(x, {1, 2}));
          return kiln::reduce_sum(rows * rows);
        },
        {0.25, -0.75});
  }
  SECTION("rows appended from the last row, read by a negative index") {
    check_loop_gradient_four_ways(
        [](const kiln::tensor& x) {
          const kiln::tensor rows = kiln::for_range(
              4,
              [](const kiln::tensor&, const kiln::tensor& acc) {
                return kiln::concat({acc, kiln::stack({kiln::tanh(acc[-1] * 0.5 + acc[0])})}, 0);
              },
              kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 2}}}, kiln::reshape(x, {1, 2}));
          return kiln::reduce_sum(rows * rows);
        },
        {0.25, -0.75});
  }
  SECTION("a vector halved each iteration until one element is left, its trip count given by the shape") {
    check_loop_gradient_four_ways(
        [](const kiln::tensor& x) {
          const kiln::tensor last = kiln::while_loop(
              [](const kiln::tensor& v) { return kiln::shape_of(v)[0] > 1; },
              [](const kiln::tensor& v) { return kiln::reduce_sum(kiln::reshape(v * v, {-1, 2}), 1) * 0.5; },
              kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none}}}, x);
          return kiln::reduce_sum(last);
        },
        {1.0, -2.0, 0.5, 1.5, 0.25, 2.0, -1.0, 0.75});
  }
  SECTION("a body that ends in break_if") {
    check_loop_gradient_four_ways(
        [](const kiln::tensor& x) {
          const kiln::tensor rows = std::get<1>(kiln::while_loop(
              [](const kiln::tensor& i, const kiln::tensor&) { return i < 10; },
              [](const kiln::tensor& i, const kiln::tensor& acc) {
                return kiln::break_if(kiln::reduce_sum(acc) > 4.0, i + 1, kiln::concat({acc, acc * 0.5 + 1.0}, 0));
              },
              kiln::loop_options{.shape_invariants = {std::nullopt, kiln::shape{kiln::none}}}, kiln::constant(0), x));
          return kiln::reduce_sum(kiln::exp(rows * 0.1));
        },
        {0.5, 0.25});
  }
}

TEST_CASE("a variable a function reads without the target depending on it has no gradient, as in TensorFlow") {
  kiln::variable used(2.0, "used"), unused(3.0, "unused");
  kiln::function f([&](const kiln::tensor& x) {
    (void)unused.read_value();  // read, but the output does not depend on it
    return x * used.read_value();
  });
  const kiln::tensor x = kiln::constant(1.5);
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(x);
  const kiln::tensor y = f(x);
  CHECK(tape.gradient(y, used).item<double>() == Approx(1.5));
  CHECK(tape.gradient(y, x).item<double>() == Approx(2.0));
  CHECK_FALSE(tape.gradient(y, unused).defined());
  CHECK(tape.gradient(y, unused, kiln::unconnected_gradients::zero).item<double>() == 0.0);
}

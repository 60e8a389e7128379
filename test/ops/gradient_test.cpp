// kiln::gradient_tape on eager ops: every op's gradient formula against central
// finite differences in float64, broadcasting, several sources, persistent and
// nested tapes, stop_gradient, unconnected and integer sources.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include <kiln/kiln.hpp>

#include "../support/op_check.hpp"

namespace {

using kiln::shape;
using kiln::tensor;
using kiln::testing::random_tensor;
using kiln::testing::value_range;

/// f's gradient at `x` by central differences, element by element (f gives a scalar).
tensor numeric_gradient(const std::function<tensor(const tensor&)>& f, const tensor& x) {
  const double h = 1e-6;
  std::vector<double> values = x.to_vector<double>(), grad(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::vector<double> up = values, down = values;
    up[i] += h;
    down[i] -= h;
    const double fu = f(kiln::testing::make_tensor(up, x.shape())).item<double>();
    const double fd = f(kiln::testing::make_tensor(down, x.shape())).item<double>();
    grad[i] = (fu - fd) / (2 * h);
  }
  return kiln::testing::make_tensor(grad, x.shape());
}

/// Requires the tape's gradient of reduce_sum(f(x)) at `x` to match finite differences.
void check_gradient(const std::function<tensor(const tensor&)>& f, const tensor& x) {
  kiln::gradient_tape tape;
  tape.watch(x);
  const tensor y = f(x);
  const tensor g = tape.gradient(y, x);
  REQUIRE(g.defined());
  kiln::testing::require_same(g, numeric_gradient([&](const tensor& v) { return kiln::reduce_sum(f(v)); }, x), 1e-6);
}

tensor randoms(const shape& s, std::uint32_t seed, value_range range = value_range::any) {
  return random_tensor(kiln::float64, s, seed, range);
}

}  // namespace

TEST_CASE("unary ops' gradients match finite differences") {
  const tensor x = randoms({2, 3}, 1, value_range::nonzero), p = randoms({2, 3}, 2, value_range::positive);
  SECTION("negative") { check_gradient([](const tensor& v) { return -v; }, x); }
  SECTION("abs") { check_gradient([](const tensor& v) { return kiln::abs(v); }, x); }
  SECTION("exp") { check_gradient([](const tensor& v) { return kiln::exp(v); }, x); }
  SECTION("log") { check_gradient([](const tensor& v) { return kiln::log(v); }, p); }
  SECTION("sqrt") { check_gradient([](const tensor& v) { return kiln::sqrt(v); }, p); }
  SECTION("square") { check_gradient([](const tensor& v) { return kiln::square(v); }, x); }
  SECTION("tanh") { check_gradient([](const tensor& v) { return kiln::tanh(v); }, x); }
  SECTION("sigmoid") { check_gradient([](const tensor& v) { return kiln::sigmoid(v); }, x); }
  SECTION("relu") { check_gradient([](const tensor& v) { return kiln::relu(v); }, x); }
  SECTION("cast between floats: the gradient comes back in the source's dtype") {
    // (Finite differences through float32 would measure its rounding, not the slope.)
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor g = tape.gradient(kiln::cast(x, kiln::float32) * 3.f, x);
    kiln::testing::require_same(g, kiln::testing::make_tensor(std::vector<double>(6, 3.0), x.shape()));
  }
}

TEST_CASE("binary ops' gradients match finite differences in each operand, broadcasting included") {
  const tensor a = randoms({2, 3}, 3, value_range::nonzero), b = randoms({3}, 4, value_range::nonzero);
  const tensor pa = randoms({2, 3}, 5, value_range::positive);
  using binary = std::function<tensor(const tensor&, const tensor&)>;
  const std::vector<std::pair<const char*, binary>> ops = {
      {"add", [](const tensor& x, const tensor& y) { return x + y; }},
      {"subtract", [](const tensor& x, const tensor& y) { return x - y; }},
      {"multiply", [](const tensor& x, const tensor& y) { return x * y; }},
      {"divide", [](const tensor& x, const tensor& y) { return x / y; }},
      {"maximum", [](const tensor& x, const tensor& y) { return kiln::maximum(x, y); }},
      {"minimum", [](const tensor& x, const tensor& y) { return kiln::minimum(x, y); }},
  };
  for (const auto& [name, op] : ops) {
    INFO(name);
    check_gradient([&](const tensor& x) { return op(x, b); }, a);
    check_gradient([&](const tensor& y) { return op(a, y); }, b);
  }
  SECTION("pow in the base and the exponent") {
    check_gradient([&](const tensor& x) { return kiln::pow(x, b); }, pa);
    check_gradient([&](const tensor& y) { return kiln::pow(pa, y); }, b);
  }
  SECTION("where in each branch") {
    const tensor cond = a > 0.0;
    check_gradient([&](const tensor& x) { return kiln::where(cond, x, b); }, pa);
    check_gradient([&](const tensor& y) { return kiln::where(cond, pa, y); }, b);
  }
}

TEST_CASE("matmul, reductions and shape ops' gradients match finite differences") {
  const tensor a = randoms({2, 3}, 6), b = randoms({3, 4}, 7), batched = randoms({2, 2, 3}, 8);
  check_gradient([&](const tensor& x) { return kiln::matmul(x, b); }, a);
  check_gradient([&](const tensor& y) { return kiln::matmul(a, y); }, b);
  check_gradient([&](const tensor& y) { return kiln::tanh(kiln::matmul(batched, y)); }, b);  // summed over the batch
  check_gradient([&](const tensor& x) { return kiln::reduce_sum(x, 1) * kiln::constant({1.0, -2.0}); }, a);
  check_gradient([&](const tensor& x) { return kiln::square(kiln::reduce_mean(x, 0, true)); }, a);
  check_gradient([&](const tensor& x) { return kiln::reduce_mean(kiln::square(x)); }, a);
  check_gradient([&](const tensor& x) { return kiln::reshape(x, {3, 2}) * kiln::constant({1.0, 2.0}); }, a);
  check_gradient([&](const tensor& x) { return kiln::transpose(x) * kiln::constant({1.0, 2.0}); }, a);
  check_gradient([&](const tensor& x) { return kiln::transpose(x, {1, 2, 0}) * kiln::constant({1.0, -1.0}); }, batched);
  check_gradient([&](const tensor& x) { return kiln::reduce_max(x, 1) * kiln::constant({1.0, -2.0}); }, a);
  check_gradient([&](const tensor& x) { return kiln::reduce_min(x, 0, true) * kiln::constant({1.0, -2.0, 3.0}); }, a);
  check_gradient([&](const tensor& x) { return kiln::reduce_max(kiln::square(x)); }, batched);
  const tensor weights = kiln::constant({1.0, -2.0, 3.0});
  const tensor other = randoms({2, 3}, 9);
  check_gradient([&](const tensor& x) { return kiln::concat({x, kiln::square(x), other}, 0) * weights; }, a);
  check_gradient([&](const tensor& x) { return kiln::concat({kiln::tanh(x), x}, -1) * kiln::constant({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}); }, a);
  check_gradient([&](const tensor& x) { return kiln::stack({x, kiln::square(x)}, 1) * weights; }, a);
  check_gradient([&](const tensor& x) { return kiln::stack({kiln::square(x), x}) * weights; }, a);
  check_gradient([&](const tensor& x) { return kiln::square(kiln::slice(x, {0, 1}, {2, 2})); }, a);
  check_gradient([&](const tensor& x) { return kiln::slice(x, {1, 0, 1}, {1, -1, 2}) * kiln::constant({3.0, -1.0}); }, batched);
}

TEST_CASE("max and min share the gradient among tied elements, as TensorFlow") {
  const tensor x = kiln::constant({1.f, 3.f, 3.f, -2.f});
  {
    kiln::gradient_tape tape;
    tape.watch(x);
    CHECK(tape.gradient(kiln::reduce_max(x), x).to_vector<float>() == std::vector<float>{0, 0.5f, 0.5f, 0});
  }
  const tensor y = kiln::constant({{1.f, -2.f, -2.f}, {4.f, 0.f, 4.f}});
  kiln::gradient_tape tape;
  tape.watch(y);
  CHECK(tape.gradient(kiln::reduce_min(y, 1), y).to_vector<float>() == std::vector<float>{0, 0.5f, 0.5f, 0, 1, 0});
}

TEST_CASE("a gradient tape follows TensorFlow's GradientTape") {
  const tensor x = kiln::constant(3.0f);

  SECTION("x * x at 3 has gradient 6, a non-scalar target is summed") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor v = kiln::constant({1.f, 2.f});
    const tensor y = x * x * v;  // [9, 18], summed: 27 x^2 / 9
    CHECK(tape.gradient(y, x).item<float>() == Approx(18.f));
  }
  SECTION("an unwatched tensor has no gradient; zeros on request") {
    kiln::gradient_tape tape({.persistent = true});
    const tensor y = x * x;
    CHECK_FALSE(tape.gradient(y, x).defined());
    const tensor z = tape.gradient(y, x, kiln::unconnected_gradients::zero);
    REQUIRE(z.defined());
    CHECK(z.item<float>() == 0.f);
  }
  SECTION("a non-persistent tape computes one set of gradients") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor y = x * x;
    (void)tape.gradient(y, x);
    kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return tape.gradient(y, x); },
                                                                {"non-persistent", "persistent = true"});
  }
  SECTION("a persistent tape may be asked again, for several sources") {
    const tensor w = kiln::constant({{1.f, 2.f}, {3.f, 4.f}}), b = kiln::constant({1.f, -1.f});
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(w);
    tape.watch(b);
    const tensor loss = kiln::reduce_sum(kiln::matmul(kiln::constant({{1.f, 1.f}}), w) + b);
    const std::vector<tensor> first = tape.gradient(loss, {w, b}), second = tape.gradient(loss, {w, b});
    kiln::testing::require_same(first[0], kiln::constant({{1.f, 1.f}, {1.f, 1.f}}));
    kiln::testing::require_same(first[1], kiln::constant({1.f, 1.f}));
    kiln::testing::require_same(second[0], first[0]);
  }
  SECTION("stop_gradient cuts the path") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor y = x * kiln::stop_gradient(x);  // d/dx = x, not 2x
    CHECK(tape.gradient(y, x).item<float>() == Approx(3.f));
  }
  SECTION("integer paths have no gradient") {
    const tensor i = kiln::constant(3);
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(i);
    tape.watch(x);
    const tensor y = kiln::cast(i, kiln::float32) * x + kiln::cast(kiln::cast(x, kiln::int32), kiln::float32);
    CHECK_FALSE(tape.gradient(y, i).defined());
    CHECK(tape.gradient(y, x).item<float>() == Approx(3.f));  // the int32 round trip adds nothing
  }
  SECTION("nested tapes give second derivatives") {
    kiln::gradient_tape outer;
    outer.watch(x);
    tensor dy;
    {
      kiln::gradient_tape inner;
      inner.watch(x);
      const tensor y = x * x * x;
      dy = inner.gradient(y, x);  // 3 x^2 = 27
    }
    CHECK(dy.item<float>() == Approx(27.f));
    CHECK(outer.gradient(dy, x).item<float>() == Approx(18.f));  // 6 x
  }
  SECTION("a used tensor keeps its gradient through a value it was copied into") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor copy = x;
    CHECK(tape.gradient(copy * 2.f, x).item<float>() == Approx(2.f));
  }
}

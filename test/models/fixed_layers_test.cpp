// Compile-time checked models (kiln/models/fixed_layers.hpp): typed dense layers built
// for an input type take their weights' shapes from it, and a typed MLP inside a typed
// function gives the values of the same layers computed here by plain loops.

#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

namespace L = kiln::layers;
using relu = L::fixed_activations::relu;
using in_t = kiln::fixed<float, 4, 6>;

auto make_mlp() {
  return L::fixed_sequential<in_t>(L::fixed_dense<5, relu>({.name = "hidden", .seed = 1}),
                                   L::fixed_dense<3, L::fixed_activations::tanh>({.name = "hidden_1", .seed = 2}),
                                   L::fixed_dense<2>({.name = "out", .seed = 3}));
}

/// act(x · w + b) for row-major x (rows x in), w (in x out), b (out), in double.
template <class X, class W, class B, class F>
std::vector<double> dense_by_hand(const std::vector<double>& x, const W& w, const B& b, std::int64_t rows, F act) {
  constexpr std::int64_t in = W::value_type::dims[0], out = W::value_type::dims[1];
  const auto wv = w.value(), bv = b.value();
  std::vector<double> y(std::size_t(rows * out));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < out; ++j) {
      double sum = bv.data()[j];
      for (std::int64_t k = 0; k < in; ++k) sum += x[std::size_t(r * in + k)] * double(wv.data()[k * out + j]);
      y[std::size_t(r * out + j)] = act(sum);
    }
  return y;
}

}  // namespace

TEST_CASE("a typed model's weights take their shapes from the input type") {
  auto mlp = make_mlp();
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(mlp.layer<0>().kernel().value())>, kiln::fixed<float, 6, 5>>);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(mlp.layer<1>().kernel().value())>, kiln::fixed<float, 5, 3>>);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(mlp.layer<2>().kernel().value())>, kiln::fixed<float, 3, 2>>);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(mlp.layer<2>().bias().value())>, kiln::fixed<float, 2>>);
  STATIC_REQUIRE(decltype(mlp)::size == 3);
  CHECK(mlp.layer<0>().kernel().name() == "hidden/kernel");
  CHECK(mlp.layer<2>().bias().name() == "out/bias");
  // Glorot-uniform kernels within Keras' limit sqrt(6 / (in + out)), seeded; zero biases.
  const auto k0 = mlp.layer<0>().kernel().value();
  const double limit = std::sqrt(6.0 / (6 + 5));
  bool spread = false;
  for (std::int64_t i = 0; i < k0.size; ++i) {
    CHECK(std::abs(k0.data()[i]) <= limit);
    spread = spread || std::abs(k0.data()[i]) > limit / 2;
  }
  CHECK(spread);
  const auto again = make_mlp().layer<0>().kernel().value();
  CHECK(std::equal(k0.data(), k0.data() + k0.size, again.data()));
  const auto b0 = mlp.layer<0>().bias().value();
  CHECK(std::all_of(b0.data(), b0.data() + b0.size, [](float v) { return v == 0.f; }));
}

TEST_CASE("a typed MLP computes its layers' formula, traced and at once") {
  auto mlp = make_mlp();
  // Non-zero biases, so that they are seen to be added.
  mlp.layer<0>().bias().set(kiln::fixed<float, 5>{0.1f, -0.2f, 0.3f, -0.4f, 0.5f});
  mlp.layer<1>().bias().set(kiln::fixed<float, 3>{0.25f, -0.5f, 0.75f});
  mlp.layer<2>().bias().set(kiln::fixed<float, 2>{-1.f, 1.f});
  const in_t x = in_t::uniform(7, -1.f, 1.f);

  std::vector<double> h(x.data(), x.data() + x.size);
  h = dense_by_hand<in_t>(h, mlp.layer<0>().kernel(), mlp.layer<0>().bias(), 4, [](double v) { return v > 0 ? v : 0.0; });
  h = dense_by_hand<in_t>(h, mlp.layer<1>().kernel(), mlp.layer<1>().bias(), 4, [](double v) { return std::tanh(v); });
  h = dense_by_hand<in_t>(h, mlp.layer<2>().kernel(), mlp.layer<2>().bias(), 4, [](double v) { return v; });

  kiln::function forward([&](const auto& v) { return mlp(v); });
  const kiln::fixed<float, 4, 2> traced = forward(x);
  const kiln::fixed<float, 4, 2> eager = mlp(x);
  for (std::size_t i = 0; i < h.size(); ++i) {
    INFO("element " << i);
    CHECK(traced.data()[i] == Approx(h[i]).epsilon(1e-5).margin(1e-6));
    CHECK(eager.data()[i] == Approx(h[i]).epsilon(1e-5).margin(1e-6));
  }
  // The weights are read at every call: a new bias shows in the next call's result.
  mlp.layer<2>().bias().set(kiln::fixed<float, 2>{0.f, 0.f});
  const kiln::fixed<float, 4, 2> after = forward(x);
  CHECK(after.data()[0] == Approx(h[0] + 1.0).epsilon(1e-5).margin(1e-6));
  CHECK(after.data()[1] == Approx(h[1] - 1.0).epsilon(1e-5).margin(1e-6));
  CHECK(forward.tracing_count() == 1);
}

TEST_CASE("a typed dense layer built alone, and one without a bias") {
  const auto d = L::fixed_dense<3>({.name = "solo", .use_bias = false, .seed = 4}).build<kiln::fixed<double, 2, 2>>();
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(d.kernel().value())>, kiln::fixed<double, 2, 3>>);
  const kiln::fixed<double, 2, 2> x{1.0, 2.0, -3.0, 0.5};
  const auto k = d.kernel().value();
  const kiln::fixed<double, 2, 3> y = d(x);
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 3; ++j)
      CHECK(y(r, j) == Approx(x(r, 0) * k(0, j) + x(r, 1) * k(1, j)).epsilon(1e-12));
}

// kiln::random::normal / truncated_normal and kiln::initializers: the moments and
// bounds that Keras' formulas give (computed here by hand from the fans), seeded
// determinism, and draws inside functions.

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

using kiln::tensor;

struct moments {
  double mean = 0, stddev = 0, min = 1e300, max = -1e300;
};
moments moments_of(const tensor& t) {
  const std::vector<double> v = kiln::cast(t, kiln::float64).to_vector<double>();
  moments m;
  for (double x : v) m.mean += x, m.min = std::min(m.min, x), m.max = std::max(m.max, x);
  m.mean /= double(v.size());
  for (double x : v) m.stddev += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(m.stddev / double(v.size()));
  return m;
}

}  // namespace

TEST_CASE("random::normal and truncated_normal draw with the moments asked for") {
  const moments n = moments_of(kiln::random::normal({100000}, 2.0, 3.0, kiln::float64, 11));
  CHECK(n.mean == Approx(2.0).margin(0.03));
  CHECK(n.stddev == Approx(3.0).epsilon(0.01));
  // A standard normal truncated to [-2, 2] has stddev 0.8796256610342398.
  const moments t = moments_of(kiln::random::truncated_normal({100000}, -1.0, 0.5, kiln::float32, 12));
  CHECK(t.min >= -2.0);
  CHECK(t.max <= 0.0);
  CHECK(t.mean == Approx(-1.0).margin(0.01));
  CHECK(t.stddev == Approx(0.5 * 0.8796256610342398).epsilon(0.01));
}

TEST_CASE("normal draws are stateful, stateless ones a function of their seed") {
  const tensor a = kiln::random::stateless_normal({5}, 3), b = kiln::random::stateless_normal({5}, 3);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(kiln::random::stateless_truncated_normal({5}, 3).to_vector<float>() !=
        kiln::random::stateless_truncated_normal({5}, 4).to_vector<float>());
  kiln::random::set_seed(5);
  const std::vector<float> first = kiln::random::normal({4}, 0, 1, kiln::float32, 1).to_vector<float>();
  const std::vector<float> second = kiln::random::normal({4}, 0, 1, kiln::float32, 1).to_vector<float>();
  CHECK(first != second);
  kiln::random::set_seed(5);
  CHECK(kiln::random::normal({4}, 0, 1, kiln::float32, 1).to_vector<float>() == first);

  // In a function: a RandomStandardNormal node that draws at every run.
  kiln::function f([](const tensor& x) { return x + kiln::random::truncated_normal({3}, 0, 1, kiln::float32, 9); });
  const tensor zero = kiln::zeros({3});
  CHECK(f(zero).to_vector<float>() != f(zero).to_vector<float>());
  CHECK(f.get_concrete_function(zero).graph().to_dot().find("TruncatedNormal") != std::string::npos);
  auto g = kiln::random::generator::from_seed(4);
  const std::vector<float> g1 = g.normal({3}).to_vector<float>();
  g.reset_from_seed(4);
  CHECK(g.normal({3}).to_vector<float>() == g1);
}

TEST_CASE("normal draws reject what they cannot draw") {
  CHECK_THROWS_AS(kiln::random::normal({2}, 0, 1, kiln::int32), kiln::type_error);
  CHECK_THROWS_WITH(kiln::random::truncated_normal({2}, 0, -1), Catch::Contains("random::truncated_normal") &&
                                                                     Catch::Contains("stddev -1"));
}

TEST_CASE("initializers follow Keras' formulas from the fans") {
  using namespace kiln::initializers;
  CHECK(fans({3, 4}) == std::pair{3.0, 4.0});
  CHECK(fans({3, 3, 2, 8}) == std::pair{18.0, 72.0});  // a 3x3 window: 9 * 2 in, 9 * 8 out
  CHECK(fans({5}) == std::pair{5.0, 5.0});

  // glorot_uniform: within sqrt(6 / (fan_in + fan_out)), variance limit^2 / 3.
  const double limit = std::sqrt(6.0 / (200 + 300));
  const moments gu = moments_of(glorot_uniform({.seed = 1})({200, 300}, kiln::float32));
  CHECK(gu.max <= limit);
  CHECK(gu.min >= -limit);
  CHECK(gu.stddev == Approx(limit / std::sqrt(3.0)).epsilon(0.01));
  // he_normal: a truncated normal of stddev sqrt(2 / fan_in), fan_in = 3 * 3 * 16.
  const moments hn = moments_of(he_normal({.seed = 2})({3, 3, 16, 64}, kiln::float64));
  CHECK(hn.stddev == Approx(std::sqrt(2.0 / 144)).epsilon(0.02));
  CHECK(hn.max <= 2 * std::sqrt(2.0 / 144) / 0.87962566103423978);
  const moments gn = moments_of(glorot_normal{}({300, 200}));
  CHECK(gn.stddev == Approx(std::sqrt(2.0 / 500)).epsilon(0.02));
  CHECK(moments_of(he_uniform{}({400, 100})).max <= std::sqrt(6.0 / 400));
  CHECK(moments_of(lecun_normal{}({400, 100})).stddev == Approx(std::sqrt(1.0 / 400)).epsilon(0.02));
  const moments rn = moments_of(random_normal{}({100000}));
  CHECK(rn.stddev == Approx(0.05).epsilon(0.01));
  const moments ru = moments_of(random_uniform({.minval = 1, .maxval = 2})({1000}));
  CHECK((ru.min >= 1 && ru.max < 2));
  CHECK(moments_of(truncated_normal{}({10000})).max <= 0.1);
  CHECK(zeros{}({2}, kiln::int32).to_vector<int>() == std::vector<int>{0, 0});
  CHECK(ones{}({2}).to_vector<float>() == std::vector<float>{1, 1});
  CHECK(constant{0.25}({2}, kiln::float64).to_vector<double>() == std::vector<double>{0.25, 0.25});
}

TEST_CASE("a seeded initializer gives the same values at every call, an unseeded one new values") {
  using namespace kiln::initializers;
  CHECK(glorot_uniform({.seed = 3})({4, 4}).to_vector<float>() == glorot_uniform({.seed = 3})({4, 4}).to_vector<float>());
  const glorot_uniform unseeded;
  CHECK(unseeded({4, 4}).to_vector<float>() != unseeded({4, 4}).to_vector<float>());
  // Called while tracing, an initializer still gives concrete values.
  kiln::function f([](const tensor& x) {
    const tensor w = he_uniform({.seed = 1})({2}, kiln::float32);
    CHECK_FALSE(w.is_symbolic());
    return x * w;
  });
  (void)f(kiln::ones({2}));
}

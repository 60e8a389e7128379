// kiln::function called with `fixed` arguments: one trace per signature type and
// per value of its C++ arguments, side effects once per trace, rebinding, results
// as `fixed` values, signatures in the seeds' format, and the runtime tier when
// `fixed` and kiln::tensor arguments mix.

#include "../support/op_check.hpp"

#include <sstream>

using namespace kiln;
using kiln::testing::require_same;

TEST_CASE("a typed call traces once per signature type, with C++ side effects once") {
  int traced = 0;
  kiln::function f([&](const auto& a, const auto& b) {
    ++traced;
    return a * b + 1.f;
  });
  const auto x = fixed<float, 3>{1, 2, 3};
  const auto y = fixed<float, 3>{4, 5, 6};
  const fixed<float, 3> r = f(x, y);
  REQUIRE(r(2) == 19.f);
  f(y, x);
  REQUIRE(traced == 1);
  f(fixed<float, 2>{1, 2}, fixed<float, 2>{3, 4});  // another type: another trace
  REQUIRE(traced == 2);
  REQUIRE(f.tracing_count() == 2);
  kiln::function g([&](const auto& a, const auto& b) { return a - b; });  // never shares f's traces
  g(x, y);
  REQUIRE(g.tracing_count() == 1);
  REQUIRE(f.tracing_count() == 2);
}

TEST_CASE("C++ values key a typed trace by value") {
  kiln::function power(
      [](auto a, int b) {
        auto c = kiln::ones_like(a);
        for (int i = 0; i < b; ++i) c = c * a;
        return c;
      },
      {.name = "power", .arg_names = {"a", "b"}});
  const auto m = fixed<std::int32_t, 2, 2>{1, 2, 3, 4};
  REQUIRE(power(m, 3)(1, 1) == 64);
  REQUIRE(power(m, 2)(1, 0) == 9);
  REQUIRE(power(m, 3)(0, 1) == 8);
  REQUIRE(power.tracing_count() == 2);
  REQUIRE(power.pretty_printed_concrete_signatures() ==
          "power(a, b=3)\n  Args:\n    a: int32 Tensor, shape=(2, 2)\n  Returns:\n    int32 Tensor, shape=(2, 2)\n\n"
          "power(a, b=2)\n  Args:\n    a: int32 Tensor, shape=(2, 2)\n  Returns:\n    int32 Tensor, shape=(2, 2)");
}

TEST_CASE("rebinding a symbolic value in a C++ loop evaluates at each assignment") {
  kiln::function f([](auto x) {
    auto y = x;
    for (int i = 0; i < 20; ++i) y = y * 0.5f + x;
    return y;
  });
  const auto x = fixed<float, 5, 7>::uniform(3);
  tensor expected = x;
  for (int i = 0; i < 20; ++i) expected = expected * 0.5f + tensor(x);
  require_same(tensor(f(x)), expected, 1e-6);
}

TEST_CASE("a typed function returns tuples, C++ values and nothing") {
  kiln::function pair([](const auto& a) { return std::tuple(a + 1, kiln::reduce_sum(a)); });
  const auto [plus_one, sum] = pair(fixed<int, 3>{1, 2, 3});
  REQUIRE(plus_one(2) == 4);
  REQUIRE(sum.item() == 6);
  REQUIRE(pair.pretty_printed_concrete_signatures() ==
          "function(x0)\n  Args:\n    x0: int32 Tensor, shape=(3,)\n  Returns:\n    (<1>, <2>)\n"
          "      <1>: int32 Tensor, shape=(3,)\n      <2>: int32 Tensor, shape=()");
  kiln::function scaled([](const auto& a, double scale) { return std::tuple(a * 2, scale); });
  scaled(fixed<float, 2, 2>{}, 0.5);
  REQUIRE(scaled.pretty_printed_concrete_signatures() ==
          "function(x0, x1=0.5)\n  Args:\n    x0: float32 Tensor, shape=(2, 2)\n  Returns:\n    (<1>, <2>)\n"
          "      <1>: float32 Tensor, shape=(2, 2)\n      <2>: float64 Tensor, shape=()");
  int calls = 0;
  kiln::function effect([&](const auto&) { ++calls; });
  effect(fixed<int, 3>{});
  effect(fixed<int, 3>{});
  REQUIRE(calls == 1);
  REQUIRE(effect.pretty_printed_concrete_signatures() ==
          "function(x0)\n  Args:\n    x0: int32 Tensor, shape=(3,)\n  Returns:\n    NoneTensorSpec()");
}

TEST_CASE("captured fixed values are constants of the trace") {
  fixed<float, 3> w{1, 2, 3};
  kiln::function f([&w](const auto& x) { return x * w; });
  REQUIRE(f(fixed<float, 3>::ones())(2) == 3.f);
  w(2) = 10.f;  // read at trace time, as TensorFlow reads captured Python values
  REQUIRE(f(fixed<float, 3>::ones())(2) == 3.f);
}

TEST_CASE("fixed beside kiln::tensor arguments runs in the runtime tier") {
  kiln::function f([](const tensor& a, const tensor& b) { return a + b; });
  const tensor r = f(fixed<float, 2>{1, 2}, kiln::constant({10.f, 20.f}));
  require_same(r, kiln::constant({11.f, 22.f}), 0);
}

TEST_CASE("one generic lambda serves both tiers with the same values") {
  kiln::function f([](const auto& x, const auto& w, const auto& b) {
    return kiln::reduce_mean<1>(kiln::relu(kiln::matmul(x, w) + b) * 2.f - 1.f);
  });
  const auto x = fixed<float, 4, 16>::uniform(1, -1.f, 1.f);
  const auto w = fixed<float, 16, 8>::uniform(2, -1.f, 1.f);
  const auto b = fixed<float, 8>::uniform(3, -1.f, 1.f);
  require_same(tensor(f(x, w, b)), f(tensor(x), tensor(w), tensor(b)), 1e-6);
  REQUIRE(f.tracing_count() == 2);  // one typed trace, one runtime trace
}

TEST_CASE("get_concrete_function with kiln::spec traces without running, and shares the trace with calls") {
  int traced = 0;
  kiln::function dbl(
      [&](const auto& a) {
        ++traced;
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});
  const auto concrete = dbl.get_concrete_function(kiln::spec<std::int32_t, 3>{});
  REQUIRE(traced == 1);
  std::ostringstream printed;
  printed << concrete;
  REQUIRE(printed.str() == "ConcreteFunction double(a)\n  Args:\n    a: int32 Tensor, shape=(3,)\n  Returns:\n    int32 Tensor, shape=(3,)\n");
  REQUIRE(concrete(fixed<std::int32_t, 3>{1, 2, 3})(2) == 6);
  REQUIRE(dbl(fixed<std::int32_t, 3>{4, 5, 6})(0) == 8);  // the same trace
  REQUIRE(traced == 1);
  REQUIRE(dbl.tracing_count() == 1);
  kiln::function power([](auto a, int b) {
    auto c = a;
    for (int i = 1; i < b; ++i) c = c * a;
    return c;
  });
  const auto square = power.get_concrete_function(kiln::spec<float, 2>{}, 2);  // b bound to 2
  REQUIRE(square(fixed<float, 2>{3.f, 4.f})(1) == 16.f);
}

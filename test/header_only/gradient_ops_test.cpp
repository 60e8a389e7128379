// Built header-only, as a user builds kiln (test/CMakeLists.txt): the other tests link
// kiln_library, which registers every op's kernels before main, so only here does a
// gradient formula fail that runs an op neither the program nor the tape registered.
// The forward passes below never call crop_or_pad or stack, which the gradients of
// x[i], concat and pad_rows run where dims are known only when the graph runs, nor
// log, floordiv or transpose, which pow's, floormod's and matmul's run (a tape
// registers transpose; pow's and floormod's formulas register the others themselves),
// nor less or less_equal. Each test case runs in a process of its own.

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <kiln/kiln.hpp>
#include <vector>

namespace {

// d(loss)/dx from a tape inside a kiln::function, against central differences.
void check_inside_function(const std::function<kiln::tensor(const kiln::tensor&)>& loss,
                           const std::vector<double>& at) {
  kiln::function gradient([&](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    tape.watch(x);
    return tape.gradient(loss(x), x);
  });
  const kiln::tensor g = gradient(kiln::constant(at));
  REQUIRE(g.shape() == kiln::shape{std::int64_t(at.size())});
  for (std::size_t k = 0; k < at.size(); ++k) {
    INFO("element " << k);
    std::vector<double> plus = at, minus = at;
    plus[k] += 1e-6;
    minus[k] -= 1e-6;
    const double numeric =
        (loss(kiln::constant(plus)).item<double>() - loss(kiln::constant(minus)).item<double>()) / 2e-6;
    CHECK(g[std::int64_t(k)].item<double>() == Approx(numeric).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE("gradients through loops whose variables change shape run in a header-only program") {
  // Rows appended from the last and the first row: x[i]'s and concat's gradients.
  check_inside_function(
      [](const kiln::tensor& x) {
        const kiln::tensor rows = kiln::for_range(
            3,
            [](const kiln::tensor&, const kiln::tensor& acc) {
              return kiln::concat({acc, kiln::reshape(kiln::tanh(acc[-1] * 0.5 + acc[0]), {1, 2})}, 0);
            },
            kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 2}}}, kiln::reshape(x, {1, 2}));
        return kiln::reduce_sum(rows * rows);
      },
      {0.25, -0.75});
  // A growing tensor_array: pad_rows' gradient.
  check_inside_function(
      [](const kiln::tensor& x) {
        const kiln::tensor_array rows = kiln::for_range(
            3,
            [&](const kiln::tensor& i, const kiln::tensor_array& a) {
              return a.write(i, x * x + kiln::cast(i, kiln::float64));
            },
            kiln::tensor_array(kiln::float64, 0, {.dynamic_size = true}));
        return kiln::reduce_sum(kiln::exp(rows.stack() * 0.5));
      },
      {0.5, -1.0});
}

TEST_CASE("the formulas of pow, floormod, matmul, abs and minimum run in a header-only program") {
  check_inside_function([](const kiln::tensor& x) { return kiln::reduce_sum(kiln::pow(x, x)); }, {0.5, 1.5});
  check_inside_function(
      [](const kiln::tensor& x) { return kiln::reduce_sum(kiln::floormod(kiln::constant({2.0, 3.0}), x)); },
      {0.7, 1.3});
  check_inside_function(
      [](const kiln::tensor& x) {
        return kiln::reduce_sum(kiln::matmul(kiln::reshape(x, {1, 2}), kiln::reshape(x, {2, 1})));
      },
      {0.5, -1.5});
  check_inside_function([](const kiln::tensor& x) { return kiln::reduce_sum(kiln::abs(x) * x); }, {-0.5, 0.75});
  check_inside_function(
      [](const kiln::tensor& x) { return kiln::reduce_sum(kiln::minimum(x, kiln::constant({0.0, 0.0})) * x); },
      {-0.5, 0.75});
}

TEST_CASE("pow's formula registers log for an eager tape in a header-only program") {
  const kiln::tensor x = kiln::constant({0.5, 1.5});
  kiln::gradient_tape tape;
  tape.watch(x);
  const kiln::tensor g = tape.gradient(kiln::reduce_sum(kiln::pow(x, x)), x);
  for (std::int64_t k = 0; k < 2; ++k) {
    const double v = k == 0 ? 0.5 : 1.5;
    CHECK(g[k].item<double>() == Approx(std::pow(v, v) * (std::log(v) + 1)).epsilon(1e-12));  // d(x^x)/dx
  }
}

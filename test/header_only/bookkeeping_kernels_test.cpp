// Built header-only (test/CMakeLists.txt): an op that only kiln's own bookkeeping runs
// (a for_range's trip count and counter) fills its row of the kernel table with
// kernels for bools and integers alone. Each test case runs in a process of its own,
// so the rows start empty. This file never calls kiln::floordiv or kiln::maximum
// itself except where a test says so.

#include <catch2/catch.hpp>
#include <kiln/kiln.hpp>
#include <span>

#include "../support/op_check.hpp"

namespace {

// Runs `op` on `inputs` through its row of the kernel table, as a graph does.
kiln::tensor run_row(const kiln::ops::any_op& op, std::initializer_list<kiln::tensor> inputs) {
  std::vector<const kiln::tensor*> in;
  for (const kiln::tensor& t : inputs) in.push_back(&t);
  return kiln::detail::execute_any(op, std::span<const kiln::tensor* const>(in));
}

kiln::tensor sum_of_range(const kiln::tensor& start) {
  kiln::function f([](const kiln::tensor& x) {
    return kiln::for_range(4, [](const kiln::tensor& i, const kiln::tensor& v) { return v + i; }, x);
  });
  return f(start);
}

}  // namespace

TEST_CASE("an op only loop counters run has kernels for bools and integers") {
  REQUIRE(sum_of_range(kiln::constant(10)).item<std::int32_t>() == 16);  // 10 + 0 + 1 + 2 + 3
  const kiln::ops::any_op floordiv(kiln::ops::floordiv{});
  CHECK(run_row(floordiv, {kiln::constant(7), kiln::constant(2)}).item<std::int32_t>() == 3);
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] { return run_row(floordiv, {kiln::constant(7.f), kiln::constant(2.f)}); },
      {"floordiv", "bool, int32 and int64 only", "float32"});
  kiln::testing::require_throws<kiln::unavailable_error>(
      [] { return kiln::detail::exec::entry_of(kiln::ops::any_op(kiln::ops::maximum{}), kiln::float64, kiln::float64); },
      {"maximum", "float64"});
}

TEST_CASE("the program's own call of an op gives its row every kernel") {
  REQUIRE(sum_of_range(kiln::constant(1)).item<std::int32_t>() == 7);
  CHECK(kiln::floordiv(kiln::constant(7.5f), kiln::constant(2.f)).item<float>() == 3.f);
  CHECK(run_row(kiln::ops::any_op(kiln::ops::floordiv{}), {kiln::constant(9.f), kiln::constant(2.f)}).item<float>() == 4.f);
}

TEST_CASE("loop counters keep the complete row of an op the program called first") {
  CHECK(kiln::floordiv(kiln::constant(7.5f), kiln::constant(2.f)).item<float>() == 3.f);
  REQUIRE(sum_of_range(kiln::constant(0)).item<std::int32_t>() == 6);
  CHECK(run_row(kiln::ops::any_op(kiln::ops::floordiv{}), {kiln::constant(-9.), kiln::constant(2.)}).item<double>() ==
        -5.);
}

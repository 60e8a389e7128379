// kiln/fixed.hpp on its own: the compile-time tier compiles and runs without the
// runtime tier (this file is built without kiln.hpp precompiled into it).

#include <kiln/fixed.hpp>

#include <catch2/catch.hpp>

#include <sstream>
#include <string>

TEST_CASE("kiln/fixed.hpp alone traces, runs and prints typed functions") {
  int traced = 0;
  kiln::fixed_variable<float, 2> total;
  kiln::function f(
      [&](const auto& x, const auto& w) {
        ++traced;
        auto y = kiln::reduce_sum<1>(kiln::matmul(x, w)) + 1.f;
        total.assign_add(y);
        return kiln::cond(kiln::reduce_max(y) > 0.f, [&] { return y; }, [&] { return -y; });
      },
      {.name = "f", .arg_names = {"x", "w"}});
  const auto x = kiln::fixed<float, 2, 3>{1, 2, 3, 4, 5, 6};
  const auto w = kiln::fixed<float, 3, 2>{1, 0, 0, 1, 1, 1};
  // x·w = [[4 5] [10 11]], row sums 9 and 21, plus one.
  const kiln::fixed<float, 2> y = f(x, w);
  REQUIRE(y(0) == 10.f);
  REQUIRE(y(1) == 22.f);
  f(x, w);
  REQUIRE(traced == 1);
  REQUIRE(f.tracing_count() == 1);
  REQUIRE(total.value()(1) == 44.f);
  REQUIRE(f.pretty_printed_concrete_signatures() ==
          "f(x, w)\n"
          "  Args:\n"
          "    x: float32 Tensor, shape=(2, 3)\n"
          "    w: float32 Tensor, shape=(3, 2)\n"
          "  Returns:\n"
          "    float32 Tensor, shape=(2,)");
  std::ostringstream os;
  os << y;
  REQUIRE(os.str() == "tensor([10. 22.], shape=(2,), dtype=float32)");
}

// kiln::cond, kiln::while_loop, kiln::for_range and kiln::fixed_variable on typed
// values: the same generic lambdas as in the runtime tier give the same values,
// traced once; conditions and variables are read at every call, in program order.

#include "../support/typed_check.hpp"

#include <iostream>
#include <sstream>

using namespace kiln;
using kiln::testing::check_both_tiers;
using kiln::testing::random_fixed;
using kiln::testing::require_same;

TEST_CASE("typed cond runs the branch its condition picks, at every call") {
  int traced = 0;
  const auto pick = [&](const auto& x) {
    ++traced;
    return kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x * 2.f; }, [&] { return -x; });
  };
  kiln::function f(pick);
  const auto up = fixed<float, 4>{1, 2, 3, 4};
  const auto down = fixed<float, 4>{-1, -2, -3, -4};
  require_same(tensor(f(up)), kiln::constant({2.f, 4.f, 6.f, 8.f}), 0);
  require_same(tensor(f(down)), kiln::constant({1.f, 2.f, 3.f, 4.f}), 0);
  REQUIRE(traced == 1);  // both calls ran the one trace
  require_same(tensor(pick(down)), kiln::constant({1.f, 2.f, 3.f, 4.f}), 0);  // on fixed values: at once
  check_both_tiers([](const auto& x) { return kiln::cond(kiln::reduce_max(x) > 0.f, [&] { return kiln::tanh(x); }, [&] { return x * x; }); },
                   random_fixed<fixed<float, 7>>(1));
}

TEST_CASE("typed cond gives tuples from both branches") {
  kiln::function f([](const auto& x) {
    return kiln::cond(kiln::reduce_max(x) > 2, [&] { return std::tuple(x + 1, kiln::reduce_sum(x)); },
                      [&] { return std::tuple(x - 1, kiln::reduce_min(x)); });
  });
  const auto [a, b] = f(fixed<int, 3>{1, 2, 3});
  REQUIRE(a(0) == 2);
  REQUIRE(b.item() == 6);
  const auto [c, d] = f(fixed<int, 3>{1, 2, 0});
  REQUIRE(c(0) == 0);
  REQUIRE(d.item() == 0);
}

TEST_CASE("typed while_loop: the seeds' tanh loop, traced once, runs until its condition fails") {
  const auto tanh_loop = [](const auto& x) {
    return kiln::while_loop([](const auto& v) { return kiln::reduce_sum(v) > 1.f; }, [](const auto& v) { return kiln::tanh(v); },
                            x);
  };
  check_both_tiers(tanh_loop, random_fixed<fixed<float, 5>>(2, kiln::testing::value_range::positive));
  kiln::function f(tanh_loop);
  const auto small = fixed<float, 2>{0.25f, 0.25f};
  require_same(tensor(f(small)), tensor(small), 0);  // the condition fails at once
}

TEST_CASE("typed while_loop computes each next value from the values its iteration started with") {
  kiln::function fib([](const auto& n) {
    return kiln::while_loop([&](const auto& i, const auto&, const auto&) { return i < n; },
                            [](const auto& i, const auto& a, const auto& b) { return std::tuple(i + 1, b, a + b); },
                            kiln::fixed<std::int64_t>(0), kiln::fixed<std::int64_t>(0), kiln::fixed<std::int64_t>(1));
  });
  const auto [i, a, b] = fib(kiln::fixed<std::int64_t>(10));
  REQUIRE(i.item() == 10);
  REQUIRE(a.item() == 55);
  REQUIRE(b.item() == 89);
}

TEST_CASE("typed for_range gives the body an int32 index") {
  check_both_tiers(
      [](const auto& x) { return kiln::for_range(5, [](const auto& i, const auto& t) { return t * 2.f + kiln::cast<float>(i); }, x); },
      random_fixed<fixed<float, 3, 4>>(3));
  // On fixed values outside a function: a C++ loop.
  const auto total = kiln::for_range(4, [](const auto& i, const auto& t) { return t + i; }, fixed<std::int32_t>(0));
  REQUIRE(total.item() == 6);
}

TEST_CASE("typed break_if stops a loop with the values its iteration started with") {
  const auto stop_at_3 = [](const auto& x) {
    return kiln::while_loop([](const auto& i) { return i < 10; }, [](const auto& i) { return kiln::break_if(i == 3, i + 1); },
                            x);
  };
  kiln::function f(stop_at_3);
  REQUIRE(f(fixed<std::int32_t>(0)).item() == 3);
  REQUIRE(f(fixed<std::int32_t>(5)).item() == 10);  // the condition ends it first
  REQUIRE(stop_at_3(fixed<std::int32_t>(0)).item() == 3);
  REQUIRE(f.tracing_count() == 1);
  // for_range and a condition on a reduction, against the runtime tier.
  check_both_tiers(
      [](const auto& x) {
        return kiln::for_range(
            10, [](const auto& i, const auto& t) { return kiln::break_if(kiln::reduce_sum(t) > 20.f, t + kiln::cast<float>(i)); },
            x);
      },
      fixed<float, 2>{1.f, 2.f});
}

TEST_CASE("fixed_variable reads and writes run at every call, in program order") {
  kiln::fixed_variable<float, 3> total;
  kiln::function add_to([&](const auto& x) { return total.assign_add(x); });
  add_to(fixed<float, 3>::ones());
  const fixed<float, 3> second = add_to(fixed<float, 3>{1, 2, 3});
  REQUIRE(second(2) == 4.f);
  REQUIRE(total.value()(1) == 3.f);
  REQUIRE(add_to.tracing_count() == 1);

  kiln::fixed_variable<int> counter;
  kiln::function steps([&](const auto& x) {
    const auto before = counter.read_value();
    counter.assign(before + x);
    const auto middle = counter.read_value();
    counter.assign_sub(middle * 3);
    return std::tuple(before, middle, counter.read_value());
  });
  const auto [before, middle, after] = steps(fixed<int>(2));
  REQUIRE(before.item() == 0);
  REQUIRE(middle.item() == 2);
  REQUIRE(after.item() == -4);
  counter.set(fixed<int>(10));
  REQUIRE(std::get<0>(steps(fixed<int>(2))).item() == 10);
  REQUIRE_THROWS_AS(counter.read_value(), kiln::type_error);  // outside a function: value() and set()
}

TEST_CASE("kiln::print of typed values prints at every call, inside loops too") {
  std::ostringstream out;
  kiln::config::set_print_stream(out);
  kiln::function f([](const auto& x) {
    kiln::print("x is", x, "and twice", x * 2);
    return kiln::for_range(2, [](const auto& i, const auto& t) {
      kiln::print("i =", i);
      return t + i;
    }, kiln::reduce_sum(x));
  });
  f(fixed<int, 3>{1, 2, 3});
  f(fixed<int, 3>{4, 5, 6});
  kiln::config::set_print_stream(std::cout);
  REQUIRE(out.str() == "x is [1 2 3] and twice [2 4 6]\ni = 0\ni = 1\nx is [4 5 6] and twice [8 10 12]\ni = 0\ni = 1\n");
  REQUIRE(f.tracing_count() == 1);
}

TEST_CASE("effects on the arguments alone run at every call of a one-expression trace") {
  // Neither a print of an argument nor a callback that returns nothing adds a value to
  // the trace: they must run all the same.
  std::ostringstream out;
  kiln::config::set_print_stream(out);
  int callbacks = 0;
  kiln::function f([&](const auto& x) {
    kiln::print("x is", x);
    kiln::host_callback([&](const fixed<float, 2>&) { ++callbacks; }, x);
    return x * 2.f;
  });
  const fixed<float, 2> first = f(fixed<float, 2>{1, 2});
  f(fixed<float, 2>{3, 4});
  kiln::config::set_print_stream(std::cout);
  CHECK(first(1) == 4.f);
  CHECK(out.str() == "x is [1 2]\nx is [3 4]\n");
  CHECK(callbacks == 2);
}

TEST_CASE("typed host_callback runs its C++ function at every call, in program order") {
  std::vector<float> seen;
  kiln::function f([&](const auto& x) {
    const auto y = kiln::host_callback(
        [&](const fixed<float, 3>& v) {
          seen.push_back(v(0));
          return v * 2.f;
        },
        x + 1.f);
    kiln::host_callback([&](const fixed<float, 3>& v, const fixed<float, 3>& w) { seen.push_back(v(1) + w(1)); }, y, x);
    const auto [a, b] = kiln::host_callback([](const fixed<float, 3>& v) { return std::tuple(v, kiln::reduce_sum(v)); }, y);
    return a + b;
  });
  const auto x = fixed<float, 3>{1, 2, 3};
  // y = (x + 1) * 2 = [4 6 8]; the result y + sum(y).
  for (int call = 0; call < 2; ++call) {
    const fixed<float, 3> r = f(x);
    REQUIRE(r(0) == 22.f);
    REQUIRE(r(2) == 26.f);
  }
  REQUIRE(seen == std::vector<float>{2, 8, 2, 8});
  REQUIRE(f.tracing_count() == 1);
  // On fixed values outside a function it runs at once.
  REQUIRE(kiln::host_callback([](const fixed<float, 3>& v) { return v + 1.f; }, x)(2) == 4.f);
}

// Rebinding loops in typed traces (`auto y = x; for (...) y = f(y);`): assignments of
// one expression type in a row run as one evaluation chain, one batch at a time, and
// give the values of the assignments one after the other (references computed here
// by plain loops); fixed_variable reads in place keep program order against later
// writes and host callbacks.

#include "../support/typed_check.hpp"

#include <cmath>
#include <vector>

using namespace kiln;

namespace {

/// The values of `x` as floats, row-major.
template <class X>
std::vector<float> values_of(const X& x) {
  return std::vector<float>(x.data(), x.data() + X::size);
}

void require_close(const std::vector<float>& got, const std::vector<float>& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-6).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("a rebinding loop gives each assignment's values, rows with partial batches included") {
  // 3 x 21: every row ends in a partial SIMD batch, whatever the batch width.
  const auto x = fixed<float, 3, 21>::uniform(5, -2.f, 2.f);
  kiln::function f([](auto v) {
    auto y = v;
    for (int i = 0; i < 25; ++i) y = kiln::maximum(y * 0.9f + 0.01f, y * 0.5f);
    return y;
  });
  std::vector<float> expected = values_of(x);
  for (float& e : expected)
    for (int i = 0; i < 25; ++i) e = std::max(e * 0.9f + 0.01f, e * 0.5f);
  require_close(values_of(f(x)), expected);
  require_close(values_of(f(x)), expected);  // the second call runs the recorded trace
  REQUIRE(f.tracing_count() == 1);
}

TEST_CASE("assignments that read older values and arguments keep their order") {
  // Two symbols rebound in turn with expressions of one type: one chain, in which each
  // assignment reads the one before it (in a register) and the one before that.
  const auto x = fixed<float, 17>::uniform(7, -1.f, 1.f);
  kiln::function f([](auto v) {
    auto a = v;
    decltype(v) b = v * 2.f;
    for (int i = 0; i < 6; ++i) {
      a = a * 0.5f + b;
      b = b * 0.25f + a;
    }
    return std::tuple(a, b + v);
  });
  std::vector<float> ea = values_of(x), eb = values_of(x);
  for (std::size_t k = 0; k < ea.size(); ++k) {
    const float v = ea[k];
    float a = v, b = v * 2.f;
    for (int i = 0; i < 6; ++i) {
      a = a * 0.5f + b;
      b = b * 0.25f + a;
    }
    ea[k] = a;
    eb[k] = b + v;
  }
  const auto [a, b] = f(x);
  require_close(values_of(a), ea);
  require_close(values_of(b), eb);
}

TEST_CASE("integer rebinding loops evaluate every element, the padding of partial batches too") {
  const auto x = fixed<std::int32_t, 2, 13>{1,  -2, 3,   4,  -5, 6,   7,  -8, 9,  10, 11, -12, 13,
                                            14, 15, -16, 17, 18, -19, 20, 21, 22, -23, 24, 25, 26};
  kiln::function f([](auto v) {
    auto y = v;
    for (int i = 0; i < 5; ++i) y = kiln::floordiv(y * 3 + v, 2);
    return y;
  });
  const fixed<std::int32_t, 2, 13> r = f(x);
  for (int k = 0; k < 26; ++k) {
    const std::int32_t v = x.data()[k];
    std::int32_t y = v;
    for (int i = 0; i < 5; ++i) {
      const std::int32_t n = y * 3 + v;
      y = n / 2 - ((n % 2 != 0) && (n < 0));  // floor division, as TensorFlow's
    }
    REQUIRE(r.data()[k] == y);
  }
}

TEST_CASE("rebinding loops inside a loop body and a cond branch") {
  const auto x = fixed<float, 5>{0.5f, -1.f, 2.f, 0.f, 3.f};
  kiln::function f([](const auto& v) {
    const auto looped = kiln::for_range(
        3,
        [](const auto&, const auto& t) {
          auto y = t;
          for (int i = 0; i < 4; ++i) y = y * 0.5f + 1.f;
          return y;
        },
        v);
    return kiln::cond(
        kiln::reduce_sum(v) > 0.f,
        [&] {
          auto y = looped;
          for (int i = 0; i < 3; ++i) y = y - 0.25f;
          return y;
        },
        [&] { return looped; });
  });
  std::vector<float> expected = values_of(x);
  for (float& e : expected) {
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < 4; ++i) e = e * 0.5f + 1.f;
    e -= 0.75f;  // the sum of x is positive
  }
  require_close(values_of(f(x)), expected);
}

TEST_CASE("a rebinding loop shows each of its assignments in the graph") {
  kiln::function f([](auto v) {
    auto y = v;
    for (int i = 0; i < 4; ++i) y = y * 2.f + v;
    return y;
  });
  const kiln::graph g = f.get_concrete_function(kiln::spec<float, 3>{}).graph();
  int multiplies = 0, adds = 0;
  for (const kiln::node& n : g.nodes()) {
    multiplies += n.op() == "mul";
    adds += n.op() == "add";
  }
  REQUIRE(multiplies == 4);
  REQUIRE(adds == 4);
}

TEST_CASE("a fixed_variable read in place keeps its value when the trace writes the variable later") {
  kiln::fixed_variable<float, 3> v(fixed<float, 3>{1, 2, 3});
  kiln::function f([&](const auto& x) {
    const auto before = v.read_value();
    v.assign(before * 10.f);
    const auto after = v.read_value();
    v.assign_add(x);
    return std::tuple(before, after, v.read_value());  // read when the call ends
  });
  const auto [before, after, last] = f(fixed<float, 3>::ones());
  REQUIRE(values_of(before) == std::vector<float>{1, 2, 3});
  REQUIRE(values_of(after) == std::vector<float>{10, 20, 30});
  REQUIRE(values_of(last) == std::vector<float>{11, 21, 31});
  const auto [before2, after2, last2] = f(fixed<float, 3>::ones());
  REQUIRE(values_of(before2) == std::vector<float>{11, 21, 31});
  REQUIRE(values_of(last2) == std::vector<float>{111, 211, 311});
}

TEST_CASE("reads in place keep program order in loop bodies, branches and around host callbacks") {
  kiln::fixed_variable<float> v(fixed<float>(1.f));
  // Each iteration reads v, doubles it, and adds what it read before the write.
  kiln::function looped([&](const auto& x) {
    return kiln::for_range(
        4,
        [&](const auto&, const auto& total) {
          const auto read = v.read_value();
          v.assign(read * 2.f);
          return total + read;
        },
        x);
  });
  REQUIRE(looped(fixed<float>(0.f)).item() == 1.f + 2.f + 4.f + 8.f);
  REQUIRE(v.value().item() == 16.f);

  // A write in a branch: the read before it keeps its value whichever branch runs.
  v.set(fixed<float>(3.f));
  kiln::function branch([&](const auto& x) {
    const auto read = v.read_value();
    kiln::cond(x > 0.f, [&] { return v.assign(x); }, [&] { return v.read_value(); });
    return read + 0.f;
  });
  REQUIRE(branch(fixed<float>(5.f)).item() == 3.f);
  REQUIRE(v.value().item() == 5.f);
  REQUIRE(branch(fixed<float>(-1.f)).item() == 5.f);

  // A host callback may set the variable: what was read before keeps its value.
  v.set(fixed<float>(7.f));
  kiln::function callback([&](const auto& x) {
    const auto read = v.read_value();
    kiln::host_callback([&](const fixed<float>&) { v.set(fixed<float>(-100.f)); }, x);
    return std::tuple(read + 0.f, v.read_value() + 0.f);
  });
  const auto [read, after] = callback(fixed<float>(0.f));
  REQUIRE(read.item() == 7.f);
  REQUIRE(after.item() == -100.f);
}

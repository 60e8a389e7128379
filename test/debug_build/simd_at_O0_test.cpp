// Built header-only at -O0 (test/CMakeLists.txt), as a user's debug build: with GCC 12
// and AVX-512BW, xsimd's integer blends (kiln's `where`, and xsimd's own `exp` and
// `log`) compile there only through kiln/core/simd.hpp. The ops run their SIMD kernels
// on arrays longer than a batch and are compared with plain C++ loops.

#include <catch2/catch.hpp>
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__OPTIMIZE__)
#error "this test checks a build without optimization: compile it at -O0"
#endif

namespace {

template <class T>
void check_where(std::int64_t n) {
  std::vector<bool> flags;
  std::vector<T> a, b;
  for (std::int64_t i = 0; i < n; ++i) {
    flags.push_back(i % 3 != 1);
    a.push_back(T(i * 1000003));
    b.push_back(T(-i - 7));
  }
  const kiln::tensor got = kiln::where(kiln::constant(flags), kiln::constant(a), kiln::constant(b));
  REQUIRE(got.dtype() == kiln::dtype_of<T>);
  const std::vector<T> values = got.template to_vector<T>();
  REQUIRE(values.size() == std::size_t(n));
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(values[i] == (flags[i] ? a[i] : b[i]));
}

}  // namespace

TEST_CASE("where blends int32 and int64 batches in a build without optimization") {
  for (std::int64_t n : {1, 15, 16, 17, 100}) {
    check_where<std::int32_t>(n);
    check_where<std::int64_t>(n);
  }
}

TEST_CASE("exp and log run their SIMD kernels in a build without optimization") {
  std::vector<float> x;
  for (int i = 0; i < 100; ++i) x.push_back(0.05f + 0.37f * float(i));
  const std::vector<float> e = kiln::exp(kiln::constant(x) * -0.25f).to_vector<float>();
  const std::vector<float> l = kiln::log(kiln::constant(x)).to_vector<float>();
  REQUIRE(e.size() == x.size());
  REQUIRE(l.size() == x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(e[i] == Approx(std::exp(double(x[i]) * -0.25)).epsilon(1e-6));
    CHECK(l[i] == Approx(std::log(double(x[i]))).epsilon(1e-6).margin(1e-7));
  }
}

TEST_CASE("a kiln::function with an integer where runs in a build without optimization") {
  kiln::function clamp_negative([](const kiln::tensor& v) { return kiln::where(v < 0, kiln::zeros_like(v), v); });
  std::vector<std::int64_t> v;
  for (std::int64_t i = -40; i < 40; ++i) v.push_back(i * 3);
  const std::vector<std::int64_t> got = clamp_negative(kiln::constant(v)).to_vector<std::int64_t>();
  REQUIRE(got.size() == v.size());
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(got[i] == (v[i] < 0 ? 0 : v[i]));
}

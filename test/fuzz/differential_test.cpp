// Differential testing on random programs (program.hpp): each program runs eagerly,
// as a kiln::function, and (for some) with jit_compile; all must give the same values
// or raise the same kind of kiln error. Any other exception, a crash or a sanitizer
// report is a defect. CI runs a fixed set of seeds; a longer run takes
// KILN_FUZZ_PROGRAMS programs from KILN_FUZZ_FIRST_SEED on (KILN_FUZZ_JIT_PROGRAMS of
// them with jit_compile, which runs the system compiler once per new fused loop).

#include "program.hpp"
#include "../support/op_check.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

using namespace kiln;
using kiln::testing::environment_number;

namespace {

/// Fails the test case with `why` when there is a disagreement (one assertion each).
void require_no_disagreement(const std::optional<std::string>& why, const char* how) {
  INFO(how << ": " << why.value_or("agrees"));
  REQUIRE_FALSE(why.has_value());
}

}  // namespace

TEST_CASE("random programs give the same values, or the same error, eagerly and as functions", "[fuzz]") {
  const std::int64_t first = environment_number("KILN_FUZZ_FIRST_SEED", 1);
  const std::int64_t count = environment_number("KILN_FUZZ_PROGRAMS", 400);
  int failed_eagerly = 0;
  for (std::int64_t seed = first; seed < first + count; ++seed) {
    INFO("seed " << seed << " (KILN_FUZZ_FIRST_SEED=" << seed << " KILN_FUZZ_PROGRAMS=1 reruns it)");
    const fuzz::program p = fuzz::program_of(std::uint32_t(seed));
    const std::vector<tensor> args = p.make_inputs(std::uint32_t(seed));
    const fuzz::outcome eager = fuzz::run_catching(p, args);
    failed_eagerly += eager.error_kind.has_value();
    function f([&p](const std::vector<tensor>& xs) { return p(xs); }, {.name = "program"});
    require_no_disagreement(fuzz::disagreement(eager, fuzz::run_catching(f, args)), "kiln::function");
    // Again with the same signature: the cached concrete function.
    require_no_disagreement(fuzz::disagreement(eager, fuzz::run_catching(f, args)), "second call");
  }
  // The generator must make both kinds of program, or half the check is idle.
  CHECK(failed_eagerly > count / 10);
  CHECK(failed_eagerly < count * 9 / 10);
}

TEST_CASE("random programs give the same values with jit_compile", "[fuzz][jit]") {
  const std::int64_t first = environment_number("KILN_FUZZ_FIRST_SEED", 1);
  const std::int64_t count = environment_number("KILN_FUZZ_JIT_PROGRAMS", 6);
  int compiled = 0;
  // Programs that run eagerly and have a fused cluster, from the first seed on.
  for (std::int64_t seed = first; compiled < count && seed < first + 100 * count; ++seed) {
    const fuzz::program p = fuzz::program_of(std::uint32_t(seed));
    const std::vector<tensor> args = p.make_inputs(std::uint32_t(seed));
    const fuzz::outcome eager = fuzz::run_catching(p, args);
    if (eager.error_kind || p.steps.size() < 3) continue;
    INFO("seed " << seed);
    ++compiled;
    function f([&p](const std::vector<tensor>& xs) { return p(xs); }, {.name = "program", .jit_compile = true});
    require_no_disagreement(fuzz::disagreement(eager, fuzz::run_catching(f, args)), "jit_compile");
  }
  CHECK(compiled == count);
}

TEST_CASE("programs that the fuzzer found failing agree now", "[fuzz]") {
  // Each is a file of fuzz/corpus; the comment says what was wrong.
  const std::vector<std::vector<std::uint8_t>> found{
      // found_exp_of_inf: tanh and exp of float64 infinities reached xsimd's scalar
      // cast of inf to int64, undefined behaviour (clang's UBSan).
      {0xd6, 0xfb, 0x22, 0x68, 0x64, 0x61, 0x41, 0x1f, 0xf9, 0x33, 0xd6, 0x3e, 0xbc, 0x3d, 0x45, 0x36,
       0x95, 0xfa, 0x9e, 0xce, 0xf1, 0xae, 0xa0, 0x85, 0xa0, 0x1c, 0xd8, 0xca, 0x75, 0xa8, 0x31, 0xca,
       0xff, 0xd4, 0x4b, 0x9a, 0xed, 0x64, 0x82, 0x2e, 0x46, 0x88, 0x3c, 0xe9, 0x52, 0xc0, 0x87, 0x72,
       0xd0, 0xca, 0x4d, 0x57, 0x0c, 0x59, 0x07, 0x44, 0x9e, 0x4f, 0x4f, 0x0d, 0x96, 0x45, 0xce, 0x53},
      // found_int64_multiply_overflow: int64 products on AVX2, which has no 64-bit
      // multiply, went through xsimd's lane-by-lane signed multiply, undefined on overflow.
      {0xcc, 0x9c, 0x16, 0x7c, 0xeb, 0x3f, 0x5b, 0x17, 0x41, 0x89, 0x96, 0x9c, 0x28, 0x81, 0x81, 0x81,
       0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81,
       0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81,
       0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x81, 0x16, 0x7c, 0xeb, 0x3f, 0x5b},
  };
  for (const auto& bytes : found) {
    const fuzz::program p = fuzz::program::decode(bytes);
    const std::vector<tensor> args = p.make_inputs(std::uint32_t(bytes.size()));  // as fuzz/fuzz_programs.cpp
    const fuzz::outcome eager = fuzz::run_catching(p, args);
    function f([&p](const std::vector<tensor>& xs) { return p(xs); }, {.name = "program"});
    require_no_disagreement(fuzz::disagreement(eager, fuzz::run_catching(f, args)), "kiln::function");
  }
}

TEST_CASE("exp and tanh of float64 infinities, NaN and huge values are IEEE's", "[fuzz]") {
  const std::vector<double> x{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::quiet_NaN(), 1e300, -1e300, 800.0, -800.0, 709.0,
                              -745.0, 21.0, -21.0, 19.5, 0.5, -0.0};
  // Long enough for the SIMD kernels (several batches), with every special value in them.
  std::vector<double> values;
  for (int k = 0; k < 8; ++k) values.insert(values.end(), x.begin(), x.end());
  const tensor t = kiln::constant(values, shape{std::int64_t(values.size())});
  const std::vector<double> e = kiln::exp(t).to_vector<double>(), h = kiln::tanh(t).to_vector<double>();
  // Equal, both NaN, or within 1e-15 relative; results below the smallest normal
  // double may flush to 0 (xsimd's exp does).
  const auto close = [](double got, double want) {
    return got == want || (std::isnan(got) && std::isnan(want)) ||
           std::abs(got - want) <= 1e-15 * std::abs(want) + std::numeric_limits<double>::min();
  };
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("x = " << values[i] << ": exp " << e[i] << ", tanh " << h[i]);
    CHECK(close(e[i], std::exp(values[i])));
    CHECK(close(h[i], std::tanh(values[i])));
  }
}

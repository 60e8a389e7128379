// Every elementwise op, on every dtype it accepts, on every backend, against the
// reference backend: same shapes, broadcasting, scalars, empty tensors, lengths
// that are not a multiple of the SIMD width, and outputs large enough to be split
// over threads.

#include <cstring>
#include <limits>

#include "../support/op_check.hpp"

using namespace kiln;
using kiln::testing::value_range;

namespace {

struct shape_case {
  std::vector<shape> inputs;
};

std::vector<shape_case> shape_cases(int arity) {
  std::vector<std::vector<shape>> base = {
      {shape{}, shape{}},          {shape{7}, shape{7}},          {shape{3, 5}, shape{5}},
      {shape{3, 1}, shape{1, 4}},  {shape{0}, shape{0}},          {shape{2, 0}, shape{1}},
      {shape{37}, shape{}},        {shape{}, shape{2, 3, 17}},    {shape{2, 3, 17}, shape{3, 1}},
      {shape{70001}, shape{70001}}, {shape{300, 257}, shape{257}}, {shape{2, 1, 3, 1}, shape{4, 1, 5}},
  };
  std::vector<shape_case> out;
  for (auto& b : base) {
    shape_case c;
    if (arity == 1) c.inputs = {b[0]};
    if (arity == 2) c.inputs = b;
    if (arity == 3) c.inputs = {b[1], b[0], b[1]};
    out.push_back(c);
  }
  return out;
}

template <class Op>
std::vector<tensor> inputs_for(const Op&, dtype t, const shape_case& c, std::uint32_t seed) {
  std::vector<tensor> in;
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    value_range range = value_range::any;
    if constexpr (requires { Op::integer_divisor; })
      if (k == 1) range = value_range::nonzero;
    if constexpr (requires { Op::integer_exponent; })
      if (k == 1) range = value_range::small_nonnegative_integer;
    dtype kt = (Op::arity == 3 && k == 0) ? bool_ : t;
    in.push_back(kiln::testing::random_tensor(kt, c.inputs[k], seed + std::uint32_t(k), range));
  }
  return in;
}

template <class Op>
void check_op(const Op& op) {
  for (dtype t : {bool_, int32, int64, float32, float64, string}) {
    if (!Op::accepts.contains(t)) continue;
    if constexpr (std::is_same_v<Op, ops::cast>)
      if (t == string) continue;  // string casts are rejected by the rule, tested below
    std::uint32_t seed = 1;
    for (const shape_case& c : shape_cases(Op::arity)) {
      INFO("dtype " << name(t) << ", case " << seed);
      kiln::testing::check_backends(op, inputs_for(op, t, c, seed++));
    }
  }
}

template <class... Ops>
void check_every_elementwise_op(boost::mp11::mp_list<Ops...>) {
  (
      [] {
        DYNAMIC_SECTION(Ops::name) {
          if constexpr (std::is_same_v<Ops, ops::cast>) {
            for (dtype to : {bool_, int32, int64, float32, float64}) check_op(ops::cast(to));
          } else {
            check_op(Ops{});
          }
        }
      }(),
      ...);
}

}  // namespace

TEST_CASE("every elementwise op matches the reference on every backend") { check_every_elementwise_op(ops::elementwise_ops{}); }

TEST_CASE("elementwise rules reject bad operands with both sides in the message") {
  tensor f = kiln::testing::random_tensor(float32, shape{2, 3}, 1);
  tensor i = kiln::testing::random_tensor(int32, shape{3}, 2);
  using kiln::testing::require_throws;
  require_throws<invalid_argument_error>([&] { return f + i; }, {"add", "float32 (2, 3)", "int32 (3,)"});
  tensor g = kiln::testing::random_tensor(float32, shape{4}, 3);
  require_throws<invalid_argument_error>([&] { return f * g; }, {"mul", "(2, 3)", "(4,)"});
  require_throws<invalid_argument_error>([&] { return kiln::exp(i); }, {"exp", "int32"});
  tensor zero = kiln::testing::make_tensor<std::int32_t>({4, 0, 1}, shape{3});
  require_throws<invalid_argument_error>([&] { return i % zero; }, {"floormod", "division by zero"});
  require_throws<invalid_argument_error>([&] { return floordiv(i, zero); }, {"floordiv", "division by zero"});
  tensor negative = kiln::testing::make_tensor<std::int32_t>({1, -1, 2}, shape{3});
  require_throws<invalid_argument_error>([&] { return kiln::pow(i, negative); }, {"pow", "negative integer powers"});
  REQUIRE_THROWS_AS(kiln::where(f, f, f), invalid_argument_error);
  REQUIRE_THROWS_AS(kiln::cast(kiln::testing::random_tensor(string, shape{2}, 1), int32), invalid_argument_error);
  REQUIRE_THROWS_AS(f + tensor(), invalid_argument_error);
}

TEST_CASE("integer elementwise semantics: floor division, floor modulo, true division, wrapping") {
  tensor a = kiln::testing::make_tensor<std::int32_t>({7, -7, 7, -7, INT32_MIN}, shape{5});
  tensor b = kiln::testing::make_tensor<std::int32_t>({2, 2, -2, -2, -1}, shape{5});
  REQUIRE(floordiv(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{3, -4, -4, 3, INT32_MIN});
  REQUIRE((a % b).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 1, -1, -1, 0});
  tensor q = a / b;
  REQUIRE(q.dtype() == float64);
  REQUIRE(q.to_vector<double>()[0] == 3.5);
  REQUIRE((-a).to_vector<std::int32_t>()[4] == INT32_MIN);
  REQUIRE(kiln::abs(a).to_vector<std::int32_t>()[1] == 7);
  REQUIRE((a + 1).dtype() == int32);
  REQUIRE((2.5 * kiln::testing::make_tensor<float>({2.f}, shape{1})).to_vector<float>()[0] == 5.f);
}

TEST_CASE("integer products and squares wrap on the SIMD path as on the scalar one") {
  // 64 lanes: whole SIMD batches on every instruction set, where AVX2 has no 64-bit
  // multiply (the fuzzer found xsimd's lane-by-lane fallback overflowing there, which
  // the sanitized build reports).
  std::vector<std::int64_t> big(64, INT64_MAX - 2), two(64, 2);
  std::vector<std::int32_t> big32(64, INT32_MAX), three32(64, 3);
  const tensor a = kiln::testing::make_tensor(big, shape{64}), b = kiln::testing::make_tensor(two, shape{64});
  const tensor a32 = kiln::testing::make_tensor(big32, shape{64}), b32 = kiln::testing::make_tensor(three32, shape{64});
  // (2^63 - 3) * 2 = 2^64 - 6, which wraps to -6; (2^31 - 1) * 3 wraps to 2^31 - 3.
  CHECK((a * b).to_vector<std::int64_t>() == std::vector<std::int64_t>(64, -6));
  CHECK((a32 * b32).to_vector<std::int32_t>() == std::vector<std::int32_t>(64, INT32_MAX - 2));
  // (2^63 - 3)^2 = 2^126 - 3 * 2^64 + 9, which is 9 modulo 2^64.
  CHECK(kiln::square(a).to_vector<std::int64_t>() == std::vector<std::int64_t>(64, 9));
  kiln::testing::check_backends(ops::multiply{}, {a, b});
  kiln::testing::check_backends(ops::square{}, {a});
}

TEST_CASE("floating casts to integers saturate instead of overflowing") {
  tensor x = kiln::testing::make_tensor<float>({1e20f, -1e20f, std::nanf(""), -2.7f, 2.7f}, shape{5});
  REQUIRE(cast(x, int32).to_vector<std::int32_t>() == std::vector<std::int32_t>{INT32_MAX, INT32_MIN, 0, -2, 2});
  REQUIRE(cast(x, bool_).to_vector<bool>() == std::vector<bool>{true, true, true, true, true});
}

TEST_CASE("string tensors concatenate and compare") {
  tensor s = kiln::testing::make_tensor<std::string>({"a", "bc"}, shape{2});
  REQUIRE((s + s).to_vector<std::string>() == std::vector<std::string>{"aa", "bcbc"});
  REQUIRE((s + "!").to_vector<std::string>() == std::vector<std::string>{"a!", "bc!"});
  REQUIRE((s == std::string("a")).to_vector<bool>() == std::vector<bool>{true, false});
  REQUIRE_THROWS_AS(s * s, invalid_argument_error);
}

TEST_CASE("outputs large enough for non-temporal stores match the reference") {
  // 2M + 5 elements: at least 8 MiB for every dtype below, and a length that is
  // not a multiple of the SIMD width; one operand broadcast in the scalar case.
  // Rows of 9 plus a broadcast row: a run per row, each starting at another
  // alignment, so most begin with outputs stored before the streamed ones.
  const shape big{(std::int64_t(1) << 21) + 5}, rows{(std::int64_t(1) << 18) + 3, 9};
  for (dtype t : {int32, int64, float32, float64}) {
    INFO("dtype " << name(t));
    tensor a = kiln::testing::random_tensor(t, big, 1), b = kiln::testing::random_tensor(t, big, 2);
    tensor s = kiln::testing::random_tensor(t, shape{}, 3);
    kiln::testing::check_backends(ops::add{}, {a, b});
    kiln::testing::check_backends(ops::multiply{}, {a, s});
    kiln::testing::check_backends(ops::negate{}, {a});
    kiln::testing::check_backends(ops::subtract{}, {kiln::testing::random_tensor(t, rows, 4),
                                                    kiln::testing::random_tensor(t, shape{9}, 5)});
  }
}

TEST_CASE("maximum and minimum propagate NaN on the SIMD path as on the scalar one") {
  const float nan = std::nanf("");
  std::vector<float> a(37, 1.f), b(37, 2.f);
  a[3] = nan, b[20] = nan, a[36] = nan;
  tensor x = kiln::testing::make_tensor(a, shape{37}), y = kiln::testing::make_tensor(b, shape{37});
  std::vector<float> mx = kiln::maximum(x, y).to_vector<float>(), mn = kiln::minimum(x, y).to_vector<float>();
  for (std::size_t i : {std::size_t(3), std::size_t(20), std::size_t(36)}) {
    CHECK(std::isnan(mx[i]));
    CHECK(std::isnan(mn[i]));
  }
  CHECK(mx[0] == 2.f);
  CHECK(mn[0] == 1.f);
  kiln::testing::check_backends(ops::maximum{}, {x, y});
  kiln::testing::check_backends(ops::minimum{}, {x, y});
}

TEST_CASE("maximum and minimum of zeros of both signs give the first operand, as std::max and TensorFlow") {
  // Equal zeros give a, whatever their signs, on the SIMD path as on the scalar one.
  std::vector<float> a(37), b(37);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = i % 2 ? -0.f : 0.f;
    b[i] = i % 2 ? 0.f : -0.f;
  }
  const tensor x = kiln::testing::make_tensor(a, shape{37}), y = kiln::testing::make_tensor(b, shape{37});
  const std::vector<float> mx = kiln::maximum(x, y).to_vector<float>(), mn = kiln::minimum(x, y).to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(std::signbit(mx[i]) == std::signbit(a[i]));
    CHECK(std::signbit(mn[i]) == std::signbit(a[i]));
  }
}

TEST_CASE("negation flips the sign of zeros on the SIMD path as on the scalar one") {
  for (dtype t : {float32, float64}) {
    INFO(t);
    std::vector<double> v(37, 0.0);
    for (std::size_t i = 0; i < v.size(); i += 2) v[i] = -0.0;
    const tensor x = kiln::cast(kiln::testing::make_tensor(v, shape{37}), t);
    const std::vector<double> r = kiln::cast(-x, float64).to_vector<double>();
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(std::signbit(r[i]) != std::signbit(v[i]));
    kiln::testing::check_backends(ops::negate{}, {x});
  }
}

TEST_CASE("float32 tanh stays within 6 ulp of the exact value and keeps the special values") {
  // Every 97th float in [0, 10] plus their negatives: about 22M points, both sides of
  // the saturation at 9 included. The reference is the double-precision tanh.
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits <= 0x41200000u; bits += 97) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    values.push_back(v);
    values.push_back(-v);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {9.f, -9.f, 8.9999995f, 1e30f, -1e30f, inf, -inf, 1e-30f, 0.f, -0.f}) values.push_back(v);
  std::vector<float> result =
      kiln::tanh(kiln::testing::make_tensor(values, shape{std::int64_t(values.size())})).to_vector<float>();
  double worst = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double exact = std::tanh(double(values[i]));
    const double error = exact == 0 ? std::fabs(double(result[i])) : std::fabs(result[i] - exact) / std::fabs(exact);
    if (error > worst) worst = error;
  }
  CHECK(worst < 4e-7);
  const std::size_t n = values.size();
  CHECK(result[n - 5] == 1.f);   // tanh(inf)
  CHECK(result[n - 4] == -1.f);  // tanh(-inf)
  CHECK(result[n - 3] == 1e-30f);
  CHECK(std::signbit(result[n - 1]));  // tanh(-0) is -0
  CHECK(std::isnan(kiln::tanh(kiln::testing::make_tensor<float>({std::nanf("")}, shape{1})).to_vector<float>()[0]));
}

TEST_CASE("floor division and remainder give the scalar results on every SIMD instruction set the build has") {
  // A build for one machine runs one instruction set: this checks the others it
  // compiles too (SSE2, which a portable build uses, included), every sign pair.
  const std::vector<float> a = {-7.5f, -2.f, 0.f, 3.25f, 5.f, -1.f, 2.f, 9.f, -0.f, 7.f, -9.f, 4.f, -4.f, 1.f, -6.f, 6.f};
  const std::vector<float> b = {2.f, -3.f, 1.5f, -0.5f, 2.f, -3.f, 1.5f, -0.5f, -2.f, -2.f, 4.f, 4.f, -4.f, 3.f, 4.f, -4.f};
  xsimd::supported_architectures::for_each([&]<class Arch>(Arch) {
    using batch = xsimd::batch<float, Arch>;
    for (std::size_t first = 0; first + batch::size <= a.size(); first += batch::size) {
      const batch x = batch::load_unaligned(a.data() + first), y = batch::load_unaligned(b.data() + first);
      alignas(64) float mod[batch::size], div[batch::size];
      kiln::math::floormod(x, y).store_unaligned(mod);
      kiln::math::floordiv(x, y).store_unaligned(div);
      for (std::size_t i = 0; i < batch::size; ++i) {
        INFO(Arch::name() << ": " << a[first + i] << " and " << b[first + i]);
        CHECK(mod[i] == kiln::math::floormod(a[first + i], b[first + i]));
        CHECK(div[i] == kiln::math::floordiv(a[first + i], b[first + i]));
      }
    }
  });
}

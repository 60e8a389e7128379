// Every elementwise op of the compile-time tier against the runtime tier: on `fixed`
// values (eager) and traced with `fixed` arguments, each must give the bits that the
// same generic lambda gives on eager kiln::tensors, for every element type it takes,
// at sizes below, at and past a SIMD batch, and broadcasting.

#include "../support/typed_check.hpp"

using namespace kiln;
using kiln::testing::value_range;

namespace {

std::uint32_t next_seed() {
  static std::uint32_t seed = 100;
  return seed++;
}

template <class X>
X random_fixed(value_range range = value_range::any) {
  return kiln::testing::random_fixed<X>(next_seed(), range);
}

template <class Fn, class... X>
void check(Fn fn, const X&... args) {
  kiln::testing::check_both_tiers(fn, args...);
}

// Under the sanitizers, which look for memory errors and undefined behaviour rather
// than for wrong values, each op runs at the shapes with a partial batch and a
// broadcast: every shape is a type with its own kernels here, and the full set doubles
// the sanitized build's longest file.
constexpr bool every_shape = !KILN_ADDRESS_SANITIZER && !KILN_THREAD_SANITIZER;

template <class T, class Fn>
void check_unary_shapes(Fn fn, value_range range = value_range::any) {
  check(fn, random_fixed<fixed<T>>(range));
  check(fn, random_fixed<fixed<T, 2, 3, 37>>(range));
  if constexpr (every_shape) {
    check(fn, random_fixed<fixed<T, 5>>(range));
    check(fn, random_fixed<fixed<T, 3, 16>>(range));
  }
}

template <class T, class Fn>
void check_binary_shapes(Fn fn, value_range range = value_range::any) {
  check(fn, random_fixed<fixed<T, 3, 37>>(), random_fixed<fixed<T, 37>>(range));     // a row
  check(fn, random_fixed<fixed<T, 2, 1, 5>>(), random_fixed<fixed<T, 3, 1>>(range)); // both ways
  check(fn, random_fixed<fixed<T>>(), random_fixed<fixed<T, 9>>(range));             // a scalar
  if constexpr (every_shape) {
    check(fn, random_fixed<fixed<T, 3, 37>>(), random_fixed<fixed<T, 3, 37>>(range));
    check(fn, random_fixed<fixed<T, 4, 1>>(), random_fixed<fixed<T, 3>>(range));  // outer product
    check(fn, random_fixed<fixed<T, 6>>(), random_fixed<fixed<T>>(range));
  }
}

}  // namespace

#define UNARY(op) [](const auto& x) { return op(x); }
#define BINARY(op) [](const auto& x, const auto& y) { return op(x, y); }

TEST_CASE("typed unary ops give the eager tensor's bits") {
  check_unary_shapes<float>(UNARY(kiln::exp));
  check_unary_shapes<double>(UNARY(kiln::exp));
  check_unary_shapes<float>(UNARY(kiln::log), value_range::positive);
  check_unary_shapes<double>(UNARY(kiln::sqrt), value_range::positive);
  check_unary_shapes<float>(UNARY(kiln::tanh));
  check_unary_shapes<double>(UNARY(kiln::tanh));
  check_unary_shapes<float>(UNARY(kiln::sigmoid));
  check_unary_shapes<float>(UNARY(kiln::sqrt), value_range::positive);
  check_unary_shapes<float>(UNARY(kiln::negative));
  check_unary_shapes<std::int32_t>(UNARY(kiln::negative));
  check_unary_shapes<std::int64_t>(UNARY(kiln::abs));
  check_unary_shapes<double>(UNARY(kiln::abs));
  check_unary_shapes<std::int32_t>(UNARY(kiln::square));
  check_unary_shapes<float>(UNARY(kiln::relu));
  check_unary_shapes<std::int64_t>(UNARY(kiln::relu));
  check_unary_shapes<bool>(UNARY(kiln::logical_not));
  check_unary_shapes<float>([](const auto& x) { return -x; });
  check_unary_shapes<float>(UNARY(kiln::erf));
  check_unary_shapes<double>(UNARY(kiln::erf));
  check_unary_shapes<float>([](const auto& x) { return kiln::gelu(x); });
  check_unary_shapes<double>([](const auto& x) { return kiln::gelu(x, true); });
  check_unary_shapes<float>(UNARY(kiln::softplus));
  check_unary_shapes<float>(UNARY(kiln::silu));
  check_unary_shapes<float>([](const auto& x) { return kiln::elu(x, 0.5); });
  check_unary_shapes<double>([](const auto& x) { return kiln::leaky_relu(x, 0.2); });
}

TEST_CASE("typed binary ops and comparisons give the eager tensor's bits, broadcasting") {
  check_binary_shapes<float>(BINARY(kiln::add));
  check_binary_shapes<std::int32_t>(BINARY(kiln::add));
  check_binary_shapes<double>(BINARY(kiln::subtract));
  check_binary_shapes<std::int64_t>(BINARY(kiln::multiply));
  check_binary_shapes<float>(BINARY(kiln::divide), value_range::nonzero);
  check_binary_shapes<std::int32_t>(BINARY(kiln::divide), value_range::nonzero);  // true division: float64
  check_binary_shapes<std::int32_t>(BINARY(kiln::floordiv), value_range::nonzero);
  check_binary_shapes<double>(BINARY(kiln::floormod), value_range::nonzero);
  check_binary_shapes<float>(BINARY(kiln::pow), value_range::small_nonnegative_integer);
  check_binary_shapes<std::int64_t>(BINARY(kiln::pow), value_range::small_nonnegative_integer);
  check_binary_shapes<float>(BINARY(kiln::maximum));
  check_binary_shapes<std::int32_t>(BINARY(kiln::minimum));
  check_binary_shapes<float>(BINARY(kiln::less));
  check_binary_shapes<std::int64_t>(BINARY(kiln::greater_equal));
  check_binary_shapes<double>(BINARY(kiln::equal));
  check_binary_shapes<bool>(BINARY(kiln::not_equal));
  check_binary_shapes<bool>(BINARY(kiln::logical_and));
  check_binary_shapes<bool>(BINARY(kiln::logical_or));
}

TEST_CASE("typed operators take C++ scalars on either side, converted to the operand's type") {
  const auto x = random_fixed<fixed<float, 3, 20>>();
  const auto i = random_fixed<fixed<std::int32_t, 7>>(value_range::nonzero);
  check([](const auto& a) { return a * 2 + 1.5; }, x);
  check([](const auto& a) { return 1.f - a / 3.f; }, x);
  check([](const auto& a) { return (a % 4) * 3 - 1; }, i);
  check([](const auto& a) { return 10 % a; }, i);
  check([](const auto& a) { return a < 0.5f; }, x);
  check([](const auto& a) { return 2 >= a; }, i);
  check([](const auto& a) { return a == 3; }, i);
}

TEST_CASE("typed where and cast give the eager tensor's bits") {
  const auto x = random_fixed<fixed<float, 2, 19>>();
  const auto y = random_fixed<fixed<float, 19>>();
  check([](const auto& a, const auto& b) { return kiln::where(a > b, a, b); }, x, y);
  check([](const auto& a) { return kiln::where(a > 0.f, a, 0.f); }, x);
  check([](const auto& a) { return kiln::where(a > 0.f, 1.f, a); }, x);
  check([](const auto& a) { return kiln::cast<std::int32_t>(a * 10.f); }, x);
}

TEST_CASE("fused typed expressions give the bits of one op at a time") {
  const auto x = random_fixed<fixed<float, 4, 37>>();
  const auto w = random_fixed<fixed<float, 37>>();
  const auto b = random_fixed<fixed<float, 4, 1>>();
  check([](const auto& a, const auto& v, const auto& c) { return kiln::tanh(a * v + c) * a - 0.25f; }, x, w, b);
  check([](const auto& a, const auto& v, const auto& c) { return kiln::sigmoid(kiln::exp(a - v) / (c * c + 1.f)); }, x, w, b);
  const auto d = random_fixed<fixed<double, 3, 5>>();
  check([](const auto& a) { return kiln::maximum(kiln::sqrt(kiln::abs(a)), a * a) - kiln::relu(-a); }, d);
}

// The typed ops that end a fused expression (reductions, matmul, transpose,
// reshape) against the runtime tier: on `fixed` values and traced with `fixed`
// arguments they must give the bits of the same generic lambda on kiln::tensors.

#include "../support/typed_check.hpp"

using namespace kiln;
using kiln::testing::require_same;

namespace {

using kiln::testing::check_both_tiers;
using kiln::testing::random_fixed;

template <class T>
void check_reductions() {
  const auto x = random_fixed<fixed<T, 3, 5, 33>>(1);
  check_both_tiers([](const auto& a) { return kiln::reduce_sum(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::reduce_sum<0>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::reduce_mean<2>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::reduce_max<0, 2>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::reduce_min<-1>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::argmax<1>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::argmax(a); }, x);
}

}  // namespace

TEST_CASE("typed reductions take axes as template arguments and give the tensor's bits") {
  check_reductions<float>();
  check_reductions<double>();
  check_reductions<std::int32_t>();
  check_reductions<std::int64_t>();
  const auto big = random_fixed<fixed<float, 70000>>(2);  // several leaves of the pairwise tree
  check_both_tiers([](const auto& a) { return kiln::reduce_sum(a); }, big);
}

TEST_CASE("keep_dims keeps reduced dims with size 1") {
  const auto x = random_fixed<fixed<float, 4, 6>>(3);
  const auto kept = kiln::reduce_sum<1>(x, kiln::keep_dims);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(kept)>, fixed<float, 4, 1>>);
  require_same(tensor(kept), kiln::reduce_sum(tensor(x), 1, true), 0);
}

TEST_CASE("typed reductions of expressions fuse the expression, then reduce") {
  const auto x = random_fixed<fixed<float, 8, 40>>(4);
  check_both_tiers([](const auto& a) { return kiln::reduce_sum<1>(a * a + 1.f) / kiln::reduce_max(kiln::abs(a)); }, x);
}

TEST_CASE("typed matmul gives the tensor's bits, batched and broadcast") {
  check_both_tiers([](const auto& a, const auto& b) { return kiln::matmul(a, b); }, random_fixed<fixed<float, 8, 64>>(5),
        random_fixed<fixed<float, 64, 32>>(6));
  check_both_tiers([](const auto& a, const auto& b) { return kiln::matmul(a, b); }, random_fixed<fixed<std::int32_t, 10, 10>>(7),
        random_fixed<fixed<std::int32_t, 10, 10>>(8));
  check_both_tiers([](const auto& a, const auto& b) { return kiln::matmul(a, b); }, random_fixed<fixed<double, 2, 3, 5>>(9),
        random_fixed<fixed<double, 5, 4>>(10));
  check_both_tiers([](const auto& a, const auto& w, const auto& b) { return kiln::tanh(kiln::matmul(a, w) + b); },
        random_fixed<fixed<float, 8, 64>>(11), random_fixed<fixed<float, 64, 32>>(12), random_fixed<fixed<float, 32>>(13));
}

TEST_CASE("typed transpose and reshape") {
  const auto x = random_fixed<fixed<std::int64_t, 2, 3, 4>>(14);
  check_both_tiers([](const auto& a) { return kiln::transpose(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::transpose<1, 0, 2>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::transpose<2, 0, 1>(a * 3) - 1; }, x);
  const auto y = random_fixed<fixed<float, 6, 4>>(15);
  const auto r = kiln::reshape<3, 8>(y);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(r)>, fixed<float, 3, 8>>);
  require_same(tensor(r), kiln::reshape(tensor(y), {3, 8}), 0);
  kiln::function f([](auto a) { return kiln::reshape<24>(a) * 2.f; });
  require_same(tensor(f(y)), kiln::reshape(tensor(y), {24}) * 2.f, 0);
}

TEST_CASE("typed concat and stack join along a dim, checked at compile time") {
  const auto a = random_fixed<fixed<float, 2, 3>>(16);
  const auto b = random_fixed<fixed<float, 2, 1>>(17);
  check_both_tiers([](const auto& x, const auto& y) { return kiln::concat<1>(x, y); }, a, b);
  check_both_tiers([](const auto& x, const auto& y) { return kiln::concat<-1>(x * 2.f, y, x); }, a, b);
  check_both_tiers([](const auto& x) { return kiln::concat<0>(x, x); }, a);
  check_both_tiers([](const auto& x) { return kiln::stack<0>(x, x + 1.f); }, a);
  check_both_tiers([](const auto& x) { return kiln::stack<2>(x, x, -x); }, a);
  const auto joined = kiln::concat<1>(a, b);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(joined)>, fixed<float, 2, 4>>);
}

TEST_CASE("typed slice takes begin and size as template arguments, checked at compile time") {
  const auto x = random_fixed<fixed<std::int32_t, 3, 4, 5>>(18);
  check_both_tiers([](const auto& a) { return kiln::slice<std::array{1, 0, 2}, std::array{2, 4, 3}>(a); }, x);
  check_both_tiers([](const auto& a) { return kiln::slice<std::array{0, 3, 0}, std::array{-1, -1, 1}>(a * 2); }, x);
  const auto s = kiln::slice<std::array{1, 1, 1}, std::array{1, -1, 2}>(x);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(s)>, fixed<std::int32_t, 1, 3, 2>>);
  REQUIRE(s(0, 2, 1) == x(1, 3, 2));
}

TEST_CASE("typed gather takes its axis as a template argument and checks indices when it runs") {
  const auto x = random_fixed<fixed<double, 4, 3>>(19);
  const auto rows = fixed<std::int32_t, 2, 2>{3, 0, 1, 1};
  const auto columns = fixed<std::int64_t, 3>{2, 2, 0};
  check_both_tiers([](const auto& a, const auto& i) { return kiln::gather(a, i); }, x, rows);
  check_both_tiers([](const auto& a, const auto& i) { return kiln::gather<1>(a * 2., i); }, x, columns);
  check_both_tiers([](const auto& a, const auto& i) { return kiln::gather<-1>(a, i); }, x, columns);
  const auto g = kiln::gather(x, rows);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(g)>, fixed<double, 2, 2, 3>>);
  REQUIRE(g(0, 0, 1) == x(3, 1));
  // An index out of range raises the runtime tier's error, eagerly and in a trace.
  const auto bad = fixed<std::int32_t, 2>{1, 4};
  std::string expected;
  try {
    kiln::gather(tensor(x), tensor(bad));
  } catch (const invalid_argument_error& e) {
    expected = e.what();
  }
  REQUIRE(expected == "gather: indices[1] = 4 is not in [0, 4) for axis 0 of shape (4, 3)");
  REQUIRE_THROWS_WITH(kiln::gather(x, bad), expected);
  kiln::function f([](const auto& a, const auto& i) { return kiln::gather(a, i); });
  REQUIRE_THROWS_WITH(f(x, bad), expected);
}

TEST_CASE("typed conv2d takes padding and strides as template arguments and gives the kernel's values") {
  const auto image = random_fixed<fixed<float, 2, 6, 5, 3>>(20);
  const auto filters = random_fixed<fixed<float, 3, 2, 3, 4>>(21);
  check_both_tiers([](const auto& x, const auto& f) { return kiln::conv2d<kiln::padding::valid>(x, f); }, image, filters);
  check_both_tiers([](const auto& x, const auto& f) { return kiln::conv2d<kiln::padding::same, 2>(x, f); }, image, filters);
  check_both_tiers([](const auto& x, const auto& f) { return kiln::conv2d<kiln::padding::same, 1, 3>(x * 0.5f, f) + 1.f; }, image,
        filters);
  const auto ints = random_fixed<fixed<std::int32_t, 1, 4, 4, 1>>(22);
  const auto int_filters = random_fixed<fixed<std::int32_t, 2, 2, 1, 2>>(23);
  check_both_tiers([](const auto& x, const auto& f) { return kiln::conv2d<kiln::padding::valid, 2>(x, f); }, ints, int_filters);
  const auto y = kiln::conv2d<kiln::padding::same, 2>(image, filters);
  STATIC_REQUIRE(std::is_same_v<std::remove_const_t<decltype(y)>, fixed<float, 2, 3, 3, 4>>);
}

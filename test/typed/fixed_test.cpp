// kiln::fixed values: storage, element access, factories, printing and the
// conversions to and from kiln::tensor.

#include "../support/op_check.hpp"

#include <sstream>

using namespace kiln;
using kiln::testing::require_same;
using kiln::testing::require_throws;

TEST_CASE("a fixed's type gives its dtype, dims, rank and size") {
  using m = fixed<float, 2, 3>;
  STATIC_REQUIRE(m::rank == 2);
  STATIC_REQUIRE(m::size == 6);
  STATIC_REQUIRE(m::dims == std::array<std::int64_t, 2>{2, 3});
  STATIC_REQUIRE(m::dtype == float32);
  STATIC_REQUIRE(fixed<int>::rank == 0);
  STATIC_REQUIRE(fixed<int>::size == 1);
  REQUIRE(m::shape() == shape{2, 3});
}

TEST_CASE("small fixed values live inline, large ones on the heap, all 64-byte aligned") {
  STATIC_REQUIRE(sizeof(fixed<float, 64, 32>) >= 64 * 32 * sizeof(float));  // inline
  STATIC_REQUIRE(sizeof(fixed<float, 1 << 20>) == sizeof(void*));         // a pointer to the heap
  fixed<float, 3> small;
  fixed<double, 1 << 16> large = fixed<double, 1 << 16>::ones();
  REQUIRE(reinterpret_cast<std::uintptr_t>(small.data()) % 64 == 0);
  REQUIRE(reinterpret_cast<std::uintptr_t>(large.data()) % 64 == 0);
  fixed<double, 1 << 16> copy = large;  // a deep copy
  copy(5) = 2;
  REQUIRE(large(5) == 1);
  REQUIRE(copy(5) == 2);
}

TEST_CASE("fixed values are zeros by default, filled by factories and indexed row-major") {
  fixed<int, 2, 3> z;
  for (int i = 0; i < 6; ++i) REQUIRE(z.data()[i] == 0);
  fixed<int, 2, 3> x{1, 2, 3, 4, 5, 6};
  REQUIRE(x(1, 0) == 4);
  x(0, 2) = 9;
  REQUIRE(x.data()[2] == 9);
  REQUIRE(fixed<float, 2, 2>::fill(2.5f)(1, 1) == 2.5f);
  REQUIRE(fixed<double, 3, 3>::eye()(1, 1) == 1);
  REQUIRE(fixed<double, 3, 3>::eye()(1, 2) == 0);
  require_same(tensor(fixed<int, 5>::range(2, 3)), kiln::range(2, 17, 3), 0);
  require_same(tensor(fixed<float, 4, 3>::uniform(7, -1.f, 1.f)),
               kiln::random::stateless_uniform({4, 3}, 7, -1, 1, float32), 0);
  fixed<float> s = 2.5f;
  REQUIRE(s.item() == 2.5f);
  require_throws<value_error>([] { return fixed<int, 3>{1, 2}; }, {"kiln::fixed", "2 values", "(3,)"});
}

TEST_CASE("fixed values print exactly as kiln::tensor") {
  const fixed<int, 2, 2> x{1, 2, 3, 4};
  std::ostringstream a, b;
  a << x;
  b << tensor(x);
  REQUIRE(a.str() == b.str());
  REQUIRE(a.str() == "tensor(\n[[1 2]\n [3 4]], shape=(2, 2), dtype=int32)");
}

TEST_CASE("fixed converts to kiln::tensor and back through a checked conversion") {
  const fixed<float, 2, 3> x = fixed<float, 2, 3>::uniform(1);
  const tensor t = x;
  REQUIRE(t.dtype() == float32);
  REQUIRE(t.shape() == shape{2, 3});
  const fixed<float, 2, 3> back(t);
  for (int i = 0; i < 6; ++i) REQUIRE(back.data()[i] == x.data()[i]);
  require_throws<value_error>([&] { return fixed<float, 3, 2>(t); }, {"kiln::fixed", "float32 (2, 3)", "float32 (3, 2)"});
  require_throws<value_error>([&] { return fixed<double, 2, 3>(t); }, {"float32 (2, 3)", "float64 (2, 3)"});
}

TEST_CASE("spec describes a fixed argument") {
  REQUIRE(spec<std::int32_t, 3>::str() == "int32 Tensor, shape=(3,)");
  STATIC_REQUIRE(std::is_same_v<spec<float, 2>::value_type, fixed<float, 2>>);
}

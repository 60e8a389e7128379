// The gpu device and its Thrust backend beyond op-by-op agreement (which the
// cross-backend suites check): transfers, where results live, device errors, and
// kernels reading tensors that are windows of a larger buffer.

#include "../support/op_check.hpp"

#if KILN_HAS_THRUST

using namespace kiln;
using kiln::testing::make_tensor;
using kiln::testing::random_tensor;
using kiln::testing::require_same;
using kiln::testing::require_throws;

namespace {

template <class... Ops>
constexpr bool thrust_supports_all(ops::type_list<Ops...>) {
  return (backend::supports<backend::thrust_backend, Ops> && ...);
}

}  // namespace

TEST_CASE("the thrust backend has a kernel for every elementwise op") {
  STATIC_REQUIRE(thrust_supports_all(ops::elementwise_ops{}));
  REQUIRE(detail::gpu_memory_slot() != nullptr);
}

TEST_CASE("tensors travel to the gpu and back unchanged") {
  for (dtype t : {bool_, int32, int64, float32, float64}) {
    for (const shape& s : {shape{}, shape{0}, shape{3, 0, 2}, shape{5, 7}, shape{(1 << 20) + 3}}) {
      INFO(name(t) << " " << s);
      tensor x = random_tensor(t, s, 7);
      tensor g = x.to(device::gpu);
      REQUIRE(g.device() == device::gpu);
      REQUIRE(g.dtype() == t);
      REQUIRE(g.shape() == s);
      tensor back = g.to(device::cpu);
      REQUIRE(back.device() == device::cpu);
      require_same(back, x, 0);
    }
  }
}

TEST_CASE("moving a tensor to the device it is on shares its buffer") {
  tensor g = make_tensor<float>({1.f, 2.f}, shape{2}).to(device::gpu);
  REQUIRE(g.to(device::gpu).raw_data() == g.raw_data());
}

TEST_CASE("gpu tensors are read through a copy to the cpu") {
  tensor g = make_tensor<std::int32_t>({4, 5, 6}, shape{3}).to(device::gpu);
  REQUIRE(g.to_vector<std::int32_t>() == std::vector<std::int32_t>{4, 5, 6});
  require_throws<invalid_argument_error>([&] { return g.data<std::int32_t>(); }, {"gpu", ".to(kiln::device::cpu)"});
  tensor s = make_tensor<double>({2.5}, shape{}).to(device::gpu);
  require_throws<invalid_argument_error>([&] { return s.item<double>(); }, {"gpu"});
  REQUIRE(s.to(device::cpu).item<double>() == 2.5);
}

TEST_CASE("string tensors stay on the cpu") {
  tensor s = make_tensor<std::string>({"a", "b"}, shape{2});
  require_throws<type_error>([&] { return s.to(device::gpu); }, {"string", "gpu"});
}

TEST_CASE("ops on gpu tensors run on the gpu and agree with the cpu") {
  tensor x = random_tensor(float32, shape{4, 1, 3}, 1);
  tensor y = random_tensor(float32, shape{5, 1}, 2);
  tensor gx = x.to(device::gpu), gy = y.to(device::gpu);

  tensor g = kiln::where(gx > gy, kiln::tanh(gx * gy + 1.f), 2 - gy);
  REQUIRE(g.device() == device::gpu);
  REQUIRE(g.shape() == shape{4, 5, 3});
  require_same(g.to(device::cpu), kiln::where(x > y, kiln::tanh(x * y + 1.f), 2 - y));

  tensor i = kiln::cast(gx * 10.f, int64);
  REQUIRE(i.device() == device::gpu);
  require_same(i.to(device::cpu), kiln::cast(x * 10.f, int64));
}

TEST_CASE("gpu kernels compute hand-checked values") {
  tensor a = make_tensor<std::int32_t>({7, -7, 7, -7, INT32_MIN}, shape{5}).to(device::gpu);
  tensor b = make_tensor<std::int32_t>({2, 2, -2, -2, -1}, shape{5}).to(device::gpu);
  REQUIRE(floordiv(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{3, -4, -4, 3, INT32_MIN});
  REQUIRE((a % b).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 1, -1, -1, 0});
  REQUIRE((a / b).to_vector<double>() == std::vector<double>{3.5, -3.5, -3.5, 3.5, 2147483648.0});
  tensor row = make_tensor<std::int64_t>({1, 2, 3}, shape{3}).to(device::gpu);
  tensor col = make_tensor<std::int64_t>({10, 20}, shape{2, 1}).to(device::gpu);
  REQUIRE((col + row).to_vector<std::int64_t>() == std::vector<std::int64_t>{11, 12, 13, 21, 22, 23});
  tensor f = make_tensor<float>({1e20f, -2.7f}, shape{2}).to(device::gpu);
  REQUIRE(kiln::cast(f, int32).to_vector<std::int32_t>() == std::vector<std::int32_t>{INT32_MAX, -2});
}

TEST_CASE("gpu kernels read tensors that are windows of a larger buffer") {
  tensor whole = make_tensor<float>({0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f}, shape{8}).to(device::gpu);
  tensor window = whole.share(shape{2, 2}, 3);  // elements 3..6
  tensor scale = make_tensor<float>({10.f, 100.f}, shape{2}).to(device::gpu);
  REQUIRE((window * scale).to_vector<float>() == std::vector<float>{30.f, 400.f, 50.f, 600.f});
}

TEST_CASE("gpu ops reject what cpu ops reject") {
  tensor g = make_tensor<std::int32_t>({1, 2}, shape{2}).to(device::gpu);
  tensor zero = make_tensor<std::int32_t>({1, 0}, shape{2}).to(device::gpu);
  require_throws<invalid_argument_error>([&] { return g % zero; }, {"floormod", "division by zero"});
  tensor c = make_tensor<std::int32_t>({1, 2}, shape{2});
  require_throws<invalid_argument_error>([&] { return g + c; }, {"add", "different devices", "cpu", "gpu"});
  tensor three = make_tensor<std::int32_t>({1, 2, 3}, shape{3}).to(device::gpu);
  require_throws<value_error>([&] { return three * g; }, {"mul", "(3,)", "(2,)"});
}

TEST_CASE("empty gpu tensors flow through ops") {
  tensor e = random_tensor(float64, shape{0, 3}, 1).to(device::gpu);
  tensor r = kiln::exp(e) + 1.0;
  REQUIRE(r.device() == device::gpu);
  REQUIRE(r.shape() == shape{0, 3});
  REQUIRE(r.to_vector<double>().empty());
}

#endif  // KILN_HAS_THRUST

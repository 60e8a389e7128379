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
constexpr bool thrust_supports_all(boost::mp11::mp_list<Ops...>) {
  return (backend::supports<backend::thrust_backend, Ops> && ...);
}

tensor on_gpu(const tensor& t) { return t.to(device::gpu); }

template <class T>
std::vector<T> values_of(const tensor& t) {
  REQUIRE(t.device() == device::gpu);
  return t.to_vector<T>();
}

}  // namespace

TEST_CASE("the thrust backend has a kernel for every op that computes values") {
  STATIC_REQUIRE(thrust_supports_all(ops::elementwise_ops{}));
  STATIC_REQUIRE(thrust_supports_all(ops::reduction_ops{}));
  STATIC_REQUIRE(thrust_supports_all(ops::linalg_ops{}));
  STATIC_REQUIRE(thrust_supports_all(
      boost::mp11::mp_list<ops::transpose, ops::concat, ops::stack, ops::gather, ops::unsorted_segment_sum, ops::slice>{}));
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
  require_throws<invalid_argument_error>([&] { return three * g; }, {"mul", "(3,)", "(2,)"});
}

TEST_CASE("empty gpu tensors flow through ops") {
  tensor e = random_tensor(float64, shape{0, 3}, 1).to(device::gpu);
  tensor r = kiln::exp(e) + 1.0;
  REQUIRE(r.device() == device::gpu);
  REQUIRE(r.shape() == shape{0, 3});
  REQUIRE(r.to_vector<double>().empty());
}

TEST_CASE("gpu reductions compute hand-checked values on both kernel paths") {
  tensor m = on_gpu(make_tensor<std::int32_t>({1, 2, 3, 4, 5, 6}, shape{2, 3}));
  REQUIRE(values_of<std::int32_t>(kiln::reduce_sum(m, 0)) == std::vector<std::int32_t>{5, 7, 9});   // one thread per output
  REQUIRE(values_of<std::int32_t>(kiln::reduce_sum(m, 1)) == std::vector<std::int32_t>{6, 15});     // reduce_by_key
  REQUIRE(values_of<std::int32_t>(kiln::reduce_mean(m, {}, true)) == std::vector<std::int32_t>{3});
  REQUIRE(values_of<std::int64_t>(kiln::argmax(m, 0)) == std::vector<std::int64_t>{1, 1, 1});
  REQUIRE(kiln::reduce_max(m, 1, true).shape() == shape{2, 1});

  // argmax keeps the first NaN, else the first largest, however the device splits the work.
  std::vector<float> row(1000, 1.f);
  row[10] = 7.f, row[600] = 7.f, row[700] = std::nanf(""), row[900] = std::nanf("");
  std::vector<float> rows = row;
  rows.insert(rows.end(), row.begin(), row.begin() + 500);  // second row: no NaN
  rows.insert(rows.end(), 500, 1.f);
  tensor x = on_gpu(make_tensor<float>(rows, shape{2, 1000}));
  REQUIRE(values_of<std::int64_t>(kiln::argmax(x, 1)) == std::vector<std::int64_t>{700, 10});
  std::vector<float> max = values_of<float>(kiln::reduce_max(x, 1));
  REQUIRE(std::isnan(max[0]));
  REQUIRE(max[1] == 7.f);
}

TEST_CASE("gpu float sums keep the low-order bits and infinities") {
  tensor cancelling = on_gpu(make_tensor<double>({1e16, 1.0, -1e16}, shape{3}));
  REQUIRE(kiln::reduce_sum(cancelling).to(device::cpu).item<double>() == 1.0);  // a plain double sum gives 0
  tensor infinite = on_gpu(make_tensor<float>({INFINITY, 1.f, 2.f}, shape{3}));
  REQUIRE(kiln::reduce_sum(infinite).to(device::cpu).item<float>() == INFINITY);
  tensor opposite = on_gpu(make_tensor<float>({INFINITY, -INFINITY}, shape{2}));
  REQUIRE(std::isnan(kiln::reduce_sum(opposite).to(device::cpu).item<float>()));
}

TEST_CASE("gpu reductions over nothing give the identity") {
  tensor e = on_gpu(random_tensor(float32, shape{2, 0}, 1));
  REQUIRE(values_of<float>(kiln::reduce_sum(e, 1)) == std::vector<float>{0.f, 0.f});
  REQUIRE(std::isnan(values_of<float>(kiln::reduce_mean(e, 1))[0]));
  REQUIRE(values_of<float>(kiln::reduce_max(e, 1))[0] == -INFINITY);
  REQUIRE(values_of<float>(kiln::reduce_min(e, 1))[0] == INFINITY);
  require_throws<invalid_argument_error>([&] { return kiln::argmax(e, 1); }, {"argmax", "empty"});
}

TEST_CASE("gpu data movement computes hand-checked values") {
  tensor m = on_gpu(make_tensor<std::int64_t>({1, 2, 3, 4, 5, 6}, shape{2, 3}));
  REQUIRE(values_of<std::int64_t>(kiln::transpose(m)) == std::vector<std::int64_t>{1, 4, 2, 5, 3, 6});
  REQUIRE(values_of<std::int64_t>(kiln::slice(m, {0, 1}, {2, -1})) == std::vector<std::int64_t>{2, 3, 5, 6});
  tensor column = on_gpu(make_tensor<std::int64_t>({7, 8}, shape{2, 1}));
  REQUIRE(values_of<std::int64_t>(kiln::concat({m, column}, 1)) == std::vector<std::int64_t>{1, 2, 3, 7, 4, 5, 6, 8});
  tensor nines = on_gpu(make_tensor<std::int64_t>({9, 9, 9}, shape{3}));
  tensor tens = on_gpu(make_tensor<std::int64_t>({10, 10, 10}, shape{3}));
  REQUIRE(values_of<std::int64_t>(kiln::stack({nines, tens}, 1)) == std::vector<std::int64_t>{9, 10, 9, 10, 9, 10});
  tensor picks = on_gpu(make_tensor<std::int32_t>({2, 0, 2}, shape{3}));
  REQUIRE(values_of<std::int64_t>(kiln::gather(m, picks, 1)) == std::vector<std::int64_t>{3, 1, 3, 6, 4, 6});
}

TEST_CASE("gpu gathers reject indices outside the gathered dim before reading") {
  tensor m = on_gpu(make_tensor<float>({1.f, 2.f, 3.f, 4.f}, shape{2, 2}));
  for (std::int64_t bad : {2, -1}) {
    tensor picks = on_gpu(make_tensor<std::int64_t>({0, bad}, shape{2}));
    require_throws<invalid_argument_error>([&] { return kiln::gather(m, picks); },
                                           {"gather", std::to_string(bad), "[0, 2)"});
  }
}

TEST_CASE("ops that re-describe a buffer keep gpu tensors on the gpu") {
  tensor m = on_gpu(make_tensor<float>({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, shape{2, 3}));
  tensor r = kiln::reshape(m, {3, -1});
  REQUIRE(r.shape() == shape{3, 2});
  REQUIRE(values_of<float>(r[2]) == std::vector<float>{5.f, 6.f});
  REQUIRE(values_of<std::int32_t>(kiln::shape_of(r)) == std::vector<std::int32_t>{3, 2});
}

TEST_CASE("gpu matmul and conv2d compute hand-checked values") {
  tensor a = on_gpu(make_tensor<float>({1.f, 2.f, 3.f, 4.f}, shape{2, 2}));
  tensor b = on_gpu(make_tensor<float>({5.f, 6.f, 7.f, 8.f, 1.f, 0.f, 0.f, 1.f}, shape{2, 2, 2}));
  REQUIRE(values_of<float>(kiln::matmul(a, b)) == std::vector<float>{19.f, 22.f, 43.f, 50.f, 1.f, 2.f, 3.f, 4.f});

  tensor image = on_gpu(make_tensor<std::int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9}, shape{1, 3, 3, 1}));
  tensor ones = on_gpu(make_tensor<std::int32_t>({1, 1, 1, 1}, shape{2, 2, 1, 1}));
  REQUIRE(values_of<std::int32_t>(kiln::conv2d(image, ones, 1, "VALID")) == std::vector<std::int32_t>{12, 16, 24, 28});
  REQUIRE(values_of<std::int32_t>(kiln::conv2d(image, ones, 2, "SAME")) == std::vector<std::int32_t>{12, 9, 15, 9});
}

#endif  // KILN_HAS_THRUST

// Reduction semantics against hand-written expected values: axes, negative axes,
// lists, keepdims, empty reductions, integer wrapping and truncation, NaN, argmax
// ties, float32 accuracy on large inputs, results that do not depend on the thread
// count, the shape rule on partial shapes, and every error.

#include "../support/op_check.hpp"

#include <limits>

using namespace kiln;
using kiln::testing::make_tensor;
using kiln::testing::require_values;
using kiln::testing::require_throws;

namespace {

/// Restores the thread count when a test that changes it ends.
struct thread_count_guard {
  int saved = config::num_threads();
  ~thread_count_guard() { config::set_num_threads(saved); }
};

}  // namespace

TEST_CASE("reductions over all axes, one axis, negative axes, lists and keepdims") {
  const tensor x = make_tensor<std::int32_t>({1, 2, 3, 4, 5, 6}, shape{2, 3});
  require_values<std::int32_t>(reduce_sum(x), shape{}, {21});
  require_values<std::int32_t>(reduce_sum(x, {}), shape{}, {21});
  require_values<std::int32_t>(reduce_sum(x, 0), shape{3}, {5, 7, 9});
  require_values<std::int32_t>(reduce_sum(x, 1), shape{2}, {6, 15});
  require_values<std::int32_t>(reduce_sum(x, -1, true), shape{2, 1}, {6, 15});
  require_values<std::int32_t>(reduce_sum(x, -2, true), shape{1, 3}, {5, 7, 9});
  require_values<std::int32_t>(reduce_sum(x, {0, 1}), shape{}, {21});
  require_values<std::int32_t>(reduce_sum(x, {1, 0}, true), shape{1, 1}, {21});
  require_values<std::int32_t>(reduce_sum(x, std::nullopt, true), shape{1, 1}, {21});
  require_values<std::int32_t>(reduce_sum(x, int_list{}), shape{2, 3}, {1, 2, 3, 4, 5, 6});
  require_values<std::int32_t>(reduce_max(x, 0), shape{3}, {4, 5, 6});
  require_values<std::int32_t>(reduce_min(x, 1), shape{2}, {1, 4});
  require_values<std::int32_t>(reduce_mean(x, 1), shape{2}, {2, 5});

  const tensor cube = make_tensor<double>({1, 2, 3, 4, 5, 6, 7, 8}, shape{2, 2, 2});
  require_values<double>(reduce_sum(cube, {0, 2}), shape{2}, {1 + 2 + 5 + 6, 3 + 4 + 7 + 8});
  require_values<double>(reduce_max(cube, {0, -1}, true), shape{1, 2, 1}, {6, 8});
  require_values<double>(reduce_mean(cube, {0, 1}), shape{2}, {4, 5});

  const tensor scalar = make_tensor<float>({2.5f}, shape{});
  require_values<float>(reduce_sum(scalar), shape{}, {2.5f});
  require_values<float>(reduce_max(scalar, std::nullopt, true), shape{}, {2.5f});
  require_values<std::int64_t>(argmax(scalar), shape{}, {0});
}

TEST_CASE("integer sums wrap and integer means truncate toward zero") {
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  require_values<std::int32_t>(reduce_sum(make_tensor<std::int32_t>({big, 1}, shape{2})), shape{}, {std::numeric_limits<std::int32_t>::min()});
  // 1000 * 2^30 is 250 * 2^32: the wrapped sum is 0, on the SIMD and threaded paths too.
  require_values<std::int32_t>(reduce_sum(make_tensor(std::vector<std::int32_t>(1000, 1 << 30), shape{1000})), shape{}, {0});
  require_values<std::int64_t>(reduce_sum(make_tensor(std::vector<std::int64_t>(100000, std::int64_t(1) << 62), shape{100000})), shape{}, {0});
  const tensor m = make_tensor<std::int32_t>({1, 2, -3, -4, 7, 0}, shape{3, 2});
  require_values<std::int32_t>(reduce_mean(m, 1), shape{3}, {1, -3, 3});
  require_values<std::int64_t>(reduce_mean(make_tensor<std::int64_t>({-7, 0, 0}, shape{3})), shape{}, {-2});
  require_values<float>(reduce_mean(make_tensor<float>({1, 2, -3, -4, 7, 0}, shape{3, 2}), 1), shape{3}, {1.5f, -3.5f, 3.5f});
}

TEST_CASE("empty reductions give the identity: 0, NaN, the lowest or largest value") {
  const tensor f = tensor(float32, shape{2, 0});
  require_values<float>(reduce_sum(f, 1), shape{2}, {0.f, 0.f});
  require_values<float>(reduce_max(f, 1), shape{2}, {-INFINITY, -INFINITY});
  require_values<float>(reduce_min(f, -1, true), shape{2, 1}, {INFINITY, INFINITY});
  const tensor mean = reduce_mean(tensor(float64, shape{0}));
  REQUIRE(mean.shape() == shape{});
  REQUIRE(std::isnan(mean.item<double>()));
  require_values<std::int32_t>(reduce_mean(tensor(int32, shape{0})), shape{}, {0});
  require_values<std::int32_t>(reduce_max(tensor(int32, shape{0})), shape{}, {std::numeric_limits<std::int32_t>::lowest()});
  require_values<std::int64_t>(reduce_min(tensor(int64, shape{3, 0}), 1), shape{3},
                               std::vector<std::int64_t>(3, std::numeric_limits<std::int64_t>::max()));
  require_values<std::int32_t>(reduce_sum(tensor(int32, shape{0, 4}), 1), shape{0}, {});  // nothing to write
}

TEST_CASE("NaN wins reduce_max and reduce_min, and argmax points at the first NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const tensor x = make_tensor<float>({1, nan, 3, nan, -1, 2}, shape{2, 3});
  REQUIRE(std::isnan(reduce_max(x).item<float>()));
  REQUIRE(std::isnan(reduce_min(x).item<float>()));
  std::vector<float> rows = reduce_max(x, 1).to_vector<float>();
  REQUIRE((std::isnan(rows[0]) && std::isnan(rows[1])));
  std::vector<float> columns = reduce_min(x, 0).to_vector<float>();
  REQUIRE((std::isnan(columns[0]) && std::isnan(columns[1]) && columns[2] == 2));
  require_values<std::int64_t>(argmax(x), shape{}, {1});
  require_values<std::int64_t>(argmax(x, 1), shape{2}, {1, 0});
  require_values<std::int64_t>(argmax(x, 0), shape{3}, {1, 0, 0});

  // A NaN late in a long input still wins, on the SIMD and threaded paths.
  std::vector<float> long_input(100000, 1.f);
  long_input[99990] = nan;
  long_input[99995] = nan;
  require_values<std::int64_t>(argmax(make_tensor(long_input, shape{100000})), shape{}, {99990});
  REQUIRE(std::isnan(reduce_max(make_tensor(long_input, shape{100000})).item<float>()));
  REQUIRE(std::isnan(reduce_min(make_tensor(long_input, shape{1000, 100}), 0).to_vector<float>()[90]));
}

TEST_CASE("argmax gives the first index of the largest value") {
  require_values<std::int64_t>(argmax(make_tensor<std::int32_t>({3, 7, 7, 1}, shape{4})), shape{}, {1});
  const tensor x = make_tensor<std::int64_t>({1, 9, 9, 8, 2, 3}, shape{2, 3});
  require_values<std::int64_t>(argmax(x, 1), shape{2}, {1, 0});
  require_values<std::int64_t>(argmax(x, 0), shape{3}, {1, 0, 0});
  require_values<std::int64_t>(argmax(x, -1, true), shape{2, 1}, {1, 0});
  require_values<std::int64_t>(argmax(x), shape{}, {1});
  require_values<std::int64_t>(argmax(x, {0, 1}), shape{}, {1});
  require_values<std::int64_t>(argmax(make_tensor<float>({-INFINITY, -INFINITY}, shape{2})), shape{}, {0});

  // Over a list of axes the index counts the reduced positions (i, k) in row-major order.
  const tensor cube = make_tensor<float>({0, 5, 1, 1,    // i = 0: (j=0: k=0,1), (j=1: k=0,1)
                                          5, 2, 9, 1},   // i = 1
                                         shape{2, 2, 2});
  require_values<std::int64_t>(argmax(cube, {0, 2}), shape{2}, {1, 2});

  // Ties between leaves, SIMD lanes and threads resolve to the first index too.
  std::vector<double> flat(70000, 0.0);
  flat[12345] = flat[54321] = flat[69999] = 4.0;
  require_values<std::int64_t>(argmax(make_tensor(flat, shape{70000})), shape{}, {12345});
  require_values<std::int64_t>(argmax(make_tensor(flat, shape{7000, 10}), 0), shape{10},
                               {0, 5432, 0, 0, 0, 1234, 0, 0, 0, 6999});
}

TEST_CASE("float32 sums of 16M values stay close to the exact sum") {
  const std::int64_t n = std::int64_t(1) << 24;
  std::vector<float> values(n);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  double exact = 0;
  for (float& v : values) {
    v = uniform(gen);
    exact += v;
  }
  const tensor x = make_tensor(values, shape{n});
  // Relative errors here: a sequential float32 sum 3e-5, 128 SIMD lanes summed in
  // sequence 8e-7, a pairwise sum 4e-8 (the rounding of the result itself).
  REQUIRE(std::abs(double(reduce_sum(x).item<float>()) - exact) <= 2e-7 * exact);
  REQUIRE(std::abs(double(reduce_mean(x).item<float>()) - exact / double(n)) <= 2e-7 * exact / double(n));
  std::vector<float> columns = reduce_sum(x.share(shape{n / 16, 16}), 0).to_vector<float>();
  double exact0 = 0;
  for (std::int64_t i = 0; i < n; i += 16) exact0 += values[i];
  REQUIRE(std::abs(double(columns[0]) - exact0) <= 2e-7 * exact0);
}

TEST_CASE("reductions give the same bits whatever the thread count") {
  thread_count_guard guard;
  const tensor x = kiln::testing::random_tensor(float32, shape{1 << 20}, 3);
  const tensor columns = x.share(shape{1 << 16, 16});
  config::set_num_threads(1);
  const float one = reduce_sum(x).item<float>();
  const std::vector<float> one_columns = reduce_sum(columns, 0).to_vector<float>();
  for (int threads : {2, 3, 5}) {
    config::set_num_threads(threads);
    REQUIRE(reduce_sum(x).item<float>() == one);
    REQUIRE(reduce_sum(columns, 0).to_vector<float>() == one_columns);
  }
}

TEST_CASE("the shape rule handles unknown dims and unknown rank") {
  using ops::reduce_sum;
  constexpr std::array<shape, 1> partial{shape{none, 3, none}};
  STATIC_REQUIRE(reduce_sum(1).result_shape(partial).value == shape{none, none});
  STATIC_REQUIRE(reduce_sum(-1, true).result_shape(partial).value == shape{none, 3, 1});
  STATIC_REQUIRE(reduce_sum().result_shape(partial).value == shape{});
  STATIC_REQUIRE(!reduce_sum(3).result_shape(partial).ok());
  STATIC_REQUIRE(!reduce_sum(reduction_axes{0, -3}).result_shape(partial).ok());
  constexpr std::array<shape, 1> unknown{shape(unknown_rank)};
  STATIC_REQUIRE(reduce_sum().result_shape(unknown).value == shape{});
  STATIC_REQUIRE(!reduce_sum(0).result_shape(unknown).value.has_known_rank());
  STATIC_REQUIRE(ops::argmax().result_dtype(std::array<dtype, 1>{float32}).value == int64);
}

TEST_CASE("reduction errors name the op and what was wrong") {
  const tensor x = make_tensor<float>({1, 2, 3, 4, 5, 6}, shape{2, 3});
  require_throws<invalid_argument_error>([&] { return reduce_sum(x, 2); }, {"reduce_sum", "axis 2", "rank 2", "float32 (2, 3)"});
  require_throws<invalid_argument_error>([&] { return reduce_max(x, -3); }, {"reduce_max", "axis -3", "rank 2"});
  require_throws<invalid_argument_error>([&] { return argmax(x, {0, 5}); }, {"argmax", "axis 5", "rank 2"});
  require_throws<invalid_argument_error>([&] { return reduce_min(x, {1, -1}); }, {"reduce_min", "axis -1", "twice"});
  require_throws<invalid_argument_error>([&] { return reduce_mean(make_tensor<float>({1}, shape{}), 0); }, {"reduce_mean", "axis 0", "rank 0"});
  require_throws<invalid_argument_error>([&] { return reduce_sum(make_tensor<bool>({true, false}, shape{2})); }, {"reduce_sum", "bool (2,)"});
  require_throws<invalid_argument_error>([&] { return reduce_max(make_tensor<bool>({true}, shape{1})); }, {"reduce_max", "bool"});
  require_throws<invalid_argument_error>([&] { return argmax(make_tensor<std::string>({"a"}, shape{1})); }, {"argmax", "string"});
  require_throws<invalid_argument_error>([&] { return argmax(tensor(float32, shape{0, 3}), 0); }, {"argmax", "(0, 3)", "empty"});
  require_throws<invalid_argument_error>([&] { return argmax(tensor(int32, shape{3, 0}), 1); }, {"argmax", "(3, 0)"});
  require_throws<invalid_argument_error>([&] { return argmax(tensor(int64, shape{0})); }, {"argmax", "(0,)"});
  require_throws<invalid_argument_error>([&] { return reduce_sum(tensor()); }, {"reduce_sum"});
}

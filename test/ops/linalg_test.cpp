// matmul, conv2d and pooling semantics against hand-computed values (pooling also
// against TensorFlow 2.12), their constexpr shape rules, and their errors.

#include "../support/op_check.hpp"

using namespace kiln;
using kiln::testing::make_tensor;
using kiln::testing::require_throws;

// The shape rules are constexpr: the same functions give compile-time checks.
constexpr shape rule(const ops::matmul& op, shape a, shape b) {
  std::array<shape, 2> in{a, b};
  return op.result_shape(in).value;
}
static_assert(rule(ops::matmul{}, {2, 3}, {3, 4}) == shape{2, 4});
static_assert(rule(ops::matmul{}, {5, 1, 2, 3}, {7, 3, 4}) == shape{5, 7, 2, 4});
static_assert(rule(ops::matmul{}, {none, 3}, {3, none}) == shape{none, none});
static_assert(!ops::matmul{}.result_shape(std::array<shape, 2>{shape{2, 3}, shape{4, 5}}).ok());
static_assert(!ops::matmul{}.result_shape(std::array<shape, 2>{shape{3}, shape{3, 5}}).ok());
static_assert(ops::broadcast_shapes({2, 1, 3}, {4, 1}).value == shape{2, 4, 3});
static_assert(ops::broadcast_shapes({none, 3}, {2, 1}).value == shape{2, 3});
static_assert(!ops::broadcast_shapes({2, 3}, {4}).ok());
static_assert(ops::conv_output_dim(200, 3, 1, ops::padding::valid).out == 198);
static_assert(ops::conv_output_dim(7, 2, 2, ops::padding::same).out == 4);
static_assert(ops::conv_output_dim(7, 2, 2, ops::padding::same).pad_before == 0);
static_assert(ops::conv_output_dim(5, 3, 1, ops::padding::same).pad_before == 1);

TEST_CASE("constexpr shape rules are usable at compile time") {
  STATIC_REQUIRE(rule(ops::matmul{}, {2, 3}, {3, 4}) == shape{2, 4});
  STATIC_REQUIRE(ops::broadcast_shapes({3, 1}, {1, 4}).value == shape{3, 4});
}

TEST_CASE("matmul of 2-D and batched matrices") {
  tensor a = make_tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  tensor b = make_tensor<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  tensor c = matmul(a, b);
  REQUIRE(c.shape() == shape{2, 2});
  REQUIRE(c.to_vector<float>() == std::vector<float>{58, 64, 139, 154});

  // Batch dims broadcast: a [2, 1, 2] x b [2, 1] -> [2, 1, 1].
  tensor ab = make_tensor<std::int32_t>({1, 2, 3, 4}, {2, 1, 2});
  tensor bb = make_tensor<std::int32_t>({10, 1}, {2, 1});
  tensor cb = matmul(ab, bb);
  REQUIRE(cb.shape() == shape{2, 1, 1});
  REQUIRE(cb.to_vector<std::int32_t>() == std::vector<std::int32_t>{12, 34});

  // k == 0 gives zeros.
  tensor z = matmul(tensor(float64, {2, 0}), tensor(float64, {0, 3}));
  REQUIRE(z.to_vector<double>() == std::vector<double>(6, 0.0));
}

TEST_CASE("conv2d VALID and SAME against a hand-computed example") {
  // 3x3 input 1..9, 2x2 filter of ones: each output sums a 2x2 window.
  tensor x = make_tensor<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 3, 3, 1});
  tensor f = make_tensor<float>({1, 1, 1, 1}, {2, 2, 1, 1});
  tensor valid = conv2d(x, f, 1, "VALID");
  REQUIRE(valid.shape() == shape{1, 2, 2, 1});
  REQUIRE(valid.to_vector<float>() == std::vector<float>{12, 16, 24, 28});
  // SAME with an even filter pads after (TensorFlow puts the extra padding last).
  tensor same = conv2d(x, f, 1, "SAME");
  REQUIRE(same.shape() == shape{1, 3, 3, 1});
  REQUIRE(same.to_vector<float>() == std::vector<float>{12, 16, 9, 24, 28, 15, 15, 17, 9});
  tensor strided = conv2d(x, f, {1, 2, 2, 1}, "SAME");
  REQUIRE(strided.shape() == shape{1, 2, 2, 1});
  REQUIRE(strided.to_vector<float>() == std::vector<float>{12, 9, 15, 9});
}

TEST_CASE("matmul and conv2d reject bad operands with both sides in the message") {
  tensor a = tensor(float32, {2, 3}), b = tensor(float32, {4, 5});
  require_throws<invalid_argument_error>([&] { return matmul(a, b); }, {"matmul", "(2, 3)", "(4, 5)"});
  require_throws<invalid_argument_error>([&] { return matmul(tensor(float32, {3}), tensor(float32, {3, 2})); }, {"matmul", "rank"});
  require_throws<invalid_argument_error>([&] { return matmul(a, tensor(float64, {3, 2})); }, {"matmul", "float32", "float64"});
  require_throws<invalid_argument_error>([&] { return matmul(tensor(bool_, {1, 1}), tensor(bool_, {1, 1})); }, {"matmul", "bool"});
  tensor x = tensor(float32, {1, 5, 5, 3}), f = tensor(float32, {3, 3, 4, 2});
  require_throws<invalid_argument_error>([&] { return conv2d(x, f, 1, "VALID"); }, {"conv2d", "(1, 5, 5, 3)", "(3, 3, 4, 2)"});
  // Attributes that no operands make valid are a value_error in every mode, as
  // TensorFlow's Python-side checks of padding and strides raise ValueError.
  require_throws<value_error>([&] { return conv2d(x, tensor(float32, {3, 3, 3, 2}), 1, "FULL"); }, {"conv2d", "FULL"});
  require_throws<value_error>([&] { return conv2d(x, tensor(float32, {3, 3, 3, 2}), {1, 2, 3}, "SAME"); },
                              {"conv2d", "[1, 2, 3]"});
  require_throws<invalid_argument_error>([&] { return conv2d(tensor(float32, {1, 2, 2, 3}), tensor(float32, {3, 3, 3, 2}), 1, "VALID"); },
                              {"conv2d", "VALID"});
}

TEST_CASE("max_pool2d and avg_pool2d against a hand-computed example") {
  // 3x4 input 1..12: 2x2 windows, VALID with strides 2 drop the last row; SAME with
  // strides 1 overlaps and averages the elements inside the image only.
  tensor x = make_tensor<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {1, 3, 4, 1});
  REQUIRE(max_pool2d(x, 2, 2, "VALID").to_vector<float>() == std::vector<float>{6, 8});
  REQUIRE(avg_pool2d(x, 2, 2, "VALID").to_vector<float>() == std::vector<float>{3.5f, 5.5f});
  tensor same = avg_pool2d(x, 2, 1, "SAME");
  REQUIRE(same.shape() == shape{1, 3, 4, 1});
  REQUIRE(same.to_vector<float>() == std::vector<float>{3.5f, 4.5f, 5.5f, 6, 7.5f, 8.5f, 9.5f, 10, 9.5f, 10.5f, 11.5f, 12});
  REQUIRE(max_pool2d(x, {1, 3, 2, 1}, {1, 1, 2, 1}, "SAME").to_vector<float>() == std::vector<float>{6, 8, 10, 12, 10, 12});
  // Ties: the gradient goes to the first largest element of each window, row-major.
  tensor ties = make_tensor<float>({1, 3, 3, 0, 3, 3, 2, 3}, {1, 2, 4, 1});
  gradient_tape tape;
  tape.watch(ties);
  REQUIRE(tape.gradient(max_pool2d(ties, 2, 2, "VALID"), ties).to_vector<float>() == std::vector<float>{0, 1, 1, 0, 0, 0, 0, 0});
}

TEST_CASE("pooling and its gradients agree with TensorFlow 2.12, ties included") {
  // x[i] = (37 i mod 11) - 5 over (2, 5, 5, 3): eleven values, so windows tie. For each
  // pooling, TensorFlow's y = max_pool2d / avg_pool2d and the gradient of sum(y^2),
  // each summed with weights (i mod 7) + 1 over its elements (tf.nn.max_pool2d,
  // tf.nn.avg_pool2d and tf.GradientTape in TensorFlow 2.12.1).
  struct tf_case {
    const char* padding;
    int ksize, stride;
    shape pooled;
    double max, max_grad, avg, avg_grad;
  };
  const std::vector<tf_case> cases = {
      {"VALID", 2, 1, {2, 4, 4, 3}, 1370, 2736, 23.5, 24.125},   {"VALID", 2, 2, {2, 2, 2, 3}, 335, 688, -7, 11.75},
      {"VALID", 2, 3, {2, 2, 2, 3}, 300, 586, 6.5, -9.625},      {"VALID", 3, 1, {2, 3, 3, 3}, 938, 2142, 13.4444, 5.7778},
      {"VALID", 3, 2, {2, 2, 2, 3}, 394, 892, 2.6667, 1.9012},   {"VALID", 3, 3, {2, 1, 1, 3}, 100, 248, -0.2222, 2.2469},
      {"SAME", 2, 1, {2, 5, 5, 3}, 1705, 3386, 32.75, 4.625},    {"SAME", 2, 2, {2, 3, 3, 3}, 502, 946, 24.75, -20.75},
      {"SAME", 2, 3, {2, 2, 2, 3}, 300, 586, 6.5, -9.625},       {"SAME", 3, 1, {2, 5, 5, 3}, 2453, 5100, 12.6667, 8.4861},
      {"SAME", 3, 2, {2, 3, 3, 3}, 808, 1686, 12.5556, 1.6836},  {"SAME", 3, 3, {2, 2, 2, 3}, 362, 762, 3.9167, -9.8781},
  };
  std::vector<float> values(2 * 5 * 5 * 3);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float((i * 37) % 11) - 5.f;
  const tensor x = make_tensor<float>(values, {2, 5, 5, 3});
  auto weighted = [](const tensor& t) {
    double sum = 0;
    const std::vector<float> v = t.to_vector<float>();
    for (std::size_t i = 0; i < v.size(); ++i) sum += double(v[i]) * double(i % 7 + 1);
    return sum;
  };
  for (const tf_case& c : cases) {
    INFO(c.padding << " ksize " << c.ksize << " strides " << c.stride);
    gradient_tape tape({.persistent = true});
    tape.watch(x);
    const tensor m = max_pool2d(x, c.ksize, c.stride, c.padding), a = avg_pool2d(x, c.ksize, c.stride, c.padding);
    const tensor max_loss = reduce_sum(m * m), avg_loss = reduce_sum(a * a);
    REQUIRE(m.shape() == c.pooled);
    REQUIRE(a.shape() == c.pooled);
    CHECK(weighted(m) == c.max);
    CHECK(weighted(tape.gradient(max_loss, x)) == c.max_grad);
    CHECK(weighted(a) == Approx(c.avg).margin(1e-4));
    CHECK(weighted(tape.gradient(avg_loss, x)) == Approx(c.avg_grad).margin(1e-4));
  }
}

TEST_CASE("pooling rejects bad operands and attributes with both sides in the message") {
  const tensor x = tensor(float32, {1, 5, 5, 3});
  require_throws<invalid_argument_error>([&] { return max_pool2d(tensor(float32, {5, 5, 3}), 2, 2, "VALID"); },
                                         {"max_pool", "(5, 5, 3)", "rank 4"});
  require_throws<invalid_argument_error>([&] { return avg_pool2d(tensor(int32, {1, 4, 4, 1}), 2, 2, "VALID"); },
                                         {"avg_pool", "int32", "float"});
  require_throws<invalid_argument_error>([&] { return max_pool2d(x, 6, 1, "VALID"); }, {"max_pool", "(1, 5, 5, 3)", "VALID"});
  require_throws<invalid_argument_error>([&] { return max_pool2d(x, 2, 0, "VALID"); }, {"max_pool", "strides"});
  require_throws<value_error>([&] { return max_pool2d(x, 2, 2, "FULL"); }, {"max_pool2d", "FULL"});
  require_throws<value_error>([&] { return avg_pool2d(x, {1, 2, 3}, {2}, "SAME"); }, {"avg_pool2d", "ksize", "[1, 2, 3]"});
}

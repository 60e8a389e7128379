// matmul and conv2d semantics against hand-computed values, their constexpr shape
// rules, and their errors.

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

// Semantics of the shape ops against hand-written expected values, their shape
// rules on partial shapes, and every error path with the op and both sides named.

#include "../support/op_check.hpp"

#include <functional>

using namespace kiln;
using kiln::testing::make_tensor;
using kiln::testing::require_values;

namespace {

/// 0, 1, 2, ... as float32 in `s`.
tensor iota(const shape& s) {
  std::vector<float> v(std::size_t(s.num_elements()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return make_tensor(v, s);
}

template <class Op>
constexpr shape_result rule(const Op& op, std::initializer_list<shape> in) {
  return op.result_shape(std::span<const shape>(in.begin(), in.size()));
}

/// kiln::testing::require_throws through one std::function: instantiating it for each
/// of this file's many lambdas would cost seconds of compile time.
template <class E>
void require_throws(const std::function<tensor()>& f, std::initializer_list<std::string> parts) {
  kiln::testing::require_throws<E>(f, parts);
}

/// True when `gpu` builds include a backend that can hold tensors there.
constexpr bool has_gpu_backend = backend::supports<backend::thrust_backend, ops::add>;

}  // namespace

TEST_CASE("reshape keeps the elements in order and shares the buffer") {
  tensor x = iota({2, 3});
  tensor r = reshape(x, {3, 2});
  require_values<float>(r, {3, 2}, {0, 1, 2, 3, 4, 5});
  REQUIRE(r.data<float>() == x.data<float>());
  require_values<float>(reshape(x, {-1}), {6}, {0, 1, 2, 3, 4, 5});
  require_values<float>(reshape(x, {kiln::none, 2}), {3, 2}, {0, 1, 2, 3, 4, 5});
  require_values<float>(reshape(x, {1, -1, 1}), {1, 6, 1}, {0, 1, 2, 3, 4, 5});
  require_values<float>(reshape(make_tensor<float>({7}, {1, 1}), {}), {}, {7});
  require_values<float>(reshape(make_tensor<float>({}, {0, 3}), {-1, 3}), {0, 3}, {});
  require_values<float>(reshape(make_tensor<float>({}, {0, 3}), {3, 0, 2}), {3, 0, 2}, {});
  require_values<std::string>(reshape(make_tensor<std::string>({"a", "b", "c", "d"}, {4}), {2, 2}), {2, 2},
                              {"a", "b", "c", "d"});
  REQUIRE(reshape(x[1], {3, 1}).data<float>() == x.data<float>() + 3);
}

TEST_CASE("reshape errors name both shapes") {
  tensor x = iota({2, 3});
  require_throws<invalid_argument_error>([&] { return reshape(x, {4, 2}); }, {"reshape", "(2, 3)", "[4, 2]"});
  require_throws<invalid_argument_error>([&] { return reshape(x, {4, -1}); }, {"reshape", "(2, 3)", "[4, -1]"});
  require_throws<invalid_argument_error>([&] { return reshape(x, {-1, -1}); }, {"reshape", "only one dim", "[-1, -1]"});
  require_throws<invalid_argument_error>([&] { return reshape(make_tensor<float>({}, {0, 3}), {0, -1}); },
                              {"reshape", "empty", "(0, 3)", "[0, -1]"});
  require_throws<invalid_argument_error>([&] { return reshape(x, {0, -1}); }, {"reshape", "(2, 3)", "[0, -1]"});
}

TEST_CASE("x[i] indexes the first axis, shares the buffer and counts negative i from the end") {
  tensor x = iota({3, 2});
  require_values<float>(x[0], {2}, {0, 1});
  require_values<float>(x[2], {2}, {4, 5});
  require_values<float>(x[-1], {2}, {4, 5});
  require_values<float>(x[-3], {2}, {0, 1});
  REQUIRE(x[1].data<float>() == x.data<float>() + 2);
  require_values<float>(x[1][0], {}, {2});
  REQUIRE(x[2][-1].item<float>() == 5);
  tensor s = make_tensor<std::string>({"ab", "cd", "ef"}, {3});
  require_values<std::string>(s[1], {}, {"cd"});
  require_values<float>(make_tensor<float>({}, {2, 0})[1], {0}, {});
}

TEST_CASE("x[i] takes a scalar integer tensor, eager and symbolic") {
  tensor x = iota({3, 2});
  require_values<float>(x[constant(2)], {2}, {4, 5});
  require_values<float>(x[constant(std::int64_t(0))], {2}, {0, 1});
  // A loop counter inside a function: the sum of the rows.
  kiln::function rows_sum([](const tensor& m) {
    return for_range(3, [&](const tensor& i, const tensor& acc) { return acc + m[i]; }, zeros({2}));
  });
  require_values<float>(rows_sum(x), {2}, {0 + 2 + 4, 1 + 3 + 5});
  require_throws<value_error>([&] { return x[constant({1})]; }, {"x[i]", "scalar", "int32 (1,)"});
  require_throws<invalid_argument_error>([&] { return x[constant(3)]; }, {"gather", "3", "[0, 3)"});
  require_throws<invalid_argument_error>([&] { return x[constant(1.f)]; }, {"gather", "int32 or int64", "float32 ()"});
}

TEST_CASE("x[i] errors") {
  tensor x = iota({3, 2});
  require_throws<invalid_argument_error>([&] { return x[3]; }, {"strided_slice", "index 3", "[-3, 3)", "(3, 2)"});
  require_throws<invalid_argument_error>([&] { return x[-4]; }, {"strided_slice", "index -4", "[-3, 3)"});
  require_throws<invalid_argument_error>([&] { return make_tensor<float>({}, {0})[0]; }, {"strided_slice", "[0, 0)"});
  require_throws<invalid_argument_error>([&] { return x[0][1][0]; }, {"strided_slice", "scalar", "float32 ()"});
}

TEST_CASE("transpose permutes dims") {
  tensor x = iota({2, 3});
  require_values<float>(transpose(x), {3, 2}, {0, 3, 1, 4, 2, 5});
  require_values<float>(transpose(x, {1, 0}), {3, 2}, {0, 3, 1, 4, 2, 5});
  require_values<float>(transpose(x, {0, 1}), {2, 3}, {0, 1, 2, 3, 4, 5});
  tensor y = iota({2, 2, 3});
  // y[i][j][k] = 6i + 3j + k; with perm {2, 0, 1} the result's [k][i][j] is that value.
  require_values<float>(transpose(y, {2, 0, 1}), {3, 2, 2}, {0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11});
  require_values<float>(transpose(y, {1, 0, 2}), {2, 2, 3}, {0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11});
  require_values<float>(transpose(y), {3, 2, 2}, {0, 6, 3, 9, 1, 7, 4, 10, 2, 8, 5, 11});
  require_values<float>(transpose(make_tensor<float>({4}, {})), {}, {4});
  require_values<float>(transpose(make_tensor<float>({}, {0, 2})), {2, 0}, {});
  require_values<std::string>(transpose(make_tensor<std::string>({"a", "b", "c", "d"}, {2, 2})), {2, 2},
                              {"a", "c", "b", "d"});
}

TEST_CASE("transpose errors name the perm and the shape") {
  tensor x = iota({2, 3});
  require_throws<invalid_argument_error>([&] { return transpose(x, {0}); }, {"transpose", "(2, 3)", "perm=[0]"});
  require_throws<invalid_argument_error>([&] { return transpose(x, {0, 0}); }, {"transpose", "permutation", "perm=[0, 0]"});
  require_throws<invalid_argument_error>([&] { return transpose(x, {0, 2}); }, {"transpose", "perm=[0, 2]"});
  require_throws<invalid_argument_error>([&] { return transpose(x, {-1, 0}); }, {"transpose", "perm=[-1, 0]"});
}

TEST_CASE("concat joins along an existing axis") {
  tensor a = make_tensor<std::int32_t>({1, 2, 3, 4}, {2, 2});
  tensor b = make_tensor<std::int32_t>({5, 6}, {1, 2});
  tensor c = make_tensor<std::int32_t>({7, 8}, {2, 1});
  require_values<std::int32_t>(concat({a, b}, 0), {3, 2}, {1, 2, 3, 4, 5, 6});
  require_values<std::int32_t>(concat({a, c}, 1), {2, 3}, {1, 2, 7, 3, 4, 8});
  require_values<std::int32_t>(concat({a, c, a}, -1), {2, 5}, {1, 2, 7, 1, 2, 3, 4, 8, 3, 4});
  require_values<std::int32_t>(concat({a}, 0), {2, 2}, {1, 2, 3, 4});
  require_values<std::int32_t>(concat({make_tensor<std::int32_t>({}, {0, 2}), b}, 0), {1, 2}, {5, 6});
  std::vector<tensor> many = {b, b, b};
  require_values<std::int32_t>(concat(many, 0), {3, 2}, {5, 6, 5, 6, 5, 6});
  tensor s = make_tensor<std::string>({"x", "y"}, {2});
  require_values<std::string>(concat({s, s}, 0), {4}, {"x", "y", "x", "y"});
}

TEST_CASE("concat errors") {
  tensor a = make_tensor<std::int32_t>({1, 2, 3, 4}, {2, 2});
  tensor f = make_tensor<float>({1, 2}, {1, 2});
  tensor c = make_tensor<std::int32_t>({7, 8, 9}, {3, 1});
  require_throws<invalid_argument_error>([&] { return concat({a, f}, 0); }, {"concat", "dtype", "int32 (2, 2)", "float32 (1, 2)"});
  require_throws<invalid_argument_error>([&] { return concat({a, c}, 1); }, {"concat", "(2, 2)", "(3, 1)", "axis=1"});
  require_throws<invalid_argument_error>([&] { return concat({a, c}, 0); }, {"concat", "(2, 2)", "(3, 1)", "axis=0"});
  require_throws<invalid_argument_error>([&] { return concat({a, a}, 2); }, {"concat", "axis", "axis=2"});
  require_throws<invalid_argument_error>([&] { return concat({a, a}, -3); }, {"concat", "axis", "axis=-3"});
  require_throws<invalid_argument_error>([&] { return concat({a, make_tensor<std::int32_t>({1, 2}, {2})}, 0); },
                              {"concat", "rank", "(2, 2)", "(2,)"});
  tensor scalar = make_tensor<std::int32_t>({1}, {});
  require_throws<invalid_argument_error>([&] { return concat({scalar, scalar}, 0); }, {"concat", "scalars", "stack"});
  require_throws<invalid_argument_error>([&] { return concat(std::vector<tensor>{}, 0); }, {"concat", "at least one"});
}

TEST_CASE("stack joins along a new axis") {
  tensor a = make_tensor<std::int64_t>({1, 2, 3}, {3});
  tensor b = make_tensor<std::int64_t>({4, 5, 6}, {3});
  require_values<std::int64_t>(stack({a, b}), {2, 3}, {1, 2, 3, 4, 5, 6});
  require_values<std::int64_t>(stack({a, b}, 1), {3, 2}, {1, 4, 2, 5, 3, 6});
  require_values<std::int64_t>(stack({a, b}, -1), {3, 2}, {1, 4, 2, 5, 3, 6});
  require_values<std::int64_t>(stack({a}, 0), {1, 3}, {1, 2, 3});
  tensor x = make_tensor<bool>({true}, {}), y = make_tensor<bool>({false}, {});
  require_values<bool>(stack({x, y, x}), {3}, {true, false, true});
  tensor m = make_tensor<float>({1, 2, 3, 4}, {2, 2}), n = make_tensor<float>({5, 6, 7, 8}, {2, 2});
  require_values<float>(stack({m, n}, 1), {2, 2, 2}, {1, 2, 5, 6, 3, 4, 7, 8});
  require_values<float>(stack({m, n}, 2), {2, 2, 2}, {1, 5, 2, 6, 3, 7, 4, 8});
  tensor e = make_tensor<float>({}, {0});
  require_values<float>(stack({e, e}, 1), {0, 2}, {});
  tensor s = make_tensor<std::string>({"p"}, {1});
  require_values<std::string>(stack({s, s}, 1), {1, 2}, {"p", "p"});
}

TEST_CASE("stack errors") {
  tensor a = make_tensor<std::int64_t>({1, 2, 3}, {3});
  tensor b = make_tensor<std::int64_t>({4, 5}, {2});
  require_throws<invalid_argument_error>([&] { return stack({a, b}); }, {"stack", "same shape", "(3,)", "(2,)"});
  require_throws<invalid_argument_error>([&] { return stack({a, make_tensor<std::int32_t>({1, 2, 3}, {3})}); },
                             {"stack", "dtype", "int64 (3,)", "int32 (3,)"});
  require_throws<invalid_argument_error>([&] { return stack({a, a}, 2); }, {"stack", "axis", "axis=2"});
  require_throws<invalid_argument_error>([&] { return stack({a, a}, -3); }, {"stack", "axis", "axis=-3"});
  require_throws<invalid_argument_error>([&] { return stack(std::vector<tensor>{}); }, {"stack", "at least one"});
}

TEST_CASE("gather picks slices along an axis") {
  tensor x = iota({3, 4});
  tensor rows = make_tensor<std::int32_t>({2, 0, 2}, {3});
  require_values<float>(gather(x, rows), {3, 4}, {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  tensor cols = make_tensor<std::int64_t>({3, 1}, {2});
  require_values<float>(gather(x, cols, 1), {3, 2}, {3, 1, 7, 5, 11, 9});
  require_values<float>(gather(x, cols, -1), {3, 2}, {3, 1, 7, 5, 11, 9});
  tensor grid = make_tensor<std::int32_t>({0, 1, 1, 2}, {2, 2});
  require_values<float>(gather(x, grid, 1), {3, 2, 2}, {0, 1, 1, 2, 4, 5, 5, 6, 8, 9, 9, 10});
  require_values<float>(gather(x, make_tensor<std::int32_t>({1}, {})), {4}, {4, 5, 6, 7});
  require_values<float>(gather(x, make_tensor<std::int64_t>({}, {0})), {0, 4}, {});
  tensor words = make_tensor<std::string>({"zero", "one", "two"}, {3});
  require_values<std::string>(gather(words, make_tensor<std::int32_t>({2, 2, 1}, {3})), {3}, {"two", "two", "one"});
}

TEST_CASE("gather errors") {
  tensor x = iota({3, 4});
  require_throws<invalid_argument_error>([&] { return gather(x, make_tensor<std::int32_t>({0, 3}, {2})); },
                                         {"gather", "indices[1] = 3", "[0, 3)"});
  require_throws<invalid_argument_error>([&] { return gather(x, make_tensor<std::int64_t>({1, 0, 0, -1}, {2, 2})); },
                                         {"gather", "indices[1, 1] = -1", "[0, 3)"});
  require_throws<invalid_argument_error>([&] { return gather(x, make_tensor<std::int32_t>({4}, {1}), 1); },
                                         {"gather", "indices[0] = 4", "[0, 4)"});
  require_throws<invalid_argument_error>(
      [&] { return gather(make_tensor<float>({}, {0, 2}), make_tensor<std::int32_t>({0}, {1})); },
      {"gather", "indices[0] = 0", "[0, 0)"});
  require_throws<invalid_argument_error>([&] { return gather(x, make_tensor<float>({0}, {1})); },
                             {"gather", "int32 or int64", "float32 (1,)"});
  require_throws<invalid_argument_error>([&] { return gather(x, make_tensor<std::int32_t>({0}, {1}), 2); },
                              {"gather", "axis", "(3, 4)", "axis=2"});
  require_throws<invalid_argument_error>([&] { return gather(make_tensor<float>({1}, {}), make_tensor<std::int32_t>({0}, {1})); },
                              {"gather", "scalar"});
}

TEST_CASE("unsorted_segment_sum adds the slices that share a segment id") {
  tensor x = iota({3, 4});
  // Rows 0 and 2 go to segment 1, row 1 to segment 0; segment 2 has no row.
  require_values<float>(unsorted_segment_sum(x, make_tensor<std::int32_t>({1, 0, 1}, {3}), 3), {3, 4},
                        {4, 5, 6, 7, 8, 10, 12, 14, 0, 0, 0, 0});
  // Negative ids are dropped, as TensorFlow drops them.
  require_values<float>(unsorted_segment_sum(x, make_tensor<std::int64_t>({-1, 1, 1}, {3}), 2), {2, 4},
                        {0, 0, 0, 0, 12, 14, 16, 18});
  // Ids of the data's two leading dims: every element is its own slice.
  require_values<float>(unsorted_segment_sum(x, make_tensor<std::int32_t>({0, 1, 0, 1, 2, 2, 2, 2, 1, 0, 0, 0}, {3, 4}), 3),
                        {3}, {0 + 2 + 9 + 10 + 11, 1 + 3 + 8, 4 + 5 + 6 + 7});
  require_values<std::int32_t>(unsorted_segment_sum(make_tensor<std::int32_t>({5, 6, 7}, {3}),
                                                    make_tensor<std::int32_t>({0, 0, 0}, {3}), 1),
                               {1}, {18});
  require_values<double>(unsorted_segment_sum(make_tensor<double>({}, {0, 2}), make_tensor<std::int32_t>({}, {0}), 2),
                         {2, 2}, {0, 0, 0, 0});
}

TEST_CASE("unsorted_segment_sum errors") {
  tensor x = iota({3, 4});
  require_throws<invalid_argument_error>(
      [&] { return unsorted_segment_sum(x, make_tensor<std::int32_t>({0, 3, 1}, {3}), 3); },
      {"unsorted_segment_sum", "segment_ids[1] = 3", "num_segments = 3"});
  require_throws<invalid_argument_error>([&] { return unsorted_segment_sum(x, make_tensor<std::int32_t>({0, 1}, {2}), 3); },
                              {"unsorted_segment_sum", "shape", "(3, 4)", "(2,)"});
  require_throws<invalid_argument_error>([&] { return unsorted_segment_sum(x, make_tensor<std::int32_t>({0}, {1}), -1); },
                              {"unsorted_segment_sum", "num_segments must not be negative"});
  require_throws<invalid_argument_error>([&] { return unsorted_segment_sum(x, make_tensor<float>({0, 1, 2}, {3}), 3); },
                             {"unsorted_segment_sum", "int32 or int64", "float32 (3,)"});
  require_throws<invalid_argument_error>(
      [&] { return unsorted_segment_sum(make_tensor<bool>({true}, {1}), make_tensor<std::int32_t>({0}, {1}), 1); },
      {"unsorted_segment_sum", "numbers", "bool"});
}

TEST_CASE("slice takes a block") {
  tensor x = iota({3, 4});
  require_values<float>(slice(x, {1, 1}, {2, 2}), {2, 2}, {5, 6, 9, 10});
  require_values<float>(slice(x, {1, 0}, {-1, -1}), {2, 4}, {4, 5, 6, 7, 8, 9, 10, 11});
  require_values<float>(slice(x, {0, 3}, {3, 1}), {3, 1}, {3, 7, 11});
  require_values<float>(slice(x, {3, 0}, {0, 4}), {0, 4}, {});
  require_values<float>(slice(x, {0, 4}, {-1, -1}), {3, 0}, {});
  require_values<float>(slice(make_tensor<float>({2}, {}), {}, {}), {}, {2});
  tensor s = make_tensor<std::string>({"a", "b", "c"}, {3});
  require_values<std::string>(slice(s, {1}, {-1}), {2}, {"b", "c"});
}

TEST_CASE("slice errors name begin, size and the shape") {
  tensor x = iota({3, 4});
  require_throws<invalid_argument_error>([&] { return slice(x, {0, 5}, {1, -1}); },
                                         {"slice", "begin=[0, 5]", "size=[1, -1]", "(3, 4)", "begin[1] = 5"});
  require_throws<invalid_argument_error>([&] { return slice(x, {-1, 0}, {1, 1}); }, {"slice", "begin[0] = -1"});
  require_throws<invalid_argument_error>([&] { return slice(x, {1, 1}, {3, 1}); },
                                         {"slice", "size=[3, 1]", "(3, 4)", "size[0] = 3", "[0, 2]"});
  require_throws<invalid_argument_error>([&] { return slice(x, {0, 0}, {1, -2}); }, {"slice", "size[1] = -2"});
  require_throws<invalid_argument_error>([&] { return slice(x, {3, 0}, {1, 1}); }, {"slice", "size[0] = 1", "[0, 0]"});
  require_throws<invalid_argument_error>([&] { return slice(x, {0}, {1}); }, {"slice", "one entry per dim", "(3, 4)", "begin=[0]"});
  require_throws<invalid_argument_error>([&] { return slice(x, {0, 0}, {1}); }, {"slice", "begin=[0, 0], size=[1]"});
}

TEST_CASE("shape_of gives the dims as int32") {
  tensor d = shape_of(iota({2, 3}));
  REQUIRE(d.dtype() == int32);
  require_values<std::int32_t>(d, {2}, {2, 3});
  require_values<std::int32_t>(shape_of(make_tensor<float>({1}, {})), {0}, {});
  require_values<std::int32_t>(shape_of(make_tensor<std::string>({}, {0, 7})), {2}, {0, 7});
  tensor huge(float32, shape{3000000000, 0});
  require_throws<invalid_argument_error>([&] { return shape_of(huge); }, {"shape", "3000000000", "int32"});
}

TEST_CASE("shape rules propagate unknown dims and ranks") {
  constexpr shape unknown(unknown_rank);
  STATIC_REQUIRE(rule(ops::reshape{{-1, 2}}, {{none, 4}}).value == shape{none, 2});
  STATIC_REQUIRE(rule(ops::reshape{{-1, 2}}, {{3, 4}}).value == shape{6, 2});
  STATIC_REQUIRE(rule(ops::reshape{{2, 2}}, {unknown}).value == shape{2, 2});
  STATIC_REQUIRE(!rule(ops::reshape{{-1, -1}}, {unknown}).ok());
  STATIC_REQUIRE(rule(ops::transpose{}, {unknown}).value == unknown);
  STATIC_REQUIRE(rule(ops::transpose{{1, 0}}, {unknown}).value == shape{none, none});
  STATIC_REQUIRE(rule(ops::transpose{{1, 2, 0}}, {{none, 2, 3}}).value == shape{2, 3, none});
  STATIC_REQUIRE(rule(ops::concat{0}, {{none, 3}, {2, none}}).value == shape{none, 3});
  STATIC_REQUIRE(rule(ops::concat{1}, {{none, 3}, {2, 4}}).value == shape{2, 7});
  STATIC_REQUIRE(rule(ops::concat{-1}, {unknown, {2, 4}}).value == shape{2, none});
  STATIC_REQUIRE(rule(ops::concat{0}, {unknown, unknown}).value == unknown);
  STATIC_REQUIRE(!rule(ops::concat{0}, {{2, 3}, {2, 4}}).ok());
  STATIC_REQUIRE(rule(ops::stack{1}, {{none, 3}, {2, none}}).value == shape{2, 2, 3});
  STATIC_REQUIRE(rule(ops::stack{0}, {unknown, unknown}).value == unknown);
  STATIC_REQUIRE(rule(ops::gather{1}, {{none, 5, 2}, {none}}).value == shape{none, none, 2});
  STATIC_REQUIRE(rule(ops::gather{0}, {{4, 2}, unknown}).value == unknown);
  STATIC_REQUIRE(rule(ops::index{}, {{none, 3}}).value == shape{3});
  STATIC_REQUIRE(rule(ops::index{}, {unknown}).value == unknown);
  STATIC_REQUIRE(rule(ops::slice{{1, 0}, {-1, 2}}, {{none, 5}}).value == shape{none, 2});
  STATIC_REQUIRE(rule(ops::slice{{1, 0}, {-1, 2}}, {unknown}).value == shape{none, 2});
  STATIC_REQUIRE(rule(ops::shape_of{}, {unknown}).value == shape{none});
  STATIC_REQUIRE(rule(ops::shape_of{}, {{none, 3}}).value == shape{2});
}

TEST_CASE("reshape, x[i] and shape_of stay on the gpu") {
  if constexpr (has_gpu_backend) {
    tensor x = iota({2, 3}).to(device::gpu);
    tensor r = reshape(x, {3, -1});
    REQUIRE(r.device() == device::gpu);
    require_values<float>(r, {3, 2}, {0, 1, 2, 3, 4, 5});
    tensor row = x[-1];
    REQUIRE(row.device() == device::gpu);
    require_values<float>(row, {3}, {3, 4, 5});
    tensor d = shape_of(x);
    REQUIRE(d.device() == device::gpu);
    require_values<std::int32_t>(d, {2}, {2, 3});
    require_throws<invalid_argument_error>([&] { return x[2]; }, {"strided_slice", "index 2"});
  } else {
    SUCCEED("this build has no gpu backend");
  }
}

TEST_CASE("set_item writes one slice and rejects what does not fit") {
  tensor x = iota({3, 2});
  require_values<float>(set_item(x, make_tensor<std::int32_t>({1}, {}), make_tensor<float>({-1, -2}, {2})), {3, 2},
                        {0, 1, -1, -2, 4, 5});
  require_values<float>(x, {3, 2}, {0, 1, 2, 3, 4, 5});  // x itself is unchanged
  require_values<float>(set_item(x, make_tensor<std::int64_t>({2}, {}), make_tensor<float>({9, 9}, {2})), {3, 2},
                        {0, 1, 2, 3, 9, 9});
  require_throws<invalid_argument_error>([&] { return set_item(x, make_tensor<std::int32_t>({3}, {}), x[0]); },
                                         {"set_item", "index 3", "[0, 3)", "(3, 2)"});
  require_throws<invalid_argument_error>([&] { return set_item(x, make_tensor<std::int32_t>({-1}, {}), x[0]); },
                                         {"set_item", "index -1", "[0, 3)"});
  require_throws<invalid_argument_error>([&] { return set_item(x, make_tensor<std::int32_t>({0}, {}), make_tensor<float>({1}, {1})); },
                              {"set_item", "float32 (3, 2)", "float32 (1,)"});
  require_throws<invalid_argument_error>([&] { return set_item(x, make_tensor<std::int32_t>({0}, {}), make_tensor<std::int32_t>({1, 2}, {2})); },
                             {"set_item", "dtype", "int32 (2,)"});
  require_throws<invalid_argument_error>([&] { return set_item(x, make_tensor<float>({0}, {}), x[0]); }, {"set_item", "int32 or int64"});
}

TEST_CASE("pad_rows appends rows of zeros up to a number of rows, which its rule leaves unknown") {
  const tensor x = iota({2, 2});
  require_values<float>(pad_rows(x, make_tensor<std::int32_t>({4}, {})), {4, 2}, {0, 1, 2, 3, 0, 0, 0, 0});
  require_values<float>(pad_rows(x, make_tensor<std::int64_t>({1}, {})), {2, 2}, {0, 1, 2, 3});  // never shrinks
  require_values<std::int32_t>(pad_rows(make_tensor<std::int32_t>({}, {0}), make_tensor<std::int32_t>({2}, {})), {2}, {0, 0});
  REQUIRE(pad_rows(kiln::constant(std::vector<std::string>{"a"}, {1}), kiln::constant(2)).to_vector<std::string>() ==
          std::vector<std::string>{"a", ""});
  REQUIRE(rule(ops::pad_rows{}, {{3, 2}, {}}).value == shape{none, 2});
  require_throws<invalid_argument_error>([&] { return pad_rows(x, make_tensor<std::int32_t>({-1}, {})); },
                                         {"pad_rows", "-1", "(2, 2)"});
  require_throws<invalid_argument_error>([&] { return pad_rows(kiln::constant(1.f), kiln::constant(2)); }, {"pad_rows", "scalar"});
  require_throws<invalid_argument_error>([&] { return pad_rows(x, kiln::constant(2.f)); }, {"pad_rows", "int32 or int64"});
}

TEST_CASE("crop_or_pad takes like's shape, its rule too, and rejects attributes that do not fit") {
  const tensor x = iota({2, 3});  // [[0 1 2] [3 4 5]]
  // Cropped to one row from the end and padded by a column on each side.
  require_values<float>(crop_or_pad(x, kiln::zeros({1, 5}), {0, -1}, {1, 0}), {1, 5}, {0, 3, 4, 5, 0});
  // The same window counted from the start.
  require_values<float>(crop_or_pad(x, kiln::zeros({1, 5}), {1, -1}, {0, 0}), {1, 5}, {0, 3, 4, 5, 0});
  // Its own gradient: padding back what it cropped, at the negated offsets.
  require_values<float>(crop_or_pad(crop_or_pad(x, kiln::zeros({1, 5}), {1, -1}, {0, 0}), x, {-1, 1}, {0, 0}), {2, 3},
                        {0, 0, 0, 3, 4, 5});
  REQUIRE(crop_or_pad(kiln::constant(std::vector<std::string>{"a"}, {1}), kiln::zeros({2}), {0}, {0})
              .to_vector<std::string>() == std::vector<std::string>{"a", ""});
  REQUIRE(rule(ops::crop_or_pad{{0, 0}, {0, 1}}, {{3, 2}, {none, 4}}).value == shape{none, 4});
  require_throws<invalid_argument_error>([&] { return crop_or_pad(x, kiln::zeros({2}), {0, 0}, {0, 0}); },
                              {"crop_or_pad", "one rank", "offset=[0, 0], align=[0, 0]"});
  require_throws<invalid_argument_error>([&] { return crop_or_pad(x, kiln::zeros({2, 2}), {0}, {0, 0}); },
                              {"crop_or_pad", "one entry per dim"});
  require_throws<invalid_argument_error>([&] { return crop_or_pad(x, kiln::zeros({2, 2}), {0, 0}, {0, 2}); },
                              {"crop_or_pad", "align must be 0", "align=[0, 2]"});
}

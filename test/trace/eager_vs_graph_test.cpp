// Graph execution must agree with eager execution (eager is the reference):
// a few ops of every family run both ways, eagerly and through a kiln::function's
// graph, and give the same dtype, shape and values. Graph execution is non-strict:
// an op that no output needs does not run.

#include "trace_check.hpp"

#include <functional>
#include <string>
#include <vector>

namespace {

using kiln::testing::random_tensor;
using kiln::testing::require_same;
using kiln::testing::value_range;

using op_case = std::function<kiln::tensor(const std::vector<kiln::tensor>&)>;

// Runs `op` eagerly, then twice through one kiln::function (the trace, then the
// cached graph), and requires the same result each time.
void require_graph_matches_eager(const std::string& name, const op_case& op, const std::vector<kiln::tensor>& inputs) {
  INFO("case " << name);
  const kiln::tensor eager = op(inputs);
  kiln::function traced(op, {.name = name});
  for (int call = 0; call < 2; ++call) require_same(traced(inputs), eager);
  CHECK(traced.tracing_count() == 1);
  // The graph computes the result: the ops were recorded, not folded into a constant.
  const kiln::graph g = traced.get_concrete_function(inputs).graph();
  CHECK(kiln::testing::count_ops(g, "Placeholder") == int(inputs.size()));
  CHECK(int(g.nodes().size()) >= int(inputs.size()) + 2);
}

kiln::tensor random_of(kiln::dtype t, const kiln::shape& s, std::uint32_t seed, value_range r = value_range::any) {
  return random_tensor(t, s, seed, r);
}

}  // namespace

TEST_CASE("elementwise ops: graph results equal eager results", "[trace][eager_vs_graph]") {
  const kiln::tensor x = random_of(kiln::float32, {2, 3}, 1), y = random_of(kiln::float32, {3}, 2, value_range::nonzero);
  const kiln::tensor p = random_of(kiln::float32, {2, 3}, 3, value_range::positive);
  const kiln::tensor i = random_of(kiln::int32, {2, 3}, 4), j = random_of(kiln::int32, {2, 3}, 5, value_range::nonzero);
  using v = const std::vector<kiln::tensor>&;
  require_graph_matches_eager("add_broadcast", [](v in) { return in[0] + in[1]; }, {x, y});
  require_graph_matches_eager("sub_scalar", [](v in) { return in[0] - 1.5f; }, {x});
  require_graph_matches_eager("scalar_mul", [](v in) { return 2.f * in[0] * in[1]; }, {x, y});
  require_graph_matches_eager("truediv", [](v in) { return in[0] / in[1]; }, {x, y});
  require_graph_matches_eager("int_truediv", [](v in) { return in[0] / in[1]; }, {i, j});
  require_graph_matches_eager("int_mul_floordiv_floormod",
                              [](v in) { return kiln::floordiv(in[0] * 3, in[1]) + in[0] % in[1]; }, {i, j});
  require_graph_matches_eager("neg_abs", [](v in) { return kiln::abs(-in[0]) + -in[1]; }, {x, p});
  require_graph_matches_eager("exp_log_sqrt", [](v in) { return kiln::exp(in[0]) + kiln::log(in[1]) * kiln::sqrt(in[1]); },
                              {x, p});
  require_graph_matches_eager("square_pow", [](v in) { return kiln::square(in[0]) + kiln::pow(in[1], 1.5f); }, {x, p});
  require_graph_matches_eager("tanh_sigmoid_relu",
                              [](v in) { return kiln::tanh(in[0]) * kiln::sigmoid(in[0]) + kiln::relu(in[0]); }, {x});
  require_graph_matches_eager("maximum_minimum",
                              [](v in) { return kiln::maximum(in[0], in[1]) - kiln::minimum(in[0], 0.f); }, {x, y});
  require_graph_matches_eager("string_concat", [](v in) { return in[0] + in[1] + kiln::constant("!"); },
                              {random_of(kiln::string, {4}, 6), random_of(kiln::string, {4}, 7)});
}

TEST_CASE("comparisons, logic, where and cast: graph results equal eager results", "[trace][eager_vs_graph]") {
  const kiln::tensor x = random_of(kiln::float32, {3, 4}, 11), y = random_of(kiln::float32, {3, 4}, 12);
  const kiln::tensor i = random_of(kiln::int32, {3, 4}, 13);
  using v = const std::vector<kiln::tensor>&;
  require_graph_matches_eager("less", [](v in) { return in[0] < in[1]; }, {x, y});
  require_graph_matches_eager("compare_all",
                              [](v in) {
                                return kiln::logical_or(kiln::logical_and(in[0] <= in[1], in[0] >= 0.f),
                                                        kiln::logical_not(kiln::equal(in[0], in[1]) != (in[1] > 1.f)));
                              },
                              {x, y});
  require_graph_matches_eager("where", [](v in) { return kiln::where(in[0] > in[1], in[0], in[1] * 2.f); }, {x, y});
  require_graph_matches_eager("where_scalar", [](v in) { return kiln::where(in[0] % 2 == 0, kiln::floordiv(in[0], 2), 0); },
                              {i});
  require_graph_matches_eager("cast", [](v in) { return kiln::cast(in[0] * 3.f, kiln::int32) + kiln::cast(in[1], kiln::int32); },
                              {x, i});
  require_graph_matches_eager("cast_to_float64", [](v in) { return kiln::cast(in[0], kiln::float64) / 3.0; }, {i});
}

TEST_CASE("reductions: graph results equal eager results", "[trace][eager_vs_graph]") {
  const kiln::tensor x = random_of(kiln::float32, {4, 5}, 21), i = random_of(kiln::int32, {3, 2, 4}, 22);
  using v = const std::vector<kiln::tensor>&;
  require_graph_matches_eager("reduce_sum_all", [](v in) { return kiln::reduce_sum(in[0]); }, {x});
  require_graph_matches_eager("reduce_sum_axis", [](v in) { return kiln::reduce_sum(in[0], 0); }, {x});
  require_graph_matches_eager("reduce_mean_keepdims", [](v in) { return kiln::reduce_mean(in[0], 1, true); }, {x});
  require_graph_matches_eager("reduce_max_min", [](v in) { return kiln::reduce_max(in[0], 2) - kiln::reduce_min(in[0], 2); },
                              {i});
  require_graph_matches_eager("reduce_axes", [](v in) { return kiln::reduce_sum(in[0], kiln::int_list{0, 2}); }, {i});
  require_graph_matches_eager("argmax", [](v in) { return kiln::argmax(in[0], 1); }, {x});
  require_graph_matches_eager("int_mean", [](v in) { return kiln::reduce_mean(kiln::pow(in[0] - 1, 2)); }, {i});
}

TEST_CASE("shape ops: graph results equal eager results", "[trace][eager_vs_graph]") {
  const kiln::tensor x = random_of(kiln::float32, {2, 3, 4}, 31), m = random_of(kiln::int32, {3, 4}, 32);
  using v = const std::vector<kiln::tensor>&;
  require_graph_matches_eager("reshape", [](v in) { return kiln::reshape(in[0], {3, -1}) + 1.f; }, {x});
  require_graph_matches_eager("transpose", [](v in) { return kiln::transpose(in[0], {1, 0, 2}); }, {x});
  require_graph_matches_eager("transpose_default", [](v in) { return kiln::transpose(in[0]); }, {m});
  require_graph_matches_eager("concat", [](v in) { return kiln::concat({in[0], in[0] * 2}, 1); }, {m});
  require_graph_matches_eager("stack", [](v in) { return kiln::stack({in[0], in[0] + 1, in[0] - 1}, 1); }, {m});
  require_graph_matches_eager("gather", [](v in) { return kiln::gather(in[0], kiln::constant({2, 0, 2})); }, {m});
  require_graph_matches_eager("gather_axis", [](v in) { return kiln::gather(in[0], in[1], 1); },
                              {m, kiln::constant({3, 1})});
  require_graph_matches_eager("unsorted_segment_sum",
                              [](v in) { return kiln::unsorted_segment_sum(in[0] * 3, in[1], 4); },
                              {m, kiln::constant({3, -1, 3})});
  require_graph_matches_eager("index", [](v in) { return in[0][1] + in[0][-1]; }, {x});
  require_graph_matches_eager("slice", [](v in) { return kiln::slice(in[0], {0, 1, 1}, {2, -1, 2}); }, {x});
  require_graph_matches_eager("shape_of", [](v in) { return kiln::shape_of(in[0]) * 2; }, {x});
}

TEST_CASE("matmul and conv2d: graph results equal eager results", "[trace][eager_vs_graph]") {
  using v = const std::vector<kiln::tensor>&;
  require_graph_matches_eager("matmul", [](v in) { return kiln::matmul(in[0], in[1]); },
                              {random_of(kiln::float32, {4, 3}, 41), random_of(kiln::float32, {3, 5}, 42)});
  require_graph_matches_eager("matmul_int", [](v in) { return kiln::matmul(in[0], in[1]); },
                              {random_of(kiln::int32, {2, 3}, 43), random_of(kiln::int32, {3, 2}, 44)});
  const kiln::tensor image = random_of(kiln::float32, {1, 6, 5, 2}, 45), filters = random_of(kiln::float32, {3, 3, 2, 4}, 46);
  require_graph_matches_eager("conv2d_valid", [](v in) { return kiln::conv2d(in[0], in[1], 1, "VALID"); }, {image, filters});
  require_graph_matches_eager("conv2d_same_strided", [](v in) { return kiln::conv2d(in[0], in[1], {2, 2}, "SAME"); },
                              {image, filters});
  require_graph_matches_eager("dense_relu_mean",
                              [](v in) { return kiln::reduce_mean(kiln::relu(kiln::matmul(in[0], in[1]) + in[2]), 1); },
                              {random_of(kiln::float32, {3, 4}, 47), random_of(kiln::float32, {4, 2}, 48),
                               random_of(kiln::float32, {2}, 49)});
}

TEST_CASE("a graph with None dims gives eager results for every size", "[trace][eager_vs_graph]") {
  auto layer = [](const kiln::tensor& x, const kiln::tensor& w) {
    return kiln::reduce_sum(kiln::tanh(kiln::matmul(x, w)), 1) + kiln::reduce_max(x);
  };
  kiln::function traced(layer, {.name = "layer",
                                .input_signature = std::vector<kiln::tensor_spec>{
                                    kiln::tensor_spec({kiln::none, 3}, kiln::float32), kiln::tensor_spec({3, 2}, kiln::float32)}});
  const kiln::tensor w = random_of(kiln::float32, {3, 2}, 51);
  for (std::int64_t rows : {1, 4, 7}) {
    INFO("rows " << rows);
    const kiln::tensor x = random_of(kiln::float32, {rows, 3}, std::uint32_t(52 + rows));
    require_same(traced(x, w), layer(x, w));
  }
  CHECK(traced.tracing_count() == 1);
}

TEST_CASE("graph execution skips an op no output needs: the seeds' unused gather", "[trace][eager_vs_graph]") {
  auto unused_return = [](const kiln::tensor& x) {
    (void)kiln::gather(x, kiln::constant({1}));  // index 1 is out of range when x has one element
    return x;
  };
  // Eagerly every op runs, so the gather raises.
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return unused_return(kiln::constant({0.f})); },
                                                              {"gather", "indices[0] = 1"});
  // In the graph the gather is recorded but nothing needs it, so it does not run.
  kiln::function unused_return_graph(unused_return);
  require_same(unused_return_graph(kiln::constant({0.f})), kiln::constant({0.f}));
  require_same(unused_return_graph(kiln::constant({5.f})), kiln::constant({5.f}));
  CHECK(kiln::testing::count_ops(unused_return_graph.get_concrete_function(kiln::constant({0.f})).graph(), "gather") == 1);
}

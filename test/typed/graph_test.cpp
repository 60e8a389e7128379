// graph() and to_dot() of typed traces: the node listing the seeds print, the same
// graph the runtime tier traces from one generic callable, and conditionals, loops
// and effects as the runtime tier's nodes with their subgraphs.

#include "../trace/trace_check.hpp"

#include <sstream>

using namespace kiln;
using kiln::testing::graph_listing;
using kiln::testing::graph_ops;

namespace {

/// Name, op, inputs, dtype and shape of every node: what the two tiers must agree on.
std::vector<std::string> node_details(const kiln::graph& g) {
  std::vector<std::string> lines;
  for (const kiln::node& n : g.nodes()) {
    std::ostringstream line;
    line << n.name() << " = " << n.op() << "(";
    for (const std::string& in : n.inputs()) line << in << " ";
    line << ") " << name(n.dtype()) << " " << n.shape().str();
    lines.push_back(line.str());
  }
  return lines;
}

const kiln::graph& subgraph(const kiln::node& n, std::size_t k) { return *n.special().subgraphs().at(k).second; }

}  // namespace

TEST_CASE("the typed graph of a + a is a placeholder, an add and an Identity") {
  kiln::function dbl([](const auto& a) { return a + a; }, {.name = "double", .arg_names = {"a"}});
  const kiln::graph g = dbl.get_concrete_function(kiln::spec<std::int32_t, 3>{}).graph();
  CHECK(graph_listing(g) == std::vector<std::string>{"[] -> a", "['a', 'a'] -> add", "['add'] -> Identity"});
  CHECK(graph_ops(g) == std::vector<std::string>{"Placeholder", "add", "Identity"});
  for (const kiln::node& n : g.nodes()) {
    CHECK(n.dtype() == int32);
    CHECK(n.shape() == shape{3});
  }
  const std::string dot = dbl.get_concrete_function(kiln::spec<std::int32_t, 3>{}).to_dot();
  CHECK_THAT(dot, Catch::Matchers::StartsWith("digraph"));
  CHECK_THAT(dot, Catch::Matchers::Contains("add\\nadd int32 (3,)"));
  CHECK(dbl.tracing_count() == 1);  // graph() reads the trace; it does not trace again
}

TEST_CASE("one generic callable gives the same graph in both tiers") {
  auto layer = [](const auto& x, const auto& w, const auto& b) {
    auto t = kiln::transpose<1, 0>(kiln::tanh(kiln::matmul(x, w) + b));
    auto s = kiln::reduce_sum<1>(t * 2.f);
    return std::tuple{t, kiln::maximum(s, 0.f), kiln::cast<double>(s > 1.f)};
  };
  kiln::function typed_layer(layer, {.name = "layer", .arg_names = {"x", "w", "b"}});
  kiln::function runtime_layer(layer, {.name = "layer", .arg_names = {"x", "w", "b"}});
  const kiln::graph typed =
      typed_layer.get_concrete_function(kiln::spec<float, 4, 8>{}, kiln::spec<float, 8, 3>{}, kiln::spec<float, 3>{}).graph();
  const kiln::graph runtime = runtime_layer
                                  .get_concrete_function(kiln::tensor_spec({4, 8}, float32), kiln::tensor_spec({8, 3}, float32),
                                                         kiln::tensor_spec({3}, float32))
                                  .graph();
  CHECK(node_details(typed) == node_details(runtime));
  // Spelled out, so that a change common to both tiers shows too.
  CHECK(graph_ops(typed) == std::vector<std::string>{"Placeholder", "Placeholder", "Placeholder", "matmul", "add", "tanh",
                                                     "transpose", "Const", "mul", "reduce_sum", "Const", "maximum",
                                                     "Const", "greater", "cast", "Identity", "Identity", "Identity"});
}

TEST_CASE("slice, gather, concat and reshape are nodes of their ops in a typed graph") {
  auto fn = [](const auto& x, const auto& i) {
    auto s = kiln::slice<std::array{0, 1}, std::array{2, 2}>(x);
    auto g = kiln::gather<1>(x, i);
    return kiln::reshape<8>(kiln::concat<1>(s, g) * 1.f);
  };
  kiln::function typed_fn(fn, {.arg_names = {"x", "i"}});
  kiln::function runtime_fn(fn, {.arg_names = {"x", "i"}});
  const kiln::graph typed = typed_fn.get_concrete_function(kiln::spec<float, 2, 3>{}, kiln::spec<std::int32_t, 2>{}).graph();
  const kiln::graph runtime =
      runtime_fn.get_concrete_function(kiln::tensor_spec({2, 3}, float32), kiln::tensor_spec({2}, int32)).graph();
  CHECK(node_details(typed) == node_details(runtime));
  CHECK(graph_ops(typed) == std::vector<std::string>{"Placeholder", "Placeholder", "slice", "gather", "concat", "Const",
                                                     "mul", "reshape", "Identity"});
}

TEST_CASE("a reshaped symbolic value is a reshape node where it is read") {
  // A typed reshape of a traced value is a view of its slot, computed nowhere; its
  // graph still shows the reshape the runtime tier traces.
  auto fn = [](const auto& x, const auto& w) {
    auto m = kiln::matmul(kiln::reshape<3, 2>(x), w);
    return kiln::reduce_sum<1>(kiln::reshape<4, 3>(m) * 2.f);
  };
  kiln::function typed_fn(fn, {.arg_names = {"x", "w"}});
  kiln::function runtime_fn(fn, {.arg_names = {"x", "w"}});
  const kiln::graph typed = typed_fn.get_concrete_function(kiln::spec<float, 2, 3>{}, kiln::spec<float, 2, 4>{}).graph();
  const kiln::graph runtime =
      runtime_fn.get_concrete_function(kiln::tensor_spec({2, 3}, float32), kiln::tensor_spec({2, 4}, float32)).graph();
  CHECK(node_details(typed) == node_details(runtime));
  CHECK(graph_listing(typed) == std::vector<std::string>{"[] -> x", "[] -> w", "['x'] -> reshape", "['reshape', 'w'] -> matmul",
                                                         "['matmul'] -> reshape_1", "[] -> Const",
                                                         "['reshape_1', 'Const'] -> mul", "['mul'] -> reduce_sum",
                                                         "['reduce_sum'] -> Identity"});
}

TEST_CASE("a typed cond is a cond node with both branches as subgraphs") {
  kiln::function f(
      [](const auto& x, const auto& y) {
        return kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x * 2.f; }, [&] { return -y; });
      },
      {.arg_names = {"x", "y"}});
  const kiln::graph g = f.get_concrete_function(kiln::spec<float, 2>{}, kiln::spec<float, 2>{}).graph();
  CHECK(graph_ops(g) == std::vector<std::string>{"Placeholder", "Placeholder", "reduce_sum", "Const", "greater", "cond",
                                                 "Identity"});
  const kiln::node& cond = g.nodes()[5];
  // The predicate, then what each branch reads from outside: x for one, y for the other.
  CHECK(cond.inputs() == std::vector<std::string>{"greater", "x", "y"});
  CHECK(cond.dtype() == float32);
  CHECK(cond.shape() == shape{2});
  CHECK_FALSE(cond.special().has_effects());
  CHECK(graph_listing(subgraph(cond, 0)) ==
        std::vector<std::string>{"[] -> x", "[] -> Const", "['x', 'Const'] -> mul", "['mul'] -> Identity"});
  CHECK(graph_listing(subgraph(cond, 1)) == std::vector<std::string>{"[] -> y", "['y'] -> neg", "['neg'] -> Identity"});
  const std::string dot = g.to_dot();
  CHECK_THAT(dot, Catch::Matchers::Contains("cond then"));
  CHECK_THAT(dot, Catch::Matchers::Contains("cond else"));
  // A node that stands for a step runs only as part of its trace.
  CHECK_THROWS_AS(cond.special().run({}, {}), kiln::unavailable_error);
}

TEST_CASE("a typed while_loop is a while node with its condition and body") {
  kiln::function f(
      [](const auto& x, const auto& limit) {
        auto below_limit = [&](const auto& v) {
          auto sum = kiln::reduce_sum(v);
          return sum < kiln::reduce_sum(limit);
        };
        return kiln::while_loop(below_limit,
                                [](const auto& v) { return kiln::tanh(v) + 1.f; }, x);
      },
      {.arg_names = {"x", "limit"}});
  const kiln::graph g = f.get_concrete_function(kiln::spec<float, 3>{}, kiln::spec<float, 3>{}).graph();
  CHECK(graph_ops(g) == std::vector<std::string>{"Placeholder", "Placeholder", "while", "Identity"});
  const kiln::node& loop = g.nodes()[2];
  CHECK(loop.inputs() == std::vector<std::string>{"x", "limit"});  // the loop variable, then the condition's capture
  CHECK(graph_listing(subgraph(loop, 0)) ==
        std::vector<std::string>{"[] -> x", "['x'] -> reduce_sum", "[] -> limit", "['limit'] -> reduce_sum_1",
                                 "['reduce_sum', 'reduce_sum_1'] -> less", "['less'] -> Identity"});
  CHECK(graph_ops(subgraph(loop, 1)) == std::vector<std::string>{"Placeholder", "tanh", "Const", "add", "Identity"});
}

TEST_CASE("typed for_range with break_if leads its body's outputs with the stop flag") {
  kiln::function f([](const auto& x) {
    return kiln::for_range(5, [](const auto& i, const auto& t) { return kiln::break_if(i == 3, t * 2.f); }, x);
  });
  const kiln::graph g = f.get_concrete_function(kiln::spec<float, 2>{}).graph();
  const kiln::node& loop = g.nodes()[2];
  REQUIRE(loop.op() == "while");
  CHECK(loop.result_count() == 2);  // the counter and t
  const kiln::graph& body = subgraph(loop, 1);
  REQUIRE(body.outputs().size() == 3);  // stop, then the counter and t
  CHECK(body.nodes()[std::size_t(body.nodes()[std::size_t(body.outputs()[0])].input_ids()[0])].op() == "equal");
}

TEST_CASE("typed variables, prints and host callbacks are effect nodes in program order") {
  kiln::fixed_variable<float, 2> total;
  kiln::function f(
      [&](const auto& x) {
        kiln::print("x:", x);
        auto y = kiln::host_callback([](const kiln::fixed<float, 2>& v) { return v; }, x);
        return total.assign_add(y);
      },
      {.arg_names = {"x"}});
  const kiln::graph g = f.get_concrete_function(kiln::spec<float, 2>{}).graph();
  CHECK(graph_ops(g) == std::vector<std::string>{"Placeholder", "PrintV2", "HostCallback", "ReadVariableOp", "add",
                                                 "AssignVariableOp", "Identity"});
  CHECK(g.has_effects());
  CHECK(g.nodes()[4].inputs() == std::vector<std::string>{"ReadVariableOp", "HostCallback"});
  CHECK(g.nodes()[5].inputs() == std::vector<std::string>{"add"});
}

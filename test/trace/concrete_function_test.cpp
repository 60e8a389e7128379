// kiln::concrete_function: get_concrete_function from values and
// specs, bound C++ arguments, calls that do not fit the trace, printing, structured
// signatures and the traced graph.

#include "trace_check.hpp"

#include <algorithm>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

using kiln::testing::graph_listing;
using kiln::testing::require_same;
using kiln::testing::require_throws;

std::string text_of(const kiln::concrete_function& f) {
  std::ostringstream os;
  os << f;
  return os.str();
}

// Printing may or may not end with a newline; the lines are what the seeds show.
std::string without_final_newlines(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

auto make_double(int& traces) {
  return kiln::function(
      [&traces](const kiln::tensor& a) {
        ++traces;
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});
}

auto make_pow() {
  return kiln::function([](const kiln::tensor& a, int b) { return kiln::pow(a, kiln::constant(float(b))); },
                        {.name = "pow", .arg_names = {"a", "b"}});
}

}  // namespace

TEST_CASE("get_concrete_function traces for values without running the graph", "[trace][concrete]") {
  int traces = 0;
  // Running this graph on a one-element x raises; tracing it does not.
  kiln::function pick([&](const kiln::tensor& x) {
    ++traces;
    return kiln::gather(x, kiln::constant({5}));
  });
  kiln::concrete_function cf = pick.get_concrete_function(kiln::constant({1.f}));
  CHECK(traces == 1);
  CHECK(pick.tracing_count() == 1);
  require_throws<kiln::invalid_argument_error>([&] { return cf(kiln::constant({1.f})); }, {"gather"});
  // The function's own calls with that signature reuse the trace.
  require_throws<kiln::invalid_argument_error>([&] { return pick(kiln::constant({2.f})); }, {"gather"});
  CHECK(traces == 1);
  // The same signature again gives the same trace.
  pick.get_concrete_function(kiln::constant({3.f}));
  CHECK(pick.tracing_count() == 1);
}

TEST_CASE("get_concrete_function traces for tensor_specs", "[trace][concrete]") {
  int traces = 0;
  auto dbl = make_double(traces);
  kiln::concrete_function strings = dbl.get_concrete_function(kiln::tensor_spec({}, kiln::string));
  CHECK(traces == 1);
  require_same(strings(kiln::constant("c")), kiln::constant("cc"));
  // A value of that spec's dtype and shape reuses the trace.
  require_same(dbl(kiln::constant("d")), kiln::constant("dd"));
  CHECK(traces == 1);

  kiln::concrete_function vectors = dbl.get_concrete_function(kiln::tensor_spec({kiln::none}, kiln::float32));
  require_same(vectors(kiln::constant({1.f, 2.f, 3.f})), kiln::constant({2.f, 4.f, 6.f}));
  require_same(vectors(kiln::constant({1.f})), kiln::constant({2.f}));
  CHECK(vectors.structured_input_signature().at(0).shape.str() == "(None,)");
  require_throws<kiln::invalid_argument_error>([&] { return vectors(kiln::constant({{1.f}})); }, {"double", "shape"});

  kiln::concrete_function any_rank = dbl.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::int32));
  require_same(any_rank(kiln::constant(4)), kiln::constant(8));
  require_same(any_rank(kiln::constant({{1, 2}})), kiln::constant({{2, 4}}));
  CHECK(traces == 3);
}

TEST_CASE("a C++ argument bound at trace time may be omitted, and no other value is accepted", "[trace][concrete]") {
  auto pw = make_pow();
  kiln::concrete_function square = pw.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::float32), 2);
  require_same(square(kiln::constant(10.f)), kiln::constant(100.f));
  require_same(square(kiln::constant({1.f, 3.f})), kiln::constant({1.f, 9.f}));
  require_same(square(kiln::constant(10.f), 2), kiln::constant(100.f));
  require_throws<kiln::type_error>([&] { return square(kiln::constant(10.f), 3); },
                                   {"pow(a, b", "was constructed with int value 2 in b, but was called with int value 3"});
  require_throws<kiln::type_error>([&] { return square(3, kiln::constant(10.f)); }, {"pow", "takes a tensor in a"});
  CHECK(pw.tracing_count() == 1);
}

TEST_CASE("a concrete call whose tensors do not fit raises invalid_argument_error", "[trace][concrete]") {
  int traces = 0;
  auto dbl = make_double(traces);
  kiln::concrete_function strings = dbl.get_concrete_function(kiln::constant("a"));
  require_same(strings(kiln::constant("b")), kiln::constant("bb"));
  require_throws<kiln::invalid_argument_error>(
      [&] { return strings(kiln::constant(1)); },
      {"cannot compute double as input #0(zero-based) was expected to be a string tensor but is a int32 tensor"});
  require_throws<kiln::invalid_argument_error>([&] { return strings(kiln::reshape(kiln::constant("a"), {1})); }, {"double", "shape"});
  require_throws<kiln::invalid_argument_error>([&] { return strings(kiln::constant("a"), kiln::constant("b")); },
                                               {"double"});
  require_throws<kiln::invalid_argument_error>([&] { return strings(); }, {"double"});
  CHECK(traces == 1);
}

TEST_CASE("pretty_printed_concrete_signatures lists every trace in the seeds' format", "[trace][concrete]") {
  int traces = 0;
  auto dbl = make_double(traces);
  dbl(kiln::constant(1));
  dbl(kiln::constant(1.1f));
  dbl(kiln::constant("a"));
  dbl(kiln::constant("b"));
  CHECK(without_final_newlines(dbl.pretty_printed_concrete_signatures()) ==
        "double(a)\n"
        "  Args:\n"
        "    a: int32 Tensor, shape=()\n"
        "  Returns:\n"
        "    int32 Tensor, shape=()\n"
        "\n"
        "double(a)\n"
        "  Args:\n"
        "    a: float32 Tensor, shape=()\n"
        "  Returns:\n"
        "    float32 Tensor, shape=()\n"
        "\n"
        "double(a)\n"
        "  Args:\n"
        "    a: string Tensor, shape=()\n"
        "  Returns:\n"
        "    string Tensor, shape=()");

  kiln::function unnamed([](const kiln::tensor& x, const kiln::tensor& y) { return x * y; });
  unnamed(kiln::constant({1.f, 2.f}), kiln::constant(2.f));
  const std::string text = unnamed.pretty_printed_concrete_signatures();
  CHECK_THAT(text, Catch::Matchers::Contains("(x0, x1)"));
  CHECK_THAT(text, Catch::Matchers::Contains("x0: float32 Tensor, shape=(2,)"));
  CHECK_THAT(text, Catch::Matchers::Contains("x1: float32 Tensor, shape=()"));
}

TEST_CASE("a concrete function prints as ConcreteFunction with its signature", "[trace][concrete]") {
  int traces = 0;
  auto dbl = make_double(traces);
  CHECK(without_final_newlines(text_of(dbl.get_concrete_function(kiln::constant("a")))) ==
        "ConcreteFunction double(a)\n"
        "  Args:\n"
        "    a: string Tensor, shape=()\n"
        "  Returns:\n"
        "    string Tensor, shape=()");
  auto pw = make_pow();
  CHECK(without_final_newlines(text_of(pw.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::float32), 2))) ==
        "ConcreteFunction pow(a, b=2)\n"
        "  Args:\n"
        "    a: float32 Tensor, shape=<unknown>\n"
        "  Returns:\n"
        "    float32 Tensor, shape=<unknown>");
  // TensorFlow 2.12 shows a function that returns nothing as NoneTensorSpec().
  kiln::function nothing([](const kiln::tensor& x) { (void)(x + 1); }, {.name = "nothing", .arg_names = {"x"}});
  CHECK_THAT(text_of(nothing.get_concrete_function(kiln::constant(1))),
             Catch::Matchers::EndsWith("Returns:\n    NoneTensorSpec()\n"));
}

TEST_CASE("a concrete function's pretty_printed_signature shows structures as TensorFlow 2.12 does", "[trace][concrete]") {
  // Each expected text is what TensorFlow 2.12.1 printed for the same function.
  kiln::function a([](const kiln::tensor& x) { return std::tuple{x, std::tuple{x + 1, x * 2}}; }, {.name = "a", .arg_names = {"x"}});
  CHECK(a.get_concrete_function(kiln::constant(1)).pretty_printed_signature() ==
        "a(x)\n"
        "  Args:\n"
        "    x: int32 Tensor, shape=()\n"
        "  Returns:\n"
        "    (<1>, (<2>, <3>))\n"
        "      <1>: int32 Tensor, shape=()\n"
        "      <2>: int32 Tensor, shape=()\n"
        "      <3>: int32 Tensor, shape=()");
  kiln::function b([](const kiln::tensor& x) { return std::vector{x, x}; }, {.name = "b", .arg_names = {"x"}});
  CHECK(b.get_concrete_function(kiln::constant(1)).pretty_printed_signature() ==
        "b(x)\n  Args:\n    x: int32 Tensor, shape=()\n  Returns:\n    [<1>, <2>]\n"
        "      <1>: int32 Tensor, shape=()\n      <2>: int32 Tensor, shape=()");
  kiln::function c([](const kiln::tensor& x) { return std::tuple{x}; }, {.name = "c", .arg_names = {"x"}});
  CHECK(c.get_concrete_function(kiln::constant(1)).pretty_printed_signature() ==
        "c(x)\n  Args:\n    x: int32 Tensor, shape=()\n  Returns:\n    (<1>,)\n      <1>: int32 Tensor, shape=()");
  kiln::function e([](const kiln::tensor& x, const std::tuple<kiln::tensor, kiln::tensor>&) { return x; },
                   {.name = "e", .arg_names = {"x", "y"}});
  CHECK(e.get_concrete_function(kiln::constant(1), std::tuple{kiln::constant(1.f), kiln::constant(2)})
            .pretty_printed_signature() ==
        "e(x, y)\n"
        "  Args:\n"
        "    x: int32 Tensor, shape=()\n"
        "    y: (<1>, <2>)\n"
        "      <1>: float32 Tensor, shape=()\n"
        "      <2>: int32 Tensor, shape=()\n"
        "  Returns:\n"
        "    int32 Tensor, shape=()");
  // The same in the compile-time tier, and in the list of every trace.
  kiln::function t([](const auto& x) { return std::tuple{x, x + 1.f}; }, {.name = "t", .arg_names = {"x"}});
  const std::string typed = t.get_concrete_function(kiln::spec<float, 2>{}).pretty_printed_signature();
  CHECK(typed ==
        "t(x)\n  Args:\n    x: float32 Tensor, shape=(2,)\n  Returns:\n    (<1>, <2>)\n"
        "      <1>: float32 Tensor, shape=(2,)\n      <2>: float32 Tensor, shape=(2,)");
  CHECK(t.pretty_printed_concrete_signatures() == typed);
  CHECK(a.pretty_printed_concrete_signatures() == a.get_concrete_function(kiln::constant(1)).pretty_printed_signature());
}

TEST_CASE("a signature shows a bound sequence of C++ values as a list", "[trace][concrete]") {
  // The seeds' my_relu([1, -1]) prints as `my_relu(x=[1, -1])`, with no Args block:
  // the trace has no tensor argument.
  kiln::function my_relu([](const std::vector<int>& x) { return kiln::maximum(kiln::constant(x, kiln::float32), 0.f); },
                         {.name = "my_relu", .arg_names = {"x"}});
  require_same(my_relu(std::vector{1, -1}), kiln::constant({1.f, 0.f}));
  const std::string text = my_relu.pretty_printed_concrete_signatures();
  CHECK_THAT(text, Catch::Matchers::StartsWith("my_relu(x=[1, -1])\n"));
  CHECK_THAT(text, !Catch::Matchers::Contains("Args:"));
}

TEST_CASE("structured_input_signature and structured_outputs give specs", "[trace][concrete]") {
  int traces = 0;
  auto dbl = make_double(traces);
  kiln::concrete_function strings = dbl.get_concrete_function(kiln::constant("a"));
  const std::vector<kiln::tensor_spec>& inputs = strings.structured_input_signature();
  REQUIRE(inputs.size() == 1);
  CHECK(inputs[0] == kiln::tensor_spec({}, kiln::string, "a"));
  CHECK(inputs[0].str() == "TensorSpec(shape=(), dtype=tf.string, name='a')");
  std::vector<kiln::tensor_spec> outputs = strings.structured_outputs();
  REQUIRE(outputs.size() == 1);
  CHECK(outputs[0] == kiln::tensor_spec({}, kiln::string, "Identity:0"));

  kiln::function two([](const kiln::tensor& x) { return std::pair{x, kiln::cast(x, kiln::float64) * 2.0}; });
  std::vector<kiln::tensor_spec> pair_outputs =
      two.get_concrete_function(kiln::tensor_spec({kiln::none, 3}, kiln::int32)).structured_outputs();
  REQUIRE(pair_outputs.size() == 2);
  CHECK(pair_outputs[0] == kiln::tensor_spec({kiln::none, 3}, kiln::int32, "Identity:0"));
  CHECK(pair_outputs[1] == kiln::tensor_spec({kiln::none, 3}, kiln::float64, "Identity_1:0"));
}

TEST_CASE("the graph of a + a is a placeholder, an add and an Identity", "[trace][concrete][graph]") {
  int traces = 0;
  auto dbl = make_double(traces);
  const kiln::graph g = dbl.get_concrete_function(kiln::constant("a")).graph();
  CHECK(graph_listing(g) == std::vector<std::string>{"[] -> a", "['a', 'a'] -> add", "['add'] -> Identity"});
  REQUIRE(g.nodes().size() == 3);
  const kiln::node &a = g.nodes()[0], &add = g.nodes()[1], &identity = g.nodes()[2];
  CHECK(a.op() == "Placeholder");
  CHECK(add.op() == "add");
  CHECK(identity.op() == "Identity");
  CHECK(add.inputs() == std::vector<std::string>{"a", "a"});
  for (const kiln::node& n : g.nodes()) {
    CHECK(n.dtype() == kiln::string);
    CHECK(n.shape() == kiln::shape{});
  }
  const std::string dot = g.to_dot();
  CHECK_THAT(dot, Catch::Matchers::StartsWith("digraph"));
  for (const kiln::node& n : g.nodes()) CHECK_THAT(dot, Catch::Matchers::Contains(n.name()));
}

TEST_CASE("to_dot draws special nodes without subgraphs (variable reads, prints)", "[trace][concrete][graph]") {
  kiln::variable v(2.f, "v");
  kiln::function f([&](const kiln::tensor& x) {
    kiln::print(x);
    return x * v.read_value();
  });
  const kiln::graph& g = f.get_concrete_function(kiln::constant(1.f)).graph();
  const std::string dot = g.to_dot();
  CHECK_THAT(dot, Catch::Matchers::StartsWith("digraph"));
  for (const kiln::node& n : g.nodes()) CHECK_THAT(dot, Catch::Matchers::Contains(n.name()));
  CHECK_THAT(dot, !Catch::Matchers::Contains("subgraph"));
}

TEST_CASE("graph nodes come in execution order with unique names, dtypes and shapes", "[trace][concrete][graph]") {
  kiln::function f(
      [](const kiln::tensor& x, const kiln::tensor& w) {
        kiln::tensor h = kiln::matmul(x, w);
        kiln::tensor y = h + h + 1.f;
        return std::tuple{kiln::reduce_sum(y, 1), kiln::cast(y > 0.f, kiln::int32)};
      },
      {.name = "layer", .arg_names = {"x", "w"}});
  const kiln::graph g =
      f.get_concrete_function(kiln::tensor_spec({kiln::none, 2}, kiln::float32), kiln::tensor_spec({2, 3}, kiln::float32))
          .graph();
  std::vector<std::string> seen;
  for (const kiln::node& n : g.nodes()) {
    INFO("node " << n.name());
    CHECK(std::find(seen.begin(), seen.end(), n.name()) == seen.end());  // unique
    for (const std::string& in : n.inputs()) CHECK(std::find(seen.begin(), seen.end(), in) != seen.end());  // earlier
    seen.push_back(n.name());
  }
  CHECK(kiln::testing::count_ops(g, "Placeholder") == 2);
  CHECK(kiln::testing::count_ops(g, "matmul") == 1);
  CHECK(kiln::testing::count_ops(g, "add") == 2);
  CHECK(kiln::testing::count_ops(g, "Identity") == 2);
  CHECK(std::find(seen.begin(), seen.end(), "add_1") != seen.end());
  CHECK(std::find(seen.begin(), seen.end(), "Identity_1") != seen.end());
  for (const kiln::node& n : g.nodes()) {
    INFO("node " << n.name() << " op " << n.op());
    if (n.op() == "matmul") {
      CHECK(n.dtype() == kiln::float32);
      CHECK(n.shape().str() == "(None, 3)");
      CHECK(n.inputs() == std::vector<std::string>{"x", "w"});
    }
    if (n.op() == "reduce_sum") CHECK(n.shape().str() == "(None,)");
    if (n.op() == "cast") CHECK(n.dtype() == kiln::int32);
  }
  REQUIRE(g.outputs().size() == 2);
  CHECK(g.nodes()[std::size_t(g.outputs()[1])].dtype() == kiln::int32);
  const std::string dot = g.to_dot();
  for (const kiln::node& n : g.nodes()) CHECK_THAT(dot, Catch::Matchers::Contains(n.name()));
}

TEST_CASE("call_flat gives every output of a concrete function", "[trace][concrete]") {
  kiln::function f([](const kiln::tensor& x) { return std::tuple{x + 1, x - 1}; });
  kiln::concrete_function cf = f.get_concrete_function(kiln::constant(5));
  std::vector<kiln::tensor> out = cf.call_flat(kiln::constant(5));
  REQUIRE(out.size() == 2);
  require_same(out[0], kiln::constant(6));
  require_same(out[1], kiln::constant(4));
}

TEST_CASE("a concrete function of a callable that returns nothing can be called", "[trace][concrete]") {
  int traces = 0;
  kiln::function f([&](const kiln::tensor& x) {
    ++traces;
    (void)(x * 2);
  });
  kiln::concrete_function cf = f.get_concrete_function(kiln::constant(1));
  CHECK(cf.call_flat(kiln::constant(2)).empty());
  CHECK_NOTHROW(cf(kiln::constant(2)));
  CHECK(traces == 1);
}

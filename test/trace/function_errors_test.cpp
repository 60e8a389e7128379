// kiln::function calling kiln::functions (nested and recursive), and the errors that
// must be clear instead of hangs or crashes: recursion on one signature, symbolic
// tensors leaking out of their trace, C++ conditions on symbolic tensors, and trace-time
// errors naming the function and the op.

#include "trace_check.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// Under a sanitizer, an allocation too large for any machine fails (returns null, as
// the C library's does) instead of aborting the program, so that the error kiln makes of
// it while a graph runs is tested there too. Read only by sanitized builds of this executable.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }

namespace {

using kiln::testing::count_ops;
using kiln::testing::functions_run_eagerly_scope;
using kiln::testing::graph_listing;
using kiln::testing::require_same;
using kiln::testing::require_throws;

}  // namespace

TEST_CASE("a function called while tracing another traces once and is inlined", "[trace][nested]") {
  int add_traces = 0;
  kiln::function add(
      [&](const kiln::tensor& a, const kiln::tensor& b) {
        ++add_traces;
        return a + b;
      },
      {.name = "add", .arg_names = {"a", "b"}});
  kiln::function dense_layer(
      [&](const kiln::tensor& x, const kiln::tensor& w, const kiln::tensor& b) { return add(kiln::matmul(x, w), b); },
      {.name = "dense_layer", .arg_names = {"x", "w", "b"}});
  for (int call = 0; call < 3; ++call)
    require_same(dense_layer(kiln::ones({3, 2}), kiln::ones({2, 2}), kiln::ones({2})), kiln::fill({3, 2}, 3.f));
  CHECK(add_traces == 1);
  CHECK(add.tracing_count() == 1);
  CHECK(dense_layer.tracing_count() == 1);
  // The inner trace's nodes sit in the outer graph; no call node, no inner Identity.
  const kiln::graph g =
      dense_layer.get_concrete_function(kiln::ones({3, 2}), kiln::ones({2, 2}), kiln::ones({2})).graph();
  CHECK(graph_listing(g) == std::vector<std::string>{"[] -> x", "[] -> w", "[] -> b", "['x', 'w'] -> matmul",
                                                     "['matmul', 'b'] -> add", "['add'] -> Identity"});
  // Called eagerly with the signature it was traced for, the inner function reuses its trace.
  require_same(add(kiln::ones({3, 2}), kiln::ones({2})), kiln::fill({3, 2}, 2.f));
  CHECK(add_traces == 1);
}

TEST_CASE("an inner function called twice is inlined twice under unique names", "[trace][nested]") {
  int inner_traces = 0;
  kiln::function scale([&](const kiln::tensor& v) {
    ++inner_traces;
    return v * 2.f;
  });
  kiln::function outer([&](const kiln::tensor& x) { return scale(scale(x) + 1.f); });
  require_same(outer(kiln::constant({1.f, 2.f})), kiln::constant({6.f, 10.f}));
  require_same(outer(kiln::constant({0.f, 1.f})), kiln::constant({2.f, 6.f}));
  CHECK(inner_traces == 1);
  const kiln::graph g = outer.get_concrete_function(kiln::constant({1.f, 2.f})).graph();
  CHECK(count_ops(g, "mul") == 2);
  CHECK(count_ops(g, "Identity") == 1);
  std::vector<std::string> names;
  for (const kiln::node& n : g.nodes()) names.push_back(n.name());
  CHECK(std::find(names.begin(), names.end(), "mul_1") != names.end());
}

TEST_CASE("an inner function called with no symbolic tensor is inlined too", "[trace][nested]") {
  // The seeds' outer_function builds constants and calls a function on them; its ops
  // belong in the outer graph (so that effects inside run with every call), not a
  // value computed once while tracing.
  kiln::function seven([] { return kiln::constant(3) + 4; });
  kiln::function twice([](const kiln::tensor& c) { return c * 2; });
  kiln::function outer([&](const kiln::tensor& x) { return x * seven() + twice(kiln::constant(1)); });
  require_same(outer(kiln::constant(2)), kiln::constant(16));
  const kiln::graph g = outer.get_concrete_function(kiln::constant(2)).graph();
  CHECK(count_ops(g, "mul") == 2);  // twice's mul and outer's mul
  // seven's `constant(3) + 4` is recorded like any op inside a trace (the optimizer
  // folds it, not the tracer): outer's graph has seven's add and its own.
  CHECK(count_ops(g, "add") == 2);
}

TEST_CASE("a function that calls itself with the same signature while tracing raises value_error", "[trace][recursion]") {
  std::function<kiln::tensor(const kiln::tensor&)> call_self;
  kiln::function forever([&](const kiln::tensor& x) { return call_self(x) + 1; }, {.name = "forever", .arg_names = {"x"}});
  call_self = [&](const kiln::tensor& x) { return forever(x); };
  require_throws<kiln::value_error>([&] { return forever(kiln::constant(1)); }, {"forever", "calls itself"});
  CHECK(forever.tracing_count() == 0);
  // The failed trace left nothing behind: the next call fails the same way, without hanging.
  require_throws<kiln::value_error>([&] { return forever(kiln::constant(1)); }, {"forever", "calls itself"});
}

TEST_CASE("recursion over C++ values traces once per value and inlines the inner traces", "[trace][recursion]") {
  int traces = 0;
  std::function<kiln::tensor(const kiln::tensor&, int)> recurse;
  kiln::function sum_to(
      [&](const kiln::tensor& x, int n) -> kiln::tensor {
        ++traces;
        return n == 0 ? x : recurse(x, n - 1) + n;
      },
      {.name = "sum_to", .arg_names = {"x", "n"}});
  recurse = [&](const kiln::tensor& x, int n) { return sum_to(x, n); };
  require_same(sum_to(kiln::constant(0), 4), kiln::constant(10));
  CHECK(traces == 5);
  CHECK(sum_to.tracing_count() == 5);
  require_same(sum_to(kiln::constant(100), 4), kiln::constant(110));
  require_same(sum_to(kiln::constant(0), 2), kiln::constant(3));  // traced on the way down
  CHECK(traces == 5);
  CHECK(count_ops(sum_to.get_concrete_function(kiln::constant(0), 4).graph(), "add") == 4);

  // The seeds' recursive_fn(5): a C++ argument only, "tracing" five times.
  std::ostringstream out;
  std::function<kiln::tensor(int)> recurse_fn;
  kiln::function recursive_fn([&](int n) -> kiln::tensor {
    if (n > 0) {
      out << "tracing\n";
      return recurse_fn(n - 1);
    }
    return kiln::constant(1);
  });
  recurse_fn = [&](int n) { return recursive_fn(n); };
  require_same(recursive_fn(5), kiln::constant(1));
  CHECK(out.str() == "tracing\ntracing\ntracing\ntracing\ntracing\n");
  CHECK(recursive_fn.tracing_count() == 6);
}

TEST_CASE("a symbolic tensor leaked out of its trace raises type_error where it is used", "[trace][leak]") {
  std::optional<kiln::tensor> leaked;
  std::vector<kiln::tensor> saved;
  kiln::function f(
      [&](const kiln::tensor& x) {
        leaked = x * 2;
        saved.push_back(x);
        return x;
      },
      {.name = "leaky", .arg_names = {"x"}});
  require_same(f(kiln::constant(1)), kiln::constant(1));
  REQUIRE(leaked.has_value());
  REQUIRE(leaked->is_symbolic());
  REQUIRE(saved.size() == 1);

  require_throws<kiln::type_error>([&] { return *leaked + 1; }, {"symbolic tensor"});
  require_throws<kiln::type_error>([&] { return kiln::exp(kiln::cast(saved[0], kiln::float32)); }, {"symbolic tensor"});
  require_throws<kiln::type_error>([&] { return leaked->item<int>(); }, {"a symbolic tensor has no value"});
  require_throws<kiln::type_error>([&] { return saved[0].to_vector<int>(); }, {"a symbolic tensor has no value"});

  // In another trace, it belongs to the wrong graph.
  kiln::function g([&](const kiln::tensor& x) { return x + *leaked; }, {.name = "g"});
  require_throws<kiln::type_error>([&] { return g(kiln::constant(1)); }, {"g", "another trace"});
  // Passed to a function or a concrete function outside any trace.
  kiln::function h([](const kiln::tensor& x) { return x * 3; }, {.name = "h"});
  require_throws<kiln::type_error>([&] { return h(*leaked); }, {"symbolic tensor"});
  kiln::concrete_function cf = h.get_concrete_function(kiln::constant(5));
  require_throws<kiln::type_error>([&] { return cf(saved[0]); }, {"symbolic tensor"});
}

TEST_CASE("a C++ condition on a symbolic tensor raises an error naming kiln::cond", "[trace][errors]") {
  kiln::function simple_relu(
      [](const kiln::tensor& x) {
        if (x > 0) return x;
        return kiln::zeros_like(x);
      },
      {.name = "simple_relu", .arg_names = {"x"}});
  require_throws<kiln::type_error>([&] { return simple_relu(kiln::constant(1)); },
                                   {"simple_relu", "kiln::cond", "kiln::while_loop"});
  CHECK(simple_relu.tracing_count() == 0);
  // Eagerly the condition is read from the value.
  functions_run_eagerly_scope eagerly;
  require_same(simple_relu(kiln::constant(1)), kiln::constant(1));
  require_same(simple_relu(kiln::constant(-1)), kiln::constant(0));
}

TEST_CASE("ops whose operands do not fit raise TensorFlow 2.12's kind in each mode", "[trace][errors]") {
  // Eagerly: InvalidArgumentError, for shapes and dtypes alike.
  require_throws<kiln::invalid_argument_error>([] { return kiln::constant({1, 2}) + kiln::constant({1, 2, 3}); },
                                               {"add", "(2,)", "(3,)"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::constant(1) + kiln::constant(1.f); },
                                               {"add", "int32", "float32"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::matmul(kiln::ones({2, 3}), kiln::ones({2, 3})); },
                                               {"matmul", "(2, 3)"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::reshape(kiln::ones({6}), {4}); }, {"reshape"});
  // While tracing: ValueError for shapes, TypeError for dtypes (the next test case).
  // When a graph runs with dims known only then: InvalidArgumentError, naming the
  // function and the node.
  kiln::function h([](const kiln::tensor& a, const kiln::tensor& b) { return a + b; },
                   {.name = "h",
                    .input_signature = std::vector{kiln::tensor_spec({kiln::none}, kiln::int32),
                                                   kiln::tensor_spec({kiln::none}, kiln::int32)}});
  require_throws<kiln::invalid_argument_error>([&] { return h(kiln::constant({1, 2}), kiln::constant({1, 2, 3})); },
                                               {"in h", "node 'add'", "add", "(2,)", "(3,)"});
  require_same(h(kiln::constant({1, 2}), kiln::constant({3, 4})), kiln::constant({4, 6}));
  // A value an op cannot use, found when the graph runs, names them too.
  kiln::function pick([](const kiln::tensor& x, const kiln::tensor& i) { return kiln::gather(x, i); }, {.name = "pick"});
  require_throws<kiln::invalid_argument_error>([&] { return pick(kiln::constant({1, 2}), kiln::constant({5})); },
                                               {"in pick", "node 'gather'", "gather"});
}

TEST_CASE("memory that runs out while a graph runs is an error naming the function, the node and the op", "[trace][errors]") {
  // Dims known only when the graph runs: a broadcast of (2^20, 1) against (1, 2^25)
  // asks for 2^45 floats.
  kiln::function outer([](const kiln::tensor& a, const kiln::tensor& b) { return a + b; },
                       {.name = "outer",
                        .input_signature = std::vector{kiln::tensor_spec({kiln::none, kiln::none}, kiln::float32),
                                                       kiln::tensor_spec({kiln::none, kiln::none}, kiln::float32)}});
  require_throws<kiln::resource_exhausted_error>(
      [&] { return outer(kiln::zeros({1 << 20, 1}), kiln::zeros({1, 1 << 25})); }, {"in outer", "node 'add'", "add", "(1048576, 33554432)"});
}

TEST_CASE("errors raised while tracing name the function and the op", "[trace][errors]") {
  kiln::function broken([](const kiln::tensor& a, const kiln::tensor& b) { return a + b; }, {.name = "broken"});
  require_throws<kiln::value_error>([&] { return broken(kiln::constant({1, 2}), kiln::constant({1, 2, 3})); },
                                    {"broken", "add", "(2,)", "(3,)"});
  require_throws<kiln::type_error>([&] { return broken(kiln::constant(1), kiln::constant(1.f)); },
                                   {"broken", "add", "int32", "float32"});
  kiln::function shapes([](const kiln::tensor& a) { return kiln::matmul(a, a); }, {.name = "shapes"});
  require_throws<kiln::value_error>([&] { return shapes(kiln::ones({2, 3})); }, {"shapes", "matmul"});
  // A reduction axis out of range: ValueError while tracing, InvalidArgumentError
  // eagerly and when a graph of unknown rank runs.
  kiln::function sum_axis_2([](const kiln::tensor& a) { return kiln::reduce_sum(a, 2); }, {.name = "sum_axis_2"});
  require_throws<kiln::value_error>([&] { return sum_axis_2(kiln::ones({2, 3})); }, {"sum_axis_2", "reduce_sum", "axis 2"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::reduce_sum(kiln::ones({2, 3}), 2); }, {"reduce_sum", "axis 2"});
  kiln::function any_rank([](const kiln::tensor& a) { return kiln::reduce_sum(a, 2); },
                          {.name = "any_rank", .input_signature = std::vector{kiln::tensor_spec(kiln::unknown_rank, kiln::float32)}});
  require_same(any_rank(kiln::ones({1, 1, 2})), kiln::constant({{2.f}}));
  require_throws<kiln::invalid_argument_error>([&] { return any_rank(kiln::ones({2, 3})); }, {"in any_rank", "reduce_sum"});
  // A failed trace is not kept: the function traces again, and succeeds on good inputs.
  CHECK(broken.tracing_count() == 0);
  require_same(broken(kiln::constant(1), kiln::constant(2)), kiln::constant(3));
  CHECK(broken.tracing_count() == 1);

  int traces = 0;
  kiln::function throws([&](const kiln::tensor& a) -> kiln::tensor {
    if (++traces == 1) throw std::runtime_error("not a kiln error");
    return a;
  });
  CHECK_THROWS_WITH(throws(kiln::constant(1)), "not a kiln error");
  CHECK(throws.tracing_count() == 0);
  require_same(throws(kiln::constant(1)), kiln::constant(1));
}

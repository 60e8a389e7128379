// Where kiln::function must do what tf.function does: ops on constants are recorded
// while tracing (and folded by the optimizer, never by the tracer), random ops draw
// at every call, init_scope lifts work out of a trace, and the printing details.

#include "trace_check.hpp"

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using kiln::testing::count_ops;
using kiln::testing::graph_listing;
using kiln::testing::graph_ops;
using kiln::testing::require_same;
using kiln::testing::require_throws;

}  // namespace

TEST_CASE("ops on constants inside a trace are recorded, as TensorFlow records them", "[trace][fidelity]") {
  kiln::function f([] { return kiln::constant(3) * kiln::constant(3) + 2; }, {.name = "f"});
  require_same(f(), kiln::constant(11));
  CHECK(graph_ops(f.get_concrete_function().graph()) ==
        std::vector<std::string>{"Const", "Const", "mul", "Const", "add", "Identity"});
  // The C++ value 3 * 3 + 2 is C++ arithmetic: a constant only.
  kiln::function g([] { return kiln::constant(3 * 3 + 2); }, {.name = "g"});
  CHECK(graph_ops(g.get_concrete_function().graph()) == std::vector<std::string>{"Const", "Identity"});
}

TEST_CASE("the seed's train over a C++ list unrolls: its graph grows with the list", "[trace][fidelity]") {
  // def train(dataset): loss = tf.constant(0); for x, y in dataset: loss += tf.abs(y - x)
  kiln::function train(
      [](const std::vector<std::pair<int, int>>& dataset) {
        kiln::tensor loss = kiln::constant(0);
        for (const auto& [x, y] : dataset) loss = loss + kiln::abs(kiln::constant(y - x));
        return loss;
      },
      {.name = "train", .arg_names = {"dataset"}});
  // TensorFlow 2.12: 11 and 32 nodes (Const, then Const, Abs, AddV2 per pair, Identity).
  CHECK(train.get_concrete_function(std::vector<std::pair<int, int>>(3, {1, 1})).graph().nodes().size() == 11);
  CHECK(train.get_concrete_function(std::vector<std::pair<int, int>>(10, {1, 1})).graph().nodes().size() == 32);
  require_same(train(std::vector<std::pair<int, int>>{{1, 3}, {4, 2}}), kiln::constant(4));
}

TEST_CASE("an unused failing op on a constant made inside a function never runs", "[trace][fidelity]") {
  // The out-of-range gather raises eagerly; in the graph nothing needs it, so the
  // call returns, and the optimizer's folding leaves the failing op in the graph.
  kiln::function f(
      [](const kiln::tensor& x) {
        (void)kiln::gather(kiln::constant({0.f}), kiln::constant({1}));
        return x + 1.f;
      },
      {.name = "f", .arg_names = {"x"}});
  require_same(f(kiln::constant(1.f)), kiln::constant(2.f));
  CHECK(count_ops(f.get_concrete_function(kiln::constant(1.f)).graph(), "gather") == 1);
  // Needed, it fails when it runs, with the op's error.
  kiln::function g([] { return kiln::gather(kiln::constant({0.f}), kiln::constant({1})); }, {.name = "g"});
  require_throws<kiln::invalid_argument_error>([&] { return g(); }, {"gather"});
}

TEST_CASE("random ops draw new numbers at every call of a function", "[trace][fidelity][random]") {
  kiln::function f([] { return kiln::random::uniform({100}); }, {.name = "f"});
  const auto first = f().to_vector<float>();
  const auto second = f().to_vector<float>();
  CHECK(first != second);
  CHECK(f.tracing_count() == 1);
  CHECK(count_ops(f.get_concrete_function().graph(), "RandomUniform") == 1);
  // Two draws in one function are two ops, never merged by the optimizer.
  kiln::function pair([] { return kiln::random::uniform({50}) - kiln::random::uniform({50}); }, {.name = "pair"});
  CHECK(kiln::reduce_max(kiln::abs(pair())).item<float>() > 0);
  // A random op whose result nothing needs does not run and does not fail.
  kiln::function unused(
      [](const kiln::tensor& x) {
        (void)kiln::random::uniform({3});
        return x;
      },
      {.name = "unused", .arg_names = {"x"}});
  require_same(unused(kiln::constant(1)), kiln::constant(1));
}

TEST_CASE("seeded random ops in functions repeat their sequence, not their numbers", "[trace][fidelity][random]") {
  // An op seed: each call draws anew, and a new trace of the same program draws the
  // same sequence again (what a second run of the program sees).
  auto sequence = [] {
    kiln::function f([] { return kiln::random::uniform({8}, 0, 10, kiln::int32, 7); }, {.name = "f"});
    std::vector<std::vector<std::int32_t>> draws;
    for (int call = 0; call < 3; ++call) draws.push_back(f().to_vector<std::int32_t>());
    return draws;
  };
  const auto a = sequence();
  CHECK(a[0] != a[1]);
  CHECK(a[1] != a[2]);
  CHECK(sequence() == a);
  // A global seed and no op seed: the same sequence after set_seed again.
  auto global = [] {
    kiln::random::set_seed(1234);
    kiln::function f([] { return kiln::random::uniform({4}) + kiln::random::uniform({4}); }, {.name = "f"});
    return std::pair{f().to_vector<float>(), f().to_vector<float>()};
  };
  const auto g = global();
  CHECK(g.first != g.second);
  CHECK(global() == g);
}

TEST_CASE("a generator in a function draws at every call and keeps its state", "[trace][fidelity][random]") {
  auto gen = kiln::random::generator::from_seed(3);
  kiln::function f([&] { return gen.uniform({16}); }, {.name = "f"});
  const auto first = f().to_vector<float>();
  const auto second = f().to_vector<float>();
  CHECK(first != second);
  CHECK(count_ops(f.get_concrete_function().graph(), "StatefulUniform") == 1);
  // Eager draws and graph draws share the generator's state.
  gen.reset_from_seed(3);
  CHECK(gen.uniform({16}).to_vector<float>() == first);
  CHECK(f().to_vector<float>() == second);
  // A draw whose numbers are unused still advances the state, in program order.
  kiln::function skip(
      [&](const kiln::tensor& x) {
        (void)gen.uniform({16});
        return x;
      },
      {.name = "skip", .arg_names = {"x"}});
  gen.reset_from_seed(3);
  skip(kiln::constant(0));
  CHECK(gen.uniform({16}).to_vector<float>() == second);
}

TEST_CASE("init_scope lifts ops out of the trace: they run once, while tracing", "[trace][fidelity]") {
  // The seed's Model: a C++ counter guards an increment. Traced, the increment runs
  // at every call (1, 2, 3); under init_scope, once (1, 1, 1).
  struct model {
    kiln::variable v{0};
    int counter = 0;
  };
  auto run = [](bool lift) {
    model m;
    kiln::function call(
        [&m, lift] {
          if (m.counter == 0) {
            m.counter += 1;
            if (lift) {
              kiln::init_scope scope;
              CHECK_FALSE(kiln::detail::tracing());
              CHECK_FALSE((kiln::constant(1) + 1).is_symbolic());
              m.v.assign_add(1);
            } else {
              m.v.assign_add(1);
            }
          }
          CHECK(kiln::detail::tracing());  // the scope restored the trace
          return m.v.read_value();
        },
        {.name = "Model"});
    std::vector<std::int32_t> values;
    for (int n = 0; n < 3; ++n) values.push_back(call().item<std::int32_t>());
    return values;
  };
  CHECK(run(false) == std::vector<std::int32_t>{1, 2, 3});
  CHECK(run(true) == std::vector<std::int32_t>{1, 1, 1});
}

TEST_CASE("kiln::print writes to standard error by default, as tf.print", "[trace][fidelity]") {
  CHECK(&kiln::config::print_stream() == &std::cerr);
}

TEST_CASE("pretty_printed_concrete_signatures ends without a newline", "[trace][fidelity]") {
  kiln::function f([](const kiln::tensor& x) { return x; }, {.name = "f", .arg_names = {"x"}});
  f(kiln::constant(1));
  f(kiln::constant(1.f));
  const std::string text = f.pretty_printed_concrete_signatures();
  CHECK(text ==
        "f(x)\n  Args:\n    x: int32 Tensor, shape=()\n  Returns:\n    int32 Tensor, shape=()\n\n"
        "f(x)\n  Args:\n    x: float32 Tensor, shape=()\n  Returns:\n    float32 Tensor, shape=()");
}

TEST_CASE("reduce_retracing relaxes a changed rank to an unknown rank, as TensorFlow", "[trace][fidelity][retracing]") {
  kiln::function f([](const kiln::tensor& x) { return kiln::reduce_sum(x); },
                   {.name = "f", .arg_names = {"x"}, .reduce_retracing = true});
  // TensorFlow traces 3 times: (2,), then (None,) for (3,) and (4,), then <unknown>
  // for the rank-2 calls.
  require_same(f(kiln::ones({2}, kiln::int32)), kiln::constant(2));
  require_same(f(kiln::ones({3}, kiln::int32)), kiln::constant(3));
  require_same(f(kiln::ones({4}, kiln::int32)), kiln::constant(4));
  require_same(f(kiln::ones({1, 2}, kiln::int32)), kiln::constant(2));
  require_same(f(kiln::ones({1, 3}, kiln::int32)), kiln::constant(3));
  CHECK(f.tracing_count() == 3);
  const std::string text = f.pretty_printed_concrete_signatures();
  CHECK_THAT(text, Catch::Matchers::Contains("x: int32 Tensor, shape=(None,)"));
  CHECK_THAT(text, Catch::Matchers::Contains("x: int32 Tensor, shape=<unknown>"));
}

TEST_CASE("a call reuses the most specific existing trace that accepts it", "[trace][fidelity][retracing]") {
  // Each trace adds what it knew of the first dim, so the result tells which ran.
  int traces = 0;
  kiln::function f(
      [&](const kiln::tensor& x) {
        ++traces;
        const std::int64_t known = x.shape().has_known_rank() ? x.shape()[0] : -2;
        return x + kiln::cast(kiln::constant(std::int32_t(known == kiln::none ? -1 : known)), x.dtype());
      },
      {.name = "f", .arg_names = {"x"}});
  f.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::int32));
  f.get_concrete_function(kiln::tensor_spec({kiln::none}, kiln::int32));
  require_same(f(kiln::constant({10, 20, 30})), kiln::constant({9, 19, 29}));  // (None,) over <unknown>
  require_same(f(kiln::constant({{10}})), kiln::constant({{8}}));               // only <unknown> accepts (1, 1)
  CHECK(traces == 2);
  require_same(f(kiln::constant(std::vector<std::int32_t>{10, 20}, {2})), kiln::constant({9, 19}));
  CHECK(traces == 2);
  // An exact trace, once made, is the most specific.
  f.get_concrete_function(kiln::tensor_spec({2}, kiln::int32));
  require_same(f(kiln::constant({10, 20})), kiln::constant({12, 22}));
  CHECK(f.tracing_count() == 3);
  // Another dtype is another signature: no trace accepts it.
  f(kiln::constant({1.f}));
  CHECK(f.tracing_count() == 4);
}

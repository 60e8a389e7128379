// kiln::function's tracing rules: one trace per call signature,
// how each kind of argument enters the signature, input_signature, reduce_retracing,
// returned structures, run_functions_eagerly and calls from several threads.

#include "trace_check.hpp"

#include <array>
#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using kiln::testing::functions_run_eagerly_scope;
using kiln::testing::require_same;
using kiln::testing::require_throws;

enum class activation { relu, tanh };

// Flattened field by field: its tensor is a tensor leaf, its int a value leaf.
struct scaled_input {
  kiln::tensor x;
  int scale = 1;
};

// Not an aggregate (it has a constructor), so a call keys it by its address, as
// TensorFlow keys a Python object by id(): the seeds' SimpleModel.
class simple_model {
 public:
  simple_model() = default;
  float weight = 2.f;
  float bias = 0.f;
};

}  // namespace

TEST_CASE("a function traces once per signature and then reruns its graph", "[trace][function]") {
  int traces = 0;
  kiln::function dbl(
      [&](const kiln::tensor& a) {
        ++traces;
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});
  REQUIRE(dbl.tracing_count() == 0);
  require_same(dbl(kiln::constant(1)), kiln::constant(2));
  require_same(dbl(kiln::constant(5)), kiln::constant(10));
  require_same(dbl(kiln::constant(-3)), kiln::constant(-6));
  CHECK(traces == 1);
  CHECK(dbl.tracing_count() == 1);
}

TEST_CASE("the callable receives symbolic tensors while tracing", "[trace][function]") {
  std::string seen;
  bool symbolic = false;
  kiln::function dbl(
      [&](const kiln::tensor& a) {
        std::ostringstream os;
        os << a;
        seen = os.str();
        symbolic = a.is_symbolic();
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});
  dbl(kiln::constant(1.1f));
  CHECK(symbolic);
  CHECK(seen == "Tensor(\"a:0\", shape=(), dtype=float32)");
}

TEST_CASE("tensors are keyed by dtype and shape, not by value", "[trace][function]") {
  int traces = 0;
  kiln::function dbl([&](const kiln::tensor& a) {
    ++traces;
    return a + a;
  });
  dbl(kiln::constant(1));
  dbl(kiln::constant(7));  // same dtype and shape
  CHECK(traces == 1);
  dbl(kiln::constant(1.5f));  // new dtype
  CHECK(traces == 2);
  dbl(kiln::constant(1.5));  // float64 is another dtype again
  CHECK(traces == 3);
  dbl(kiln::constant({1, 2}));  // new shape
  CHECK(traces == 4);
  dbl(kiln::constant({3, 4}));
  CHECK(traces == 4);
  dbl(kiln::constant({1, 2, 3}));  // same rank, another size
  CHECK(traces == 5);
  dbl(kiln::constant({{1, 2, 3}}));  // same size, another rank
  CHECK(traces == 6);
  require_same(dbl(kiln::constant("a")), kiln::constant("aa"));
  require_same(dbl(kiln::constant("b")), kiln::constant("bb"));
  CHECK(traces == 7);
  CHECK(dbl.tracing_count() == 7);
}

TEST_CASE("C++ numbers, strings and enums are keyed by value", "[trace][function]") {
  SECTION("ints: a new value retraces, the same value does not, and the value is baked into the graph") {
    int traces = 0;
    kiln::function scale([&](const kiln::tensor& x, int n) {
      ++traces;
      return x * n;
    });
    kiln::tensor x = kiln::constant({1, 2});
    require_same(scale(x, 3), kiln::constant({3, 6}));
    require_same(scale(x, 3), kiln::constant({3, 6}));
    CHECK(traces == 1);
    require_same(scale(x, 4), kiln::constant({4, 8}));
    CHECK(traces == 2);
    require_same(scale(x, 3), kiln::constant({3, 6}));
    CHECK(traces == 2);
  }
  SECTION("floating point values and bools") {
    int traces = 0;
    kiln::function f([&](const kiln::tensor& x, double factor, bool negate) {
      ++traces;
      kiln::tensor y = x * float(factor);
      return negate ? -y : y;
    });
    kiln::tensor x = kiln::constant(2.f);
    require_same(f(x, 0.5, false), kiln::constant(1.f));
    require_same(f(x, 0.5, false), kiln::constant(1.f));
    CHECK(traces == 1);
    require_same(f(x, 1.5, false), kiln::constant(3.f));
    CHECK(traces == 2);
    require_same(f(x, 1.5, true), kiln::constant(-3.f));
    CHECK(traces == 3);
  }
  SECTION("std::string by its text") {
    int traces = 0;
    kiln::function act([&](const kiln::tensor& x, const std::string& name) {
      ++traces;
      return name == "relu" ? kiln::relu(x) : kiln::tanh(x);
    });
    kiln::tensor x = kiln::constant({-1.f, 1.f});
    require_same(act(x, std::string("relu")), kiln::constant({0.f, 1.f}));
    std::string same_text = "relu";  // another object with the same text
    require_same(act(x, same_text), kiln::constant({0.f, 1.f}));
    CHECK(traces == 1);
    require_same(act(x, std::string("tanh")), kiln::tanh(x));
    CHECK(traces == 2);
  }
  SECTION("enums by value") {
    int traces = 0;
    kiln::function act([&](const kiln::tensor& x, activation a) {
      ++traces;
      return a == activation::relu ? kiln::relu(x) : kiln::tanh(x);
    });
    kiln::tensor x = kiln::constant({-1.f, 1.f});
    require_same(act(x, activation::relu), kiln::constant({0.f, 1.f}));
    require_same(act(x, activation::relu), kiln::constant({0.f, 1.f}));
    CHECK(traces == 1);
    require_same(act(x, activation::tanh), kiln::tanh(x));
    CHECK(traces == 2);
  }
  SECTION("a C++ argument alone: the seeds' a_function_with_python_side_effect(2), (3)") {
    int traces = 0;
    kiln::function f([&](int x) {
      ++traces;
      return kiln::constant(x) * x + kiln::constant(2);
    });
    require_same(f(2), kiln::constant(6));
    require_same(f(3), kiln::constant(11));
    require_same(f(2), kiln::constant(6));
    CHECK(traces == 2);
  }
}

TEST_CASE("a string literal is keyed by its text, like a std::string", "[trace][function]") {
  int traces = 0;
  kiln::function act([&](const kiln::tensor& x, const std::string& name) {
    ++traces;
    return name == "relu" ? kiln::relu(x) : kiln::tanh(x);
  });
  kiln::tensor x = kiln::constant({-1.f, 1.f});
  act(x, "relu");
  act(x, std::string("relu"));  // the same text: the same signature
  CHECK(traces == 1);
  char name[8] = "relu";
  act(x, name);
  CHECK(traces == 1);
  name[0] = 't', name[1] = 'a', name[2] = 'n', name[3] = 'h';  // same array, new text
  require_same(act(x, name), kiln::tanh(x));
  CHECK(traces == 2);
}

TEST_CASE("tuples, pairs, arrays, vectors and aggregates are flattened to their leaves", "[trace][function]") {
  SECTION("a tuple of a tensor and an int") {
    int traces = 0;
    bool symbolic = false;
    kiln::function f([&](const std::tuple<kiln::tensor, int>& t) {
      ++traces;
      symbolic = std::get<0>(t).is_symbolic();
      return std::get<0>(t) * std::get<1>(t);
    });
    require_same(f(std::tuple{kiln::constant(2), 3}), kiln::constant(6));
    CHECK(symbolic);
    require_same(f(std::tuple{kiln::constant(5), 3}), kiln::constant(15));  // new tensor value: same trace
    CHECK(traces == 1);
    require_same(f(std::tuple{kiln::constant(5), 4}), kiln::constant(20));  // new int: retrace
    CHECK(traces == 2);
    f(std::tuple{kiln::constant({1, 2}), 4});  // new shape: retrace
    CHECK(traces == 3);
  }
  SECTION("a pair and a std::array") {
    int traces = 0;
    kiln::function f(
        [&](const std::pair<kiln::tensor, float>& p, const std::array<kiln::tensor, 2>& a) {
          ++traces;
          return p.first * p.second + a[0] - a[1];
        },
        {.arg_names = {"p", "a"}});
    require_same(f(std::pair{kiln::constant(1.f), 2.f}, std::array{kiln::constant(3.f), kiln::constant(1.f)}),
                 kiln::constant(4.f));
    require_same(f(std::pair{kiln::constant(2.f), 2.f}, std::array{kiln::constant(0.f), kiln::constant(1.f)}),
                 kiln::constant(3.f));
    CHECK(traces == 1);
    f(std::pair{kiln::constant(2.f), 3.f}, std::array{kiln::constant(0.f), kiln::constant(1.f)});
    CHECK(traces == 2);
    // Every tensor leaf is an input of its own, named after its argument.
    auto inputs = f.get_concrete_function(std::pair{kiln::constant(1.f), 2.f},
                                          std::array{kiln::constant(3.f), kiln::constant(1.f)})
                      .structured_input_signature();
    REQUIRE(inputs.size() == 3);
    CHECK(inputs[0].name == "p");
    CHECK(inputs[1].name == "a");
    CHECK(inputs[2].name == "a_1");
  }
  SECTION("a vector of tensors: its length is part of the signature") {
    int traces = 0;
    kiln::function sum([&](const std::vector<kiln::tensor>& xs) {
      ++traces;
      kiln::tensor total = xs[0];
      for (std::size_t i = 1; i < xs.size(); ++i) total = total + xs[i];
      return total;
    });
    require_same(sum(std::vector{kiln::constant(1), kiln::constant(2)}), kiln::constant(3));
    require_same(sum(std::vector{kiln::constant(5), kiln::constant(6)}), kiln::constant(11));
    CHECK(traces == 1);
    require_same(sum(std::vector{kiln::constant(1), kiln::constant(2), kiln::constant(3)}), kiln::constant(6));
    CHECK(traces == 2);
  }
  SECTION("a vector of C++ values is keyed by its values") {
    int traces = 0;
    kiln::function f([&](const kiln::tensor& x, const std::vector<int>& steps) {
      ++traces;
      kiln::tensor y = x;
      for (int s : steps) y = y + s;
      return y;
    });
    kiln::tensor x = kiln::constant(0);
    require_same(f(x, std::vector{1, 2}), kiln::constant(3));
    require_same(f(x, std::vector{1, 2}), kiln::constant(3));
    CHECK(traces == 1);
    require_same(f(x, std::vector{2, 1}), kiln::constant(3));
    CHECK(traces == 2);
    require_same(f(x, std::vector{1, 2, 3}), kiln::constant(6));
    CHECK(traces == 3);
  }
  SECTION("nested structures") {
    int traces = 0;
    kiln::function f([&](const std::vector<std::tuple<kiln::tensor, int>>& terms) {
      ++traces;
      kiln::tensor total = kiln::constant(0);
      for (const auto& [t, k] : terms) total = total + t * k;
      return total;
    });
    using term = std::tuple<kiln::tensor, int>;
    require_same(f(std::vector<term>{{kiln::constant(1), 2}, {kiln::constant(3), 4}}), kiln::constant(14));
    require_same(f(std::vector<term>{{kiln::constant(2), 2}, {kiln::constant(1), 4}}), kiln::constant(8));
    CHECK(traces == 1);
    require_same(f(std::vector<term>{{kiln::constant(2), 2}, {kiln::constant(1), 5}}), kiln::constant(9));
    CHECK(traces == 2);
  }
  SECTION("an aggregate, field by field") {
    int traces = 0;
    bool symbolic = false;
    kiln::function f([&](const scaled_input& in) {
      ++traces;
      symbolic = in.x.is_symbolic();
      return in.x * in.scale;
    });
    require_same(f(scaled_input{kiln::constant(2.f), 3}), kiln::constant(6.f));
    CHECK(symbolic);
    require_same(f(scaled_input{kiln::constant(4.f), 3}), kiln::constant(12.f));
    CHECK(traces == 1);
    require_same(f(scaled_input{kiln::constant(4.f), 5}), kiln::constant(20.f));
    CHECK(traces == 2);
  }
}

TEST_CASE("other objects are keyed by their address", "[trace][function]") {
  int traces = 0;
  kiln::function evaluate([&](const simple_model& model, const kiln::tensor& x) {
    ++traces;
    return model.weight * x + model.bias;
  });
  simple_model model;
  kiln::tensor x = kiln::constant(10.f);
  require_same(evaluate(model, x), kiln::constant(20.f));
  // The seeds' "Adding bias!": a plain member is read while tracing only, so the
  // same object keeps its trace and the old bias.
  model.bias += 5.f;
  require_same(evaluate(model, x), kiln::constant(20.f));
  CHECK(traces == 1);
  // Another object is another signature, traced with its own members.
  simple_model other;
  other.bias = 5.f;
  require_same(evaluate(other, x), kiln::constant(25.f));
  CHECK(traces == 2);
  // A new function traces the mutated object afresh: the seeds' evaluate_with_bias.
  kiln::function evaluate_again([](const simple_model& m, const kiln::tensor& v) { return m.weight * v + m.bias; });
  kiln::concrete_function with_bias = evaluate_again.get_concrete_function(model, x);
  require_same(with_bias(x), kiln::constant(25.f));
}

TEST_CASE("separate function objects never share traces", "[trace][function]") {
  int traces = 0;
  auto body = [&](const kiln::tensor& x) {
    ++traces;
    return x * 2;
  };
  kiln::function first(body);
  kiln::function second(body);
  first(kiln::constant(1));
  second(kiln::constant(1));
  CHECK(traces == 2);
  first(kiln::constant(2));
  second(kiln::constant(2));
  CHECK(traces == 2);
  CHECK(first.tracing_count() == 1);
  CHECK(second.tracing_count() == 1);
}

TEST_CASE("input_signature: one trace, and None dims accept any size", "[trace][function]") {
  int traces = 0;
  std::string seen;
  kiln::function g(
      [&](const kiln::tensor& x) {
        ++traces;
        std::ostringstream os;
        os << x;
        seen = os.str();
        return x;
      },
      {.name = "g",
       .arg_names = {"x"},
       .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({kiln::none}, kiln::int32)}});
  require_same(g(kiln::constant({1, 2, 3})), kiln::constant({1, 2, 3}));
  require_same(g(kiln::constant({1, 2, 3, 4, 5})), kiln::constant({1, 2, 3, 4, 5}));
  require_same(g(kiln::constant(std::vector<int>{}, kiln::shape{0})), kiln::constant(std::vector<int>{}, kiln::shape{0}));
  CHECK(traces == 1);
  CHECK(seen == "Tensor(\"x:0\", shape=(None,), dtype=int32)");
  // A spec the signature accepts gives the same trace.
  kiln::concrete_function cf = g.get_concrete_function(kiln::tensor_spec({kiln::none}, kiln::int32));
  require_same(cf(kiln::constant({7, 8})), kiln::constant({7, 8}));
  CHECK(g.tracing_count() == 1);
  CHECK(g.pretty_printed_concrete_signatures().find("x: int32 Tensor, shape=(None,)") != std::string::npos);
}

TEST_CASE("input_signature rejects other calls with a value_error naming inputs and signature", "[trace][function]") {
  int traces = 0;
  kiln::function next_collatz(
      [&](const kiln::tensor& x) {
        ++traces;
        return kiln::where(x % 2 == 0, kiln::floordiv(x, 2), 3 * x + 1);
      },
      {.name = "next_collatz",
       .arg_names = {"x"},
       .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({kiln::none}, kiln::int32)}});
  require_same(next_collatz(kiln::constant({1, 2})), kiln::constant({4, 1}));
  const std::string signature = "TensorSpec(shape=(None,), dtype=tf.int32, name=None)";
  require_throws<kiln::value_error>([&] { return next_collatz(kiln::constant({{1, 2}, {3, 4}})); },
                                    {"input_signature", "inputs", "shape=(2, 2), dtype=int32", signature});
  require_throws<kiln::value_error>([&] { return next_collatz(kiln::constant({1.f, 2.f})); },
                                    {"input_signature", "[1. 2.]", "dtype=float32", signature});
  require_throws<kiln::value_error>([&] { return next_collatz(kiln::constant(1)); },
                                    {"input_signature", "shape=()", signature});
  require_throws<kiln::value_error>(
      [&] { return next_collatz.get_concrete_function(kiln::tensor_spec({kiln::none, 2}, kiln::int32)); },
      {"input_signature", signature});
  CHECK(traces == 1);
  CHECK(next_collatz.tracing_count() == 1);
}

TEST_CASE("reduce_retracing: sequences of different lengths trace at most twice", "[trace][function]") {
  int traces = 0;
  auto body = [&](const kiln::tensor& x) {
    ++traces;
    return x * 2;
  };
  kiln::function relaxed(body, {.name = "relaxed", .arg_names = {"x"}, .reduce_retracing = true});
  for (int n = 1; n <= 6; ++n) {
    std::vector<int> values(std::size_t(n), 0), doubled(std::size_t(n), 0);
    for (int i = 0; i < n; ++i) values[std::size_t(i)] = i, doubled[std::size_t(i)] = 2 * i;
    require_same(relaxed(kiln::constant(values)), kiln::constant(doubled));
  }
  CHECK(traces <= 2);
  CHECK(relaxed.tracing_count() <= 2);
  CHECK(relaxed.pretty_printed_concrete_signatures().find("shape=(None,)") != std::string::npos);
  // A new dtype still needs its own trace.
  const int before = relaxed.tracing_count();
  relaxed(kiln::constant({1.f, 2.f}));
  CHECK(relaxed.tracing_count() == before + 1);

  // Without the option, each length is a trace of its own.
  traces = 0;
  kiln::function exact(body);
  for (int n = 1; n <= 6; ++n) exact(kiln::zeros({n}, kiln::int32));
  CHECK(traces == 6);
}

TEST_CASE("a function may return tuples, pairs, arrays and vectors of tensors", "[trace][function]") {
  kiln::tensor x = kiln::constant({1, 2});
  SECTION("tuple") {
    kiln::function f([](const kiln::tensor& a) { return std::tuple{a + 1, a * 2}; });
    for (int call = 0; call < 2; ++call) {  // the trace, then the cached graph
      auto [plus, times] = f(x);
      STATIC_REQUIRE(std::is_same_v<decltype(f(x)), std::tuple<kiln::tensor, kiln::tensor>>);
      require_same(plus, kiln::constant({2, 3}));
      require_same(times, kiln::constant({2, 4}));
    }
    CHECK(f.tracing_count() == 1);
  }
  SECTION("pair") {
    kiln::function f([](const kiln::tensor& a) { return std::pair{a - 1, a}; });
    for (int call = 0; call < 2; ++call) {
      std::pair<kiln::tensor, kiln::tensor> r = f(x);
      require_same(r.first, kiln::constant({0, 1}));
      require_same(r.second, x);
    }
  }
  SECTION("array") {
    kiln::function f([](const kiln::tensor& a) { return std::array{a, -a, a * a}; });
    for (int call = 0; call < 2; ++call) {
      std::array<kiln::tensor, 3> r = f(x);
      require_same(r[0], x);
      require_same(r[1], kiln::constant({-1, -2}));
      require_same(r[2], kiln::constant({1, 4}));
    }
  }
  SECTION("vector") {
    kiln::function f([](const kiln::tensor& a, int n) {
      std::vector<kiln::tensor> powers{a};
      for (int i = 1; i < n; ++i) powers.push_back(powers.back() * a);
      return powers;
    });
    for (int call = 0; call < 2; ++call) {
      std::vector<kiln::tensor> r = f(x, 3);
      REQUIRE(r.size() == 3);
      require_same(r[2], kiln::constant({1, 8}));
    }
  }
  SECTION("the same tensor twice, and an argument returned unchanged") {
    kiln::function f([](const kiln::tensor& a, const kiln::tensor& b) { return std::tuple{b, a + b, b}; });
    for (int call = 0; call < 2; ++call) {
      auto [first, sum, last] = f(x, kiln::constant({10, 20}));
      require_same(first, kiln::constant({10, 20}));
      require_same(sum, kiln::constant({11, 22}));
      require_same(last, kiln::constant({10, 20}));
    }
  }
}

TEST_CASE("C++ values a function returns become constant tensors", "[trace][function]") {
  kiln::function f([](const kiln::tensor& a, int n) { return std::tuple{a * n, n, 0.5, 2.5f, n > 1}; });
  for (int call = 0; call < 2; ++call) {
    auto [scaled, n, half, f32, flag] = f(kiln::constant(3), 2);
    STATIC_REQUIRE(std::is_same_v<decltype(n), kiln::tensor>);
    require_same(scaled, kiln::constant(6));
    require_same(n, kiln::constant(2));
    require_same(half, kiln::constant(0.5));
    require_same(f32, kiln::constant(2.5f));
    require_same(flag, kiln::constant(true));
  }
  kiln::function seven([] { return 7; });
  require_same(seven(), kiln::constant(7));
  require_same(seven(), kiln::constant(7));
  CHECK(seven.tracing_count() == 1);
  // An eager tensor made while tracing is captured as a constant of the graph.
  kiln::function made([](const kiln::tensor& a) { return std::pair{a, kiln::constant({4.f, 5.f})}; });
  for (int call = 0; call < 2; ++call) require_same(made(kiln::constant(1)).second, kiln::constant({4.f, 5.f}));
}

TEST_CASE("a function may return nothing", "[trace][function]") {
  int traces = 0;
  kiln::function f([&](const kiln::tensor& a) {
    ++traces;
    (void)(a * 2);
  });
  STATIC_REQUIRE(std::is_void_v<decltype(f(kiln::constant(1)))>);
  f(kiln::constant(1));
  f(kiln::constant(2));
  CHECK(traces == 1);
  CHECK(f.tracing_count() == 1);
}

TEST_CASE("run_functions_eagerly calls the callable on every call with eager tensors", "[trace][function]") {
  int calls = 0;
  int symbolic_calls = 0;
  kiln::function get_mse([&](const kiln::tensor& y_true, const kiln::tensor& y_pred) {
    ++calls;
    symbolic_calls += y_true.is_symbolic();
    return std::tuple{kiln::reduce_mean(kiln::pow(y_true - y_pred, 2)), 1};
  });
  kiln::tensor y_true = kiln::constant({1, 6, 8, 2, 3}), y_pred = kiln::constant({9, 2, 4, 6, 6});
  {
    functions_run_eagerly_scope eagerly;
    CHECK(kiln::config::functions_run_eagerly());
    for (int i = 0; i < 3; ++i) {
      auto [mse, one] = get_mse(y_true, y_pred);
      require_same(mse, kiln::constant(24));
      require_same(one, kiln::constant(1));
      CHECK_FALSE(mse.is_symbolic());
    }
    CHECK(calls == 3);
    CHECK(symbolic_calls == 0);
    CHECK(get_mse.tracing_count() == 0);
  }
  CHECK_FALSE(kiln::config::functions_run_eagerly());
  for (int i = 0; i < 3; ++i) require_same(std::get<0>(get_mse(y_true, y_pred)), kiln::constant(24));
  CHECK(calls == 4);
  CHECK(symbolic_calls == 1);
  CHECK(get_mse.tracing_count() == 1);
}

TEST_CASE("calls from several threads are safe and trace each signature once", "[trace][function][threads]") {
  std::atomic<int> traces{0};
  kiln::function f([&](const kiln::tensor& x) {
    ++traces;
    return x * 3 + 1;
  });
  const std::vector<kiln::tensor> inputs{kiln::constant({1.f, 2.f}), kiln::constant({1, 2}), kiln::constant({1.f, 2.f, 3.f})};
  const std::vector<kiln::tensor> expected{kiln::constant({4.f, 7.f}), kiln::constant({4, 7}),
                                           kiln::constant({4.f, 7.f, 10.f})};
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        std::size_t k = std::size_t(i + t) % inputs.size();
        try {
          kiln::tensor y = f(inputs[k]);
          bool same = y.dtype() == expected[k].dtype() && y.shape() == expected[k].shape();
          if (same && y.dtype() == kiln::float32) same = y.to_vector<float>() == expected[k].to_vector<float>();
          if (same && y.dtype() == kiln::int32) same = y.to_vector<std::int32_t>() == expected[k].to_vector<std::int32_t>();
          wrong += !same;
        } catch (...) {
          ++failed;
        }
      }
    });
  for (std::thread& t : threads) t.join();
  CHECK(failed.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(traces.load() == 3);
  CHECK(f.tracing_count() == 3);
}

TEST_CASE("input_signature rejects a C++ value where a tensor is expected", "[trace][function]") {
  kiln::function f([](const kiln::tensor& x, int n) { return x * n; },
                   {.name = "f", .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({}, kiln::int32)}});
  require_throws<kiln::value_error>([&] { return f(kiln::constant(1), 2); },
                                    {"input_signature", "TensorSpec(shape=(), dtype=tf.int32, name=None)"});
  kiln::function two([](const kiln::tensor& x, const kiln::tensor& y) { return x + y; },
                     {.name = "two", .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({}, kiln::int32)}});
  require_throws<kiln::value_error>([&] { return two(kiln::constant(1), kiln::constant(2)); }, {"input_signature"});
  CHECK(f.tracing_count() == 0);
  CHECK(two.tracing_count() == 0);
}

TEST_CASE("input_signature does not give one object's trace to another object", "[trace][function]") {
  // An object keyed by address does not fit a tensor_spec: either the call is rejected
  // or each object gets its own trace, never the first object's members.
  kiln::function evaluate([](const simple_model& m, const kiln::tensor& x) { return m.weight * x + m.bias; },
                          {.name = "evaluate",
                           .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({}, kiln::float32)}});
  simple_model first, second;
  second.bias = 5.f;
  kiln::tensor x = kiln::constant(10.f);
  try {
    require_same(evaluate(first, x), kiln::constant(20.f));
    require_same(evaluate(second, x), kiln::constant(25.f));
  } catch (const kiln::value_error&) {
    SUCCEED("rejected: an object does not fit the input signature");
  }
}

TEST_CASE("reduce_retracing keeps objects keyed by address apart", "[trace][function]") {
  kiln::function evaluate([](const simple_model& m, const kiln::tensor& x) { return m.weight * x + m.bias; },
                          {.name = "evaluate", .reduce_retracing = true});
  simple_model first, second;
  second.bias = 5.f;
  evaluate(first, kiln::constant({1.f}));
  evaluate(first, kiln::constant({1.f, 2.f}));  // relaxes the dim to None
  require_same(evaluate(second, kiln::constant({1.f, 2.f, 3.f})), kiln::constant({7.f, 9.f, 11.f}));
}

TEST_CASE("reduce_retracing keeps differently nested structures apart", "[trace][function]") {
  using nested = std::vector<std::vector<kiln::tensor>>;
  kiln::function first_group_sum(
      [](const nested& groups) {
        kiln::tensor total = groups[0][0];
        for (std::size_t i = 1; i < groups[0].size(); ++i) total = total + groups[0][i];
        return total;
      },
      {.name = "first_group_sum", .reduce_retracing = true});
  auto v = [](float value, std::int64_t n) { return kiln::fill({n}, value); };
  first_group_sum(nested{{v(1, 1)}, {v(2, 1), v(3, 1)}});
  first_group_sum(nested{{v(1, 2)}, {v(2, 2), v(3, 2)}});  // relaxes the dims to None
  // Same leaves, another nesting: the first group now holds two tensors.
  require_same(first_group_sum(nested{{v(1, 3), v(2, 3)}, {v(3, 3)}}), v(3, 3));
}

TEST_CASE("a callable may take an object by non-const reference; it is keyed by address", "[trace][function]") {
  struct model {
    kiln::variable w{kiln::constant(2.f)};
    int traces = 0;
  };
  model a, b;
  kiln::function f([](auto& m, auto x) {
    ++m.traces;  // changes the caller's object, not a copy
    return m.w * x;
  });
  require_same(f(a, kiln::constant(3.f)), kiln::constant(6.f));
  require_same(f(a, kiln::constant(4.f)), kiln::constant(8.f));
  CHECK(a.traces == 1);
  a.w.assign(kiln::constant(10.f));
  require_same(f(a, kiln::constant(1.f)), kiln::constant(10.f));
  require_same(f(b, kiln::constant(1.f)), kiln::constant(2.f));  // another address, another trace
  CHECK(b.traces == 1);
  CHECK(f.tracing_count() == 2);
  CHECK(f.get_concrete_function(a, kiln::constant(1.f)).graph().nodes().size() > 0);
  CHECK(a.traces == 1);
  {
    functions_run_eagerly_scope eager;
    require_same(f(a, kiln::constant(1.f)), kiln::constant(10.f));
    CHECK(a.traces == 2);
  }
}

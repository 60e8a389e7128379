// Scalar programs (kiln/exec/scalar_program.hpp), how a loop whose condition and body
// work on one-element values runs without an executor: every elementwise op of the
// registry, on every dtype it takes but strings, and every cast between them, compiles
// to one; ops that refuse some integer operands check them there, with eager's error.

#include "../support/op_check.hpp"

#include <boost/mp11/algorithm.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace {

using kiln::detail::exec::scalar_program;

// A graph of `op` on scalar placeholders of dtype `t` (where's condition a bool).
template <class Op>
std::optional<kiln::graph> one_op_graph(const Op& op, kiln::dtype t) {
  std::vector<kiln::dtype> dtypes(std::size_t(Op::arity), t);
  if constexpr (kiln::ops::value_operand<Op> == 1) dtypes[0] = kiln::bool_;  // where's condition
  const kiln::dtype_result result = op.result_dtype(dtypes);
  if (!result.ok()) return std::nullopt;
  kiln::graph g;
  std::vector<int> inputs;
  for (std::size_t k = 0; k < dtypes.size(); ++k)
    inputs.push_back(g.add_placeholder("x" + std::to_string(k), dtypes[k], kiln::shape{}));
  g.add_output(g.add_op(kiln::ops::any_op(op), inputs, result.value, kiln::shape{}));
  return g;
}

// The while nodes of `f`'s trace for `args` (which `f` keeps, with its graph).
template <class F, class... Args>
std::vector<const kiln::detail::while_op*> loops_of(F& f, const Args&... args) {
  std::vector<const kiln::detail::while_op*> loops;
  const auto trace = f.get_concrete_function(args...);
  for (const kiln::node& n : trace.graph().nodes())
    if (n.op() == "while") {
      loops.push_back(n.special().template as<kiln::detail::while_op>());
      REQUIRE(loops.back() != nullptr);
    }
  return loops;
}

// Whether some loop variable of `loop` is a vector (a stack of the iterations' values).
bool has_vector_variable(const kiln::detail::while_op& loop) {
  const kiln::graph& body = loop.body_graph();
  for (int k = 0; k < loop.loop_variables(); ++k)
    if (body.node_at(body.arguments()[std::size_t(k)]).shape().rank() == 1) return true;
  return false;
}

}  // namespace

TEST_CASE("every elementwise op of every non-string dtype it takes runs as a scalar program", "[exec]") {
  int compiled = 0;
  boost::mp11::mp_for_each<kiln::ops::elementwise_ops>([&](auto op) {
    using Op = decltype(op);
    for (const kiln::dtype t : {kiln::bool_, kiln::int32, kiln::int64, kiln::float32, kiln::float64}) {
      std::vector<Op> variants{op};
      if constexpr (requires { op.to; })  // cast: to every dtype
        variants = {Op(kiln::bool_), Op(kiln::int32), Op(kiln::int64), Op(kiln::float32), Op(kiln::float64)};
      for (const Op& v : variants) {
        const std::optional<kiln::graph> g = one_op_graph(v, t);
        if (!g) continue;
        INFO(Op::name << " on " << kiln::name(t));
        CHECK(scalar_program::compile(*g).has_value());
        ++compiled;
      }
    }
  });
  CHECK(compiled > 100);
}

TEST_CASE("a scalar loop with integer division and a cast runs as a scalar program, with eager's errors", "[exec]") {
  // The body of the issue that left the fast path: i + 1, s + cast(i % 7, int64).
  auto body = [](const kiln::tensor& n, const kiln::tensor& divisor) {
    auto [i, s] = kiln::while_loop([&](const kiln::tensor& i, const kiln::tensor&) { return i < n; },
                                   [&](const kiln::tensor& i, const kiln::tensor& s) {
                                     return std::tuple{i + 1, s + kiln::cast(i % divisor, kiln::int64)};
                                   },
                                   kiln::constant(0), kiln::constant(std::int64_t(0)));
    return s;
  };
  kiln::function f(body, {.name = "mod_sum"});
  std::int64_t expected = 0;
  for (int i = 0; i < 1000; ++i) expected += i % 7;
  CHECK(f(kiln::constant(1000), kiln::constant(7)).item<std::int64_t>() == expected);
  for (const auto* loop : loops_of(f, kiln::constant(1000), kiln::constant(7))) CHECK(loop->runs_as_scalar_program());
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return f(kiln::constant(3), kiln::constant(0)); },
                                                             {"in mod_sum", "floormod: integer division by zero"});
}

TEST_CASE("a loop that grows a tensor_array runs as a scalar program, writing the array in place", "[exec]") {
  // The body appends to a growing tensor_array, as a loop gradient's stacks do: pad_rows
  // then set_item, in place on an array of the program.
  auto squares = [](const kiln::tensor& n) {
    kiln::tensor_array out(kiln::float32, 0, {.dynamic_size = true});
    auto [i, all] = kiln::while_loop(
        [&](const kiln::tensor& i, const kiln::tensor_array&) { return i < n; },
        [](const kiln::tensor& i, const kiln::tensor_array& acc) {
          const kiln::tensor x = kiln::cast(i, kiln::float32);
          return std::tuple{i + 1, acc.write(i, x * x)};
        },
        kiln::constant(0), out);
    return all.stack();
  };
  kiln::function f(squares);
  for (const int n : {0, 1, 50, 1000}) {
    std::vector<float> expected;
    for (int i = 0; i < n; ++i) expected.push_back(float(i * i));
    INFO("n = " << n);
    CHECK(f(kiln::constant(n)).to_vector<float>() == expected);
  }
  const auto loops = loops_of(f, kiln::constant(50));
  REQUIRE(loops.size() == 1);
  CHECK(loops[0]->runs_as_scalar_program());
  // Called twice with the same array: the first call's result keeps its values when
  // the second grows its own.
  const kiln::tensor first = f(kiln::constant(3)), second = f(kiln::constant(4));
  CHECK(first.to_vector<float>() == std::vector<float>{0, 1, 4});
  CHECK(second.to_vector<float>() == std::vector<float>{0, 1, 4, 9});

  // What a condition that compiled to a program does not read may be of any shape.
  kiln::function counter_only([](const kiln::tensor& i, const kiln::tensor&) { return i < 3; },
                              {.input_signature = std::vector<kiln::tensor_spec>{{{}, kiln::int32}, {{kiln::none}, kiln::float32}}});
  const std::optional<scalar_program> program = scalar_program::compile(
      counter_only.get_concrete_function(kiln::tensor_spec({}, kiln::int32), kiln::tensor_spec({kiln::none}, kiln::float32))
          .graph());
  REQUIRE(program.has_value());
  CHECK(program->reads(0));
  CHECK_FALSE(program->reads(1));
}

TEST_CASE("a scalar program reads and writes arrays with the executor's values and errors", "[exec]") {
  // A captured vector read at the counter (gather), and a fixed-size tensor_array
  // written at it (set_item): run as scalar programs, and by the executor when
  // check_numerics is on, with the same results, and the same errors past the end.
  auto sum_to = [](int capacity) {
    return [capacity](const kiln::tensor& values, const kiln::tensor& n) {
      kiln::tensor_array doubled(kiln::float32, capacity);
      auto [i, s, out] = kiln::while_loop(
          [&](const kiln::tensor& i, const kiln::tensor&, const kiln::tensor_array&) { return i < n; },
          [&](const kiln::tensor& i, const kiln::tensor& s, const kiln::tensor_array& acc) {
            const kiln::tensor v = values[i];
            return std::tuple{i + 1, s + v, acc.write(i, v * 2.f)};
          },
          kiln::constant(0), kiln::constant(0.f), doubled);
      return std::vector<kiln::tensor>{s, out.stack()};
    };
  };
  kiln::function f(sum_to(5), {.name = "sum_to"}), short_array(sum_to(4), {.name = "short_array"});
  const std::vector<float> values{1.5f, -2.f, 4.f, 8.25f, 0.5f};
  const kiln::tensor x = kiln::constant(values);
  const auto loops = loops_of(f, x, kiln::constant(5));
  REQUIRE(loops.size() == 1);
  CHECK(loops[0]->runs_as_scalar_program());
  // check_numerics on, until the end of a scope (an assertion that throws included).
  struct numerics_checked {
    numerics_checked() { kiln::debugging::enable_check_numerics(); }
    ~numerics_checked() { kiln::debugging::disable_check_numerics(); }
  };
  for (const bool executor : {false, true}) {
    INFO((executor ? "the executor" : "scalar programs"));
    std::optional<numerics_checked> checked;
    if (executor) checked.emplace();
    const std::vector<kiln::tensor> out = f(x, kiln::constant(4));
    float sum = 0;
    std::vector<float> doubled(5, 0.f);
    for (std::size_t i = 0; i < 4; ++i) {
      sum += values[i];
      doubled[i] = values[i] * 2.f;
    }
    CHECK(out[0].item<float>() == sum);
    CHECK(out[1].to_vector<float>() == doubled);
    kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return f(x, kiln::constant(6)); },
                                                               {"in sum_to", "gather: indices", "= 5 is not in [0, 5)"});
    kiln::testing::require_throws<kiln::invalid_argument_error>(
        [&] { return short_array(x, kiln::constant(5)); }, {"in short_array", "set_item: index 4 is not in [0, 4)"});
  }
}

TEST_CASE("a loop's gradient stacks only the values its steps read, and both its loops run as scalar programs", "[exec]") {
  // s * 0.5 + 1: each step's gradient is 0.5 whatever s was, so nothing is stacked.
  kiln::function linear([](const kiln::tensor& x, const kiln::tensor& n) {
    kiln::gradient_tape tape;
    tape.watch(x);
    const kiln::tensor y =
        kiln::for_range(n, [](const kiln::tensor&, const kiln::tensor& s) { return s * 0.5f + 1.f; }, x);
    return tape.gradient(y, x);
  });
  const kiln::tensor x = kiln::constant(3.f);
  for (const int n : {0, 1, 10}) CHECK(linear(x, kiln::constant(n)).item<float>() == std::ldexp(1.f, -n));
  auto loops = loops_of(linear, x, kiln::constant(10));
  CHECK(loops.size() >= 2);
  for (const auto* loop : loops) {
    CHECK(loop->runs_as_scalar_program());
    CHECK_FALSE(has_vector_variable(*loop));
  }

  // s * s / 2: each step's gradient is the s it began with, which the walk back reads
  // from the stack the recomputed loop grows.
  kiln::function square([](const kiln::tensor& x, const kiln::tensor& n) {
    kiln::gradient_tape tape;
    tape.watch(x);
    const kiln::tensor y =
        kiln::for_range(n, [](const kiln::tensor&, const kiln::tensor& s) { return s * s * 0.5f; }, x);
    return tape.gradient(y, x);
  });
  double s = 1.25, expected = 1;  // the product of the values each step began with
  for (int i = 0; i < 6; ++i) {
    expected *= s;
    s = s * s * 0.5;
  }
  CHECK(std::fabs(square(kiln::constant(1.25f), kiln::constant(6)).item<float>() - expected) < 1e-5 * expected);
  loops = loops_of(square, kiln::constant(1.25f), kiln::constant(6));
  int stacking = 0;
  for (const auto* loop : loops) {
    CHECK(loop->runs_as_scalar_program());
    stacking += has_vector_variable(*loop);
  }
  CHECK(stacking == 1);
}

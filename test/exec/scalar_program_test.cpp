// Scalar programs (kiln/exec/scalar_program.hpp), how a loop whose condition and body
// work on one-element values runs without an executor: every elementwise op of the
// registry, on every dtype it takes but strings, and every cast between them, compiles
// to one; ops that refuse some integer operands check them there, with eager's error.

#include "../support/op_check.hpp"

#include <boost/mp11/algorithm.hpp>

#include <cstdint>
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
  const kiln::graph& g = f.get_concrete_function(kiln::constant(1000), kiln::constant(7)).graph();
  for (const kiln::node& n : g.nodes())
    if (n.op() == "while") {
      const auto* loop = n.special().as<kiln::detail::while_op>();
      REQUIRE(loop != nullptr);
      CHECK(loop->runs_as_scalar_program());
    }
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return f(kiln::constant(3), kiln::constant(0)); },
                                                             {"in mod_sum", "floormod: integer division by zero"});
}

TEST_CASE("a loop condition that reads only scalars runs as a scalar program while the body grows an array", "[exec]") {
  // The body appends to a growing tensor_array (a loop gradient's stacks do): the body
  // needs the executor, the condition, given the array but reading only the counter,
  // does not.
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
  const kiln::tensor n = kiln::constant(50);
  std::vector<float> expected;
  for (int i = 0; i < 50; ++i) expected.push_back(float(i * i));
  CHECK(f(n).to_vector<float>() == expected);
  int loops = 0;
  for (const kiln::node& node : f.get_concrete_function(n).graph().nodes())
    if (node.op() == "while") {
      const auto* loop = node.special().as<kiln::detail::while_op>();
      REQUIRE(loop != nullptr);
      CHECK_FALSE(loop->runs_as_scalar_program());
      CHECK(loop->condition_runs_as_scalar_program());
      ++loops;
    }
  CHECK(loops == 1);
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

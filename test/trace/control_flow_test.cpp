// kiln::cond, kiln::while_loop, kiln::for_range and kiln::break_if: eagerly and in
// graphs (which must agree), the nodes they leave, the trace-time errors, captures
// from the enclosing trace, and effects inside branches and bodies.

#include <sstream>

#include "trace_check.hpp"

using namespace kiln;
using kiln::testing::count_ops;
using kiln::testing::ints;
using kiln::testing::require_graph_matches_eager;
using kiln::testing::require_same;
using kiln::testing::require_throws;

TEST_CASE("cond picks a branch eagerly and in a graph, with a cond node") {
  auto fn = [](const tensor& x) {
    return std::vector<tensor>{kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x * 2.f; }, [&] { return -x; })};
  };
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant({1.f, 2.f}));
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant({-1.f, -2.f}));

  function f(fn, {.name = "f"});
  auto g = f.get_concrete_function(kiln::constant({1.f, 2.f})).graph();
  REQUIRE(count_ops(g, "cond") == 1);
  // Both branches were traced: the cond node shows both subgraphs.
  std::string dot = g.to_dot();
  REQUIRE(dot.find("subgraph cluster_") != std::string::npos);
  REQUIRE(dot.find("cond then") != std::string::npos);
  REQUIRE(dot.find("cond else") != std::string::npos);
}

TEST_CASE("a C++ if on a C++ value runs at trace time and leaves no cond node") {
  function f([](const tensor& x, bool training) { return training ? x * 2 : x; }, {.name = "f"});
  REQUIRE(ints(f(kiln::constant(3), true)) == std::vector<std::int32_t>{6});
  REQUIRE(count_ops(f.get_concrete_function(kiln::constant(3), true).graph(), "cond") == 0);
}

TEST_CASE("cond branches may return structures, nothing, or values captured from outer traces") {
  std::ostringstream out;
  config::set_print_stream(out);
  function f([](const tensor& x, const tensor& y) {
    auto [a, b] = kiln::cond(x > y, [&] { return std::tuple{x, y}; }, [&] { return std::tuple{y, x}; });
    kiln::cond(x > y, [&] { kiln::print("x is larger"); }, [&] { kiln::print("y is larger"); });
    // A cond inside a cond: the inner branch captures x through the outer one.
    tensor c = kiln::cond(x > 0, [&] { return kiln::cond(y > 0, [&] { return x + y; }, [&] { return x; }); },
                          [&] { return y; });
    return std::tuple{a, b, c};
  }, {.name = "f"});
  auto [a, b, c] = f(kiln::constant(1), kiln::constant(5));
  auto [a2, b2, c2] = f(kiln::constant(7), kiln::constant(-2));
  config::set_print_stream(std::cerr);
  REQUIRE(ints(a) == std::vector<std::int32_t>{5});
  REQUIRE(ints(b) == std::vector<std::int32_t>{1});
  REQUIRE(ints(c) == std::vector<std::int32_t>{6});
  REQUIRE(ints(a2) == std::vector<std::int32_t>{7});
  REQUIRE(ints(c2) == std::vector<std::int32_t>{7});
  REQUIRE(out.str() == "y is larger\nx is larger\n");
  REQUIRE(f.tracing_count() == 1);
}

TEST_CASE("cond branches that disagree raise value_error at trace time") {
  function shapes([](const tensor& x) { return kiln::cond(x[0] > 0, [&] { return x; }, [&] { return x[0]; }); },
                  {.name = "shapes"});
  require_throws<value_error>([&] { return shapes(kiln::constant({1, 2})); },
                              {"shapes", "cond", "int32 (2,)", "int32 ()"});
  function dtypes([](const tensor& x) { return kiln::cond(x > 0, [&] { return x; }, [&] { return kiln::cast(x, float32); }); },
                  {.name = "dtypes"});
  require_throws<value_error>([&] { return dtypes(kiln::constant(1)); }, {"cond", "int32 ()", "float32 ()"});
  function counts([](const tensor& x) {
    return kiln::cond(x > 0, [&] { return std::vector<tensor>{x, x}; }, [&] { return std::vector<tensor>{x}; });
  }, {.name = "counts"});
  require_throws<value_error>([&] { return counts(kiln::constant(1)); }, {"cond", "(int32 (), int32 ())", "(int32 ())"});
  function not_bool([](const tensor& x) { return kiln::cond(x, [&] { return x; }, [&] { return x; }); }, {.name = "nb"});
  require_throws<value_error>([&] { return not_bool(kiln::constant(1)); }, {"cond", "bool scalar", "int32 ()"});
}

TEST_CASE("while_loop runs eagerly and as one while node, tracing its body once") {
  int body_traces = 0;
  auto fn = [&](const tensor& x) {
    // The seeds' loop: while reduce_sum(x) > 1: x = tanh(x).
    tensor y = kiln::while_loop([](const tensor& v) { return kiln::reduce_sum(v) > 1.f; },
                                [&](const tensor& v) {
                                  ++body_traces;
                                  return kiln::tanh(v);
                                },
                                x);
    auto [i, total] = kiln::while_loop([](const tensor& i, const tensor&) { return i < 10; },
                                       [](const tensor& i, const tensor& t) { return std::tuple{i + 1, t + i}; },
                                       kiln::constant(0), kiln::constant(0));
    return std::vector<tensor>{y, i, total};
  };
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant({5.f, 5.f}));
  function f(fn, {.name = "f"});
  body_traces = 0;
  auto out = f(kiln::constant({5.f, 5.f}));
  f(kiln::constant({3.f, 3.f}));
  REQUIRE(body_traces == 1);
  REQUIRE(kiln::reduce_sum(out[0]).to_vector<float>()[0] <= 1.f);
  REQUIRE(ints(out[1]) == std::vector<std::int32_t>{10});
  REQUIRE(ints(out[2]) == std::vector<std::int32_t>{45});
  REQUIRE(count_ops(f.get_concrete_function(kiln::constant({5.f, 5.f})).graph(), "while") == 2);
}

TEST_CASE("loop variables that change dtype or shape raise value_error naming them") {
  function grows([](const tensor& x) {
    return kiln::while_loop([](const tensor& v) { return v[0] < 4; },
                            [](const tensor& v) { return kiln::concat({v, v}, 0); }, x);
  }, {.name = "grows"});
  require_throws<value_error>([&] { return grows(kiln::constant({1})); },
                              {"grows", "loop variable 0", "int32 (1,)", "int32 (2,)"});
  function retypes([](const tensor& i, const tensor& x) {
    return kiln::while_loop([](const tensor& k, const tensor&) { return k < 3; },
                            [](const tensor& k, const tensor& v) { return std::tuple{k + 1, kiln::cast(v, float32)}; }, i, x);
  }, {.name = "retypes"});
  require_throws<value_error>([&] { return retypes(kiln::constant(0), kiln::constant(1)); },
                              {"loop variable 1", "int32 ()", "float32 ()"});
}

TEST_CASE("for_range makes a while node whatever the limit; a C++ loop unrolls") {
  auto fn = [](const tensor& n) {
    tensor total = kiln::for_range(n, [](const tensor& i, const tensor& t) { return t + i; }, kiln::constant(0));
    tensor down = kiln::for_range(10, 0, -3, [](const tensor& i, const tensor& t) { return t * 100 + i; }, kiln::constant(0));
    tensor none = kiln::for_range(5, 5, 1, [](const tensor& i, const tensor& t) { return t + i; }, kiln::constant(-1));
    return std::vector<tensor>{total, down, none};
  };
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant(5));
  function f(fn, {.name = "f"});
  auto out = f(kiln::constant(5));
  REQUIRE(ints(out[0]) == std::vector<std::int32_t>{10});
  REQUIRE(ints(out[1]) == std::vector<std::int32_t>{10070401});  // 10, 7, 4, 1
  REQUIRE(ints(out[2]) == std::vector<std::int32_t>{-1});

  function with_int([](const tensor& x) { return kiln::for_range(3, [](const tensor&, const tensor& v) { return v * 2; }, x); },
                    {.name = "with_int"});
  REQUIRE(ints(with_int(kiln::constant(1))) == std::vector<std::int32_t>{8});
  REQUIRE(count_ops(with_int.get_concrete_function(kiln::constant(1)).graph(), "while") == 1);

  function unrolled([](const tensor& x) {
    tensor v = x;
    for (int i = 0; i < 3; ++i) v = v * 2;
    return v;
  }, {.name = "unrolled"});
  auto g = unrolled.get_concrete_function(kiln::constant(1)).graph();
  REQUIRE(count_ops(g, "while") == 0);
  REQUIRE(count_ops(g, "mul") == 3);

  function zero_step([](const tensor& d) { return kiln::for_range(0, 5, d, [](const tensor& i, const tensor& t) { return t + i; },
                                                                  kiln::constant(0)); },
                     {.name = "zero_step"});
  require_throws<invalid_argument_error>([&] { return zero_step(kiln::constant(0)); }, {"floordiv", "division by zero"});
}

TEST_CASE("for_range with no loop variables runs its effects every iteration") {
  std::ostringstream out;
  config::set_print_stream(out);
  function f([](const tensor& n) { kiln::for_range(n, [](const tensor& i) { kiln::print("step", i); }); }, {.name = "f"});
  f(kiln::constant(3));
  f(kiln::constant(1));
  config::set_print_stream(std::cerr);
  REQUIRE(out.str() == "step 0\nstep 1\nstep 2\nstep 0\n");
}

TEST_CASE("break_if stops with the values the iteration started with") {
  auto fn = [](const tensor& limit) {
    tensor stopped = kiln::while_loop([](const tensor& i) { return i < 100; },
                                      [&](const tensor& i) { return kiln::break_if(i >= limit, i + 1); }, kiln::constant(0));
    tensor summed = kiln::for_range(100, [&](const tensor& i, const tensor& t) { return kiln::break_if(t > limit, t + i); },
                                    kiln::constant(0));
    return std::vector<tensor>{stopped, summed};
  };
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant(7));
  function f(fn, {.name = "f"});
  auto out = f(kiln::constant(7));
  REQUIRE(ints(out[0]) == std::vector<std::int32_t>{7});
  REQUIRE(ints(out[1]) == std::vector<std::int32_t>{10});  // 0+1+2+3+4 = 10 > 7 stops
}

TEST_CASE("loop variables may be structures; bodies capture tensors and read variables") {
  variable step(kiln::constant(2));
  auto fn = [&](const tensor& x, const tensor& y) {
    auto [pair, count] = kiln::while_loop(
        [](const std::vector<tensor>&, const tensor& c) { return c < 3; },
        [&](const std::vector<tensor>& v, const tensor& c) { return std::tuple{std::vector<tensor>{v[0] + x, v[1] * y}, c + step}; },
        std::vector<tensor>{x, y}, kiln::constant(0));
    return std::vector<tensor>{pair[0], pair[1], count};
  };
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant(1), kiln::constant(3));
  function f(fn, {.name = "f"});
  auto out = f(kiln::constant(1), kiln::constant(3));
  REQUIRE(ints(out[0]) == std::vector<std::int32_t>{3});
  REQUIRE(ints(out[1]) == std::vector<std::int32_t>{27});
  REQUIRE(ints(out[2]) == std::vector<std::int32_t>{4});
  step.assign(kiln::constant(1));
  REQUIRE(ints(f(kiln::constant(1), kiln::constant(3))[2]) == std::vector<std::int32_t>{3});
}

TEST_CASE("maximum_iterations bounds a loop that would not end, eagerly and in a graph") {
  auto fn = [](const tensor& bound) {
    const loop_options five{.maximum_iterations = 5};
    // A condition that never fails: the bound alone stops the loop.
    tensor forever = kiln::while_loop([](const tensor&) { return kiln::constant(true); },
                                      [](const tensor& i) { return i * 2; }, five, kiln::constant(1));
    // A condition that fails first: the bound changes nothing.
    auto [i, total] = kiln::while_loop([&](const tensor& i, const tensor&) { return i < bound; },
                                       [](const tensor& i, const tensor& t) { return std::tuple{i + 1, t + i}; }, five,
                                       kiln::constant(0), kiln::constant(0));
    // With break_if, and a bound of zero that leaves the variables as they came.
    tensor broken = kiln::while_loop([](const tensor&) { return kiln::constant(true); },
                                     [](const tensor& i) { return kiln::break_if(i >= 100, i + 3); }, five, kiln::constant(0));
    tensor none_run = kiln::while_loop([](const tensor&) { return kiln::constant(true); },
                                       [](const tensor& i) { return i + 1; }, loop_options{.maximum_iterations = 0},
                                       kiln::constant(42));
    tensor counted = kiln::for_range(100, [](const tensor& k, const tensor& t) { return t + k; }, five, kiln::constant(0));
    return std::vector<tensor>{forever, i, total, broken, none_run, counted};
  };
  require_graph_matches_eager(fn, {.name = "f"}, kiln::constant(3));
  function f(fn, {.name = "f"});
  const std::vector<std::vector<std::int32_t>> expected{{32}, {3}, {3}, {15}, {42}, {10}};
  for (const auto& out : {f(kiln::constant(3)), fn(kiln::constant(3))})
    for (std::size_t k = 0; k < expected.size(); ++k) {
      INFO("output " << k);
      REQUIRE(ints(out[k]) == expected[k]);
    }
  require_throws<value_error>(
      [] {
        return kiln::while_loop([](const tensor&) { return kiln::constant(true); }, [](const tensor& i) { return i; },
                                loop_options{.maximum_iterations = -1}, kiln::constant(0));
      },
      {"maximum_iterations", "-1"});
}

TEST_CASE("a loop condition that is not a bool scalar raises value_error") {
  function f([](const tensor& x) { return kiln::while_loop([](const tensor& v) { return v; }, [](const tensor& v) { return v; }, x); },
             {.name = "f"});
  require_throws<value_error>([&] { return f(kiln::constant(1)); }, {"while_loop", "bool scalar", "int32 ()"});
  require_throws<invalid_argument_error>(
      [] { return kiln::while_loop([](const tensor& v) { return v; }, [](const tensor& v) { return v; }, kiln::constant(1)); },
      {"while_loop", "bool scalar", "int32 ()"});
}

TEST_CASE("a tensor_array is written, read and stacked eagerly, and rejects bad writes") {
  tensor_array squares(int32, 4);
  REQUIRE(squares.size() == 4);
  REQUIRE(squares.dtype() == int32);
  REQUIRE(squares.unwritten());
  tensor_array written = squares.write(1, kiln::constant(1)).write(kiln::constant(3), kiln::constant(9));
  REQUIRE(squares.unwritten());  // write returns a new array
  REQUIRE(ints(written.stack()) == std::vector<std::int32_t>{0, 1, 0, 9});  // unwritten elements are zeros
  REQUIRE(ints(written.read(3)) == std::vector<std::int32_t>{9});
  REQUIRE(written.read(kiln::constant(std::int64_t(0))).shape() == shape{});

  require_throws<value_error>([&] { return squares.stack(); }, {"tensor_array.stack", "size 4", "element shape is unknown"});
  require_throws<value_error>([&] { return squares.read(0); }, {"tensor_array.read"});
  require_throws<type_error>([&] { return written.write(0, kiln::constant(1.f)); }, {"tensor_array.write", "int32", "float32"});
  require_throws<value_error>([&] { return written.write(0, kiln::constant({1, 2})); }, {"tensor_array.write", "()", "(2,)"});
  // TensorFlow 2.12's eager TensorArray raises OutOfRangeError with this message; in
  // a graph its TensorList raises InvalidArgumentError when it runs, as set_item does.
  require_throws<out_of_range_error>([&] { return written.write(4, kiln::constant(1)); },
                                     {"tensor_array.write", "Tried to write to index 4 but array is not resizeable and size is: 4"});
  function write_at([](const tensor& i) { return tensor_array(int32, 2).write(i, kiln::constant(1)).stack(); },
                    {.name = "write_at"});
  REQUIRE(ints(write_at(kiln::constant(1))) == std::vector<std::int32_t>{0, 1});
  require_throws<invalid_argument_error>([&] { return write_at(kiln::constant(2)); }, {"in write_at", "set_item", "index 2"});
  require_throws<invalid_argument_error>([&] { return tensor_array(float32, -1); }, {"tensor_array", "-1"});
}

TEST_CASE("a tensor_array first written inside a loop gets its element shape from that write") {
  // Collects the running sum of the rows of x, as dynamic_rnn collects its states.
  auto running_sums = [](const tensor& x) {
    const std::int64_t steps = x.shape()[0];
    auto [state, sums] = kiln::for_range(
        steps,
        [&](const tensor& i, const tensor& s, const tensor_array& out) {
          tensor next = s + kiln::gather(x, i);
          return std::tuple{next, out.write(i, next)};
        },
        kiln::zeros({x.shape()[1]}), tensor_array(float32, steps));
    return std::vector<tensor>{sums.stack(), state};
  };
  const tensor x = kiln::constant({{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}});
  const std::vector<tensor> eager = running_sums(x);
  require_same(eager[0], kiln::constant({{1.f, 2.f}, {4.f, 6.f}, {9.f, 12.f}}));
  require_graph_matches_eager(running_sums, {.name = "running_sums"}, x);

  function f(running_sums, {.name = "running_sums"});
  REQUIRE(count_ops(f.get_concrete_function(x).graph(), "while") == 1);
  require_same(f(kiln::constant({{1.f, 2.f}}))[0], kiln::constant({{1.f, 2.f}}));
  // An array of size 0 is never written: it stacks to an empty tensor.
  REQUIRE(running_sums(kiln::zeros({0, 2}))[0].shape() == shape{0});
}

TEST_CASE("a tensor_array written before a loop, or returned by a function, keeps its elements") {
  auto reverse = [](const tensor& x) {
    const std::int64_t n = x.shape()[0];
    tensor_array out = tensor_array(float32, n).write(n - 1, kiln::gather(x, kiln::constant(0)));
    out = kiln::for_range(1, n, 1, [&](const tensor& i, const tensor_array& a) { return a.write(std::int32_t(n - 1) - i, kiln::gather(x, i)); },
                          out);
    return out;
  };
  const tensor x = kiln::constant({1.f, 2.f, 3.f});
  require_same(reverse(x).stack(), kiln::constant({3.f, 2.f, 1.f}));
  function f(reverse, {.name = "reverse"});
  const tensor_array traced = f(x);
  REQUIRE(traced.size() == 3);
  require_same(traced.stack(), kiln::constant({3.f, 2.f, 1.f}));
  require_same(traced.read(0), kiln::constant(3.f));
}

TEST_CASE("loops on scalars run as scalar programs with the executor's results") {
  // Newton's square root with a step counter: captures in the condition and the body,
  // a cast, a select, float division, an early exit.
  auto newton = [](const tensor& a, const tensor& limit) {
    auto [x, steps] = kiln::while_loop(
        [&](const tensor& x, const tensor& steps) {
          return kiln::logical_and(steps < limit, kiln::abs(x * x - a) > 1e-6f);
        },
        [&](const tensor& x, const tensor& steps) {
          tensor next = 0.5f * (x + a / x);
          next = kiln::where(next > 0.f, next, kiln::cast(steps + 1, float32));
          return kiln::break_if(next > 1e6f, next, steps + 1);
        },
        a, kiln::constant(0));
    return std::vector<tensor>{x, steps};
  };
  require_graph_matches_eager(newton, {.name = "newton"}, kiln::constant(2.f), kiln::constant(100));
  require_graph_matches_eager(newton, {.name = "newton"}, kiln::constant(1e4f), kiln::constant(3));
  const std::vector<tensor> root = function(newton, {.name = "newton"})(kiln::constant(9.f), kiln::constant(100));
  REQUIRE(std::fabs(root[0].item<float>() - 3.f) < 1e-6f);
  REQUIRE(ints(root[1])[0] > 2);

  // Integer division keeps its check (test/exec/scalar_program_test.cpp).
  auto halving = [](const tensor& x) {
    return std::vector<tensor>{
        kiln::while_loop([](const tensor& v) { return v > 1; }, [](const tensor& v) { return kiln::floordiv(v, 2); }, x)};
  };
  require_graph_matches_eager(halving, {.name = "halving"}, kiln::constant(std::int64_t(1) << 40));
  // So does a vector loop variable.
  auto vector_halving = [](const tensor& x) {
    return std::vector<tensor>{kiln::while_loop([](const tensor& v) { return kiln::reduce_max(v) > 1; },
                                                [](const tensor& v) { return kiln::floordiv(v, 2); }, x)};
  };
  require_graph_matches_eager(vector_halving, {.name = "halving"}, kiln::constant({7, 900}));
}

// Loop variables whose shape changes (kiln::loop_options' shape invariants) and
// tensor arrays sized by a tensor or growing with dynamic_size: eagerly and in
// graphs, against values worked out by hand, and the errors that name both sides.

#include "trace_check.hpp"

using namespace kiln;
using kiln::testing::require_graph_matches_eager;
using kiln::testing::require_same;
using kiln::testing::ints;
using kiln::testing::require_throws;

namespace {

/// The shape of the first result of the first `while` node of `g`.
shape loop_shape(const graph& g) {
  for (const node& n : g.nodes())
    if (n.op() == "while") return n.shape();
  FAIL("no while node");
  return {};
}

const loop_options any_length{.shape_invariants = {shape{none}}};
}  // namespace

TEST_CASE("a loop variable with a None dim in its shape invariant may grow, eagerly and in a graph") {
  // Row i is [i i]: the seeds' buggy_concat with a shape invariant.
  auto rows = [](const tensor& n) {
    return std::vector<tensor>{kiln::for_range(
        n,
        [](const tensor& i, const tensor& x) {
          return kiln::concat({x, kiln::reshape(kiln::cast(i, float32), {1, 1}) * kiln::ones({1, 2})}, 0);
        },
        loop_options{.shape_invariants = {shape{none, 2}}}, kiln::zeros({0, 2}))};
  };
  require_same(rows(kiln::constant(3))[0], kiln::constant({{0.f, 0.f}, {1.f, 1.f}, {2.f, 2.f}}));
  require_graph_matches_eager(rows, {.name = "rows"}, kiln::constant(3));

  function f(rows, {.name = "rows"});
  require_same(f(kiln::constant(2))[0], kiln::constant({{0.f, 0.f}, {1.f, 1.f}}));
  REQUIRE(f(kiln::constant(6))[0].shape() == shape{6, 2});
  REQUIRE(f(kiln::constant(0))[0].shape() == shape{0, 2});
  REQUIRE(f.tracing_count() == 1);
  // The loop's result has the invariant's shape.
  REQUIRE(f.get_concrete_function(kiln::constant(3)).structured_outputs()[0].shape == shape{none, 2});
}

TEST_CASE("a while loop may halve a vector's length each iteration") {
  // Pairwise sums until one element is left.
  auto halve = [](const tensor& x) {
    return std::vector<tensor>{kiln::while_loop([](const tensor& v) { return kiln::shape_of(v)[0] > 1; },
                                                [](const tensor& v) { return kiln::reduce_sum(kiln::reshape(v, {-1, 2}), 1); },
                                                any_length, x)};
  };
  const tensor x = kiln::constant({1, 2, 3, 4, 5, 6, 7, 8});  // [3 7 11 15], [10 26], [36]
  require_same(halve(x)[0], kiln::constant({36}));
  require_graph_matches_eager(halve, {.name = "halve"}, x);
  require_graph_matches_eager(halve, {.name = "halve"}, kiln::constant({5.f}));  // no iteration
  // An unknown rank accepts any shape.
  auto flatten_once = [](const tensor& x) {
    return std::vector<tensor>{kiln::while_loop([](const tensor& v) { return kiln::shape_of(kiln::shape_of(v))[0] > 1; },
                                                [](const tensor& v) { return kiln::reduce_sum(v, 0); },
                                                loop_options{.shape_invariants = {shape(unknown_rank)}}, x)};
  };
  require_graph_matches_eager(flatten_once, {.name = "flatten_once"}, kiln::constant({{1, 2}, {3, 4}}));
  require_same(flatten_once(kiln::constant({{1, 2}, {3, 4}}))[0], kiln::constant({4, 6}));
}

TEST_CASE("a one-element variable with a None dim runs on the executor with eager's results") {
  // Only elementwise ops, but the relaxed shape keeps the loop off the scalar path.
  auto doubled = [](const tensor& x) {
    return std::vector<tensor>{kiln::while_loop([](const tensor& v) { return kiln::reduce_sum(v) < 100; },
                                                [](const tensor& v) { return v * 2; }, any_length, x)};
  };
  require_same(doubled(kiln::constant({3}))[0], kiln::constant({192}));
  require_graph_matches_eager(doubled, {.name = "doubled"}, kiln::constant({3}));
  function f(doubled, {.name = "doubled"});
  REQUIRE(loop_shape(f.get_concrete_function(kiln::constant({3})).graph()) == shape{none});
}

TEST_CASE("shape invariants apply to the caller's variables, with break_if and beside kept shapes") {
  // [1] -> [1 2] -> [1 2 2 4], then the size test stops the loop.
  auto doubling = [](const tensor& x) {
    return std::vector<tensor>{kiln::while_loop(
        [](const tensor&) { return kiln::constant(true); },
        [](const tensor& v) { return kiln::break_if(kiln::shape_of(v)[0] >= 4, kiln::concat({v, v * 2}, 0)); }, any_length,
        x)};
  };
  require_same(doubling(kiln::constant({1}))[0], kiln::constant({1, 2, 2, 4}));
  require_graph_matches_eager(doubling, {.name = "doubling"}, kiln::constant({1}));
  require_graph_matches_eager(doubling, {.name = "doubling"}, kiln::constant({3, 1, 2}));  // [3 1 2 6 2 4]

  // for_range's counter is not counted: the second invariant is the second variable's.
  auto evens = [](const tensor& n) {
    auto [count, values] = kiln::for_range(
        0, n, 2,
        [](const tensor& i, const tensor& c, const tensor& v) { return std::tuple{c + 1, kiln::concat({v, kiln::reshape(i, {1})}, 0)}; },
        loop_options{.shape_invariants = {std::nullopt, shape{none}}}, kiln::constant(0), kiln::zeros({0}, int32));
    return std::vector<tensor>{count, values};
  };
  const std::vector<tensor> out = evens(kiln::constant(9));
  REQUIRE(ints(out[0]) == std::vector<std::int32_t>{5});
  REQUIRE(ints(out[1]) == std::vector<std::int32_t>{0, 2, 4, 6, 8});
  require_graph_matches_eager(evens, {.name = "evens"}, kiln::constant(9));
}

TEST_CASE("shape invariants that do not fit raise value_error naming the variable, its shape and the invariant") {
  const loop_options four_columns{.shape_invariants = {shape{none, 4}}};
  auto same = [](const tensor& v) { return v; };
  auto never = [](const tensor&) { return kiln::constant(false); };
  require_throws<value_error>([&] { return kiln::while_loop(never, same, four_columns, kiln::zeros({2, 3})); },
                              {"loop variable 0", "float32 (2, 3)", "shape invariant (None, 4)"});
  function enters([&](const tensor& x) { return kiln::while_loop(never, same, four_columns, x); }, {.name = "enters"});
  require_throws<value_error>([&] { return enters(kiln::zeros({2, 3})); },
                              {"enters", "loop variable 0", "float32 (2, 3)", "(None, 4)"});

  // The body's result must fit the invariant: columns double here.
  auto widen = [](const tensor& x) {
    return kiln::while_loop([](const tensor& v) { return kiln::shape_of(v)[1] < 8; },
                            [](const tensor& v) { return kiln::concat({v, v}, 1); },
                            loop_options{.shape_invariants = {shape{none, 2}}}, x);
  };
  require_throws<value_error>([&] { return widen(kiln::zeros({1, 2})); },
                              {"loop variable 0", "shape invariant (None, 2)", "float32 (1, 4)"});
  function widen_graph(widen, {.name = "widen"});
  require_throws<value_error>([&] { return widen_graph(kiln::zeros({1, 2})); },
                              {"widen", "loop variable 0", "shape invariant (None, 2)", "float32 (None, 4)"});

  // The dtype must still be kept.
  function retypes([](const tensor& x) {
    return kiln::while_loop([](const tensor& v) { return kiln::shape_of(v)[0] < 3; },
                            [](const tensor& v) { return kiln::cast(kiln::concat({v, v}, 0), float32); }, any_length, x);
  }, {.name = "retypes"});
  require_throws<value_error>([&] { return retypes(kiln::constant({1})); },
                              {"loop variable 0", "int32 (None,)", "float32 (None,)", "keep its dtype"});

  require_throws<value_error>(
      [&] { return kiln::while_loop(never, same, loop_options{.shape_invariants = {shape{none}, shape{none}}}, kiln::zeros({1})); },
      {"2 shape invariants", "1 loop variables"});
  require_throws<value_error>(
      [&] { return kiln::while_loop([](const tensor_array&) { return kiln::constant(false); },
                                    [](const tensor_array& a) { return a; }, any_length, tensor_array(float32, 2)); },
      {"loop variable 0", "tensor_array", "no shape invariant"});
}

TEST_CASE("a loop variable that changes shape without an invariant names the remedy") {
  function grows([](const tensor& x) {
    return kiln::for_range(3, [](const tensor&, const tensor& v) { return kiln::concat({v, v}, 0); }, x);
  }, {.name = "grows"});
  require_throws<value_error>([&] { return grows(kiln::constant({1})); },
                              {"loop variable 0", "int32 (1,)", "int32 (2,)", "kiln::none",
                               "kiln::loop_options{.shape_invariants = ...}"});
  require_throws<value_error>(
      [] { return kiln::for_range(3, [](const tensor&, const tensor& v) { return kiln::concat({v, v}, 0); }, kiln::constant({1})); },
      {"loop variable 0", "int32 (1,)", "int32 (2,)", "kiln::loop_options"});
}

TEST_CASE("a tensor_array may be sized by an eager tensor, read at once") {
  tensor_array squares(int32, kiln::constant(std::int64_t(3)));
  REQUIRE(squares.size() == 3);
  REQUIRE(ints(squares.size_tensor()) == std::vector<std::int32_t>{3});
  squares = kiln::for_range(3, [](const tensor& i, const tensor_array& a) { return a.write(i, i * i); }, squares);
  REQUIRE(ints(squares.stack()) == std::vector<std::int32_t>{0, 1, 4});

  require_throws<type_error>([] { return tensor_array(int32, kiln::constant(2.f)); }, {"tensor_array", "int32 or int64", "float32"});
  require_throws<value_error>([] { return tensor_array(int32, kiln::constant({2})); }, {"tensor_array", "scalar", "(1,)"});
  require_throws<invalid_argument_error>([] { return tensor_array(int32, kiln::constant(-2)); }, {"tensor_array", "-2"});
}

TEST_CASE("a tensor_array sized by a function's argument traces once for every size") {
  int traces = 0;
  function squares([&](const tensor& n) {
    ++traces;
    tensor_array out(int32, n);
    out = kiln::for_range(n, [](const tensor& i, const tensor_array& a) { return a.write(i, i * i); }, out);
    return std::vector<tensor>{out.stack(), out.size_tensor()};
  }, {.name = "squares"});
  std::vector<tensor> three = squares(kiln::constant(3));
  REQUIRE(ints(three[0]) == std::vector<std::int32_t>{0, 1, 4});
  REQUIRE(ints(three[1]) == std::vector<std::int32_t>{3});
  std::vector<tensor> five = squares(kiln::constant(5));
  REQUIRE(ints(five[0]) == std::vector<std::int32_t>{0, 1, 4, 9, 16});
  REQUIRE(ints(five[1]) == std::vector<std::int32_t>{5});
  REQUIRE(traces == 1);

  // Written outside a loop, with an int64 size: the other elements read as zeros.
  function first_only([](const tensor& n) {
    tensor_array a = tensor_array(float32, n).write(1, kiln::constant({1.f, 2.f}));
    return std::vector<tensor>{a.stack(), a.read(0)};
  }, {.name = "first_only"});
  require_same(first_only(kiln::constant(std::int64_t(3)))[0], kiln::constant({{0.f, 0.f}, {1.f, 2.f}, {0.f, 0.f}}));
  require_same(first_only(kiln::constant(std::int64_t(2)))[1], kiln::constant({0.f, 0.f}));
  require_throws<invalid_argument_error>([&] { return first_only(kiln::constant(std::int64_t(-1))); }, {"-1"});
  require_throws<invalid_argument_error>([&] { return first_only(kiln::constant(std::int64_t(1))); },
                                         {"set_item", "index 1", "[0, 1)"});

  // Its size is a tensor: size() cannot tell it while tracing.
  function sized([](const tensor& n) { return kiln::constant(tensor_array(int32, n).size()); }, {.name = "sized"});
  require_throws<value_error>([&] { return sized(kiln::constant(2)); }, {"tensor_array.size", "size_tensor()"});
}

TEST_CASE("a tensor_array with dynamic_size grows on writes past its end, eagerly and in a graph") {
  tensor_array grown = tensor_array(int32, 2, {.dynamic_size = true}).write(4, kiln::constant(7));
  REQUIRE(grown.size() == 5);
  REQUIRE(ints(grown.stack()) == std::vector<std::int32_t>{0, 0, 0, 0, 7});
  REQUIRE(ints(grown.write(1, kiln::constant(3)).stack()) == std::vector<std::int32_t>{0, 3, 0, 0, 7});

  // Empty at first, as TensorArray(size=0, dynamic_size=True) collects a loop's values.
  auto tens = [](const tensor& n) {
    tensor_array a(int32, 0, {.dynamic_size = true});
    a = kiln::for_range(n, [](const tensor& i, const tensor_array& acc) { return acc.write(i, i * 10); }, a);
    return std::vector<tensor>{a.stack(), a.size_tensor()};
  };
  const std::vector<tensor> eager = tens(kiln::constant(4));
  REQUIRE(ints(eager[0]) == std::vector<std::int32_t>{0, 10, 20, 30});
  REQUIRE(ints(eager[1]) == std::vector<std::int32_t>{4});
  require_graph_matches_eager(tens, {.name = "tens"}, kiln::constant(4));
  function f(tens, {.name = "tens"});
  REQUIRE(ints(f(kiln::constant(2))[0]) == std::vector<std::int32_t>{0, 10});
  REQUIRE(ints(f(kiln::constant(6))[1]) == std::vector<std::int32_t>{6});
  REQUIRE(f.tracing_count() == 1);
  REQUIRE(tens(kiln::constant(0))[0].shape() == shape{0});

  // Written before the loop, then grown by it, with element rows of two.
  auto appended = [](const tensor& n) {
    tensor_array a = tensor_array(float32, 1, {.dynamic_size = true}).write(0, kiln::constant({7.f, 7.f}));
    a = kiln::for_range(n, [](const tensor& i, const tensor_array& acc) {
      return acc.write(i + 1, kiln::cast(i, float32) * kiln::ones({2}));
    }, a);
    return std::vector<tensor>{a.stack()};
  };
  require_same(appended(kiln::constant(3))[0], kiln::constant({{7.f, 7.f}, {0.f, 0.f}, {1.f, 1.f}, {2.f, 2.f}}));
  require_graph_matches_eager(appended, {.name = "appended"}, kiln::constant(3));
}

TEST_CASE("reading a tensor_array past its end raises TensorFlow's kinds: out of range eagerly, invalid argument in a graph") {
  // TensorFlow 2.12's eager TensorArray: "Tried to read from index 5 but array size is: 3" (OutOfRangeError).
  tensor_array a = tensor_array(int32, 3, {.dynamic_size = true}).write(0, kiln::constant(1));
  require_throws<out_of_range_error>([&] { return a.read(5); }, {"tensor_array.read", "Tried to read from index 5 but array size is: 3"});
  require_throws<out_of_range_error>([&] { return a.read(-1); }, {"index -1"});
  function read_at([](const tensor& n, const tensor& i) {
    tensor_array b = tensor_array(int32, n).write(0, kiln::constant(1));
    return b.read(i);
  }, {.name = "read_at"});
  REQUIRE(ints(read_at(kiln::constant(2), kiln::constant(0))) == std::vector<std::int32_t>{1});
  require_throws<invalid_argument_error>([&] { return read_at(kiln::constant(2), kiln::constant(2)); }, {"2", "[0, 2)"});
}

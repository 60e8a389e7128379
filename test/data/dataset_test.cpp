// kiln::data::dataset: every source and transformation read eagerly against values
// worked out by hand; the same pipelines inside a kiln::function (one ReduceDataset
// node, traced once, equal results); dataset arguments keyed by element spec; the
// generator called at every run; shuffle's determinism; the errors.

#include <algorithm>
#include <sstream>

#include "../trace/trace_check.hpp"

using namespace kiln;
using kiln::data::dataset;
using kiln::testing::count_ops;
using kiln::testing::require_throws;

namespace {

// The single int64 component of every element, in order.
std::vector<std::int64_t> int64s(const dataset& ds) {
  std::vector<std::int64_t> out;
  for (const auto& e : ds) {
    REQUIRE(e.size() == 1);
    out.push_back(e[0].item<std::int64_t>());
  }
  return out;
}

// The first (int64) component of every element of one pass, as a number whose
// decimal digits are the elements: one value a function can return.
std::int64_t digits_of(const std::vector<std::int64_t>& values) {
  std::int64_t n = 0;
  for (std::int64_t v : values) n = n * 10 + v;
  return n;
}

tensor zero64() { return kiln::constant(std::int64_t(0)); }

// The sum of every int64 in the elements of a dataset argument, in a graph.
auto summing_function() {
  return kiln::function(
      [](const dataset& ds) {
        return kiln::for_each(ds, [](const tensor& x, const tensor& total) { return total + kiln::reduce_sum(x); },
                              zero64());
      },
      {.name = "sum"});
}

}  // namespace

TEST_CASE("range counts like Python's range, as int64 scalars") {
  CHECK(int64s(dataset::range(5)) == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  CHECK(int64s(dataset::range(1, 8, 3)) == std::vector<std::int64_t>{1, 4, 7});
  CHECK(int64s(dataset::range(5, 0, -2)) == std::vector<std::int64_t>{5, 3, 1});
  CHECK(int64s(dataset::range(0)).empty());
  CHECK(int64s(dataset::range(3, 1)).empty());
  const auto spec = dataset::range(2).element_spec();
  REQUIRE(spec.size() == 1);
  CHECK(spec[0].dtype == int64);
  CHECK(spec[0].shape == shape{});
  for (const auto& e : dataset::range(1)) CHECK(e[0].shape() == shape{});
  require_throws<invalid_argument_error>([] { return dataset::range(0, 5, 0); }, {"range", "delta"});
}

TEST_CASE("from_tensor_slices slices every component along its first dim") {
  const dataset rows = dataset::from_tensor_slices(kiln::constant({{1, 2}, {3, 4}, {5, 6}}));
  CHECK(rows.element_spec()[0].shape == shape{2});
  std::vector<std::vector<std::int32_t>> seen;
  for (const auto& e : rows) seen.push_back(e[0].to_vector<std::int32_t>());
  CHECK(seen == std::vector<std::vector<std::int32_t>>{{1, 2}, {3, 4}, {5, 6}});

  const dataset pairs = dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({0.5f, 4.f})});
  REQUIRE(pairs.element_spec().size() == 2);
  CHECK(pairs.element_spec()[1].dtype == float32);
  std::vector<std::pair<int, float>> got;
  for (const auto& e : pairs) got.emplace_back(e[0].item<std::int32_t>(), e[1].item<float>());
  CHECK(got == std::vector<std::pair<int, float>>{{1, 0.5f}, {2, 4.f}});

  require_throws<value_error>(
      [] { return dataset::from_tensor_slices(std::vector{kiln::constant({1, 2, 3}), kiln::constant({1, 2})}); },
      {"from_tensor_slices", "(3,)", "(2,)"});
  require_throws<value_error>([] { return dataset::from_tensor_slices(kiln::constant(1)); }, {"from_tensor_slices", "scalar"});
}

TEST_CASE("from_tensors makes one element of the whole components") {
  const dataset one = dataset::from_tensors(std::pair{kiln::constant({1, 2, 3}), kiln::constant(7.0)});
  int count = 0;
  for (const auto& e : one) {
    ++count;
    CHECK(e[0].to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3});
    CHECK(e[1].item<double>() == 7.0);
  }
  CHECK(count == 1);
  CHECK(one.element_spec()[0].shape == shape{3});
}

TEST_CASE("from_generator calls the generator at every pass and checks its elements") {
  int calls = 0;
  const dataset ds = dataset::from_generator(
      [&calls] {
        ++calls;
        return std::vector<std::pair<int, int>>{{1, 2}, {3, 5}};
      },
      {tensor_spec({}, int32), tensor_spec({}, int32)});
  CHECK(calls == 0);
  std::vector<std::pair<int, int>> got;
  for (const auto& e : ds) got.emplace_back(e[0].item<std::int32_t>(), e[1].item<std::int32_t>());
  for (const auto& e : ds) (void)e;
  CHECK(got == std::vector<std::pair<int, int>>{{1, 2}, {3, 5}});
  CHECK(calls == 2);

  // A generator-like source: a callable giving one optional element per call.
  const dataset counted = dataset::from_generator(
      [] {
        return [n = std::int64_t(0)]() mutable -> std::optional<std::int64_t> {
          if (n == 3) return std::nullopt;
          return n++ * 10;
        };
      },
      {tensor_spec({}, int64)});
  CHECK(int64s(counted) == std::vector<std::int64_t>{0, 10, 20});

  // C++ numbers take the dtype of the spec.
  const dataset as_double =
      dataset::from_generator([] { return std::vector<int>{1, 2}; }, {tensor_spec({}, float64)});
  for (const auto& e : as_double) CHECK(e[0].dtype() == float64);

  const dataset wrong = dataset::from_generator([] { return std::vector<tensor>{kiln::constant({1, 2})}; },
                                                {tensor_spec({}, int32)});
  require_throws<invalid_argument_error>([&] { return int64s(wrong); }, {"from_generator", "int32 (2,)", "int32 ()"});
}

TEST_CASE("map runs a function traced once per element") {
  int traces = 0;
  const dataset squares = dataset::range(4).map([&traces](const tensor& x) {
    ++traces;
    return x * x;
  });
  CHECK(traces == 1);
  CHECK(int64s(squares) == std::vector<std::int64_t>{0, 1, 4, 9});
  CHECK(int64s(squares) == std::vector<std::int64_t>{0, 1, 4, 9});
  CHECK(traces == 1);

  // Two components in, two out: (x, y) -> (x + y, x * y).
  const dataset pairs = dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({10, 20})})
                            .map([](const tensor& x, const tensor& y) { return std::tuple{x + y, x * y}; });
  std::vector<std::pair<int, int>> got;
  for (const auto& e : pairs) got.emplace_back(e[0].item<std::int32_t>(), e[1].item<std::int32_t>());
  CHECK(got == std::vector<std::pair<int, int>>{{11, 10}, {22, 40}});

  require_throws<value_error>([] { return dataset::range(3).map([](const tensor& x, const tensor& y) { return x + y; }); },
                              {"dataset::map", "2", "have 1"});
}

TEST_CASE("batch stacks elements, with or without the partial last batch") {
  const dataset batches = dataset::range(5).batch(2);
  CHECK(batches.element_spec()[0].shape == shape{none});
  std::vector<std::vector<std::int64_t>> got;
  std::vector<shape> shapes;
  for (const auto& e : batches) {
    got.push_back(e[0].to_vector<std::int64_t>());
    shapes.push_back(e[0].shape());
  }
  CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}, {4}});
  CHECK(shapes == std::vector<shape>{shape{2}, shape{2}, shape{1}});

  const dataset full = dataset::range(5).batch(2, true);
  CHECK(full.element_spec()[0].shape == shape{2});
  got.clear();
  for (const auto& e : full) got.push_back(e[0].to_vector<std::int64_t>());
  CHECK(got == std::vector<std::vector<std::int64_t>>{{0, 1}, {2, 3}});

  // Batches of rows: shape (2, 2) and the spec (None, 2).
  const dataset rows = dataset::from_tensor_slices(kiln::constant({{1, 2}, {3, 4}, {5, 6}})).batch(2);
  CHECK(rows.element_spec()[0].shape == shape{none, 2});

  require_throws<invalid_argument_error>([] { return dataset::range(5).batch(0); }, {"batch", "positive", "0"});
  const dataset ragged = dataset::from_generator(
      [] { return std::vector<tensor>{kiln::constant({1}), kiln::constant({1, 2})}; }, {tensor_spec({none}, int32)});
  require_throws<invalid_argument_error>([&] { return int64s(ragged.batch(2)); }, {"batch", "(1,)", "(2,)"});
}

TEST_CASE("take and prefetch") {
  CHECK(int64s(dataset::range(10).take(3)) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(int64s(dataset::range(3).take(-1)) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(int64s(dataset::range(3).take(0)).empty());
  CHECK(int64s(dataset::range(4).prefetch(2)) == std::vector<std::int64_t>{0, 1, 2, 3});
  require_throws<invalid_argument_error>([] { return dataset::range(4).prefetch(-2); }, {"prefetch", "-2"});
}

TEST_CASE("shuffle is a permutation, reproducible with a seed, new at every pass") {
  const std::vector<std::int64_t> in_order{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const dataset a = dataset::range(10).shuffle(10, 42), b = dataset::range(10).shuffle(10, 42);
  const std::vector<std::int64_t> a1 = int64s(a), a2 = int64s(a), b1 = int64s(b), b2 = int64s(b);
  std::vector<std::int64_t> sorted = a1;
  std::ranges::sort(sorted);
  CHECK(sorted == in_order);
  CHECK(a1 != in_order);
  CHECK(a1 == b1);  // the same seed, the same first pass
  CHECK(a2 == b2);  // and the same second pass
  CHECK(a1 != a2);  // reshuffled each iteration
  CHECK(int64s(dataset::range(10).shuffle(10, 42, false)) == int64s(dataset::range(10).shuffle(10, 42, false)));
  // A buffer of one element cannot reorder anything.
  CHECK(int64s(dataset::range(10).shuffle(1, 3)) == in_order);
  require_throws<invalid_argument_error>([] { return dataset::range(3).shuffle(0); }, {"shuffle", "buffer_size", "0"});
}

TEST_CASE("reduce and for_each fold a dataset eagerly") {
  CHECK(dataset::range(5).reduce(zero64(), [](const tensor& s, const tensor& x) { return s + x; }).item<std::int64_t>() == 10);
  auto [count, total] = kiln::for_each(
      dataset::range(1, 4), [](const tensor& x, const tensor& n, const tensor& t) { return std::tuple{n + 1, t + x * x}; },
      kiln::constant(0), zero64());
  CHECK(count.item<std::int32_t>() == 3);
  CHECK(total.item<std::int64_t>() == 14);
}

TEST_CASE("inside a function a dataset loop is one ReduceDataset node, traced once") {
  int body_traces = 0;
  function f(
      [&body_traces] {
        const dataset ds = dataset::range(1, 6).map([](const tensor& x) { return x * 2; }).batch(2);
        return kiln::for_each(
            ds,
            [&body_traces](const tensor& batch, const tensor& total) {
              ++body_traces;
              return total + kiln::reduce_sum(batch);
            },
            zero64());
      },
      {.name = "f"});
  CHECK(f().item<std::int64_t>() == 30);  // 2 + 4 + 6 + 8 + 10
  CHECK(f().item<std::int64_t>() == 30);
  CHECK(f.tracing_count() == 1);
  CHECK(body_traces == 1);
  CHECK(count_ops(f.get_concrete_function().graph(), "ReduceDataset") == 1);
  CHECK(count_ops(f.get_concrete_function().graph(), "reduce_sum") == 0);  // inside the body, not unrolled

  function r([] { return dataset::range(5).reduce(zero64(), [](const tensor& s, const tensor& x) { return s + x; }); },
             {.name = "r"});
  CHECK(r().item<std::int64_t>() == 10);
  CHECK(count_ops(r.get_concrete_function().graph(), "ReduceDataset") == 1);
}

TEST_CASE("a loop over C++ data unrolls, a loop over a dataset does not") {
  function train(
      [](const auto& data) {
        return kiln::for_each(
            data, [](const auto& x, const auto& y, const tensor& loss) { return loss + kiln::abs(y - x); },
            kiln::constant(0));
      },
      {.name = "train"});
  using pairs = std::vector<std::pair<tensor, tensor>>;
  const pairs three(3, {kiln::constant(1), kiln::constant(4)}), ten(10, {kiln::constant(1), kiln::constant(4)});
  const auto small = train.get_concrete_function(three).graph().nodes().size();
  const auto big = train.get_concrete_function(ten).graph().nodes().size();
  CHECK(big > small);
  CHECK(train(three).item<std::int32_t>() == 9);

  auto slices = [](std::int64_t n) {
    return dataset::from_tensor_slices(std::pair{kiln::fill(shape{n}, 1), kiln::fill(shape{n}, 4)});
  };
  const auto ds_small = train.get_concrete_function(slices(3)).graph().nodes().size();
  const auto ds_big = train.get_concrete_function(slices(10)).graph().nodes().size();
  CHECK(ds_small == ds_big);
  CHECK(train(slices(10)).item<std::int32_t>() == 30);
}

TEST_CASE("a dataset argument is keyed by its element spec and each call reads its own") {
  auto sum = summing_function();
  CHECK(sum(dataset::range(5)).item<std::int64_t>() == 10);
  CHECK(sum(dataset::range(10)).item<std::int64_t>() == 45);
  CHECK(sum(dataset::range(3).map([](const tensor& x) { return x + 100; })).item<std::int64_t>() == 303);
  CHECK(sum(dataset::from_tensor_slices(kiln::constant({std::int64_t(7), std::int64_t(8)}))).item<std::int64_t>() == 15);
  CHECK(sum.tracing_count() == 1);
  // Another element spec is another trace.
  CHECK(sum(dataset::range(4).batch(2)).item<std::int64_t>() == 0 + 1 + 2 + 3);
  CHECK(sum.tracing_count() == 2);

  // A concrete function given a dataset of another spec names both specs.
  auto concrete = sum.get_concrete_function(dataset::range(3));
  CHECK(concrete(dataset::range(4)).item<std::int64_t>() == 6);
  require_throws<invalid_argument_error>(
      [&] { return concrete(dataset::from_tensor_slices(kiln::constant({1.f}))); }, {"ReduceDataset", "float32 ()", "int64 ()"});
}

TEST_CASE("a dataset loop inside a graph loop captures the dataset argument") {
  function twice(
      [](const dataset& ds) {
        return kiln::for_range(
            2,
            [&ds](const tensor& i, const tensor& total) {
              const tensor inner = kiln::for_each(ds, [](const tensor& x, const tensor& t) { return t + x; }, zero64());
              return total + inner * kiln::cast(i + 1, int64);
            },
            zero64());
      },
      {.name = "twice"});
  CHECK(twice(dataset::range(4)).item<std::int64_t>() == 6 * 1 + 6 * 2);
  CHECK(twice(dataset::range(5)).item<std::int64_t>() == 10 * 1 + 10 * 2);
  CHECK(twice.tracing_count() == 1);
}

TEST_CASE("from_generator is fetched at every call of a function, not at trace time") {
  int calls = 0;
  std::vector<std::int64_t> data{1, 2, 3};
  const dataset ds = dataset::from_generator(
      [&] {
        ++calls;
        return data;
      },
      {tensor_spec({}, int64)});
  auto sum = summing_function();
  (void)sum.get_concrete_function(ds);
  CHECK(calls == 0);
  CHECK(sum(ds).item<std::int64_t>() == 6);
  data.push_back(10);
  CHECK(sum(ds).item<std::int64_t>() == 16);
  CHECK(calls == 2);
  CHECK(sum.tracing_count() == 1);
}

TEST_CASE("a loop variable fed by elements of unknown shape takes an unknown shape, as in tf.data") {
  const dataset untyped = dataset::from_generator([] { return std::vector<std::pair<int, int>>{{1, 4}, {6, 2}}; },
                                                  {int32, int32});
  CHECK(untyped.element_spec()[0].shape.rank() == -1);
  function train(
      [](const dataset& ds) {
        return kiln::for_each(ds, [](const tensor& x, const tensor& y, const tensor& loss) { return loss + kiln::abs(y - x); },
                              kiln::constant(0));
      },
      {.name = "train"});
  const concrete_function concrete = train.get_concrete_function(untyped);
  CHECK(concrete.structured_outputs()[0].shape.rank() == -1);
  CHECK(count_ops(concrete.graph(), "ReduceDataset") == 1);
  const tensor loss = train(untyped);
  CHECK(loss.shape() == shape{});
  CHECK(loss.item<std::int32_t>() == 7);  // |4 - 1| + |2 - 6|
}

TEST_CASE("a shuffled dataset in a function matches eager passes and reshuffles per call") {
  function order(
      [](const dataset& ds) {
        return kiln::for_each(ds, [](const tensor& x, const tensor& n) { return n * 10 + x; }, zero64());
      },
      {.name = "order"});
  const dataset in_graph = dataset::range(8).shuffle(8, 5), eager = dataset::range(8).shuffle(8, 5);
  const std::int64_t first = order(in_graph).item<std::int64_t>(), second = order(in_graph).item<std::int64_t>();
  CHECK(first == digits_of(int64s(eager)));
  CHECK(second == digits_of(int64s(eager)));
  CHECK(first != second);
}

TEST_CASE("a loop without loop variables runs its effects at every call") {
  std::ostringstream printed;
  kiln::config::set_print_stream(printed);
  function show([](const dataset& ds) { kiln::for_each(ds, [](const tensor& x) { kiln::print("x =", x); }); },
                {.name = "show"});
  show(dataset::range(2));
  show(dataset::range(3));
  kiln::config::set_print_stream(std::cerr);
  CHECK(printed.str() == "x = 0\nx = 1\nx = 0\nx = 1\nx = 2\n");
  CHECK(show.tracing_count() == 1);
}

TEST_CASE("loop variables must keep dtype and shape; bodies must take the element") {
  const dataset ds = dataset::range(3);
  auto to_float = [](const tensor&, const tensor& total) { return kiln::cast(total, float32); };
  auto to_pair = [](const tensor&, const tensor& total) { return kiln::stack({total, total}); };
  require_throws<value_error>([&] { return kiln::for_each(ds, to_float, kiln::constant(0)); },
                              {"for_each", "loop variable 0", "int32 ()", "float32 ()"});
  require_throws<value_error>([&] { return kiln::for_each(ds, to_pair, kiln::constant(0)); },
                              {"for_each", "int32 ()", "int32 (2,)"});
  function traced([&](const dataset& d) { return kiln::for_each(d, to_pair, kiln::constant(0)); }, {.name = "traced"});
  require_throws<value_error>([&] { return traced(ds); }, {"traced", "for_each", "int32 ()", "int32 (2,)"});
  require_throws<value_error>(
      [&] { return ds.reduce(kiln::constant(0), [](const tensor& s, const tensor&) { return kiln::cast(s, float64); }); },
      {"dataset::reduce", "int32 ()", "float64 ()"});

  const dataset pairs = dataset::from_tensor_slices(std::pair{kiln::constant({1}), kiln::constant({2})});
  require_throws<value_error>(
      [&] { return kiln::for_each(pairs, [](const tensor& x, const tensor& t) { return t + x; }, kiln::constant(0)); },
      {"for_each", "1", "have 2"});
}

TEST_CASE("a dataset prints its stage, shapes and types") {
  auto text = [](const dataset& ds) {
    std::ostringstream os;
    os << ds;
    return os.str();
  };
  CHECK(text(dataset::range(3)) == "<RangeDataset shapes: (), types: int64>");
  CHECK(text(dataset::range(3).batch(2)) == "<BatchDataset shapes: (None,), types: int64>");
  CHECK(text(dataset::from_generator([] { return std::vector<std::pair<int, int>>{}; },
                                     {tensor_spec({}, int32), tensor_spec(unknown_rank, int32)})) ==
        "<FlatMapDataset shapes: ((), <unknown>), types: (int32, int32)>");
}

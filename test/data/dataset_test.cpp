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

TEST_CASE("a C++ for over a dataset inside a trace is an error naming for_each and reduce, never a stale unrolled graph") {
  // Passed as an argument: datasets of one spec share a trace, so an unrolled loop
  // over range(3) would answer 3 for range(5).
  kiln::function sum_argument(
      [](const dataset& ds) {
        tensor s = zero64();
        for (const auto& e : ds) s = s + e[0];
        return s;
      },
      {.name = "sum_argument"});
  require_throws<kiln::type_error>([&] { sum_argument(dataset::range(3)); },
                                   {"in sum_argument", "kiln::for_each", "reduce"});
  require_throws<kiln::type_error>([&] { sum_argument(dataset::range(5)); }, {"kiln::for_each"});
  // Captured from outside, with a structured binding.
  const auto captured = dataset::range(3);
  kiln::function sum_captured([&] {
    tensor s = zero64();
    for (auto [x] : captured) s = s + x;
    return s;
  });
  require_throws<kiln::type_error>([&] { sum_captured(); }, {"kiln::for_each", "ReduceDataset"});
  // The same loops written with for_each and reduce run at every call.
  kiln::function sum_reduce([](const dataset& ds) { return ds.reduce(zero64(), [](auto s, auto x) { return s + x; }); });
  CHECK(sum_reduce(dataset::range(3)).item<std::int64_t>() == 3);
  CHECK(sum_reduce(dataset::range(5)).item<std::int64_t>() == 10);
  CHECK(sum_reduce.tracing_count() == 1);
  // Outside a function, or lifted out of the trace by init_scope, the loop runs.
  std::int64_t eager = 0;
  for (auto [x] : captured) eager += x.item<std::int64_t>();
  CHECK(eager == 3);
  kiln::function lifted([&] {
    kiln::init_scope outside;
    std::int64_t n = 0;
    for (auto [x] : captured) n += x.item<std::int64_t>();
    return kiln::constant(n);
  });
  CHECK(lifted().item<std::int64_t>() == 3);
}

TEST_CASE("elements of several components bind to structured bindings") {
  const auto pairs = dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})});
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(*pairs.begin())>, std::array<tensor, 2>>);
  std::vector<int> xs;
  std::vector<float> ys;
  for (auto [x, y] : pairs) {
    xs.push_back(x.item<int>());
    ys.push_back(y.item<float>());
  }
  CHECK(xs == std::vector{1, 2});
  CHECK(ys == std::vector{3.f, 4.f});
  // Transformations that keep the component count keep the static count.
  for (auto [x, y] : pairs.batch(2).shuffle(2, 7).take(1)) {
    CHECK(x.shape() == kiln::shape{2});
    CHECK(y.shape() == kiln::shape{2});
  }
  // map's count follows what its function returns.
  const auto swapped = pairs.map([](const tensor& x, const tensor& y) { return std::tuple{y, kiln::cast(x, kiln::float32)}; });
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(swapped)>, kiln::data::dataset_of<2>>);
  std::vector<float> sums;
  for (auto [a, b] : swapped) sums.push_back((a + b).item<float>());
  CHECK(sums == std::vector{4.f, 6.f});
  // A generator of pairs gives pairs; a dataset of unknown count is a dataset, its
  // elements vectors, and dataset_of checks a claimed count.
  const auto generated = dataset::from_generator([] { return std::vector<std::pair<int, int>>{{1, 10}}; },
                                                 {tensor_spec({}, int32), tensor_spec({}, int32)});
  for (auto [a, b] : generated) CHECK((a + b).item<int>() == 11);
  const dataset erased = pairs;
  for (const auto& e : erased) CHECK(e.size() == 2);
  CHECK(kiln::data::dataset_of<2>(erased).element_spec().size() == 2);
  require_throws<kiln::value_error>([&] { kiln::data::dataset_of<3>{erased}; }, {"dataset_of<3>", "2 components"});
}

TEST_CASE("shard keeps every num_shards-th element from index") {
  CHECK(int64s(dataset::range(10).shard(3, 0)) == std::vector<std::int64_t>{0, 3, 6, 9});
  CHECK(int64s(dataset::range(10).shard(3, 1)) == std::vector<std::int64_t>{1, 4, 7});
  CHECK(int64s(dataset::range(10).shard(3, 2)) == std::vector<std::int64_t>{2, 5, 8});
  CHECK(int64s(dataset::range(2).shard(4, 3)).empty());
  require_throws<kiln::invalid_argument_error>([] { dataset::range(3).shard(0, 0); }, {"shard", "num_shards"});
  require_throws<kiln::invalid_argument_error>([] { dataset::range(3).shard(2, 2); }, {"shard", "index", "[0, 2)"});
  require_throws<kiln::invalid_argument_error>([] { dataset::range(3).shard(2, -1); }, {"shard", "index"});
  // Inside a function, on the shard of each call's dataset.
  auto sum = summing_function();
  CHECK(sum(dataset::range(10).shard(2, 1)).item<std::int64_t>() == 1 + 3 + 5 + 7 + 9);
}

TEST_CASE("an iterator advances at every get_next, eagerly and at every call of a function (good_consume_next)") {
  auto it = dataset::from_tensor_slices(kiln::constant({1, 2, 3})).make_iterator();
  std::vector<kiln::tensor> seen;
  kiln::function consume(
      [&](const kiln::data::iterator& i) {
        kiln::host_callback([&](const tensor& v) { seen.push_back(v); }, {}, i.get_next()[0]);
      },
      {.name = "good_consume_next", .arg_names = {"iterator"}});
  consume(it);
  consume(it);
  consume(it);
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].item<int>() == 1);
  CHECK(seen[1].item<int>() == 2);
  CHECK(seen[2].item<int>() == 3);
  CHECK(consume.tracing_count() == 1);
  // Past the end, TensorFlow's OutOfRangeError, naming the function and the node.
  require_throws<kiln::out_of_range_error>([&] { consume(it); }, {"in good_consume_next", "IteratorGetNext", "End of sequence"});
  // Another iterator of the same spec reuses the trace and advances on its own.
  auto other = dataset::from_tensor_slices(kiln::constant({7, 8})).make_iterator();
  consume(other);
  CHECK(seen.back().item<int>() == 7);
  CHECK(consume.tracing_count() == 1);
  // A concrete function called with an iterator of another element spec.
  const kiln::concrete_function traced = consume.get_concrete_function(other);
  auto floats = dataset::from_tensor_slices(kiln::constant({1.f})).make_iterator();
  require_throws<kiln::invalid_argument_error>([&] { traced(floats); },
                                               {"IteratorGetNext", "iterator's elements are (float32 ())", "traced for (int32 ())"});
  // Eagerly, the same errors; a copy shares the pass.
  auto eager = dataset::range(2).make_iterator();
  auto copy = eager;
  auto [first] = eager.get_next();
  CHECK(first.item<std::int64_t>() == 0);
  CHECK(kiln::data::get_next(copy)[0].item<std::int64_t>() == 1);
  require_throws<kiln::out_of_range_error>([&] { eager.get_next(); }, {"End of sequence"});
  require_throws<kiln::value_error>([] { kiln::data::iterator().get_next(); }, {"iterator over nothing"});
}

TEST_CASE("a captured iterator advances inside a function, and a graph keeps it alive") {
  kiln::function two_at_a_time([] {
    static auto it = dataset::range(5).make_iterator();
    auto [a] = it.get_next();
    auto [b] = it.get_next();
    return a * 10 + b;
  });
  CHECK(two_at_a_time().item<std::int64_t>() == 1);
  CHECK(two_at_a_time().item<std::int64_t>() == 23);
  require_throws<kiln::out_of_range_error>([&] { two_at_a_time(); }, {"IteratorGetNext", "End of sequence"});
  // An iterator made inside the trace lives in the graph's node.
  kiln::function fresh([] { return kiln::data::get_next(dataset::range(4).make_iterator())[0]; });
  CHECK(fresh().item<std::int64_t>() == 0);
  CHECK(fresh().item<std::int64_t>() == 1);
}

TEST_CASE("signatures show datasets and iterators as TensorFlow's DatasetSpec and IteratorSpec") {
  kiln::function sum([](const dataset& ds) { return ds.reduce(zero64(), [](auto s, auto x) { return s + kiln::reduce_sum(x); }); },
                     {.name = "d", .arg_names = {"ds"}});
  // TensorFlow 2.12 prints these for Dataset.range(5).batch(2) and an iterator over
  // from_tensor_slices(([1, 2], [3., 4.])).
  CHECK(sum.get_concrete_function(dataset::range(5).batch(2)).pretty_printed_signature() ==
        "d(ds)\n"
        "  Args:\n"
        "    ds: DatasetSpec(TensorSpec(shape=(None,), dtype=tf.int64, name=None), TensorShape([]))\n"
        "  Returns:\n"
        "    int64 Tensor, shape=()");
  kiln::function first([](const kiln::data::iterator& it) { return it.get_next()[1]; }, {.name = "f", .arg_names = {"it"}});
  auto it = dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})}).make_iterator();
  CHECK(first.get_concrete_function(it).pretty_printed_signature() ==
        "f(it)\n"
        "  Args:\n"
        "    it: IteratorSpec((TensorSpec(shape=(), dtype=tf.int32, name=None), TensorSpec(shape=(), dtype=tf.float32, "
        "name=None)),)\n"
        "  Returns:\n"
        "    float32 Tensor, shape=()");
  CHECK(first(it).item<float>() == 3.f);
}

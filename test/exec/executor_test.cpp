// The graph executor against eager execution: fused elementwise clusters (with every
// kind of broadcast operand), mixed dtypes, integer ops and their value checks,
// non-elementwise ops between clusters, outputs that are intermediates, arguments or
// constants, None-dim signatures, the multi-threaded path, concurrent callers, and
// the allocations of a call in steady state.

#include "../support/op_check.hpp"

#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

// Counts this thread's calls of the global operator new, so a test can see what one
// graph run allocates. Every kiln tensor buffer comes with one (its shared storage).
namespace {
thread_local long allocations_on_this_thread = 0;

void* counted_allocation(std::size_t bytes, std::size_t alignment) {
  ++allocations_on_this_thread;
  bytes = bytes == 0 ? 1 : bytes;
  void* p = alignment <= alignof(std::max_align_t) ? std::malloc(bytes)
                                                   : std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

// Not inlined: GCC would otherwise see `free` meet `operator new` and warn.
[[gnu::noinline]] void* operator new(std::size_t bytes) { return counted_allocation(bytes, 0); }
[[gnu::noinline]] void* operator new(std::size_t bytes, std::align_val_t a) { return counted_allocation(bytes, std::size_t(a)); }
// The nothrow forms too: a sanitizer's runtime would otherwise allocate them, and
// the replaced operator delete would free its blocks.
[[gnu::noinline]] void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(bytes, 0);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
[[gnu::noinline]] void* operator new(std::size_t bytes, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(bytes, std::size_t(a));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using kiln::tensor;
using kiln::testing::random_floats;
using kiln::testing::random_tensor;
using kiln::testing::require_same;
using kiln::testing::value_range;
using tensors = std::vector<tensor>;

/// kiln::testing::require_graph_matches_eager with default options.
template <class F, class... Args>
void require_graph_matches_eager(F fn, const Args&... args) {
  kiln::testing::require_graph_matches_eager(fn, kiln::function_options{}, args...);
}


/// The executor's schedule of `fn`'s optimized graph for `args`.
template <class F, class... Args>
std::string schedule_of(F fn, const Args&... args) {
  kiln::function f(fn);
  const kiln::graph g = kiln::detail::optimize(f.get_concrete_function(args...).graph());
  return kiln::detail::graph_executor(g).schedule(std::vector<tensor>{args...});
}

}  // namespace

TEST_CASE("elementwise nodes of one shape fuse into one step", "[exec]") {
  const tensor s = random_floats({}, 50), x = random_floats({4, 5}, 51), row = random_floats({5}, 52);
  CHECK(schedule_of([](const tensor& x) { return x * x + 2; }, s) == "[mul add]");
  CHECK(schedule_of([](const tensor& x) { return kiln::tanh(x * 0.5f + 1) * x - 0.25f; }, x) == "[mul add tanh mul sub]");
  std::string chain = "[";
  for (int i = 0; i < 25; ++i) chain += i ? " mul add" : "mul add";
  CHECK(schedule_of(
            [](const tensor& x0) {
              tensor x = x0;
              for (int i = 0; i < 25; ++i) x = x * 1.0001f + 0.5f;
              return x;
            },
            x) == chain + "]");
  // Two clusters that one node reads merge; a cluster of another shape stays apart.
  CHECK(schedule_of(
            [](const tensor& x, const tensor& r) {
              tensor twice = x * 2.f;
              tensor next = x + 1.f;
              tensor scaled = r * 3.f;
              return twice * next + scaled;
            },
            x, row) == "[mul] [mul add mul add]");
  // A cluster closes when an op outside it reads it, so the op never runs too early.
  CHECK(schedule_of(
            [](const tensor& x, const tensor& w) {
              tensor a = kiln::relu(x * 2.f);
              tensor m = kiln::matmul(a, w);
              tensor s = kiln::reduce_sum(a);
              return m + s - 1.f;
            },
            x, random_floats({5, 3}, 53)) == "[mul relu] matmul reduce_sum [add sub]");
  // A checked op takes its inputs from outside its cluster; an unchecked one joins.
  const tensor i = random_tensor(kiln::int32, {6}, 54, value_range::positive);
  CHECK(schedule_of([](const tensor& a, const tensor& b) { return a % (b + 1) * 2; }, i, i) == "[add] [floormod mul]");
  CHECK(schedule_of([](const tensor& a, const tensor& b) { return a % b * 2; }, i, i) == "[floormod mul]");
  // Strings run op by op.
  CHECK(schedule_of([](const tensor& t) { return t + "!"; }, kiln::constant("a")) == "add");
#if KILN_HAS_THRUST
  CHECK(schedule_of([](const tensor& x) { return x * 2.f; }, x.to(kiln::device::gpu)) == "interpreted");
#endif
}

TEST_CASE("fused chains read row vectors, column vectors and scalars", "[exec]") {
  const tensor x = random_floats({4, 5}, 1), row = random_floats({5}, 2), col = random_floats({4, 1}, 3), one = random_floats({}, 4);
  require_graph_matches_eager(
      [](const tensor& x, const tensor& row, const tensor& col, const tensor& s) {
        tensor a = (x * row + col) * s - 2.f;
        tensor b = kiln::tanh(a * 0.5f) / (kiln::abs(row) + 1.f) + kiln::exp(col * 0.1f);
        return tensors{kiln::maximum(a, b) * kiln::sigmoid(x), -b};
      },
      x, row, col, one);
  // A cluster wider than all of its operands: a (1, 5) row meets a (4, 1) column.
  require_graph_matches_eager(
      [](const tensor& r, const tensor& c) { return tensors{kiln::square(r + c) - r * 3.f}; }, random_floats({1, 5}, 5),
      random_floats({4, 1}, 6));
  // Rank-3 broadcasts, and the same operand read in place and broadcast.
  require_graph_matches_eager(
      [](const tensor& x, const tensor& m, const tensor& v) { return tensors{(x * m + v) * x + kiln::relu(m - v)}; },
      random_floats({3, 4, 5}, 7), random_floats({4, 1}, 8), random_floats({1, 1, 5}, 9));
}

TEST_CASE("comparisons make bools that feed where, casts and logic ops", "[exec]") {
  const tensor x = random_floats({6, 7}, 10), y = random_floats({7}, 11);
  require_graph_matches_eager(
      [](const tensor& x, const tensor& y) {
        tensor positive = x > 0.f, small = kiln::abs(y) < 1.f;
        tensor both = kiln::logical_and(positive, kiln::logical_not(small));
        tensor picked = kiln::where(both, x * 2.f, y - 1.f);
        tensor counted = kiln::cast(kiln::logical_or(positive, x == y), kiln::int32) + 3;
        return tensors{picked, counted, kiln::cast(picked, kiln::float64) * 0.5, both};
      },
      x, y);
  // A bool argument and a scalar condition.
  require_graph_matches_eager(
      [](const tensor& c, const tensor& x, const tensor& s) {
        return tensors{kiln::where(c, x, -x) + kiln::where(s > 0.f, x, 1.f)};
      },
      random_tensor(kiln::bool_, {9}, 12), random_floats({9}, 13), random_floats({}, 14));
}

TEST_CASE("integer ops fuse and keep their value checks", "[exec]") {
  const tensor a = random_tensor(kiln::int32, {5, 6}, 15), b = random_tensor(kiln::int32, {6}, 16, value_range::nonzero);
  const tensor e = random_tensor(kiln::int64, {5, 6}, 17, value_range::small_nonnegative_integer);
  auto arithmetic = [](const tensor& a, const tensor& b, const tensor& e) {
    tensor t = (a * 3 + 7) % 5 - kiln::floordiv(a, b);
    tensor p = kiln::pow(kiln::cast(t, kiln::int64), e) + kiln::floordiv(kiln::cast(a, kiln::int64), 2);
    return tensors{t, p, a / b, kiln::minimum(t, -a) * kiln::abs(b)};
  };
  require_graph_matches_eager(arithmetic, a, b, e);

  kiln::function f(arithmetic);
  REQUIRE_NOTHROW(f(a, b, e));  // planned and cached with a good divisor
  const tensor zero = kiln::testing::make_tensor<std::int32_t>({1, 2, 0, 4, 5, 6}, {6});
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return f(a, zero, e); }, {"floordiv", "by zero"});
  const tensor negative = kiln::testing::make_tensor<std::int64_t>(std::vector<std::int64_t>(30, -1), {5, 6});
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return f(a, b, negative); }, {"pow", "negative"});

  // A divisor computed in the graph is checked too, before the kernel runs.
  kiln::function computed([](const tensor& a, const tensor& b) { return a % (b - 1) + 1; });
  const tensor ones = kiln::testing::make_tensor<std::int32_t>({3, 1, 2}, {3});
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return computed(ones, ones); }, {"floormod", "by zero"});
  // Floats divide by zero as IEEE says, fused.
  require_graph_matches_eager([](const tensor& x) { return tensors{kiln::floordiv(x, x - x) + x % 0.f}; }, random_floats({8}, 18));
}

TEST_CASE("non-elementwise ops between clusters", "[exec]") {
  const tensor x = random_floats({6, 4}, 19), w = random_floats({4, 5}, 20), idx = kiln::constant({2, 0, 5});
  require_graph_matches_eager(
      [](const tensor& x, const tensor& w, const tensor& idx) {
        tensor a = kiln::relu(x * 2.f - 0.5f);
        tensor m = kiln::matmul(a, w) + 1.f;
        tensor s = kiln::reduce_sum(m, 1, true);
        tensor r = kiln::reshape(kiln::transpose(m * s), {5, 3, 2});
        tensor g = kiln::gather(a, idx) * 3.f;
        tensor c = kiln::concat({a, a * a}, 1);
        return tensors{kiln::tanh(r) - kiln::reduce_mean(m), g, c[1] + kiln::reduce_max(x), kiln::slice(c, {1, 2}, {2, 3})};
      },
      x, w, idx);
  // An index out of range is still found at run time.
  kiln::function f([](const tensor& x, const tensor& i) { return kiln::gather(x * 2.f, i) + 1.f; });
  REQUIRE_NOTHROW(f(x, kiln::constant({1, 2})));
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return f(x, kiln::constant({1, 9})); }, {"gather", "9"});
}

TEST_CASE("outputs may be intermediates, arguments, constants or repeated", "[exec]") {
  const tensor c = kiln::constant({1.f, 2.f, 3.f});
  const tensor x = random_floats({3}, 21);
  require_graph_matches_eager(
      [c](const tensor& x) {
        tensor a = x * c;
        tensor b = a + 1.f;
        tensor d = kiln::reshape(b * 2.f, {3, 1});
        return tensors{a, b * a, x, c, b, a, d, kiln::reshape(x, {1, 3})};
      },
      x);
  // Outputs stay intact when the next call runs: they never share reused memory.
  kiln::function f([](const tensor& x) { return tensors{x * 2.f, kiln::reshape(x + 1.f, {3})}; });
  tensors first = f(x);
  tensors second = f(x * 10.f);
  require_same(first[0], x * 2.f);
  require_same(first[1], x + 1.f);
  require_same(second[0], x * 20.f);
}

TEST_CASE("strings, empty tensors and values no output needs", "[exec]") {
  require_graph_matches_eager(
      [](const tensor& s, const tensor& x) {
        tensor joined = s + "!";
        return tensors{joined, kiln::where(joined == "a!", x, x * 2.f), kiln::cast(s, kiln::string)};
      },
      random_tensor(kiln::string, {5}, 22), random_floats({5}, 23));
  require_graph_matches_eager([](const tensor& x, const tensor& r) { return tensors{x * r + 1.f, kiln::reduce_sum(x * 2.f)}; },
                              random_floats({0, 3}, 24), random_floats({3}, 25));
  // Non-strict: a failing op that no output needs never runs.
  kiln::function f([](const tensor& a) {
    tensor unused = kiln::floordiv(a, a - a);
    return a + 1;
  });
  require_same(f(kiln::constant({1, 2})), kiln::constant({2, 3}));
}

TEST_CASE("None dims plan once per input shape", "[exec]") {
  auto fn = [](const tensor& x, const tensor& b) {
    tensor y = kiln::tanh(x * b + 1.f) * x;
    return tensors{y - kiln::reduce_sum(y, 1, true), kiln::reshape(y, {-1})};
  };
  kiln::function f(fn, {.input_signature = std::vector<kiln::tensor_spec>{{{kiln::none, kiln::none}, kiln::float32},
                                                                          {{kiln::none}, kiln::float32}}});
  for (std::int64_t rows : {1, 3, 0, 17, 3}) {
    for (std::int64_t cols : {1, 5, 64}) {
      INFO(rows << " x " << cols);
      const tensor x = random_floats({rows, cols}, std::uint32_t(rows * 100 + cols)), b = random_floats({cols}, 26);
      const tensors graph = f(x, b), eager = fn(x, b);
      for (std::size_t i = 0; i < eager.size(); ++i) require_same(graph[i], eager[i]);
    }
  }
  REQUIRE(f.tracing_count() == 1);
  // Sizes the ops reject at run time raise eager's error, naming the function and the node.
  kiln::function add([](const tensor& a, const tensor& b) { return a + b; },
                     {.input_signature = std::vector<kiln::tensor_spec>{{{kiln::none}, kiln::float32}, {{kiln::none}, kiln::float32}}});
  kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return add(random_floats({3}, 27), random_floats({4}, 28)); },
                                                   {"in function", "node 'add'", "add", "(3,)", "(4,)"});
  require_same(add(random_floats({3}, 27), random_floats({1}, 28)), random_floats({3}, 27) + random_floats({1}, 28));
  // An unknown rank.
  kiln::function any_rank([](const tensor& a) { return a * a - 1.f; },
                          {.input_signature = std::vector<kiln::tensor_spec>{{kiln::unknown_rank, kiln::float32}}});
  for (const tensor& a : {random_floats({}, 29), random_floats({2, 3, 4}, 30), random_floats({7}, 31)}) require_same(any_rank(a), a * a - 1.f);
}

TEST_CASE("arguments of ever new shapes plan once where the shapes cannot matter", "[exec]") {
  // Past 32 plans an executor stops planning; the count below would be 32 if each
  // shape were planned.
  constexpr int shapes = 40;
  const auto vectors = std::vector<kiln::tensor_spec>{{{kiln::none}, kiln::float32}, {{kiln::none}, kiln::float32}};
  // An argument the graph does not read (a loop condition given the loop's growing
  // arrays): its shape does not change the plan.
  kiln::function ignores_second([](const tensor& x, const tensor&) { return x * 2.f; }, {.input_signature = vectors});
  const kiln::graph ignoring = ignores_second.get_concrete_function(kiln::tensor_spec({kiln::none}, kiln::float32),
                                                                    kiln::tensor_spec({kiln::none}, kiln::float32))
                                   .graph();
  kiln::detail::graph_executor by_x(ignoring);
  const tensor x = random_floats({5}, 48);
  for (int k = 0; k < shapes; ++k) require_same(by_x.run(tensors{x, random_floats({k}, 49)})[0], x * 2.f);
  CHECK(by_x.cached_plans() == 1);
  // A shape that depends on a value (a write past the end of a growing tensor_array
  // pads it): no shape of the arguments gives a plan, so one interpreted plan serves
  // them all.
  kiln::function pads([](const tensor& x, const tensor& rows) { return kiln::pad_rows(x, rows) + 1.f; },
                      {.input_signature = std::vector<kiln::tensor_spec>{{{kiln::none}, kiln::float32}, {{}, kiln::int64}}});
  const kiln::graph padding =
      pads.get_concrete_function(kiln::tensor_spec({kiln::none}, kiln::float32), kiln::tensor_spec({}, kiln::int64)).graph();
  kiln::detail::graph_executor by_value(padding);
  for (int k = 0; k < shapes; ++k) {
    const tensor v = random_floats({k}, std::uint32_t(50 + k)), rows = kiln::constant(std::int64_t(k + 2));
    require_same(by_value.run(tensors{v, rows})[0], kiln::pad_rows(v, rows) + 1.f);
  }
  CHECK(by_value.cached_plans() == 1);
  // An array that grows by a row at each call, padded and written as a loop's stacks
  // are: its length is no part of the plan, which runs planned (not node by node).
  kiln::function grows([](const tensor& stack, const tensor& i, const tensor& x) {
    return kiln::set_item(kiln::pad_rows(stack, i + 1), i, x * 2.f);
  }, {.input_signature = std::vector<kiln::tensor_spec>{{{kiln::none}, kiln::float32}, {{}, kiln::int64}, {{}, kiln::float32}}});
  const kiln::graph growing = grows.get_concrete_function(kiln::tensor_spec({kiln::none}, kiln::float32),
                                                          kiln::tensor_spec({}, kiln::int64), kiln::tensor_spec({}, kiln::float32))
                                  .graph();
  kiln::detail::graph_executor by_length(growing);
  for (int k = 0; k < shapes; ++k) {
    const tensor stack = random_floats({k}, std::uint32_t(100 + k)), i = kiln::constant(std::int64_t(k)),
                 x = kiln::constant(float(k));
    const tensors args{stack, i, x};
    CHECK(by_length.schedule(args) != "interpreted");
    require_same(by_length.run(args)[0], kiln::set_item(kiln::pad_rows(stack, i + 1), i, x * 2.f));
  }
  CHECK(by_length.cached_plans() == 1);
  // Shapes that do decide the plan still get one each.
  kiln::detail::graph_executor by_shape(ignoring);
  for (int k = 0; k < 3; ++k) require_same(by_shape.run(tensors{random_floats({k}, 51), x})[0], random_floats({k}, 51) * 2.f);
  CHECK(by_shape.cached_plans() == 3);
}

TEST_CASE("a cluster's last partial tile runs on its elements padded with the last one, in every element size", "[exec]") {
  // Padding with the last element keeps integer division away from the zeros a
  // padded lane would otherwise hold; sizes 1 to 17 end a tile anywhere.
  for (std::int64_t n = 1; n <= 17; ++n) {
    INFO(n << " elements");
    for (const kiln::dtype t : {kiln::int32, kiln::int64, kiln::float32, kiln::float64}) {
      INFO(kiln::name(t));
      const tensor x = random_tensor(t, {n}, std::uint32_t(60 + n)),
                   y = random_tensor(t, {n}, std::uint32_t(80 + n), kiln::testing::value_range::nonzero);
      require_graph_matches_eager([](const tensor& a, const tensor& b) { return tensors{kiln::floordiv(a * b + a, b) - a}; },
                                  x, y);
    }
    const tensor p = random_tensor(kiln::bool_, {n}, std::uint32_t(100 + n)), q = random_tensor(kiln::bool_, {n}, std::uint32_t(120 + n));
    require_graph_matches_eager(
        [](const tensor& a, const tensor& b) { return tensors{kiln::logical_or(kiln::logical_and(a, b), kiln::logical_not(a))}; },
        p, q);
  }
}

TEST_CASE("large clusters run over the thread pool with per-chunk scratch", "[exec]") {
  // Odd sizes so tiles and chunks end in the middle of rows.
  const tensor x = random_floats({517, 703}, 32), row = random_floats({703}, 33), col = random_floats({517, 1}, 34);
  require_graph_matches_eager(
      [](const tensor& x, const tensor& row, const tensor& col) {
        tensor a = kiln::tanh(x * 0.5f + row) * col;
        tensor b = kiln::where(a > 0.f, a, row - col);
        return tensors{b * x - 0.25f, kiln::reduce_sum(b, 0), a};
      },
      x, row, col);
  require_graph_matches_eager([](const tensor& x) { return tensors{kiln::cast(x * 7.f, kiln::int64) % 3 + 1}; },
                              random_floats({1 << 18}, 35));
}

TEST_CASE("several threads call one function at once", "[exec]") {
  auto fn = [](const tensor& x, const tensor& r) {
    tensor a = x * r + 1.f;
    return tensors{kiln::tanh(a) * kiln::reduce_sum(a), kiln::matmul(a, kiln::transpose(a)) - 2.f};
  };
  kiln::function f(fn, {.input_signature = std::vector<kiln::tensor_spec>{{{kiln::none, 8}, kiln::float32},
                                                                          {{8}, kiln::float32}}});
  constexpr int threads = 4, sizes = 6;
  std::vector<tensor> xs, expected_first, expected_second;
  const tensor r = random_floats({8}, 36);
  for (int k = 0; k < sizes; ++k) {
    xs.push_back(random_floats({k * 7 + 1, 8}, std::uint32_t(37 + k)));
    const tensors e = fn(xs.back(), r);
    expected_first.push_back(e[0]);
    expected_second.push_back(e[1]);
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int call = 0; call < 200; ++call) {
        const int k = (call + t) % sizes;
        const tensors got = f(xs[std::size_t(k)], r);
        const auto a = got[0].to_vector<float>(), b = expected_first[std::size_t(k)].to_vector<float>();
        const auto c = got[1].to_vector<float>(), d = expected_second[std::size_t(k)].to_vector<float>();
        if (a != b || c != d) ++mismatches;
      }
    });
  for (auto& th : pool) th.join();
  REQUIRE(mismatches == 0);
}

#if KILN_HAS_THRUST
TEST_CASE("gpu tensors run node by node", "[exec]") {
  const tensor x = random_floats({4, 5}, 43), row = random_floats({5}, 44);
  auto fn = [](const tensor& x, const tensor& row) { return tensors{kiln::tanh(x * row + 1.f) - kiln::reduce_sum(x)}; };
  kiln::function f(fn);
  const tensor got = f(x.to(kiln::device::gpu), row.to(kiln::device::gpu))[0];
  REQUIRE(got.device() == kiln::device::gpu);
  require_same(got.to(kiln::device::cpu), fn(x, row)[0]);
}
#endif

TEST_CASE("a call in steady state allocates only its outputs", "[exec]") {
  const tensor x = random_floats({32, 48}, 45), row = random_floats({48}, 46), col = random_floats({32, 1}, 47);
  kiln::function f([](const tensor& x, const tensor& row, const tensor& col) {
    tensor a = kiln::tanh(x * row + col) - 0.5f;              // a cluster
    tensor t = kiln::transpose(a * 2.f);                      // a kernel between clusters
    tensor m = kiln::reshape(t, {48 * 32}) + 1.f;             // a view, then a cluster
    tensor s = kiln::reduce_sum(kiln::reshape(a * a, {-1}));  // a reduction of a view of a cluster
    return std::make_tuple(m * s, a);
  });
  auto concrete = f.get_concrete_function(x, row, col);
  const kiln::graph g = kiln::detail::optimize(concrete.graph());
  kiln::detail::graph_executor executor(g);
  const std::vector<tensor> args{x, row, col};
  for (int warm = 0; warm < 3; ++warm) executor.run(args);
  for (int call = 0; call < 5; ++call) {
    const long before = allocations_on_this_thread;
    const std::vector<tensor> out = executor.run(args);
    const long during = allocations_on_this_thread - before;
    // The vector of outputs. The outputs' buffers, and the storages that own them,
    // come from the caching allocator.
    CHECK(during == 1);
  }
  REQUIRE(executor.cached_plans() == 1);
}

TEST_CASE("a training step in steady state allocates nothing", "[exec]") {
  // Forward, backward and Adam's update of a small MLP in one function: variable
  // reads and writes, reductions (some split over threads), and buffers of 64 KiB and
  // more, which the allocator keeps in its shared list rather than per thread.
  struct model {
    std::vector<kiln::variable> weights;
    kiln::optimizers::adam optimizer{{.learning_rate = 1e-3}};
  } m;
  const std::int64_t widths[] = {256, 128, 10};
  for (int l = 0; l < 2; ++l) {
    m.weights.emplace_back(random_floats({widths[l], widths[l + 1]}, 50 + l) * 0.1f);
    m.weights.emplace_back(kiln::zeros({widths[l + 1]}));
  }
  kiln::function step([&m](const tensor& x, const tensor& labels) {
    kiln::gradient_tape tape;
    const tensor h = kiln::relu(kiln::matmul(x, m.weights[0]) + m.weights[1]);
    const tensor logits = kiln::matmul(h, m.weights[2]) + m.weights[3];
    const tensor loss = kiln::reduce_mean(kiln::sparse_softmax_cross_entropy(labels, logits));
    m.optimizer.apply_gradients(tape.gradient(loss, m.weights), m.weights);
    return loss;
  });
  const tensor x = random_floats({128, 256}, 52);
  std::vector<std::int32_t> classes(128);
  for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = std::int32_t(i % 10);
  const tensor labels = kiln::constant(classes, kiln::shape{128});
  float last = step(x, labels).item<float>();
  for (int warm = 0; warm < 3; ++warm) last = step(x, labels).item<float>();
  for (int call = 0; call < 5; ++call) {
    const long before = allocations_on_this_thread;
    const tensor loss = step(x, labels);
    const long during = allocations_on_this_thread - before;
    CHECK(during == 0);
    // The step trains: the loss goes down.
    CHECK(loss.item<float>() < last);
    last = loss.item<float>();
  }
  CHECK(step.tracing_count() == 1);
}

TEST_CASE("a function's traces share their workspaces: many shapes hold about one trace's memory", "[exec]") {
  // Transposes and a reduction between elementwise clusters: the plan keeps their
  // results in workspace slots, which used to stay with every trace.
  kiln::function f([](const tensor& x) {
    const tensor t = kiln::transpose(kiln::exp(x * 0.5f), {1, 0});
    return kiln::reduce_sum(kiln::transpose(t * t + 1.f, {1, 0}) - x);
  });
  kiln::config::set_warning_stream(nullptr);  // it retraces on purpose
  const auto& allocator = kiln::detail::host_allocator();
  const std::size_t before = allocator.live_large_bytes();
  auto call = [&](std::int64_t rows) {
    const tensor x = random_floats({rows, 256}, std::uint32_t(rows));
    const float got = f(x).item<float>();
    const tensor e = kiln::exp(x * 0.5f);
    CHECK(got == Approx(kiln::reduce_sum(e * e + 1.f - x).item<float>()).epsilon(1e-4));
  };
  call(256);
  const std::size_t one_trace = allocator.live_large_bytes() - before;
  CHECK(one_trace > 0);
  for (std::int64_t rows = 257; rows < 277; ++rows) call(rows);
  CHECK(f.tracing_count() == 21);
  const std::size_t all_traces = allocator.live_large_bytes() - before;
  INFO("one trace holds " << one_trace << " bytes, 21 traces " << all_traces);
  CHECK(all_traces <= 2 * one_trace);
  kiln::config::set_warning_stream(&std::cerr);
}

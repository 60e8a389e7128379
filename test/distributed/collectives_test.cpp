// Collectives (kiln/distributed.hpp): every kind on every dtype it takes, eagerly and as
// nodes of a kiln::function, the float sum's rank order, groups, errors, and gradients.
// This file runs as one process (a world of one, each TEST_CASE alone) and whole under
// mpirun on 2 and 4 ranks (test/CMakeLists.txt): the expected values are formulas of
// the rank and the size, so the same assertions hold for every size.

#include <kiln/distributed.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "../support/op_check.hpp"
#include "world.hpp"

namespace {

using kiln::testing::require_throws;
using kiln::testing::world;

// The numeric dtypes a reduction takes, and a value of each from a small integer.
const kiln::dtype numeric_dtypes[] = {kiln::int32, kiln::int64, kiln::float32, kiln::float64};

kiln::tensor column(const std::vector<std::int64_t>& values, kiln::dtype t) {
  return kiln::cast(kiln::constant(values), t);
}
std::vector<double> as_doubles(const kiln::tensor& x) {
  return kiln::cast(x, kiln::float64).to_vector<double>();
}

}  // namespace

TEST_CASE("all_reduce sums, averages, and takes the max and min of every rank's tensor, on every numeric dtype") {
  const std::int64_t r = world().rank(), n = world().size();
  for (kiln::dtype t : numeric_dtypes) {
    INFO("dtype " << kiln::name(t));
    const kiln::tensor x = column({r + 1, 2 * (r + 1), 7 - r}, t);  // rank r's values
    const double sum1 = double(n * (n + 1) / 2);                  // the sum over the ranks of r + 1
    const double sum3 = double(7 * n - n * (n - 1) / 2);           // of 7 - r
    auto mean = [&](double sum) { return kiln::is_floating(t) ? sum / double(n) : double(std::int64_t(sum) / n); };

    const kiln::tensor sum = kiln::all_reduce(x);
    CHECK(sum.dtype() == t);
    CHECK(sum.shape() == kiln::shape{3});
    CHECK(as_doubles(sum) == std::vector<double>{sum1, 2 * sum1, sum3});
    CHECK(as_doubles(kiln::all_reduce(x, kiln::reduce_op::mean)) == std::vector<double>{mean(sum1), mean(2 * sum1), mean(sum3)});
    CHECK(as_doubles(kiln::all_reduce(x, kiln::reduce_op::max)) == std::vector<double>{double(n), double(2 * n), 7});
    CHECK(as_doubles(kiln::all_reduce(x, kiln::reduce_op::min)) == std::vector<double>{1, 2, double(7 - (n - 1))});
  }
}

TEST_CASE("an integer mean truncates toward zero, as reduce_mean's") {
  const std::int64_t r = world().rank(), n = world().size();
  // Rank r gives -(r + 1): the sum is -n(n+1)/2, and its mean truncates toward zero.
  const std::int64_t expected = -(n * (n + 1) / 2) / n;
  CHECK(kiln::all_reduce(kiln::constant(-(r + 1)), kiln::reduce_op::mean).item<std::int64_t>() == expected);
}

TEST_CASE("all_reduce of several tensors moves them as one bucket, each with its own result") {
  const std::int64_t r = world().rank(), n = world().size();
  const std::vector<kiln::tensor> xs{kiln::fill({2, 3}, float(r + 1)), kiln::fill({4}, float(10 * (r + 1))),
                                     kiln::fill({0}, 1.f), kiln::fill({}, float(r))};
  const std::vector<kiln::tensor> sums = kiln::all_reduce(xs, kiln::reduce_op::sum);
  REQUIRE(sums.size() == 4);
  const float total = float(n * (n + 1) / 2);
  CHECK(sums[0].shape() == kiln::shape{2, 3});
  CHECK(sums[0].to_vector<float>() == std::vector<float>(6, total));
  CHECK(sums[1].to_vector<float>() == std::vector<float>(4, 10 * total));
  CHECK(sums[2].shape() == kiln::shape{0});
  CHECK(sums[3].shape() == kiln::shape{});
  CHECK(sums[3].item<float>() == float(n * (n - 1) / 2));
  require_throws<kiln::type_error>([&] { return kiln::all_reduce({kiln::ones({2}), kiln::constant({1, 2})}); },
                                   {"kiln::all_reduce", "share a dtype", "float32", "int32"});
}

TEST_CASE("a float sum is taken in rank order, the same bits on every rank") {
  const int r = world().rank(), n = world().size();
  // Values whose sum depends on the order: 1e8, 1, -1e8, 1, 1e8, ... (float32, where
  // 1e8 + 1 rounds back to 1e8). Several elements, so that every rank sums a block.
  auto value = [](int rank) { return rank % 2 == 1 ? 1.f : (rank % 4 == 0 ? 1e8f : -1e8f); };
  float expected = value(0);
  for (int k = 1; k < n; ++k) expected += value(k);  // ((x0 + x1) + x2) + ...
  const kiln::tensor x = kiln::fill({5 * n + 3}, value(r));
  const kiln::tensor sum = kiln::all_reduce(x);
  for (float v : sum.to_vector<float>()) REQUIRE(v == expected);
  const kiln::tensor mean = kiln::all_reduce(x, kiln::reduce_op::mean);
  for (float v : mean.to_vector<float>()) REQUIRE(v == expected / float(n));
  // Every rank holds the same bits (as float64 values, which hold a float32's exactly).
  const kiln::tensor everyone = kiln::all_gather(kiln::reshape(kiln::cast(sum, kiln::float64), {1, 5 * n + 3}));
  const std::vector<double> rows = everyone.to_vector<double>();
  for (std::size_t i = 0; i < rows.size(); ++i) REQUIRE(rows[i] == double(expected));
}

TEST_CASE("all_gather stacks every rank's tensor along axis 0 in rank order, on every dtype") {
  const std::int64_t r = world().rank(), n = world().size();
  for (kiln::dtype t : numeric_dtypes) {
    const kiln::tensor g = kiln::all_gather(kiln::reshape(column({r, 10 * r}, t), {1, 2}));
    CHECK(g.shape() == kiln::shape{n, 2});
    std::vector<double> expected;
    for (std::int64_t k = 0; k < n; ++k) expected.insert(expected.end(), {double(k), double(10 * k)});
    CHECK(as_doubles(g) == expected);
  }
  const kiln::tensor flags = kiln::all_gather(kiln::constant({r % 2 == 0, true}));
  std::vector<bool> expected_flags;
  for (std::int64_t k = 0; k < n; ++k) expected_flags.insert(expected_flags.end(), {k % 2 == 0, true});
  CHECK(flags.dtype() == kiln::bool_);
  CHECK(flags.to_vector<bool>() == expected_flags);
  // Strings of different lengths on each rank.
  const kiln::tensor words = kiln::all_gather(kiln::constant(std::vector<std::string>{std::string(std::size_t(r), 'x'), "rank " + std::to_string(r)}));
  std::vector<std::string> expected_words;
  for (std::int64_t k = 0; k < n; ++k) expected_words.insert(expected_words.end(), {std::string(std::size_t(k), 'x'), "rank " + std::to_string(k)});
  CHECK(words.to_vector<std::string>() == expected_words);
}

TEST_CASE("broadcast gives every rank the root's tensor, on every dtype") {
  const std::int64_t r = world().rank(), n = world().size();
  const int root = int(n - 1);
  for (kiln::dtype t : numeric_dtypes) {
    const kiln::tensor b = kiln::broadcast(column({r, r + 5}, t), root);
    CHECK(b.dtype() == t);
    CHECK(as_doubles(b) == std::vector<double>{double(root), double(root + 5)});
  }
  CHECK(kiln::broadcast(kiln::constant(r == root), root).item<bool>());
  const kiln::tensor text = kiln::broadcast(kiln::constant(std::string(r == root ? "the root's words" : "ignored")), root);
  CHECK(text.to_vector<std::string>() == std::vector<std::string>{"the root's words"});
}

TEST_CASE("reduce_scatter gives rank r block r of the reduction, on every numeric dtype") {
  const std::int64_t r = world().rank(), n = world().size();
  for (kiln::dtype t : numeric_dtypes) {
    INFO("dtype " << kiln::name(t));
    // Rank s gives (s + 1) * [0, 1, ..., 2n - 1], as a (2n, 1) column.
    std::vector<std::int64_t> values;
    for (std::int64_t i = 0; i < 2 * n; ++i) values.push_back((r + 1) * i);
    const kiln::tensor x = kiln::reshape(column(values, t), {2 * n, 1});
    const kiln::tensor block = kiln::reduce_scatter(x);
    CHECK(block.shape() == kiln::shape{2, 1});
    const double total = double(n * (n + 1) / 2);
    CHECK(as_doubles(block) == std::vector<double>{total * double(2 * r), total * double(2 * r + 1)});
    CHECK(as_doubles(kiln::reduce_scatter(x, kiln::reduce_op::max)) ==
          std::vector<double>{double(n * 2 * r), double(n * (2 * r + 1))});
    if (kiln::is_floating(t))
      CHECK(as_doubles(kiln::reduce_scatter(x, kiln::reduce_op::mean)) ==
            std::vector<double>{total * double(2 * r) / double(n), total * double(2 * r + 1) / double(n)});
  }
  if (n > 1) {
    require_throws<kiln::invalid_argument_error>([&] { return kiln::reduce_scatter(kiln::ones({2 * n + 1})); },
                                                 {"kiln::reduce_scatter", "does not divide", std::to_string(n)});
  } else {  // every first dim divides into one block
    CHECK(kiln::reduce_scatter(kiln::ones({3})).to_vector<float>() == std::vector<float>(3, 1.f));
  }
}

TEST_CASE("a collective takes the dtypes TensorFlow's takes, and another raises a type_error naming it") {
  require_throws<kiln::type_error>([] { return kiln::all_reduce(kiln::constant(true)); },
                                   {"kiln::all_reduce", "bool"});
  require_throws<kiln::type_error>([] { return kiln::all_reduce(kiln::constant("a")); },
                                   {"kiln::all_reduce", "string"});
  require_throws<kiln::type_error>([] { return kiln::reduce_scatter(kiln::constant({true, false})); },
                                   {"kiln::reduce_scatter", "bool"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::all_gather(kiln::constant(1.f)); },
                                               {"kiln::all_gather", "scalar"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::broadcast(kiln::constant(1.f), 99); },
                                               {"kiln::broadcast", "root 99"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::all_reduce(kiln::tensor()); },
                                               {"kiln::all_reduce", "empty"});
  // While tracing: the dtype is a type_error, a shape a value_error (TensorFlow's kinds).
  kiln::function bad_dtype([](const kiln::tensor& x) { return kiln::all_reduce(x); });
  require_throws<kiln::type_error>([&] { return bad_dtype(kiln::constant(true)); }, {"kiln::all_reduce", "bool"});
  kiln::function bad_shape([](const kiln::tensor& x) { return kiln::all_gather(x); });
  require_throws<kiln::value_error>([&] { return bad_shape(kiln::constant(1)); }, {"kiln::all_gather", "scalar"});
}

TEST_CASE("inside a kiln::function a collective is a node that runs at every call") {
  const std::int64_t r = world().rank(), n = world().size();
  kiln::function f([](const kiln::tensor& x) {
    return std::tuple(kiln::all_reduce(x * 2.f), kiln::all_gather(x), kiln::broadcast(x, 0),
                      kiln::reduce_scatter(kiln::concat(std::vector<kiln::tensor>(std::size_t(kiln::distribute::communicator::world().size()), x), 0)));
  });
  for (int call = 1; call <= 2; ++call) {
    const auto [sum, gathered, root, block] = f(kiln::fill({1}, float(call * (r + 1))));
    CHECK(sum.item<float>() == float(2 * call * n * (n + 1) / 2));
    std::vector<float> expected;
    for (std::int64_t k = 0; k < n; ++k) expected.push_back(float(call * (k + 1)));
    CHECK(gathered.to_vector<float>() == expected);
    CHECK(root.item<float>() == float(call));
    CHECK(block.item<float>() == float(call * n * (n + 1) / 2));
  }
  CHECK(f.tracing_count() == 1);
  std::vector<std::string> ops;
  for (const kiln::node& node : f.get_concrete_function(kiln::fill({1}, 1.f)).graph().nodes()) ops.emplace_back(node.op());
  for (const char* op : {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastV2", "CollectiveReduceScatterV2"})
    CHECK(std::count(ops.begin(), ops.end(), std::string(op)) == 1);
}

TEST_CASE("a collective whose result no output needs still runs (it has effects)") {
  const std::int64_t n = world().size();
  kiln::function f([](const kiln::tensor& x) {
    (void)kiln::all_reduce(x);  // unused here, but every rank must take part
    return x + 1.f;
  });
  CHECK(f(kiln::constant(1.f)).item<float>() == 2.f);
  // The next collective pairs with the next, not with the unused one's leftovers.
  CHECK(kiln::all_reduce(kiln::constant(1.f)).item<float>() == float(n));
}

TEST_CASE("a group made by split runs its own collectives") {
  const int r = world().rank(), n = world().size();
  const kiln::distribute::communicator parity = world().split(r % 2);
  // The ranks of one parity, in rank order.
  std::vector<int> members;
  for (int k = r % 2; k < n; k += 2) members.push_back(k);
  CHECK(parity.size() == int(members.size()));
  CHECK(parity.rank() == r / 2);
  if (n > 1) CHECK(parity.members() == members);
  float expected = 0;
  for (int k : members) expected += float(k);
  CHECK(kiln::all_reduce(kiln::constant(float(r)), kiln::reduce_op::sum, parity).item<float>() == expected);
  const kiln::tensor first = kiln::broadcast(kiln::constant(r), 0, parity);
  CHECK(first.item<int>() == members.front());
  // Ranked by key: the order of all_gather follows it.
  const kiln::distribute::communicator reversed = world().split(0, n - r);
  std::vector<int> backwards;
  for (int k = n - 1; k >= 0; --k) backwards.push_back(k);
  CHECK(kiln::all_gather(kiln::constant({r}), reversed).to_vector<int>() == backwards);
  world().barrier();
}

TEST_CASE("the gradient of an all-sum is an all-sum, of an all-mean an all-mean") {
  const int r = world().rank(), n = world().size();
  kiln::variable w(kiln::constant({float(r + 1), -1.f}), "w");
  {
    kiln::gradient_tape tape;
    const kiln::tensor y = kiln::reduce_sum(kiln::all_reduce(w * w));
    // Every rank's y depends on w through the sum: d/dw of its own y is (1 from each of
    // the n ranks' sums, all-reduced: n) * 2w.
    CHECK(tape.gradient(y, w).to_vector<float>() == std::vector<float>{2.f * float(n) * float(r + 1), -2.f * float(n)});
  }
  {
    kiln::gradient_tape tape;
    const kiln::tensor y = kiln::reduce_sum(kiln::all_reduce(w * w, kiln::reduce_op::mean));
    CHECK(tape.gradient(y, w).to_vector<float>() == std::vector<float>{2.f * float(r + 1), -2.f});
  }
  {
    kiln::gradient_tape tape;
    const kiln::tensor y = kiln::reduce_sum(kiln::all_reduce(w * w, kiln::reduce_op::max));
    if (n == 1) {  // one rank: the collective is its input, a plain function of w
      CHECK(tape.gradient(y, w).to_vector<float>() == std::vector<float>{2.f * float(r + 1), -2.f});
    } else {
      require_throws<kiln::unavailable_error>([&] { return tape.gradient(y, w); },
                                              {"kiln::all_reduce", "reduce_op::max", "no gradient"});
    }
  }
}

TEST_CASE("the gradients of all_gather, broadcast and reduce_scatter") {
  const int r = world().rank(), n = world().size();
  kiln::variable w(kiln::constant({float(r + 1), 2.f}), "w");
  {  // y = sum(c * all_gather(w)) with c the row number + 1: dw is the sum over ranks of their c for this rank's block
    kiln::gradient_tape tape;
    const kiln::tensor gathered = kiln::all_gather(w.read_value());
    const kiln::tensor c = kiln::cast(kiln::floordiv(kiln::range(2 * n), 2) + 1, kiln::float32);
    const kiln::tensor y = kiln::reduce_sum(gathered * c);
    CHECK(tape.gradient(y, w).to_vector<float>() == std::vector<float>(2, float(n) * float(r + 1)));
  }
  {  // y = sum(broadcast(w, root)): the root's w feeds every rank's y; the others' none
    const int root = n - 1;
    kiln::gradient_tape tape;
    const kiln::tensor y = kiln::reduce_sum(kiln::broadcast(w.read_value(), root));
    const float expected = r == root ? float(n) : 0.f;
    CHECK(tape.gradient(y, w).to_vector<float>() == std::vector<float>(2, expected));
  }
  {  // y = sum(reduce_scatter(v)): each element of v reaches one rank's y once
    kiln::variable v(kiln::fill({2 * n}, float(r)), "v");
    kiln::gradient_tape tape;
    const kiln::tensor y = kiln::reduce_sum(kiln::reduce_scatter(v.read_value()));
    CHECK(tape.gradient(y, v).to_vector<float>() == std::vector<float>(std::size_t(2 * n), 1.f));
    kiln::gradient_tape mean_tape;
    const kiln::tensor z = kiln::reduce_sum(kiln::reduce_scatter(v.read_value(), kiln::reduce_op::mean));
    CHECK(mean_tape.gradient(z, v).to_vector<float>() == std::vector<float>(std::size_t(2 * n), 1.f / float(n)));
  }
}

TEST_CASE("gradients through collectives inside a kiln::function, traced and replayed") {
  const int r = world().rank(), n = world().size();
  kiln::variable w(kiln::constant(float(r + 1)), "w");
  // A tape inside the function: the backward collectives are nodes of the same graph.
  kiln::function grad([&](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    const kiln::tensor y = kiln::all_reduce(w * x);
    return tape.gradient(y, w);
  });
  CHECK(grad(kiln::constant(3.f)).item<float>() == 3.f * float(n));
  CHECK(grad(kiln::constant(5.f)).item<float>() == 5.f * float(n));
  // A function with collectives called under an eager tape: it has effects, so it runs
  // op by op for the tape, which records its collective through the replay.
  kiln::function forward([&](const kiln::tensor& x) { return kiln::all_reduce(w * x, kiln::reduce_op::mean); });
  kiln::gradient_tape tape;
  const kiln::tensor y = forward(kiln::constant(2.f));
  CHECK(y.item<float>() == 2.f * float(n + 1) / 2.f);
  CHECK(tape.gradient(y, w).item<float>() == 2.f);
}

#if KILN_HAS_THRUST
TEST_CASE("tensors on the gpu travel through host memory and come back to the gpu") {
  const std::int64_t r = world().rank(), n = world().size();
  const kiln::tensor x = kiln::fill({3}, float(r + 1)).to(kiln::device::gpu);
  const kiln::tensor sum = kiln::all_reduce(x);
  CHECK(sum.device() == kiln::device::gpu);
  CHECK(sum.to_vector<float>() == std::vector<float>(3, float(n * (n + 1) / 2)));
  require_throws<kiln::invalid_argument_error>(
      [&] { return kiln::all_reduce({x, kiln::ones({1})}); }, {"kiln::all_reduce", "one device"});
}
#endif

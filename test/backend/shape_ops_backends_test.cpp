// Every shape op, on every dtype, on every backend, against the reference backend:
// scalars, empty tensors, size-1 dims, negative axes, odd sizes that leave partial
// transpose tiles, and outputs large enough to be split over threads.

#include "../support/op_check.hpp"

using namespace kiln;

namespace {

constexpr dtype all_dtypes[] = {bool_, int32, int64, float32, float64, string};

/// Runs `op` on random inputs of `shapes`, for every dtype.
template <class Op>
void check_all_dtypes(const Op& op, const std::vector<shape>& shapes) {
  std::uint32_t seed = 1;
  for (dtype t : all_dtypes) {
    INFO("dtype " << name(t));
    std::vector<tensor> in;
    for (const shape& s : shapes) in.push_back(kiln::testing::random_tensor(t, s, seed++));
    kiln::testing::check_backends(op, in);
  }
}

/// Calls `check(t, d)` for every dtype `t` on every device `d` of this build (strings
/// only on the CPU: they never live on the GPU).
template <class F>
void for_each_dtype_and_device(F&& check) {
  std::vector<device> devices{device::cpu};
#if KILN_HAS_THRUST
  devices.push_back(device::gpu);
#endif
  for (dtype t : all_dtypes) {
    for (device d : devices) {
      if (d != device::cpu && t == string) continue;
      INFO("dtype " << name(t) << ", device " << name(d));
      check(t, d);
    }
  }
}

/// Random indices in [lowest, limit) of dtype `t`, drawn without kiln's kernels.
tensor random_indices(dtype t, const shape& s, std::int64_t limit, std::uint32_t seed, std::int64_t lowest = 0) {
  std::mt19937 gen(seed);
  std::vector<std::int64_t> values(std::size_t(s.num_elements()));
  for (auto& v : values) v = lowest + std::int64_t(gen() % std::uint64_t(limit - lowest));
  if (t == int64) return kiln::testing::make_tensor(values, s);
  return kiln::testing::make_tensor(std::vector<std::int32_t>(values.begin(), values.end()), s);
}

}  // namespace

TEST_CASE("transpose matches the reference on every backend") {
  struct test_case {
    shape x;
    int_list perm;
  };
  const std::vector<test_case> cases = {
      {{}, {}},
      {{7}, {0}},
      {{0, 3}, {1, 0}},
      {{3, 5}, {}},
      {{1, 1}, {1, 0}},
      {{33, 65}, {1, 0}},
      {{2, 3, 4}, {0, 2, 1}},
      {{2, 3, 4}, {2, 0, 1}},
      {{2, 3, 4}, {1, 0, 2}},
      {{2, 3, 4}, {0, 1, 2}},
      {{4, 1}, {1, 0}},
      {{2, 1, 3, 1, 5}, {4, 2, 0, 3, 1}},
      {{3, 4, 5, 6}, {3, 1, 2, 0}},
      {{2, 1, 2, 1, 2, 1, 2, 3}, {}},
      {{700, 513}, {1, 0}},            // tiled, several threads
      {{37, 2, 71, 45}, {2, 3, 0, 1}},  // tiled over merged dims
      {{300, 40, 33}, {1, 0, 2}},      // innermost dim kept: runs, several threads
      {{70001}, {0}},
  };
  for (const test_case& c : cases) {
    INFO("shape " << c.x << ", perm " << c.perm.str());
    check_all_dtypes(ops::transpose{c.perm}, {c.x});
  }
}

TEST_CASE("concat matches the reference on every backend") {
  struct test_case {
    std::vector<shape> inputs;
    std::int64_t axis;
  };
  const std::vector<test_case> cases = {
      {{{3}, {4}}, 0},
      {{{2, 3}, {2, 5}}, 1},
      {{{2, 3}, {2, 5}}, -1},
      {{{2, 3}, {4, 3}, {0, 3}}, 0},
      {{{2, 0, 4}, {2, 3, 4}, {2, 1, 4}}, 1},
      {{{2, 0, 4}, {2, 3, 4}, {2, 1, 4}}, -2},
      {{{3, 2}}, 1},
      {{{0, 0}, {0, 0}}, 1},
      {{{5, 1}, {5, 1}, {5, 1}, {5, 1}}, 1},
      {{{600, 300}, {600, 200}}, 1},
      {{{100000}, {50001}}, 0},
  };
  for (const test_case& c : cases) {
    INFO("case " << &c - cases.data() << ", axis " << c.axis);
    check_all_dtypes(ops::concat{c.axis}, c.inputs);
  }
}

TEST_CASE("stack matches the reference on every backend") {
  struct test_case {
    shape each;
    int count;
    std::int64_t axis;
  };
  const std::vector<test_case> cases = {
      {{}, 3, 0},        {{3}, 2, 1},       {{3}, 2, -1},     {{2, 3}, 2, 0},      {{2, 3}, 2, 1},
      {{2, 3}, 4, 2},    {{2, 3}, 2, -3},   {{0, 2}, 2, 1},   {{5}, 1, 0},         {{300, 400}, 2, 1},
      {{300, 400}, 3, 2},
  };
  for (const test_case& c : cases) {
    INFO("shape " << c.each << " x" << c.count << ", axis " << c.axis);
    check_all_dtypes(ops::stack{c.axis}, std::vector<shape>(std::size_t(c.count), c.each));
  }
}

TEST_CASE("gather matches the reference on every backend") {
  struct test_case {
    shape x, indices;
    std::int64_t axis;
  };
  const std::vector<test_case> cases = {
      {{5}, {3}, 0},          {{5, 3}, {}, 0},          {{4, 6}, {2, 3}, 1},     {{2, 3, 4}, {5}, -1},
      {{2, 3, 4}, {2, 2}, -2}, {{3, 4}, {0}, 0},         {{3, 0}, {4}, 0},        {{1000, 300}, {800}, 0},
      {{300, 1000}, {700}, 1}, {{7, 300, 9}, {400}, 1},
  };
  for (const test_case& c : cases) {
    INFO("x " << c.x << ", indices " << c.indices << ", axis " << c.axis);
    const std::int64_t limit = c.x[ops::normalize_axis(c.axis, c.x.rank())];
    for (dtype index_type : {int32, int64}) {
      std::uint32_t seed = 1;
      for (dtype t : all_dtypes) {
        INFO("dtype " << name(t) << ", indices " << name(index_type));
        kiln::testing::check_backends(ops::gather{c.axis}, {kiln::testing::random_tensor(t, c.x, seed),
                                                           random_indices(index_type, c.indices, limit, seed + 1)});
        seed += 2;
      }
    }
  }
}

TEST_CASE("unsorted_segment_sum matches the reference on every backend") {
  struct test_case {
    shape data;
    int ids_rank;
    std::int64_t axis, num_segments;
  };
  // Ids of the leading dims or of dims after `axis` (gather's gradient), scalar ids,
  // empty data, more segments than rows, and sizes split over threads.
  const std::vector<test_case> cases = {
      {{5}, 1, 0, 3},        {{5, 3}, 1, 0, 4},         {{4, 6}, 2, 0, 5},      {{2, 3, 4}, 1, 1, 3},
      {{2, 3, 4}, 1, 2, 7},  {{3, 4}, 0, 0, 2},         {{0, 4}, 1, 0, 3},      {{3, 0}, 1, 0, 2},
      {{1000, 300}, 1, 0, 90}, {{300, 1000}, 1, 1, 700}, {{7, 300, 9}, 1, 1, 40}, {{4000}, 1, 0, 1},
  };
  for (const test_case& c : cases) {
    INFO("data " << c.data << ", ids rank " << c.ids_rank << ", axis " << c.axis << ", segments " << c.num_segments);
    kiln::shape ids;
    for (int d = 0; d < c.ids_rank; ++d) ids.push_back(c.data[int(c.axis) + d]);
    for (dtype index_type : {int32, int64}) {
      std::uint32_t seed = 1;
      for (dtype t : {int32, int64, float32, float64}) {
        INFO("dtype " << name(t) << ", ids " << name(index_type));
        // Ids from -1 (dropped) to num_segments - 1.
        const tensor segment_ids = random_indices(index_type, ids, c.num_segments, seed + 1, -1);
        kiln::testing::check_backends(ops::unsorted_segment_sum{c.num_segments, c.axis},
                                      {kiln::testing::random_tensor(t, c.data, seed), segment_ids});
        seed += 2;
      }
    }
  }
}

TEST_CASE("slice matches the reference on every backend") {
  struct test_case {
    shape x;
    int_list begin, size;
  };
  const std::vector<test_case> cases = {
      {{}, {}, {}},
      {{7}, {2}, {3}},
      {{7}, {0}, {-1}},
      {{7}, {7}, {0}},
      {{4, 5}, {1, 2}, {2, -1}},
      {{4, 5}, {0, 0}, {4, 5}},
      {{4, 5}, {1, 0}, {2, 5}},
      {{4, 5}, {0, 3}, {4, 1}},
      {{3, 4, 5}, {1, 1, 1}, {1, 2, 3}},
      {{2, 3, 4}, {0, 1, 0}, {2, 1, 4}},
      {{2, 3, 4}, {0, 1, 0}, {2, 0, 4}},
      {{600, 700}, {10, 20}, {500, 600}},
      {{1000, 600}, {100, 0}, {800, -1}},
  };
  for (const test_case& c : cases) {
    INFO("shape " << c.x << ", begin " << c.begin.str() << ", size " << c.size.str());
    check_all_dtypes(ops::slice{c.begin, c.size}, {c.x});
  }
}

TEST_CASE("reshape, x[i] and shape_of give the same result on every backend") {
  check_all_dtypes(ops::reshape{{3, 2}}, {{2, 3}});
  check_all_dtypes(ops::reshape{{-1}}, {{2, 3, 4}});
  check_all_dtypes(ops::reshape{{}}, {{1, 1}});
  check_all_dtypes(ops::reshape{{0, 5}}, {{3, 0}});
  check_all_dtypes(ops::index{-1}, {{4, 3}});
  check_all_dtypes(ops::index{0}, {{2}});
  check_all_dtypes(ops::index{1}, {{2, 0}});
  check_all_dtypes(ops::shape_of{}, {{}});
  check_all_dtypes(ops::shape_of{}, {{0, 3, 5}});
}

TEST_CASE("set_item replaces one slice, on every dtype and device") {
  std::uint32_t seed = 100;
  for_each_dtype_and_device([&](dtype t, device d) {
    const tensor x = kiln::testing::random_tensor(t, {4, 3}, seed++).to(d);
    const tensor value = kiln::testing::random_tensor(t, {3}, seed++).to(d);
    for (std::int64_t i : {0, 2, 3}) {
      const tensor out = kiln::set_item(x, kiln::constant(i).to(d), value).to(device::cpu);
      REQUIRE(out.shape() == shape{4, 3});
      for (std::int64_t row = 0; row < 4; ++row)
        kiln::testing::require_same(out[row], (row == i ? value : x[row]).to(device::cpu));
    }
    // Scalar elements.
    const tensor scalar = kiln::testing::random_tensor(t, {}, seed++);
    const tensor column = kiln::set_item(kiln::testing::random_tensor(t, {1}, seed++).to(d), kiln::constant(0).to(d), scalar.to(d));
    kiln::testing::require_same(column.to(device::cpu), kiln::reshape(scalar, {1}));
  });
}

TEST_CASE("crop_or_pad cuts and pads from either end, on every dtype and device") {
  std::uint32_t seed = 300;
  // Rows from the start at -1 (a row of zeros first), columns from the end at 1
  // (the window's columns start at 1 + (4 - 3) = 2 and run one past x).
  for_each_dtype_and_device([&](dtype t, device d) {
    const tensor x = kiln::testing::random_tensor(t, {3, 4}, seed++).to(d);
    const tensor out = kiln::crop_or_pad(x, kiln::zeros({4, 3}).to(d), {-1, 1}, {0, 1}).to(device::cpu);
    REQUIRE(out.shape() == shape{4, 3});
    REQUIRE(out.dtype() == t);
    const tensor host = x.to(device::cpu);
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 3; ++j) {
        const std::int64_t row = i - 1, column = j + 2;
        kiln::testing::require_same(out[i][j], row >= 0 && column < 4 ? host[row][column] : kiln::zeros({}, t));
      }
    // A window that misses x altogether is zeros.
    kiln::testing::require_same(kiln::crop_or_pad(x, kiln::zeros({2, 2}).to(d), {5, 0}, {0, 0}).to(device::cpu),
                                kiln::zeros({2, 2}, t));
  });
}

TEST_CASE("pad_rows appends rows of zeros, on every dtype and device") {
  std::uint32_t seed = 200;
  for_each_dtype_and_device([&](dtype t, device d) {
    const tensor x = kiln::testing::random_tensor(t, {2, 3}, seed++).to(d);
    const tensor out = kiln::pad_rows(x, kiln::constant(4).to(d)).to(device::cpu);
    REQUIRE(out.shape() == shape{4, 3});
    for (std::int64_t row = 0; row < 4; ++row)
      kiln::testing::require_same(out[row], row < 2 ? x[row].to(device::cpu) : kiln::zeros({3}, t));
  });
}

// matmul and conv2d on every backend and numeric dtype, against the reference.

#include "../support/op_check.hpp"

using namespace kiln;
using kiln::testing::random_tensor;

TEST_CASE("matmul matches the reference on every backend") {
  const std::vector<std::pair<shape, shape>> cases = {
      {{1, 1}, {1, 1}},           {{2, 3}, {3, 4}},         {{10, 10}, {10, 10}},   {{17, 33}, {33, 9}},
      {{0, 3}, {3, 4}},           {{3, 0}, {0, 4}},         {{5, 7}, {7, 0}},       {{64, 130}, {130, 67}},
      {{2, 5, 6}, {6, 3}},        {{4, 1, 3, 5}, {2, 5, 2}}, {{3, 4, 8}, {3, 8, 5}}, {{200, 150}, {150, 170}},
  };
  for (dtype t : {int32, int64, float32, float64}) {
    std::uint32_t seed = 10;
    for (auto& [a, b] : cases) {
      INFO(name(t) << " " << a << " x " << b);
      // Long float32 dot products round differently with blocking and FMA.
      double rtol = t == float32 ? 1e-4 : -1;
      kiln::testing::check_backends(ops::matmul{}, {random_tensor(t, a, seed), random_tensor(t, b, seed + 1)}, rtol);
      seed += 2;
    }
  }
}

TEST_CASE("conv2d matches the reference on every backend") {
  struct conv_case {
    shape input, filters;
    std::int64_t sh, sw;
    ops::padding pad;
  };
  const std::vector<conv_case> cases = {
      {{1, 5, 5, 1}, {3, 3, 1, 1}, 1, 1, ops::padding::valid},  {{1, 5, 5, 1}, {3, 3, 1, 1}, 1, 1, ops::padding::same},
      {{2, 7, 6, 3}, {2, 3, 3, 4}, 2, 1, ops::padding::same},   {{2, 7, 6, 3}, {2, 3, 3, 4}, 2, 3, ops::padding::valid},
      {{1, 9, 9, 17}, {3, 3, 17, 19}, 1, 1, ops::padding::same}, {{1, 4, 4, 2}, {1, 1, 2, 5}, 1, 1, ops::padding::valid},
      {{3, 12, 10, 8}, {5, 3, 8, 16}, 2, 2, ops::padding::same}, {{1, 3, 3, 2}, {3, 3, 2, 2}, 4, 4, ops::padding::same},
      {{0, 5, 5, 2}, {3, 3, 2, 2}, 1, 1, ops::padding::valid},   {{1, 20, 20, 33}, {3, 3, 33, 35}, 1, 1, ops::padding::valid},
  };
  for (dtype t : {int32, int64, float32, float64}) {
    std::uint32_t seed = 100;
    for (const conv_case& c : cases) {
      INFO(name(t) << " " << c.input << " * " << c.filters << " strides " << c.sh << "," << c.sw);
      ops::conv2d op;
      op.stride_h = c.sh, op.stride_w = c.sw, op.pad = c.pad;
      double rtol = t == float32 ? 1e-4 : -1;
      kiln::testing::check_backends(op, {random_tensor(t, c.input, seed), random_tensor(t, c.filters, seed + 1)}, rtol);
      seed += 2;
    }
  }
}

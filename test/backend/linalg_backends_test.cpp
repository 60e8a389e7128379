// matmul and conv2d on every backend and numeric dtype, against the reference.

#include <limits>

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

TEST_CASE("pooling and its gradients' ops match the reference on every backend") {
  struct pool_case {
    shape input;
    ops::pool_window window;
  };
  using ops::padding;
  // Tiling windows (each gradient written once), overlapping ones, strides past the
  // windows, SAME padding on both sides, channels past a SIMD batch and an empty batch.
  const std::vector<pool_case> cases = {
      {{2, 4, 6, 3}, {2, 2, 2, 2, padding::valid}},    {{2, 5, 7, 3}, {2, 2, 2, 2, padding::valid}},
      {{1, 7, 6, 19}, {3, 3, 2, 2, padding::same}},    {{2, 6, 6, 4}, {3, 3, 1, 1, padding::same}},
      {{1, 9, 8, 5}, {2, 3, 3, 4, padding::valid}},    {{3, 5, 5, 33}, {3, 2, 1, 2, padding::same}},
      {{1, 4, 4, 2}, {1, 1, 1, 1, padding::valid}},    {{0, 4, 4, 2}, {2, 2, 2, 2, padding::valid}},
      {{2, 28, 28, 32}, {2, 2, 2, 2, padding::valid}}, {{1, 3, 3, 8}, {5, 5, 4, 4, padding::same}},
  };
  for (dtype t : {float32, float64})
    for (kiln::testing::value_range range : {kiln::testing::value_range::any, kiln::testing::value_range::small_nonnegative_integer}) {
      std::uint32_t seed = 200;
      for (const pool_case& c : cases) {
        const ops::pool_window& w = c.window;
        INFO(name(t) << " " << c.input << " window " << w.window_h << "x" << w.window_w << " strides " << w.stride_h << ","
                     << w.stride_w << (w.pad == padding::same ? " SAME" : " VALID") << " ties "
                     << (range != kiln::testing::value_range::any));
        // (small integers tie within windows: the first largest element takes the gradient)
        const tensor x = random_tensor(t, c.input, seed, range);
        const shape pooled = w.pooled_shape(c.input).value;
        const tensor dy = random_tensor(t, pooled, seed + 1), d = random_tensor(t, c.input, seed + 2);
        kiln::testing::check_backends(ops::max_pool{w}, {x});
        kiln::testing::check_backends(ops::avg_pool{w}, {x}, t == float32 ? 1e-6 : 1e-12);
        kiln::testing::check_backends(ops::max_pool_grad{w}, {x, dy}, t == float32 ? 1e-6 : 1e-12);
        kiln::testing::check_backends(ops::max_pool_grad_grad{w}, {x, d});
        kiln::testing::check_backends(ops::avg_pool_grad{w}, {x, dy}, t == float32 ? 1e-6 : 1e-12);
        seed += 3;
      }
    }
}

TEST_CASE("max pooling propagates NaN and gives its gradient to the first NaN of a window") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const tensor x = kiln::reshape(kiln::constant({1.0, nan, 3.0, 1.0, nan, 5.0, 4.0, 0.0}), {1, 2, 4, 1});
  const ops::pool_window w{2, 2, 2, 2, ops::padding::valid};
  kiln::testing::check_backends(ops::max_pool{w}, {x});
  kiln::testing::check_backends(ops::max_pool_grad{w}, {x, kiln::reshape(kiln::constant({1.0, 2.0}), {1, 1, 2, 1})});
  const std::vector<double> y = kiln::max_pool2d(x, 2, 2, "VALID").to_vector<double>();
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 4.0);
  // The first window's first NaN (row 0, column 1; another at row 1, column 0) takes
  // its gradient; the second window's maximum 4 (row 1, column 2) takes its own.
  kiln::gradient_tape tape;
  tape.watch(x);
  const tensor g = tape.gradient(kiln::max_pool2d(x, 2, 2, "VALID") * kiln::reshape(kiln::constant({1.0, 2.0}), {1, 1, 2, 1}), x);
  CHECK(g.to_vector<double>() == std::vector<double>{0, 1, 0, 0, 0, 0, 2, 0});
}

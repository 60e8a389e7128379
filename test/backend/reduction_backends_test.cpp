// Every reduction, on every dtype it accepts, on every backend, against the
// reference backend: all axes, one axis, negative axes, lists of axes, keepdims,
// scalars, empty tensors, sizes that are not a multiple of the SIMD width, and every
// kernel path (rows, short rows, columns in wide and narrow tiles, strided axes
// lists) at sizes that take the multi-threaded path.

#include "../support/op_check.hpp"

#include <limits>

using namespace kiln;

namespace {

struct reduction_case {
  shape input;
  reduction_axes axes;
  bool keepdims = false;
};

std::vector<reduction_case> reduction_cases() {
  return {
      {shape{}, {}},
      {shape{}, int_list{}},  // reduces nothing
      {shape{0}, {}},
      {shape{2, 0}, 1},  // empty reductions, non-empty output
      {shape{0, 3}, 0, true},
      {shape{7}, 0},
      {shape{37}, -1},
      {shape{3, 5}, 1},
      {shape{3, 5}, 0, true},
      {shape{3, 5}, {0, 1}},
      {shape{3, 5}, {-1, 0}, true},
      {shape{3, 5}, int_list{}},
      {shape{4, 1, 5}, 1},            // a size-1 axis: nothing to combine
      {shape{2, 3, 17}, {0, 2}},      // strided, contiguous innermost runs
      {shape{2, 3, 17}, 1},           // a column: one batch and a few single columns
      {shape{2, 3, 17}, -1, true},    // short rows
      {shape{3, 4, 5, 6}, {0, 2}},    // strided, strided innermost runs
      {shape{300, 257}, 0},           // wide column tiles and a tail
      {shape{300, 257}, 1},           // rows with a tail
      {shape{1000, 3}, 0},            // narrow columns over several leaves
      {shape{5000, 3}, 1},            // many short rows
      {shape{70001}, {}},             // one long row split over threads
      {shape{2, 100003}, 1},          // a few long rows, each split over threads
      {shape{70000, 20}, 0},          // a few long columns, each split over threads
      {shape{3, 40000, 19}, 1, true}, // (outer, rows, inner) columns
      {shape{300, 2, 300}, {0, 2}},   // strided, few outputs split over threads
      {shape{512, 130}, {}},          // everything, several leaves
  };
}

template <class Op>
void check_op() {
  std::uint32_t seed = 1;
  for (dtype t : {int32, int64, float32, float64}) {
    for (const reduction_case& c : reduction_cases()) {
      const Op op(c.axes, c.keepdims);
      INFO("dtype " << name(t) << ", shape " << c.input.str() << ", axes " << c.axes.str() << ", keepdims " << c.keepdims);
      if (std::is_same_v<Op, ops::argmax> && ops::reduced_count(c.input, c.axes) == 0) continue;  // an error, tested below
      // The reference adds floats in a wider type; a float32 pairwise sum of n terms
      // in [-3, 3] is off by about eps * sqrt(n) * 3 (a sequential one, by far more).
      const bool sum = Op::kind == ops::reduction_kind::sum || Op::kind == ops::reduction_kind::mean;
      const double rtol = sum && t == float32 ? 1e-6 * std::sqrt(double(ops::reduced_count(c.input, c.axes))) : -1;
      kiln::testing::check_backends(op, {kiln::testing::random_tensor(t, c.input, seed++)}, rtol);
    }
  }
}

template <class... Ops>
void check_every_reduction(boost::mp11::mp_list<Ops...>) {
  ([] { DYNAMIC_SECTION(Ops::name) { check_op<Ops>(); } }(), ...);
}

/// A float tensor with NaNs at `positions`.
template <class T>
tensor with_nans(const shape& s, std::initializer_list<std::int64_t> positions, std::uint32_t seed) {
  tensor x = kiln::testing::random_tensor(dtype_of<T>, s, seed);
  for (std::int64_t i : positions) x.view().as<T>()[i] = std::numeric_limits<T>::quiet_NaN();
  return x;
}

}  // namespace

TEST_CASE("every reduction matches the reference on every backend") { check_every_reduction(ops::reduction_ops{}); }

TEST_CASE("NaN wins max, min and argmax on every backend and path") {
  for (const reduction_case& c : {reduction_case{shape{70001}, {}}, reduction_case{shape{300, 257}, 0},
                                  reduction_case{shape{300, 257}, 1}, reduction_case{shape{5000, 3}, 1},
                                  reduction_case{shape{1000, 3}, 0}, reduction_case{shape{3, 4, 5, 6}, {0, 2}}}) {
    INFO("shape " << c.input.str() << ", axes " << c.axes.str());
    const std::int64_t n = c.input.num_elements();
    for (const tensor& x : {with_nans<float>(c.input, {3, n / 2, n / 2 + 7, n - 1}, 5), with_nans<double>(c.input, {0, n - 2}, 6)}) {
      kiln::testing::check_backends(ops::reduce_max(c.axes), {x});
      kiln::testing::check_backends(ops::reduce_min(c.axes), {x});
      kiln::testing::check_backends(ops::argmax(c.axes), {x});
    }
  }
}

TEST_CASE("argmax over an empty axis is rejected before any backend runs") {
  for (const shape& s : {shape{2, 0}, shape{0, 0}}) {
    const tensor x(float32, s);
    const std::vector<const tensor*> in{&x};
    using kiln::testing::require_throws;
    require_throws<invalid_argument_error>([&] { return detail::run_on<backend::reference_backend>(ops::argmax(1), in); },
                                           {"argmax", s.str()});
    require_throws<invalid_argument_error>([&] { return detail::run_on<backend::cpu_backend>(ops::argmax(1), in); },
                                           {"argmax", s.str()});
  }
}

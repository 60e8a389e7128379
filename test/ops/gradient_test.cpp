// kiln::gradient_tape on eager ops and inside kiln::function: a walk of the op
// registry that checks every op's gradient formula against central finite
// differences in float64, eagerly and in a graph, broadcasting included; then ties,
// several sources, persistent and nested tapes, stop_gradient, unconnected and
// integer sources.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <kiln/kiln.hpp>

#include "../support/op_check.hpp"

namespace {

using kiln::shape;
using kiln::tensor;
using kiln::testing::random_tensor;
using kiln::testing::value_range;

/// f's gradient at `x` by central differences, element by element (f gives a scalar).
tensor numeric_gradient(const std::function<tensor(const tensor&)>& f, const tensor& x) {
  const double h = 1e-6;
  std::vector<double> values = x.to_vector<double>(), grad(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::vector<double> up = values, down = values;
    up[i] += h;
    down[i] -= h;
    const double fu = f(kiln::testing::make_tensor(up, x.shape())).item<double>();
    const double fd = f(kiln::testing::make_tensor(down, x.shape())).item<double>();
    grad[i] = (fu - fd) / (2 * h);
  }
  return kiln::testing::make_tensor(grad, x.shape());
}

using unary_function = std::function<tensor(const tensor&)>;

/// The gradient of f(x) (summed, as a tape sums a target that is not a scalar) at `x`
/// from an eager tape and from a tape inside a kiln::function; both must match finite
/// differences (or `exact`, where given), and the graph's must equal the eager one.
void check_gradient(const unary_function& f, const tensor& x, const tensor& exact = {}) {
  kiln::gradient_tape tape;
  tape.watch(x);
  const tensor eager = tape.gradient(f(x), x);
  REQUIRE(eager.defined());
  if (exact.defined())
    kiln::testing::require_same(eager, exact, 0);
  else
    kiln::testing::require_same(eager, numeric_gradient([&](const tensor& v) { return kiln::reduce_sum(f(v)); }, x), 1e-6);

  kiln::function traced([&](const tensor& v) {
    kiln::gradient_tape inner;
    inner.watch(v);
    return inner.gradient(f(v), v);
  });
  kiln::testing::require_same(traced(x), eager, 1e-12);
}

tensor randoms(const shape& s, std::uint32_t seed, value_range range = value_range::any) {
  return random_tensor(kiln::float64, s, seed, range);
}

/// A function of one float64 tensor whose gradient exercises an op, the point at
/// which to check it, and the exact gradient where finite differences cannot tell it.
struct gradient_case {
  unary_function f;
  tensor at;
  tensor exact = {};
};

/// The finite-difference cases of each differentiable op of the registry, by the op's
/// name: each operand the op is differentiable in, broadcasting where the op does.
std::map<std::string_view, std::vector<gradient_case>> cases_by_op() {
  using kiln::constant;
  const tensor x = randoms({2, 3}, 1, value_range::nonzero), p = randoms({2, 3}, 2, value_range::positive);
  const tensor a = randoms({2, 3}, 3, value_range::nonzero), b = randoms({3}, 4, value_range::nonzero);
  const tensor m = randoms({2, 3}, 6), n = randoms({3, 4}, 7), batched = randoms({2, 2, 3}, 8);
  const tensor other = randoms({2, 3}, 9), weights = constant({1.0, -2.0, 3.0});
  const tensor image = randoms({2, 7, 6, 3}, 10), filters = randoms({3, 2, 3, 4}, 11);
  const tensor weights42 = randoms({4, 2}, 13), weights15 = randoms({1, 5}, 14);
  const kiln::ops::pool_window window{3, 3, 2, 2, kiln::ops::padding::same};  // image pooled to (2, 4, 3, 3)
  const tensor pooled = randoms({2, 4, 3, 3}, 15);
  // Binary ops: the gradient of each operand, the second broadcast along the rows.
  auto both_operands = [&](std::function<tensor(const tensor&, const tensor&)> op, const tensor& first) {
    return std::vector<gradient_case>{{[=](const tensor& v) { return op(v, b); }, first},
                                      {[=](const tensor& v) { return op(first, v); }, b}};
  };
  // (dividends and divisors whose quotients stay away from the integers, where
  // floormod jumps)
  const tensor dividend = constant({{5.3, -2.7, 7.9}, {0.4, 3.3, -5.9}}), divisor = constant({2.0, 1.5, -3.1});
  return {
      {"neg", {{[](const tensor& v) { return -v; }, x}}},
      {"abs", {{[](const tensor& v) { return kiln::abs(v); }, x}}},
      {"exp", {{[](const tensor& v) { return kiln::exp(v); }, x}}},
      {"log", {{[](const tensor& v) { return kiln::log(v); }, p}}},
      {"sqrt", {{[](const tensor& v) { return kiln::sqrt(v); }, p}}},
      {"square", {{[](const tensor& v) { return kiln::square(v); }, x}}},
      {"tanh", {{[](const tensor& v) { return kiln::tanh(v); }, x}}},
      {"sigmoid", {{[](const tensor& v) { return kiln::sigmoid(v); }, x}}},
      {"relu", {{[](const tensor& v) { return kiln::relu(v); }, x}}},
      // (relu's gradient: linear in dy, operand 1; y, operand 0, only selects)
      {"relu_grad", {{[=](const tensor& v) { return kiln::square(kiln::detail::apply(kiln::ops::relu_grad{}, x, v)); }, m}}},
      {"erf", {{[](const tensor& v) { return kiln::erf(v); }, x}}},
      {"gelu",
       {{[](const tensor& v) { return kiln::gelu(v); }, x}, {[](const tensor& v) { return kiln::gelu(v, true); }, x}}},
      {"softplus", {{[](const tensor& v) { return kiln::softplus(v); }, x}}},
      {"silu", {{[](const tensor& v) { return kiln::silu(v); }, x}}},
      {"elu", {{[](const tensor& v) { return kiln::elu(v); }, x}, {[](const tensor& v) { return kiln::elu(v, 0.5); }, x}}},
      {"leaky_relu", {{[](const tensor& v) { return kiln::leaky_relu(v); }, x}}},
      // Between floats the gradient comes back in the source's dtype. (Finite
      // differences through float32 would measure its rounding, not the slope.)
      {"cast",
       {{[](const tensor& v) { return kiln::cast(v, kiln::float32) * 3.f; }, x,
         kiln::testing::make_tensor(std::vector<double>(6, 3.0), x.shape())}}},
      {"add", both_operands([](const tensor& u, const tensor& v) { return u + v; }, a)},
      {"sub", both_operands([](const tensor& u, const tensor& v) { return u - v; }, a)},
      {"mul", both_operands([](const tensor& u, const tensor& v) { return u * v; }, a)},
      {"truediv", both_operands([](const tensor& u, const tensor& v) { return u / v; }, a)},
      {"maximum", both_operands([](const tensor& u, const tensor& v) { return kiln::maximum(u, v); }, a)},
      {"minimum", both_operands([](const tensor& u, const tensor& v) { return kiln::minimum(u, v); }, a)},
      {"pow", {{[=](const tensor& v) { return kiln::pow(v, b); }, p}, {[=](const tensor& v) { return kiln::pow(p, v); }, b}}},
      {"floormod",
       {{[=](const tensor& v) { return kiln::floormod(v, divisor); }, dividend},
        {[=](const tensor& v) { return kiln::floormod(dividend, v); }, divisor}}},
      {"select",
       {{[=](const tensor& v) { return kiln::where(a > 0.0, v, b); }, p},
        {[=](const tensor& v) { return kiln::where(a > 0.0, p, v); }, b}}},
      {"matmul",
       {{[=](const tensor& v) { return kiln::matmul(v, n); }, m},
        {[=](const tensor& v) { return kiln::matmul(m, v); }, n},
        {[=](const tensor& v) { return kiln::tanh(kiln::matmul(batched, v)); }, n}}},  // summed over the batch
      // Strides that leave input rows no output reads, and SAME padding on both sides.
      {"conv2d",
       {{[=](const tensor& v) { return kiln::square(kiln::conv2d(v, filters, {2, 2}, "VALID")); }, image},
        {[=](const tensor& v) { return kiln::square(kiln::conv2d(v, filters, {2, 3}, "SAME")); }, image},
        {[=](const tensor& v) { return kiln::square(kiln::conv2d(image, v, {1, 1}, "SAME")); }, filters},
        {[=](const tensor& v) { return kiln::square(kiln::conv2d(image, v, {3, 2}, "VALID")); }, filters}}},
      // Overlapping windows with SAME padding on both sides, and strides past the
      // windows; the gradients' ops in their linear operand (the output gradient).
      {"max_pool",
       {{[=](const tensor& v) { return kiln::square(kiln::max_pool2d(v, 3, 2, "SAME")); }, image},
        {[=](const tensor& v) { return kiln::square(kiln::max_pool2d(v, {2, 1}, {1, 3}, "VALID")); }, image}}},
      {"avg_pool",
       {{[=](const tensor& v) { return kiln::square(kiln::avg_pool2d(v, 3, 2, "SAME")); }, image},
        {[=](const tensor& v) { return kiln::square(kiln::avg_pool2d(v, {2, 1}, {1, 3}, "VALID")); }, image}}},
      {"max_pool_grad",
       {{[=](const tensor& v) { return kiln::square(kiln::detail::apply(kiln::ops::max_pool_grad{window}, image, v)); },
         pooled}}},
      {"max_pool_grad_grad",
       {{[=](const tensor& v) { return kiln::square(kiln::detail::apply(kiln::ops::max_pool_grad_grad{window}, image, v)); },
         randoms(image.shape(), 16)}}},
      {"avg_pool_grad",
       {{[=](const tensor& v) { return kiln::square(kiln::detail::apply(kiln::ops::avg_pool_grad{window}, image, v)); },
         pooled}}},
      {"reduce_sum", {{[](const tensor& v) { return kiln::reduce_sum(v, 1) * kiln::constant({1.0, -2.0}); }, m}}},
      {"reduce_mean",
       {{[](const tensor& v) { return kiln::square(kiln::reduce_mean(v, 0, true)); }, m},
        {[](const tensor& v) { return kiln::reduce_mean(kiln::square(v)); }, m}}},
      {"reduce_max",
       {{[](const tensor& v) { return kiln::reduce_max(v, 1) * kiln::constant({1.0, -2.0}); }, m},
        {[](const tensor& v) { return kiln::reduce_max(kiln::square(v)); }, batched}}},
      {"reduce_min", {{[](const tensor& v) { return kiln::reduce_min(v, 0, true) * kiln::constant({1.0, -2.0, 3.0}); }, m}}},
      {"reshape", {{[](const tensor& v) { return kiln::reshape(v, {3, 2}) * kiln::constant({1.0, 2.0}); }, m}}},
      {"transpose",
       {{[](const tensor& v) { return kiln::transpose(v) * kiln::constant({1.0, 2.0}); }, m},
        {[](const tensor& v) { return kiln::transpose(v, {1, 2, 0}) * kiln::constant({1.0, -1.0}); }, batched}}},
      {"concat",
       {{[=](const tensor& v) { return kiln::concat({v, kiln::square(v), other}, 0) * weights; }, m},
        {[](const tensor& v) {
           return kiln::concat({kiln::tanh(v), v}, -1) * kiln::constant({1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
         },
         m}}},
      {"stack",
       {{[=](const tensor& v) { return kiln::stack({v, kiln::square(v)}, 1) * weights; }, m},
        {[=](const tensor& v) { return kiln::stack({kiln::square(v), v}) * weights; }, m}}},
      {"slice",
       {{[](const tensor& v) { return kiln::square(kiln::slice(v, {0, 1}, {2, 2})); }, m},
        {[](const tensor& v) { return kiln::slice(v, {1, 0, 1}, {1, -1, 2}) * kiln::constant({3.0, -1.0}); }, batched}}},
      {"strided_slice",
       {{[](const tensor& v) { return kiln::square(v[1]); }, m},
        {[](const tensor& v) { return v[-2] * kiln::constant({1.0, -1.0, 2.0}); }, batched}}},
      // (a tensor array's write and growth)
      {"set_item",
       {{[](const tensor& v) { return kiln::square(kiln::set_item(v, kiln::constant(1), kiln::constant({1.0, 2.0, 3.0}))); },
         m},
        {[=](const tensor& v) { return kiln::square(kiln::set_item(m, kiln::constant(0), v)); }, b}}},
      {"pad_rows", {{[=](const tensor& v) { return kiln::pad_rows(v, kiln::constant(4)) * randoms({4, 3}, 12); }, m}}},
      // Padded in one dim and cropped in the other, from either end.
      {"crop_or_pad",
       {{[=](const tensor& v) { return kiln::crop_or_pad(v, kiln::zeros({4, 2}), {-1, 1}, {0, 0}) * weights42; }, m},
        {[=](const tensor& v) { return kiln::crop_or_pad(v, kiln::zeros({1, 5}), {0, 1}, {1, 1}) * weights15; }, m}}},
      // Repeated indices add their rows' gradients.
      {"gather",
       {{[](const tensor& v) { return kiln::square(kiln::gather(v, kiln::constant({1, 0, 1}))); }, m},
        {[](const tensor& v) { return kiln::square(kiln::gather(v, kiln::constant({{2, 0}, {2, 2}}), -1)); }, batched}}},
      // A negative id drops its row: that row's gradient is zero.
      {"unsorted_segment_sum",
       {{[](const tensor& v) { return kiln::square(kiln::unsorted_segment_sum(v, kiln::constant({2, -1}), 3)); }, m},
        {[](const tensor& v) {
           return kiln::square(kiln::unsorted_segment_sum(v, kiln::constant({{0, 1}, {1, 1}}), 2));
         },
         batched}}},
  };
}

/// Ops without a gradient, as in TensorFlow: integer, boolean and index results.
const std::set<std::string_view> not_differentiable = {
    "logical_not", "floordiv", "less", "less_equal", "greater", "greater_equal", "equal",
    "not_equal",   "logical_and", "logical_or", "shape", "argmax"};

/// Calls `f.template operator()<Op>()` for every op type of the registry.
template <class F>
void for_each_op(F&& f) {
  [&]<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    (f.template operator()<Ops>(), ...);
  }(static_cast<kiln::ops::all_ops*>(nullptr));
}

}  // namespace

TEST_CASE("every differentiable op of the registry matches finite differences, eagerly and in a graph") {
  const auto cases = cases_by_op();
  std::set<std::string_view> differentiable;
  for_each_op([&]<class Op>() {
    INFO("op " << Op::name);
    if constexpr (kiln::detail::differentiable<Op>) {
      differentiable.insert(Op::name);
      const auto found = cases.find(Op::name);
      REQUIRE(found != cases.end());
      for (std::size_t i = 0; i < found->second.size(); ++i) {
        INFO("case " << i);
        check_gradient(found->second[i].f, found->second[i].at, found->second[i].exact);
      }
    } else {
      CHECK(not_differentiable.contains(Op::name));
    }
  });
  for (const auto& [name, op_cases] : cases) {
    INFO("the cases of " << name << " are for an op with a formula");
    CHECK(differentiable.contains(name));
  }
}

TEST_CASE("max and min share the gradient among tied elements, as TensorFlow") {
  const tensor x = kiln::constant({1.f, 3.f, 3.f, -2.f});
  {
    kiln::gradient_tape tape;
    tape.watch(x);
    CHECK(tape.gradient(kiln::reduce_max(x), x).to_vector<float>() == std::vector<float>{0, 0.5f, 0.5f, 0});
  }
  const tensor y = kiln::constant({{1.f, -2.f, -2.f}, {4.f, 0.f, 4.f}});
  kiln::gradient_tape tape;
  tape.watch(y);
  CHECK(tape.gradient(kiln::reduce_min(y, 1), y).to_vector<float>() == std::vector<float>{0, 0.5f, 0.5f, 0, 1, 0});
}

TEST_CASE("a gradient tape follows TensorFlow's GradientTape") {
  const tensor x = kiln::constant(3.0f);

  SECTION("x * x at 3 has gradient 6, a non-scalar target is summed") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor v = kiln::constant({1.f, 2.f});
    const tensor y = x * x * v;  // [9, 18], summed: 27 x^2 / 9
    CHECK(tape.gradient(y, x).item<float>() == Approx(18.f));
  }
  SECTION("an unwatched tensor has no gradient; zeros on request") {
    kiln::gradient_tape tape({.persistent = true});
    const tensor y = x * x;
    CHECK_FALSE(tape.gradient(y, x).defined());
    const tensor z = tape.gradient(y, x, kiln::unconnected_gradients::zero);
    REQUIRE(z.defined());
    CHECK(z.item<float>() == 0.f);
  }
  SECTION("a non-persistent tape computes one set of gradients") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor y = x * x;
    (void)tape.gradient(y, x);
    kiln::testing::require_throws<kiln::invalid_argument_error>([&] { return tape.gradient(y, x); },
                                                                {"non-persistent", "persistent = true"});
  }
  SECTION("a persistent tape may be asked again, for several sources") {
    const tensor w = kiln::constant({{1.f, 2.f}, {3.f, 4.f}}), b = kiln::constant({1.f, -1.f});
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(w);
    tape.watch(b);
    const tensor loss = kiln::reduce_sum(kiln::matmul(kiln::constant({{1.f, 1.f}}), w) + b);
    const std::vector<tensor> first = tape.gradient(loss, {w, b}), second = tape.gradient(loss, {w, b});
    kiln::testing::require_same(first[0], kiln::constant({{1.f, 1.f}, {1.f, 1.f}}));
    kiln::testing::require_same(first[1], kiln::constant({1.f, 1.f}));
    kiln::testing::require_same(second[0], first[0]);
  }
  SECTION("stop_gradient cuts the path") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor y = x * kiln::stop_gradient(x);  // d/dx = x, not 2x
    CHECK(tape.gradient(y, x).item<float>() == Approx(3.f));
  }
  SECTION("integer paths have no gradient") {
    const tensor i = kiln::constant(3);
    kiln::gradient_tape tape({.persistent = true});
    tape.watch(i);
    tape.watch(x);
    const tensor y = kiln::cast(i, kiln::float32) * x + kiln::cast(kiln::cast(x, kiln::int32), kiln::float32);
    CHECK_FALSE(tape.gradient(y, i).defined());
    CHECK(tape.gradient(y, x).item<float>() == Approx(3.f));  // the int32 round trip adds nothing
  }
  SECTION("nested tapes give second derivatives") {
    kiln::gradient_tape outer;
    outer.watch(x);
    tensor dy;
    {
      kiln::gradient_tape inner;
      inner.watch(x);
      const tensor y = x * x * x;
      dy = inner.gradient(y, x);  // 3 x^2 = 27
    }
    CHECK(dy.item<float>() == Approx(27.f));
    CHECK(outer.gradient(dy, x).item<float>() == Approx(18.f));  // 6 x
  }
  SECTION("a used tensor keeps its gradient through a value it was copied into") {
    kiln::gradient_tape tape;
    tape.watch(x);
    const tensor copy = x;
    CHECK(tape.gradient(copy * 2.f, x).item<float>() == Approx(2.f));
  }
}

// Scalar arithmetic folded into the pass of the op next to it (exec::folded_arithmetic):
// which nodes fold and which may not, and results with eager's exact bits for every
// form of fold, dtype, operand kind and tiling, signed zeros and infinities included.

#include "../support/op_check.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

using kiln::tensor;
using kiln::testing::random_floats;
using kiln::testing::random_tensor;
using tensors = std::vector<tensor>;
namespace exec = kiln::detail::exec;

/// The instructions of the clusters of `fn`'s plan for `args`, as "[op+k ...]" where
/// k nodes are folded into the op's pass.
template <class F, class... Args>
std::string lowered_code(F fn, const Args&... args) {
  kiln::function f(fn);
  const kiln::graph g = kiln::detail::optimize(f.get_concrete_function(args...).graph());
  const exec::graph_outline outline(g);
  const tensors in{args...};
  const auto plan = exec::planner::build_plan(g, outline, in);
  std::string s;
  for (const exec::fused_cluster& c : plan->clusters) {
    s += "[";
    for (const exec::instruction& i : c.code) {
      if (&i != c.code.data()) s += ' ';
      s += i.native_name.substr(i.native_name.rfind(':') + 1);
      if (i.folded_ops) s += '+' + std::to_string(i.folded_ops);
      CHECK((i.compound != nullptr) == (i.folded_ops > 0));
    }
    s += "]";
  }
  return s;
}

/// Requires `fn` traced to give the bits `fn` gives eagerly (any NaN for a NaN).
template <class F, class... Args>
void require_bits_match_eager(F fn, const Args&... args) {
  kiln::function f(fn);
  const tensors eager = fn(args...);
  const tensors graph = f(args...);
  REQUIRE(graph.size() == eager.size());
  for (std::size_t k = 0; k < eager.size(); ++k) {
    INFO("output " << k);
    REQUIRE(graph[k].dtype() == eager[k].dtype());
    REQUIRE(graph[k].shape() == eager[k].shape());
    kiln::visit_dtype(eager[k].dtype(), [&]<class T>() {
      if constexpr (std::is_arithmetic_v<T>) {
        const std::vector<T> a = graph[k].to_vector<T>(), e = eager[k].to_vector<T>();
        for (std::size_t i = 0; i < e.size(); ++i) {
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(a[i]) && std::isnan(e[i])) continue;
            if (std::signbit(a[i]) != std::signbit(e[i])) FAIL("element " << i << ": the sign of " << a[i] << " differs");
          }
          if (!(a[i] == e[i] || (a[i] != a[i] && e[i] != e[i]))) FAIL("element " << i << ": " << a[i] << " != " << e[i]);
        }
      }
    });
  }
  SUCCEED();
}


tensors folded_chain(const tensor& x) { return {kiln::tanh(x * 0.5f + 1) * x - 0.25f}; }

}  // namespace

TEST_CASE("scalar arithmetic folds into the pass of the op next to it", "[exec][fold]") {
  const tensor x = random_floats({40, 33}, 1), y = random_floats({40, 33}, 2), z = random_floats({40, 33}, 3);
  const tensor s = random_floats({}, 4), row = random_floats({33}, 5), col = random_floats({40, 1}, 6);
  // The chain is one pass: a product and a sum before tanh, a product and a sum after.
  CHECK(lowered_code(folded_chain, x) == "[tanh+4]");
  // Before a unary op: a product, then a sum, with one-element operands.
  CHECK(lowered_code([](const tensor& x) { return kiln::exp(x * 0.5f - 1.f); }, x) == "[exp+2]");
  CHECK(lowered_code([](const tensor& x) { return kiln::tanh(2.f - x * 3.f); }, x) == "[tanh+2]");
  CHECK(lowered_code([](const tensor& x, const tensor& s) { return kiln::relu(s + x); }, x, s) == "[relu+1]");
  CHECK(lowered_code([](const tensor& x) { return kiln::exp((x + 1.f) * 2.f); }, x) == "[add exp+1]");
  // After a unary op: also cluster-shaped operands, computed before it.
  CHECK(lowered_code([](const tensor& x) { return kiln::tanh(x) * 2.f - 1.f; }, x) == "[tanh+2]");
  CHECK(lowered_code([](const tensor& x, const tensor& y) { return y - kiln::abs(x); }, x, y) == "[abs+1]");
  CHECK(lowered_code([](const tensor& x, const tensor& y, const tensor& z) { return kiln::sigmoid(x) * y + z; }, x, y, z) ==
        "[sigmoid+2]");
  CHECK(lowered_code([](const tensor& x, const tensor& r, const tensor& c) { return kiln::tanh(x) * r - c; }, x, row, col) ==
        "[tanh+2]");
  CHECK(lowered_code(
            [](const tensor& x) {
              tensor t = kiln::tanh(x);
              return t * kiln::exp(x);
            },
            x) == "[tanh exp+1]");
  // After a binary op: one-element operands only.
  CHECK(lowered_code([](const tensor& x, const tensor& y) { return (x + y) * 0.5f + 1.f; }, x, y) == "[add+2]");
  CHECK(lowered_code([](const tensor& x, const tensor& y, const tensor& z) { return (x + y) * z; }, x, y, z) ==
        "[add multiply]");
  // Nothing folds that is read twice, reaches memory, divides or follows a sum.
  CHECK(lowered_code(
            [](const tensor& x) {
              tensor u = x * 2.f;
              tensor t = kiln::tanh(u);
              return t + kiln::exp(u);
            },
            x) == "[multiply tanh exp+1]");
  CHECK(lowered_code(
            [](const tensor& x) {
              tensor u = x * 0.5f;
              return tensors{kiln::tanh(u + 1.f), u};
            },
            x) == "[multiply tanh+1]");
  CHECK(lowered_code([](const tensor& x) { return kiln::tanh(x / 3.f); }, x) == "[divide tanh]");
  CHECK(lowered_code([](const tensor& x) { return kiln::exp(-kiln::abs(x)); }, x) == "[abs negate exp]");
  CHECK(lowered_code([](const tensor& x) { return (kiln::exp(x) + 1.f) * 2.f; }, x) == "[exp+1 multiply]");
}

TEST_CASE("folded arithmetic computes eager's bits", "[exec][fold]") {
  auto forms = [](const tensor& x, const tensor& y, const tensor& s, const tensor& r) {
    return tensors{kiln::tanh(x * 0.5f + 1.f) * x - 0.25f,
                   kiln::exp(x * s - 1.f),
                   kiln::tanh(s - x * 3.f) * y + s,
                   kiln::sigmoid(x) * y - r,
                   y - kiln::abs(x) * s,
                   r - kiln::relu(s + x),
                   (x + y) * 0.5f + s,
                   kiln::maximum(x, r) - 2.f,
                   s - kiln::minimum(x, y) * 3.f,
                   kiln::tanh(x) * kiln::exp(y)};
  };
  SECTION("one tile, many tiles with a remainder, threads, a scalar") {
    for (kiln::shape sh : {kiln::shape{40, 33}, kiln::shape{3, 1001}, kiln::shape{700, 1000}, kiln::shape{}}) {
      INFO("shape " << sh.str());
      const kiln::shape rs = sh.rank() ? kiln::shape{sh[sh.rank() - 1]} : kiln::shape{};
      require_bits_match_eager(forms, random_floats(sh, 10), random_floats(sh, 11), random_floats({}, 12), random_floats(rs, 13));
    }
  }
  SECTION("signed zeros, infinities and NaNs") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> special{-0.f, 0.f, inf, -inf, nan, 1.f, -1.f, 1e-30f, -1e-30f, 3.f, -0.f, 0.f, 2.f, -2.f, inf, 0.5f};
    std::vector<float> mirrored(special.rbegin(), special.rend());
    const tensor x = kiln::constant(special, kiln::shape{16}), y = kiln::constant(mirrored, kiln::shape{16});
    for (float scalar : {-0.f, 0.f, inf, 1.f}) {
      INFO("scalar " << scalar);
      require_bits_match_eager(forms, x, y, kiln::constant(scalar), y);
    }
  }
  SECTION("float64, int32 and int64") {
    require_bits_match_eager(
        [](const tensor& x, const tensor& y) { return tensors{kiln::tanh(x * 0.5 + 1.0) * y - 0.25, 2.0 - kiln::sqrt(x * x + 1.0)}; },
        random_tensor(kiln::float64, {5, 77}, 14), random_tensor(kiln::float64, {5, 77}, 15));
    require_bits_match_eager(
        [](const tensor& a, const tensor& b) { return tensors{kiln::abs(a * 3 - 7) * b + 2, 5 - (a - b) * 2, kiln::square(a) - b}; },
        random_tensor(kiln::int32, {1000}, 16), random_tensor(kiln::int32, {1000}, 17));
    require_bits_match_eager([](const tensor& a, const tensor& b) { return tensors{(a - b) * 2 - 5, b - kiln::abs(a + 3)}; },
                             random_tensor(kiln::int64, {3, 100}, 18), random_tensor(kiln::int64, {3, 100}, 19));
  }
}

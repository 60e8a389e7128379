// What a gradient tape adds to a trace: only the gradients of inputs that lead back
// to a watched tensor. `x * 3` inside a function gives x's gradient `dy * 3`; the
// formula's other half, `x * dy` summed to the shape of the captured 3, would be
// traced for nothing and pruned again by the optimizer (each op of a long chain
// tripled the graph its gradient made).

#include <catch2/catch.hpp>

#include <string_view>

#include <kiln/kiln.hpp>

namespace {

int count_of_op(const kiln::graph& g, std::string_view op) {
  int count = 0;
  for (const kiln::node& n : g.nodes()) count += n.op() == op;
  return count;
}

}  // namespace

TEST_CASE("a tape traces the gradients of watched inputs only", "[gradient]") {
  kiln::function f([](const kiln::tensor& x) {
    kiln::gradient_tape tape;
    tape.watch(x);
    return tape.gradient(kiln::reduce_sum(x * 3.f), x);
  });
  const kiln::tensor x = kiln::ones({4});
  const kiln::graph g = f.get_concrete_function(x).graph();
  // The forward x * 3 and the backward dy * 3; no x * dy for the constant.
  CHECK(count_of_op(g, "mul") == 2);
  // The forward sum only: nothing sums a gradient down to the constant's shape.
  CHECK(count_of_op(g, "reduce_sum") == 1);
  const kiln::tensor dx = f(x);
  REQUIRE(dx.shape() == kiln::shape{4});
  for (int i = 0; i < 4; ++i) CHECK(dx.data<float>()[i] == 3.f);
}

TEST_CASE("a formula still gives every watched input its gradient", "[gradient]") {
  // Both operands watched: both halves of the product's formula run.
  const kiln::tensor a = kiln::constant({1.f, 2.f}), b = kiln::constant({3.f, 5.f});
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(a);
  tape.watch(b);
  const kiln::tensor y = kiln::reduce_sum(a * b / a * a);  // a * b in effect, by three ops
  const std::vector<kiln::tensor> g = tape.gradient(y, std::vector<kiln::tensor>{a, b});
  REQUIRE(g[0].defined());
  REQUIRE(g[1].defined());
  CHECK(g[0].data<float>()[0] == Approx(3.f));
  CHECK(g[0].data<float>()[1] == Approx(5.f));
  CHECK(g[1].data<float>()[0] == Approx(1.f));
  CHECK(g[1].data<float>()[1] == Approx(2.f));
  // One of them watched: the other's gradient is unconnected, as before.
  kiln::gradient_tape only_a;
  only_a.watch(a);
  const kiln::tensor z = kiln::reduce_sum(a * b);
  const std::vector<kiln::tensor> h = only_a.gradient(z, std::vector<kiln::tensor>{a, b});
  REQUIRE(h[0].defined());
  CHECK(h[0].data<float>()[1] == Approx(5.f));
  CHECK_FALSE(h[1].defined());
}

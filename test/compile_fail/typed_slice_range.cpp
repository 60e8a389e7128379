// A typed slice that does not lie within its operand names kiln::slice and the rule.
// expect-first-error: static assertion failed: kiln::slice: begin and size must lie within the operand's dims
// expect-early: fixed<float, 3, 4>
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  const auto x = kiln::fixed<float, 3, 4>::ones();
  auto y = kiln::slice<std::array{2, 0}, std::array{2, 4}>(x);
}

// Typed operands whose shapes do not broadcast: the first error line names the op
// and the rule, the dims follow at once.
// expect-first-error: static assertion failed: kiln::add: the operands' shapes do not broadcast
// expect-early: X = typed::symbol<float, typed::dims<2, 3> >; Y = typed::symbol<float, typed::dims<3, 2> >
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](const auto& x, const auto& y) { return x + y; });
  f(kiln::fixed<float, 2, 3>::ones(), kiln::fixed<float, 3, 2>::ones());
}

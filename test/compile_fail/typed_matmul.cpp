// A matmul whose inner dimensions differ is a compile error naming matmul and the rule.
// expect-first-error: static assertion failed: kiln::matmul: the inner dimensions must match
// expect-early: A = fixed<float, 8, 64>; B = fixed<float, 32, 64>
// max-lines: 40
#include <kiln/fixed.hpp>

auto y = kiln::matmul(kiln::fixed<float, 8, 64>::ones(), kiln::fixed<float, 32, 64>::ones());

// An op that does not take the operand's element type (tanh of integers).
// expect-first-error: static assertion failed: kiln::tanh: the operands' element types are not ones this op takes
// expect-early: X = fixed<int, 3>
// max-lines: 40
#include <kiln/fixed.hpp>

auto y = kiln::tanh(kiln::fixed<int, 3>::ones());

// A typed reduction over an axis the operand does not have.
// expect-first-error: static assertion failed: kiln::reduce_sum: an axis is out of range or listed twice
// expect-early: Axes = \{2\}; X = fixed<float, 2, 3>
// max-lines: 40
#include <kiln/fixed.hpp>

auto y = kiln::reduce_sum<2>(kiln::fixed<float, 2, 3>::ones());

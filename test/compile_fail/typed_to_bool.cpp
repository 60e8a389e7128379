// A C++ `if` on a symbolic typed value: the message names kiln::cond and kiln::while_loop.
// expect-first-error: static assertion failed: kiln: a symbolic typed value cannot be converted to bool while tracing; use kiln::cond or kiln::while_loop
// expect-early: with auto:[0-9]+ = kiln::typed::symbol<float, kiln::typed::dims<3> >
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](auto x) {
    if (kiln::reduce_sum(x) > 0.f) x = x * 2.f;
    return x;
  });
  f(kiln::fixed<float, 3>::ones());
}

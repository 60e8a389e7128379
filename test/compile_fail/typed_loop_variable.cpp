// A typed while_loop body that changes a loop variable's dims.
// expect-first-error: static assertion failed: kiln::while_loop: the body must give each loop variable its element type and dims
// expect-early: with auto:[0-9]+ = kiln::typed::symbol<float, kiln::typed::dims<3> >
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](const auto& x) {
    return kiln::while_loop([](const auto& v) { return kiln::reduce_sum(v) > 1.f; },
                            [](const auto& v) { return kiln::reduce_sum<0>(kiln::reshape<3, 1>(v), kiln::keep_dims); }, x);
  });
  f(kiln::fixed<float, 3>::ones());
}

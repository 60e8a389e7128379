// kiln::cond branches that give values of other dims, on typed values.
// expect-first-error: static assertion failed: kiln::cond: both branches must give values of the same element types and dims
// expect-early: with auto:[0-9]+ = kiln::typed::symbol<float, kiln::typed::dims<3> >
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](const auto& x) {
    return kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x; }, [&] { return kiln::reduce_sum(x); });
  });
  f(kiln::fixed<float, 3>::ones());
}

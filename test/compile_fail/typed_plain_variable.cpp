// A plain kiln::variable used with typed values: the message names fixed_variable.
// expect-first-error: static assertion failed: kiln: a kiln::variable cannot be used with fixed arguments; use kiln::fixed_variable
// max-lines: 40
#include <kiln/kiln.hpp>

int main() {
  kiln::variable v(1.f);
  kiln::function f([&](const auto& x) { return v * x; });
  f(kiln::fixed<float, 3>::ones());
}

// kiln/fixed.hpp alone has the compile-time tier: a kiln::function called with
// kiln::tensor arguments there says which header gives the runtime tier.
// expect-first-error: static assertion failed: kiln::function: a call with kiln::tensor arguments needs the runtime tier; include <kiln/kiln.hpp>
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](const auto& x) { return x * 2.f; });
  f(kiln::tensor(kiln::float32, kiln::shape{2}));
}

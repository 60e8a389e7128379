// Expression templates' `auto` pitfall: a variable holding an expression cannot be
// rebound, and the message says what to write instead.
// expect-first-error: static assertion failed: kiln: this variable holds an expression, whose type changes with every op, so it cannot be reassigned; declare it with the argument's type
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](auto x) {
    auto y = x * 2.f;
    y = y * 2.f;
    return y;
  });
  f(kiln::fixed<float, 3>::ones());
}

// A one-argument kiln::function called with two `fixed` values (the compile-time
// tier): the same first error, naming the `fixed` types.
// expect-first-error: static assertion failed: kiln::function: the callable does not accept arguments of these types
// expect: callable_does_not_accept\(\) \[with Args = \{kiln::fixed<float, 2>, kiln::fixed<int, 3>\}\]
// max-lines: 12
#include <kiln/kiln.hpp>

int main() {
  kiln::function f([](const auto& x) { return x * 2; });
  f(kiln::fixed<float, 2>::ones(), kiln::fixed<int, 3>::ones());
}

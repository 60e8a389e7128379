// A one-argument kiln::function called with two tensors: the first error says the
// callable does not take them, and the instantiation above it names their types.
// expect-first-error: static assertion failed: kiln::function: the callable does not accept arguments of these types
// expect: callable_does_not_accept\(\) \[with Args = \{kiln::tensor, kiln::tensor\}\]
// max-lines: 12
#include <kiln/kiln.hpp>

int main() {
  kiln::function f([](const kiln::tensor& x) { return x * 2; });
  f(kiln::constant(1.f), kiln::constant(2.f));
}

// get_concrete_function with specs the callable does not take: the same first error.
// expect-first-error: static assertion failed: kiln::function: the callable does not accept arguments of these types
// expect: callable_does_not_accept\(\) \[with Args = \{kiln::tensor_spec, kiln::tensor_spec\}\]
// max-lines: 12
#include <kiln/kiln.hpp>

int main() {
  kiln::function f([](const kiln::tensor& x) { return x * 2; });
  f.get_concrete_function(kiln::tensor_spec({}, kiln::float32), kiln::tensor_spec({}, kiln::float32));
}

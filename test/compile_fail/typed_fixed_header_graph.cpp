// kiln/fixed.hpp alone has the compile-time tier: the graph of a typed trace is a
// kiln::graph, which comes with the runtime tier, and the message says which header.
// expect-first-error: static assertion failed: kiln: graph\(\) of a typed trace needs the runtime tier; include <kiln/kiln.hpp>
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  kiln::function f([](const auto& x) { return x * 2.f; });
  f.get_concrete_function(kiln::spec<float, 2>{}).graph();
}

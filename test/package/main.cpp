// Prints kiln's version and a little of its API, so the package test can tell that the
// program was built against the kiln it meant to use.
#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  std::cout << "kiln " << KILN_VERSION_MAJOR << '.' << KILN_VERSION_MINOR << '.' << KILN_VERSION_PATCH
            << ": shape " << kiln::shape{2, 3} << ", dtype " << kiln::float32 << '\n';
}

// Prints kiln's version, a little of its API and how kiln reached it (the compiled
// library or header-only; Thrust's backend on or off), so the package test can tell
// that the program was built against the kiln it meant to use, the way it meant.
#include <kiln/kiln.hpp>

#include <iostream>

int main() {
#if defined(KILN_SEPARATE_COMPILATION)
  const char* mode = "compiled";
#else
  const char* mode = "header-only";
#endif
  std::cout << "kiln " << KILN_VERSION_MAJOR << '.' << KILN_VERSION_MINOR << '.' << KILN_VERSION_PATCH
            << ": shape " << kiln::shape{2, 3} << ", dtype " << kiln::float32 << ", " << mode
            << ", thrust " << KILN_HAS_THRUST << '\n';
}

// Placeholder for the tour of kiln: prints the library's version until the tour exists.
#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  std::cout << "kiln " << KILN_VERSION_MAJOR << '.' << KILN_VERSION_MINOR << '.' << KILN_VERSION_PATCH << '\n';
}

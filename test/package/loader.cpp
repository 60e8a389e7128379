// Serving as a user writes it: load a saved function and call it. This program calls
// none of its ops (conv2d, reshape, matmul, subtract, sqrt): linking kiln::kiln brings them.
#include <kiln/saved_function.hpp>

#include <iostream>

int main(int argc, char** argv) {
  const kiln::loaded_function f = kiln::load(argv[1]);
  const kiln::tensor x = kiln::constant(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}, kiln::shape{1, 3, 3, 1});
  std::cout << f.call_flat(x)[0].item<float>() << "\n";
}

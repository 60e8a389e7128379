// A typed model built for inputs of last dim 64 fed one of last dim 65: the error names
// the layer, and the line above it the input's shape and the one the layer was built for.
// expect-first-error: static assertion failed: kiln::layers::fixed_dense: the input's last dim is not the one the layer was built for
// expect-early: X = kiln::typed::symbol<float, kiln::typed::dims<8, 65> >; T = float; long int In = 64; long int Units = 16
// max-lines: 40
#include <kiln/fixed.hpp>
#include <kiln/models/fixed_layers.hpp>

int main() {
  namespace L = kiln::layers;
  auto mlp = L::fixed_sequential<kiln::fixed<float, 8, 64>>(L::fixed_dense<16, L::fixed_activations::relu>(), L::fixed_dense<4>());
  kiln::function forward([&](const auto& x) { return mlp(x); });
  auto y = forward(kiln::fixed<float, 8, 65>::ones());
}

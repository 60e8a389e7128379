// Typed conv2d whose filters take another number of channels names kiln::conv2d.
// expect-first-error: static assertion failed: kiln::conv2d: the input \(NHWC\) and filters \(HWIO\) do not fit
// expect-early: fixed<float, 3, 3, 2, 4>
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  const auto x = kiln::fixed<float, 1, 5, 5, 3>::ones();
  const auto f = kiln::fixed<float, 3, 3, 2, 4>::ones();
  auto y = kiln::conv2d(x, f);
}

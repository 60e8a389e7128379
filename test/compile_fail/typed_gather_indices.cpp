// Typed gather with float indices names kiln::gather and the dtypes it takes.
// expect-first-error: static assertion failed: kiln::gather: the indices must be int32 or int64
// expect-early: fixed<float, 2>
// max-lines: 40
#include <kiln/fixed.hpp>

int main() {
  const auto x = kiln::fixed<float, 3, 4>::ones();
  auto y = kiln::gather(x, kiln::fixed<float, 2>{0.f, 1.f});
}

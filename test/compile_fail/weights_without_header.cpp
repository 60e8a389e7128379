// save_weights without kiln/weights.hpp (HDF5): the message says what to include.
// expect-first-error: static assertion failed: kiln: save_weights and load_weights need #include <kiln/weights.hpp>
// max-lines: 30
#include <kiln/kiln.hpp>

int main() {
  kiln::layers::dense d(2);
  (void)d(kiln::ones({1, 3}));
  d.save_weights("w.h5");
}

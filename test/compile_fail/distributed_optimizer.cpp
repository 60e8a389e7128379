// data_parallel::optimizer given something that is not an optimizer: the first error
// says what it wraps (built where kiln::distributed exists).
// expect-first-error: static assertion failed: kiln::distribute::data_parallel::optimizer: wraps an optimizer, whose apply_gradients\(grads, vars\)
// expect: Optimizer = int
// max-lines: 14
#include <kiln/distributed.hpp>

int main() {
  kiln::distribute::data_parallel strategy;
  int not_an_optimizer = 0;
  (void)strategy.optimizer(not_an_optimizer);
}

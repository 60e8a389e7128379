// The guides' non-strict execution example (Introduction to graphs and tf.function
// "Non-strict execution"): eagerly every op runs, so an out-of-range tf.gather whose
// result nobody uses still raises; a graph runs only the ops that its outputs (and
// effects) need, so there the unused gather is skipped and no error is raised. Never
// depend on an error from an op a graph does not need.

#include <kiln/kiln.hpp>

#include <iostream>

namespace {

kiln::tensor unused_return_eager(const kiln::tensor& x) {
  // Get index 1 will fail when `len(x) == 1`
  (void)kiln::gather(x, kiln::constant({1}));  // unused
  return x;
}

}  // namespace

int main() {
  try {
    std::cout << unused_return_eager(kiln::constant({0.f})) << "\n";
  } catch (const kiln::invalid_argument_error& e) {
    // All operations are run during eager execution so an error is raised.
    std::cout << "kiln::invalid_argument_error: " << e.what() << "\n";
  }

  // @tf.function
  // def unused_return_graph(x):
  //   tf.gather(x, [1]) # unused
  //   return x
  // The same C++ code, traced into a graph.
  kiln::function unused_return_graph(unused_return_eager, {.name = "unused_return_graph", .arg_names = {"x"}});

  // Only needed operations are run during graph execution. The error is not raised.
  std::cout << unused_return_graph(kiln::constant({0.f})) << "\n";
}

// The guides' "C++ or tensor arguments?" examples: a new C++ value is a new signature, so
// it retraces, while tensors are keyed by dtype and shape only, so new values reuse the
// trace. Better performance with tf.function "Python or Tensor args?"
// (`train(num_steps)`, whose loop `for _ in tf.range(num_steps)` is kiln::for_range) and
// Introduction to graphs and tf.function "When is a Function tracing?"
// (`a_function_with_python_side_effect`).

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // kiln::print writes to standard error, as tf.print; the guides' notebooks show both
  // streams in order, and so does this program, on standard output.
  kiln::config::set_print_stream(std::cout);
  // def train_one_step(): pass
  auto train_one_step = [] {};

  // @tf.function
  // def train(num_steps):
  //   print("Tracing with num_steps = ", num_steps)
  //   tf.print("Executing with num_steps = ", num_steps)
  //   for _ in tf.range(num_steps):
  //     train_one_step()
  kiln::function train(
      [&](const auto& num_steps) {
        std::cout << "Tracing with num_steps = " << num_steps << "\n";
        kiln::print("Executing with num_steps =", num_steps);
        kiln::for_range(num_steps, [&](const kiln::tensor&) { train_one_step(); });
      },
      {.name = "train", .arg_names = {"num_steps"}});

  std::cout << "Retracing occurs for different C++ arguments.\n";
  train(10);
  train(20);

  std::cout << "\nTraces are reused for tensor arguments.\n";
  train(kiln::constant(10));
  train(kiln::constant(20));

  // @tf.function
  // def a_function_with_python_side_effect(x):
  //   print("Tracing!")  # An eager-only side effect.
  //   return x * x + tf.constant(2)
  kiln::function a_function_with_python_side_effect(
      [](const auto& x) {
        std::cout << "Tracing!\n";
        return x * x + kiln::constant(2);
      },
      {.name = "a_function_with_python_side_effect", .arg_names = {"x"}});

  // This is traced the first time.
  std::cout << a_function_with_python_side_effect(kiln::constant(2)) << "\n";
  // The second time through, you won't see the side effect.
  std::cout << a_function_with_python_side_effect(kiln::constant(3)) << "\n";

  // This retraces each time the C++ argument changes, as a C++ argument could be an
  // epoch count or other hyperparameter.
  std::cout << a_function_with_python_side_effect(2) << "\n";
  std::cout << a_function_with_python_side_effect(3) << "\n";
}

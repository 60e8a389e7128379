// The seeds' "C++ or tensor arguments?" examples: a new C++ value is a new signature,
// so it retraces, while tensors are keyed by dtype and shape only, so new values reuse
// the trace. 002 "Python or Tensor args?" (`train(num_steps)`) and 003 "When is a
// Function tracing?" (`a_function_with_python_side_effect`).
//
// The seeds' train loops `for _ in tf.range(num_steps): train_one_step()` over a
// train_one_step that does nothing; such a loop adds nothing to observe, so it is left
// out here (kiln::for_range is its C++ form). 001's version of this example also
// calls tf.print on every run ("Executing with num_steps = 10"), which needs kiln::print.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // @tf.function
  // def train(num_steps):
  //   print("Tracing with num_steps = {}".format(num_steps))
  kiln::function train([](const auto& num_steps) { std::cout << "Tracing with num_steps = " << num_steps << "\n"; },
                       {.name = "train", .arg_names = {"num_steps"}});

  train(10);
  train(20);

  // The simple workaround: pass tensors when the values do not shape the graph.
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

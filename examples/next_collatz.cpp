// The guides' input_signature examples (Better performance with tf.function "Controlling
// retracing", Better performance with tf.function): with an input signature a function
// traces once, for that signature; calls that do not fit it raise kiln::value_error
// naming the inputs and the signature, and a kiln::none dim accepts any size, so `g`
// serves sequences of every length with one trace.

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

int main() {
  // @tf.function(input_signature=(tf.TensorSpec(shape=[None], dtype=tf.int32),))
  // def next_collatz(x):
  //   print("Tracing with", x)
  //   return tf.where(x % 2 == 0, x // 2, 3 * x + 1)
  kiln::function next_collatz(
      [](const kiln::tensor& x) {
        std::cout << "Tracing with " << x << "\n";
        return kiln::where(x % 2 == 0, kiln::floordiv(x, 2), 3 * x + 1);
      },
      {.name = "next_collatz",
       .arg_names = {"x"},
       .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({kiln::none}, kiln::int32)}});

  std::cout << next_collatz(kiln::constant({1, 2})) << "\n";
  // You specified a 1-D tensor in the input signature, so this should fail.
  try {
    next_collatz(kiln::constant({{1, 2}, {3, 4}}));
  } catch (const kiln::value_error& e) {
    std::cout << "Caught expected exception \n  kiln::value_error: " << e.what() << "\n";
  }
  // You specified an int32 dtype in the input signature, so this should fail.
  try {
    next_collatz(kiln::constant({1.f, 2.f}));
  } catch (const kiln::value_error& e) {
    std::cout << "Caught expected exception \n  kiln::value_error: " << e.what() << "\n";
  }

  // @tf.function(input_signature=(tf.TensorSpec(shape=[None], dtype=tf.int32),))
  // def g(x):
  //   print('Tracing with', x)
  //   return x
  kiln::function g(
      [](const kiln::tensor& x) {
        std::cout << "Tracing with " << x << "\n";
        return x;
      },
      {.name = "g",
       .arg_names = {"x"},
       .input_signature = std::vector<kiln::tensor_spec>{kiln::tensor_spec({kiln::none}, kiln::int32)}});

  // No retrace!
  std::cout << g(kiln::constant({1, 2, 3})) << "\n";
  std::cout << g(kiln::constant({1, 2, 3, 4, 5})) << "\n";
}

// The guides' bound C++ arguments (Better performance with tf.function "Obtaining
// concrete functions", Better performance with tf.function): a C++ argument stays in a
// concrete function's signature with the value it was traced with; it may be left out of
// a call, and another value raises kiln::type_error.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // @tf.function
  // def pow(a, b):
  //   return a ** b
  kiln::function pow([](const kiln::tensor& a, int b) { return kiln::pow(a, b); }, {.name = "pow", .arg_names = {"a", "b"}});

  // square = pow.get_concrete_function(a=tf.TensorSpec(None, tf.float32), b=2)
  kiln::concrete_function square = pow.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::float32), 2);
  std::cout << square;

  // assert square(tf.constant(10.0)) == 100
  if (square(kiln::constant(10.f)).item<float>() != 100.f) return 1;

  try {
    square(kiln::constant(10.f), 3);
  } catch (const kiln::type_error& e) {
    std::cout << "Caught expected exception \n  kiln::type_error: " << e.what() << "\n";
  }
}

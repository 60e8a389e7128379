// The guides' first tf.function examples (Better performance with tf.function "Basics /
// Usage", Better performance with tf.function "A function is like an op" and "You can use
// functions inside functions"): `add` is a function like any op, and `dense_layer` calls
// it while it is traced itself, so the graph of dense_layer holds add's ops. Called under
// a gradient tape, `add` is differentiable like an op ("Functions have gradients").

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // @tf.function
  // def add(a, b):
  //   return a + b
  kiln::function add([](const kiln::tensor& a, const kiln::tensor& b) { return a + b; },
                     {.name = "add", .arg_names = {"a", "b"}});

  std::cout << add(kiln::ones({2, 2}), kiln::ones({2, 2})) << "\n";  //  [[2., 2.], [2., 2.]]

  // v = tf.Variable(1.0)
  // with tf.GradientTape() as tape:
  //   result = add(v, 1.0)
  // tape.gradient(result, v)
  kiln::variable v(1.f);
  kiln::gradient_tape tape;
  kiln::tensor result = add(v, kiln::constant(1.f));
  std::cout << tape.gradient(result, v) << "\n";  // 1.0

  // @tf.function
  // def dense_layer(x, w, b):
  //   return add(tf.matmul(x, w), b)
  kiln::function dense_layer(
      [&](const kiln::tensor& x, const kiln::tensor& w, const kiln::tensor& b) { return add(kiln::matmul(x, w), b); },
      {.name = "dense_layer", .arg_names = {"x", "w", "b"}});

  std::cout << dense_layer(kiln::ones({3, 2}), kiln::ones({2, 2}), kiln::ones({2})) << "\n";
}

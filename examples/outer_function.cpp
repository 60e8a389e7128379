// The guides' first graphs (Introduction to graphs and tf.function "Taking advantage of
// graphs"): a function made from a regular C++ function computes what the regular
// function computes, and a function traces every function it calls: outer_function's
// graph holds the ops of the plain C++ function it calls.

#include <kiln/kiln.hpp>

#include <iostream>

namespace {

// def a_regular_function(x, y, b):
//   x = tf.matmul(x, y)
//   x = x + b
//   return x
kiln::tensor a_regular_function(const kiln::tensor& x, const kiln::tensor& y, const kiln::tensor& b) {
  return kiln::matmul(x, y) + b;
}

}  // namespace

int main() {
  // `a_function_that_uses_a_graph` is a kiln::function.
  kiln::function a_function_that_uses_a_graph(a_regular_function, {.name = "a_regular_function"});

  kiln::tensor x1 = kiln::constant({{1.f, 2.f}});
  kiln::tensor y1 = kiln::constant({{2.f}, {3.f}});
  kiln::tensor b1 = kiln::constant(4.f);

  auto orig_value = a_regular_function(x1, y1, b1).to_vector<float>();
  // Call a kiln::function like a C++ function.
  auto tf_function_value = a_function_that_uses_a_graph(x1, y1, b1).to_vector<float>();
  if (orig_value != tf_function_value) return 1;  // assert(orig_value == tf_function_value)

  // @tf.function
  // def outer_function(x):
  //   y = tf.constant([[2.0], [3.0]])
  //   b = tf.constant(4.0)
  //   return inner_function(x, y, b)
  // (The guide's inner_function has a_regular_function's body.)
  kiln::function outer_function(
      [](const kiln::tensor& x) {
        kiln::tensor y = kiln::constant({{2.f}, {3.f}});
        kiln::tensor b = kiln::constant(4.f);
        return a_regular_function(x, y, b);
      },
      {.name = "outer_function", .arg_names = {"x"}});

  // Note that the callable will create a graph that includes `inner_function` as
  // well as `outer_function`.
  std::cout << outer_function(kiln::constant({{1.f, 2.f}})) << "\n";
}

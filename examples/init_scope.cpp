// The guides' "Creating tf.Variables" counter (Better performance with tf.function): a
// C++ counter that guards a variable's increment is read while tracing only, so the
// traced graph increments the variable at every call (1, 2, 3). kiln::init_scope, as
// tf.init_scope, lifts the increment out of the graph: it runs once, while tracing (1, 1,
// 1).

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // class Model(tf.Module):
  //   def __init__(self):
  //     self.v = tf.Variable(0)
  //     self.counter = 0
  //   @tf.function
  //   def __call__(self):
  //     if self.counter == 0:
  //       # A python side-effect
  //       self.counter += 1
  //       self.v.assign_add(1)
  //     return self.v
  struct model {
    kiln::variable v{0};
    int counter = 0;
  } m;
  kiln::function call(
      [&m] {
        if (m.counter == 0) {
          // A C++ side effect
          m.counter += 1;
          m.v.assign_add(1);
        }
        return m.v.read_value();
      },
      {.name = "Model"});
  for (int n = 0; n < 3; ++n) std::cout << call().item<std::int32_t>() << "\n";  // prints 1, 2, 3

  // The same model, with the increment under tf.init_scope():
  //       with tf.init_scope():
  //         self.counter += 1
  //         self.v.assign_add(1)
  model lifted;
  kiln::function lifted_call(
      [&lifted] {
        if (lifted.counter == 0) {
          // Lifts ops out of function-building graphs
          kiln::init_scope scope;
          lifted.counter += 1;
          lifted.v.assign_add(1);
        }
        return lifted.v.read_value();
      },
      {.name = "Model"});
  for (int n = 0; n < 3; ++n) std::cout << lifted_call().item<std::int32_t>() << "\n";  // prints 1, 1, 1
}

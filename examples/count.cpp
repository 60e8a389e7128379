// The seeds' "Creating tf.Variables" (001) and "Automatic control dependencies" (002):
// a variable created at every call is an error; the singleton pattern creates it on
// the first trace only; reads and writes of variables run in program order.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // @tf.function
  // def f(x):
  //   v = tf.Variable(1.0)
  //   return v
  kiln::function f(
      [](const kiln::tensor&) {
        kiln::variable v(1.f);
        return v.read_value();
      },
      {.name = "f"});
  try {
    f(kiln::constant(1.f));
    return 1;
  } catch (const kiln::value_error& e) {
    std::cout << "Caught expected exception kiln::value_error:\n  " << e.what() << "\n";
  }

  // class Count(tf.Module):
  //   def __init__(self):
  //     self.count = None
  //   @tf.function
  //   def __call__(self):
  //     if self.count is None:
  //       self.count = tf.Variable(0)
  //     return self.count.assign_add(1)
  struct counter {
    kiln::variable count;
  } state;
  kiln::function c(
      [&state] {
        if (!state.count) state.count = kiln::variable(0);
        return state.count.assign_add(1);
      },
      {.name = "Count"});
  std::cout << c() << "\n";
  std::cout << c() << "\n";

  // a = tf.Variable(1.0)
  // b = tf.Variable(2.0)
  // @tf.function
  // def f(x, y):
  //   a.assign(y * b)
  //   b.assign_add(x * a)
  //   return a + b
  // f(1.0, 2.0)  # 10.0
  kiln::variable a(1.f), b(2.f);
  kiln::function g(
      [&](const kiln::tensor& x, const kiln::tensor& y) {
        a.assign(y * b);
        b.assign_add(x * a);
        return a + b;
      },
      {.name = "f"});
  std::cout << g(kiln::constant(1.f), kiln::constant(2.f)) << "\n";
}

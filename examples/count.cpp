// The guides' "Creating tf.Variables" (Better performance with tf.function) and
// "Automatic control dependencies" (Better performance with tf.function): a variable
// created at every call is an error; the singleton pattern creates it on the first trace
// only; reads and writes of variables run in program order; a variable's initial value
// may come from the arguments and other variables (Better performance with tf.function
// "Variables").

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

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

  // Variable initializers can depend on function arguments and on values of other
  // variables; they run, in program order, when the graph first runs.
  // state = []
  // @tf.function
  // def fn(x):
  //   if not state:
  //     state.append(tf.Variable(2.0 * x))
  //     state.append(tf.Variable(state[0] * 3.0))
  //   return state[0] * x * state[1]
  std::vector<kiln::variable> variables;
  kiln::function fn(
      [&variables](const kiln::tensor& x) {
        if (variables.empty()) {
          variables.emplace_back(2.f * x);
          variables.emplace_back(variables[0] * 3.f);
        }
        return variables[0] * x * variables[1];
      },
      {.name = "fn"});
  std::cout << fn(kiln::constant(1.f)) << "\n";
  std::cout << fn(kiln::constant(3.f)) << "\n";
}

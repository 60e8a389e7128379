// The guides' "Depending on Python global and free variables" (Better performance with
// tf.function "Known issues"): a captured C++ value is read while tracing and baked into
// the graph, so changing it later changes nothing; a C++ argument is part of the
// signature, so a new value retraces and is seen. A captured kiln::variable, by contrast,
// is read at every call.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  int foo = 1;

  // @tf.function
  // def buggy_add():
  //   return 1 + foo
  kiln::function buggy_add([&] { return 1 + foo; }, {.name = "buggy_add"});

  // @tf.function
  // def recommended_add(foo):
  //   return 1 + foo
  kiln::function recommended_add([](int value) { return 1 + value; }, {.name = "recommended_add", .arg_names = {"foo"}});

  std::cout << "Buggy: " << buggy_add() << "\n";
  std::cout << "Correct: " << recommended_add(foo) << "\n";

  std::cout << "Updating the value of `foo` to 100!\n";
  foo = 100;
  std::cout << "Buggy: " << buggy_add() << "\n";  // Did not change!
  std::cout << "Correct: " << recommended_add(foo) << "\n";

  // Another way to update a global value is to make it a variable and assign to it.
  // @tf.function
  // def variable_add():
  //   return 1 + foo
  kiln::variable foo_variable(1, "foo");
  kiln::function variable_add([&] { return 1 + foo_variable; }, {.name = "variable_add"});
  std::cout << "Variable: " << variable_add() << "\n";
  std::cout << "Updating the value of `foo` to 100!\n";
  foo_variable.assign(100);
  std::cout << "Variable: " << variable_add() << "\n";
}

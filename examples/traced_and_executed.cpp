// The guides' "Executing Python side effects" (Better performance with tf.function): a
// C++ side effect (std::cout) runs only while tracing, kiln::print at every call;
// kiln::host_callback runs C++ code at every call (tf.py_function), on concrete tensors.

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

int main() {
  // kiln::print writes to standard error, as tf.print; the guides' notebooks show both
  // streams in order, and so does this program, on standard output.
  kiln::config::set_print_stream(std::cout);
  // @tf.function
  // def f(x):
  //   print("Traced with", x)
  //   tf.print("Executed with", x)
  kiln::function f(
      [](int x) {
        std::cout << "Traced with " << x << "\n";
        kiln::print("Executed with", x);
      },
      {.name = "f", .arg_names = {"x"}});
  f(1);
  f(1);
  f(2);  // a new C++ value: a new trace

  // external_list = []
  // def side_effect(x):
  //   print('Python side effect')
  //   external_list.append(x)
  // @tf.function
  // def f(x):
  //   tf.py_function(side_effect, inp=[x], Tout=[])
  std::vector<kiln::tensor> external_list;
  auto side_effect = [&](const kiln::tensor& x) {
    std::cout << "C++ side effect\n";
    external_list.push_back(x);
  };
  kiln::function g([&](const kiln::tensor& x) { kiln::host_callback(side_effect, {}, x); }, {.name = "f"});
  g(kiln::constant(1));
  g(kiln::constant(1));
  g(kiln::constant(1));
  std::cout << "len(external_list) = " << external_list.size() << ", external_list[0] = " << external_list[0] << "\n";
  return external_list.size() == 3 && external_list[0].to_vector<std::int32_t>()[0] == 1 ? 0 : 1;
}

// The guides' concrete functions (Better performance with tf.function, "Obtaining
// concrete functions" and "Obtaining graphs"): get_concrete_function traces `double` for
// strings without running it, the concrete function runs that one graph, prints its
// signature, gives its input and output specs and its graph, and rejects a tensor of
// another dtype.
//
// In the guide, `double` had already been traced for strings by the cells before, so
// there "Obtaining concrete trace" is not followed by a "Tracing with" line; this program
// starts afresh, and get_concrete_function is where it traces.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  kiln::function dbl(
      [](const kiln::tensor& a) {
        std::cout << "Tracing with " << a << "\n";
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});

  std::cout << "Obtaining concrete trace\n";
  kiln::concrete_function double_strings = dbl.get_concrete_function(kiln::constant("a"));
  std::cout << "Executing traced function\n";
  std::cout << double_strings(kiln::constant("a")) << "\n";
  std::cout << double_strings(kiln::constant("b")) << "\n";

  // You can also call get_concrete_function on an InputSpec: the same signature, so
  // the same trace.
  kiln::concrete_function double_strings_from_inputspec = dbl.get_concrete_function(kiln::tensor_spec({}, kiln::string));
  std::cout << double_strings_from_inputspec(kiln::constant("c")) << "\n";

  // print(double_strings)
  std::cout << double_strings;

  // print(double_strings.structured_input_signature): the positional specs as Python
  // shows a tuple, then the keyword ones (none in C++).
  std::cout << "((";
  for (const kiln::tensor_spec& spec : double_strings.structured_input_signature()) std::cout << spec << ",";
  std::cout << "), {})\n";
  // print(double_strings.structured_outputs): the output as the graph value it is.
  for (const kiln::tensor_spec& out : double_strings.structured_outputs())
    std::cout << "Tensor(\"" << out.name << "\", shape=" << out.shape << ", dtype=" << out.dtype << ")\n";

  // Using a concrete trace with incompatible types will throw an error.
  try {
    double_strings(kiln::constant(1));
  } catch (const kiln::invalid_argument_error& e) {
    std::cout << "Caught expected exception \n  kiln::invalid_argument_error: " << e.what() << "\n";
  }

  // graph = double_strings.graph
  // for node in graph.as_graph_def().node:
  //   print(f'{node.input} -> {node.name}')
  for (const kiln::node& n : double_strings.graph().nodes()) {
    std::cout << "[";
    for (std::size_t i = 0; i < n.inputs().size(); ++i) std::cout << (i ? ", '" : "'") << n.inputs()[i] << "'";
    std::cout << "] -> " << n.name() << "\n";
  }
}

// The guides' my_relu (Introduction to graphs and tf.function "Polymorphism: one
// Function, many graphs"): one function, one graph per signature. A scalar tensor, a list
// of C++ ints (keyed by its values) and a vector tensor make three concrete functions;
// calls with a signature seen before reuse its graph.

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

namespace {

// tf.maximum(0., x) converts a Python list to a float32 tensor; C++ converts it explicitly.
kiln::tensor as_float_tensor(const kiln::tensor& x) { return x; }
kiln::tensor as_float_tensor(const std::vector<int>& x) { return kiln::constant(x, kiln::float32); }

}  // namespace

int main() {
  // @tf.function
  // def my_relu(x):
  //   return tf.maximum(0., x)
  kiln::function my_relu([](const auto& x) { return kiln::maximum(0.f, as_float_tensor(x)); },
                         {.name = "my_relu", .arg_names = {"x"}});

  // `my_relu` creates new graphs as it observes more signatures.
  std::cout << my_relu(kiln::constant(5.5f)) << "\n";
  std::cout << my_relu(std::vector{1, -1}) << "\n";
  std::cout << my_relu(kiln::constant({3.f, -3.f})) << "\n";

  // These two calls do *not* create new graphs.
  std::cout << my_relu(kiln::constant(-2.5f)) << "\n";     // Signature matches `kiln::constant(5.5f)`.
  std::cout << my_relu(kiln::constant({-1.f, 1.f})) << "\n";  // Signature matches `kiln::constant({3.f, -3.f})`.

  // There are three concrete functions (one for each graph) in `my_relu`.
  // The concrete function also knows the return type and shape!
  std::cout << my_relu.pretty_printed_concrete_signatures() << "\n";
}

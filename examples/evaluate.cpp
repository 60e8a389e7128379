// The guides' "Depending on Python objects" (Better performance with tf.function "Known
// issues"): an object that is not a tensor, a C++ value or a structure of those is keyed
// by its address, as TensorFlow keys it by id(). Its plain members are read while tracing
// only, so changing them does not retrace and the graph keeps the old values; a new
// function traces afresh. With kiln::variable members (BetterModel), the graph reads them
// at every call instead.

#include <kiln/kiln.hpp>

#include <iostream>

namespace {

class simple_model {
 public:
  simple_model() = default;  // a constructor makes it a class kiln keys by address
  // These values are *not* kiln::variables.
  float bias = 0.f;
  float weight = 2.f;
};

kiln::tensor evaluate_model(const simple_model& model, const kiln::tensor& x) { return model.weight * x + model.bias; }

// class BetterModel: its members are tf.Variables.
class better_model {
 public:
  kiln::variable bias{kiln::constant(0.f)};
  kiln::variable weight{kiln::constant(2.f)};
};

kiln::tensor evaluate_better(const better_model& model, const kiln::tensor& x) { return model.weight * x + model.bias; }

}  // namespace

int main() {
  // @tf.function
  // def evaluate(model, x):
  //   return model.weight * x + model.bias
  kiln::function evaluate(evaluate_model, {.name = "evaluate", .arg_names = {"model", "x"}});

  simple_model model;
  kiln::tensor x = kiln::constant(10.f);
  std::cout << evaluate(model, x) << "\n";
  std::cout << "Adding bias!\n";
  model.bias += 5.f;
  std::cout << evaluate(model, x) << "\n";  // Didn't change :(

  // The workaround: a new function (and concrete function) whenever the object changes.
  simple_model new_model;
  kiln::concrete_function evaluate_no_bias =
      kiln::function(evaluate_model, {.name = "evaluate"}).get_concrete_function(new_model, x);
  // Don't pass in `new_model`, the function already captured its state during tracing.
  std::cout << evaluate_no_bias(x) << "\n";
  std::cout << "Adding bias!\n";
  new_model.bias += 5.f;
  // Create a new function and concrete function since you modified new_model.
  kiln::concrete_function evaluate_with_bias =
      kiln::function(evaluate_model, {.name = "evaluate"}).get_concrete_function(new_model, x);
  std::cout << evaluate_with_bias(x) << "\n";  // Don't pass in `new_model`.

  // The graph reads a variable at every call: mutate it (but do not replace it).
  kiln::function evaluate_variables(evaluate_better, {.name = "evaluate", .arg_names = {"model", "x"}});
  better_model better;
  std::cout << evaluate_variables(better, x) << "\n";
  std::cout << "Adding bias!\n";
  better.bias.assign_add(kiln::constant(5.f));  // Note: instead of better.bias = better.bias + 5
  std::cout << evaluate_variables(better, x) << "\n";  // This works!
}

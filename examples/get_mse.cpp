// The guides' get_MSE (Introduction to graphs and tf.function, "Graph execution vs. eager
// execution"): a function runs its graph by default;
// kiln::config::run_functions_eagerly(true) makes it call the C++ callable on every call
// instead. A C++ print in the callable shows the difference: once per trace in graph
// mode, once per call eagerly.
//
// The guide draws y_true and y_pred with tf.random.uniform; fixed values here keep the
// printed output checkable.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // @tf.function
  // def get_MSE(y_true, y_pred):
  //   sq_diff = tf.pow(y_true - y_pred, 2)
  //   return tf.reduce_mean(sq_diff)
  kiln::function get_mse(
      [](const kiln::tensor& y_true, const kiln::tensor& y_pred) {
        kiln::tensor sq_diff = kiln::pow(y_true - y_pred, 2);
        return kiln::reduce_mean(sq_diff);
      },
      {.name = "get_MSE", .arg_names = {"y_true", "y_pred"}});

  kiln::tensor y_true = kiln::constant({1, 6, 8, 2, 3});
  kiln::tensor y_pred = kiln::constant({9, 2, 4, 6, 6});
  std::cout << y_true << "\n";
  std::cout << y_pred << "\n";

  std::cout << get_mse(y_true, y_pred) << "\n";

  kiln::config::run_functions_eagerly(true);
  std::cout << get_mse(y_true, y_pred) << "\n";
  // Don't forget to set it back when you are done.
  kiln::config::run_functions_eagerly(false);

  // @tf.function
  // def get_MSE(y_true, y_pred):
  //   print("Calculating MSE!")
  //   ...
  kiln::function get_mse_printing(
      [](const kiln::tensor& y_true, const kiln::tensor& y_pred) {
        std::cout << "Calculating MSE!\n";
        kiln::tensor sq_diff = kiln::pow(y_true - y_pred, 2);
        return kiln::reduce_mean(sq_diff);
      },
      {.name = "get_MSE", .arg_names = {"y_true", "y_pred"}});

  // Called three times, it prints once: the print runs while tracing only.
  kiln::tensor error = get_mse_printing(y_true, y_pred);
  error = get_mse_printing(y_true, y_pred);
  error = get_mse_printing(y_true, y_pred);

  // Now, globally set everything to run eagerly to force eager execution.
  kiln::config::run_functions_eagerly(true);
  // Observe what is printed below.
  error = get_mse_printing(y_true, y_pred);
  error = get_mse_printing(y_true, y_pred);
  error = get_mse_printing(y_true, y_pred);
  kiln::config::run_functions_eagerly(false);
}

// The guides' recursive function (Better performance with tf.function "Recursive
// tf.functions are not supported"): a function that calls itself with a new C++ value
// each time traces once per value (five "tracing" lines), which works but costs a trace
// per level. With a tensor argument, the recursive call has the signature of the call
// being traced: that raises kiln::value_error instead of recursing forever (the guide's
// "maximum recursion error").

#include <kiln/kiln.hpp>

#include <functional>
#include <iostream>

int main() {
  std::function<kiln::tensor(int)> call_recursive_fn;

  // @tf.function
  // def recursive_fn(n):
  //   if n > 0:
  //     print('tracing')
  //     return recursive_fn(n - 1)
  //   else:
  //     return 1
  kiln::function recursive_fn(
      [&](int n) {
        if (n > 0) {
          std::cout << "tracing\n";
          return call_recursive_fn(n - 1);
        }
        return kiln::constant(1);
      },
      {.name = "recursive_fn", .arg_names = {"n"}});
  call_recursive_fn = [&](int n) { return recursive_fn(n); };

  std::cout << recursive_fn(5) << "\n";  // Warning - multiple tracings

  // @tf.function
  // def recursive_fn(n):
  //   if n > 0:
  //     return recursive_fn(n - 1)
  //   else:
  //     return 1
  // recursive_fn(tf.constant(5))  # Bad - maximum recursion error.
  std::function<kiln::tensor(const kiln::tensor&)> call_tensor_fn;
  kiln::function recursive_tensor_fn(
      [&](const kiln::tensor& n) {
        return kiln::cond(n > 0, [&] { return call_tensor_fn(n - 1); }, [] { return kiln::constant(1); });
      },
      {.name = "recursive_fn", .arg_names = {"n"}});
  call_tensor_fn = [&](const kiln::tensor& n) { return recursive_tensor_fn(n); };
  try {
    recursive_tensor_fn(kiln::constant(5));
  } catch (const kiln::value_error& e) {
    std::cout << "Caught expected exception kiln::value_error:\n  " << e.what() << "\n";
  }
}

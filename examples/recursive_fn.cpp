// The seeds' recursive function (001 "Recursive tf.functions are not supported"): a
// function that calls itself with a new C++ value each time traces once per value
// (five "tracing" lines), which works but costs a trace per level. (A call with the
// same signature while tracing raises kiln::value_error instead of recursing forever.)

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
}

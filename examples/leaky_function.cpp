// The guides' "All outputs of a tf.function must be return values" (Better performance
// with tf.function "Known issues"): a tensor stored outside the function while it traces
// is symbolic, a placeholder for a value of the graph. Reading it raises
// kiln::type_error, and so does using it in another function's trace. Only the returned
// values (and variables) leave a graph.

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

namespace {

kiln::tensor x;  // x = None

template <class F>
void expect_type_error(F&& f) {
  try {
    f();
    std::cout << "no error\n";
  } catch (const kiln::type_error& e) {
    std::cout << "Caught expected exception kiln::type_error:\n  " << e.what() << "\n";
  }
}

}  // namespace

int main() {
  // @tf.function
  // def leaky_function(a):
  //   global x
  //   x = a + 1  # Bad - leaks local tensor
  //   return a + 2
  kiln::function leaky_function(
      [](const kiln::tensor& a) {
        x = a + 1;  // Bad - leaks local tensor
        return a + 2;
      },
      {.name = "leaky_function", .arg_names = {"a"}});

  kiln::tensor correct_a = leaky_function(kiln::constant(1));
  std::cout << correct_a.item<std::int32_t>() << "\n";  // Good - value obtained from the function's returns
  expect_type_error([] { return x.item<std::int32_t>(); });  // Bad - tensor leaked from inside the function

  // This is true even if the leaked value is also returned.
  kiln::function leaky_function_returning_x(
      [](const kiln::tensor& a) {
        x = a + 1;  // Bad - leaks local tensor
        return x;   // Good - uses local tensor
      },
      {.name = "leaky_function", .arg_names = {"a"}});
  correct_a = leaky_function_returning_x(kiln::constant(1));
  std::cout << correct_a.item<std::int32_t>() << "\n";
  expect_type_error([] { return x.item<std::int32_t>(); });

  // @tf.function
  // def captures_leaked_tensor(b):
  //   b += x  # Bad - `x` is leaked from `leaky_function`
  //   return b
  kiln::function captures_leaked_tensor([](const kiln::tensor& b) { return b + x; },
                                        {.name = "captures_leaked_tensor", .arg_names = {"b"}});
  expect_type_error([&] { return captures_leaked_tensor(kiln::constant(2)); });

  // Leaks into containers and objects are the same mistake.
  std::vector<kiln::tensor> external_list;
  struct my_class {
    kiln::tensor field;
  } external_object;
  kiln::function leaky_into_objects(
      [&](const kiln::tensor& b) {
        kiln::tensor a = b + 1;
        external_list.push_back(a);  // Bad - leaks tensor
        external_object.field = a;   // Bad - leaks tensor
      },
      {.name = "leaky_function", .arg_names = {"b"}});
  leaky_into_objects(kiln::constant(1));
  expect_type_error([&] { return external_list[0].item<std::int32_t>(); });
  expect_type_error([&] { return external_object.field + 1; });
}

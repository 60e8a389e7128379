// The guides' first examples on the compile-time tier: the same callables called with
// kiln::fixed arguments, whose element type and shape are part of their type. A call
// traces once per signature *type* (the "Tracing with" line is a C++ side effect), its
// result is a kiln::fixed whose shape the compiler worked out, and a shape error would
// have been a compile error (test/compile_fail/typed_*.cpp).

#include <kiln/kiln.hpp>

#include <cstdint>
#include <iostream>

int main() {
  // @tf.function
  // def add(a, b):
  //   return a + b
  kiln::function add([](const auto& a, const auto& b) { return a + b; }, {.name = "add", .arg_names = {"a", "b"}});
  std::cout << add(kiln::fixed<float, 2, 2>::ones(), kiln::fixed<float, 2, 2>::ones()) << "\n";

  // @tf.function
  // def dense_layer(x, w, b):
  //   return add(tf.matmul(x, w), b)   (here without the inner tf.function)
  kiln::function dense_layer([](const auto& x, const auto& w, const auto& b) { return kiln::matmul(x, w) + b; },
                             {.name = "dense_layer", .arg_names = {"x", "w", "b"}});
  const kiln::fixed<float, 3, 2> dense =
      dense_layer(kiln::fixed<float, 3, 2>::ones(), kiln::fixed<float, 2, 2>::ones(), kiln::fixed<float, 2>::ones());
  std::cout << dense << "\n\n";

  // @tf.function
  // def double(a):
  //   print("Tracing with", a)
  //   return a + a
  kiln::function dbl(
      [](const auto& a) {
        std::cout << "Tracing with " << a << "\n";
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});
  std::cout << dbl(kiln::fixed<std::int32_t>(1)) << "\n\n";
  std::cout << dbl(kiln::fixed<float>(1.1f)) << "\n\n";
  std::cout << dbl(kiln::fixed<std::int32_t, 3>{1, 2, 3}) << "\n\n";
  // The same signature type again: no "Tracing with" line.
  std::cout << dbl(kiln::fixed<std::int32_t>(2)) << "\n";
  std::cout << dbl.pretty_printed_concrete_signatures() << "\n\n";

  // def power(x, y):
  //   result = tf.eye(10, dtype=tf.dtypes.int32)
  //   for _ in range(y):
  //     result = tf.matmul(x, result)
  //   return result
  using matrix = kiln::fixed<std::int32_t, 10, 10>;
  kiln::function power(
      [](const auto& x, int y) {
        kiln::typed::traced_t<matrix> result = matrix::eye();
        for (int i = 0; i < y; ++i) result = kiln::matmul(x, result);
        return result;
      },
      {.name = "power", .arg_names = {"x", "y"}});
  const matrix x(kiln::random::uniform({10, 10}, -1, 2, kiln::int32, 5));
  std::cout << "power(x, 3) = " << power(x, 3) << "\n";
  std::cout << "power(x, 100) agrees with the runtime tier: "
            << (kiln::tensor(power(x, 100)).to_vector<std::int32_t>() ==
                        [&] {
                          kiln::tensor r = kiln::eye(10, 10, kiln::int32);
                          for (int i = 0; i < 100; ++i) r = kiln::matmul(kiln::tensor(x), r);
                          return r.to_vector<std::int32_t>();
                        }()
                    ? "true"
                    : "false")
            << "\n";
  std::cout << "power traced " << power.tracing_count() << " times (one per value of y)\n\n";

  // @tf.function
  // def f(x):
  //   while tf.reduce_sum(x) > 1:
  //     tf.print(x)          (here: the number of iterations, from a second loop variable)
  //     x = tf.tanh(x)
  //   return x
  kiln::function tanh_loop([](const auto& x) {
    return kiln::while_loop([](const auto& v, const auto&) { return kiln::reduce_sum(v) > 1.f; },
                            [](const auto& v, const auto& n) { return std::tuple(kiln::tanh(v), n + 1); }, x,
                            kiln::fixed<std::int32_t>(0));
  });
  const auto [settled, iterations] = tanh_loop(kiln::fixed<float, 5>::ones());
  std::cout << settled << " after " << iterations.item() << " iterations\n\n";

  // A compile-time checked model: a two-layer perceptron's forward pass.
  kiln::function mlp(
      [](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2) {
        return kiln::matmul(kiln::relu(kiln::matmul(x, w1) + b1), w2) + b2;
      },
      {.name = "mlp"});
  std::cout << mlp(kiln::fixed<float, 2, 3>::ones(), kiln::fixed<float, 3, 4>::fill(0.5f), kiln::fixed<float, 4>::fill(-1.f),
                   kiln::fixed<float, 4, 2>::fill(2.f), kiln::fixed<float, 2>::ones())
            << "\n";
}

// The guides' "Seeing the speed-up" (Introduction to graphs and tf.function): power(x,
// 100) is a hundred small matmuls, whose cost eagerly is mostly per-op overhead; as a
// kiln::function the C++ loop over the C++ int `y` unrolls into 100 matmul nodes that run
// from a precomputed plan. The timings vary from machine to machine, so they are in
// bench/ (`power_100`); this program checks that both ways compute the same matrix.

#include <kiln/kiln.hpp>

#include <iostream>

namespace {

// def power(x, y):
//   result = tf.eye(10, dtype=tf.dtypes.int32)
//   for _ in range(y):
//     result = tf.matmul(x, result)
//   return result
kiln::tensor power(const kiln::tensor& x, int y) {
  kiln::tensor result = kiln::eye(10, 10, kiln::int32);
  for (int i = 0; i < y; ++i) result = kiln::matmul(x, result);
  return result;
}

}  // namespace

int main() {
  // x = tf.random.uniform(shape=[10, 10], minval=-1, maxval=2, dtype=tf.dtypes.int32)
  const kiln::tensor x = kiln::random::uniform({10, 10}, -1, 2, kiln::int32, 5);

  const kiln::tensor eager = power(x, 100);
  kiln::function power_as_graph(power, {.name = "power", .arg_names = {"x", "y"}});
  const kiln::tensor graph = power_as_graph(x, 100);

  int matmuls = 0;
  for (const kiln::node& n : power_as_graph.get_concrete_function(x, 100).graph().nodes()) matmuls += n.op() == "matmul";
  std::cout << "power_as_graph(x, 100) has " << matmuls << " matmul nodes\n";
  std::cout << "Eager and graph execution agree: " << (kiln::reduce_max(kiln::abs(eager - graph)).item<std::int32_t>() == 0 ? "true" : "false")
            << "\n";
  // A small power to read: x @ x @ x.
  std::cout << "x = " << x << "\n";
  std::cout << "power(x, 3) = " << power_as_graph(x, 3) << "\n";
}

// The guides' "Conditionals" (Better performance with tf.function AutoGraph): a C++ `if`
// on a C++ value picks a branch while tracing and leaves no cond node; kiln::cond on a
// tensor traces both branches and chooses at run time, so C++ code in both branches runs
// while tracing, and the branches must agree. And simple_relu (Introduction to graphs and
// tf.function): a data-dependent branch in a graph.

#include <kiln/kiln.hpp>

#include <iostream>
#include <string>

namespace {

// def test_tf_cond(f, *args):
//   g = f.get_concrete_function(*args).graph
//   if any(node.name == 'cond' for node in g.as_graph_def().node): ... uses tf.cond.
template <class F, class... Args>
void test_tf_cond(F& f, const std::string& call, const Args&... args) {
  const kiln::graph g = f.get_concrete_function(args...).graph();
  bool uses_cond = false;
  for (const kiln::node& n : g.nodes()) uses_cond = uses_cond || n.op() == "cond";
  std::cout << call << (uses_cond ? " uses kiln::cond.\n" : " executes normally.\n");
}

}  // namespace

int main() {
  // @tf.function
  // def hyperparam_cond(x, training=True):
  //   if training:
  //     x = tf.nn.dropout(x, rate=0.5)
  //   return x
  kiln::function hyperparam_cond(
      [](const kiln::tensor& x, bool training) { return training ? x * 0.5f : x; },  // (a stand-in for dropout)
      {.name = "hyperparam_cond"});

  // @tf.function
  // def maybe_tensor_cond(x):
  //   if x < 0:
  //     x = -x
  //   return x
  kiln::function maybe_tensor_cond(
      [](const kiln::tensor& x) { return kiln::cond(x < 0, [&] { return -x; }, [&] { return x; }); },
      {.name = "maybe_tensor_cond"});
  // With a C++ int argument, the C++ `if` decides while tracing.
  kiln::function maybe_int_cond([](int x) { return kiln::constant(x < 0 ? -x : x); }, {.name = "maybe_tensor_cond"});

  test_tf_cond(hyperparam_cond, "hyperparam_cond(tensor([1.]), true)", kiln::ones({1}, kiln::float32), true);
  test_tf_cond(maybe_tensor_cond, "maybe_tensor_cond(tensor(-1))", kiln::constant(-1));
  test_tf_cond(maybe_int_cond, "maybe_tensor_cond(-1)", -1);

  // kiln::cond traces both branches, so C++ code in both runs while tracing.
  // @tf.function
  // def f():
  //   x = tf.constant(0)
  //   if tf.constant(True): x = x + 1; print("Tracing `then` branch")
  //   else: x = x - 1; print("Tracing `else` branch")
  //   return x
  kiln::function both_branches(
      [] {
        const kiln::tensor x = kiln::constant(0);
        return kiln::cond(
            kiln::constant(true),
            [&] {
              std::cout << "Tracing `then` branch\n";
              return x + 1;
            },
            [&] {
              std::cout << "Tracing `else` branch\n";
              return x - 1;
            });
      },
      {.name = "f"});
  std::cout << both_branches() << "\n";

  // Both branches must give the same values: the guide's `x` defined in one branch
  // only is, in C++, a branch that returns something else.
  // @tf.function
  // def f():
  //   if tf.constant(True): x = tf.ones([3, 3])
  //   return x
  kiln::function one_branch_defines(
      [] { return kiln::cond(kiln::constant(true), [] { return kiln::ones({3, 3}); }, [] { return kiln::ones({}); }); },
      {.name = "f"});
  try {
    one_branch_defines();
    return 1;
  } catch (const kiln::value_error& e) {
    std::cout << "Caught expected exception kiln::value_error:\n  " << e.what() << "\n";
  }

  // @tf.function
  // def simple_relu(x):
  //   if tf.greater(x, 0):
  //     return x
  //   else:
  //     return 0
  kiln::function simple_relu(
      [](const kiln::tensor& x) { return kiln::cond(kiln::greater(x, 0), [&] { return x; }, [&] { return kiln::zeros_like(x); }); },
      {.name = "simple_relu"});
  std::cout << "First branch, with graph: " << simple_relu(kiln::constant(1)) << "\n";
  std::cout << "Second branch, with graph: " << simple_relu(kiln::constant(-1)) << "\n";
}

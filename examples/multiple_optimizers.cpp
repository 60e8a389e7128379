// The guides' "Using with multiple Keras optimizers" (Better performance with
// tf.function): a traced train_step whose optimizer creates its slot variables on first
// use. Called with a second optimizer, the function traces again and that optimizer's
// variables would be created by a later trace, which kiln::function rejects as
// tf.function does; the workaround is one concrete function per optimizer.

#include <kiln/kiln.hpp>

#include <iostream>
#include <vector>

int main() {
  // opt1 = tf.keras.optimizers.Adam(learning_rate = 1e-2)
  // opt2 = tf.keras.optimizers.Adam(learning_rate = 1e-3)
  kiln::optimizers::adam opt1({.learning_rate = 1e-2});
  kiln::optimizers::adam opt2({.learning_rate = 1e-3});

  // def train_step(w, x, y, optimizer):
  //    with tf.GradientTape() as tape:
  //        L = tf.reduce_sum(tf.square(w*x - y))
  //    gradients = tape.gradient(L, [w])
  //    optimizer.apply_gradients(zip(gradients, [w]))
  auto train_step = [](const kiln::variable& w, const kiln::tensor& x, const kiln::tensor& y, auto& optimizer) {
    kiln::gradient_tape tape;
    kiln::tensor loss = kiln::reduce_sum(kiln::square(w * x - y));
    std::vector<kiln::tensor> gradients = tape.gradient(loss, std::vector{w});
    optimizer.apply_gradients(gradients, {w});
  };

  // w = tf.Variable(2.); x = tf.constant([-1.]); y = tf.constant([2.])
  kiln::variable w(2.f, "w");
  const kiln::tensor x = kiln::constant({-1.f});
  const kiln::tensor y = kiln::constant({2.f});

  {
    // @tf.function
    kiln::function traced_train_step(train_step, {.name = "train_step", .arg_names = {"w", "x", "y", "optimizer"}});
    traced_train_step(w, x, y, opt1);
    std::cout << "Calling `train_step` with different optimizer...\n";
    try {
      traced_train_step(w, x, y, opt2);
    } catch (const kiln::value_error& e) {
      std::cout << "Caught expected exception\n  kiln::value_error: " << e.what() << "\n";
    }
  }

  // Make a new Function and ConcreteFunction for each optimizer.
  kiln::optimizers::adam opt3({.learning_rate = 1e-2});
  kiln::optimizers::adam opt4({.learning_rate = 1e-3});
  kiln::variable v(2.f, "v");
  auto train_step_1 = kiln::function(train_step, {.name = "train_step"}).get_concrete_function(v, x, y, opt3);
  auto train_step_2 = kiln::function(train_step, {.name = "train_step"}).get_concrete_function(v, x, y, opt4);
  for (int i = 0; i < 10; ++i) {
    if (i % 2 == 0)
      train_step_1(v, x, y);  // `opt3` is not used as a parameter.
    else
      train_step_2(v, x, y);  // `opt4` is not used as a parameter.
  }
  std::cout << "v after 10 steps: " << v.read_value() << "\n";
  std::cout << "steps: " << opt3.iterations().read_value().item<std::int64_t>() << " and "
            << opt4.iterations().read_value().item<std::int64_t>() << "\n";
}

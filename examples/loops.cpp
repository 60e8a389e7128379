// The guides' "Loops" (Better performance with tf.function AutoGraph) and fizzbuzz
// (Better performance with tf.function): a C++ loop unrolls while tracing;
// kiln::for_range and kiln::while_loop make one `while` node, whose body is traced once
// and runs as often as the tensors say, and a loop over a dataset makes one ReduceDataset
// node; kiln::break_if exits early; a loop variable may not change its dtype, nor its
// shape unless a shape invariant lets it. And Better performance with tf.function's "A
// simple loop" (tanh until the sum drops to 1).

#include <kiln/kiln.hpp>

#include <iostream>
#include <string>

namespace {

// def test_dynamically_unrolled(f, *args): ... uses tf.while_loop / uses
// tf.data.Dataset.reduce / gets unrolled.
template <class F, class... Args>
void test_dynamically_unrolled(F& f, const std::string& call, const Args&... args) {
  bool uses_while = false, uses_reduce = false;
  for (const kiln::node& n : f.get_concrete_function(args...).graph().nodes()) {
    uses_while = uses_while || n.op() == "while";
    uses_reduce = uses_reduce || n.op() == "ReduceDataset";
  }
  std::cout << call
            << (uses_while    ? " uses kiln::while_loop.\n"
                : uses_reduce ? " uses kiln::data::dataset::reduce.\n"
                              : " gets unrolled.\n");
}

// with assert_raises(error_class): f()
template <class Error, class F>
void assert_raises(const char* error_name, F&& f) {
  try {
    f();
    std::cout << "no exception\n";
  } catch (const Error& e) {
    std::cout << "Caught expected exception " << error_name << ":\n  " << e.what() << "\n";
  }
}

}  // namespace

int main() {
  // kiln::print writes to standard error, as tf.print; the guides' notebooks show both
  // streams in order, and so does this program, on standard output.
  kiln::config::set_print_stream(std::cout);
  using kiln::tensor;

  // def for_in_range(): x = 0; for i in range(5): x += i
  kiln::function for_in_range(
      [] {
        tensor x = kiln::constant(0);
        for (int i = 0; i < 5; ++i) x = x + i;
        return x;
      },
      {.name = "for_in_range"});
  // def for_in_tfrange(): x = tf.constant(0); for i in tf.range(5): x += i
  kiln::function for_in_tfrange(
      [] { return kiln::for_range(5, [](const tensor& i, const tensor& x) { return x + i; }, kiln::constant(0)); },
      {.name = "for_in_tfrange"});
  // def for_in_tfdataset(): x = tf.constant(0, dtype=tf.int64); for i in tf.data.Dataset.range(5): x += i
  kiln::function for_in_tfdataset(
      [] {
        return kiln::for_each(kiln::data::dataset::range(5), [](const tensor& i, const tensor& x) { return x + i; },
                              kiln::constant(std::int64_t(0)));
      },
      {.name = "for_in_tfdataset"});
  test_dynamically_unrolled(for_in_range, "for_in_range()");
  test_dynamically_unrolled(for_in_tfrange, "for_in_tfrange()");
  test_dynamically_unrolled(for_in_tfdataset, "for_in_tfdataset()");
  std::cout << "for_in_tfdataset() = " << for_in_tfdataset() << "\n";

  // def while_py_cond(): x = 5; while x > 0: x -= 1
  kiln::function while_py_cond(
      [] {
        int x = 5;
        while (x > 0) x -= 1;
        return x;
      },
      {.name = "while_py_cond"});
  // def while_tf_cond(): x = tf.constant(5); while x > 0: x -= 1
  kiln::function while_tf_cond(
      [] {
        return kiln::while_loop([](const tensor& x) { return x > 0; }, [](const tensor& x) { return x - 1; },
                                kiln::constant(5));
      },
      {.name = "while_tf_cond"});
  test_dynamically_unrolled(while_py_cond, "while_py_cond()");
  test_dynamically_unrolled(while_tf_cond, "while_tf_cond()");

  // def buggy_while_py_true_tf_break(x):
  //   while True:
  //     if tf.equal(x, 0): break
  //     x -= 1
  // A C++ loop cannot test a symbolic tensor: the `if` raises kiln::type_error.
  kiln::function buggy_while_py_true_tf_break(
      [](kiln::tensor x) {
        for (;;) {
          if (kiln::equal(x, 0)) break;
          x = x - 1;
        }
        return x;
      },
      {.name = "buggy_while_py_true_tf_break"});
  assert_raises<kiln::type_error>("kiln::type_error", [&] { buggy_while_py_true_tf_break(kiln::constant(5)); });

  // def while_tf_true_tf_break(x):
  //   while tf.constant(True):
  //     if tf.equal(x, 0): break
  //     x -= 1
  kiln::function while_tf_true_tf_break(
      [](const tensor& x) {
        return kiln::while_loop([](const tensor&) { return kiln::constant(true); },
                                [](const tensor& v) { return kiln::break_if(kiln::equal(v, 0), v - 1); }, x);
      },
      {.name = "while_tf_true_tf_break"});
  test_dynamically_unrolled(while_tf_true_tf_break, "while_tf_true_tf_break(5)", kiln::constant(5));
  std::cout << "while_tf_true_tf_break(5) = " << while_tf_true_tf_break(kiln::constant(5)) << "\n";

  // def buggy_py_for_tf_break():
  //   x = 0
  //   for i in range(5):
  //     if tf.equal(i, 3): break
  //     x += i
  // Inside a function every op is recorded, so tf.equal(i, 3) is a symbolic tensor
  // even though `i` is a C++ int, and a C++ `if` cannot test it: TensorFlow raises a
  // TypeError, kiln a kiln::type_error.
  kiln::function buggy_py_for_tf_break(
      [] {
        kiln::tensor x = kiln::constant(0);
        for (int i = 0; i < 5; ++i) {
          if (kiln::equal(kiln::constant(i), 3)) break;
          x = x + i;
        }
        return x;
      },
      {.name = "buggy_py_for_tf_break"});
  assert_raises<kiln::type_error>("kiln::type_error", [&] {
    test_dynamically_unrolled(buggy_py_for_tf_break, "buggy_py_for_tf_break()");
  });

  // def tf_for_tf_break():
  //   x = 0
  //   for i in tf.range(5):
  //     if tf.equal(i, 3): break
  //     x += i
  kiln::function tf_for_tf_break(
      [] {
        return kiln::for_range(
            5, [](const tensor& i, const tensor& x) { return kiln::break_if(kiln::equal(i, 3), x + i); }, kiln::constant(0));
      },
      {.name = "tf_for_tf_break"});
  test_dynamically_unrolled(tf_for_tf_break, "tf_for_tf_break()");
  std::cout << "tf_for_tf_break() = " << tf_for_tf_break() << "\n";

  // def buggy_loop_type_changes():
  //   x = tf.constant(0, dtype=tf.float32)
  //   for i in tf.range(3): x = i
  kiln::function buggy_loop_type_changes(
      [] { return kiln::for_range(3, [](const tensor& i, const tensor&) { return i; }, kiln::constant(0.f)); },
      {.name = "buggy_loop_type_changes"});
  assert_raises<kiln::value_error>("kiln::value_error", [&] { buggy_loop_type_changes(); });

  // @tf.function
  // def f():
  //   x = tf.constant(0)
  //   for i in tf.range(3): x = i
  //   return x
  // (x must be initialized above the loop, since a loop may run 0 times.)
  kiln::function last_index([] { return kiln::for_range(3, [](const tensor& i, const tensor&) { return i; }, kiln::constant(0)); },
                            {.name = "f"});
  std::cout << "f() = " << last_index() << "\n";

  // def buggy_concat():
  //   x = tf.ones([0, 10])
  //   for i in tf.range(5): x = tf.concat([x, tf.ones([1, 10])], axis=0)
  kiln::function buggy_concat(
      [] {
        return kiln::for_range(
            5, [](const tensor&, const tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
            kiln::ones({0, 10}));
      },
      {.name = "buggy_concat"});
  assert_raises<kiln::value_error>("kiln::value_error", [&] { buggy_concat(); });
  // def concat_with_padding(): the loop variable keeps its shape (5, 10); row i is
  // written in place of the guide's x[:i] / concat / set_shape.
  kiln::function concat_with_padding(
      [] {
        return kiln::for_range(
            5, [](const tensor& i, const tensor& x) { return kiln::set_item(x, i, kiln::ones({10})); }, kiln::zeros({5, 10}));
      },
      {.name = "concat_with_padding"});
  std::cout << "concat_with_padding() = " << concat_with_padding() << "\n";
  // TensorFlow's own remedy: a shape invariant whose None dim lets x grow.
  // def concat_with_shape_invariants():
  //   x = tf.ones([0, 10])
  //   for i in tf.range(5):
  //     tf.autograph.experimental.set_loop_options(shape_invariants=[(x, tf.TensorShape([None, 10]))])
  //     x = tf.concat([x, tf.ones([1, 10])], axis=0)
  //   return x
  kiln::function concat_with_shape_invariants(
      [] {
        return kiln::for_range(
            5, [](const tensor&, const tensor& x) { return kiln::concat({x, kiln::ones({1, 10})}, 0); },
            kiln::loop_options{.shape_invariants = {kiln::shape{kiln::none, 10}}}, kiln::ones({0, 10}));
      },
      {.name = "concat_with_shape_invariants"});
  std::cout << "concat_with_shape_invariants() = " << concat_with_shape_invariants() << "\n";

  // A simple loop (Better performance with tf.function "AutoGraph transformations"):
  // @tf.function
  // def f(x):
  //   while tf.reduce_sum(x) > 1:
  //     tf.print(x)
  //     x = tf.tanh(x)
  //   return x
  // f(tf.random.uniform([5]))  # here with a fixed seed
  kiln::function tanh_loop(
      [](const tensor& x) {
        return kiln::while_loop([](const tensor& v) { return kiln::reduce_sum(v) > 1.f; },
                                [](const tensor& v) {
                                  // tf.print(x), to 5 decimals (in units of 1e-5): the
                                  // last digits of tanh depend on the SIMD instruction set.
                                  kiln::print(kiln::cast(v * 1e5f + 0.5f, kiln::int32));
                                  return kiln::tanh(v);
                                },
                                x);
      },
      {.name = "f"});
  tanh_loop(kiln::random::uniform({5}, 0, 1, kiln::float32, 11));

  // @tf.function
  // def fizzbuzz(n):
  //   for i in tf.range(1, n + 1):
  //     print('Tracing for loop')
  //     if i % 15 == 0: print('Tracing fizzbuzz branch'); tf.print('fizzbuzz')
  //     elif i % 3 == 0: print('Tracing fizz branch'); tf.print('fizz')
  //     elif i % 5 == 0: print('Tracing buzz branch'); tf.print('buzz')
  //     else: print('Tracing default branch'); tf.print(i)
  kiln::function fizzbuzz(
      [](const tensor& n) {
        kiln::for_range(1, n + 1, 1, [](const tensor& i) {
          std::cout << "Tracing for loop\n";
          kiln::cond(
              i % 15 == 0,
              [] {
                std::cout << "Tracing fizzbuzz branch\n";
                kiln::print("fizzbuzz");
              },
              [&] {
                kiln::cond(
                    i % 3 == 0,
                    [] {
                      std::cout << "Tracing fizz branch\n";
                      kiln::print("fizz");
                    },
                    [&] {
                      kiln::cond(
                          i % 5 == 0,
                          [] {
                            std::cout << "Tracing buzz branch\n";
                            kiln::print("buzz");
                          },
                          [&] {
                            std::cout << "Tracing default branch\n";
                            kiln::print(i);
                          });
                    });
              });
        });
      },
      {.name = "fizzbuzz"});
  fizzbuzz(kiln::constant(5));
  fizzbuzz(kiln::constant(20));
}

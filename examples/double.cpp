// The guides' polymorphic `double` (Better performance with tf.function "Tracing / What
// is tracing?", Better performance with tf.function "Tracing and Polymorphism"): each new
// argument dtype traces the callable once (the "Tracing with" line is a C++ side effect,
// so it appears only while tracing), a call with a signature seen before reuses its
// graph, and pretty_printed_concrete_signatures lists the three traces.

#include <kiln/kiln.hpp>

#include <iostream>

int main() {
  // @tf.function
  // def double(a):
  //   print("Tracing with", a)
  //   return a + a
  kiln::function dbl(
      [](const kiln::tensor& a) {
        std::cout << "Tracing with " << a << "\n";
        return a + a;
      },
      {.name = "double", .arg_names = {"a"}});

  std::cout << dbl(kiln::constant(1)) << "\n";
  std::cout << "\n";
  std::cout << dbl(kiln::constant(1.1f)) << "\n";
  std::cout << "\n";
  std::cout << dbl(kiln::constant("a")) << "\n";
  std::cout << "\n";

  // This doesn't print 'Tracing with ...'
  std::cout << dbl(kiln::constant("b")) << "\n";

  // print(double.pretty_printed_concrete_signatures())
  std::cout << dbl.pretty_printed_concrete_signatures() << "\n";
}

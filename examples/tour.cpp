// A tour of kiln: tensors and the op library, eagerly, as the first half of the
// TensorFlow guides shows them with `tf.constant`, `tf.matmul` and
// friends. Each section prints what it computes; the expected output is checked in CI
// (examples/expected/tour.txt).

#include <kiln/kiln.hpp>

#include <iostream>

namespace {

void section(const char* title) { std::cout << "\n== " << title << "\n"; }

// The guides' "a_regular_function": a dense layer without its activation.
kiln::tensor a_regular_function(const kiln::tensor& x, const kiln::tensor& y, const kiln::tensor& b) {
  return kiln::matmul(x, y) + b;
}

// The guides' get_MSE, run eagerly.
kiln::tensor get_mse(const kiln::tensor& y_true, const kiln::tensor& y_pred) {
  kiln::tensor sq_diff = kiln::pow(y_true - y_pred, 2);
  return kiln::reduce_mean(sq_diff);
}

}  // namespace

int main() {
  section("Tensors print as TensorFlow prints them");
  std::cout << kiln::constant(1) + kiln::constant(1) << "\n";
  std::cout << kiln::constant(1.1f) + kiln::constant(1.1f) << "\n";
  std::cout << kiln::constant("a") + kiln::constant("a") << "\n";
  kiln::tensor m = kiln::constant({{1.f, 2.f}, {3.f, 4.f}});
  std::cout << m << "\n";
  std::cout << "dtype " << m.dtype() << ", shape " << m.shape() << ", rank " << m.rank() << ", size " << m.size() << "\n";

  section("Factories");
  std::cout << kiln::zeros({2, 3}) << "\n";
  std::cout << kiln::ones({3}, kiln::int32) << "\n";
  std::cout << kiln::fill({2}, 7.5) << "\n";
  std::cout << kiln::eye(3, kiln::int32) << "\n";
  std::cout << kiln::range(1, 10, 3) << "\n";
  std::cout << kiln::random::uniform({5}, 0, 10, kiln::int32, /*seed=*/7).shape() << " random ints in [0, 10)\n";

  section("Arithmetic broadcasts and promotes C++ scalars");
  kiln::tensor row = kiln::constant({10.f, 20.f});
  std::cout << m + row << "\n";
  std::cout << 2.f * m - 1 << "\n";
  std::cout << kiln::constant({7, -7}) % 3 << " (floor modulo)\n";
  std::cout << kiln::floordiv(kiln::constant({7, -7}), 2) << " (floor division)\n";
  std::cout << kiln::constant({7, -7}) / 2 << " (true division)\n";
  std::cout << kiln::maximum(m, 2.5f) << "\n";

  section("Math, comparisons and selection");
  kiln::tensor x = kiln::constant({-2.f, -0.5f, 0.f, 0.5f, 2.f});
  std::cout << kiln::relu(x) << "\n";
  std::cout << kiln::abs(x) << "\n";
  std::cout << kiln::square(x) << "\n";
  std::cout << (x > 0.f) << "\n";
  std::cout << kiln::where(x > 0.f, x, 0.f) << "\n";
  std::cout << kiln::cast(x, kiln::int32) << "\n";

  section("Reductions");
  kiln::tensor t = kiln::constant({{1, 2, 3}, {4, 5, 6}});
  std::cout << kiln::reduce_sum(t) << "\n";
  std::cout << kiln::reduce_sum(t, 0) << "\n";
  std::cout << kiln::reduce_max(t, 1) << "\n";
  std::cout << kiln::reduce_mean(kiln::cast(t, kiln::float32), 1) << "\n";
  std::cout << kiln::argmax(t, 1) << "\n";

  section("Shapes");
  std::cout << kiln::reshape(t, {3, -1}) << "\n";
  std::cout << kiln::transpose(t) << "\n";
  std::cout << kiln::concat({t, t}, 0).shape() << " " << kiln::stack({t, t}, 1).shape() << "\n";
  std::cout << kiln::gather(kiln::constant({10, 20, 30, 40}), kiln::constant({3, 0})) << "\n";
  std::cout << t[1] << "\n";
  std::cout << kiln::slice(t, {0, 1}, {2, 2}) << "\n";
  std::cout << kiln::shape_of(t) << "\n";

  section("A dense layer and the mean squared error, eagerly");
  kiln::tensor x1 = kiln::constant({{1.f, 2.f}});
  kiln::tensor y1 = kiln::constant({{2.f}, {3.f}});
  kiln::tensor b1 = kiln::constant(4.f);
  std::cout << a_regular_function(x1, y1, b1) << "\n";
  kiln::tensor y_true = kiln::constant({1, 9, 3, 7, 0});
  kiln::tensor y_pred = kiln::constant({2, 9, 1, 7, 4});
  std::cout << get_mse(y_true, y_pred) << "\n";

  section("A convolution, as the guides' Conv2D(100, 3) on a 200x200x100 image");
  kiln::tensor image = kiln::ones({1, 200, 200, 100});
  kiln::tensor filters = kiln::fill({3, 3, 100, 100}, 0.01f);
  kiln::tensor features = kiln::conv2d(image, filters, 1, "VALID");
  // Every output sums 3 * 3 * 100 products of 1 and 0.01.
  bool all_nine = kiln::reduce_max(kiln::abs(features - 9.f)).item<float>() < 1e-3f;
  std::cout << features.shape() << ", every output is 9: " << std::boolalpha << all_nine << "\n";

  // Operands that do not fit raise invalid_argument_error when the op runs, as
  // TensorFlow's InvalidArgumentError (inside a function being traced, value_error for
  // shapes and type_error for dtypes).
  section("Bad input is a clear error");
  try {
    std::cout << m + kiln::constant({1.f, 2.f, 3.f});
  } catch (const kiln::invalid_argument_error& e) {
    std::cout << "kiln::invalid_argument_error: " << e.what() << "\n";
  }
  try {
    std::cout << m + kiln::constant({1, 2});
  } catch (const kiln::invalid_argument_error& e) {
    std::cout << "kiln::invalid_argument_error: " << e.what() << "\n";
  }
  try {
    std::cout << kiln::gather(t, kiln::constant({5}));
  } catch (const kiln::invalid_argument_error& e) {
    std::cout << "kiln::invalid_argument_error: " << e.what() << "\n";
  }
}

// The guides' convolution example (Better performance with tf.function "Seeing the
// speed-up"): a Keras-style `Conv2D(100, 3)` layer called eagerly and inside a
// kiln::function on a 1 x 200 x 200 x 100 image of zeros. The layer builds its 3 x 3 x
// 100 x 100 kernel on its first call; the function reads the same weights. A convolution
// is one big op, so graph execution saves little over eager execution, as the guide
// notes. Run with `--time` to print the timings (they vary from machine to machine;
// bench/ has them).

#include <kiln/kiln.hpp>

#include <chrono>
#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  // conv_layer = tf.keras.layers.Conv2D(100, 3)
  kiln::layers::conv2d conv_layer(100, 3);
  // @tf.function
  // def conv_fn(image):
  //   return conv_layer(image)
  kiln::function conv_fn([&](const kiln::tensor& image) { return conv_layer(image); }, {.name = "conv_fn"});

  // image = tf.zeros([1, 200, 200, 100])
  const kiln::tensor image = kiln::zeros({1, 200, 200, 100});
  // Warm up: the first call builds the layer, the second traces the function.
  const kiln::tensor eager = conv_layer(image), graph = conv_fn(image);
  std::cout << "kernel: " << conv_layer.kernel().shape() << ", bias: " << conv_layer.bias().shape() << "\n";
  std::cout << "output: " << eager.shape() << "\n";
  std::cout << "Eager and function agree: "
            << (kiln::reduce_max(kiln::abs(eager - graph)).item<float>() == 0.f ? "true" : "false") << "\n";

  if (argc > 1 && std::strcmp(argv[1], "--time") == 0) {
    auto seconds = [](auto&& f) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; ++i) (void)f();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    std::cout << "Eager conv: " << seconds([&] { return conv_layer(image); }) << "\n";
    std::cout << "Function conv: " << seconds([&] { return conv_fn(image); }) << "\n";
  }
  std::cout << "Note how there's not much difference in performance for convolutions\n";
}

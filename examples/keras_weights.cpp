// Keras weights loaded and served: a model trained in Keras 2.12 and saved with
// `model.save_weights("keras_model.h5")` (test/weights/, made by
// test/models/make_keras_fixtures.py) is rebuilt from kiln layers of the same
// architecture, loads the file, and serves predictions from a kiln::function. kiln
// writes the same layout back, which Keras loads. Needs kiln::weights (HDF5).
//
//   model = tf.keras.Sequential([Conv2D(4, 3, activation="relu", input_shape=(6, 6, 2)),
//       BatchNormalization(), MaxPooling2D(2), Flatten(), Dense(5, activation="gelu"), Dense(3)])

#include <kiln/kiln.hpp>
#include <kiln/weights.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::string file = argc > 1 ? argv[1] : KILN_EXAMPLE_WEIGHTS_DIR "/keras_model.h5";
  namespace layers = kiln::layers;
  layers::sequential model({layers::conv2d(4, 3, {.activation = kiln::relu}), layers::batch_normalization(),
                            layers::max_pooling2d(2), layers::flatten(), layers::dense(5, {.activation = kiln::gelu}),
                            layers::dense(3)});

  // Keras builds a model from its input shape; kiln builds it on the first call.
  kiln::function serve([&](const kiln::tensor& images) { return kiln::softmax(model(images)); }, {.name = "serve"});
  // Two images of a ramp from -1 to 1, the second reversed.
  const kiln::tensor ramp = kiln::range(0.f, 72.f) / 35.5f - 1.f;
  const kiln::tensor images = kiln::reshape(kiln::concat({ramp, -ramp}, 0), {2, 6, 6, 2});
  (void)serve.get_concrete_function(images);  // traces: the layers build their weights

  model.load_weights(file);
  std::cout << "loaded " << model.variables().size() << " weights:";
  for (const kiln::variable& v : model.variables()) std::cout << " " << v.shape();
  std::cout << "\n";
  const kiln::tensor p = serve(images);
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> row = p[i].to_vector<float>();
    std::printf("image %d: class probabilities %.4f %.4f %.4f\n", i, row[0], row[1], row[2]);
  }
  std::printf("predicted classes: ");
  std::cout << kiln::argmax(p, 1) << "\n";

  // kiln writes Keras' layout back; a second model reads it to the same predictions.
  const std::string copy = "keras_weights_example.weights.h5";
  model.save_weights(copy);
  layers::sequential again({layers::conv2d(4, 3, {.activation = kiln::relu}), layers::batch_normalization(),
                            layers::max_pooling2d(2), layers::flatten(), layers::dense(5, {.activation = kiln::gelu}),
                            layers::dense(3)});
  (void)again(images);
  again.load_weights(copy);
  std::cout << "reloaded from kiln's file, same predictions: "
            << (kiln::reduce_max(kiln::abs(kiln::softmax(again(images)) - p)).item<float>() == 0.f ? "true" : "false")
            << "\n";
  std::remove(copy.c_str());
}

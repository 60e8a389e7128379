// Introduction to graphs and tf.function: "you can use your TensorFlow graph in
// environments that don't have a Python interpreter, like mobile applications, embedded
// devices, and backend servers".
// Here one program trains a small classifier (which quadrants of the plane hold class 1),
// saves its prediction function with kiln::save, and starts a second program, the
// server, which has only the file: it loads the function with kiln::load and answers
// requests, counting them in a variable that came with the file. (Both programs are this
// one: run as `save_and_serve serve <file>`, it is the server.)

#include <kiln/saved_function.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

// A program that runs graphs it did not trace needs the kernels of their ops: a
// header-only server compiles here those of the model it serves (the ops of predict's
// graph below, as softmax and shape_of(x)[0] make it). One that serves any graph
// lists KILN_ALL_OPS, which takes a minute to compile; a CMake build with
// kiln_add_library links them all instead. A graph with an op left out of the list
// fails to load, with a kiln::unavailable_error naming the op.
#if !defined(KILN_SEPARATE_COMPILATION)
#define SERVED_OPS(F)                                                                                          \
  F(matmul) F(add) F(subtract) F(divide) F(tanh) F(exp) F(abs) F(less) F(where) F(reduce_max) F(reduce_sum) \
  F(argmax) F(shape_of) F(index)
KILN_INSTANTIATE_KERNELS(SERVED_OPS)
#endif

namespace {

int serve(const std::string& file) {
  const kiln::loaded_function predict = kiln::load(file);
  std::printf("server: loaded %s\n", predict.pretty_printed_concrete_signatures().c_str());
  const kiln::tensor requests = kiln::constant(std::vector<float>{0.5f, 0.5f, -0.5f, 0.5f, -0.3f, -0.8f, 0.9f, -0.1f},
                                               kiln::shape{4, 2});
  const std::vector<kiln::tensor> answer = predict.call_flat(requests);
  const std::vector<std::int64_t> classes = answer[0].to_vector<std::int64_t>();
  const std::vector<float> confidence = answer[1].to_vector<float>();
  for (std::size_t k = 0; k < classes.size(); ++k)
    std::printf("server: (%+.1f, %+.1f) -> class %lld (%.2f)\n", double(requests[std::int64_t(k)][0].item<float>()),
                double(requests[std::int64_t(k)][1].item<float>()), static_cast<long long>(classes[k]),
                double(confidence[k]));
  (void)predict.call_flat(kiln::reshape(requests[0], {1, 2}));  // one more, of one point
  std::printf("server: %d requests answered since training\n", predict.variable("requests").read_value().item<int>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "serve") return serve(argv[2]);

  // 256 points on a jittered grid of [-1, 1]^2, labelled by quadrant.
  std::vector<float> points;
  std::vector<int> labels;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      const float x = -0.95f + 0.125f * float(i) + 0.01f * float((i * 7 + j * 3) % 5);
      const float y = -0.95f + 0.125f * float(j) - 0.01f * float((i * 5 + j) % 3);
      points.insert(points.end(), {x, y});
      labels.push_back(x * y > 0 ? 1 : 0);
    }
  const kiln::tensor features = kiln::constant(points, kiln::shape{256, 2});
  const kiln::tensor classes = kiln::constant(labels, kiln::shape{256});

  kiln::variable w1(kiln::random::uniform({2, 16}, -1, 1, kiln::float32, 1), "w1");
  kiln::variable b1(kiln::zeros({16}), "b1");
  kiln::variable w2(kiln::random::uniform({16, 2}, -1, 1, kiln::float32, 2), "w2");
  kiln::variable b2(kiln::zeros({2}), "b2");
  kiln::variable requests(0, "requests");
  const std::vector<kiln::variable> weights = {w1, b1, w2, b2};
  kiln::optimizers::adam optimizer({.learning_rate = 0.01});

  auto logits_of = [&](const kiln::tensor& x) { return kiln::matmul(kiln::tanh(kiln::matmul(x, w1) + b1), w2) + b2; };
  kiln::function train_step([&](const kiln::tensor& x, const kiln::tensor& y) {
    kiln::gradient_tape tape;
    kiln::tensor loss = kiln::reduce_mean(kiln::sparse_softmax_cross_entropy(y, logits_of(x)));
    optimizer.apply_gradients(tape.gradient(loss, weights), weights);
    return loss;
  });
  // What the server runs: the class of each point and the model's confidence in it.
  kiln::function predict([&](const kiln::tensor& x) {
    requests.assign_add(kiln::shape_of(x)[0]);
    const kiln::tensor probabilities = kiln::softmax(logits_of(x));
    return std::tuple{kiln::argmax(probabilities, 1), kiln::reduce_max(probabilities, 1)};
  });

  for (int step = 1; step <= 300; ++step) {
    const float loss = train_step(features, classes).item<float>();
    if (step % 100 == 0) std::printf("trainer: step %d, loss %.2f\n", step, double(loss));
  }
  const auto [predicted, confidence] = predict(features);
  const float accuracy =
      kiln::reduce_mean(kiln::cast(kiln::equal(predicted, kiln::cast(classes, kiln::int64)), kiln::float32)).item<float>();
  std::printf("trainer: accuracy %.2f\n", double(accuracy));
  requests.assign(0);

  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("kiln_quadrants_" + std::to_string(::getpid()) + ".kiln");
  kiln::save(predict, file, kiln::tensor_spec({kiln::none, 2}, kiln::float32));
  std::printf("trainer: saved predict\n");
  std::fflush(stdout);

  const int status = std::system((std::string(argv[0]) + " serve " + file.string()).c_str());
  std::filesystem::remove(file);
  return status == 0 ? 0 : 1;
}

// examples/regression_trainer.cpp in libtorch (Debian's libtorch-dev 1.13), for
// bench/compile_times.sh: a 1 -> 16 -> 1 MLP (tanh) fits y = sin(3x) on 64 points of
// [-1, 1] with Adam, 20 epochs of 4 mini-batches, then saves the model (TorchScript
// has no traced function of a C++ model: torch::save writes its parameters).
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

struct mlp : torch::nn::Module {
  mlp() : hidden(register_module("hidden", torch::nn::Linear(1, 16))), out(register_module("out", torch::nn::Linear(16, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::tanh(hidden(x))); }
  torch::nn::Linear hidden, out;
};

int main() {
  torch::manual_seed(1);
  const torch::Tensor x = torch::linspace(-1, 1, 64).reshape({64, 1});
  const torch::Tensor y = torch::sin(3 * x);

  auto model = std::make_shared<mlp>();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.05));

  for (int epoch = 1; epoch <= 20; ++epoch) {
    float loss = 0;
    for (int batch = 0; batch < 4; ++batch) {
      optimizer.zero_grad();
      const torch::Tensor batch_loss =
          torch::mse_loss(model->forward(x.slice(0, 16 * batch, 16 * batch + 16)), y.slice(0, 16 * batch, 16 * batch + 16));
      batch_loss.backward();
      optimizer.step();
      loss += batch_loss.item<float>();
    }
    if (epoch % 5 == 0) std::printf("epoch %2d  loss %.3f\n", epoch, double(loss / 4));
  }
  torch::NoGradGuard no_grad;
  const float at_half = model->forward(torch::full({1, 1}, 0.5f)).item<float>();
  std::printf("f(0.5) = %.2f (sin(1.5) = %.2f)\n", double(at_half), std::sin(1.5));

  const std::filesystem::path file = std::filesystem::temp_directory_path() / ("torch_regression_" + std::to_string(::getpid()) + ".pt");
  torch::save(model, file.string());
  std::printf("saved the model\n");
  std::filesystem::remove(file);
}

// A 20-op model on the compile-time tier: a dense layer on 8x64 · 64x32, then
// elementwise ops and a reduction. bench/compile_cost.sh --typed compiles it beside
// eigen_model.cpp, the same model with Eigen's fixed-size matrices. It includes the
// compile-time tier alone, as a program that uses `fixed` only does.
#include <kiln/fixed.hpp>

#include <iostream>

int main() {
  kiln::function model([](const auto& x, const auto& w, const auto& b) {
    auto h = kiln::matmul(x, w) + b;
    auto a = kiln::tanh(h) * 0.5f + 0.25f;
    auto c = kiln::maximum(a, a * a - 0.1f);
    auto d = kiln::sigmoid(c * 2.f - 1.f) + kiln::abs(h) * 0.01f;
    auto e = kiln::relu(d - 0.3f) * d;
    return kiln::reduce_sum<1>(e * e + 1.f);
  });
  const auto x = kiln::fixed<float, 8, 64>::uniform(1, -1.f, 1.f);
  const auto w = kiln::fixed<float, 64, 32>::uniform(2, -1.f, 1.f);
  const auto b = kiln::fixed<float, 32>::uniform(3, -1.f, 1.f);
  std::cout << model(x, w, b) << "\n";
}

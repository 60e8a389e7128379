// typed_model.cpp's 20-op model with Eigen's fixed-size matrices.
#include <Eigen/Core>

#include <iostream>

int main() {
  using x_t = Eigen::Matrix<float, 8, 64, Eigen::RowMajor>;
  using w_t = Eigen::Matrix<float, 64, 32, Eigen::RowMajor>;
  using b_t = Eigen::Matrix<float, 1, 32>;
  auto model = [](const x_t& x, const w_t& w, const b_t& b) {
    const Eigen::Array<float, 8, 32, Eigen::RowMajor> h = ((x * w).rowwise() + b).array();
    const auto a = h.tanh() * 0.5f + 0.25f;
    const auto c = a.max(a * a - 0.1f);
    const Eigen::Array<float, 8, 32, Eigen::RowMajor> d = 1.f / (1.f + (-(c * 2.f - 1.f)).exp()) + h.abs() * 0.01f;
    const auto e = (d - 0.3f).max(0.f) * d;
    const Eigen::Array<float, 8, 1> r = (e * e + 1.f).rowwise().sum();
    return r;
  };
  const x_t x = x_t::Random();
  const w_t w = w_t::Random();
  const b_t b = b_t::Random();
  std::cout << model(x, w, b).transpose() << "\n";
}

// Writes model.kiln, the saved function that the package test's loader (loader.cpp)
// runs: f(x) = sqrt(matmul(reshape(conv2d(x, 2x2 ones, valid), [1, 4]), [1, 2, 3, 4]^T) - 3)
// for x of shape [1, 3, 3, 1]. Not part of the build: run it again if the format of
// saved functions changes,
//   g++ -std=c++20 -O1 -I include test/package/write_model.cpp -o write_model -ldl -lpthread
//   ./write_model test/package/model.kiln
#include <kiln/saved_function.hpp>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  kiln::function f([](const kiln::tensor& x) {
    const kiln::tensor windows = kiln::conv2d(x, kiln::ones({2, 2, 1, 1}), 1, "VALID");
    const kiln::tensor weights = kiln::constant(std::vector<float>{1, 2, 3, 4}, kiln::shape{4, 1});
    return kiln::sqrt(kiln::matmul(kiln::reshape(windows, {1, 4}), weights) - 3.f);
  });
  kiln::save(f, argv[1], kiln::tensor_spec({1, 3, 3, 1}, kiln::float32));
}

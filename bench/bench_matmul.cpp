/// \file
/// `matmul` of two 1024x1024 float32 matrices on 1 and 2 threads: kiln against
/// OpenBLAS (cblas_sgemm), Eigen and libtorch, in GFLOP/s (2 n^3 per product).

#include "bench_support.hpp"

#if KILN_BENCH_HAS_OPENBLAS
#include <cblas.h>
#endif
#if KILN_BENCH_HAS_EIGEN
#include <Eigen/Core>
#endif
#if KILN_BENCH_HAS_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#endif

namespace kiln::bench {
namespace {

constexpr std::int64_t n = matmul_size;
constexpr double flops = 2.0 * n * n * n;

/// The operands, row-major, shared by every peer.
struct matmul_operands {
  float_buffer a = make_filled(n * n, 0.f);
  float_buffer b = make_filled(n * n, 0.f);
  float_buffer c = make_filled(n * n, 0.f);
  matmul_operands() {
    fill_pattern(a.get(), n * n, 3);
    fill_pattern(b.get(), n * n, 4);
  }
  static matmul_operands& get() {
    static matmul_operands operands;
    return operands;
  }
};

void register_matmul(int threads) {
  register_case("matmul_1024", "kiln", threads, [threads](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    auto& m = matmul_operands::get();
    const kiln::tensor a = to_kiln(m.a.get(), kiln::shape{n, n});
    const kiln::tensor b = to_kiln(m.b.get(), kiln::shape{n, n});
    for (auto _ : state) benchmark::DoNotOptimize(kiln::matmul(a, b));
    set_flops(state, flops);
  });
#if KILN_BENCH_HAS_OPENBLAS
  register_case("matmul_1024", "openblas", threads, [threads](benchmark::State& state) {
    openblas_set_num_threads(threads);
    auto& m = matmul_operands::get();
    const auto ni = static_cast<blasint>(n);
    for (auto _ : state) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.f, m.a.get(), ni, m.b.get(), ni, 0.f,
                  m.c.get(), ni);
      benchmark::ClobberMemory();
    }
    set_flops(state, flops);
  });
#endif
#if KILN_BENCH_HAS_EIGEN
  register_case("matmul_1024", "eigen", threads, [threads](benchmark::State& state) {
    Eigen::setNbThreads(threads);
    auto& m = matmul_operands::get();
    using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const matrix> a(m.a.get(), n, n), b(m.b.get(), n, n);
    Eigen::Map<matrix> c(m.c.get(), n, n);
    for (auto _ : state) {
      c.noalias() = a * b;
      benchmark::ClobberMemory();
    }
    set_flops(state, flops);
  });
#endif
#if KILN_BENCH_HAS_TORCH
  register_case("matmul_1024", "libtorch", threads, [threads](benchmark::State& state) {
    at::set_num_threads(threads);
#if KILN_BENCH_HAS_OPENBLAS
    // Debian's torch multiplies through the same OpenBLAS, whose own thread count
    // at::set_num_threads leaves alone.
    openblas_set_num_threads(threads);
#endif
    auto& m = matmul_operands::get();
    const at::Tensor a = at::from_blob(m.a.get(), {n, n}, at::kFloat);
    const at::Tensor b = at::from_blob(m.b.get(), {n, n}, at::kFloat);
    for (auto _ : state) benchmark::DoNotOptimize(at::matmul(a, b));
    set_flops(state, flops);
  });
#endif
}

const bool registered = [] {
  for (int threads : {1, 2}) register_matmul(threads);
  return true;
}();

}  // namespace
}  // namespace kiln::bench

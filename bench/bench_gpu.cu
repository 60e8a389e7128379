/// \file
/// kiln on the GPU (its Thrust backend under nvcc) against hand-written CUDA kernels:
/// one op (`gpu_add_16M`), the five-op chain of bench_function.cpp eagerly and as a
/// kiln::function (`gpu_chain_16M`), and a 1024 x 1024 matmul (`gpu_matmul_1024`).
/// The hand-written kernels are the floor: the add and the chain each read their inputs
/// and write their output once; the chain fused into one kernel. PyTorch's CUDA peers
/// of the same cases are in peers_gpu.py. Every timed iteration ends with
/// cudaDeviceSynchronize, so a row is the wall time of finished work.
///
/// Built by nvcc only (KILN_ENABLE_CUDA, or bench/gpu.sh).

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

constexpr std::int64_t large_size = std::int64_t{1} << 24;
constexpr std::int64_t matmul_size = 1024;
constexpr float chain_scale = 0.5f, chain_offset = 1.f, chain_shift = 0.25f;

/// `tanh(x * 0.5 + 1) * x - 0.25`, as in bench_function.cpp.
template <class T>
T chain(const T& x) {
  return tanh(x * chain_scale + chain_offset) * x - chain_shift;
}

__global__ void add_kernel(const float* a, const float* b, float* c, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    c[i] = a[i] + b[i];
}
__global__ void chain_kernel(const float* x, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = tanhf(x[i] * chain_scale + chain_offset) * x[i] - chain_shift;
}
// One thread per output element over 16 x 16 shared-memory tiles: the textbook kernel,
// the level kiln's one-dot-product-per-element Thrust kernel is compared with.
__global__ void matmul_kernel(const float* a, const float* b, float* c, int n) {
  __shared__ float ta[16][16], tb[16][16];
  const int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < n; k0 += 16) {
    ta[threadIdx.y][threadIdx.x] = a[row * n + k0 + threadIdx.x];
    tb[threadIdx.y][threadIdx.x] = b[(k0 + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < 16; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  c[row * n + col] = acc;
}

void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}

/// Values in [-1, 1), the same pattern for every peer.
kiln::tensor pattern(const kiln::shape& s, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(s.num_elements()));
  std::uint32_t state = seed * 2654435761u + 1u;
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.f;
  }
  return kiln::constant(v, s).to(kiln::device::gpu);
}

/// The largest difference between two gpu tensors' values, read on the cpu.
double max_difference(const kiln::tensor& a, const kiln::tensor& b) {
  return kiln::reduce_max(kiln::abs(a.to(kiln::device::cpu) - b.to(kiln::device::cpu))).item<float>();
}

bool close_or_skip(benchmark::State& state, const kiln::tensor& got, const kiln::tensor& expected, double tolerance) {
  const double d = max_difference(got, expected);
  if (d <= tolerance) return true;
  state.SkipWithError(("result differs from the hand-written kernel by " + std::to_string(d)).c_str());
  return false;
}

const float* device_data(const kiln::tensor& t) { return static_cast<const float*>(t.raw_data()); }

struct operands {
  kiln::tensor a = pattern(kiln::shape{large_size}, 1), b = pattern(kiln::shape{large_size}, 2);
  kiln::tensor ma = pattern(kiln::shape{matmul_size, matmul_size}, 3), mb = pattern(kiln::shape{matmul_size, matmul_size}, 4);
  static const operands& get() {
    static const operands o;
    return o;
  }
};

constexpr int block = 256, grid = 132 * 16;

void gpu_add_16M_kiln(benchmark::State& state) {
  const operands& o = operands::get();
  for (auto _ : state) {
    benchmark::DoNotOptimize(o.a + o.b);
    check(cudaDeviceSynchronize());
  }
  state.SetBytesProcessed(state.iterations() * 3 * large_size * 4);
}
void gpu_add_16M_hand_cuda(benchmark::State& state) {
  const operands& o = operands::get();
  kiln::tensor c = kiln::zeros(kiln::shape{large_size}).to(kiln::device::gpu);
  add_kernel<<<grid, block>>>(device_data(o.a), device_data(o.b), const_cast<float*>(device_data(c)), large_size);
  check(cudaDeviceSynchronize());
  if (!close_or_skip(state, c, o.a + o.b, 0.0)) return;
  for (auto _ : state) {
    add_kernel<<<grid, block>>>(device_data(o.a), device_data(o.b), const_cast<float*>(device_data(c)), large_size);
    check(cudaDeviceSynchronize());
  }
  state.SetBytesProcessed(state.iterations() * 3 * large_size * 4);
}

/// The fused kernel's result, which kiln's must match.
const kiln::tensor& chain_expected() {
  static const kiln::tensor c = [] {
    kiln::tensor out = kiln::zeros(kiln::shape{large_size}).to(kiln::device::gpu);
    chain_kernel<<<grid, block>>>(device_data(operands::get().a), const_cast<float*>(device_data(out)), large_size);
    check(cudaDeviceSynchronize());
    return out;
  }();
  return c;
}
void gpu_chain_16M_hand_cuda(benchmark::State& state) {
  const operands& o = operands::get();
  kiln::tensor out = kiln::zeros(kiln::shape{large_size}).to(kiln::device::gpu);
  for (auto _ : state) {
    chain_kernel<<<grid, block>>>(device_data(o.a), const_cast<float*>(device_data(out)), large_size);
    check(cudaDeviceSynchronize());
  }
  state.SetBytesProcessed(state.iterations() * 2 * large_size * 4);
}
void gpu_chain_16M_kiln_eager(benchmark::State& state) {
  const operands& o = operands::get();
  if (!close_or_skip(state, chain(o.a), chain_expected(), 1e-6)) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(chain(o.a));
    check(cudaDeviceSynchronize());
  }
  state.SetBytesProcessed(state.iterations() * 2 * large_size * 4);
}
void gpu_chain_16M_kiln(benchmark::State& state) {
  const operands& o = operands::get();
  kiln::function f(chain<kiln::tensor>);
  if (!close_or_skip(state, f(o.a), chain_expected(), 1e-6)) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f(o.a));
    check(cudaDeviceSynchronize());
  }
  state.SetBytesProcessed(state.iterations() * 2 * large_size * 4);
}

void gpu_matmul_1024_hand_cuda(benchmark::State& state) {
  const operands& o = operands::get();
  kiln::tensor c = kiln::zeros(kiln::shape{matmul_size, matmul_size}).to(kiln::device::gpu);
  const dim3 tiles(matmul_size / 16, matmul_size / 16), threads(16, 16);
  for (auto _ : state) {
    matmul_kernel<<<tiles, threads>>>(device_data(o.ma), device_data(o.mb), const_cast<float*>(device_data(c)), int(matmul_size));
    check(cudaDeviceSynchronize());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * matmul_size * matmul_size * matmul_size * double(state.iterations()),
                                                  benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
void gpu_matmul_1024_kiln(benchmark::State& state) {
  const operands& o = operands::get();
  kiln::tensor expected = kiln::zeros(kiln::shape{matmul_size, matmul_size}).to(kiln::device::gpu);
  const dim3 tiles(matmul_size / 16, matmul_size / 16), threads(16, 16);
  matmul_kernel<<<tiles, threads>>>(device_data(o.ma), device_data(o.mb), const_cast<float*>(device_data(expected)), int(matmul_size));
  check(cudaDeviceSynchronize());
  if (!close_or_skip(state, kiln::matmul(o.ma, o.mb), expected, 1e-3)) return;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kiln::matmul(o.ma, o.mb));
    check(cudaDeviceSynchronize());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * matmul_size * matmul_size * matmul_size * double(state.iterations()),
                                                  benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

}  // namespace

BENCHMARK(gpu_add_16M_kiln)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(gpu_add_16M_hand_cuda)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(gpu_chain_16M_kiln_eager)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(gpu_chain_16M_kiln)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(gpu_chain_16M_hand_cuda)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(gpu_matmul_1024_kiln)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(gpu_matmul_1024_hand_cuda)->Unit(benchmark::kMicrosecond)->UseRealTime();

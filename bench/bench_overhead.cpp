/// \file
/// Eager per-op overhead: `a + b` on 10-element float32 tensors, where the arithmetic
/// is a few nanoseconds and everything else is dispatch, allocation and bookkeeping.

#include "bench_support.hpp"

#if KILN_BENCH_HAS_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#endif

namespace kiln::bench {
namespace {

const bool registered = [] {
  register_case("add_10", "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const kiln::tensor a = kiln::random::uniform(kiln::shape{tiny_size}, 0.f, 1.f, kiln::float32, 1);
    const kiln::tensor b = kiln::random::uniform(kiln::shape{tiny_size}, 0.f, 1.f, kiln::float32, 2);
    for (auto _ : state) benchmark::DoNotOptimize(a + b);
  })->Unit(benchmark::kNanosecond);
#if KILN_BENCH_HAS_TORCH
  register_case("add_10", "libtorch", 1, [](benchmark::State& state) {
    at::set_num_threads(1);
    const at::Tensor a = at::rand({tiny_size});
    const at::Tensor b = at::rand({tiny_size});
    for (auto _ : state) benchmark::DoNotOptimize(at::add(a, b));
  })->Unit(benchmark::kNanosecond);
#endif
  return true;
}();

}  // namespace
}  // namespace kiln::bench

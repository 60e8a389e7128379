/// \file
/// Memory-bound cases over 16M float32 (64 MiB per array): the machine's copy and read
/// bandwidth measured in the same run, then `a + b` and `reduce_sum`, each with every
/// peer at hand. report.py states kiln's throughput as a share of that bandwidth.

#include "bench_support.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__)
#include <immintrin.h>
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

using batch = xsimd::batch<float>;
constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
constexpr std::int64_t array_bytes = large_size * static_cast<std::int64_t>(sizeof(float));

void copy_xsimd(const float* src, float* dst, std::int64_t begin, std::int64_t end) {
  std::int64_t i = begin;
  for (; i + lanes <= end; i += lanes) batch::load_aligned(src + i).store_aligned(dst + i);
  std::copy(src + i, src + end, dst + i);
}

#if defined(__AVX512F__)
// Non-temporal stores write whole cache lines without first reading them in (no
// read-for-ownership), which is how memcpy moves large blocks; xsimd 8.1 has no
// streaming store, so the store is the AVX-512 intrinsic on the batch's register.
static_assert(lanes == 16, "-mavx512f gives xsimd 16-float batches");

void copy_xsimd_stream(const float* src, float* dst, std::int64_t begin, std::int64_t end) {
  std::int64_t i = begin;
  for (; i + lanes <= end; i += lanes) _mm512_stream_ps(dst + i, batch::load_aligned(src + i));
  _mm_sfence();
  std::copy(src + i, src + end, dst + i);
}

void add_xsimd_stream(const float* a, const float* b, float* c, std::int64_t begin, std::int64_t end) {
  std::int64_t i = begin;
  for (; i + lanes <= end; i += lanes)
    _mm512_stream_ps(c + i, batch::load_aligned(a + i) + batch::load_aligned(b + i));
  _mm_sfence();
  std::transform(a + i, a + end, b + i, c + i, std::plus<>());
}
#endif

void add_plain(const float* a, const float* b, float* c, std::int64_t begin, std::int64_t end) {
  std::transform(a + begin, a + end, b + begin, c + begin, std::plus<>());
}

void add_xsimd(const float* a, const float* b, float* c, std::int64_t begin, std::int64_t end) {
  std::int64_t i = begin;
  for (; i + lanes <= end; i += lanes) (batch::load_aligned(a + i) + batch::load_aligned(b + i)).store_aligned(c + i);
  add_plain(a, b, c, i, end);
}

// Four independent accumulators hide the latency of the vector add, so the loop is
// limited by memory, not by the dependency chain.
float sum_xsimd(const float* x, std::int64_t begin, std::int64_t end) {
  batch s0(0.f), s1(0.f), s2(0.f), s3(0.f);
  std::int64_t i = begin;
  for (; i + 4 * lanes <= end; i += 4 * lanes) {
    s0 += batch::load_aligned(x + i);
    s1 += batch::load_aligned(x + i + lanes);
    s2 += batch::load_aligned(x + i + 2 * lanes);
    s3 += batch::load_aligned(x + i + 3 * lanes);
  }
  float total = xsimd::hadd((s0 + s1) + (s2 + s3));
  for (; i < end; ++i) total += x[i];
  return total;
}

float sum_plain(const float* x, std::int64_t begin, std::int64_t end) {
  return std::accumulate(x + begin, x + end, 0.f);
}

template <class Sum>
float parallel_sum(int threads, const float* x, Sum sum) {
  std::vector<float> partial(static_cast<std::size_t>(threads), 0.f);
  parallel_ranges(threads, large_size, [&](std::int64_t b, std::int64_t e) {
    partial[static_cast<std::size_t>(omp_get_thread_num())] += sum(x, b, e);
  });
  return std::accumulate(partial.begin(), partial.end(), 0.f);
}

void register_bandwidth(int threads) {
  register_case("copy_64MiB", "memcpy", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) {
      parallel_ranges(threads, large_size, [&](std::int64_t b, std::int64_t e) {
        std::memcpy(m.c.get() + b, m.a.get() + b, static_cast<std::size_t>(e - b) * sizeof(float));
      });
      benchmark::ClobberMemory();
    }
    set_bytes(state, 2 * array_bytes);
  });
  register_case("copy_64MiB", "xsimd", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) {
      parallel_ranges(threads, large_size, [&](std::int64_t b, std::int64_t e) { copy_xsimd(m.a.get(), m.c.get(), b, e); });
      benchmark::ClobberMemory();
    }
    set_bytes(state, 2 * array_bytes);
  });
#if defined(__AVX512F__)
  register_case("copy_64MiB", "xsimd_stream", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) {
      parallel_ranges(threads, large_size,
                      [&](std::int64_t b, std::int64_t e) { copy_xsimd_stream(m.a.get(), m.c.get(), b, e); });
      benchmark::ClobberMemory();
    }
    set_bytes(state, 2 * array_bytes);
  });
#endif
  register_case("read_64MiB", "xsimd_sum", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) benchmark::DoNotOptimize(parallel_sum(threads, m.a.get(), sum_xsimd));
    set_bytes(state, array_bytes);
  });
}

void register_add(int threads) {
  constexpr std::int64_t bytes = 3 * array_bytes;  // two reads and one write
  register_case("add_16M", "kiln", threads, [threads](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    const auto& k = kiln_operands::get();
    for (auto _ : state) benchmark::DoNotOptimize(k.a + k.b);
    set_bytes(state, bytes);
  });
  register_case("add_16M", "hand_plain", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) {
      parallel_ranges(threads, large_size,
                      [&](std::int64_t b, std::int64_t e) { add_plain(m.a.get(), m.b.get(), m.c.get(), b, e); });
      benchmark::ClobberMemory();
    }
    set_bytes(state, bytes);
  });
  register_case("add_16M", "hand_xsimd", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) {
      parallel_ranges(threads, large_size,
                      [&](std::int64_t b, std::int64_t e) { add_xsimd(m.a.get(), m.b.get(), m.c.get(), b, e); });
      benchmark::ClobberMemory();
    }
    set_bytes(state, bytes);
  });
#if defined(__AVX512F__)
  register_case("add_16M", "hand_xsimd_stream", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) {
      parallel_ranges(threads, large_size,
                      [&](std::int64_t b, std::int64_t e) { add_xsimd_stream(m.a.get(), m.b.get(), m.c.get(), b, e); });
      benchmark::ClobberMemory();
    }
    set_bytes(state, bytes);
  });
#endif
#if KILN_BENCH_HAS_EIGEN
  // Eigen evaluates coefficient-wise expressions on the calling thread only.
  if (threads == 1) {
    register_case("add_16M", "eigen", threads, [](benchmark::State& state) {
      auto& m = large_arrays::get();
      Eigen::Map<const Eigen::ArrayXf> a(m.a.get(), large_size), b(m.b.get(), large_size);
      Eigen::Map<Eigen::ArrayXf> c(m.c.get(), large_size);
      for (auto _ : state) {
        c = a + b;
        benchmark::ClobberMemory();
      }
      set_bytes(state, bytes);
    });
  }
#endif
#if KILN_BENCH_HAS_TORCH
  // Eager torch allocates its result as kiln's eager ops do; `add_out` writes into a
  // buffer kept across calls, which shows how much of the cost is the allocation.
  register_case("add_16M", "libtorch", threads, [threads](benchmark::State& state) {
    at::set_num_threads(threads);
    auto& m = large_arrays::get();
    const at::Tensor a = at::from_blob(m.a.get(), {large_size}, at::kFloat);
    const at::Tensor b = at::from_blob(m.b.get(), {large_size}, at::kFloat);
    for (auto _ : state) benchmark::DoNotOptimize(at::add(a, b));
    set_bytes(state, bytes);
  });
  register_case("add_16M", "libtorch_out", threads, [threads](benchmark::State& state) {
    at::set_num_threads(threads);
    auto& m = large_arrays::get();
    const at::Tensor a = at::from_blob(m.a.get(), {large_size}, at::kFloat);
    const at::Tensor b = at::from_blob(m.b.get(), {large_size}, at::kFloat);
    at::Tensor c = at::from_blob(m.c.get(), {large_size}, at::kFloat);
    for (auto _ : state) {
      at::add_out(c, a, b);
      benchmark::ClobberMemory();
    }
    set_bytes(state, bytes);
  });
#endif
}

void register_reduce_sum(int threads) {
  register_case("reduce_sum_16M", "kiln", threads, [threads](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    const auto& k = kiln_operands::get();
    for (auto _ : state) benchmark::DoNotOptimize(kiln::reduce_sum(k.a).item<float>());
    set_bytes(state, array_bytes);
  });
  register_case("reduce_sum_16M", "hand_plain", threads, [threads](benchmark::State& state) {
    auto& m = large_arrays::get();
    for (auto _ : state) benchmark::DoNotOptimize(parallel_sum(threads, m.a.get(), sum_plain));
    set_bytes(state, array_bytes);
  });
#if KILN_BENCH_HAS_EIGEN
  if (threads == 1) {
    register_case("reduce_sum_16M", "eigen", threads, [](benchmark::State& state) {
      auto& m = large_arrays::get();
      Eigen::Map<const Eigen::ArrayXf> a(m.a.get(), large_size);
      for (auto _ : state) benchmark::DoNotOptimize(a.sum());
      set_bytes(state, array_bytes);
    });
  }
#endif
#if KILN_BENCH_HAS_TORCH
  register_case("reduce_sum_16M", "libtorch", threads, [threads](benchmark::State& state) {
    at::set_num_threads(threads);
    auto& m = large_arrays::get();
    const at::Tensor a = at::from_blob(m.a.get(), {large_size}, at::kFloat);
    for (auto _ : state) benchmark::DoNotOptimize(at::sum(a).item<float>());
    set_bytes(state, array_bytes);
  });
#endif
}

const bool registered = [] {
  for (int threads : {1, 2}) {
    register_bandwidth(threads);
    register_add(threads);
    register_reduce_sum(threads);
  }
  return true;
}();

}  // namespace
}  // namespace kiln::bench

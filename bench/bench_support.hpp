#pragma once
/// \file
/// What every benchmark file of the suite shares: the problem sizes, aligned buffers
/// that are allocated and touched once (so no peer pays page faults inside a timed
/// loop unless its own API allocates), a fork-join helper for the hand-written
/// loops, and the naming scheme `<case>/<peer>/threads:<n>` that report.py parses.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <omp.h>

#include <kiln/kiln.hpp>

namespace kiln::bench {

/// Elements of the large streaming cases: 16M float32 = 64 MiB per array.
inline constexpr std::int64_t large_size = std::int64_t{1} << 24;
/// Elements of the per-op overhead case.
inline constexpr std::int64_t tiny_size = 10;
/// Side of the square matmul case.
inline constexpr std::int64_t matmul_size = 1024;

/// Byte alignment of every buffer: a cache line, enough for AVX-512 aligned loads.
inline constexpr std::size_t alignment = 64;

struct aligned_free {
  void operator()(float* p) const { std::free(p); }
};

/// An owned, 64-byte-aligned float array.
/// Example: `auto x = make_filled(n, 1.f); x[0] += 1;`
using float_buffer = std::unique_ptr<float[], aligned_free>;

/// Allocates `n` floats, writes `value` to each so every page is resident.
/// Example: `float_buffer a = make_filled(large_size, 1.5f);`
inline float_buffer make_filled(std::int64_t n, float value) {
  const auto bytes = (static_cast<std::size_t>(n) * sizeof(float) + alignment - 1) / alignment * alignment;
  auto* p = static_cast<float*>(std::aligned_alloc(alignment, bytes));
  if (p == nullptr) throw std::bad_alloc();
  for (std::int64_t i = 0; i < n; ++i) p[i] = value;
  return float_buffer(p);
}

/// Fills `p[0..n)` with a deterministic pattern in [-1, 1), so sums and products
/// cannot be folded or skipped.
/// Example: `fill_pattern(a.get(), large_size, 7);`
inline void fill_pattern(float* p, std::int64_t n, std::uint32_t seed) {
  std::uint32_t state = seed * 2654435761u + 1u;
  for (std::int64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    p[i] = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.f;
  }
}

/// A kiln tensor holding a copy of `p[0..size)` in the given shape, so kiln and the
/// peers compute on the same values.
/// Example: `kiln::tensor a = to_kiln(m.a.get(), kiln::shape{large_size});`
inline kiln::tensor to_kiln(const float* p, const kiln::shape& s) {
  return kiln::constant(std::vector<float>(p, p + s.num_elements()), s);
}

/// The three 16M-element arrays of the streaming cases (inputs a, b; output c),
/// created on first use and shared by every peer.
struct large_arrays {
  float_buffer a = make_filled(large_size, 0.f);
  float_buffer b = make_filled(large_size, 0.f);
  float_buffer c = make_filled(large_size, 0.f);
  large_arrays() {
    fill_pattern(a.get(), large_size, 1);
    fill_pattern(b.get(), large_size, 2);
  }
  /// Example: `const float* a = large_arrays::get().a.get();`
  static large_arrays& get() {
    static large_arrays arrays;
    return arrays;
  }
};

/// kiln copies of the inputs of the streaming cases (`large_arrays`' a and b), made once
/// and shared by every kiln benchmark.
/// Example: `const kiln::tensor& a = kiln_operands::get().a;`
struct kiln_operands {
  kiln::tensor a = to_kiln(large_arrays::get().a.get(), kiln::shape{large_size});
  kiln::tensor b = to_kiln(large_arrays::get().b.get(), kiln::shape{large_size});
  static kiln_operands& get() {
    static kiln_operands operands;
    return operands;
  }
};

/// Runs `body(begin, end)` over consecutive 64-byte aligned chunks covering [0, n),
/// on `threads` OpenMP threads that take chunks as they finish (so a thread that the
/// busy machine preempts does not hold the others up, as kiln's pool does not). The
/// hand-written peers use it; OpenMP keeps its threads alive between calls, as kiln's
/// and the libraries' pools do.
/// Example: `parallel_ranges(2, n, [&](std::int64_t b, std::int64_t e) { ... });`
template <class Body>
void parallel_ranges(int threads, std::int64_t n, Body&& body) {
  if (threads <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  constexpr std::int64_t grain = alignment / sizeof(float);
  constexpr std::int64_t chunks_per_thread = 8;
  const std::int64_t chunks = threads * chunks_per_thread;
  const std::int64_t per_chunk = ((n + chunks - 1) / chunks + grain - 1) / grain * grain;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t begin = c * per_chunk < n ? c * per_chunk : n;
    const std::int64_t end = begin + per_chunk < n ? begin + per_chunk : n;
    if (begin < end) body(begin, end);
  }
}

/// How long idle worker threads of a multi-threaded peer may keep spinning after its
/// last call: OpenBLAS's spin for 2^28 cycles (about 0.1 s) before they sleep.
inline constexpr std::chrono::milliseconds spin_down_time{150};

/// Registers `fn` as `<case_name>/<peer>/threads:<threads>`, timed in wall-clock time
/// (the only fair clock for multi-threaded peers). After a multi-threaded case, the
/// untimed tail waits until its library's workers stop spinning, so that they do not
/// steal one of the two cores from whichever case runs next.
/// Example: `register_case("add_16M", "eigen", 1, [](benchmark::State& s) { ... });`
inline benchmark::internal::Benchmark* register_case(const std::string& case_name, const std::string& peer,
                                                     int threads, std::function<void(benchmark::State&)> fn) {
  const std::string name = case_name + "/" + peer + "/threads:" + std::to_string(threads);
  return benchmark::RegisterBenchmark(name.c_str(),
                                      [fn = std::move(fn), threads](benchmark::State& s) {
                                        fn(s);
                                        if (threads > 1) std::this_thread::sleep_for(spin_down_time);
                                      })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

/// Records the bytes one iteration moves, so the JSON carries `bytes_per_second`.
/// Example: `set_bytes(state, 3 * large_size * sizeof(float));`
inline void set_bytes(benchmark::State& state, std::int64_t bytes_per_iteration) {
  state.SetBytesProcessed(state.iterations() * bytes_per_iteration);
}

/// Records the floating-point operations of one iteration as the rate counter `flops`.
/// Example: `set_flops(state, 2.0 * n * n * n);`
inline void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["flops"] = benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
}

/// Whether `actual[0..n)` equals `expected[0..n)` to within `tolerance`, relative to
/// the magnitude (vectorised and scalar tanh differ in the last bits). If not, the
/// benchmark fails with the first difference, so a peer that computes something else
/// is never timed.
inline bool check_close(benchmark::State& state, const float* expected, const float* actual, std::int64_t n,
                 float tolerance = 1e-5f) {
  for (std::int64_t i = 0; i < n; ++i) {
    // Written so that a NaN fails.
    if (!(std::fabs(actual[i] - expected[i]) <= tolerance * (1.f + std::fabs(expected[i])))) {
      state.SkipWithError(("result differs from the reference at element " + std::to_string(i) + ": " +
                           std::to_string(actual[i]) + " instead of " + std::to_string(expected[i]))
                              .c_str());
      return false;
    }
  }
  return true;
}

/// Whether `actual` equals `expected` element for element; if not, the benchmark
/// fails, so a peer that computes something else is never timed.
inline bool check_equal(benchmark::State& state, const std::vector<std::int32_t>& expected, const std::int32_t* actual) {
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (actual[i] != expected[i]) {
      state.SkipWithError(("result differs from the reference at element " + std::to_string(i)).c_str());
      return false;
    }
  return true;
}


}  // namespace kiln::bench

/// \file
/// Costs that must grow with the work, no faster (section 20 of RESULTS.md):
/// - `growth_trace_<n>`: tracing, optimizing and planning a chain of n elementwise ops
///   (each with a captured scalar), and the first call; `growth_trace_grad_<n>` the same
///   with a gradient tape inside the function, whose backward pass joins the graph (the
///   function's destruction after each, its graphs and plans freed, is not timed);
/// - `growth_trace_clusters_<n>`: the same for a chain of n ops alternating a product
///   with a transpose on a (4, 4) tensor: a fused cluster of one op between every two
///   transposes, n / 2 clusters in all;
/// - `growth_while_grad_<n>`: a call of a function that differentiates a loop of n
///   iterations (a tape inside it: the backward pass runs the loop again, stacking the
///   loop variables its steps read, none for this recurrence, and walks it back);
/// - `growth_mod_loop`: a scalar while_loop of loop_trips iterations whose body is
///   `i + 1`, `s + cast(i % 7, int64)` (integer division and a cast), against section
///   12's `while_scalar` body;
/// - `growth_traces_memory`: what a function holds after 100 traces of shapes of a
///   million floats, against one trace (counters `one_trace_mb` and `traces_mb`).

#include "bench_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>

namespace kiln::bench {
namespace {

// The rows at 10⁵ ops time three calls each: on a shared virtual machine one call of
// the same code varied by 5 %. The loop rows run for the benchmark's minimum time,
// as most rows do, so that each times about as long a span: the fastest of a few
// 5 ms calls (10⁵ iterations) came out 2 % faster per iteration than the fastest of a
// few 50 ms calls, where ten 5 ms calls in a row took as long as one 50 ms call.

// Destroys the function `f` holds outside the timing: what the rows time is the trace,
// its optimization and plan (and the first call), not the freeing of its graphs.
template <class Function>
void untimed_reset(benchmark::State& state, std::optional<Function>& f) {
  state.PauseTiming();
  f.reset();
  state.ResumeTiming();
}

// y = x; then n times alternately y * 1.0001 and y + 0.5, each scalar captured anew.
kiln::tensor chain(const kiln::tensor& x, int n) {
  kiln::tensor y = x;
  for (int i = 0; i < n; ++i) y = (i % 2) ? y * 1.0001f : y + 0.5f;
  return y;
}

void register_trace(int n, const std::string& label) {
  for (const bool grad : {false, true}) {
    register_case(grad ? "growth_trace_grad_" + label : "growth_trace_" + label, "kiln", 1,
                  [n, grad](benchmark::State& state) {
                    kiln::config::set_num_threads(1);
                    const kiln::tensor x = kiln::ones({16});
                    auto body = [n, grad](const kiln::tensor& a) {
                      if (!grad) return chain(a, n);
                      kiln::gradient_tape tape;
                      tape.watch(a);
                      return tape.gradient(kiln::reduce_sum(chain(a, n)), a);
                    };
                    for (auto _ : state) {
                      std::optional<kiln::function<decltype(body)>> f(std::in_place, body);
                      benchmark::DoNotOptimize((*f)(x));  // traces, optimizes, plans and runs
                      untimed_reset(state, f);
                    }
                    state.counters["ops"] = double(n);
                  })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(n >= 100000 ? 3 : 5);
  }
}

// y = x; then n times alternately y * 1.0001 and its transpose: each product a cluster of its own.
kiln::tensor clusters_chain(const kiln::tensor& x, int n) {
  kiln::tensor y = x;
  for (int i = 0; i < n; ++i) y = (i % 2) ? kiln::transpose(y, {1, 0}) : y * 1.0001f;
  return y;
}

void register_trace_clusters(int n, const std::string& label) {
  register_case("growth_trace_clusters_" + label, "kiln", 1, [n](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const kiln::tensor x = kiln::ones({4, 4});
    auto body = [n](const kiln::tensor& a) { return clusters_chain(a, n); };
    for (auto _ : state) {
      std::optional<kiln::function<decltype(body)>> f(std::in_place, body);
      benchmark::DoNotOptimize((*f)(x));  // traces, optimizes, plans and runs
      untimed_reset(state, f);
    }
    state.counters["ops"] = double(n);
  })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(n >= 100000 ? 3 : 5);
}

// The loop's factor: its gradient, decay^n, stays a normal float32 up to 10^6
// iterations (4.5e-5). With 0.9999 the product falls under float32's smallest normal
// number after 873,000 iterations, and on x86 a multiply of a subnormal takes a
// microcode assist: the 10^6 row then timed the FPU as much as the loop.
constexpr float decay = 0.99999f;

void register_while_grad(int n, const std::string& label) {
  register_case("growth_while_grad_" + label, "kiln", 1, [n](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function f([](const kiln::tensor& x, const kiln::tensor& trips) {
      kiln::gradient_tape tape;
      tape.watch(x);
      const kiln::tensor y =
          kiln::for_range(trips, [](const kiln::tensor&, const kiln::tensor& s) { return s * decay + 0.001f; }, x);
      return tape.gradient(y, x);
    });
    const kiln::tensor x = kiln::constant(1.f), trips = kiln::constant(n);
    // d/dx of n steps of s * decay + 0.001 is decay^n.
    const float expected = float(std::pow(double(decay), n)), first = f(x, trips).item<float>();
    if (std::abs(first - expected) > 1e-3f * std::max(expected, 1e-3f)) {
      state.SkipWithError("the loop's gradient is wrong");
      return;
    }
    for (auto _ : state) benchmark::DoNotOptimize(f(x, trips));
    state.counters["iterations"] = double(n);
  })->Unit(benchmark::kMillisecond);
}

constexpr std::int32_t mod_trips = 100000;

void register_mod_loop() {
  register_case("growth_mod_loop", "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function f([](const kiln::tensor& n) {
      auto [i, s] = kiln::while_loop([&](const kiln::tensor& i, const kiln::tensor&) { return i < n; },
                                     [](const kiln::tensor& i, const kiln::tensor& s) {
                                       return std::tuple{i + 1, s + kiln::cast(i % 7, kiln::int64)};
                                     },
                                     kiln::constant(0), kiln::constant(std::int64_t(0)));
      return s;
    });
    std::int64_t expected = 0;
    for (std::int32_t i = 0; i < mod_trips; ++i) expected += i % 7;
    const kiln::tensor n = kiln::constant(mod_trips);
    if (f(n).item<std::int64_t>() != expected) {
      state.SkipWithError("the loop's sum is wrong");
      return;
    }
    for (auto _ : state) benchmark::DoNotOptimize(f(n));
    state.counters["iterations"] = double(mod_trips);
  })->Unit(benchmark::kMicrosecond);
}

void register_traces_memory() {
  register_case("growth_traces_memory", "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::config::set_warning_stream(nullptr);  // it retraces on purpose
    const auto& allocator = kiln::detail::host_allocator();
    double one = 0, all = 0;
    for (auto _ : state) {
      kiln::function f([](const kiln::tensor& x) {
        const kiln::tensor t = kiln::transpose(kiln::exp(x * 0.5f), {1, 0});
        return kiln::reduce_sum(kiln::transpose(t * t + 1.f, {1, 0}) - x);
      });
      const std::size_t before = allocator.live_large_bytes();
      for (std::int64_t k = 0; k < 100; ++k) {
        benchmark::DoNotOptimize(f(kiln::ones({1000 + k, 1000})));
        if (k == 0) one = double(allocator.live_large_bytes() - before);
      }
      all = double(allocator.live_large_bytes() - before);
    }
    state.counters["one_trace_mb"] = one / double(1 << 20);
    state.counters["traces_mb"] = all / double(1 << 20);
    kiln::config::set_warning_stream(&std::cerr);
  })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
}

const bool registered = [] {
  register_trace(1000, "1e3");
  register_trace(10000, "1e4");
  register_trace(100000, "1e5");
  register_trace_clusters(1000, "1e3");
  register_trace_clusters(10000, "1e4");
  register_trace_clusters(100000, "1e5");
  register_while_grad(10000, "1e4");
  register_while_grad(100000, "1e5");
  register_while_grad(1000000, "1e6");
  register_mod_loop();
  register_traces_memory();
  return true;
}();

}  // namespace
}  // namespace kiln::bench

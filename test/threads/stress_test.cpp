// kiln under contention: many threads calling one kiln::function (with one signature
// and with several), updating one variable inside functions, and sharing the caching
// allocator and the thread pool. Results must be right and every signature traced
// once; CI runs this file under ThreadSanitizer too (scripts/tsan.sh), which must
// report no race.

#include "../support/op_check.hpp"

#include <atomic>
#include <thread>
#include <vector>

using namespace kiln;

namespace {
constexpr int thread_count = 8;

/// Runs `body(t)` on `thread_count` threads at once and waits for them all.
template <class F>
void on_threads(F body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < thread_count; ++t)
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < thread_count) std::this_thread::yield();  // start together
      body(t);
    });
  for (std::thread& th : threads) th.join();
}

/// The element values 0, 1, ..., n - 1, as floats.
tensor iota(std::int64_t n) { return kiln::cast(kiln::range(std::int32_t(n)), float32); }
}  // namespace

TEST_CASE("threads calling one function with one signature share its single trace") {
  std::atomic<int> traces{0};
  function f([&](const tensor& x) {
    traces.fetch_add(1);
    return kiln::tanh(x * 0.5f) + x;
  }, {.name = "f"});
  const tensor x = iota(64);
  const std::vector<float> expected = (kiln::tanh(x * 0.5f) + x).to_vector<float>();
  std::atomic<int> wrong{0};
  on_threads([&](int) {
    for (int i = 0; i < 200; ++i)
      if (f(x).to_vector<float>() != expected) wrong.fetch_add(1);
  });
  CHECK(wrong.load() == 0);
  CHECK(traces.load() == 1);
  CHECK(f.tracing_count() == 1);
}

TEST_CASE("threads calling one function with different signatures trace each once") {
  std::atomic<int> traces{0};
  function f([&](const tensor& x) {
    traces.fetch_add(1);
    return kiln::reduce_sum(x * x);
  }, {.name = "f"});
  std::atomic<int> wrong{0};
  on_threads([&](int t) {
    // Thread t uses length t + 1 and, every other call, length t + 1 of the next thread.
    for (int i = 0; i < 100; ++i) {
      const std::int64_t n = (t + i % 2) % thread_count + 1;
      const float sum = f(iota(n)).item<float>();
      if (sum != float((n - 1) * n * (2 * n - 1) / 6)) wrong.fetch_add(1);
    }
  });
  CHECK(wrong.load() == 0);
  CHECK(traces.load() == thread_count);
  CHECK(f.tracing_count() == thread_count);
}

TEST_CASE("assign_add inside a function is atomic per call, from many threads") {
  variable counter(kiln::constant(std::int64_t(0)), "counter");
  variable total(kiln::zeros({16}), "total");
  function step([&](const tensor& x) {
    counter.assign_add(kiln::constant(std::int64_t(1)));
    return total.assign_add(x);
  }, {.name = "step"});
  constexpr int calls = 250;
  on_threads([&](int) {
    for (int i = 0; i < calls; ++i) step(kiln::ones({16}));
  });
  CHECK(counter.read_value().item<std::int64_t>() == thread_count * calls);
  CHECK(total.read_value().to_vector<float>() == std::vector<float>(16, float(thread_count * calls)));
}

TEST_CASE("the caching allocator and the thread pool under contention") {
  std::atomic<int> wrong{0};
  on_threads([&](int t) {
    for (int i = 0; i < 40; ++i) {
      // Small blocks (per-thread caches), large ones (the shared cache) and ops large
      // enough to use the thread pool from every thread at once.
      const std::int64_t n = (i % 3 == 0) ? 8 : (i % 3 == 1) ? 5000 : (std::int64_t{1} << 18) + t;
      const tensor a = kiln::fill({n}, float(t)), b = kiln::ones({n});
      const tensor c = a * 2.f + b;
      const tensor s = kiln::reduce_sum(c);
      if (s.item<float>() != float(n) * float(2 * t + 1)) wrong.fetch_add(1);
    }
  });
  CHECK(wrong.load() == 0);
}

#include <kiln/kiln.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

// Runs parallel_for(n, grain) and checks that its ranges cover [0, n) exactly once.
void check_covers_each_index_once(std::int64_t n, std::int64_t grain) {
  const auto size = static_cast<std::size_t>(n > 0 ? n : 0);
  auto hits = std::make_unique<std::atomic<int>[]>(size);
  std::atomic<bool> bad_range{false};
  kiln::detail::parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
    if (lo < 0 || hi > n || lo >= hi) bad_range = true;
    for (std::int64_t i = lo; i < hi && !bad_range; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
  });
  CHECK_FALSE(bad_range);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < size; ++i) wrong += hits[i].load() != 1;
  CHECK(wrong == 0);
}

// Restores the thread count a test changed.
struct thread_count_guard {
  int saved = kiln::config::num_threads();
  ~thread_count_guard() { kiln::config::set_num_threads(saved); }
};

}  // namespace

TEST_CASE("parallel_for covers every index exactly once", "[parallel]") {
  thread_count_guard guard;
  for (int threads : {1, 2, 4}) {
    kiln::config::set_num_threads(threads);
    for (std::int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      for (std::int64_t grain : {-1, 0, 1, 3, 64, 1 << 20}) {
        INFO("threads " << threads << ", n " << n << ", grain " << grain);
        check_covers_each_index_once(n, grain);
      }
    }
  }
}

TEST_CASE("parallel_for with a negative count does nothing", "[parallel]") {
  bool called = false;
  kiln::detail::parallel_for(-5, 1, [&](std::int64_t, std::int64_t) { called = true; });
  CHECK_FALSE(called);
}

TEST_CASE("nested parallel_for runs the inner loops completely", "[parallel]") {
  thread_count_guard guard;
  kiln::config::set_num_threads(4);
  constexpr std::int64_t outer = 50, inner = 200;
  std::vector<std::atomic<int>> hits(outer * inner);
  kiln::detail::parallel_for(outer, 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      kiln::detail::parallel_for(inner, 8, [&](std::int64_t ilo, std::int64_t ihi) {
        for (std::int64_t j = ilo; j < ihi; ++j) hits[static_cast<std::size_t>(i * inner + j)].fetch_add(1);
      });
    }
  });
  std::int64_t wrong = 0;
  for (auto& h : hits) wrong += h.load() != 1;
  CHECK(wrong == 0);
}

TEST_CASE("parallel_for from several threads at once", "[parallel]") {
  thread_count_guard guard;
  kiln::config::set_num_threads(3);
  constexpr std::int64_t n = 20000;
  std::vector<std::int64_t> sums(4, 0);
  std::vector<std::thread> callers;
  for (std::size_t c = 0; c < sums.size(); ++c) {
    callers.emplace_back([&, c] {
      std::atomic<std::int64_t> sum{0};
      kiln::detail::parallel_for(n, 100, [&](std::int64_t lo, std::int64_t hi) {
        std::int64_t local = 0;
        for (std::int64_t i = lo; i < hi; ++i) local += i;
        sum += local;
      });
      sums[c] = sum.load();
    });
  }
  for (auto& t : callers) t.join();
  for (std::int64_t s : sums) CHECK(s == n * (n - 1) / 2);
}

TEST_CASE("set_num_threads changes the pool size", "[parallel]") {
  thread_count_guard guard;
  kiln::config::set_num_threads(3);
  CHECK(kiln::config::num_threads() == 3);
  kiln::config::set_num_threads(1);
  CHECK(kiln::config::num_threads() == 1);
  kiln::config::set_num_threads(0);  // clamped: a pool always has the calling thread
  CHECK(kiln::config::num_threads() == 1);
  kiln::config::set_num_threads(-4);
  CHECK(kiln::config::num_threads() == 1);

  kiln::config::set_num_threads(2);
  std::mutex mutex;
  std::vector<std::thread::id> workers;
  kiln::detail::parallel_for(1000, 1, [&](std::int64_t, std::int64_t) {
    std::lock_guard lock(mutex);
    workers.push_back(std::this_thread::get_id());
  });
  CHECK(workers.size() >= 2);  // more than one chunk with two threads
}

TEST_CASE("back-to-back jobs, with pauses long enough for the workers to sleep, each run every chunk once", "[parallel]") {
  // Workers spin between jobs and then sleep: both ways of picking up a job, and a
  // job finishing before a worker comes, must run each chunk exactly once.
  kiln::detail::thread_pool pool(3);
  for (int round = 0; round < 400; ++round) {
    std::vector<std::atomic<int>> hits(37);
    pool.run(37, [&](std::int64_t i) { hits[std::size_t(i)].fetch_add(1); });
    int wrong = 0;
    for (const auto& h : hits) wrong += h.load() != 1;
    REQUIRE(wrong == 0);
    if (round % 100 == 99) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin
  }
}

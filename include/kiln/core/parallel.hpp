#pragma once
/// \file
/// A small fork-join thread pool for kernels over large tensors. The calling thread
/// works too, nested calls run inline, and calls from several user threads at once
/// are serialized (a second caller runs its loop itself rather than waiting).

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln {
namespace detail {

class thread_pool {
 public:
  explicit thread_pool(int threads) : size_(std::max(1, threads)) {
    for (int i = 1; i < size_; ++i) workers_.emplace_back([this] { work(); });
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return size_; }

  /// Calls `fn(i)` once for every i in [0, chunks), spread over the pool.
  template <class F>
  void run(std::int64_t chunks, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_erased(
        chunks, [](void* f, std::int64_t i) { (*static_cast<Fn*>(f))(i); },
        const_cast<std::remove_const_t<Fn>*>(std::addressof(fn)));
  }

 private:
  struct job {
    void (*call)(void*, std::int64_t);
    void* fn;
    std::int64_t chunks;
    std::atomic<std::int64_t> next{0};
    std::atomic<std::int64_t> finished{0};
  };

  // run() for any callable: compiled once, not once per kernel that runs in parallel.
  void run_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* fn) {
    if (chunks <= 0) return;
    std::unique_lock busy(run_mutex_, std::try_to_lock);
    if (chunks == 1 || size_ == 1 || inside_worker() || !busy.owns_lock()) {
      for (std::int64_t i = 0; i < chunks; ++i) call(fn, i);
      return;
    }
    job j{call, fn, chunks};
    {
      std::lock_guard lock(mutex_);
      job_ = &j;
      ++generation_;
    }
    wake_.notify_all();
    inside_worker() = true;
    drain(j);
    inside_worker() = false;
    // Wait until every worker that joined this job has left it, so `j` can die.
    std::unique_lock lock(mutex_);
    job_ = nullptr;
    done_.wait(lock, [&] { return j.finished.load(std::memory_order_acquire) == j.chunks && active_ == 0; });
  }

  static bool& inside_worker() {
    thread_local bool flag = false;
    return flag;
  }

  static void drain(job& j) {
    for (;;) {
      std::int64_t i = j.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= j.chunks) return;
      j.call(j.fn, i);
      j.finished.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void work() {
    inside_worker() = true;
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && job_ != nullptr); });
      if (stopping_) return;
      seen = generation_;
      job* j = job_;
      ++active_;
      lock.unlock();
      drain(*j);
      lock.lock();
      --active_;
      if (active_ == 0) done_.notify_all();
    }
  }

  int size_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  job* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int active_ = 0;
  bool stopping_ = false;
};

inline int default_thread_count() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

struct pool_holder {
  std::mutex mutex;
  std::shared_ptr<thread_pool> pool = std::make_shared<thread_pool>(default_thread_count());
};
inline pool_holder& pool_state() {
  static pool_holder holder;
  return holder;
}
inline std::shared_ptr<thread_pool> current_pool() {
  auto& s = pool_state();
  std::lock_guard lock(s.mutex);
  return s.pool;
}

/// parallel_for's ranges for any callable `call(fn, lo, hi)`, compiled once.
inline void parallel_ranges(std::int64_t n, std::int64_t grain, void (*call)(void*, std::int64_t, std::int64_t), void* fn) {
  auto pool = current_pool();
  std::int64_t chunks = std::min<std::int64_t>((n + grain - 1) / grain, 4 * std::int64_t(pool->size()));
  if (pool->size() == 1) chunks = 1;
  const std::int64_t step = (n + chunks - 1) / chunks;
  pool->run(chunks, [&](std::int64_t c) {
    const std::int64_t lo = c * step, hi = std::min(n, lo + step);
    if (lo < hi) call(fn, lo, hi);
  });
}

/// Runs `fn(lo, hi)` over [0, n) in contiguous ranges of at least `grain` items,
/// in parallel when the range is large enough to pay for it.
/// \code parallel_for(n, 1 << 16, [&](std::int64_t lo, std::int64_t hi) { ... }); \endcode
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  if (n <= grain) {
    fn(std::int64_t(0), n);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  parallel_ranges(
      n, grain, [](void* f, std::int64_t lo, std::int64_t hi) { (*static_cast<Fn*>(f))(lo, hi); },
      const_cast<std::remove_const_t<Fn>*>(std::addressof(fn)));
}

/// parallel_for, or with `Serial` (a range known at compile time to be no longer than
/// the grain) the one call parallel_for would make, without the thread pool compiled in.
template <bool Serial, class F>
void ranges_for(std::int64_t n, std::int64_t grain, F&& fn) {
  if constexpr (Serial) {
    if (n > 0) fn(std::int64_t(0), n);
  } else {
    parallel_for(n, grain, fn);
  }
}

}  // namespace detail

namespace config {
/// Sets how many threads kernels over large tensors use (default: hardware threads,
/// or the KILN_NUM_THREADS environment variable).
/// \code kiln::config::set_num_threads(1); \endcode
inline void set_num_threads(int n) {
  auto& s = kiln::detail::pool_state();
  auto fresh = std::make_shared<kiln::detail::thread_pool>(std::max(1, n));
  std::lock_guard lock(s.mutex);
  s.pool = std::move(fresh);
}
/// The number of threads kernels use.
inline int num_threads() { return kiln::detail::current_pool()->size(); }
}  // namespace config

}  // namespace kiln

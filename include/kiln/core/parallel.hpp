#pragma once
/// \file
/// A small fork-join thread pool for kernels over large tensors. The calling thread
/// works too, nested calls run inline, and calls from several user threads at once
/// are serialized (a second caller runs its loop itself rather than waiting).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "kiln/config.hpp"

namespace kiln {
namespace detail {

class thread_pool {
 public:
  KILN_LIBRARY_INLINE explicit thread_pool(int threads);
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  KILN_LIBRARY_INLINE ~thread_pool();

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
  };

  // How long a thread that waits spins before it sleeps. Waking a sleeping thread
  // takes tens of microseconds (more in a virtual machine), as long as a whole chunk
  // of a mid-sized matmul: a pool whose workers sleep between the jobs of one
  // computation adds that to every job, and two threads end up slower than one.
  // OpenMP runtimes and Eigen's pool spin for the same reason.
  static constexpr std::chrono::microseconds spin_time{200};

  // run() for any callable: compiled once, not once per kernel that runs in parallel.
  KILN_LIBRARY_INLINE void run_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* fn);

  KILN_LIBRARY_INLINE static bool& inside_worker();

  KILN_LIBRARY_INLINE static void drain(job& j);

  /// Spins until `ready()` or spin_time has passed; returns whether it is ready.
  template <class Ready>
  static bool spin_until(Ready&& ready) {
    const auto deadline = std::chrono::steady_clock::now() + spin_time;
    for (int i = 1;; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#else
      std::this_thread::yield();
#endif
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return false;
    }
  }

  KILN_LIBRARY_INLINE void work();

  int size_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  job* job_ = nullptr;                         // guarded by mutex_
  std::atomic<std::uint64_t> generation_{0};   // written under mutex_, read by spinning workers
  std::atomic<int> active_{0};                 // workers inside the current job
  int sleeping_ = 0;                           // guarded by mutex_
  std::atomic<bool> stopping_{false};
};

KILN_LIBRARY_INLINE int default_thread_count();

struct pool_holder {
  std::mutex mutex;
  std::shared_ptr<thread_pool> pool = std::make_shared<thread_pool>(default_thread_count());
};
KILN_LIBRARY_INLINE pool_holder& pool_state();
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE pool_holder& pool_state() {
  static pool_holder holder;
  return holder;
}
#endif
KILN_LIBRARY_INLINE std::shared_ptr<thread_pool> current_pool();

/// How many chunks `n` items (more than `grain`) split into on `threads` threads: at
/// least `grain` items each, at most four per thread, and as many for every thread.
KILN_LIBRARY_INLINE std::int64_t balanced_chunks(std::int64_t n, std::int64_t grain, std::int64_t threads);

/// parallel_for's ranges for any callable `call(fn, lo, hi)`, compiled once. A range
/// within the grain is one call here too, so that the body behind `call` is compiled
/// once, not again inline in each parallel_for.
KILN_LIBRARY_INLINE void parallel_ranges(std::int64_t n, std::int64_t grain,
                                         void (*call)(void*, std::int64_t, std::int64_t), void* fn);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE void parallel_ranges(std::int64_t n, std::int64_t grain,
                                         void (*call)(void*, std::int64_t, std::int64_t), void* fn) {
  if (n <= grain) {
    call(fn, 0, n);
    return;
  }
  auto pool = current_pool();
  const std::int64_t chunks = pool->size() == 1 ? 1 : balanced_chunks(n, grain, pool->size());
  const std::int64_t step = (n + chunks - 1) / chunks;
  pool->run(chunks, [&](std::int64_t c) {
    const std::int64_t lo = c * step, hi = std::min(n, lo + step);
    if (lo < hi) call(fn, lo, hi);
  });
}
#endif

/// Runs `fn(lo, hi)` over [0, n) in contiguous ranges of at least `grain` items,
/// in parallel when the range is large enough to pay for it.
/// \code
/// std::vector<float> v(1 << 20);
/// kiln::detail::parallel_for(std::int64_t(v.size()), 1 << 16, [&](std::int64_t lo, std::int64_t hi) {
///   std::fill(v.begin() + lo, v.begin() + hi, 1.f);
/// });
/// \endcode
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
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
KILN_LIBRARY_INLINE void set_num_threads(int n);
/// The number of threads kernels use.
KILN_LIBRARY_INLINE int num_threads();
}  // namespace config

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE thread_pool::thread_pool(int threads) : size_(std::max(1, threads)) {
  for (int i = 1; i < size_; ++i) workers_.emplace_back([this] { work(); });
}

KILN_LIBRARY_INLINE thread_pool::~thread_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

KILN_LIBRARY_INLINE void thread_pool::run_erased(std::int64_t chunks, void (*call)(void*, std::int64_t), void* fn) {
  if (chunks <= 0) return;
  std::unique_lock busy(run_mutex_, std::try_to_lock);
  if (chunks == 1 || size_ == 1 || inside_worker() || !busy.owns_lock()) {
    for (std::int64_t i = 0; i < chunks; ++i) call(fn, i);
    return;
  }
  job j{call, fn, chunks};
  bool sleepers = false;
  {
    std::lock_guard lock(mutex_);
    job_ = &j;
    generation_.fetch_add(1, std::memory_order_release);
    sleepers = sleeping_ > 0;
  }
  if (sleepers) wake_.notify_all();
  inside_worker() = true;
  drain(j);
  inside_worker() = false;
  {
    // No worker joins the job from here on; wait until those that joined have left
    // it, so that `j` can die.
    std::lock_guard lock(mutex_);
    job_ = nullptr;
  }
  if (spin_until([&] { return active_.load(std::memory_order_acquire) == 0; })) return;
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
}

KILN_LIBRARY_INLINE bool& thread_pool::inside_worker() {
  thread_local bool flag = false;
  return flag;
}

KILN_LIBRARY_INLINE void thread_pool::drain(job& j) {
  for (std::int64_t i; (i = j.next.fetch_add(1, std::memory_order_relaxed)) < j.chunks;) j.call(j.fn, i);
}

KILN_LIBRARY_INLINE void thread_pool::work() {
  inside_worker() = true;
  std::uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stopping_.load(); });
    std::unique_lock lock(mutex_);
    ++sleeping_;
    wake_.wait(lock, [&] { return stopping_.load() || generation_.load(std::memory_order_relaxed) != seen; });
    --sleeping_;
    if (stopping_) return;
    seen = generation_.load(std::memory_order_relaxed);
    job* j = job_;
    if (j == nullptr) continue;  // it finished before this thread came
    active_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    drain(*j);
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Taking the mutex orders this with the caller's check of active_: it either
      // sees zero or is already waiting when notified.
      std::lock_guard sync(mutex_);
      done_.notify_all();
    }
  }
}

KILN_LIBRARY_INLINE int default_thread_count() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

KILN_LIBRARY_INLINE std::shared_ptr<thread_pool> current_pool() {
  auto& s = pool_state();
  std::lock_guard lock(s.mutex);
  return s.pool;
}

KILN_LIBRARY_INLINE std::int64_t balanced_chunks(std::int64_t n, std::int64_t grain, std::int64_t threads) {
  const std::int64_t chunks = std::min((n + grain - 1) / grain, 4 * threads);
  return std::min(n, (chunks + threads - 1) / threads * threads);
}

}  // namespace kiln::detail

namespace kiln::config {

KILN_LIBRARY_INLINE void set_num_threads(int n) {
  auto& s = kiln::detail::pool_state();
  auto fresh = std::make_shared<kiln::detail::thread_pool>(std::max(1, n));
  std::lock_guard lock(s.mutex);
  s.pool = std::move(fresh);
}

KILN_LIBRARY_INLINE int num_threads() { return kiln::detail::current_pool()->size(); }

}  // namespace kiln::config
#endif  // KILN_DEFINE_LIBRARY

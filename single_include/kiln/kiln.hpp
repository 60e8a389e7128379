// kiln single header, generated from include/kiln/kiln.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
// ----- begin kiln/kiln.hpp -----
/// \file
/// The umbrella header: `#include <kiln/kiln.hpp>` gives the whole public API.

// ----- begin kiln/config.hpp -----
#include <cstddef>
/// \file
/// Version, feature macros and portability helpers shared by every kiln header.

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

// The Thrust backend is on when Thrust headers are reachable, unless the user
// opts out with KILN_NO_THRUST. nvcc builds run it on the GPU; host compilers
// run it on THRUST_DEVICE_SYSTEM (CPP or OMP), which is how CI exercises it.
#if !defined(KILN_NO_THRUST) && !defined(KILN_HAS_THRUST)
#  if defined(__has_include)
#    if __has_include(<thrust/version.h>)
#      define KILN_HAS_THRUST 1
#    endif
#  endif
#endif
#ifndef KILN_HAS_THRUST
#  define KILN_HAS_THRUST 0
#endif

#if defined(__CUDACC__)
#  define KILN_HAS_CUDA 1
#  define KILN_HOST_DEVICE __host__ __device__
#else
#  define KILN_HAS_CUDA 0
#  define KILN_HOST_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define KILN_ALWAYS_INLINE inline __attribute__((always_inline))
#  define KILN_RESTRICT __restrict__
#else
#  define KILN_ALWAYS_INLINE inline
#  define KILN_RESTRICT
#endif

namespace kiln {
/// Byte alignment of every tensor buffer: one cache line, and enough for AVX-512 loads.
inline constexpr std::size_t buffer_alignment = 64;
}  // namespace kiln
// ----- end kiln/config.hpp -----
// ----- begin kiln/core/error.hpp -----
/// \file
/// The exception hierarchy of API.md section 7.

#include <stdexcept>
#include <string>

namespace kiln {

/// Base of every error kiln raises. `catch (const kiln::error& e)` catches them all.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An argument has a value the operation cannot accept: an index out of range, a
/// call that does not match a concrete function's signature, a NaN under check_numerics.
/// \code throw kiln::invalid_argument_error("gather: index 7 is out of range [0, 3)"); \endcode
class invalid_argument_error : public error {
 public:
  using error::error;
};

/// A value has the right type but the wrong shape or structure (incompatible shapes,
/// mismatched branches, an input_signature mismatch).
class value_error : public error {
 public:
  using error::error;
};

/// A value has the wrong type: a dtype an op does not support, reading a symbolic tensor.
class type_error : public error {
 public:
  using error::error;
};

/// A capability this build does not have, such as the GPU device without a GPU backend.
class unavailable_error : public error {
 public:
  using error::error;
};

/// A broken internal invariant; reaching one is a kiln bug.
class internal_error : public error {
 public:
  using error::error;
};

}  // namespace kiln
// ----- end kiln/core/error.hpp -----
// ----- begin kiln/core/dtype.hpp -----
/// \file
/// Element types: the runtime `kiln::dtype` and its mapping to C++ types.

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>


namespace kiln {

/// The element type of a tensor, known at run time.
/// \code kiln::zeros({2}, kiln::int32).dtype() == kiln::int32 \endcode
enum class dtype : std::uint8_t { bool_, int32, int64, float32, float64, string };

inline constexpr dtype bool_ = dtype::bool_;      ///< C++ `bool`
inline constexpr dtype int32 = dtype::int32;      ///< C++ `std::int32_t`
inline constexpr dtype int64 = dtype::int64;      ///< C++ `std::int64_t`
inline constexpr dtype float32 = dtype::float32;  ///< C++ `float`
inline constexpr dtype float64 = dtype::float64;  ///< C++ `double`
inline constexpr dtype string = dtype::string;    ///< C++ `std::string`

/// Number of dtypes; tables indexed by dtype have this many rows.
inline constexpr int dtype_count = 6;

/// The name TensorFlow prints for a dtype: `bool`, `int32`, ..., `string`.
constexpr std::string_view name(dtype t) {
  constexpr std::string_view names[dtype_count] = {"bool", "int32", "int64", "float32", "float64", "string"};
  return names[static_cast<int>(t)];
}

inline std::ostream& operator<<(std::ostream& os, dtype t) { return os << name(t); }

/// A set of dtypes, used by op definitions to say what they accept.
/// \code constexpr kiln::dtype_set floats = kiln::dtype_set{kiln::float32, kiln::float64}; \endcode
class dtype_set {
 public:
  constexpr dtype_set() = default;
  constexpr dtype_set(std::initializer_list<dtype> ts) {
    for (dtype t : ts) bits_ |= bit(t);
  }
  constexpr bool contains(dtype t) const { return (bits_ & bit(t)) != 0; }
  constexpr dtype_set operator|(dtype_set o) const { return from_bits(bits_ | o.bits_); }
  constexpr dtype_set operator&(dtype_set o) const { return from_bits(bits_ & o.bits_); }
  constexpr bool operator==(const dtype_set&) const = default;

  // Public so that a dtype_set can be a template argument (a structural type).
  std::uint8_t bits_ = 0;

 private:
  static constexpr std::uint8_t bit(dtype t) { return std::uint8_t(1u << static_cast<int>(t)); }
  static constexpr dtype_set from_bits(std::uint8_t b) {
    dtype_set s;
    s.bits_ = b;
    return s;
  }
};

namespace dtypes {
inline constexpr dtype_set floating{float32, float64};
inline constexpr dtype_set integer{int32, int64};
inline constexpr dtype_set numeric = floating | integer;
inline constexpr dtype_set all{bool_, int32, int64, float32, float64, string};
}  // namespace dtypes

/// The dtype of a C++ element type; `dtype_of<float> == float32`. Only the six
/// element types of the contract have one.
template <class T>
inline constexpr bool has_dtype =
    std::is_same_v<T, bool> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::string>;

template <class T>
  requires has_dtype<T>
inline constexpr dtype dtype_of = std::is_same_v<T, bool>           ? bool_
                                  : std::is_same_v<T, std::int32_t> ? int32
                                  : std::is_same_v<T, std::int64_t> ? int64
                                  : std::is_same_v<T, float>        ? float32
                                  : std::is_same_v<T, double>       ? float64
                                                                    : string;

namespace detail {
template <dtype D> struct element_type_of;
template <> struct element_type_of<bool_> { using type = bool; };
template <> struct element_type_of<int32> { using type = std::int32_t; };
template <> struct element_type_of<int64> { using type = std::int64_t; };
template <> struct element_type_of<float32> { using type = float; };
template <> struct element_type_of<float64> { using type = double; };
template <> struct element_type_of<string> { using type = std::string; };
}  // namespace detail

/// The C++ element type of a dtype: `element_t<kiln::float32>` is `float`.
template <dtype D>
using element_t = typename detail::element_type_of<D>::type;

/// Bytes per element (`sizeof(std::string)` for strings).
constexpr std::size_t size_of(dtype t) {
  constexpr std::size_t sizes[dtype_count] = {sizeof(bool), 4, 8, 4, 8, sizeof(std::string)};
  return sizes[static_cast<int>(t)];
}

constexpr bool is_floating(dtype t) { return dtypes::floating.contains(t); }
constexpr bool is_integer(dtype t) { return dtypes::integer.contains(t); }

/// Calls `f(std::type_identity<T>{})` with the C++ element type of `t`; the
/// single switch from a runtime dtype to compiled code.
/// \code kiln::visit_dtype(x.dtype(), [&](auto tag) { using T = typename decltype(tag)::type; ... }); \endcode
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case bool_: return f(std::type_identity<bool>{});
    case int32: return f(std::type_identity<std::int32_t>{});
    case int64: return f(std::type_identity<std::int64_t>{});
    case float32: return f(std::type_identity<float>{});
    case float64: return f(std::type_identity<double>{});
    case string: return f(std::type_identity<std::string>{});
  }
  throw internal_error("visit_dtype: invalid dtype value " + std::to_string(static_cast<int>(t)));
}

}  // namespace kiln
// ----- end kiln/core/dtype.hpp -----
// ----- begin kiln/core/shape.hpp -----
/// \file
/// `kiln::shape`: a fixed-capacity, constexpr list of dims. Because it is a literal
/// type, every shape rule is a constexpr function usable by the compile-time tier.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <sstream>
#include <string>


namespace kiln {

/// A dim whose size is not known (only in specs); printed `None`.
inline constexpr std::int64_t none = -1;

/// Tag for a shape of unknown rank (only in specs); printed `<unknown>`.
/// \code kiln::tensor_spec(kiln::unknown_rank, kiln::float32) \endcode
struct unknown_rank_t {
  explicit constexpr unknown_rank_t() = default;
};
inline constexpr unknown_rank_t unknown_rank{};

/// The most dims a kiln tensor can have.
inline constexpr int max_rank = 8;

/// Dims of a tensor, row-major; `kiln::shape{}` is a scalar.
/// \code kiln::shape s{2, 3}; s.rank() == 2; s.num_elements() == 6; \endcode
class shape {
 public:
  constexpr shape() = default;
  constexpr shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
  constexpr explicit shape(std::span<const std::int64_t> dims) { assign(dims.data(), dims.size()); }
  constexpr shape(unknown_rank_t) : rank_(-1) {}

  /// `s.rank()` is the number of dims; -1 for an unknown rank.
  constexpr int rank() const { return rank_; }
  constexpr bool has_known_rank() const { return rank_ >= 0; }
  /// True when the rank and every dim are known.
  constexpr bool is_fully_defined() const {
    if (rank_ < 0) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] == none) return false;
    return true;
  }
  constexpr std::int64_t operator[](int i) const { return dims_[i]; }
  constexpr std::int64_t& operator[](int i) { return dims_[i]; }
  constexpr const std::int64_t* begin() const { return dims_.data(); }
  constexpr const std::int64_t* end() const { return dims_.data() + (rank_ < 0 ? 0 : rank_); }
  constexpr std::span<const std::int64_t> dims() const { return {begin(), end()}; }

  /// Product of the dims (1 for a scalar). Only meaningful for a fully defined shape.
  constexpr std::int64_t num_elements() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }

  /// Appends a dim; `shape{2}.push_back(3) == shape{2, 3}`.
  constexpr void push_back(std::int64_t d) {
    if (rank_ >= max_rank) throw value_error("kiln supports at most " + std::to_string(max_rank) + " dims");
    dims_[rank_++] = d;
  }

  constexpr bool operator==(const shape& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }

  /// True when a concrete shape `s` fits this spec (`none` dims and unknown rank match anything).
  constexpr bool accepts(const shape& s) const {
    if (rank_ < 0) return true;
    if (rank_ != s.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != none && dims_[i] != s.dims_[i]) return false;
    return true;
  }

  /// TensorFlow's text: `(2, 3)`, `()`, `(2,)`, `(None, 3)`, `<unknown>`.
  std::string str() const {
    if (rank_ < 0) return "<unknown>";
    std::string s = "(";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ", ";
      s += dims_[i] == none ? std::string("None") : std::to_string(dims_[i]);
    }
    if (rank_ == 1) s += ",";
    return s + ")";
  }

 private:
  constexpr void assign(const std::int64_t* d, std::size_t n) {
    if (n > std::size_t(max_rank)) throw value_error("kiln supports at most " + std::to_string(max_rank) + " dims");
    rank_ = static_cast<int>(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (d[i] < 0 && d[i] != none) throw value_error("shape dims must be >= 0 or kiln::none, got " + std::to_string(d[i]));
      dims_[i] = d[i];
    }
  }

  int rank_ = 0;
  std::array<std::int64_t, max_rank> dims_{};
};

inline std::ostream& operator<<(std::ostream& os, const shape& s) { return os << s.str(); }

/// Row-major strides of a shape, in elements.
constexpr std::array<std::int64_t, max_rank> row_major_strides(const shape& s) {
  std::array<std::int64_t, max_rank> st{};
  std::int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

}  // namespace kiln
// ----- end kiln/core/shape.hpp -----
// ----- begin kiln/core/device.hpp -----
/// \file
/// Where a tensor's buffer lives and its ops run.

#include <ostream>
#include <string_view>

namespace kiln {

/// The device of a tensor: `cpu` runs the xsimd kernels, `gpu` the Thrust kernels
/// (on CUDA when compiled by nvcc, on the host device system otherwise).
/// \code auto y = x.to(kiln::device::gpu); \endcode
enum class device : unsigned char { cpu, gpu };

constexpr std::string_view name(device d) { return d == device::cpu ? "cpu" : "gpu"; }
inline std::ostream& operator<<(std::ostream& os, device d) { return os << name(d); }

}  // namespace kiln
// ----- end kiln/core/device.hpp -----
// ----- begin kiln/core/parallel.hpp -----
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
    if (chunks <= 0) return;
    std::unique_lock busy(run_mutex_, std::try_to_lock);
    if (chunks == 1 || size_ == 1 || inside_worker() || !busy.owns_lock()) {
      for (std::int64_t i = 0; i < chunks; ++i) fn(i);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    job j{[](void* f, std::int64_t i) { (*static_cast<Fn*>(f))(i); }, &fn, chunks};
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

 private:
  struct job {
    void (*call)(void*, std::int64_t);
    void* fn;
    std::int64_t chunks;
    std::atomic<std::int64_t> next{0};
    std::atomic<std::int64_t> finished{0};
  };

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
  auto pool = current_pool();
  std::int64_t chunks = std::min<std::int64_t>((n + grain - 1) / grain, 4 * std::int64_t(pool->size()));
  if (pool->size() == 1) chunks = 1;
  std::int64_t step = (n + chunks - 1) / chunks;
  pool->run(chunks, [&](std::int64_t c) {
    std::int64_t lo = c * step, hi = std::min(n, lo + step);
    if (lo < hi) fn(lo, hi);
  });
}

}  // namespace detail

namespace config {
/// Sets how many threads kernels over large tensors use (default: hardware threads,
/// or the KILN_NUM_THREADS environment variable).
/// \code kiln::config::set_num_threads(1); \endcode
inline void set_num_threads(int n) {
  auto& s = detail::pool_state();
  auto fresh = std::make_shared<detail::thread_pool>(std::max(1, n));
  std::lock_guard lock(s.mutex);
  s.pool = std::move(fresh);
}
/// The number of threads kernels use.
inline int num_threads() { return detail::current_pool()->size(); }
}  // namespace config

}  // namespace kiln
// ----- end kiln/core/parallel.hpp -----
// ----- begin kiln/core/tensor.hpp -----
/// \file
/// `kiln::tensor`: the runtime-typed tensor of API.md section 1. Eager tensors own a
/// shared immutable buffer; symbolic tensors (inside a trace) carry a dtype, a
/// possibly partial shape and a handle to the graph value they stand for.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// ----- begin kiln/core/storage.hpp -----
/// \file
/// `storage`: one reference-counted, immutable-after-creation buffer of elements on
/// a device. Devices other than the CPU plug their memory in through a
/// `memory_resource`, so this layer knows nothing of backends.

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

// ----- begin kiln/core/allocator.hpp -----
/// \file
/// The host buffer allocator: 64-byte aligned, and caching large blocks, because a
/// fresh large buffer costs a page fault per 4 KiB on first touch (a new 64 MiB
/// buffer is several times slower to fill than a resident one).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>


namespace kiln::detail {

class caching_allocator {
 public:
  /// Blocks at least this large are kept for reuse when freed.
  static constexpr std::size_t cache_threshold = std::size_t(1) << 16;

  ~caching_allocator() { release_cached(); }

  void* allocate(std::size_t bytes) {
    std::size_t size = round_up(bytes);
    if (size >= cache_threshold) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_bytes_ -= size;
        return p;
      }
    }
    void* p = std::aligned_alloc(buffer_alignment, size);
    if (!p) throw std::bad_alloc();
    return p;
  }

  void deallocate(void* p, std::size_t bytes) {
    if (!p) return;
    std::size_t size = round_up(bytes);
    if (size >= cache_threshold) {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + size <= cache_limit_) {
        free_.emplace(size, p);
        cached_bytes_ += size;
        return;
      }
    }
    std::free(p);
  }

  /// Returns every cached block to the system.
  void release_cached() {
    std::lock_guard lock(mutex_);
    for (auto& [size, p] : free_) std::free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

 private:
  // Large sizes are rounded to 1/8 of their power of two, so blocks of nearby
  // sizes are interchangeable at a bounded (12.5%) waste.
  static std::size_t round_up(std::size_t bytes) {
    std::size_t size = (std::max<std::size_t>(bytes, 1) + buffer_alignment - 1) & ~(buffer_alignment - 1);
    if (size < cache_threshold) return size;
    std::size_t top = std::size_t(1) << (63 - __builtin_clzll(size));
    std::size_t step = top / 8;
    return (size + step - 1) & ~(step - 1);
  }

  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::size_t cached_bytes_ = 0;
  std::size_t cache_limit_ = std::size_t(2) << 30;
};

inline caching_allocator& host_allocator() {
  static caching_allocator instance;
  return instance;
}

}  // namespace kiln::detail
// ----- end kiln/core/allocator.hpp -----

namespace kiln::detail {

/// How a device allocates and copies its memory.
struct memory_resource {
  void* (*allocate)(std::size_t bytes);
  void (*deallocate)(void* p, std::size_t bytes);
  void (*copy_to_host)(void* host_dst, const void* src, std::size_t bytes);
  void (*copy_from_host)(void* dst, const void* host_src, std::size_t bytes);
};

inline const memory_resource& host_memory() {
  static const memory_resource r{
      [](std::size_t n) { return host_allocator().allocate(n); },
      [](void* p, std::size_t n) { host_allocator().deallocate(p, n); },
      [](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); },
      [](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); },
  };
  return r;
}

/// The GPU's memory, set by the Thrust backend when the build has one.
inline const memory_resource*& gpu_memory_slot() {
  static const memory_resource* r = nullptr;
  return r;
}

inline const memory_resource& memory_for(device d) {
  if (d == device::cpu) return host_memory();
  if (const memory_resource* r = gpu_memory_slot()) return *r;
  throw unavailable_error("kiln::device::gpu is not available: this build has no GPU backend (Thrust not found)");
}

class storage {
 public:
  storage(kiln::dtype t, std::int64_t count, kiln::device d)
      : dtype_(t), device_(d), count_(count), bytes_(std::size_t(count) * size_of(t)) {
    if (t == kiln::string && d != kiln::device::cpu)
      throw type_error("string tensors live on the cpu only; cannot place one on " + std::string(name(d)));
    data_ = memory_for(d).allocate(bytes_);
    if (t == kiln::string) {
      auto* s = static_cast<std::string*>(data_);
      for (std::int64_t i = 0; i < count; ++i) new (s + i) std::string();
    }
  }
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (dtype_ == kiln::string) {
      auto* s = static_cast<std::string*>(data_);
      for (std::int64_t i = 0; i < count_; ++i) s[i].~basic_string();
    }
    memory_for(device_).deallocate(data_, bytes_);
  }

  void* data() { return data_; }
  const void* data() const { return data_; }
  kiln::dtype dtype() const { return dtype_; }
  kiln::device device() const { return device_; }
  std::int64_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }

 private:
  kiln::dtype dtype_;
  kiln::device device_;
  std::int64_t count_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

}  // namespace kiln::detail
// ----- end kiln/core/storage.hpp -----

namespace kiln {

namespace detail {
/// The graph value a symbolic tensor stands for; defined by the tracer.
struct symbol;
}  // namespace detail

/// What a kernel sees of a tensor: its elements, dtype and shape. Kernels never
/// own or allocate; the caller passes views of inputs and a preallocated output.
struct buffer_view {
  void* data = nullptr;
  kiln::dtype dtype = kiln::float32;
  kiln::shape shape;

  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::int64_t size() const { return shape.num_elements(); }
};

/// A tensor with a runtime dtype, shape and device. Copies share the buffer.
/// \code
/// kiln::tensor x = kiln::constant({{1.f, 2.f}, {3.f, 4.f}});
/// x.shape();               // (2, 2)
/// (x + 1).to_vector<float>();  // {2, 3, 4, 5}
/// \endcode
class tensor {
 public:
  /// An empty handle; using it in an op raises kiln::invalid_argument_error.
  tensor() = default;

  /// An uninitialized eager tensor of the given dtype and shape (kernels fill it).
  tensor(kiln::dtype t, const kiln::shape& s, kiln::device d = kiln::device::cpu)
      : buffer_(std::make_shared<detail::storage>(t, checked_size(s), d)), shape_(s), dtype_(t), device_(d) {}

  /// A symbolic tensor standing for `sym` (used by the tracer).
  tensor(kiln::dtype t, const kiln::shape& s, std::shared_ptr<const detail::symbol> sym)
      : shape_(s), dtype_(t), symbol_(std::move(sym)) {}

  /// False for a default-constructed handle.
  bool defined() const { return buffer_ != nullptr || symbol_ != nullptr; }
  kiln::dtype dtype() const { return dtype_; }
  const kiln::shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  /// Number of elements.
  std::int64_t size() const { return shape_.num_elements(); }
  kiln::device device() const { return device_; }
  /// True inside a trace: the tensor has a dtype and shape but no value.
  bool is_symbolic() const { return symbol_ != nullptr; }
  const std::shared_ptr<const detail::symbol>& symbol() const { return symbol_; }

  /// The value of a scalar; `T` must be the tensor's element type.
  /// \code kiln::constant(3).item<int>() == 3 \endcode
  template <class T>
  T item() const {
    if (shape_.rank() != 0 && size() != 1)
      throw value_error("item() needs a tensor with one element, got shape " + shape_.str());
    return host_data<T>("item")[0];
  }

  /// The elements in row-major order; `T` must be the tensor's element type.
  /// \code kiln::range(3).to_vector<int>() == std::vector<int>{0, 1, 2} \endcode
  template <class T>
  std::vector<T> to_vector() const {
    if (device_ != kiln::device::cpu) return to(kiln::device::cpu).to_vector<T>();
    const T* p = host_data<T>("to_vector");
    return std::vector<T>(p, p + size());
  }

  /// Pointer to the first element of an eager tensor on the CPU.
  template <class T>
  const T* data() const {
    return host_data<T>("data");
  }

  /// A copy on device `d` (or this tensor, if it is there already).
  /// \code auto g = x.to(kiln::device::gpu); \endcode
  tensor to(kiln::device d) const {
    require_value("to");
    if (d == device_) return *this;
    tensor out(dtype_, shape_, d);
    const void* src = raw_data();
    std::size_t bytes = std::size_t(size()) * size_of(dtype_);
    if (d == kiln::device::cpu)
      detail::memory_for(device_).copy_to_host(out.raw_data(), src, bytes);
    else
      detail::memory_for(d).copy_from_host(out.raw_data(), src, bytes);
    return out;
  }

  /// Reads a scalar as a condition. A symbolic tensor cannot be tested with C++
  /// `if`/`while`: use kiln::cond and kiln::while_loop.
  explicit operator bool() const;

  /// `x[i]`: the i-th slice along the first axis (negative i counts from the end).
  tensor operator[](std::int64_t i) const;

  /// The kernel view of an eager tensor.
  buffer_view view() const { return {const_cast<void*>(raw_data()), dtype_, shape_}; }
  void* raw_data() const {
    return static_cast<char*>(const_cast<void*>(buffer_->data())) + offset_ * std::int64_t(size_of(dtype_));
  }
  /// A tensor sharing this one's buffer with another shape of the same size, or a
  /// contiguous window of it starting `offset` elements in.
  tensor share(const kiln::shape& s, std::int64_t offset = 0) const {
    tensor t = *this;
    t.shape_ = s;
    t.offset_ = offset_ + offset;
    return t;
  }

  /// Throws kiln::type_error when this tensor has no value (it is symbolic or empty).
  void require_value(std::string_view what) const {
    if (symbol_) throw type_error(std::string(what) + ": a symbolic tensor has no value; return it from the function instead");
    if (!buffer_) throw invalid_argument_error(std::string(what) + ": the tensor is empty (default-constructed)");
  }

 private:
  static std::int64_t checked_size(const kiln::shape& s) {
    if (!s.is_fully_defined()) throw value_error("an eager tensor needs a fully defined shape, got " + s.str());
    return s.num_elements();
  }

  template <class T>
  const T* host_data(const char* what) const {
    require_value(what);
    if constexpr (!has_dtype<T>) {
      static_assert(has_dtype<T>, "kiln tensors hold bool, int32_t, int64_t, float, double or std::string");
    } else if (dtype_of<T> != dtype_) {
      throw type_error(std::string(what) + "<" + std::string(name(dtype_of<T>)) + ">() on a tensor of dtype " +
                       std::string(name(dtype_)));
    }
    if (device_ != kiln::device::cpu)
      throw invalid_argument_error(std::string(what) + ": the tensor is on " + std::string(name(device_)) +
                                   "; copy it with .to(kiln::device::cpu) first");
    return static_cast<const T*>(raw_data());
  }

  std::shared_ptr<detail::storage> buffer_;
  std::int64_t offset_ = 0;
  kiln::shape shape_;
  kiln::dtype dtype_ = kiln::float32;
  kiln::device device_ = kiln::device::cpu;
  std::shared_ptr<const detail::symbol> symbol_;
};

}  // namespace kiln
// ----- end kiln/core/tensor.hpp -----

// ----- begin kiln/ops/op.hpp -----
/// \file
/// What every op definition provides, and the rules shared between op families.
///
/// An op is a type in kiln::ops holding its attributes, with
/// - `static constexpr std::string_view name`: the op's name in graphs and errors;
/// - `constexpr dtype_result result_dtype(std::span<const dtype>) const`;
/// - `constexpr shape_result result_shape(std::span<const shape>) const`.
/// Both rules are constexpr, so the compile-time tier turns a failure into a
/// `static_assert` and the runtime tier into a kiln::type_error / kiln::value_error.
/// Elementwise ops derive from `elementwise_op` and add a functor `operator()`.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>


namespace kiln {

/// Outcome of a dtype rule: the result dtype, or the reason there is none.
struct dtype_result {
  dtype value = float32;
  std::string_view failure{};
  constexpr bool ok() const { return failure.empty(); }
};

/// Outcome of a shape rule: the result shape, or the reason there is none.
struct shape_result {
  kiln::shape value{};
  std::string_view failure{};
  constexpr bool ok() const { return failure.empty(); }
};

/// A short constexpr list of integers (axes, permutations, strides), allowing negatives.
/// \code kiln::int_list perm{1, 0}; perm.size() == 2; \endcode
class int_list {
 public:
  constexpr int_list() = default;
  constexpr int_list(std::initializer_list<std::int64_t> v) {
    for (auto x : v) push_back(x);
  }
  constexpr explicit int_list(std::span<const std::int64_t> v) {
    for (auto x : v) push_back(x);
  }
  constexpr void push_back(std::int64_t x) {
    if (size_ >= max_rank) throw value_error("kiln supports at most " + std::to_string(max_rank) + " dims");
    items_[size_++] = x;
  }
  constexpr int size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr std::int64_t operator[](int i) const { return items_[i]; }
  constexpr const std::int64_t* begin() const { return items_.data(); }
  constexpr const std::int64_t* end() const { return items_.data() + size_; }
  constexpr bool operator==(const int_list& o) const {
    if (size_ != o.size_) return false;
    for (int i = 0; i < size_; ++i)
      if (items_[i] != o.items_[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < size_; ++i) s += (i ? ", " : "") + std::to_string(items_[i]);
    return s + "]";
  }

 private:
  int size_ = 0;
  std::array<std::int64_t, max_rank> items_{};
};

namespace ops {

/// Normalizes a possibly negative axis against `rank`; -1 when out of range.
constexpr int normalize_axis(std::int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) return -1;
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

/// One dim of a broadcast: sizes must match or one must be 1; `none` (unknown)
/// takes the other side's size unless that is 1.
constexpr std::int64_t broadcast_dim(std::int64_t a, std::int64_t b, bool& ok) {
  if (a == b) return a;
  if (a == 1) return b;
  if (b == 1) return a;
  if (a == none) return b;
  if (b == none) return a;
  ok = false;
  return 0;
}

/// NumPy broadcasting of two shapes.
/// \code static_assert(kiln::ops::broadcast_shapes({2, 1}, {3}).value == kiln::shape{2, 3}); \endcode
constexpr shape_result broadcast_shapes(const shape& a, const shape& b) {
  if (!a.has_known_rank() || !b.has_known_rank()) return {shape(unknown_rank)};
  int rank = a.rank() > b.rank() ? a.rank() : b.rank();
  shape out;
  bool ok = true;
  for (int i = 0; i < rank; ++i) {
    int ia = i - (rank - a.rank()), ib = i - (rank - b.rank());
    std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    out.push_back(broadcast_dim(da, db, ok));
  }
  if (!ok) return {{}, "shapes are not broadcast-compatible"};
  return {out};
}

/// Broadcast of any number of shapes.
constexpr shape_result broadcast_all(std::span<const shape> in) {
  shape_result r{in.empty() ? shape{} : in[0]};
  for (std::size_t i = 1; i < in.size() && r.ok(); ++i) r = broadcast_shapes(r.value, in[i]);
  return r;
}

/// How an elementwise op's result dtype follows from its inputs'.
enum class result_rule {
  same,            ///< the input dtype
  boolean,         ///< bool (comparisons)
  true_division,   ///< the input dtype, but float64 for integers (TensorFlow's `/`)
};

/// Base of elementwise ops: `arity` inputs of one dtype from `accepts`, broadcast
/// together. `simd` lists the dtypes whose functor also runs on xsimd batches.
template <int Arity, dtype_set Accepts, result_rule Rule = result_rule::same, dtype_set Simd = dtypes::floating>
struct elementwise_op {
  static constexpr int arity = Arity;
  static constexpr dtype_set accepts = Accepts;
  static constexpr dtype_set simd = Simd;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    for (dtype t : in)
      if (t != in[0]) return {in[0], "operands must have the same dtype"};
    if (!accepts.contains(in[0])) return {in[0], "dtype not supported"};
    switch (Rule) {
      case result_rule::boolean: return {bool_};
      case result_rule::true_division: return {is_integer(in[0]) ? float64 : in[0]};
      default: return {in[0]};
    }
  }
  constexpr shape_result result_shape(std::span<const shape> in) const { return broadcast_all(in); }
  constexpr bool operator==(const elementwise_op&) const = default;
};

template <class Op>
concept elementwise = requires {
  Op::arity;
  Op::accepts;
  Op::simd;
};

}  // namespace ops
}  // namespace kiln
// ----- end kiln/ops/op.hpp -----
// ----- begin kiln/ops/elementwise.hpp -----
/// \file
/// Elementwise ops: one functor each, written once in kiln::math so that it runs
/// on scalars, xsimd batches and in Thrust device code; NumPy broadcasting; C++
/// scalars promoted to the tensor operand's dtype.

#include <string>

// ----- begin kiln/ops/dispatch.hpp -----
/// \file
/// The single entry point through which every op function of the library runs:
/// `detail::apply(op, inputs...)`. It is declared here, below the op families, and
/// defined in kiln/eager/apply.hpp, which decides whether the op runs now (eager
/// tensors) or is recorded into a graph (symbolic tensors).

#include <array>
#include <concepts>
#include <span>
#include <string>
#include <type_traits>

// ----- begin kiln/ops/math.hpp -----
/// \file
/// The scalar arithmetic that elementwise functors are written in. Each function
/// works on a C++ scalar (host or CUDA device) and on an `xsimd::batch`, so one
/// functor serves the reference, CPU-SIMD and Thrust backends. Integer arithmetic
/// wraps (two's complement) instead of overflowing into undefined behaviour.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if !defined(__CUDA_ARCH__)
#include <xsimd/xsimd.hpp>
#endif


namespace kiln::math {

template <class T>
inline constexpr bool is_signed_integer = std::is_integral_v<T> && std::is_signed_v<T> && !std::is_same_v<T, bool>;

// ---- scalars -------------------------------------------------------------------

template <class T>
KILN_HOST_DEVICE constexpr T add(T a, T b) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(a) + std::make_unsigned_t<T>(b));
  else
    return a + b;
}
template <class T>
KILN_HOST_DEVICE constexpr T sub(T a, T b) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(a) - std::make_unsigned_t<T>(b));
  else
    return a - b;
}
template <class T>
KILN_HOST_DEVICE constexpr T mul(T a, T b) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(a) * std::make_unsigned_t<T>(b));
  else
    return a * b;
}
template <class T>
KILN_HOST_DEVICE constexpr T neg(T a) {
  if constexpr (is_signed_integer<T>)
    return T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(a));
  else
    return -a;
}
template <class T>
KILN_HOST_DEVICE constexpr T abs(T a) {
  if constexpr (std::is_floating_point_v<T>)
    return std::fabs(a);
  else
    return a < T(0) ? neg(a) : a;
}
template <class T>
KILN_HOST_DEVICE constexpr T max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    return (a > b || a != a) ? a : b;  // NaN propagates, as in TensorFlow
  else
    return a > b ? a : b;
}
template <class T>
KILN_HOST_DEVICE constexpr T min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    return (a < b || a != a) ? a : b;
  else
    return a < b ? a : b;
}
template <class T>
KILN_HOST_DEVICE constexpr T select(bool c, T a, T b) {
  return c ? a : b;
}

/// Floor division: rounds toward negative infinity. An integer division by zero
/// gives 0 (callers reject it before running), INT_MIN / -1 wraps.
template <class T>
KILN_HOST_DEVICE constexpr T floordiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::floor(a / b);
  } else {
    if (b == T(0)) return T(0);
    if (b == T(-1)) return neg(a);
    T q = a / b;
    return (a % b != T(0) && ((a < T(0)) != (b < T(0)))) ? T(q - 1) : q;
  }
}
/// Floor modulo: the result has the sign of the divisor, as Python's `%`.
template <class T>
KILN_HOST_DEVICE constexpr T floormod(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    T r = std::fmod(a, b);
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r;
  } else {
    if (b == T(0) || b == T(-1)) return T(0);
    T r = a % b;
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? T(r + b) : r;
  }
}
/// Power; integer exponents use exact square-and-multiply (negative ones give 0,
/// and callers reject them before running).
template <class T>
KILN_HOST_DEVICE constexpr T pow(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::pow(a, b);
  } else {
    if (b < T(0)) return T(0);
    T result = T(1);
    while (b != T(0)) {
      if (b & T(1)) result = mul(result, a);
      a = mul(a, a);
      b = T(b >> 1);
    }
    return result;
  }
}
template <class T>
KILN_HOST_DEVICE T exp(T a) {
  return std::exp(a);
}
template <class T>
KILN_HOST_DEVICE T log(T a) {
  return std::log(a);
}
template <class T>
KILN_HOST_DEVICE T sqrt(T a) {
  return std::sqrt(a);
}
template <class T>
KILN_HOST_DEVICE T tanh(T a) {
  return std::tanh(a);
}

/// Converts between element types without undefined behaviour: floats to integers
/// saturate (NaN gives 0), anything to bool tests for non-zero.
template <class To, class From>
KILN_HOST_DEVICE constexpr To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    if (v != v) return To(0);
    if (v <= From(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (v >= From(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return To(v);
  } else {
    return To(v);
  }
}

// ---- SIMD batches (host only) ---------------------------------------------------

#if !defined(__CUDA_ARCH__)
template <class T, class A>
xsimd::batch<T, A> add(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return a + b; }
template <class T, class A>
xsimd::batch<T, A> sub(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return a - b; }
template <class T, class A>
xsimd::batch<T, A> mul(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return a * b; }
template <class T, class A>
xsimd::batch<T, A> neg(const xsimd::batch<T, A>& a) { return -a; }
template <class T, class A>
xsimd::batch<T, A> abs(const xsimd::batch<T, A>& a) { return xsimd::abs(a); }
template <class T, class A>
xsimd::batch<T, A> max(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  if constexpr (std::is_floating_point_v<T>)
    return xsimd::select((a > b) | (a != a), a, b);
  else
    return xsimd::max(a, b);
}
template <class T, class A>
xsimd::batch<T, A> min(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  if constexpr (std::is_floating_point_v<T>)
    return xsimd::select((a < b) | (a != a), a, b);
  else
    return xsimd::min(a, b);
}
template <class T, class A>
xsimd::batch<T, A> select(const xsimd::batch_bool<T, A>& c, const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  return xsimd::select(c, a, b);
}
template <class T, class A>
xsimd::batch<T, A> floordiv(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return xsimd::floor(a / b); }
template <class T, class A>
xsimd::batch<T, A> floormod(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  auto r = xsimd::fmod(a, b);
  auto zero = xsimd::batch<T, A>(T(0));
  return xsimd::select((r != zero) & ((r < zero) != (b < zero)), r + b, r);
}
template <class T, class A>
xsimd::batch<T, A> pow(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) { return xsimd::pow(a, b); }
template <class T, class A>
xsimd::batch<T, A> exp(const xsimd::batch<T, A>& a) { return xsimd::exp(a); }
template <class T, class A>
xsimd::batch<T, A> log(const xsimd::batch<T, A>& a) { return xsimd::log(a); }
template <class T, class A>
xsimd::batch<T, A> sqrt(const xsimd::batch<T, A>& a) { return xsimd::sqrt(a); }
template <class T, class A>
xsimd::batch<T, A> tanh(const xsimd::batch<T, A>& a) { return xsimd::tanh(a); }
#endif

}  // namespace kiln::math
// ----- end kiln/ops/math.hpp -----

namespace kiln {
namespace detail {

/// Runs (or records) `op` on `inputs` and returns its result.
template <class Op>
tensor apply_span(const Op& op, std::span<const tensor* const> inputs);

template <class Op, std::same_as<tensor>... Ts>
tensor apply(const Op& op, const Ts&... inputs) {
  std::array<const tensor*, sizeof...(Ts)> ptrs{&inputs...};
  return apply_span(op, std::span<const tensor* const>(ptrs));
}

/// A scalar tensor holding `value` converted to dtype `t` on device `d`.
template <class S>
tensor make_scalar(kiln::dtype t, S value, kiln::device d) {
  tensor out(t, shape{}, kiln::device::cpu);
  visit_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, std::string> || std::is_convertible_v<S, std::string>) {
      if constexpr (std::is_same_v<T, std::string> && std::is_convertible_v<S, std::string>)
        *out.view().template as<T>() = std::string(value);
      else
        throw type_error("cannot combine a " + std::string(name(t)) + " tensor with a " +
                         (std::is_convertible_v<S, std::string> ? std::string("string") : std::string("numeric")) +
                         " C++ value");
    } else {
      *out.view().template as<T>() = math::convert<T>(value);
    }
  });
  return d == kiln::device::cpu ? out : out.to(d);
}

}  // namespace detail

/// A C++ value that kiln promotes to a tensor when it meets one in an op: numbers
/// take the other operand's dtype (`x + 1`), strings join string tensors (`s + "!"`).
template <class S>
concept promotable_scalar = std::is_arithmetic_v<S> || std::is_convertible_v<S, std::string>;

}  // namespace kiln
// ----- end kiln/ops/dispatch.hpp -----

namespace kiln::ops {

using dtypes::all;
using dtypes::floating;
using dtypes::numeric;
inline constexpr dtype_set numeric_and_string = numeric | dtype_set{string};
inline constexpr dtype_set logical{bool_};

// ---- unary ------------------------------------------------------------------
struct negate : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "neg";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::neg(a); }
};
struct abs : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "abs";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::abs(a); }
};
struct exp : elementwise_op<1, floating> {
  static constexpr std::string_view name = "exp";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::exp(a); }
};
struct log : elementwise_op<1, floating> {
  static constexpr std::string_view name = "log";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::log(a); }
};
struct sqrt : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sqrt";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::sqrt(a); }
};
struct square : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "square";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::mul(a, a); }
};
struct tanh : elementwise_op<1, floating> {
  static constexpr std::string_view name = "tanh";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::tanh(a); }
};
struct sigmoid : elementwise_op<1, floating> {
  static constexpr std::string_view name = "sigmoid";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return T(1) / (T(1) + math::exp(math::neg(a))); }
};
struct relu : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "relu";
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return math::max(a, T(0)); }
};
struct logical_not : elementwise_op<1, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_not";
  KILN_HOST_DEVICE bool operator()(bool a) const { return !a; }
};
/// Converts to `to`; the kernels' element conversion (math::convert) does the work.
struct cast : elementwise_op<1, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "cast";
  dtype to = float32;
  constexpr cast() = default;
  constexpr explicit cast(dtype target) : to(target) {}
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if ((in[0] == string) != (to == string)) return {to, "cannot cast between string and other dtypes"};
    return {to};
  }
  template <class T> KILN_HOST_DEVICE T operator()(T a) const { return a; }
  constexpr bool operator==(const cast&) const = default;
};

// ---- binary -----------------------------------------------------------------
struct add : elementwise_op<2, numeric_and_string, result_rule::same, numeric> {
  static constexpr std::string_view name = "add";
  template <class T> KILN_HOST_DEVICE T operator()(const T& a, const T& b) const {
    if constexpr (std::is_same_v<T, std::string>)
      return a + b;
    else
      return math::add(a, b);
  }
};
struct subtract : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "sub";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::sub(a, b); }
};
struct multiply : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "mul";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::mul(a, b); }
};
/// True division: integers divide as float64, as TensorFlow's `/`.
struct divide : elementwise_op<2, numeric, result_rule::true_division> {
  static constexpr std::string_view name = "truediv";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>)
      return double(a) / double(b);
    else
      return a / b;
  }
};
struct floordiv : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "floordiv";
  static constexpr bool integer_divisor = true;  // an integer divisor of 0 is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::floordiv(a, b); }
};
struct floormod : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "floormod";
  static constexpr bool integer_divisor = true;
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::floormod(a, b); }
};
struct pow : elementwise_op<2, numeric> {
  static constexpr std::string_view name = "pow";
  static constexpr bool integer_exponent = true;  // a negative integer exponent is rejected
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::pow(a, b); }
};
struct maximum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "maximum";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::max(a, b); }
};
struct minimum : elementwise_op<2, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "minimum";
  template <class T> KILN_HOST_DEVICE T operator()(T a, T b) const { return math::min(a, b); }
};
struct less : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a < b; }
};
struct less_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "less_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a <= b; }
};
struct greater : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a > b; }
};
struct greater_equal : elementwise_op<2, numeric, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "greater_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(T a, T b) const { return a >= b; }
};
struct equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a == b; }
};
struct not_equal : elementwise_op<2, all, result_rule::boolean, numeric> {
  static constexpr std::string_view name = "not_equal";
  template <class T> KILN_HOST_DEVICE auto operator()(const T& a, const T& b) const { return a != b; }
};
struct logical_and : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_and";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};
struct logical_or : elementwise_op<2, logical, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "logical_or";
  KILN_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};

// ---- ternary ----------------------------------------------------------------
/// `where(cond, a, b)`: a bool condition choosing between two values of one dtype.
struct where : elementwise_op<3, all, result_rule::same, dtype_set{}> {
  static constexpr std::string_view name = "select";
  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (in[0] != bool_) return {in[1], "the condition must be a bool tensor"};
    if (in[1] != in[2]) return {in[1], "both branches must have the same dtype"};
    return {in[1]};
  }
  template <class T> KILN_HOST_DEVICE T operator()(bool c, const T& a, const T& b) const { return c ? a : b; }
};

}  // namespace kiln::ops

namespace kiln {

// Each function builds its op and hands it to detail::apply. The operators take a
// C++ scalar on either side and convert it to the tensor operand's dtype.
#define KILN_UNARY_FUNCTION(fn, op)                                                  \
  inline tensor fn(const tensor& x) { return detail::apply(ops::op{}, x); }
#define KILN_BINARY_FUNCTION(fn, op)                                                 \
  inline tensor fn(const tensor& x, const tensor& y) { return detail::apply(ops::op{}, x, y); } \
  template <promotable_scalar S>                                                     \
  tensor fn(const tensor& x, const S& y) {                                           \
    return detail::apply(ops::op{}, x, detail::make_scalar(x.dtype(), y, x.device())); \
  }                                                                                  \
  template <promotable_scalar S>                                                     \
  tensor fn(const S& x, const tensor& y) {                                           \
    return detail::apply(ops::op{}, detail::make_scalar(y.dtype(), x, y.device()), y); \
  }

/// `kiln::negative(x)`, also `-x`: elementwise negation.
KILN_UNARY_FUNCTION(negative, negate)
/// `kiln::abs(kiln::constant({-1, 2}))` is `[1 2]`.
KILN_UNARY_FUNCTION(abs, abs)
/// `kiln::exp(x)`: e to the x, for float tensors.
KILN_UNARY_FUNCTION(exp, exp)
/// `kiln::log(x)`: natural logarithm, for float tensors.
KILN_UNARY_FUNCTION(log, log)
/// `kiln::sqrt(x)`: square root, for float tensors.
KILN_UNARY_FUNCTION(sqrt, sqrt)
/// `kiln::square(x)` is `x * x`.
KILN_UNARY_FUNCTION(square, square)
/// `kiln::tanh(x)`: hyperbolic tangent, for float tensors.
KILN_UNARY_FUNCTION(tanh, tanh)
/// `kiln::sigmoid(x)` is `1 / (1 + exp(-x))`.
KILN_UNARY_FUNCTION(sigmoid, sigmoid)
/// `kiln::relu(x)` is `maximum(x, 0)`.
KILN_UNARY_FUNCTION(relu, relu)
/// `kiln::logical_not(b)` on a bool tensor.
KILN_UNARY_FUNCTION(logical_not, logical_not)

/// `kiln::add(x, y)`, also `x + y`; concatenates string tensors.
KILN_BINARY_FUNCTION(add, add)
/// `kiln::subtract(x, y)`, also `x - y`.
KILN_BINARY_FUNCTION(subtract, subtract)
/// `kiln::multiply(x, y)`, also `x * y`.
KILN_BINARY_FUNCTION(multiply, multiply)
/// `kiln::divide(x, y)`, also `x / y`: true division (integers give float64).
KILN_BINARY_FUNCTION(divide, divide)
/// `kiln::floordiv(7, kiln::constant(-2))` is `-4`: division rounding down.
KILN_BINARY_FUNCTION(floordiv, floordiv)
/// `kiln::floormod(x, y)`, also `x % y`: the remainder takes the divisor's sign.
KILN_BINARY_FUNCTION(floormod, floormod)
/// `kiln::pow(x, 2)`: x to the power y.
KILN_BINARY_FUNCTION(pow, pow)
/// `kiln::maximum(x, 0)`: elementwise larger value.
KILN_BINARY_FUNCTION(maximum, maximum)
/// `kiln::minimum(x, y)`: elementwise smaller value.
KILN_BINARY_FUNCTION(minimum, minimum)
/// `kiln::equal(x, y)`, also `x == y`: a bool tensor.
KILN_BINARY_FUNCTION(equal, equal)
/// `kiln::not_equal(x, y)`, also `x != y`.
KILN_BINARY_FUNCTION(not_equal, not_equal)
/// `kiln::less(x, y)`, also `x < y`.
KILN_BINARY_FUNCTION(less, less)
/// `kiln::less_equal(x, y)`, also `x <= y`.
KILN_BINARY_FUNCTION(less_equal, less_equal)
/// `kiln::greater(x, y)`, also `x > y`.
KILN_BINARY_FUNCTION(greater, greater)
/// `kiln::greater_equal(x, y)`, also `x >= y`.
KILN_BINARY_FUNCTION(greater_equal, greater_equal)
/// `kiln::logical_and(a, b)` on bool tensors.
KILN_BINARY_FUNCTION(logical_and, logical_and)
/// `kiln::logical_or(a, b)` on bool tensors.
KILN_BINARY_FUNCTION(logical_or, logical_or)

#undef KILN_UNARY_FUNCTION
#undef KILN_BINARY_FUNCTION

/// `kiln::cast(x, kiln::int32)`: converts elements (floats to integers truncate
/// toward zero and saturate; NaN becomes 0).
inline tensor cast(const tensor& x, dtype to) { return detail::apply(ops::cast(to), x); }

/// `kiln::where(x > 0, x, 0.f)`: picks from `a` where `cond` holds, else from `b`.
inline tensor where(const tensor& cond, const tensor& a, const tensor& b) { return detail::apply(ops::where{}, cond, a, b); }
template <promotable_scalar S>
tensor where(const tensor& cond, const tensor& a, const S& b) {
  return where(cond, a, detail::make_scalar(a.dtype(), b, a.device()));
}
template <promotable_scalar S>
tensor where(const tensor& cond, const S& a, const tensor& b) {
  return where(cond, detail::make_scalar(b.dtype(), a, b.device()), b);
}

inline tensor operator-(const tensor& x) { return negative(x); }

#define KILN_BINARY_OPERATOR(sym, fn)                                                \
  inline tensor operator sym(const tensor& x, const tensor& y) { return fn(x, y); } \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const tensor& x, const S& y) { return fn(x, y); }              \
  template <promotable_scalar S>                                                     \
  tensor operator sym(const S& x, const tensor& y) { return fn(x, y); }
KILN_BINARY_OPERATOR(+, add)
KILN_BINARY_OPERATOR(-, subtract)
KILN_BINARY_OPERATOR(*, multiply)
KILN_BINARY_OPERATOR(/, divide)
KILN_BINARY_OPERATOR(%, floormod)
KILN_BINARY_OPERATOR(==, equal)
KILN_BINARY_OPERATOR(!=, not_equal)
KILN_BINARY_OPERATOR(<, less)
KILN_BINARY_OPERATOR(<=, less_equal)
KILN_BINARY_OPERATOR(>, greater)
KILN_BINARY_OPERATOR(>=, greater_equal)
#undef KILN_BINARY_OPERATOR

}  // namespace kiln
// ----- end kiln/ops/elementwise.hpp -----
// ----- begin kiln/ops/registry.hpp -----
/// \file
/// The op registry: every op type, one row each, in one list. Graphs store an op as
/// a `std::variant` over this list, and the cross-backend suite walks it; the count
/// `static_assert` makes adding an op without its row (or the reverse) a compile error.

#include <cstddef>
#include <string_view>
#include <variant>


namespace kiln::ops {

template <class... Ops>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ops);
};

template <class... Lists>
struct concat_lists;
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};

using elementwise_ops =
    type_list<negate, abs, exp, log, sqrt, square, tanh, sigmoid, relu, logical_not, cast,                    //
              add, subtract, multiply, divide, floordiv, floormod, pow, maximum, minimum,                      //
              less, less_equal, greater, greater_equal, equal, not_equal, logical_and, logical_or, where>;
static_assert(elementwise_ops::size == 29, "an elementwise op was added or removed: update the list and the tests");

/// Every op kiln defines.
using all_ops = typename concat_lists<elementwise_ops>::type;

}  // namespace kiln::ops
// ----- end kiln/ops/registry.hpp -----

// ----- begin kiln/backend/backend.hpp -----
/// \file
/// Backends are tag types. A backend implements op `Op` by providing an overload
///   void compute(Tag, const Op&, std::span<const buffer_view> inputs, const buffer_view& output);
/// found by argument-dependent lookup; `supports<Tag, Op>` asks whether one exists.
/// The output is preallocated with the dtype and shape the op's rules gave.

#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <string>
#include <type_traits>
#include <utility>


namespace kiln::backend {

/// Plain scalar loops: the executable specification every other backend is tested against.
struct reference_backend {
  static constexpr std::string_view name = "reference";
};
/// SIMD (xsimd) and multi-threaded kernels for device::cpu.
struct cpu_backend {
  static constexpr std::string_view name = "cpu";
};
/// Thrust kernels for device::gpu (CUDA under nvcc, the host device system otherwise).
struct thrust_backend {
  static constexpr std::string_view name = "thrust";
};

/// True when backend `B` has a kernel for op `Op`.
/// \code static_assert(kiln::backend::supports<kiln::backend::cpu_backend, kiln::ops::add>); \endcode
template <class B, class Op>
concept supports = requires(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  compute(B{}, op, in, out);
};

/// Strides (in elements) of an input broadcast to `out`: 0 along broadcast dims.
/// Aligned to the output's rank.
constexpr std::array<std::int64_t, max_rank> broadcast_strides(const shape& in, const shape& out) {
  std::array<std::int64_t, max_rank> st{};
  std::int64_t acc = 1;
  int offset = out.rank() - in.rank();
  for (int i = in.rank() - 1; i >= 0; --i) {
    st[i + offset] = in[i] == 1 ? 0 : acc;
    acc *= in[i];
  }
  return st;
}

template <class Op, class In, class Seq = std::make_index_sequence<Op::arity>>
struct elementwise_result;
template <class Op, class In, std::size_t... I>
struct elementwise_result<Op, In, std::index_sequence<I...>> {
  using type = std::decay_t<decltype(std::declval<const Op&>()((void(I), std::declval<const In&>())...))>;
};
template <class Op, class In>
struct elementwise_result<Op, In, std::index_sequence<0, 1, 2>> {  // where(cond, a, b)
  using type = std::decay_t<decltype(std::declval<const Op&>()(true, std::declval<const In&>(), std::declval<const In&>()))>;
};
/// The C++ type an elementwise op produces from operands of type `In`.
template <class Op, class In>
using elementwise_result_t = typename elementwise_result<Op, In>::type;

/// Calls `f.template operator()<In, Out>()` with the C++ types an elementwise op
/// reads and writes, instantiating only the dtypes the op accepts. `In` is the
/// dtype of the value operands (for `where`, the branches).
template <ops::elementwise Op, class F>
void visit_elementwise_types([[maybe_unused]] const Op& op, dtype in, dtype out, F&& f) {
  visit_dtype(in, [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    if constexpr (Op::accepts.contains(dtype_of<In>)) {
      if constexpr (std::is_same_v<Op, ops::cast>) {
        visit_dtype(out, [&](auto out_tag) {
          using Out = typename decltype(out_tag)::type;
          if constexpr (std::is_same_v<In, std::string> == std::is_same_v<Out, std::string>) f.template operator()<In, Out>();
        });
      } else {
        using Out = elementwise_result_t<Op, In>;
        if (dtype_of<Out> != out) throw internal_error(std::string(Op::name) + ": unexpected output dtype");
        f.template operator()<In, Out>();
      }
    } else {
      throw internal_error(std::string(Op::name) + ": dtype " + std::string(name(in)) + " reached a kernel");
    }
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/backend.hpp -----
// ----- begin kiln/backend/reference/elementwise.hpp -----
/// \file
/// Reference elementwise kernel: one output element at a time, each input index
/// computed from scratch. Slow and obviously right.

#include <span>


namespace kiln::backend {

template <ops::elementwise Op>
void compute(reference_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& os = out.shape;
  std::array<std::array<std::int64_t, max_rank>, 3> strides{};
  for (int k = 0; k < Op::arity; ++k) strides[k] = broadcast_strides(in[k].shape, os);
  auto offset = [&](int k, std::int64_t flat) {
    std::int64_t off = 0;
    for (int d = os.rank() - 1; d >= 0; --d) {
      off += (flat % os[d]) * strides[k][d];
      flat /= os[d];
    }
    return off;
  };
  dtype value_dtype = in[Op::arity == 3 ? 1 : 0].dtype;
  visit_elementwise_types(op, value_dtype, out.dtype, [&]<class In, class Out>() {
    Out* o = out.as<Out>();
    for (std::int64_t i = 0, n = os.num_elements(); i < n; ++i) {
      if constexpr (Op::arity == 1)
        o[i] = math::convert<Out>(op(in[0].as<In>()[offset(0, i)]));
      else if constexpr (Op::arity == 2)
        o[i] = math::convert<Out>(op(in[0].as<In>()[offset(0, i)], in[1].as<In>()[offset(1, i)]));
      else
        o[i] = op(in[0].as<bool>()[offset(0, i)], in[1].as<In>()[offset(1, i)], in[2].as<In>()[offset(2, i)]);
    }
  });
}

}  // namespace kiln::backend
// ----- end kiln/backend/reference/elementwise.hpp -----
// ----- begin kiln/backend/cpu/elementwise.hpp -----
/// \file
/// CPU elementwise kernel. Broadcast dims are collapsed so the loop nest is as
/// short as possible; the innermost run is an xsimd loop specialised on which
/// operands are contiguous and which are broadcast; large outputs are split over
/// the thread pool.

#include <span>
#include <type_traits>

#include <xsimd/xsimd.hpp>


namespace kiln::backend {
namespace cpu {

/// Elements per parallel task: below this, threads cost more than they save.
inline constexpr std::int64_t elementwise_grain = std::int64_t(1) << 16;

/// The loop nest of an elementwise op after merging dims that every operand
/// walks contiguously (or every operand broadcasts).
template <int Arity>
struct loop_nest {
  int rank = 0;
  std::array<std::int64_t, max_rank> size{};
  std::array<std::array<std::int64_t, max_rank>, Arity> stride{};

  loop_nest(std::span<const buffer_view> in, const shape& out) {
    std::array<std::array<std::int64_t, max_rank>, Arity> full{};
    for (int k = 0; k < Arity; ++k) full[k] = broadcast_strides(in[k].shape, out);
    for (int d = 0; d < out.rank(); ++d) {
      if (out[d] == 1) continue;  // size-1 dims contribute nothing
      bool merge = rank > 0;
      for (int k = 0; k < Arity && merge; ++k) merge = stride[k][rank - 1] == full[k][d] * out[d];
      if (merge) {
        size[rank - 1] *= out[d];
        for (int k = 0; k < Arity; ++k) stride[k][rank - 1] = full[k][d];
      } else {
        size[rank] = out[d];
        for (int k = 0; k < Arity; ++k) stride[k][rank] = full[k][d];
        ++rank;
      }
    }
    if (rank == 0) {  // a scalar, or all dims of size 1
      rank = 1;
      size[0] = 1;
    }
  }
};

template <class T>
inline constexpr bool simd_type =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

/// One contiguous run of `len` outputs. Bit k of `Contig` says operand k advances
/// by one element per output; otherwise it is broadcast (stride 0).
/// Operand k starts at `p[k]`; for `where`, operand 0 is the bool condition.
template <unsigned Contig, class Op, class In, class Out, int Arity>
void inner_run(const Op& op, Out* KILN_RESTRICT o, const std::array<const void*, Arity>& p, std::int64_t len) {
  auto at = [&](int k, std::int64_t i) -> const In& {
    return static_cast<const In*>(p[k])[(Contig >> k) & 1u ? i : 0];
  };
  std::int64_t i = 0;
  if constexpr (std::is_same_v<In, Out> && simd_type<In> && Op::simd.contains(dtype_of<In>) && Arity <= 2) {
    using B = xsimd::batch<In>;
    constexpr std::int64_t w = B::size;
    auto load = [&](int k, std::int64_t j) {
      const In* q = static_cast<const In*>(p[k]);
      return (Contig >> k) & 1u ? B::load_unaligned(q + j) : B(q[0]);
    };
    for (; i + w <= len; i += w) {
      if constexpr (Arity == 1)
        op(load(0, i)).store_unaligned(o + i);
      else
        op(load(0, i), load(1, i)).store_unaligned(o + i);
    }
  }
  for (; i < len; ++i) {
    if constexpr (Arity == 1)
      o[i] = math::convert<Out>(op(at(0, i)));
    else if constexpr (Arity == 2)
      o[i] = math::convert<Out>(op(at(0, i), at(1, i)));
    else
      o[i] = op(static_cast<const bool*>(p[0])[(Contig & 1u) ? i : 0], at(1, i), at(2, i));
  }
}

template <class Op, class In, class Out, int Arity, unsigned Contig = 0>
void dispatch_run(unsigned contig, const Op& op, Out* o, const std::array<const void*, Arity>& p, std::int64_t len) {
  if constexpr (Contig == (1u << Arity)) {
    (void)contig, (void)op, (void)o, (void)p, (void)len;
  } else if (contig == Contig) {
    inner_run<Contig, Op, In, Out, Arity>(op, o, p, len);
  } else {
    dispatch_run<Op, In, Out, Arity, Contig + 1>(contig, op, o, p, len);
  }
}

template <class Op, class In, class Out>
void run_elementwise(const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  constexpr int arity = Op::arity;
  const std::int64_t n = out.size();
  if (n == 0) return;
  const loop_nest<arity> nest(in, out.shape);
  const int r = nest.rank;
  const std::int64_t inner = nest.size[r - 1];
  unsigned contig = 0;
  for (int k = 0; k < arity; ++k)
    if (nest.stride[k][r - 1] == 1) contig |= 1u << k;
  // `where` reads its condition as bool and its branches as In; byte offsets differ.
  auto base = [&](int k) { return static_cast<const char*>(in[k].data); };
  auto elem_size = [&](int k) { return (arity == 3 && k == 0) ? sizeof(bool) : sizeof(In); };

  detail::parallel_for(n, elementwise_grain, [&](std::int64_t lo, std::int64_t hi) {
    std::array<std::int64_t, max_rank> idx{};
    for (std::int64_t rest = lo, d = r - 1; d >= 0; --d) {
      idx[d] = rest % nest.size[d];
      rest /= nest.size[d];
    }
    while (lo < hi) {
      std::int64_t len = std::min(inner - idx[r - 1], hi - lo);
      std::array<const void*, arity> p{};
      for (int k = 0; k < arity; ++k) {
        std::int64_t off = 0;
        for (int d = 0; d < r; ++d) off += idx[d] * nest.stride[k][d];
        p[k] = base(k) + off * std::int64_t(elem_size(k));
      }
      dispatch_run<Op, In, Out, arity>(contig, op, out.as<Out>() + lo, p, len);
      lo += len;
      idx[r - 1] += len;
      for (int d = r - 1; d > 0 && idx[d] == nest.size[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

}  // namespace cpu

template <ops::elementwise Op>
void compute(cpu_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  dtype value_dtype = in[Op::arity == 3 ? 1 : 0].dtype;
  visit_elementwise_types(op, value_dtype, out.dtype,
                          [&]<class In, class Out>() { cpu::run_elementwise<Op, In, Out>(op, in, out); });
}

}  // namespace kiln::backend
// ----- end kiln/backend/cpu/elementwise.hpp -----

// ----- begin kiln/eager/apply.hpp -----
/// \file
/// Eager execution of one op: check the inputs against the op's dtype and shape
/// rules (raising the contract's errors with both sides in the message), allocate
/// the result on the inputs' device and run the device's backend kernel.

#include <span>
#include <sstream>
#include <string>
#include <vector>

// ----- begin kiln/core/small_vector.hpp -----
/// \file
/// `small_vector`: a vector that keeps up to N elements inline, so the per-op
/// bookkeeping of a few inputs (their shapes, dtypes, views) costs no heap
/// allocation and no zero-filling of unused slots.

#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <utility>

namespace kiln::detail {

template <class T, std::size_t N>
class small_vector {
 public:
  small_vector() = default;
  small_vector(const small_vector&) = delete;
  small_vector& operator=(const small_vector&) = delete;
  ~small_vector() {
    std::destroy(begin(), end());
    if (data_ != inline_data()) ::operator delete(data_, std::align_val_t(alignof(T)));
  }

  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    T* fresh = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
    std::uninitialized_move(begin(), end(), fresh);
    std::destroy(begin(), end());
    if (data_ != inline_data()) ::operator delete(data_, std::align_val_t(alignof(T)));
    data_ = fresh;
    capacity_ = n;
  }
  template <class... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == capacity_) reserve(2 * capacity_);
    return *new (data_ + size_++) T(std::forward<Args>(args)...);
  }

  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  std::size_t size() const { return size_; }
  operator std::span<const T>() const { return {data_, size_}; }

 private:
  T* inline_data() { return reinterpret_cast<T*>(inline_); }
  alignas(T) unsigned char inline_[N * sizeof(T)];
  T* data_ = inline_data();
  std::size_t size_ = 0;
  std::size_t capacity_ = N;
};

}  // namespace kiln::detail
// ----- end kiln/core/small_vector.hpp -----

namespace kiln {
namespace detail {

/// "int32 (2, 3), float32 (3,)": the inputs as an error message shows them.
inline std::string describe_inputs(std::span<const tensor* const> in) {
  std::string s;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    s += std::string(name(in[i]->dtype())) + " " + in[i]->shape().str();
  }
  return s;
}

/// The dtype and shape `op` gives for `inputs`, or the contract's error.
template <class Op>
std::pair<dtype, shape> infer(const Op& op, std::span<const tensor* const> in) {
  small_vector<dtype, 4> d;
  small_vector<shape, 4> s;
  d.reserve(in.size());
  s.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!in[i]->defined()) throw invalid_argument_error(std::string(Op::name) + ": input " + std::to_string(i) + " is an empty tensor");
    d.emplace_back(in[i]->dtype());
    s.emplace_back(in[i]->shape());
  }
  dtype_result dt = op.result_dtype(d);
  if (!dt.ok()) throw type_error(std::string(Op::name) + ": " + std::string(dt.failure) + "; got " + describe_inputs(in));
  shape_result sh = op.result_shape(s);
  if (!sh.ok()) throw value_error(std::string(Op::name) + ": " + std::string(sh.failure) + "; got " + describe_inputs(in));
  return {dt.value, sh.value};
}

/// Rejects values an op cannot compute without undefined behaviour: integer
/// division by zero, integers to negative powers.
template <class Op>
void check_values(const Op&, std::span<const tensor* const> in);

/// Runs `op` on eager `inputs` with backend `B` (on the device the inputs are on).
template <class B, class Op>
tensor run_on(const Op& op, std::span<const tensor* const> in) {
  auto [dt, sh] = infer(op, in);
  kiln::device dev = in.empty() ? kiln::device::cpu : in[0]->device();
  for (const tensor* t : in) {
    t->require_value(Op::name);
    if (t->device() != dev)
      throw invalid_argument_error(std::string(Op::name) + ": inputs are on different devices (" + std::string(name(dev)) +
                                   " and " + std::string(name(t->device())) + ")");
  }
  check_values(op, in);
  if constexpr (requires { op.evaluate(in); }) {
    return op.evaluate(in);  // ops that only re-describe a buffer (reshape, x[i])
  } else {
    static_assert(backend::supports<B, Op>, "this backend has no kernel for the op");
    small_vector<buffer_view, 4> views;
    views.reserve(in.size());
    for (const tensor* t : in) views.emplace_back(t->view());
    tensor out(dt, sh, dev);
    if (out.size() > 0) compute(B{}, op, std::span<const buffer_view>(views), out.view());
    return out;
  }
}

template <class Op>
tensor apply_span(const Op& op, std::span<const tensor* const> in) {
  for (const tensor* t : in)
    if (t->is_symbolic()) throw type_error(std::string(Op::name) + ": symbolic tensors are only usable inside a kiln::function trace");
  if (!in.empty() && in[0]->device() == kiln::device::gpu) {
#if KILN_HAS_THRUST
    if constexpr (backend::supports<backend::thrust_backend, Op>) return run_on<backend::thrust_backend>(op, in);
#endif
    throw unavailable_error(std::string(Op::name) + ": no GPU kernel in this build");
  }
  return run_on<backend::cpu_backend>(op, in);
}

template <class Op>
void check_values(const Op&, std::span<const tensor* const> in) {
  if constexpr (requires { Op::integer_divisor; } || requires { Op::integer_exponent; }) {
    const tensor& y = *in[1];
    if (!is_integer(y.dtype()) || y.size() == 0) return;
    bool bad = visit_dtype(y.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        std::vector<T> host = y.to_vector<T>();
        for (T v : host)
          if (requires { Op::integer_divisor; } ? v == T(0) : v < T(0)) return true;
      }
      return false;
    });
    if (bad)
      throw invalid_argument_error(std::string(Op::name) + (requires { Op::integer_divisor; }
                                                                ? ": integer division by zero"
                                                                : ": integers to negative integer powers are not allowed"));
  }
}

}  // namespace detail
}  // namespace kiln
// ----- end kiln/eager/apply.hpp -----
// ----- end kiln/kiln.hpp -----

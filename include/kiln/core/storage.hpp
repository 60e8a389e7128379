#pragma once
/// \file
/// `storage`: one reference-counted, immutable-after-creation buffer of elements on
/// a device. Devices other than the CPU plug their memory in through a
/// `memory_resource`, so this layer knows nothing of backends.

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "kiln/config.hpp"
#include "kiln/core/allocator.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"

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
    if (!addressable()) throw exhausted();
    try {
      data_ = held_inline() ? inline_ : memory_for(d).allocate(bytes_);
    } catch (const std::bad_alloc&) {
      throw exhausted();
    }
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
    if (!held_inline()) memory_for(device_).deallocate(data_, bytes_);
  }

  void* data() { return data_; }
  const void* data() const { return data_; }
  kiln::dtype dtype() const { return dtype_; }
  kiln::device device() const { return device_; }
  std::int64_t count() const { return count_; }
  std::size_t bytes() const { return bytes_; }

 private:
  // Pointer arithmetic over the buffer needs its byte count to fit in a ptrdiff_t.
  bool addressable() const { return std::size_t(count_) <= std::size_t(PTRDIFF_MAX) / size_of(dtype_); }
  // Appended to one string: every tensor-making file compiles this message, and a
  // chain of `+` compiles a temporary and its cleanup per piece.
  KILN_COLD KILN_NOINLINE resource_exhausted_error exhausted() const {
    std::string text = "cannot allocate ";
    text += std::to_string(count_);
    text += ' ';
    text += name(dtype_);
    text += " elements (";
    text += addressable() ? std::to_string(bytes_) + " bytes" : "more bytes than memory can address";
    text += ") on ";
    text += name(device_);
    return resource_exhausted_error(text);
  }

  // A scalar's bytes (up to inline_bytes on the host) are held in the storage itself,
  // one block with its shared count instead of two: a trace that captures a scalar
  // per op made two small allocations for each. Not under AddressSanitizer, which sees
  // a read past a block's end only in a block of the exact size.
  static constexpr std::size_t inline_bytes = 16;
  bool held_inline() const {
    return !KILN_ADDRESS_SANITIZER && device_ == kiln::device::cpu && bytes_ <= inline_bytes && dtype_ != kiln::string;
  }

  kiln::dtype dtype_;
  kiln::device device_;
  std::int64_t count_;
  std::size_t bytes_;
  void* data_ = nullptr;
  alignas(16) unsigned char inline_[inline_bytes];
};

/// Allocates a storage and its shared count (one block) from the host's caching
/// allocator, as `make_shared` would from `operator new`: a tensor made in steady
/// state (a graph's output, a variable's new value) then allocates nothing.
template <class T>
struct bookkeeping_allocator {
  using value_type = T;
  bookkeeping_allocator() = default;
  template <class U>
  bookkeeping_allocator(const bookkeeping_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(host_allocator().allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { host_allocator().deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const bookkeeping_allocator<U>&) const noexcept {
    return true;
  }
};

/// A new storage of `count` elements, shared. (Compiled once in a compiled kiln,
/// KILN_LIBRARY_INLINE: a program that makes tensors then compiles neither the
/// storage's constructor nor its shared count's.)
KILN_LIBRARY_INLINE std::shared_ptr<storage> make_storage(kiln::dtype t, std::int64_t count, kiln::device d);
#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::shared_ptr<storage> make_storage(kiln::dtype t, std::int64_t count, kiln::device d) {
  return std::allocate_shared<storage>(bookkeeping_allocator<storage>(), t, count, d);
}
#endif

}  // namespace kiln::detail

#pragma once
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

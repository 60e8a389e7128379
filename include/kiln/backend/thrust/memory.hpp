#pragma once
/// \file
/// The memory of kiln::device::gpu. Under CUDA it is device memory (cudaMalloc,
/// cudaMemcpy); on a host device system it is host memory from kiln's caching
/// allocator, so the Thrust kernels run on the host unchanged. Including this header
/// makes the GPU device available: it registers the memory with the storage layer.

#include <cstddef>
#include <new>
#include <string>

#include "kiln/backend/thrust/system.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"

#if KILN_THRUST_CUDA
#  include <cuda_runtime_api.h>
#endif

namespace kiln::backend::thrust_kernels {

#if KILN_THRUST_CUDA
/// Turns a CUDA error into the kiln error a caller can act on.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the sticky error state so later calls can proceed
  if (status == cudaErrorMemoryAllocation) throw std::bad_alloc();
  std::string message = std::string("kiln::device::gpu: ") + what + " failed: " + cudaGetErrorString(status);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) throw unavailable_error(message);
  throw internal_error(message);
}

/// cudaMalloc and cudaFree, for the caching allocator.
struct cuda_system {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  // Runs in destructors, also after the CUDA runtime shut down at exit: never throws.
  static void release(void* p) noexcept { (void)cudaFree(p); }
};

/// The GPU's blocks, cached as the host's are (core/allocator.hpp). Thrust's
/// algorithms on `thrust::device` return when their kernels have finished, so a
/// freed block is idle and can be handed out again at once. Never destroyed, as the
/// host's (a static tensor may be freed after every other static).
inline detail::basic_caching_allocator<cuda_system>& gpu_allocator() {
  static auto* const instance = new detail::basic_caching_allocator<cuda_system>;
  return *instance;
}

/// CUDA device memory.
inline const detail::memory_resource& gpu_memory() {
  static const detail::memory_resource resource{
      [](std::size_t bytes) { return gpu_allocator().allocate(bytes); },
      [](void* p, std::size_t bytes) { gpu_allocator().deallocate(p, bytes); },
      [](void* host_dst, const void* src, std::size_t bytes) {
        check_cuda(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
      },
      [](void* dst, const void* host_src, std::size_t bytes) {
        check_cuda(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
      },
  };
  return resource;
}
#else
/// On a host device system, "device" memory is host memory; it is the same
/// resource as the CPU's, so transfers are plain copies.
inline const detail::memory_resource& gpu_memory() { return detail::host_memory(); }
#endif

/// Set during static initialization of every program that includes this header.
inline const bool gpu_memory_registered = (detail::gpu_memory_slot() = &gpu_memory(), true);

}  // namespace kiln::backend::thrust_kernels

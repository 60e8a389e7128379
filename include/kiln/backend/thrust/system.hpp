#pragma once
/// \file
/// The Thrust device system the thrust_backend runs on, and what every Thrust
/// kernel of kiln shares: typed device pointers over kernel views.
///
/// nvcc builds use Thrust's CUDA system. A host compiler cannot build that system,
/// so when the build did not choose one (THRUST_DEVICE_SYSTEM, set by kiln's CMake
/// to CPP or OMP) the "device" is the host's sequential CPP system; this keeps a
/// plain `g++ -Iinclude` build working wherever Thrust headers are on the path.

#include "kiln/config.hpp"

#if !defined(THRUST_DEVICE_SYSTEM) && !defined(__CUDACC__)
#  define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif

#include <cstdint>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "kiln/core/tensor.hpp"

/// True when device memory is CUDA memory that host code must not dereference.
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#  define KILN_THRUST_CUDA 1
#else
#  define KILN_THRUST_CUDA 0
#endif

namespace kiln::backend::thrust_kernels {

/// The elements of a kernel view as a Thrust device pointer, so that algorithms
/// given `thrust::device` and these pointers run on the device system.
/// \code auto p = device_data<float>(out); ::thrust::fill(::thrust::device, p, p + out.size(), 0.f); \endcode
template <class T>
::thrust::device_ptr<T> device_data(const buffer_view& v) {
  return ::thrust::device_pointer_cast(v.as<T>());
}

/// Sets every element `i` of `out` (of type `T`) to `element(i)`: the one kernel
/// shape of most gpu ops, a transform over the output's flat indices.
/// \code fill_elements<float>(out, read_strided<float>{x, index}); \endcode
template <class T, class Element>
void fill_elements(const buffer_view& out, const Element& element) {
  ::thrust::counting_iterator<std::int64_t> first(0);
  ::thrust::transform(::thrust::device, first, first + out.size(), device_data<T>(out), element);
}

}  // namespace kiln::backend::thrust_kernels

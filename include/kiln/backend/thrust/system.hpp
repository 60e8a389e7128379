#pragma once
/// \file
/// The Thrust device system the thrust_backend runs on, and the transform over
/// output elements that most Thrust kernels of kiln are.
///
/// nvcc builds use Thrust's CUDA system. A host compiler cannot build that system,
/// so when the build did not choose one (THRUST_DEVICE_SYSTEM, set by kiln's CMake
/// to CPP or OMP) the "device" is the host's sequential CPP system; this keeps a
/// plain `g++ -Iinclude` build working wherever Thrust headers are on the path.
///
/// Kernels hand Thrust raw pointers together with the `thrust::device` policy: the
/// policy, not the pointer type, selects the device system. Wrapping them in
/// `thrust::device_ptr` would make the host device systems write through
/// `thrust::device_reference`, which Thrust implements by binding a reference to a
/// null system pointer (undefined behaviour that UBSan reports).

#include "kiln/config.hpp"

#if !defined(THRUST_DEVICE_SYSTEM) && !defined(__CUDACC__)
#  define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif

#include <cstdint>

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

/// Sets every element `i` of `out` (of type `T`) to `element(i)`: the one kernel
/// shape of most gpu ops, a transform over the output's flat indices.
/// For example `fill_elements<float>(out, read_strided<float>{x, index})`.
template <class T, class Element>
void fill_elements(const buffer_view& out, const Element& element) {
  ::thrust::counting_iterator<std::int64_t> first(0);
  ::thrust::transform(::thrust::device, first, first + out.size(), out.as<T>(), element);
}

}  // namespace kiln::backend::thrust_kernels

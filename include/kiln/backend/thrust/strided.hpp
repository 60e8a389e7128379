#pragma once
/// \file
/// `strided_offsets`: the device-side index arithmetic of the Thrust kernels. An
/// output element's flat (row-major) index becomes the element offsets of several
/// operands, each walking the output's dims with its own strides: 0 along a
/// broadcast dim, permuted for a transpose, the source's strides for a slice.

#include <array>
#include <cstdint>

#include "kiln/config.hpp"
#include "kiln/core/shape.hpp"

namespace kiln::backend::thrust_kernels {

/// Element offsets of `N` operands for one output element.
template <int N>
struct offsets {
  std::int64_t at[N];
};

/// Maps flat output indices to operand offsets; plain data, copied to the device by
/// value inside kernel functors.
/// \code
/// using kiln::backend::thrust_kernels::strided_offsets;
/// strided_offsets<1> t = strided_offsets<1>::over(kiln::shape{2, 3}, {{{1, 2}}});  // transpose of a (3, 2)
/// t(4).at[0] == 3;  // output (1, 1) reads input (1, 1), at offset 1 * 2 + 1
/// \endcode
template <int N>
struct strided_offsets {
  int rank = 0;
  std::int64_t size[max_rank] = {};
  std::int64_t stride[N][max_rank] = {};

  /// Walks the dims of `out` with per-operand strides `strides[k][d]`.
  static strided_offsets over(const shape& out, const std::array<std::array<std::int64_t, max_rank>, N>& strides) {
    strided_offsets s;
    s.rank = out.rank();
    for (int d = 0; d < s.rank; ++d) {
      s.size[d] = out[d];
      for (int k = 0; k < N; ++k) s.stride[k][d] = strides[k][d];
    }
    return s;
  }

  /// Integer division is the costly part on a GPU, so the outermost dim needs none:
  /// a contiguous or collapsed (rank 1) walk costs one multiply per operand. The dim
  /// loop is unrolled over every possible dim, so that each `size[d]` and `stride[k][d]`
  /// has a constant index: indexing them with a variable makes CUDA copy this whole
  /// object to each thread's local memory, which made a kernel several times slower.
  KILN_HOST_DEVICE offsets<N> operator()(std::int64_t flat) const {
    offsets<N> o{};
    KILN_UNROLL
    for (int d = max_rank - 1; d > 0; --d) {
      if (d >= rank) continue;
      std::int64_t i = flat % size[d];
      flat /= size[d];
      KILN_UNROLL
      for (int k = 0; k < N; ++k) o.at[k] += i * stride[k][d];
    }
    if (rank > 0)
      KILN_UNROLL
      for (int k = 0; k < N; ++k) o.at[k] += flat * stride[k][0];
    return o;
  }
};

}  // namespace kiln::backend::thrust_kernels

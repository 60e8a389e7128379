#pragma once
/// \file
/// Thrust kernels of the data-movement ops. transpose, slice and gather are one
/// `thrust::transform` over the output's elements, each reading the input element
/// it comes from (a gather). concat and stack copy each input into its window of
/// the output: viewed as matrices with the joined axis and everything after it as
/// columns, input k fills a block of columns of the output. Indices were checked
/// on the host before any kernel runs (ops::check_values), so kernels read in
/// bounds. String tensors never live on the gpu. (reshape, `x[i]`, shape_of and set_item
/// need no kernel: they evaluate on any device.)

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/permutation_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include "kiln/backend/backend.hpp"
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/backend/thrust/strided.hpp"
#include "kiln/core/small_vector.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::backend {
namespace thrust_kernels {

/// Calls `f.template operator()<T>()` with the element type of `t`; strings, which
/// cannot be on the gpu, are an internal error.
template <class F>
void visit_device_dtype(dtype t, std::string_view op, F&& f) {
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string>)
      throw internal_error(std::string(op) + ": string tensors cannot be on the gpu");
    else
      f.template operator()<T>();
  });
}

/// Output element `i` is input element `index(i)`.
template <class T>
struct read_strided {
  const T* x;
  strided_offsets<1> index;
  KILN_HOST_DEVICE T operator()(std::int64_t i) const { return x[index(i).at[0]]; }
};

/// Fills `out` from `x` (starting `first` elements in), walking the output's dims
/// with the input strides `strides`.
inline void copy_strided(std::string_view op, const buffer_view& x, std::int64_t first,
                         const std::array<std::int64_t, max_rank>& strides, const buffer_view& out) {
  const auto index = strided_offsets<1>::over(out.shape, {strides});
  visit_device_dtype(out.dtype, op, [&]<class T>() {
    fill_elements<T>(out, read_strided<T>{x.as<const T>() + first, index});
  });
}

/// Output element `i` of a gather, seen as (outer, gathered, inner): row `indices[j]`
/// of the input seen as (outer, dim, inner).
template <class T>
struct gather_element {
  const T* x;
  const void* indices;
  bool wide_indices;  // int64 rather than int32; uniform across threads, so no divergence
  std::int64_t gathered, dim, inner;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t r = i % inner, rest = i / inner, j = rest % gathered, o = rest / gathered;
    const std::int64_t row = wide_indices ? static_cast<const std::int64_t*>(indices)[j]
                                          : std::int64_t(static_cast<const std::int32_t*>(indices)[j]);
    return x[(o * dim + row) * inner + r];
  }
};

/// Output element `i` of an unsorted_segment_sum, seen as (outer, segment, inner):
/// the sum, in order, of the data rows (outer, order[k], inner) for k from
/// starts[segment] to starts[segment + 1], the rows of that segment.
template <class T>
struct segment_sum_element {
  const T* data;
  const std::int64_t* order;   // data's row numbers sorted stably by segment id
  const std::int64_t* starts;  // segments + 1 positions in `order`
  std::int64_t rows, segments, inner;

  KILN_HOST_DEVICE T operator()(std::int64_t i) const {
    const std::int64_t r = i % inner, rest = i / inner, s = rest % segments, o = rest / segments;
    T sum = T(0);
    for (std::int64_t k = starts[s]; k < starts[s + 1]; ++k) sum = math::add(sum, data[(o * rows + order[k]) * inner + r]);
    return sum;
  }
};

/// Where element `j` of a block `columns` wide lands in a matrix `width` wide, the
/// block starting at column `first_column`.
struct block_position {
  std::int64_t columns, width, first_column;
  KILN_HOST_DEVICE std::int64_t operator()(std::int64_t j) const {
    return (j / columns) * width + first_column + j % columns;
  }
};

/// Copies input k, `lengths[k]` long along the joined axis, into its block of
/// columns of `out`; `inner` is the product of the output's dims after the axis.
inline void join(std::string_view op, std::span<const buffer_view> in, std::span<const std::int64_t> lengths,
                 std::int64_t inner, const buffer_view& out) {
  std::int64_t total = 0;
  for (std::int64_t n : lengths) total += n;
  visit_device_dtype(out.dtype, op, [&]<class T>() {
    std::int64_t first_column = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const std::int64_t columns = lengths[k] * inner, n = in[k].size();
      if (n > 0) {
        auto positions = ::thrust::make_transform_iterator(::thrust::counting_iterator<std::int64_t>(0),
                                                           block_position{columns, total * inner, first_column});
        ::thrust::copy_n(::thrust::device, in[k].as<const T>(), n, ::thrust::make_permutation_iterator(out.as<T>(), positions));
      }
      first_column += columns;
    }
  });
}

/// The product of dims [from, to) of `s`.
inline std::int64_t dims_product(const shape& s, int from, int to) {
  std::int64_t n = 1;
  for (int d = from; d < to; ++d) n *= s[d];
  return n;
}

}  // namespace thrust_kernels

template <class = void>
void compute(thrust_backend, const ops::transpose& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int_list perm = op.permutation(xs.rank());
  const auto x_strides = row_major_strides(xs);
  std::array<std::int64_t, max_rank> strides{};
  for (int d = 0; d < xs.rank(); ++d) strides[d] = x_strides[perm[d]];
  thrust_kernels::copy_strided(ops::transpose::name, in[0], 0, strides, out);
}

template <class = void>
void compute(thrust_backend, const ops::slice& op, std::span<const buffer_view> in, const buffer_view& out) {
  const auto strides = row_major_strides(in[0].shape);
  std::int64_t first = 0;
  for (int d = 0; d < in[0].shape.rank(); ++d) first += op.begin[d] * strides[d];
  thrust_kernels::copy_strided(ops::slice::name, in[0], first, strides, out);
}

template <class = void>
void compute(thrust_backend, const ops::gather& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int a = ops::normalize_axis(op.axis, xs.rank());
  thrust_kernels::visit_device_dtype(out.dtype, ops::gather::name, [&]<class T>() {
    const thrust_kernels::gather_element<T> element{in[0].as<const T>(), in[1].data, in[1].dtype == int64, in[1].size(),
                                                    xs[a], thrust_kernels::dims_product(xs, a + 1, xs.rank())};
    thrust_kernels::fill_elements<T>(out, element);
  });
}

template <class = void>
void compute(thrust_backend, const ops::unsorted_segment_sum& op, std::span<const buffer_view> in,
             const buffer_view& out) {
  const shape& ds = in[0].shape;
  const int ids_end = int(op.axis) + in[1].shape.rank();
  const std::int64_t rows = in[1].size();
  // Each output element sums its segment's rows: the row numbers sorted stably by id,
  // and where each segment starts among them (negative ids sort first, before segment 0).
  ::thrust::device_vector<std::int64_t> ids(static_cast<std::size_t>(rows)), order(static_cast<std::size_t>(rows)),
      starts(static_cast<std::size_t>(op.num_segments + 1));
  // (Raw pointers: the vectors' own iterators write through device references, which
  // bind a null execution policy on host systems.)
  std::int64_t *id = ::thrust::raw_pointer_cast(ids.data()), *row = ::thrust::raw_pointer_cast(order.data()),
               *start = ::thrust::raw_pointer_cast(starts.data());
  if (in[1].dtype == int64)
    ::thrust::copy_n(::thrust::device, in[1].as<const std::int64_t>(), rows, id);
  else
    ::thrust::copy_n(::thrust::device, in[1].as<const std::int32_t>(), rows, id);
  ::thrust::sequence(::thrust::device, row, row + rows);
#if KILN_THRUST_CUDA
  ::thrust::stable_sort_by_key(::thrust::device, id, id + rows, row);
#else
  // A host system's device memory is host memory: std::stable_sort, as thrust's sort
  // binds a null execution policy in its buffers there.
  std::stable_sort(row, row + rows, [id](std::int64_t a, std::int64_t b) { return id[a] < id[b]; });
  std::stable_sort(id, id + rows);
#endif
  const ::thrust::counting_iterator<std::int64_t> segment(0);
  ::thrust::lower_bound(::thrust::device, id, id + rows, segment, segment + op.num_segments + 1, start);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    const thrust_kernels::segment_sum_element<T> element{in[0].as<const T>(), row, start, rows, op.num_segments,
                                                         thrust_kernels::dims_product(ds, ids_end, ds.rank())};
    thrust_kernels::fill_elements<T>(out, element);
  });
}

template <class = void>
void compute(thrust_backend, const ops::concat& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  detail::small_vector<std::int64_t, 8> lengths;
  for (const buffer_view& v : in) lengths.emplace_back(v.shape[a]);
  thrust_kernels::join(ops::concat::name, in, lengths,
                       thrust_kernels::dims_product(out.shape, a + 1, out.shape.rank()), out);
}

template <class = void>
void compute(thrust_backend, const ops::stack& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  detail::small_vector<std::int64_t, 8> lengths;  // each input is one slice along the new axis
  for (std::size_t k = 0; k < in.size(); ++k) lengths.emplace_back(1);
  thrust_kernels::join(ops::stack::name, in, lengths, thrust_kernels::dims_product(out.shape, a + 1, out.shape.rank()),
                       out);
}

}  // namespace kiln::backend

#pragma once
/// \file
/// Reference kernels of the data-movement ops: for every output element, its
/// multi-index, the input element it comes from, and one assignment. Slow and
/// obviously right. (reshape, `x[i]`, shape_of and set_item need no kernel: they evaluate.)

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "kiln/backend/backend.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::backend {
namespace reference {

using multi_index = std::array<std::int64_t, max_rank>;

inline multi_index unravel(std::int64_t flat, const shape& s) {
  multi_index idx{};
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

inline std::int64_t ravel(const multi_index& idx, const shape& s) {
  std::int64_t flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + idx[d];
  return flat;
}

/// Fills `out`: element i is element `source(i).second` of input `source(i).first`.
template <class Source>
void copy_from(std::span<const buffer_view> in, const buffer_view& out, Source source) {
  visit_dtype(out.dtype, [&]<class T>() {
    T* o = out.as<T>();
    for (std::int64_t i = 0, n = out.size(); i < n; ++i) {
      auto [k, j] = source(i);
      o[i] = in[k].template as<const T>()[j];
    }
  });
}

inline std::int64_t read_index(const buffer_view& indices, std::int64_t i) {
  return indices.dtype == int64 ? indices.as<const std::int64_t>()[i] : indices.as<const std::int32_t>()[i];
}

}  // namespace reference

template <class = void>
void compute(reference_backend, const ops::transpose& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape& xs = in[0].shape;
  const int_list perm = op.permutation(xs.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index o = reference::unravel(i, out.shape), x{};
    for (int d = 0; d < out.shape.rank(); ++d) x[perm[d]] = o[d];
    return std::pair{std::size_t(0), reference::ravel(x, xs)};
  });
}

template <class = void>
void compute(reference_backend, const ops::concat& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index idx = reference::unravel(i, out.shape);
    std::size_t k = 0;
    while (idx[a] >= in[k].shape[a]) idx[a] -= in[k++].shape[a];
    return std::pair{k, reference::ravel(idx, in[k].shape)};
  });
}

template <class = void>
void compute(reference_backend, const ops::stack& op, std::span<const buffer_view> in, const buffer_view& out) {
  const int a = ops::normalize_axis(op.axis, out.shape.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index o = reference::unravel(i, out.shape), x{};
    for (int d = 0, e = 0; d < out.shape.rank(); ++d)
      if (d != a) x[e++] = o[d];
    return std::pair{std::size_t(o[a]), reference::ravel(x, in[0].shape)};
  });
}

template <class = void>
void compute(reference_backend, const ops::gather& op, std::span<const buffer_view> in, const buffer_view& out) {
  const shape &xs = in[0].shape, &is = in[1].shape;
  const int a = ops::normalize_axis(op.axis, xs.rank());
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index o = reference::unravel(i, out.shape), x{}, j{};
    for (int d = 0; d < a; ++d) x[d] = o[d];
    for (int d = 0; d < is.rank(); ++d) j[d] = o[a + d];
    x[a] = reference::read_index(in[1], reference::ravel(j, is));
    for (int d = a + 1; d < xs.rank(); ++d) x[d] = o[d - 1 + is.rank()];
    return std::pair{std::size_t(0), reference::ravel(x, xs)};
  });
}

template <class = void>
void compute(reference_backend, const ops::unsorted_segment_sum& op, std::span<const buffer_view> in,
             const buffer_view& out) {
  const shape &ds = in[0].shape, &ids = in[1].shape;
  const int a = int(op.axis);
  ops::visit_numeric(out.dtype, [&]<class T>() {
    T* o = out.as<T>();
    std::fill_n(o, out.size(), T(0));
    for (std::int64_t i = 0, n = ds.num_elements(); i < n; ++i) {  // in order, so each segment sums its ids in order
      const reference::multi_index x = reference::unravel(i, ds);
      std::int64_t j = 0;
      for (int d = 0; d < ids.rank(); ++d) j = j * ids[d] + x[a + d];
      const std::int64_t segment = reference::read_index(in[1], j);
      if (segment < 0) continue;
      reference::multi_index y{};
      for (int d = 0; d < a; ++d) y[d] = x[d];
      y[a] = segment;
      for (int d = a + ids.rank(); d < ds.rank(); ++d) y[d - ids.rank() + 1] = x[d];
      T& sum = o[reference::ravel(y, out.shape)];
      sum = math::add(sum, in[0].as<const T>()[i]);
    }
  });
}

template <class = void>
void compute(reference_backend, const ops::slice& op, std::span<const buffer_view> in, const buffer_view& out) {
  reference::copy_from(in, out, [&](std::int64_t i) {
    reference::multi_index idx = reference::unravel(i, out.shape);
    for (int d = 0; d < out.shape.rank(); ++d) idx[d] += op.begin[d];
    return std::pair{std::size_t(0), reference::ravel(idx, in[0].shape)};
  });
}

}  // namespace kiln::backend

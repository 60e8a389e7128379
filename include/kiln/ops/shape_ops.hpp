#pragma once
/// \file
/// Shape and data-movement ops: reshape, transpose, concat, stack, gather, `x[i]`,
/// slice, shape_of, set_item, pad_rows and crop_or_pad. None computes new values, so each accepts every dtype,
/// strings included. The rules handle `kiln::none` dims and unknown ranks (the
/// tracer's partial shapes); reshape, `x[i]` and shape_of only re-describe a buffer
/// and so provide `evaluate` instead of kernels. Indices and ranges that do not fit
/// the input raise kiln::invalid_argument_error, as TensorFlow's kernels do, from
/// the `check_values` overloads below, before anything is allocated. Each op's
/// `attributes()` ("perm=[1, 0]") is appended to the errors of its rules, which
/// otherwise could only show the inputs.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/small_vector.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/op.hpp"

namespace kiln {
namespace detail {

/// The most specific shape that both specs allow, or a failure when two known dims differ.
constexpr shape_result merge_shapes(const shape& a, const shape& b) {
  if (!a.has_known_rank()) return {b};
  if (!b.has_known_rank()) return {a};
  if (a.rank() != b.rank()) return {{}, "all inputs must have the same shape"};
  shape out = a;
  for (int d = 0; d < a.rank(); ++d) {
    if (a[d] == none) out[d] = b[d];
    else if (b[d] != none && b[d] != a[d]) return {{}, "all inputs must have the same shape"};
  }
  return {out};
}

/// The dtype rule of ops that join tensors: all of one dtype, kept.
constexpr dtype_result same_dtype(std::span<const dtype> in) {
  for (dtype t : in)
    if (t != in[0]) return {in[0], "all inputs must have the same dtype"};
  return {in.empty() ? float32 : in[0]};
}

/// `[4, -1]`: dims as the user wrote them (-1 for kiln::none).
KILN_LIBRARY_INLINE std::string dims_text(const shape& s);

}  // namespace detail

namespace ops {

/// `reshape(x, new_shape)`: the same elements in another shape; one dim may be
/// kiln::none (-1), inferred from the element count.
struct reshape {
  static constexpr std::string_view name = "reshape";
  static constexpr std::string_view onnx_name = "Reshape";
  static constexpr int arity = 1;
  kiln::shape new_shape;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"shape", &reshape::new_shape}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (!new_shape.has_known_rank()) return {{}, "the new shape must have a known rank"};
    int inferred = -1;
    kiln::shape known_dims;  // the new shape without its -1 dim
    for (int d = 0; d < new_shape.rank(); ++d) {
      if (new_shape[d] != none) {
        known_dims.push_back(new_shape[d]);
      } else if (inferred >= 0) {
        return {{}, "only one dim of the new shape may be -1 (kiln::none)"};
      } else {
        inferred = d;
      }
    }
    if (!known_dims.count_fits()) return {{}, "the new shape has more elements than int64 can count"};
    const std::int64_t known = known_dims.num_elements();
    if (!in[0].is_fully_defined()) return {new_shape};  // the -1 dim stays unknown until run time
    if (!in[0].count_fits()) return {{}, "the input has more elements than int64 can count"};
    const std::int64_t count = in[0].num_elements();
    if (inferred < 0) {
      if (known != count) return {{}, "the new shape has a different number of elements"};
      return {new_shape};
    }
    if (known == 0) {
      if (count == 0) return {{}, "cannot infer the -1 dim of an empty tensor when another dim is 0"};
      return {{}, "the new shape has a different number of elements"};
    }
    if (count % known != 0) return {{}, "the new shape has a different number of elements"};
    kiln::shape out = new_shape;
    out[inferred] = count / known;
    return {out};
  }
  /// Shares the input's buffer: no element is copied.
  KILN_LIBRARY_INLINE tensor evaluate(std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  template <class G> void gradient(G& g) const { g.give(0, G::reshape(g.dy(), g.x(0).t.shape())); }
  constexpr bool operator==(const reshape&) const = default;
};

/// `transpose(x, perm)`: dim i of the result is dim `perm[i]` of `x`; an empty
/// `perm` reverses the dims.
struct transpose {
  static constexpr std::string_view name = "transpose";
  static constexpr std::string_view onnx_name = "Transpose";
  static constexpr int arity = 1;
  int_list perm;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"perm", &transpose::perm}}; }

  /// The permutation for a tensor of `rank` dims (`perm`, or the reversal when it is empty).
  constexpr int_list permutation(int rank) const {
    if (!perm.empty()) return perm;
    int_list reversed;
    for (int d = rank - 1; d >= 0; --d) reversed.push_back(d);
    return reversed;
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape& s = in[0];
    if (!s.has_known_rank() && perm.empty()) return {kiln::shape(unknown_rank)};
    const int rank = s.has_known_rank() ? s.rank() : perm.size();
    if (perm.size() != rank && !perm.empty()) return {{}, "perm must have one entry per dim"};
    const int_list p = permutation(rank);
    std::array<bool, max_rank> seen{};
    kiln::shape out;
    for (int d = 0; d < rank; ++d) {
      if (p[d] < 0 || p[d] >= rank || seen[p[d]]) return {{}, "perm must be a permutation of 0, 1, ..., rank - 1"};
      seen[p[d]] = true;
      out.push_back(s.has_known_rank() ? s[int(p[d])] : none);
    }
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  /// The gradient goes back through the inverse permutation.
  template <class G> void gradient(G& g) const {
    const int rank = g.x(0).t.rank();
    const int_list p = permutation(rank);
    int_list inverse;  // inverse[p[j]] == j
    for (int d = 0; d < rank; ++d)
      for (int j = 0; j < rank; ++j)
        if (p[j] == d) inverse.push_back(j);
    g.give(0, G::transpose(g.dy(), inverse));
  }
  constexpr bool operator==(const transpose&) const = default;
};

/// `concat({a, b}, axis)`: the inputs joined along an existing dim.
struct concat {
  static constexpr std::string_view name = "concat";
  static constexpr std::string_view onnx_name = "Concat";
  static constexpr int arity = variadic;  ///< one or more inputs
  std::int64_t axis = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"axis", &concat::axis}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return detail::same_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (in.empty()) return {{}, "needs at least one input"};
    int rank = -1;
    for (const kiln::shape& s : in)
      if (s.has_known_rank()) rank = s.rank();
    if (rank < 0) return {kiln::shape(unknown_rank)};
    if (rank == 0) return {{}, "cannot concatenate scalars (use kiln::stack)"};
    const int a = normalize_axis(axis, rank);
    if (a < 0) return {{}, "axis is out of range for the inputs' rank"};
    kiln::shape out;
    for (int d = 0; d < rank; ++d) out.push_back(d == a ? 0 : none);
    for (const kiln::shape& s : in) {
      if (!s.has_known_rank()) {
        out[a] = none;
        continue;
      }
      if (s.rank() != rank) return {{}, "all inputs must have the same rank"};
      for (int d = 0; d < rank; ++d) {
        if (d == a) {
          if (s[a] == none) out[a] = none;
          else if (out[a] != none && out[a] > std::numeric_limits<std::int64_t>::max() - s[a])
            return {{}, "the result would have more elements than int64 can count"};
          else if (out[a] != none) out[a] += s[a];
        } else if (out[d] == none) {
          out[d] = s[d];
        } else if (s[d] != none && s[d] != out[d]) {
          return {{}, "all inputs must have the same dims except along the axis"};
        }
      }
    }
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const concat&) const = default;
  /// Each input's gradient is its slice of dy along the axis.
  template <class G> void gradient(G& g) const;
};

/// `stack({a, b}, axis)`: inputs of one shape joined along a new dim.
struct stack {
  static constexpr std::string_view name = "stack";
  static constexpr int arity = variadic;  ///< one or more inputs
  std::int64_t axis = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"axis", &stack::axis}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return detail::same_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (in.empty()) return {{}, "needs at least one input"};
    shape_result common{in[0]};
    for (const kiln::shape& s : in.subspan(1)) {
      common = detail::merge_shapes(common.value, s);
      if (!common.ok()) return common;
    }
    if (!common.value.has_known_rank()) return {kiln::shape(unknown_rank)};
    const int rank = common.value.rank();
    if (rank == max_rank) return {{}, "the result would have more dims than kiln supports"};
    const int a = normalize_axis(axis, rank + 1);
    if (a < 0) return {{}, "axis is out of range for the result's rank"};
    kiln::shape out;
    for (int d = 0; d <= rank; ++d) {
      if (d == a) out.push_back(std::int64_t(in.size()));
      if (d < rank) out.push_back(common.value[d]);
    }
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const stack&) const = default;
  /// Input i's gradient is dy at i along the new dim.
  template <class G> void gradient(G& g) const;
};

/// `gather(x, indices, axis)`: the slices of `x` along `axis` that `indices` (int32
/// or int64, any shape) name; the result's shape is
/// `x.shape[:axis] + indices.shape + x.shape[axis + 1:]`.
struct gather {
  static constexpr std::string_view name = "gather";
  static constexpr std::string_view onnx_name = "Gather";
  static constexpr int arity = 2;
  std::int64_t axis = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"axis", &gather::axis}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "indices must be int32 or int64"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &indices = in[1];
    if (x.has_known_rank() && x.rank() == 0) return {{}, "cannot gather from a scalar"};
    if (!x.has_known_rank() || !indices.has_known_rank()) return {kiln::shape(unknown_rank)};
    const int a = normalize_axis(axis, x.rank());
    if (a < 0) return {{}, "axis is out of range for the input's rank"};
    if (x.rank() - 1 + indices.rank() > max_rank) return {{}, "the result would have more dims than kiln supports"};
    kiln::shape out;
    for (int d = 0; d < a; ++d) out.push_back(x[d]);
    for (std::int64_t d : indices) out.push_back(d);
    for (int d = a + 1; d < x.rank(); ++d) out.push_back(x[d]);
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const gather&) const = default;
  /// dy summed into the rows it was gathered from (unsorted_segment_sum).
  template <class G> void gradient(G& g) const;
};

/// `unsorted_segment_sum(data, segment_ids, num_segments)`: the sum of the slices of
/// `data` that share a segment id, one per segment in [0, num_segments) (0 where no id
/// names it; negative ids are dropped, as TensorFlow drops them). `segment_ids`
/// (int32 or int64) has the shape of `data`'s dims from `axis` on; the result's shape
/// is `data.shape[:axis] + (num_segments,) + data.shape[axis + ids.rank:]`. The adjoint
/// of gather, whose gradient it is. Each segment sums its slices in the order of
/// their ids, on every backend, so every backend gives the same bits.
struct unsorted_segment_sum {
  static constexpr std::string_view name = "unsorted_segment_sum";
  static constexpr int arity = 2;
  std::int64_t num_segments = 0;
  std::int64_t axis = 0;  ///< the dim of `data` where the ids' dims start (gather's gradient sets it)
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"num_segments", &unsorted_segment_sum::num_segments},
                      attribute{"axis", &unsorted_segment_sum::axis}};
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "segment ids must be int32 or int64"};
    if (!dtypes::numeric.contains(in[0])) return {in[0], "data must be numbers"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &data = in[0], &ids = in[1];
    if (num_segments < 0) return {{}, "num_segments must not be negative"};
    if (!data.has_known_rank() || !ids.has_known_rank()) return {kiln::shape(unknown_rank)};
    if (axis < 0 || axis + ids.rank() > data.rank()) return {{}, "segment ids have more dims than data has from the axis on"};
    if (data.rank() - ids.rank() + 1 > max_rank) return {{}, "the result would have more dims than kiln supports"};
    for (int d = 0; d < ids.rank(); ++d) {
      const std::int64_t want = data[int(axis) + d];
      if (want != none && ids[d] != none && want != ids[d])
        return {{}, "segment ids must have the shape of data's dims from the axis on"};
    }
    kiln::shape out;
    for (int d = 0; d < axis; ++d) out.push_back(data[d]);
    out.push_back(num_segments);
    for (int d = int(axis) + ids.rank(); d < data.rank(); ++d) out.push_back(data[d]);
    return {out};
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const unsorted_segment_sum&) const = default;
  /// dy gathered at the ids.
  template <class G> void gradient(G& g) const;
};

/// `x[i]`: the i-th slice along the first dim (negative i counts from the end).
/// Named as TensorFlow names the node that indexing creates.
struct index {
  static constexpr std::string_view name = "strided_slice";
  static constexpr std::string_view onnx_name = "Gather";
  static constexpr int arity = 1;
  std::int64_t i = 0;
  static constexpr auto attribute_fields() { return std::tuple{attribute{"index", &index::i}}; }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape& s = in[0];
    if (!s.has_known_rank()) return {kiln::shape(unknown_rank)};
    if (s.rank() == 0) return {{}, "a scalar cannot be indexed"};
    return {kiln::shape(s.dims().subspan(1))};
  }
  /// Shares the input's buffer: the slice is one contiguous window of it.
  KILN_LIBRARY_INLINE tensor evaluate(std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const index&) const = default;
  /// dy in place of the row, zeros around it.
  template <class G> void gradient(G& g) const;
};

/// `set_item(x, i, value)`: `x` with its i-th slice along the first dim replaced by
/// `value` (TensorFlow's TensorListSetItem, behind kiln::tensor_array::write). It
/// builds a new tensor from slices of `x` and `value` with slice and concat, so it
/// runs on every backend those do.
struct set_item {
  static constexpr std::string_view name = "set_item";
  static constexpr int arity = 3;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "the index must be int32 or int64"};
    if (in[2] != in[0]) return {in[0], "the value must have the dtype of the tensor it is written to"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &i = in[1], &value = in[2];
    if (i.has_known_rank() && i.rank() != 0) return {{}, "the index must be a scalar"};
    if (!x.has_known_rank()) return {x};
    if (x.rank() == 0) return {{}, "cannot write a slice of a scalar"};
    const shape_result row = detail::merge_shapes(kiln::shape(x.dims().subspan(1)), value);
    if (!row.ok()) return {{}, "the value must have the shape of one slice along the first dim"};
    return {x};
  }
  template <class = void>
  tensor evaluate(std::span<const tensor* const> in) const;
  /// The result written into the buffer of `x`, the first input, when no one else
  /// holds it (a graph's value that no later node reads: a loop that accumulates rows
  /// in a tensor_array writes each row, where a copy per row made it quadratic); else,
  /// or for a string tensor or one off the CPU, a copy as evaluate() makes. `in[1]`
  /// and `in[2]` are the index and the value.
  template <class = void>
  tensor evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const set_item&) const = default;
  /// dy with zeros in place of the row for `x`; dy's row for `value`.
  template <class G> void gradient(G& g) const;
};

/// `pad_rows(x, rows)`: `x` with rows of zeros appended along its first dim until it
/// has `rows` (an int32 or int64 scalar), or `x` itself when it has that many
/// already (TensorFlow's TensorListResize, growing only). It makes the elements of
/// a kiln::tensor_array whose size is a tensor and grows one with dynamic_size; as
/// the number of rows is a value, the result's first dim is known only when it runs.
struct pad_rows {
  static constexpr std::string_view name = "pad_rows";
  static constexpr int arity = 2;

  constexpr dtype_result result_dtype(std::span<const dtype> in) const {
    if (!is_integer(in[1])) return {in[0], "the number of rows must be int32 or int64"};
    return {in[0]};
  }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &rows = in[1];
    if (rows.has_known_rank() && rows.rank() != 0) return {{}, "the number of rows must be a scalar"};
    if (!x.has_known_rank()) return {x};
    if (x.rank() == 0) return {{}, "cannot add rows to a scalar"};
    kiln::shape out = x;
    out[0] = none;
    return {out};
  }
  template <class = void>
  tensor evaluate(std::span<const tensor* const> in) const;
  /// The result in the buffer of `x`, the first input, when no one else holds it and
  /// its spare room is enough, else in a new buffer with room for twice the rows
  /// (grow()), so that a tensor_array grown a row at a time in a loop costs amortized
  /// O(1) per row (a copy per row made it quadratic); strings and tensors off the CPU
  /// as evaluate().
  template <class = void>
  tensor evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const;
  /// `x` (on the CPU, not strings) with rows of zeros appended until it has `rows`,
  /// more than it has: in its buffer's spare room when it is the buffer's sole owner
  /// and the room is enough, else in a new buffer with room for twice its rows.
  template <class = void>
  static tensor grow(tensor&& x, std::int64_t rows);
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const pad_rows&) const = default;
  /// dy without the added rows.
  template <class G> void gradient(G& g) const;
};

/// `crop_or_pad(x, like)`: a tensor of `like`'s shape (only its shape is read) and
/// `x`'s dtype whose element i is x's element i + start along every dim, zeros where
/// that falls outside x; start[d] counts `offset[d]` from x's first element, or with
/// `align[d]` == 1 from where the window would begin if its end met x's end. It cuts
/// and pads tensors whose dims are known only when the graph runs, in the gradients of
/// concat, slice and pad_rows, and is its own gradient (negated offsets).
struct crop_or_pad {
  static constexpr std::string_view name = "crop_or_pad";
  static constexpr int arity = 2;
  int_list offset;
  int_list align;  // per dim: 0 counts offset from x's start, 1 from its end
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"offset", &crop_or_pad::offset}, attribute{"align", &crop_or_pad::align}};
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape &x = in[0], &like = in[1];
    if (offset.size() != align.size()) return {{}, "offset and align must have one entry per dim"};
    for (std::int64_t a : align)
      if (a != 0 && a != 1) return {{}, "align must be 0 (from the start) or 1 (from the end) in every dim"};
    if ((x.has_known_rank() && x.rank() != offset.size()) || (like.has_known_rank() && like.rank() != offset.size()))
      return {{}, "x, like, offset and align must have one rank"};
    if (!like.has_known_rank()) return {kiln::shape(std::vector<std::int64_t>(std::size_t(offset.size()), none))};
    return {like};
  }
  /// Where the window of dim `d` starts in x, for an x dim of `in` elements and a
  /// result dim of `out`.
  constexpr std::int64_t start(int d, std::int64_t in, std::int64_t out) const {
    return offset[d] + (align[d] ? in - out : 0);
  }
  template <class = void>
  tensor evaluate(std::span<const tensor* const> in) const;
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const crop_or_pad&) const = default;
  /// crop_or_pad of dy to x's shape with the offsets negated.
  template <class G> void gradient(G& g) const;
};

/// `slice(x, begin, size)`: the block of `size[d]` elements from `begin[d]` along
/// every dim d; a size of -1 takes everything to the end.
struct slice {
  static constexpr std::string_view name = "slice";
  static constexpr std::string_view onnx_name = "Slice";
  static constexpr int arity = 1;
  int_list begin;
  int_list size;
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"begin", &slice::begin},
                      attribute{"size", &slice::size}};
  }

  /// The extent along dim `d` of a dim of `dim` elements; out-of-range values give
  /// 0 here, and check_values rejects them before anything runs.
  constexpr std::int64_t extent(int d, std::int64_t dim) const {
    if (size[d] >= 0) return size[d];
    if (dim == none) return none;
    if (size[d] != -1 || begin[d] < 0 || begin[d] > dim) return 0;
    return dim - begin[d];
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return {in[0]}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const kiln::shape& s = in[0];
    if (begin.size() != size.size() || (s.has_known_rank() && begin.size() != s.rank()))
      return {{}, "begin and size must have one entry per dim"};
    kiln::shape out;
    for (int d = 0; d < begin.size(); ++d) out.push_back(extent(d, s.has_known_rank() ? s[d] : none));
    return {out};
  }
  /// The first dim of `s` that begin and size do not fit (begin in [0, dim], size -1
  /// or in [0, dim - begin]), or -1 when they fit every dim.
  constexpr int first_unfit_dim(const kiln::shape& s) const {
    for (int d = 0; d < s.rank(); ++d)
      if (begin[d] < 0 || begin[d] > s[d] || size[d] < -1 || size[d] > s[d] - begin[d]) return d;
    return -1;
  }
  KILN_LIBRARY_INLINE std::string attributes() const;
  constexpr bool operator==(const slice&) const = default;
  /// dy in place of the slice, zeros around it.
  template <class G> void gradient(G& g) const;
};

// ---- gradients of the ops above, which run each other -------------------------

/// `rank` zeros: where a slice from the first element begins.
KILN_LIBRARY_INLINE int_list origin(int rank);

/// The slice of `x` of shape `size` at `begin` (the shape ops' formulas cut dy and
/// zeros with it).
template <class G, class V>
V slice_of(const V& x, const int_list& begin, const kiln::shape& size) {
  int_list sizes;
  for (std::int64_t d : size) sizes.push_back(int(d));
  return G::run(slice{begin, sizes}, x);
}

/// Each entry of `l` negated: the offsets that undo a window's.
KILN_LIBRARY_INLINE int_list negated(const int_list& l);

/// Zeros per dim, `rank` of them, but `at` in dim `axis`.
KILN_LIBRARY_INLINE int_list along(int rank, int axis, std::int64_t at);

template <class G>
void concat::gradient(G& g) const {
  const int rank = g.x(0).t.rank(), a = normalize_axis(axis, rank), n = int(g.arity());
  // The inputs whose sizes along the axis are known only when the graph runs: those
  // up to the first are cut at offsets from dy's start, those from the last at
  // offsets from its end; one between two has neither.
  int first = n, last = -1;
  for (int i = 0; i < n; ++i)
    if (g.x(i).t.shape()[a] == none) first = std::min(first, i), last = i;
  if (last - first > 1)
    throw unavailable_error("concat: no gradient for input " + std::to_string(first + 1) + ", between inputs " +
                            std::to_string(first) + " and " + std::to_string(last) + " whose sizes along axis " +
                            std::to_string(a) + " are known only when the graph runs");
  std::int64_t offset = 0;
  for (int i = 0; i <= std::min(first, n - 1); ++i) {
    const kiln::shape s = g.x(i).t.shape();
    if (s.is_fully_defined())
      g.give(i, slice_of<G>(g.dy(), along(rank, a, offset), s));
    else
      g.give(i, G::run(crop_or_pad{along(rank, a, offset), origin(rank)}, g.dy(), g.x(i)));
    offset += s[a];
  }
  std::int64_t after = 0;
  for (int i = n - 1; i > first; --i) {
    g.give(i, G::run(crop_or_pad{along(rank, a, -after), along(rank, a, 1)}, g.dy(), g.x(i)));
    after += g.x(i).t.shape()[a];
  }
}

template <class G>
void stack::gradient(G& g) const {
  const kiln::shape out = g.y().t.shape();
  const int a = normalize_axis(axis, out.rank());
  kiln::shape one = out;
  one[a] = 1;
  for (int i = 0; i < int(g.arity()); ++i) {
    int_list begin;
    for (int d = 0; d < out.rank(); ++d) begin.push_back(d == a ? i : 0);
    g.give(i, G::reshape(slice_of<G>(g.dy(), begin, one), g.x(i).t.shape()));
  }
}

template <class G>
void gather::gradient(G& g) const {
  const kiln::shape x = g.x(0).t.shape();
  const int a = normalize_axis(axis, x.rank());
  if (x[a] == none)
    throw unavailable_error("gather: no gradient for a tensor of shape " + x.str() + " whose size along axis " +
                            std::to_string(a) + " is known only when the graph runs");
  g.give(0, G::run(unsorted_segment_sum{x[a], a}, g.dy(), g.x(1)));
}

template <class G>
void unsorted_segment_sum::gradient(G& g) const {
  // TensorFlow's _GatherDropNegatives: a dropped (negative) id's slice gets zeros.
  const auto ids = g.x(1), kept = G::run(greater_equal{}, ids, ids.scalar(0));
  const auto rows = G::run(gather{axis}, g.dy(), G::run(where{}, kept, ids, ids.scalar(0)));
  kiln::shape mask = ids.t.shape();  // the ids' dims, then ones: broadcasts against rows
  for (int d = int(axis) + ids.t.rank(); d < rows.t.rank(); ++d) mask.push_back(1);
  g.give(0, G::run(where{}, G::reshape(kept, mask), rows, rows.scalar(0)));
}

template <class G>
void set_item::gradient(G& g) const {
  g.give(0, G::run(set_item{}, g.dy(), g.x(1), g.zeros_like(2)));
  g.give(2, G::run(gather{}, g.dy(), g.x(1)));
}

template <class G>
void pad_rows::gradient(G& g) const {
  const kiln::shape x = g.x(0).t.shape();
  if (x.is_fully_defined())
    g.give(0, slice_of<G>(g.dy(), origin(x.rank()), x));
  else
    g.give(0, G::run(crop_or_pad{origin(x.rank()), origin(x.rank())}, g.dy(), g.x(0)));
}

template <class G>
void crop_or_pad::gradient(G& g) const {
  g.give(0, G::run(crop_or_pad{negated(offset), align}, g.dy(), g.x(0)));
}

/// `block`, a slice at `begin` of a tensor of shape `in`, with zeros (a tensor of
/// shape `in`) around it: the gradient of the slice, built dim by dim.
template <class G, class V>
V zeros_around(V block, const kiln::shape& in, const int_list& begin, const V& zeros) {
  kiln::shape current = block.t.shape();
  for (int d = 0; d < in.rank(); ++d) {
    const std::int64_t before = begin[d], after = in[d] - begin[d] - current[d];
    kiln::shape part = current;
    if (before > 0) {
      part[d] = before;
      block = G::run(concat{d}, slice_of<G>(zeros, origin(in.rank()), part), block);
    }
    if (after > 0) {
      part[d] = after;
      block = G::run(concat{d}, block, slice_of<G>(zeros, origin(in.rank()), part));
    }
    current[d] = in[d];
  }
  return block;
}

template <class G>
void slice::gradient(G& g) const {
  const kiln::shape x = g.x(0).t.shape();
  if (x.is_fully_defined()) {
    g.give(0, zeros_around<G>(g.dy(), x, begin, g.zeros_like(0)));
  } else {
    g.give(0, G::run(crop_or_pad{negated(begin), origin(x.rank())}, g.dy(), g.x(0)));
  }
}

template <class G>
void index::gradient(G& g) const {
  const kiln::shape in = g.x(0).t.shape();
  if (!in.is_fully_defined()) {  // dy as one row, padded to x's shape; a negative i counts from the end
    const crop_or_pad pad{along(in.rank(), 0, i < 0 ? -i - 1 : -i), along(in.rank(), 0, i < 0 ? 1 : 0)};
    g.give(0, G::run(pad, G::run(stack{0}, g.dy()), g.x(0)));
    return;
  }
  kiln::shape row = in;
  row[0] = 1;
  int_list begin;
  for (int d = 0; d < in.rank(); ++d) begin.push_back(d > 0 ? 0 : int(i < 0 ? i + in[0] : i));
  g.give(0, zeros_around<G>(G::reshape(g.dy(), row), in, begin, g.zeros_like(0)));
}

/// `shape_of(x)`: the dims of `x` as a 1-D int32 tensor.
struct shape_of {
  static constexpr std::string_view name = "shape";
  static constexpr std::string_view onnx_name = "Shape";
  static constexpr int arity = 1;

  constexpr dtype_result result_dtype(std::span<const dtype>) const { return {int32}; }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    return {kiln::shape{in[0].has_known_rank() ? std::int64_t(in[0].rank()) : none}};
  }
  /// Builds the dims on the host, then moves them to the input's device.
  KILN_LIBRARY_INLINE tensor evaluate(std::span<const tensor* const> in) const;
  constexpr bool operator==(const shape_of&) const = default;
};

// detail::run_on calls `check_values(op, inputs)` unqualified before it allocates the
// result; these overloads, found by argument-dependent lookup, reject indices and
// ranges that do not fit the (now concrete) input shapes. Templates, so that a file
// compiles them (and the index readers they instantiate) only where it runs the op.

/// `x[i]` needs -dim <= i < dim for the first dim.
template <class = void>
void check_values(const index& op, std::span<const tensor* const> in) {
  const shape& s = in[0]->shape();
  if (op.i < -s[0] || op.i >= s[0])
    throw invalid_argument_error("strided_slice: index " + std::to_string(op.i) + " is out of range [" +
                                 std::to_string(-s[0]) + ", " + std::to_string(s[0]) +
                                 ") for the first dim of a tensor of shape " + s.str());
}

/// `slice` needs 0 <= begin[d] <= dim and 0 <= size[d] <= dim - begin[d] (or size[d] == -1).
template <class = void>
void check_values(const slice& op, std::span<const tensor* const> in) {
  const shape& s = in[0]->shape();
  const int d = op.first_unfit_dim(s);
  if (d < 0) return;
  const std::string problem =
      op.begin[d] < 0 || op.begin[d] > s[d]
          ? "begin[" + std::to_string(d) + "] = " + std::to_string(op.begin[d]) + " is not in [0, " + std::to_string(s[d]) + "]"
          : "size[" + std::to_string(d) + "] = " + std::to_string(op.size[d]) + " is not -1 or in [0, " +
                std::to_string(s[d] - op.begin[d]) + "]";
  throw invalid_argument_error("slice: " + op.attributes() + " is out of range for shape " + s.str() + ": " + problem);
}

/// Position `k` of a tensor of shape `s` as a multi-index, as TensorFlow prints it ("1, 0").
KILN_LIBRARY_INLINE std::string position_text(std::int64_t k, const shape& s);

/// Calls `f(p)` with a host pointer to the elements of `indices` (int32 or int64, on
/// any device).
template <class F>
void with_host_indices(const tensor& indices, F&& f) {
  auto read = [&]<class T>(std::type_identity<T>) {
    if (indices.device() == device::cpu) {
      f(indices.data<T>());
    } else {
      const std::vector<T> copied = indices.to_vector<T>();
      f(copied.data());
    }
  };
  if (indices.dtype() == int64)
    read(std::type_identity<std::int64_t>{});
  else
    read(std::type_identity<std::int32_t>{});
}

/// Raises kiln::invalid_argument_error, as TensorFlow's CPU kernel, when one of the
/// indices at `p` (of shape `indices`) is outside [0, dim) for `axis` of shape `x`.
template <class I>
void check_gather_indices(const I* p, const shape& indices, std::int64_t axis, const shape& x) {
  const std::int64_t dim = x[normalize_axis(axis, x.rank())], n = indices.num_elements();
  std::int64_t k = 0;
  while (k < n && p[k] >= 0 && p[k] < dim) ++k;
  if (k == n) return;
  throw invalid_argument_error("gather: indices[" + position_text(k, indices) + "] = " + std::to_string(p[k]) +
                               " is not in [0, " + std::to_string(dim) + ") for axis " + std::to_string(axis) +
                               " of shape " + x.str());
}

/// `gather` needs every index in [0, dim) for the gathered dim.
template <class = void>
void check_values(const gather& op, std::span<const tensor* const> in) {
  with_host_indices(*in[1], [&](const auto* p) { check_gather_indices(p, in[1]->shape(), op.axis, in[0]->shape()); });
}

/// `unsorted_segment_sum` needs every segment id below num_segments (negative ones
/// are dropped), as TensorFlow's CPU kernel does.
template <class = void>
void check_values(const unsorted_segment_sum& op, std::span<const tensor* const> in) {
  const shape& ids = in[1]->shape();
  const std::int64_t n = ids.num_elements();
  with_host_indices(*in[1], [&](const auto* p) {
    std::int64_t k = 0;
    while (k < n && p[k] < op.num_segments) ++k;
    if (k == n) return;
    throw invalid_argument_error("unsorted_segment_sum: segment_ids[" + position_text(k, ids) + "] = " +
                                 std::to_string(p[k]) + " is not below num_segments = " + std::to_string(op.num_segments));
  });
}

/// The value of an int32 or int64 scalar index (the `i` of set_item), on any device.
KILN_LIBRARY_INLINE std::int64_t scalar_index(const tensor& index);

/// `set_item` needs 0 <= i < dim for the first dim of `x`.
template <class = void>
void check_set_item_index(std::int64_t i, const shape& x) {
  if (i < 0 || i >= x[0])
    throw invalid_argument_error("set_item: index " + std::to_string(i) + " is not in [0, " + std::to_string(x[0]) +
                                 ") for the first dim of a tensor of shape " + x.str());
}

template <class = void>
void check_values(const set_item&, std::span<const tensor* const> in) {
  check_set_item_index(scalar_index(*in[1]), in[0]->shape());
}

/// `pad_rows` needs a number of rows that is not negative.
template <class = void>
void check_pad_rows(std::int64_t rows, const shape& x) {
  if (rows < 0)
    throw invalid_argument_error("pad_rows: the number of rows must not be negative, got " + std::to_string(rows) +
                                 " for a tensor of shape " + x.str());
}

template <class = void>
void check_values(const pad_rows&, std::span<const tensor* const> in) {
  check_pad_rows(scalar_index(*in[1]), in[0]->shape());
}

}  // namespace ops

namespace detail {

/// Runs an op on a list of tensors (concat, stack).
template <class Op>
tensor apply_to_list(const Op& op, std::span<const tensor> values) {
  small_vector<const tensor*, 8> inputs;
  inputs.reserve(values.size());
  for (const tensor& t : values) inputs.emplace_back(&t);
  return apply_span(op, inputs);
}

}  // namespace detail

/// `kiln::reshape(x, {2, -1})`: the elements of `x` in a new shape; one dim may be -1
/// (kiln::none) and is inferred. An eager result shares `x`'s buffer.
template <class = void>
tensor reshape(const tensor& x, const shape& new_shape) {
  const tensor* in[] = {&x};
  return detail::apply_span(ops::reshape{new_shape}, in);
}

/// `kiln::transpose(x, {1, 0})` swaps the dims of a matrix; `kiln::transpose(x)`
/// reverses the dims of any tensor.
template <class = void>
tensor transpose(const tensor& x, const int_list& perm = {}) {
  const tensor* in[] = {&x};
  return detail::apply_span(ops::transpose{perm}, in);
}

/// `kiln::concat({a, b}, 0)`: joins tensors of one dtype along an existing dim
/// (negative axes count from the end); the other dims must match.
template <class = void>
tensor concat(std::span<const tensor> values, std::int64_t axis) {
  return detail::apply_to_list(ops::concat{axis}, values);
}
/// `kiln::concat({a, b}, -1)`.
template <class = void>
tensor concat(std::initializer_list<tensor> values, std::int64_t axis) {
  return concat(std::span<const tensor>(values.begin(), values.size()), axis);
}

/// `kiln::stack({a, b})`: joins tensors of one shape along a new dim `axis`
/// (shape (2, 3) twice gives (2, 2, 3)).
template <class = void>
tensor stack(std::span<const tensor> values, std::int64_t axis = 0) {
  return detail::apply_to_list(ops::stack{axis}, values);
}
/// `kiln::stack({a, b}, 1)`.
template <class = void>
tensor stack(std::initializer_list<tensor> values, std::int64_t axis = 0) {
  return stack(std::span<const tensor>(values.begin(), values.size()), axis);
}

/// `kiln::gather(x, indices, axis)`: the slices of `x` along `axis` at `indices`
/// (an int32 or int64 tensor of any shape); gathering rows {2, 0} of a (3, 4)
/// matrix gives a (2, 4) one. An index outside [0, dim) raises kiln::invalid_argument_error.
template <class = void>
tensor gather(const tensor& x, const tensor& indices, std::int64_t axis = 0) {
  const tensor* in[] = {&x, &indices};
  return detail::apply_span(ops::gather{axis}, in);
}

/// `kiln::unsorted_segment_sum(data, segment_ids, num_segments)`: for each segment s
/// in [0, num_segments), the sum of the slices `data[j]` whose id `segment_ids[j]` is
/// s (TensorFlow's tf.math.unsorted_segment_sum: `segment_ids`, int32 or int64, has
/// the shape of `data`'s leading dims; a segment no id names is 0, a negative id is
/// dropped, an id of num_segments or more raises kiln::invalid_argument_error).
/// \code kiln::unsorted_segment_sum(kiln::constant({1.f, 2.f, 3.f}), kiln::constant({1, 0, 1}), 2);  // [2 4] \endcode
template <class = void>
tensor unsorted_segment_sum(const tensor& data, const tensor& segment_ids, std::int64_t num_segments) {
  const tensor* in[] = {&data, &segment_ids};
  return detail::apply_span(ops::unsorted_segment_sum{num_segments}, in);
}

/// `kiln::slice(x, {1, 0}, {2, -1})`: rows 1 and 2 of `x`, every column; a size of -1
/// takes everything to the end of its dim.
template <class = void>
tensor slice(const tensor& x, const int_list& begin, const int_list& size) {
  const tensor* in[] = {&x};
  return detail::apply_span(ops::slice{begin, size}, in);
}

/// `kiln::set_item(x, i, value)`: a copy of `x` whose slice `x[i]` is `value`
/// (`i` an int32 or int64 scalar in [0, x.shape()[0])).
/// \code kiln::set_item(kiln::zeros({3, 2}), kiln::constant(1), kiln::ones({2}));  // [[0 0] [1 1] [0 0]] \endcode
template <class = void>
tensor set_item(const tensor& x, const tensor& i, const tensor& value) {
  return detail::apply(ops::set_item{}, x, i, value);
}

template <class>
tensor ops::set_item::evaluate(std::span<const tensor* const> in) const {
  const tensor &x = *in[0], &value = *in[2];
  const std::int64_t i = scalar_index(*in[1]);
  int_list zero, before, begin, after;  // x[:i] is slice(x, zero, before); x[i + 1:] is slice(x, begin, after)
  for (int d = 0; d < x.rank(); ++d) {
    zero.push_back(0);
    before.push_back(d == 0 ? i : -1);
    begin.push_back(d == 0 ? i + 1 : 0);
    after.push_back(-1);
  }
  kiln::shape row = x.shape();
  row[0] = 1;
  return detail::execute_now(concat{0}, detail::execute_now(slice{zero, before}, x), detail::execute_now(reshape{row}, value),
                             detail::execute_now(slice{begin, after}, x));
}

template <class>
tensor ops::set_item::evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const {
  const tensor& value = *in[2];
  if (x.dtype() == string || x.device() != device::cpu || value.device() != device::cpu || !x.sole_owner()) {
    const tensor* rest[] = {&x, in[1], in[2]};
    return evaluate(rest);
  }
  const std::size_t row_bytes = std::size_t(value.size()) * size_of(value.dtype());
  std::memcpy(static_cast<char*>(x.raw_data()) + std::size_t(scalar_index(*in[1])) * row_bytes, value.raw_data(), row_bytes);
  return std::move(x);
}

/// `kiln::pad_rows(x, rows)`: `x` with rows of zeros (`false`, `""`) appended along
/// its first dim until it has `rows` (an int32 or int64 scalar, not negative); `x`
/// itself when it has that many rows already.
/// \code kiln::pad_rows(kiln::ones({1, 2}), kiln::constant(3));  // [[1 1] [0 0] [0 0]] \endcode
template <class = void>
tensor pad_rows(const tensor& x, const tensor& rows) { return detail::apply(ops::pad_rows{}, x, rows); }

template <class>
tensor ops::pad_rows::evaluate(std::span<const tensor* const> in) const {
  const tensor& x = *in[0];
  kiln::shape missing = x.shape();
  missing[0] = scalar_index(*in[1]) - x.shape()[0];
  if (missing[0] <= 0) return x;
  return detail::execute_now(concat{0}, x, kiln::zeros(missing, x.dtype(), x.device()));
}

template <class>
tensor ops::pad_rows::evaluate_in_place(tensor&& x, std::span<const tensor* const> in) const {
  const std::int64_t rows = scalar_index(*in[1]);
  if (rows <= x.shape()[0]) return std::move(x);
  if (x.dtype() == string || x.device() != device::cpu) {
    const tensor* rest[] = {&x, in[1]};
    return evaluate(rest);
  }
  return grow(std::move(x), rows);
}

template <class>
tensor ops::pad_rows::grow(tensor&& x, std::int64_t rows) {
  const std::int64_t have = x.shape()[0];
  kiln::shape grown = x.shape();
  grown[0] = rows;
  const std::int64_t row = have > 0 ? x.size() / have : grown.num_elements() / rows;
  const std::size_t element = size_of(x.dtype());
  tensor out = std::move(x);
  if (!out.sole_owner() || out.buffer_capacity() < rows * row) {
    kiln::shape room = grown;
    room[0] = std::max(rows, 2 * have);
    tensor bigger(out.dtype(), room);
    if (out.size() > 0) std::memcpy(bigger.raw_data(), out.raw_data(), std::size_t(out.size()) * element);
    out = std::move(bigger).share(out.shape());
  }
  std::memset(static_cast<char*>(out.raw_data()) + std::size_t(have * row) * element, 0,
              std::size_t((rows - have) * row) * element);
  return std::move(out).share(grown);
}

/// `kiln::crop_or_pad(x, like, offset, align)`: the window of `x` of `like`'s shape
/// at `offset` (from x's start, or with align 1 in a dim from its end), zeros where
/// it leaves x (see ops::crop_or_pad).
/// \code kiln::crop_or_pad(kiln::constant({1, 2, 3}), kiln::zeros({4}), {-1}, {0});  // [0 1 2 3] \endcode
template <class = void>
tensor crop_or_pad(const tensor& x, const tensor& like, const int_list& offset, const int_list& align) {
  const tensor* in[] = {&x, &like};
  return detail::apply_span(ops::crop_or_pad{offset, align}, in);
}

template <class>
tensor ops::crop_or_pad::evaluate(std::span<const tensor* const> in) const {
  const tensor& x = *in[0];
  const kiln::shape& out = in[1]->shape();
  int_list begin, size;  // the block of x inside the window
  kiln::shape before, after;  // the zeros around it, per dim
  bool empty = false;
  for (int d = 0; d < out.rank(); ++d) {
    const std::int64_t first = start(d, x.shape()[d], out[d]);
    const std::int64_t lo = std::clamp<std::int64_t>(first, 0, x.shape()[d]);
    const std::int64_t hi = std::clamp<std::int64_t>(first + out[d], 0, x.shape()[d]);
    empty |= hi <= lo;
    begin.push_back(lo);
    size.push_back(std::max<std::int64_t>(hi - lo, 0));
    before.push_back(std::clamp<std::int64_t>(lo - first, 0, out[d]));
    after.push_back(out[d] - before[d] - size[d]);
  }
  if (empty) return kiln::zeros(out, x.dtype(), x.device());
  tensor block = detail::execute_now(slice{begin, size}, x);
  for (int d = 0; d < out.rank(); ++d) {
    kiln::shape part = block.shape();
    if (before[d] > 0) {
      part[d] = before[d];
      block = detail::execute_now(concat{d}, kiln::zeros(part, x.dtype(), x.device()), block);
    }
    if (after[d] > 0) {
      part[d] = after[d];
      block = detail::execute_now(concat{d}, block, kiln::zeros(part, x.dtype(), x.device()));
    }
  }
  return block;
}

/// `kiln::shape_of(x)`: the dims of `x` as a 1-D int32 tensor (`[2 3]` for a 2x3 matrix).
template <class = void>
tensor shape_of(const tensor& x) { return detail::apply(ops::shape_of{}, x); }

template <class>
tensor tensor::operator[](std::int64_t i) const {
  const tensor* in[] = {this};
  return detail::apply_span(ops::index{i}, in);
}

template <class>
tensor tensor::operator[](const tensor& i) const {
  if (i.defined() && i.rank() != 0)
    throw value_error("x[i]: the index must be a scalar, got " + std::string(name(i.dtype())) + " " + i.shape().str() +
                      "; use kiln::gather for several indices");
  return gather(*this, i);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string dims_text(const shape& s) { return int_list(s.dims()).str(); }

}  // namespace kiln::detail

namespace kiln::ops {

KILN_LIBRARY_INLINE tensor reshape::evaluate(std::span<const tensor* const> in) const {
  const kiln::shape& s = in[0]->shape();
  return in[0]->share(result_shape(std::span<const kiln::shape>(&s, 1)).value);
}

KILN_LIBRARY_INLINE std::string reshape::attributes() const { return "shape=" + detail::dims_text(new_shape); }

KILN_LIBRARY_INLINE std::string transpose::attributes() const { return "perm=" + perm.str(); }

KILN_LIBRARY_INLINE std::string concat::attributes() const { return "axis=" + std::to_string(axis); }

KILN_LIBRARY_INLINE std::string stack::attributes() const { return "axis=" + std::to_string(axis); }

KILN_LIBRARY_INLINE std::string gather::attributes() const { return "axis=" + std::to_string(axis); }

KILN_LIBRARY_INLINE std::string unsorted_segment_sum::attributes() const {
  return "num_segments=" + std::to_string(num_segments) + (axis == 0 ? "" : ", axis=" + std::to_string(axis));
}

KILN_LIBRARY_INLINE tensor index::evaluate(std::span<const tensor* const> in) const {
  const kiln::shape& s = in[0]->shape();
  kiln::shape rest(s.dims().subspan(1));
  return in[0]->share(rest, (i < 0 ? i + s[0] : i) * rest.num_elements());
}

KILN_LIBRARY_INLINE std::string index::attributes() const { return "index=" + std::to_string(i); }

KILN_LIBRARY_INLINE std::string set_item::attributes() const { return ""; }

KILN_LIBRARY_INLINE std::string pad_rows::attributes() const { return ""; }

KILN_LIBRARY_INLINE std::string crop_or_pad::attributes() const {
  return "offset=" + offset.str() + ", align=" + align.str();
}

KILN_LIBRARY_INLINE std::string slice::attributes() const { return "begin=" + begin.str() + ", size=" + size.str(); }

KILN_LIBRARY_INLINE int_list origin(int rank) {
  int_list o;
  for (int d = 0; d < rank; ++d) o.push_back(0);
  return o;
}

KILN_LIBRARY_INLINE int_list negated(const int_list& l) {
  int_list out;
  for (std::int64_t x : l) out.push_back(-x);
  return out;
}

KILN_LIBRARY_INLINE int_list along(int rank, int axis, std::int64_t at) {
  int_list o;
  for (int d = 0; d < rank; ++d) o.push_back(d == axis ? at : 0);
  return o;
}

KILN_LIBRARY_INLINE tensor shape_of::evaluate(std::span<const tensor* const> in) const {
  const kiln::shape& s = in[0]->shape();
  tensor out(int32, kiln::shape{s.rank()});
  auto* dims = out.view().as<std::int32_t>();
  for (int d = 0; d < s.rank(); ++d) {
    if (s[d] > std::numeric_limits<std::int32_t>::max())
      throw invalid_argument_error("shape: dim " + std::to_string(d) + " of shape " + s.str() +
                                   " does not fit in int32");
    dims[d] = std::int32_t(s[d]);
  }
  return out.to(in[0]->device());
}

KILN_LIBRARY_INLINE std::string position_text(std::int64_t k, const shape& s) {
  std::string position;
  for (std::int64_t d = s.rank() - 1, rest = k; d >= 0; --d) {
    position = std::to_string(rest % s[int(d)]) + (position.empty() ? "" : ", ") + position;
    rest /= s[int(d)];
  }
  return position;
}

KILN_LIBRARY_INLINE std::int64_t scalar_index(const tensor& index) {
  return index.dtype() == int64 ? index.to_vector<std::int64_t>()[0] : index.to_vector<std::int32_t>()[0];
}

}  // namespace kiln::ops
#endif  // KILN_DEFINE_LIBRARY

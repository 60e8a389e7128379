#pragma once
/// \file
/// Linear algebra and NN ops: `matmul` (2-D and batched, batch dims broadcast) and
/// `conv2d` (NHWC input, HWIO filters, strides, VALID or SAME padding).

#include <array>
#include <string_view>
#include <utility>

#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/op.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::ops {

/// Shared dtype rule: two operands of one numeric dtype.
constexpr dtype_result same_numeric_dtype(std::span<const dtype> in) {
  if (in[0] != in[1]) return {in[0], "operands must have the same dtype"};
  if (!dtypes::numeric.contains(in[0])) return {in[0], "dtype not supported"};
  return {in[0]};
}

/// `a @ b` over the last two dims; leading (batch) dims broadcast.
struct matmul {
  static constexpr std::string_view name = "matmul";
  static constexpr std::string_view onnx_name = "MatMul";
  static constexpr int arity = 2;
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return same_numeric_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const shape &a = in[0], &b = in[1];
    if (!a.has_known_rank() || !b.has_known_rank()) return {shape(unknown_rank)};
    if (a.rank() < 2 || b.rank() < 2) return {{}, "operands must have rank >= 2"};
    std::int64_t ka = a[a.rank() - 1], kb = b[b.rank() - 2];
    if (ka != kb && ka != none && kb != none) return {{}, "inner dimensions do not match"};
    shape batch_a, batch_b;
    for (int i = 0; i < a.rank() - 2; ++i) batch_a.push_back(a[i]);
    for (int i = 0; i < b.rank() - 2; ++i) batch_b.push_back(b[i]);
    shape_result out = broadcast_shapes(batch_a, batch_b);
    if (!out.ok()) return {{}, "batch dimensions are not broadcast-compatible"};
    out.value.push_back(a[a.rank() - 2]);
    out.value.push_back(b[b.rank() - 1]);
    return out;
  }
  constexpr bool operator==(const matmul&) const = default;
  /// dy · bᵀ and aᵀ · dy (summed over broadcast batch dims by the tape).
  template <class G> void gradient(G& g) const {
    if (g.needs(0)) g.give(0, G::matmul(g.dy(), G::transpose(g.x(1), swap_last_two(g.x(1).t.rank()))));
    if (g.needs(1)) g.give(1, G::matmul(G::transpose(g.x(0), swap_last_two(g.x(0).t.rank())), g.dy()));
  }
  /// The permutation that swaps the last two of `rank` dims.
  static constexpr int_list swap_last_two(int rank) {
    int_list p;
    for (int d = 0; d < rank - 2; ++d) p.push_back(d);
    p.push_back(rank - 1);
    p.push_back(rank - 2);
    return p;
  }
};

/// Sizes of a (batched) matmul and where each batch's operands start, shared by
/// every backend's kernel.
struct matmul_geometry {
  std::int64_t m = 0, n = 0, k = 0, batches = 1;

  constexpr matmul_geometry(const shape& a, const shape& b, const shape& out) {
    const int r = out.rank();
    m = out[r - 2], n = out[r - 1], k = a[a.rank() - 1];
    for (int i = 0; i < r - 2; ++i) batch_.push_back(out[i]);
    batches = batch_.num_elements();
    a_strides_ = leading_strides(a, batch_);
    b_strides_ = leading_strides(b, batch_);
  }
  /// Element offsets of batch `i`'s matrices in a and in b.
  constexpr std::pair<std::int64_t, std::int64_t> operand_offsets(std::int64_t i) const {
    std::int64_t oa = 0, ob = 0;
    for (int d = batch_.rank() - 1; d >= 0; --d) {
      oa += (i % batch_[d]) * a_strides_[d];
      ob += (i % batch_[d]) * b_strides_[d];
      i /= batch_[d];
    }
    return {oa * m * k, ob * k * n};
  }

 private:
  // Broadcast strides, in matrices, of an operand's batch dims against the output's.
  static constexpr std::array<std::int64_t, max_rank> leading_strides(const shape& x, const shape& batch) {
    std::array<std::int64_t, max_rank> st{};
    std::int64_t acc = 1;
    int lead = x.rank() - 2, offset = batch.rank() - lead;
    for (int i = lead - 1; i >= 0; --i) {
      st[i + offset] = x[i] == 1 ? 0 : acc;
      acc *= x[i];
    }
    return st;
  }
  shape batch_;
  std::array<std::int64_t, max_rank> a_strides_{}, b_strides_{};
};

/// Padding of a convolution, as TensorFlow's "VALID" and "SAME".
enum class padding : unsigned char { valid, same };

/// The output size and leading padding of one spatial dim of a convolution.
struct conv_dim {
  std::int64_t out = 0;
  std::int64_t pad_before = 0;
};
constexpr conv_dim conv_output_dim(std::int64_t in, std::int64_t filter, std::int64_t stride, padding p) {
  if (in == none) return {none, 0};
  if (p == padding::valid) return {in >= filter ? (in - filter) / stride + 1 : 0, 0};
  std::int64_t out = (in + stride - 1) / stride;
  std::int64_t total = (out - 1) * stride + filter - in;
  return {out, total > 0 ? total / 2 : 0};
}

/// 2-D convolution (cross-correlation, as TensorFlow's conv2d).
struct conv2d {
  static constexpr std::string_view name = "conv2d";
  static constexpr std::string_view onnx_name = "Conv";
  static constexpr int arity = 2;
  std::int64_t stride_h = 1, stride_w = 1;
  padding pad = padding::valid;
  static constexpr auto attribute_fields() {
    return std::tuple{attribute{"stride_h", &conv2d::stride_h},
                      attribute{"stride_w", &conv2d::stride_w},
                      attribute{"padding", &conv2d::pad}};
  }

  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return same_numeric_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    const shape &x = in[0], &f = in[1];
    if (stride_h < 1 || stride_w < 1) return {{}, "strides must be >= 1"};
    if (!x.has_known_rank() || !f.has_known_rank()) return {shape(unknown_rank)};
    if (x.rank() != 4) return {{}, "the input must have rank 4 (NHWC)"};
    if (f.rank() != 4) return {{}, "the filters must have rank 4 (HWIO)"};
    if (x[3] != f[2] && x[3] != none && f[2] != none) return {{}, "input channels do not match the filters' in-channels"};
    if (pad == padding::valid && x[1] != none && f[0] != none && x[1] < f[0])
      return {{}, "VALID padding needs the input to be at least as large as the filter"};
    if (pad == padding::valid && x[2] != none && f[1] != none && x[2] < f[1])
      return {{}, "VALID padding needs the input to be at least as large as the filter"};
    return {shape{x[0], conv_output_dim(x[1], f[0], stride_h, pad).out, conv_output_dim(x[2], f[1], stride_w, pad).out, f[3]}};
  }
  constexpr bool operator==(const conv2d&) const = default;
  /// Both are stride-1 convolutions of dy spread out by the strides: the input's is a
  /// full correlation with the filters turned by 180° (TensorFlow's
  /// Conv2DBackpropInput), the filters' a correlation of the padded input with dy,
  /// the batch taking the place of the channels (Conv2DBackpropFilter).
  template <class G> void gradient(G& g) const;
};

/// `v` with `step - 1` zeros after each element along `axis` but the last: a strided
/// convolution's output spread over the positions a stride-1 one would have.
template <class G, class V>
V spread_out(const V& v, int axis, std::int64_t step) {
  const shape s = v.t.shape();
  if (step == 1 || s[axis] == 0) return v;
  shape column, gap, spread = s;  // one more dim after `axis`: each element, then its gap
  for (int d = 0; d < s.rank(); ++d) {
    column.push_back(s[d]);
    gap.push_back(s[d]);
    if (d == axis) column.push_back(1), gap.push_back(step - 1);
  }
  spread[axis] = s[axis] * step;
  const V joined = G::run(concat{axis + 1}, G::reshape(v, column), G::zeros(gap, v));
  shape kept = s;  // the last element's gap cut
  kept[axis] = (s[axis] - 1) * step + 1;
  return slice_of<G>(G::reshape(joined, spread), origin(s.rank()), kept);
}

/// `v` with `before` zeros ahead of it along `axis`, then zeros or a cut at the end
/// so that the dim has `length` elements.
template <class G, class V>
V fit_dim(V v, int axis, std::int64_t before, std::int64_t length) {
  shape s = v.t.shape();
  if (before > 0) {
    s[axis] = before;
    v = G::run(concat{axis}, G::zeros(s, v), v);
  }
  s = v.t.shape();
  if (s[axis] < length) {
    s[axis] = length - s[axis];
    v = G::run(concat{axis}, v, G::zeros(s, v));
  } else if (s[axis] > length) {
    s[axis] = length;
    v = slice_of<G>(v, origin(s.rank()), s);
  }
  return v;
}

template <class G>
void conv2d::gradient(G& g) const {
  const shape x = g.x(0).t.shape(), f = g.x(1).t.shape(), y = g.y().t.shape();
  const std::int64_t top = conv_output_dim(x[1], f[0], stride_h, pad).pad_before,
                     left = conv_output_dim(x[2], f[1], stride_w, pad).pad_before;
  const auto spread = spread_out<G>(spread_out<G>(g.dy(), 1, stride_h), 2, stride_w);
  // Input: every input pixel meets each filter tap that read it.
  if (g.needs(0)) {
    const auto turned = G::transpose(
        G::run(gather{0}, G::run(gather{1}, g.x(1), G::reversed_indices(f[1], g.x(1))), G::reversed_indices(f[0], g.x(1))),
        {0, 1, 3, 2});
    const auto framed_dy =
        fit_dim<G>(fit_dim<G>(spread, 1, f[0] - 1 - top, x[1] + f[0] - 1), 2, f[1] - 1 - left, x[2] + f[1] - 1);
    g.give(0, G::run(conv2d{}, framed_dy, turned));
  }
  if (!g.needs(1)) return;
  // Filters: the input as the forward pass saw it (padded, rows no output reached
  // cut), with images and channels swapped, correlated with the spread dy.
  const auto framed_x =
      fit_dim<G>(fit_dim<G>(g.x(0), 1, top, (y[1] - 1) * stride_h + f[0]), 2, left, (y[2] - 1) * stride_w + f[1]);
  g.give(1, G::transpose(G::run(conv2d{}, G::transpose(framed_x, {3, 1, 2, 0}), G::transpose(spread, {1, 2, 0, 3})),
                         {1, 2, 0, 3}));
}

}  // namespace kiln::ops

namespace kiln {

/// Padding of a convolution: `kiln::padding::valid` or `kiln::padding::same`.
using ops::padding;

/// Matrix product over the last two dims; leading dims are batch dims and broadcast.
/// \code kiln::matmul(kiln::ones({2, 3}), kiln::ones({3, 4})).shape() == kiln::shape{2, 4} \endcode
template <class = void>
tensor matmul(const tensor& a, const tensor& b) { return detail::apply(ops::matmul{}, a, b); }

/// Parses "VALID" / "SAME"; anything else is a kiln::value_error.
KILN_LIBRARY_INLINE ops::padding parse_padding(std::string_view p);

/// 2-D convolution of an NHWC input with HWIO filters. `strides` is one int, two
/// ints (height, width) or four (TensorFlow's NHWC form, batch and channel 1).
/// \code kiln::conv2d(kiln::ones({1, 5, 5, 1}), kiln::ones({3, 3, 1, 2}), {1, 1}, "VALID").shape() == kiln::shape{1, 3, 3, 2} \endcode
template <class = void>
tensor conv2d(const tensor& input, const tensor& filters, const int_list& strides, std::string_view padding) {
  ops::conv2d op;
  op.pad = parse_padding(padding);
  if (strides.size() == 1) {
    op.stride_h = op.stride_w = strides[0];
  } else if (strides.size() == 2) {
    op.stride_h = strides[0], op.stride_w = strides[1];
  } else if (strides.size() == 4 && strides[0] == 1 && strides[3] == 1) {
    op.stride_h = strides[1], op.stride_w = strides[2];
  } else {
    throw value_error("conv2d: strides must be 1, 2 or 4 ints (4 as [1, h, w, 1]), got " + strides.str());
  }
  return detail::apply(op, input, filters);
}
/// 2-D convolution with the same stride along height and width.
template <class = void>
tensor conv2d(const tensor& input, const tensor& filters, std::int64_t stride, std::string_view padding) {
  return conv2d(input, filters, int_list{stride}, padding);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE ops::padding parse_padding(std::string_view p) {
  if (p == "VALID") return ops::padding::valid;
  if (p == "SAME") return ops::padding::same;
  throw value_error("conv2d: padding must be \"VALID\" or \"SAME\", got \"" + std::string(p) + "\"");
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// Pooling ops over NHWC images, as TensorFlow's: `max_pool` and `avg_pool` (windows,
/// strides, VALID or SAME padding), and the ops their gradients run:
/// `max_pool_grad` (TensorFlow's MaxPoolGrad: each window's gradient goes to the
/// first of its largest elements, in row-major order), `max_pool_grad_grad` (its
/// gradient: what the first largest element of each window receives) and
/// `avg_pool_grad` (each window's gradient shared by the elements it averages; with
/// SAME padding a window averages its elements inside the image only, as
/// TensorFlow's AvgPool).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "kiln/ops/dispatch.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/op.hpp"

namespace kiln::ops {

/// The window, strides and padding of a pooling op (its attributes).
struct pool_window {
  std::int64_t window_h = 2, window_w = 2;
  std::int64_t stride_h = 2, stride_w = 2;
  padding pad = padding::valid;

  constexpr bool operator==(const pool_window&) const = default;

  /// The pooled shape of NHWC input `x`, or why there is none.
  constexpr shape_result pooled_shape(const shape& x) const {
    if (window_h < 1 || window_w < 1) return {{}, "the window must be at least 1 x 1"};
    if (stride_h < 1 || stride_w < 1) return {{}, "strides must be >= 1"};
    if (!x.has_known_rank()) return {shape(unknown_rank)};
    if (x.rank() != 4) return {{}, "the input must have rank 4 (NHWC)"};
    if (pad == padding::valid && ((x[1] != none && x[1] < window_h) || (x[2] != none && x[2] < window_w)))
      return {{}, "VALID padding needs the input to be at least as large as the window"};
    return {shape{x[0], conv_output_dim(x[1], window_h, stride_h, pad).out, conv_output_dim(x[2], window_w, stride_w, pad).out,
                  x[3]}};
  }
  /// The shape of an input gradient (the input's, operand 0) for an output gradient
  /// (operand 1) that must have the pooled shape.
  constexpr shape_result input_gradient_shape(std::span<const shape> in) const {
    const shape_result pooled = pooled_shape(in[0]);
    if (!pooled.ok()) return pooled;
    if (!in[1].is_compatible_with(pooled.value)) return {{}, "the gradient must have the pooled input's shape"};
    return {in[0]};
  }
};

/// The attributes of pooling op `Op` (a pool_window), as saved graphs list them.
template <class Op>
constexpr auto pool_attribute_fields() {
  return std::tuple{attribute{"window_h", &Op::window_h}, attribute{"window_w", &Op::window_w},
                    attribute{"stride_h", &Op::stride_h}, attribute{"stride_w", &Op::stride_w},
                    attribute{"padding", &Op::pad}};
}

/// Float inputs of one dtype, as TensorFlow's pooling ops and their gradients take.
constexpr dtype_result pooled_dtype(std::span<const dtype> in) {
  for (dtype t : in)
    if (t != in[0]) return {in[0], "operands must have the same dtype"};
  if (!dtypes::floating.contains(in[0])) return {in[0], "dtype not supported (pooling takes float32 or float64)"};
  return {in[0]};
}

/// The largest element of each window (TensorFlow's MaxPool).
struct max_pool : pool_window {
  static constexpr std::string_view name = "max_pool";
  static constexpr std::string_view onnx_name = "MaxPool";
  static constexpr int arity = 1;
  static constexpr auto attribute_fields() { return pool_attribute_fields<max_pool>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return pooled_shape(in[0]); }
  constexpr bool operator==(const max_pool&) const = default;
  /// Each window's gradient to the first of its largest elements (max_pool_grad).
  template <class G> void gradient(G& g) const;
};

/// The mean of each window's elements inside the image (TensorFlow's AvgPool).
struct avg_pool : pool_window {
  static constexpr std::string_view name = "avg_pool";
  static constexpr std::string_view onnx_name = "AveragePool";
  static constexpr int arity = 1;
  static constexpr auto attribute_fields() { return pool_attribute_fields<avg_pool>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return pooled_shape(in[0]); }
  constexpr bool operator==(const avg_pool&) const = default;
  /// Each window's gradient shared by its elements (avg_pool_grad).
  template <class G> void gradient(G& g) const;
};

/// The input gradient of max_pool at input `x` (operand 0) for the output gradient
/// `dy` (operand 1): zeros but at each window's first largest element, which receives
/// the window's gradient (summed where windows overlap).
struct max_pool_grad : pool_window {
  static constexpr std::string_view name = "max_pool_grad";
  static constexpr int arity = 2;
  static constexpr auto attribute_fields() { return pool_attribute_fields<max_pool_grad>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return input_gradient_shape(in); }
  constexpr bool operator==(const max_pool_grad&) const = default;
  /// Linear in dy, whose gradient is max_pool_grad_grad; x only picks the elements.
  template <class G> void gradient(G& g) const;
};

/// For input `x` (operand 0) and a gradient `d` of x's shape (operand 1), each
/// window's value of `d` at the window's first largest element of `x`: the gradient of
/// max_pool_grad with respect to its output gradient.
struct max_pool_grad_grad : pool_window {
  static constexpr std::string_view name = "max_pool_grad_grad";
  static constexpr int arity = 2;
  static constexpr auto attribute_fields() { return pool_attribute_fields<max_pool_grad_grad>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const {
    if (!in[1].is_compatible_with(in[0])) return {{}, "the gradient must have the input's shape"};
    return pooled_shape(in[0]);
  }
  constexpr bool operator==(const max_pool_grad_grad&) const = default;
  template <class G> void gradient(G& g) const;
};

/// The input gradient of avg_pool for the output gradient `dy` (operand 1); input `x`
/// (operand 0) gives the shape only.
struct avg_pool_grad : pool_window {
  static constexpr std::string_view name = "avg_pool_grad";
  static constexpr int arity = 2;
  static constexpr auto attribute_fields() { return pool_attribute_fields<avg_pool_grad>(); }
  constexpr dtype_result result_dtype(std::span<const dtype> in) const { return pooled_dtype(in); }
  constexpr shape_result result_shape(std::span<const shape> in) const { return input_gradient_shape(in); }
  constexpr bool operator==(const avg_pool_grad&) const = default;
  /// Linear in dy: its gradient is avg_pool of the incoming gradient.
  template <class G> void gradient(G& g) const;
};

template <class G>
void max_pool::gradient(G& g) const {
  g.give(0, G::run(max_pool_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void avg_pool::gradient(G& g) const {
  g.give(0, G::run(avg_pool_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void max_pool_grad::gradient(G& g) const {
  g.give(1, G::run(max_pool_grad_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void max_pool_grad_grad::gradient(G& g) const {
  g.give(1, G::run(max_pool_grad{*this}, g.x(0), g.dy()));
}
template <class G>
void avg_pool_grad::gradient(G& g) const {
  g.give(1, G::run(avg_pool{*this}, g.dy()));
}

/// The sizes of one pooling call, shared by every backend's kernels: input dims
/// (batch, in_h, in_w, channels), output dims, the window, strides and the padding
/// before the first row and column. Window (oy, ox) covers input rows
/// [oy * stride_h - pad_top, + window_h) and columns likewise, cut to the image.
struct pool_geometry {
  std::int64_t batch = 0, in_h = 0, in_w = 0, channels = 0, out_h = 0, out_w = 0;
  std::int64_t window_h = 1, window_w = 1, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;

  constexpr pool_geometry() = default;
  constexpr pool_geometry(const pool_window& p, const shape& x)
      : batch(x[0]), in_h(x[1]), in_w(x[2]), channels(x[3]), window_h(p.window_h), window_w(p.window_w),
        stride_h(p.stride_h), stride_w(p.stride_w) {
    const conv_dim h = conv_output_dim(in_h, window_h, stride_h, p.pad), w = conv_output_dim(in_w, window_w, stride_w, p.pad);
    out_h = h.out, out_w = w.out, pad_top = h.pad_before, pad_left = w.pad_before;
  }
  /// The first input row of output row `oy`'s windows and one past their last.
  KILN_HOST_DEVICE constexpr std::int64_t row_begin(std::int64_t oy) const {
    const std::int64_t r = oy * stride_h - pad_top;
    return r < 0 ? 0 : r;
  }
  KILN_HOST_DEVICE constexpr std::int64_t row_end(std::int64_t oy) const {
    const std::int64_t r = oy * stride_h - pad_top + window_h;
    return r > in_h ? in_h : r;
  }
  KILN_HOST_DEVICE constexpr std::int64_t column_begin(std::int64_t ox) const {
    const std::int64_t c = ox * stride_w - pad_left;
    return c < 0 ? 0 : c;
  }
  KILN_HOST_DEVICE constexpr std::int64_t column_end(std::int64_t ox) const {
    const std::int64_t c = ox * stride_w - pad_left + window_w;
    return c > in_w ? in_w : c;
  }
  /// The first and one past the last output row whose windows hold input row `iy`.
  KILN_HOST_DEVICE constexpr std::int64_t first_row_holding(std::int64_t iy) const {
    const std::int64_t from = iy + pad_top - window_h + 1;  // oy * stride_h > this - 1
    return from <= 0 ? 0 : (from + stride_h - 1) / stride_h;
  }
  KILN_HOST_DEVICE constexpr std::int64_t rows_holding_end(std::int64_t iy) const {
    const std::int64_t last = (iy + pad_top) / stride_h + 1;
    return last < out_h ? last : out_h;
  }
  KILN_HOST_DEVICE constexpr std::int64_t first_column_holding(std::int64_t ix) const {
    const std::int64_t from = ix + pad_left - window_w + 1;
    return from <= 0 ? 0 : (from + stride_w - 1) / stride_w;
  }
  KILN_HOST_DEVICE constexpr std::int64_t columns_holding_end(std::int64_t ix) const {
    const std::int64_t last = (ix + pad_left) / stride_w + 1;
    return last < out_w ? last : out_w;
  }
  /// Whether the windows tile the input: each element in exactly one window.
  constexpr bool tiles() const {
    return stride_h == window_h && stride_w == window_w && pad_top == 0 && pad_left == 0 && out_h * window_h == in_h &&
           out_w * window_w == in_w;
  }
  /// The offset of element (b, iy, ix, c) of the input.
  KILN_HOST_DEVICE constexpr std::int64_t input_offset(std::int64_t b, std::int64_t iy, std::int64_t ix, std::int64_t c) const {
    return ((b * in_h + iy) * in_w + ix) * channels + c;
  }
  /// The offset of element (b, oy, ox, c) of the output.
  KILN_HOST_DEVICE constexpr std::int64_t output_offset(std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) const {
    return ((b * out_h + oy) * out_w + ox) * channels + c;
  }

  /// The input offset of the first largest element of channel `c` of window (b, oy,
  /// ox) of `x` (in row-major order; a NaN counts as the largest, as it propagates).
  template <class T>
  KILN_HOST_DEVICE std::int64_t argmax(const T* x, std::int64_t b, std::int64_t oy, std::int64_t ox, std::int64_t c) const {
    std::int64_t best = -1;
    T top = T(0);
    for (std::int64_t iy = row_begin(oy); iy < row_end(oy); ++iy)
      for (std::int64_t ix = column_begin(ox); ix < column_end(ox); ++ix) {
        const std::int64_t at = input_offset(b, iy, ix, c);
        const T v = x[at];
        if (best < 0 || (top == top && (v > top || v != v))) best = at, top = v;
      }
    return best;
  }
  /// How many input elements window (oy, ox) covers (inside the image).
  KILN_HOST_DEVICE constexpr std::int64_t window_count(std::int64_t oy, std::int64_t ox) const {
    return (row_end(oy) - row_begin(oy)) * (column_end(ox) - column_begin(ox));
  }
};

}  // namespace kiln::ops

namespace kiln {

namespace detail {
/// The pool_window of a pooling function's arguments; sizes below 1 are the op's rule
/// errors.
template <class = void>
ops::pool_window pool_window_of(std::string_view fn, const int_list& ksize, const int_list& strides,
                                       std::string_view padding) {
  auto pair = [&](const int_list& v, const char* what) {
    if (v.size() == 1) return std::pair{v[0], v[0]};
    if (v.size() == 2) return std::pair{v[0], v[1]};
    if (v.size() == 4 && v[0] == 1 && v[3] == 1) return std::pair{v[1], v[2]};
    throw value_error(std::string(fn) + ": " + what + " must be 1, 2 or 4 ints (4 as [1, h, w, 1]), got " + v.str());
  };
  ops::pool_window p;
  std::tie(p.window_h, p.window_w) = pair(ksize, "ksize");
  std::tie(p.stride_h, p.stride_w) = pair(strides, "strides");
  if (padding != "VALID" && padding != "SAME")
    throw value_error(std::string(fn) + ": padding must be \"VALID\" or \"SAME\", got \"" + std::string(padding) + "\"");
  p.pad = parse_padding(padding);
  return p;
}
}  // namespace detail

/// The largest value of each `ksize` window of an NHWC input, moved by `strides`, with
/// "VALID" or "SAME" padding (TensorFlow's tf.nn.max_pool2d). `ksize` and `strides`
/// are one int, two (height, width) or four (TensorFlow's NHWC form). Its gradient
/// goes to the first largest element of each window, as TensorFlow's.
/// \code kiln::max_pool2d(kiln::ones({1, 4, 4, 3}), 2, 2, "VALID").shape() == kiln::shape{1, 2, 2, 3} \endcode
template <class = void>
tensor max_pool2d(const tensor& input, const int_list& ksize, const int_list& strides, std::string_view padding) {
  const ops::pool_window p = detail::pool_window_of("max_pool2d", ksize, strides, padding);
  return detail::apply(ops::max_pool{p}, input);
}

/// max_pool2d with square windows and equal strides.
template <class = void>
tensor max_pool2d(const tensor& input, std::int64_t ksize, std::int64_t stride, std::string_view padding) {
  return max_pool2d(input, int_list{ksize}, int_list{stride}, padding);
}

/// The mean of each `ksize` window of an NHWC input (tf.nn.avg_pool2d); with "SAME"
/// padding a window averages the elements inside the image only.
/// \code kiln::avg_pool2d(kiln::ones({1, 4, 4, 3}), 3, 1, "SAME").shape() == kiln::shape{1, 4, 4, 3} \endcode
template <class = void>
tensor avg_pool2d(const tensor& input, const int_list& ksize, const int_list& strides, std::string_view padding) {
  const ops::pool_window p = detail::pool_window_of("avg_pool2d", ksize, strides, padding);
  return detail::apply(ops::avg_pool{p}, input);
}

/// avg_pool2d with square windows and equal strides.
template <class = void>
tensor avg_pool2d(const tensor& input, std::int64_t ksize, std::int64_t stride, std::string_view padding) {
  return avg_pool2d(input, int_list{ksize}, int_list{stride}, padding);
}

}  // namespace kiln

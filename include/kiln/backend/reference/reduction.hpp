#pragma once
/// \file
/// Reference reduction kernel: one pass over the input in row-major order, each
/// element's output and reduced position computed from scratch. Float sums are
/// accumulated in a wider type so that the reference is the more accurate side.

#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/backend/backend.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"

namespace kiln::backend {

template <ops::reduction Op>
void compute(reference_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  using kind = ops::reduction_kind;
  const shape& s = in[0].shape;
  const auto reduced = ops::reduced_dims(op.axis, s.rank());
  const std::int64_t count = ops::reduced_count(s, op.axis), outputs = out.size();

  ops::visit_numeric(in[0].dtype, [&]<class T>() {
    constexpr bool floating = std::is_floating_point_v<T>;
    // Integers wrap in their own type, as TensorFlow's do.
    using acc_t = std::conditional_t<std::is_same_v<T, float>, double, std::conditional_t<floating, long double, T>>;
    constexpr acc_t lowest = floating ? -std::numeric_limits<acc_t>::infinity() : std::numeric_limits<acc_t>::lowest();
    constexpr acc_t highest = floating ? std::numeric_limits<acc_t>::infinity() : std::numeric_limits<acc_t>::max();
    std::vector<acc_t> acc(outputs, Op::kind == kind::min ? highest : Op::kind == kind::sum || Op::kind == kind::mean ? acc_t(0) : lowest);
    std::vector<std::int64_t> best(outputs, -1);

    const T* x = in[0].as<T>();
    for (std::int64_t i = 0, n = s.num_elements(); i < n; ++i) {
      std::int64_t rest = i, o = 0, o_scale = 1, k = 0, k_scale = 1;
      for (int d = s.rank() - 1; d >= 0; --d) {
        std::int64_t coord = rest % s[d];
        rest /= s[d];
        if (reduced[d]) {
          k += coord * k_scale;
          k_scale *= s[d];
        } else {
          o += coord * o_scale;
          o_scale *= s[d];
        }
      }
      const acc_t v = acc_t(x[i]);
      if constexpr (Op::kind == kind::sum || Op::kind == kind::mean) {
        acc[o] = math::add(acc[o], v);
      } else if constexpr (Op::kind == kind::max) {
        acc[o] = math::max(acc[o], v);
      } else if constexpr (Op::kind == kind::min) {
        acc[o] = math::min(acc[o], v);
      } else {
        bool nan_first = floating && v != v && acc[o] == acc[o];
        if (best[o] < 0 || v > acc[o] || nan_first) {
          acc[o] = v;
          best[o] = k;
        }
      }
    }

    for (std::int64_t o = 0; o < outputs; ++o) {
      if constexpr (Op::kind == kind::argmax) {
        out.as<std::int64_t>()[o] = best[o];
      } else if constexpr (Op::kind == kind::mean) {
        out.as<T>()[o] = ops::mean_of<T>(acc[o], count);
      } else {
        out.as<T>()[o] = T(acc[o]);
      }
    }
  });
}

}  // namespace kiln::backend

#pragma once
/// \file
/// Thrust reduction kernels. The input is enumerated with the kept dims first and
/// the reduced dims last, so that output `o` is the reduction of enumerated
/// elements [o * count, (o + 1) * count). Many outputs (or few elements each) make
/// one thread per output loop over its elements, which reads neighbouring memory in
/// neighbouring threads when the innermost dim is kept; few long reductions go to
/// `thrust::reduce_by_key`, which splits each over the whole device. Float sums
/// are compensated double sums, accurate whatever order the device adds in.

#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include <thrust/reduce.h>

#include "kiln/backend/backend.hpp"
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/backend/thrust/strided.hpp"
#include "kiln/ops/math.hpp"
#include "kiln/ops/reduction.hpp"

namespace kiln::backend {
namespace thrust_kernels {

/// A double sum carrying the rounding error of its additions (each found exactly by
/// Knuth's TwoSum, as in Kahan-Babuska-Neumaier summation): a sum of any length,
/// added in any order, is then about as accurate as one in twice the precision,
/// like the reference's wide sequential sum.
struct compensated_sum {
  double sum;
  double error;

  KILN_HOST_DEVICE compensated_sum operator+(const compensated_sum& o) const {
    const double s = sum + o.sum, o_part = s - sum;
    return {s, error + o.error + ((sum - (s - o_part)) + (o.sum - o_part))};
  }
  /// Once the sum is infinite or NaN the error term is meaningless (inf - inf).
  KILN_HOST_DEVICE double value() const { return sum - sum == 0 ? sum + error : sum; }
};

/// A value and the position (among the reduced elements) it came from; position -1
/// marks the empty partial result.
template <class T>
struct indexed_value {
  T value;
  std::int64_t position;
};

/// What reduction `Kind` keeps while combining elements of type `T`, and how it
/// turns that into the output element: the device-side half of a reduction op.
template <ops::reduction_kind Kind, class T>
struct reducer {
  static constexpr bool sums = Kind == ops::reduction_kind::sum || Kind == ops::reduction_kind::mean;
  using accumulator = std::conditional_t<sums && std::is_floating_point_v<T>, compensated_sum, T>;
  using partial = std::conditional_t<Kind == ops::reduction_kind::argmax, indexed_value<T>, accumulator>;
  using output = std::conditional_t<Kind == ops::reduction_kind::argmax, std::int64_t, T>;

  std::int64_t count;  // elements per output

  KILN_HOST_DEVICE partial identity() const {
    if constexpr (sums)
      return accumulator{};
    else if constexpr (Kind == ops::reduction_kind::min)
      return highest();
    else if constexpr (Kind == ops::reduction_kind::max)
      return lowest();
    else
      return {lowest(), -1};
  }
  /// Element `x` at reduced position `position` as a partial result.
  KILN_HOST_DEVICE partial lift(T x, std::int64_t position) const {
    if constexpr (Kind == ops::reduction_kind::argmax)
      return {x, position};
    else if constexpr (std::is_same_v<accumulator, compensated_sum>)
      return compensated_sum{double(x), 0};
    else
      return x;
  }
  /// Associative (and commutative), as reduce_by_key needs: argmax keeps the first
  /// NaN, else the first largest value, whatever the order of combination.
  KILN_HOST_DEVICE partial operator()(const partial& a, const partial& b) const {
    if constexpr (std::is_same_v<accumulator, compensated_sum>) {
      return a + b;
    } else if constexpr (sums) {
      return math::add(a, b);
    } else if constexpr (Kind == ops::reduction_kind::max) {
      return math::max(a, b);
    } else if constexpr (Kind == ops::reduction_kind::min) {
      return math::min(a, b);
    } else {
      if (a.position < 0) return b;
      if (b.position < 0) return a;
      const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
      if (a_nan != b_nan) return a_nan ? a : b;
      if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
      return a.position < b.position ? a : b;
    }
  }
  KILN_HOST_DEVICE output finish(const partial& p) const {
    if constexpr (Kind == ops::reduction_kind::argmax)
      return p.position;
    else if constexpr (std::is_same_v<accumulator, compensated_sum>)
      return Kind == ops::reduction_kind::mean ? ops::mean_of<T>(p.value(), count) : T(p.value());
    else if constexpr (Kind == ops::reduction_kind::mean)
      return ops::mean_of<T>(p, count);
    else
      return p;
  }

 private:
  static KILN_HOST_DEVICE T lowest() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  static KILN_HOST_DEVICE T highest() {
    if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
};

/// Enumerated element `j` (kept dims first, reduced dims last) as a partial result.
template <ops::reduction_kind Kind, class T>
struct lift_element {
  reducer<Kind, T> reduce;
  const T* x;
  strided_offsets<1> input;

  KILN_HOST_DEVICE typename reducer<Kind, T>::partial operator()(std::int64_t j) const {
    return reduce.lift(x[input(j).at[0]], j % reduce.count);
  }
};

/// Output `o`, reduced by one thread in order.
template <ops::reduction_kind Kind, class T>
struct reduce_output {
  lift_element<Kind, T> element;

  KILN_HOST_DEVICE typename reducer<Kind, T>::output operator()(std::int64_t o) const {
    const reducer<Kind, T>& reduce = element.reduce;
    typename reducer<Kind, T>::partial acc = reduce.identity();
    for (std::int64_t j = o * reduce.count, end = j + reduce.count; j < end; ++j) acc = reduce(acc, element(j));
    return reduce.finish(acc);
  }
};

/// The output a run of enumerated elements belongs to.
struct output_of_element {
  std::int64_t count;
  KILN_HOST_DEVICE std::int64_t operator()(std::int64_t j) const { return j / count; }
};

/// Turns a partial result into the output element as reduce_by_key writes it.
template <ops::reduction_kind Kind, class T>
struct finish_output {
  reducer<Kind, T> reduce;
  KILN_HOST_DEVICE typename reducer<Kind, T>::output operator()(const typename reducer<Kind, T>::partial& p) const {
    return reduce.finish(p);
  }
};

/// Below this many outputs, each reducing more elements than there are outputs,
/// one thread per output would leave most of a GPU idle.
inline constexpr std::int64_t outputs_to_fill_device = std::int64_t(1) << 16;

template <ops::reduction_kind Kind, class T>
void run_reduction(const reduction_axes& axes, const buffer_view& in, const buffer_view& out) {
  const shape& s = in.shape;
  const auto reduced = ops::reduced_dims(axes, s.rank());
  const auto strides = row_major_strides(s);
  shape enumerated;
  std::array<std::array<std::int64_t, max_rank>, 1> enumerated_strides{};
  for (bool reduced_pass : {false, true}) {
    for (int d = 0; d < s.rank(); ++d) {
      if (reduced[d] != reduced_pass) continue;
      enumerated_strides[0][enumerated.rank()] = strides[d];
      enumerated.push_back(s[d]);
    }
  }
  const std::int64_t count = ops::reduced_count(s, axes), outputs = out.size();
  using out_t = typename reducer<Kind, T>::output;
  const lift_element<Kind, T> element{{count}, in.as<const T>(), strided_offsets<1>::over(enumerated, enumerated_strides)};
  if (count == 0 || outputs >= count || outputs >= outputs_to_fill_device) {
    fill_elements<out_t>(out, reduce_output<Kind, T>{element});
  } else {
    ::thrust::counting_iterator<std::int64_t> first(0);
    ::thrust::reduce_by_key(::thrust::device, ::thrust::make_transform_iterator(first, output_of_element{count}),
                            ::thrust::make_transform_iterator(first + outputs * count, output_of_element{count}),
                            ::thrust::make_transform_iterator(first, element), ::thrust::make_discard_iterator(),
                            ::thrust::make_transform_output_iterator(out.as<out_t>(), finish_output<Kind, T>{element.reduce}),
                            ::thrust::equal_to<std::int64_t>(), element.reduce);
  }
}

}  // namespace thrust_kernels

template <ops::reduction Op>
void compute(thrust_backend, const Op& op, std::span<const buffer_view> in, const buffer_view& out) {
  ops::visit_numeric(in[0].dtype, [&]<class T>() { thrust_kernels::run_reduction<Op::kind, T>(op.axis, in[0], out); });
}

}  // namespace kiln::backend

#pragma once
/// \file
/// Keras' weight initializers (`tf.keras.initializers`), as callables
/// `(shape, dtype) -> tensor`: the variance-scaling family (glorot, he, lecun) with
/// Keras' fans and scales, random normal and uniform with Keras' defaults, zeros,
/// ones and constants. A seeded initializer gives the same values at every call, as
/// Keras 2.12's do; an unseeded one new values (reproducible under
/// random::set_seed). Values are always drawn at once, also while a function is traced,
/// so a layer built in a trace starts from concrete weights.

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "kiln/ops/factories.hpp"
#include "kiln/trace/random.hpp"

namespace kiln {

/// An initializer: the initial value of a variable of a shape and dtype.
using initializer = std::function<tensor(const shape&, dtype)>;

namespace initializers {

/// The seed of an initializer: the same values at every call with one, new ones without.
struct seed_options {
  std::optional<std::uint64_t> seed = std::nullopt;
};
/// `random_normal`'s and `truncated_normal`'s options, Keras' defaults.
struct normal_options {
  double mean = 0.0;
  double stddev = 0.05;
  std::optional<std::uint64_t> seed = std::nullopt;
};
/// `random_uniform`'s options, Keras' defaults.
struct uniform_options {
  double minval = -0.05;
  double maxval = 0.05;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// Keras' fans of a weight shape: (fan_in, fan_out). A kernel (in, out) has fans in
/// and out; a convolution's (..., in, out) multiplies both by its window's size; a
/// vector has its length for both, a scalar 1.
KILN_LIBRARY_INLINE std::pair<double, double> fans(const shape& s);

namespace detail {
/// The Philox key of one call: the seed, or a fresh one (kiln::random's rules).
KILN_LIBRARY_INLINE std::uint64_t key_of(const std::optional<std::uint64_t>& seed);
/// The fan `variance_scaling` divides by.
enum class fan_mode { in, average };

/// The draws of the random initializers (`initializer_draws`, the one specialization):
/// a template on nothing, compiled only where a program initializes weights.
template <class Unused>
struct basic_initializer_draws {
  /// A draw of `spec` keyed by `seed`, done now, tracing or not.
  static tensor draw_now(kiln::detail::uniform_spec spec, const std::optional<std::uint64_t>& seed);
  /// Keras' `VarianceScaling`: scale / n with n the fan of `mode`, drawn from a
  /// truncated normal (its standard deviation corrected for the truncation) or a
  /// uniform distribution of that variance.
  static tensor variance_scaling(const shape& s, dtype t, double scale, fan_mode mode, bool normal,
                                 const std::optional<std::uint64_t>& seed);
};
using initializer_draws = basic_initializer_draws<void>;

#if KILN_DEFINE_LIBRARY
template <class Unused>
tensor basic_initializer_draws<Unused>::draw_now(kiln::detail::uniform_spec spec,
                                                 const std::optional<std::uint64_t>& seed) {
  spec.check();
  return spec.draw(key_of(seed), 0);
}

template <class Unused>
tensor basic_initializer_draws<Unused>::variance_scaling(const shape& s, dtype t, double scale, fan_mode mode,
                                                         bool normal, const std::optional<std::uint64_t>& seed) {
  const auto [fan_in, fan_out] = fans(s);
  const double n = std::max(1.0, mode == fan_mode::in ? fan_in : (fan_in + fan_out) / 2);
  if (normal) {
    // The standard deviation of a standard normal truncated to [-2, 2].
    const double stddev = std::sqrt(scale / n) / 0.87962566103423978;
    return draw_now({s, t, 0.0, stddev, kiln::detail::distribution::truncated_normal}, seed);
  }
  const double limit = std::sqrt(3.0 * scale / n);
  return draw_now({s, t, -limit, limit}, seed);
}
#endif

}  // namespace detail

/// Keras' default kernel initializer: uniform in [-l, l], l = sqrt(6 / (fan_in + fan_out)).
/// \code kiln::tensor w = kiln::initializers::glorot_uniform({.seed = 1})({3, 4}, kiln::float32); \endcode
struct glorot_uniform {
  seed_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::variance_scaling(
        s, t, 1.0, detail::fan_mode::average, false, options.seed);
  }
};
/// Truncated normal, stddev sqrt(2 / (fan_in + fan_out)).
struct glorot_normal {
  seed_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::variance_scaling(
        s, t, 1.0, detail::fan_mode::average, true, options.seed);
  }
};
/// Uniform in [-l, l], l = sqrt(6 / fan_in).
struct he_uniform {
  seed_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::variance_scaling(
        s, t, 2.0, detail::fan_mode::in, false, options.seed);
  }
};
/// Truncated normal, stddev sqrt(2 / fan_in).
struct he_normal {
  seed_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::variance_scaling(
        s, t, 2.0, detail::fan_mode::in, true, options.seed);
  }
};
/// Truncated normal, stddev sqrt(1 / fan_in).
struct lecun_normal {
  seed_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::variance_scaling(
        s, t, 1.0, detail::fan_mode::in, true, options.seed);
  }
};
/// Uniform in [-l, l], l = sqrt(3 / fan_in).
struct lecun_uniform {
  seed_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::variance_scaling(
        s, t, 1.0, detail::fan_mode::in, false, options.seed);
  }
};
/// Normal numbers, mean 0 and stddev 0.05 by default.
struct random_normal {
  normal_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::draw_now(
        {s, t, options.mean, options.stddev, kiln::detail::distribution::normal}, options.seed);
  }
};
/// Normal numbers within two standard deviations of the mean (0 and 0.05 by default).
struct truncated_normal {
  normal_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::draw_now(
        {s, t, options.mean, options.stddev, kiln::detail::distribution::truncated_normal},
                            options.seed);
  }
};
/// Uniform numbers in [minval, maxval), [-0.05, 0.05) by default.
struct random_uniform {
  uniform_options options{};
  template <class Unused = void>
  tensor operator()(const shape& s, dtype t = float32) const {
    return detail::basic_initializer_draws<Unused>::draw_now({s, t, options.minval, options.maxval}, options.seed);
  }
};
/// Zeros (Keras' default bias initializer).
struct zeros {
  template <class = void>
  tensor operator()(const shape& s, dtype t = float32) const { return kiln::zeros(s, t); }
};
/// Ones (batch normalization's gamma and moving variance).
struct ones {
  template <class = void>
  tensor operator()(const shape& s, dtype t = float32) const { return kiln::ones(s, t); }
};
/// Every element `value`.
/// \code kiln::initializers::constant{0.1}({3}, kiln::float32); \endcode
struct constant {
  double value = 0.0;
  template <class = void>
  tensor operator()(const shape& s, dtype t = float32) const { return kiln::cast(kiln::fill(s, value), t); }
};

}  // namespace initializers
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::initializers {

KILN_LIBRARY_INLINE std::pair<double, double> fans(const shape& s) {
  if (s.rank() < 1) return {1.0, 1.0};
  if (s.rank() == 1) return {double(s[0]), double(s[0])};
  double receptive = 1;
  for (int d = 0; d < s.rank() - 2; ++d) receptive *= double(s[d]);
  return {double(s[s.rank() - 2]) * receptive, double(s[s.rank() - 1]) * receptive};
}

}  // namespace kiln::initializers

namespace kiln::initializers::detail {

KILN_LIBRARY_INLINE std::uint64_t key_of(const std::optional<std::uint64_t>& seed) {
  return seed ? *seed : kiln::detail::random_state::get().key_for(std::nullopt);
}

}  // namespace kiln::initializers::detail
#endif  // KILN_DEFINE_LIBRARY

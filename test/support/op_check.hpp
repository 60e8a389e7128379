#pragma once
// Helpers shared by the op tests: deterministic inputs made without kiln's own
// kernels, element-by-element comparison, and `check_backends`, which runs one op
// on every enabled backend and compares each with the reference backend.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>

namespace kiln::testing {

/// The number in environment variable `name`, or `fallback` when it is not set.
inline std::int64_t environment_number(const char* name, std::int64_t fallback) {
  const char* text = std::getenv(name);
  return text ? std::strtoll(text, nullptr, 10) : fallback;
}

/// Which values `random_tensor` draws.
enum class value_range {
  any,       ///< floats in [-3, 3], integers in [-20, 20]
  positive,  ///< floats in [0.1, 3], integers in [1, 20]
  nonzero,   ///< as `any`, but never 0
  small_nonnegative_integer,  ///< floats and integers in {0, ..., 4}
};

/// A tensor filled from a seeded std::mt19937, independent of kiln's kernels.
inline tensor random_tensor(dtype t, const shape& s, std::uint32_t seed, value_range range = value_range::any) {
  tensor out(t, s);
  std::mt19937 gen(seed);
  std::int64_t n = s.num_elements();
  visit_dtype(t, [&]<class T>() {
    T* p = out.view().as<T>();
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = gen() & 1u;
      } else if constexpr (std::is_same_v<T, std::string>) {
        p[i] = std::string(gen() % 4, char('a' + gen() % 3));
      } else if constexpr (std::is_floating_point_v<T>) {
        double u = std::uniform_real_distribution<double>(0, 1)(gen);
        double v = range == value_range::positive                    ? 0.1 + 2.9 * u
                   : range == value_range::small_nonnegative_integer ? double(gen() % 5)
                                                                     : -3 + 6 * u;
        if (range == value_range::nonzero && v == 0) v = 1;
        p[i] = T(v);
      } else {
        std::int64_t v = range == value_range::positive                    ? 1 + std::int64_t(gen() % 20)
                         : range == value_range::small_nonnegative_integer ? std::int64_t(gen() % 5)
                                                                           : std::int64_t(gen() % 41) - 20;
        if (range == value_range::nonzero && v == 0) v = 7;
        p[i] = T(v);
      }
    }
  });
  return out;
}

/// A float32 tensor of values in [-3, 3], as `random_tensor` draws them.
inline tensor random_floats(const shape& s, std::uint32_t seed) { return random_tensor(float32, s, seed); }

/// A tensor from explicit values (test data written by hand).
template <class T>
tensor make_tensor(const std::vector<T>& values, const shape& s) {
  tensor out(dtype_of<T>, s);
  T* p = out.view().template as<T>();
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return out;
}

inline std::string describe(const tensor& t) {
  std::ostringstream os;
  os << name(t.dtype()) << " " << t.shape().str();
  return os.str();
}

/// Requires `t` to be a `T` tensor of shape `s` holding exactly `expected`.
template <class T>
void require_values(const tensor& t, const shape& s, const std::vector<T>& expected) {
  INFO("got " << describe(t));
  REQUIRE(t.dtype() == dtype_of<T>);
  REQUIRE(t.shape() == s);
  REQUIRE(t.template to_vector<T>() == expected);
}

/// Requires `actual` to equal `expected` in dtype, shape and every element;
/// floats within a relative tolerance (NaNs match NaNs, infinities match exactly).
inline void require_same(const tensor& actual, const tensor& expected, double rtol = -1) {
  INFO("actual " << describe(actual) << ", expected " << describe(expected));
  REQUIRE(actual.dtype() == expected.dtype());
  REQUIRE(actual.shape() == expected.shape());
  visit_dtype(expected.dtype(), [&]<class T>() {
    std::vector<T> a = actual.to_vector<T>(), e = expected.to_vector<T>();
    for (std::size_t i = 0; i < e.size(); ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        double tol = rtol >= 0 ? rtol : (std::is_same_v<T, float> ? 2e-5 : 1e-12);
        bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
        bool close = a[i] == e[i] || std::abs(double(a[i]) - double(e[i])) <= tol * std::max(1.0, std::abs(double(e[i])));
        if (!(both_nan || close)) FAIL("element " << i << ": " << a[i] << " != " << e[i]);
      } else {
        if (!(a[i] == e[i])) FAIL("element " << i << " differs");
      }
    }
  });
  SUCCEED();
}

/// Requires `f()` to throw an `E` whose message contains every one of `parts`.
/// \code require_throws<kiln::value_error>([&] { return a + b; }, {"add", "(2, 3)", "(4,)"}); \endcode
template <class E, class F>
void require_throws(F&& f, std::initializer_list<std::string> parts) {
  try {
    (void)f();
  } catch (const E& e) {
    for (const std::string& p : parts) CHECK_THAT(e.what(), Catch::Matchers::Contains(p));
    return;
  } catch (const std::exception& e) {
    FAIL("threw the wrong kind of error: " << e.what());
  }
  FAIL("did not throw");
}

#if KILN_HAS_THRUST
/// `inputs` copied to the GPU, or nothing when one of them is a string tensor
/// (strings never live there).
inline std::optional<std::vector<tensor>> copies_on_gpu(const std::vector<tensor>& inputs) {
  std::vector<tensor> copies;
  for (const tensor& t : inputs) {
    if (t.dtype() == string) return std::nullopt;
    copies.push_back(t.to(device::gpu));
  }
  return copies;
}
#endif

/// Runs `op` on every enabled backend and requires each result to match the
/// reference backend's. An input the reference rejects must be rejected alike.
template <class Op>
void check_backends(const Op& op, const std::vector<tensor>& inputs, double rtol = -1) {
  std::vector<const tensor*> ptrs;
  for (const tensor& t : inputs) ptrs.push_back(&t);
  INFO("op " << Op::name);
  tensor expected = detail::run_on<backend::reference_backend>(op, ptrs);
  {
    INFO("backend cpu");
    require_same(detail::run_on<backend::cpu_backend>(op, ptrs), expected, rtol);
  }
#if KILN_HAS_THRUST
  if constexpr (backend::supports<backend::thrust_backend, Op>) {
    if (const auto on_gpu = copies_on_gpu(inputs)) {
      INFO("backend thrust");
      std::vector<const tensor*> gptrs;
      for (const tensor& t : *on_gpu) gptrs.push_back(&t);
      tensor got = detail::run_on<backend::thrust_backend>(op, gptrs);
      REQUIRE(got.device() == device::gpu);
      require_same(got.to(device::cpu), expected, rtol);
    }
  }
#endif
}

/// Calls `fn` (returning a vector of tensors) as a kiln::function with `options`
/// twice (planning, then the cached plan) and eagerly, and requires the same outputs.
template <class F, class... Args>
void require_graph_matches_eager(F fn, const function_options& options, const Args&... args) {
  kiln::function f(fn, options);
  const std::vector<tensor> eager = fn(args...);
  for (int call = 0; call < 2; ++call) {
    INFO("call " << call);
    const std::vector<tensor> graph = f(args...);
    REQUIRE(graph.size() == eager.size());
    for (std::size_t i = 0; i < eager.size(); ++i) {
      INFO("output " << i);
      require_same(graph[i], eager[i]);
    }
  }
}

}  // namespace kiln::testing

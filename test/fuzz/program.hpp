#pragma once
// A random program over kiln's ops, decoded from bytes: a seed's pseudo-random bytes
// in the differential test, a fuzzer's input in a fuzzing run. The program is a C++
// callable on tensors, so the same program runs eagerly and traced into a
// kiln::function (with or without jit_compile); the differential check runs it each
// way and requires the same values, or the same kind of kiln error.
//
// Programs mix elementwise ops with broadcasting, reductions over axes, shape ops
// (transpose, reshape, concat, slice, stack), matmul, where, gather, cond, while_loop,
// division (by zero too), powers, comparisons, casts, argmax and segment sums, on
// float32, float64 or int32
// values whose shapes have ranks 0 to 3 and dims 0 to 4. Attributes are drawn without
// regard to validity, so that the errors are exercised too.

#include <kiln/kiln.hpp>

#include <algorithm>
#include <array>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

namespace kiln::fuzz {

/// Hands out the bytes of an input one at a time; past its end, zeros.
class byte_source {
 public:
  explicit byte_source(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::uint8_t next() { return at_ < bytes_.size() ? bytes_[at_++] : 0; }
  /// A number in [0, n).
  int below(int n) { return next() % n; }
  /// A number in [lo, hi].
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t at_ = 0;
};

/// The ops a step runs, by their names in kiln::ops (and two control-flow steps). The
/// order is the corpus' encoding: a new step goes before `count`.
enum class step_kind : std::uint8_t {
  negate, abs, square, tanh, sigmoid, relu, exp,      // unary
  add, subtract, multiply, maximum, minimum,          // binary, broadcasting
  reduce_sum, reduce_max, reduce_mean,                // over an axis or all
  transpose, reshape, concat, slice, matmul, where,   // structure
  gather, cond, while_loop,                           // indexing, control flow
  divide, floordiv, floormod, pow, less,              // division by zero, negative powers, bools
  cast, stack, argmax, reduce_min, unsorted_segment_sum,  // more dtypes and shapes
  count
};

/// The ops of kiln's op list (kiln/ops/op_list.hpp) that no step runs, and why.
enum class left_out {
  log, sqrt, erf, gelu, softplus, silu, elu, leaky_relu,  // floats only: as exp and tanh, through the same kernels
  logical_not, logical_and, logical_or,                   // bools, which programs make with less alone
  equal, not_equal, less_equal, greater, greater_equal,   // as less: one comparison kernel template
  relu_grad,                                              // relu's gradient, not a function
  index, shape_of, set_item, pad_rows, crop_or_pad,       // made by tracing (loops, tensor arrays), not called
  conv2d, max_pool, avg_pool, max_pool_grad, max_pool_grad_grad, avg_pool_grad,  // rank-4 NHWC only
};

// Every op of the op list is a step or left out, so that an op added to the list is
// fuzzed or said not to be: this header stops compiling until it is.
#define KILN_FUZZ_ACCOUNTED(op)                                                                \
  template <class E>                                                                           \
  inline constexpr bool names_##op = requires { E::op; };                                      \
  static_assert(names_##op<step_kind> || names_##op<left_out>,                                 \
                "kiln::ops::" #op " is in kiln/ops/op_list.hpp but neither a step of the fuzzer's " \
                "programs nor left out by them (test/fuzz/program.hpp)");
KILN_ALL_OPS(KILN_FUZZ_ACCOUNTED)
#undef KILN_FUZZ_ACCOUNTED

/// One op of a program: its kind, the values it reads (indices into the values made
/// so far) and its attributes, raw (a step may be invalid on purpose).
struct step {
  step_kind kind;
  int a = 0, b = 0;
  std::vector<std::int64_t> ints = {};  // axes, a permutation, a shape, begin and size
  bool flag = false;               // keepdims
};

struct program {
  dtype type = float32;
  std::vector<shape> inputs;
  std::vector<step> steps;

  /// Decodes a program from `bytes`: always a valid program to run, though its steps
  /// may be ops that raise errors.
  static program decode(std::span<const std::uint8_t> bytes) {
    byte_source in(bytes);
    program p;
    p.type = std::array{float32, float64, int32}[std::size_t(in.below(3))];
    const int inputs = in.between(1, 3);
    for (int i = 0; i < inputs; ++i) {
      shape s;
      const int rank = in.between(0, 3);
      for (int d = 0; d < rank; ++d) s.push_back(in.below(8) == 0 ? 0 : in.between(1, 4));
      p.inputs.push_back(s);
    }
    const int steps = in.between(1, 8);
    for (int k = 0; k < steps; ++k) {
      step s{step_kind(in.below(int(step_kind::count)))};
      const int values = inputs + k;
      s.a = in.below(values);
      s.b = in.below(values);
      const int ints = in.between(0, 4);
      for (int i = 0; i < ints; ++i) s.ints.push_back(in.between(-4, 4));
      s.flag = in.below(2) == 1;
      p.steps.push_back(s);
    }
    return p;
  }

  /// Deterministic input values: floats in [-2, 2), integers in [-5, 5].
  std::vector<tensor> make_inputs(std::uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<tensor> out;
    for (const shape& s : inputs) {
      const std::int64_t n = s.num_elements();
      if (type == int32) {
        std::vector<std::int32_t> v(std::size_t(n), 0);
        for (auto& x : v) x = std::int32_t(rng() % 11) - 5;
        out.push_back(kiln::constant(v, s));
      } else {
        std::vector<double> v(std::size_t(n), 0.0);
        for (auto& x : v) x = double(rng() % 4096) / 1024.0 - 2.0;
        out.push_back(kiln::cast(kiln::constant(v, s), type));
      }
    }
    return out;
  }

  /// Runs the program on `args` with kiln's ops (eager or symbolic alike): every value
  /// it makes, the inputs first.
  std::vector<tensor> operator()(const std::vector<tensor>& args) const {
    std::vector<tensor> v = args;
    for (const step& s : steps) v.push_back(run(s, v[std::size_t(s.a)], v[std::size_t(s.b)]));
    return v;
  }

 private:
  static int_list list(const std::vector<std::int64_t>& ints) { return int_list(std::span<const std::int64_t>(ints)); }

  static tensor run(const step& s, const tensor& a, const tensor& b) {
    const std::int64_t first = s.ints.empty() ? 0 : s.ints[0];
    switch (s.kind) {
      case step_kind::negate: return -a;
      case step_kind::abs: return kiln::abs(a);
      case step_kind::square: return kiln::square(a);
      case step_kind::tanh: return kiln::tanh(a);
      case step_kind::sigmoid: return kiln::sigmoid(a);
      case step_kind::relu: return kiln::relu(a);
      case step_kind::exp: return kiln::exp(a);
      case step_kind::add: return a + b;
      case step_kind::subtract: return a - b;
      case step_kind::multiply: return a * b;
      case step_kind::maximum: return kiln::maximum(a, b);
      case step_kind::minimum: return kiln::minimum(a, b);
      case step_kind::reduce_sum:
        return s.ints.empty() ? kiln::reduce_sum(a) : kiln::reduce_sum(a, first, s.flag);
      case step_kind::reduce_max:
        return s.ints.empty() ? kiln::reduce_max(a) : kiln::reduce_max(a, first, s.flag);
      case step_kind::reduce_mean:
        return s.ints.empty() ? kiln::reduce_mean(a) : kiln::reduce_mean(a, first, s.flag);
      case step_kind::transpose: return s.flag ? kiln::transpose(a) : kiln::transpose(a, list(s.ints));
      case step_kind::reshape: return kiln::reshape(a, s.flag ? shape{-1} : shape(std::span<const std::int64_t>(s.ints)));
      case step_kind::concat: return kiln::concat({a, b}, first);
      case step_kind::slice: {
        const std::size_t half = s.ints.size() / 2;
        std::vector<std::int64_t> begin(s.ints.begin(), s.ints.begin() + std::ptrdiff_t(half));
        std::vector<std::int64_t> size(s.ints.begin() + std::ptrdiff_t(half), s.ints.end());
        size.resize(half);
        return kiln::slice(a, list(begin), list(size));
      }
      case step_kind::matmul: return kiln::matmul(a, b);
      case step_kind::where: return kiln::where(a > b, a, b);
      case step_kind::gather:  // indices from b's magnitudes: in range or not, as it comes
        return kiln::gather(a, kiln::cast(kiln::abs(b), int32), first);
      case step_kind::cond:
        return kiln::cond(kiln::reduce_sum(b) > 0, [&] { return a * 2; }, [&] { return a - 1; });
      case step_kind::while_loop: {
        // A loop that never runs, or runs three times. A graph traces the body of the
        // first too, where eager never calls it: its body is valid for every dtype, so
        // that both agree (a body that fails only when traced is graph semantics, not a
        // defect).
        const bool never = s.flag;
        auto [i, x] = kiln::while_loop(
            [&](const tensor& i, const tensor&) { return i < (never ? 0 : 3); },
            [&](const tensor& i, const tensor& x) { return std::tuple{i + 1, never ? x : kiln::maximum(x - 1, x * 2)}; },
            kiln::constant(std::int64_t(0)), a);
        return x;
      }
      case step_kind::divide: return a / b;
      case step_kind::floordiv: return kiln::floordiv(a, b);
      case step_kind::floormod: return kiln::floormod(a, b);
      case step_kind::pow: return kiln::pow(a, b);
      case step_kind::less: return a < b;
      case step_kind::cast: return kiln::cast(a, std::array{float32, float64, int32, bool_}[std::size_t(first & 3)]);
      case step_kind::stack: return kiln::stack({a, b}, first);
      case step_kind::argmax:
        return s.ints.empty() ? kiln::argmax(a) : kiln::argmax(a, first, s.flag);
      case step_kind::reduce_min:
        return s.ints.empty() ? kiln::reduce_min(a) : kiln::reduce_min(a, first, s.flag);
      case step_kind::unsorted_segment_sum:  // segment ids from b's magnitudes, first + 2 segments
        return kiln::unsorted_segment_sum(a, kiln::cast(kiln::abs(b), int32), first + 2);
      case step_kind::count: break;
    }
    throw internal_error("fuzz: unknown step");
  }
};

/// What running a program gave: its values, or the kind and text of the kiln error.
struct outcome {
  std::vector<tensor> values;
  std::optional<std::string> error_kind, error_text;
};

/// Runs `f(args)`, catching kiln errors (anything else propagates: a bug).
template <class F>
outcome run_catching(F&& f, const std::vector<tensor>& args) {
  try {
    return {f(args), std::nullopt, std::nullopt};
  } catch (const kiln::error& e) {
    return {{}, std::string(typeid(e).name()), e.what()};
  }
}

/// Why two results differ, or nothing when they agree: integers and booleans exactly,
/// floats within a few ulps (a fused cluster may contract a multiply and an add into
/// one FMA), NaN with NaN.
inline std::optional<std::string> value_difference(const tensor& x, const tensor& y) {
  if (x.dtype() != y.dtype() || x.shape() != y.shape())
    return "dtype or shape differs: " + std::string(name(x.dtype())) + " " + x.shape().str() + " against " +
           std::string(name(y.dtype())) + " " + y.shape().str();
  const std::vector<double> u = kiln::cast(x, float64).to_vector<double>(), w = kiln::cast(y, float64).to_vector<double>();
  const double tolerance = x.dtype() == float32 ? 1e-5 : x.dtype() == float64 ? 1e-12 : 0.0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if ((std::isnan(u[i]) && std::isnan(w[i])) || u[i] == w[i]) continue;
    if (std::abs(u[i] - w[i]) <= tolerance * std::max({1.0, std::abs(u[i]), std::abs(w[i])})) continue;
    return "element " + std::to_string(i) + ": " + std::to_string(u[i]) + " against " + std::to_string(w[i]);
  }
  return std::nullopt;
}

/// Why `got` is not what eager execution gave (`expected`), or nothing when it is.
/// Errors agree in kind, with one exception that graphs make by design, as TensorFlow's
/// do: what an op raises when it runs (invalid_argument_error: operands that do not
/// fit, an index out of range) is, while tracing, a value_error or type_error for
/// operands that do not fit, and comes after the errors later ops raise while tracing.
inline std::optional<std::string> disagreement(const outcome& expected, const outcome& got) {
  const std::string got_text = got.error_kind ? *got.error_kind + ": " + *got.error_text : "no error";
  if (expected.error_kind) {
    const bool run_time_error = *expected.error_kind == typeid(invalid_argument_error).name();
    const bool trace_time_error =
        got.error_kind == typeid(value_error).name() || got.error_kind == typeid(type_error).name();
    if (got.error_kind == expected.error_kind || (run_time_error && trace_time_error)) return std::nullopt;
    return "eager raised " + *expected.error_kind + ": " + *expected.error_text + "; got " + got_text;
  }
  if (got.error_kind) return "eager raised nothing; got " + got_text;
  if (got.values.size() != expected.values.size()) return "a different number of values";
  for (std::size_t i = 0; i < got.values.size(); ++i)
    if (auto why = value_difference(expected.values[i], got.values[i])) return "value " + std::to_string(i) + ": " + *why;
  return std::nullopt;
}

/// The program that `seed` gives: 64 pseudo-random bytes decoded.
inline program program_of(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> bytes(64);
  for (auto& b : bytes) b = std::uint8_t(rng());
  return program::decode(bytes);
}

}  // namespace kiln::fuzz

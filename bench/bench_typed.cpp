/// \file
/// The compile-time tier (kiln::function called with kiln::fixed arguments) against
/// hand-written loops, Eigen's fixed-size matrices and kiln's runtime tier, in the
/// cases its issue sets targets for: a call of `x * x + 2` on a scalar (`fixed_x2`),
/// 50 elementwise ops on 10 floats (`fixed_ops50` with ten tanh among them,
/// `fixed_arith50` arithmetic only), a dense layer
/// `tanh(x · w + b)` on 8x64 · 64x32 (`fixed_dense`), a 3-layer MLP of typed layers
/// against the same model written with raw typed ops (`fixed_mlp3`), the guides' `power(x, 100)` as
/// 100 matmuls of 10x10 int32 (`fixed_power`) and the chain
/// `tanh(x * 0.5 + 1) * x - 0.25` on 2^20 floats (`fixed_chain_1M`). Peers named
/// `kiln` are the runtime tier's kiln::function on kiln::tensor arguments.

#include "bench_support.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <xsimd/xsimd.hpp>

#if KILN_BENCH_HAS_EIGEN
#include <Eigen/Core>
#endif

namespace kiln::bench {
namespace {

void register_x2() {
  static constexpr float input = 3.f, expected = input * input + 2.f;
  const auto formula = [](const auto& x) { return x * x + 2.f; };
  register_case("fixed_x2", "kiln_fixed", 1, [formula](benchmark::State& state) {
    kiln::function f(formula);
    const kiln::fixed<float> x = input;
    const float first = f(x).item();  // traces
    if (!check_close(state, &expected, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(x));
  })->Unit(benchmark::kNanosecond);
  register_case("fixed_x2", "kiln", 1, [formula](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function f(formula);
    const kiln::tensor x = kiln::constant(input);
    const float first = f(x).item<float>();
    if (!check_close(state, &expected, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(x));
  })->Unit(benchmark::kNanosecond);
}

// ---- 50 elementwise ops on 10 floats --------------------------------------------------
// Ten rounds of five ops, in two mixes: `tanh_round`, whose time is mostly its ten
// tanh, and `arithmetic_round`, whose time is mostly what a call itself costs.

constexpr int rounds = 10;
constexpr float scale_of(int i) { return 0.9f - 0.02f * float(i); }
constexpr float shift_of(int i) { return 0.1f + 0.01f * float(i); }

/// x = maximum(tanh(x * scale + y) - shift, y)
struct tanh_round {
  template <class X, class Y>
  static auto apply(const X& x, const Y& y, int i) {
    return kiln::maximum(kiln::tanh(x * scale_of(i) + y) - shift_of(i), y);
  }
  static float hand(float x, float y, int i) { return std::max(std::tanh(x * scale_of(i) + y) - shift_of(i), y); }
  /// On one SIMD batch, with kiln's tanh and NaN-propagating maximum.
  static xsimd::batch<float> simd(const xsimd::batch<float>& x, const xsimd::batch<float>& y, int i) {
    using B = xsimd::batch<float>;
    return kiln::math::max(kiln::math::tanh(x * B(scale_of(i)) + y) - B(shift_of(i)), y);
  }
};

/// x = maximum(x * scale + y - shift, y * 0.5)
struct arithmetic_round {
  template <class X, class Y>
  static auto apply(const X& x, const Y& y, int i) {
    return kiln::maximum(x * scale_of(i) + y - shift_of(i), y * 0.5f);
  }
  static float hand(float x, float y, int i) { return std::max(x * scale_of(i) + y - shift_of(i), y * 0.5f); }
  static xsimd::batch<float> simd(const xsimd::batch<float>& x, const xsimd::batch<float>& y, int i) {
    using B = xsimd::batch<float>;
    return kiln::math::max(x * B(scale_of(i)) + y - B(shift_of(i)), y * B(0.5f));
  }
};

/// The rounds as one expression: round `I` applied to the expression of the ones
/// before, so a typed trace is one fused loop.
template <class Round, int I = 0, class X, class Y>
auto fused_rounds(const X& x, const Y& y) {
  if constexpr (I == rounds)
    return x;
  else
    return fused_rounds<Round, I + 1>(Round::apply(x, y, I), y);
}

/// The rounds as a C++ loop that rebinds `x`, as the runtime tier's benchmark writes
/// them: a typed trace evaluates at each assignment.
template <class Round, class X, class Y>
X looped_rounds(X x, const Y& y) {
  for (int i = 0; i < rounds; ++i) x = Round::apply(x, y, i);
  return x;
}

using ten = kiln::fixed<float, 10>;

template <class Round>
struct rounds_inputs {
  ten x, y;
  std::vector<float> expected;
  rounds_inputs() {
    fill_pattern(x.data(), 10, 3);
    fill_pattern(y.data(), 10, 4);
    expected = looped_rounds<Round>(kiln::tensor(x), kiln::tensor(y)).template to_vector<float>();
  }
  static const rounds_inputs& get() {
    static const rounds_inputs inputs;
    return inputs;
  }
};

template <class Round>
void hand_rounds(const float* x, const float* y, float* out) {
  for (int e = 0; e < 10; ++e) {
    float v = x[e];
    for (int i = 0; i < rounds; ++i) v = Round::hand(v, y[e], i);
    out[e] = v;
  }
}

/// The rounds written by hand on SIMD batches (one with AVX-512: the ten elements and
/// padding): the time of the chain of dependent instructions itself.
template <class Round>
void simd_rounds(const float* x, const float* y, float* out) {
  using B = xsimd::batch<float>;
  constexpr std::size_t batches = (10 + B::size - 1) / B::size;
  alignas(64) std::array<float, batches * B::size> a{}, b{};
  std::copy_n(x, 10, a.begin());
  std::copy_n(y, 10, b.begin());
  for (std::size_t k = 0; k < batches; ++k) {
    B v = B::load_aligned(a.data() + k * B::size);
    const B w = B::load_aligned(b.data() + k * B::size);
    for (int i = 0; i < rounds; ++i) v = Round::simd(v, w, i);
    v.store_aligned(a.data() + k * B::size);
  }
  std::copy_n(a.begin(), 10, out);
}

/// The rounds written by hand (`Hand`: plain loops, or SIMD batches) as peer `peer`;
/// a template on the function, so that its call is direct, as the peers' are.
template <class Round, void (*Hand)(const float*, const float*, float*)>
void register_hand(const char* name, const char* peer) {
  using inputs = rounds_inputs<Round>;
  register_case(name, peer, 1, [](benchmark::State& state) {
    ten x = inputs::get().x, y = inputs::get().y;
    std::array<float, 10> out{};
    Hand(x.data(), y.data(), out.data());
    if (!check_close(state, inputs::get().expected.data(), out.data(), 10)) return;
    for (auto _ : state) {
      benchmark::DoNotOptimize(x);
      benchmark::DoNotOptimize(y);
      Hand(x.data(), y.data(), out.data());
      benchmark::DoNotOptimize(out);
    }
  })->Unit(benchmark::kNanosecond);
}

template <class Round>
void register_rounds(const char* name) {
  using inputs = rounds_inputs<Round>;
  // Every peer's inputs are opaque to the compiler at each iteration, so that no
  // peer's work can be hoisted out of the timed loop.
  register_case(name, "kiln_fixed", 1, [](benchmark::State& state) {
    ten x = inputs::get().x, y = inputs::get().y;
    kiln::function f([](const auto& a, const auto& b) { return fused_rounds<Round>(a, b); });
    if (!check_close(state, inputs::get().expected.data(), f(x, y).data(), 10)) return;
    for (auto _ : state) {
      benchmark::DoNotOptimize(x);
      benchmark::DoNotOptimize(y);
      benchmark::DoNotOptimize(f(x, y));
    }
  })->Unit(benchmark::kNanosecond);
  register_case(name, "kiln_fixed_rebound", 1, [](benchmark::State& state) {
    ten x = inputs::get().x, y = inputs::get().y;
    kiln::function f([](auto a, const auto& b) { return looped_rounds<Round>(a, b); });
    if (!check_close(state, inputs::get().expected.data(), f(x, y).data(), 10)) return;
    for (auto _ : state) {
      benchmark::DoNotOptimize(x);
      benchmark::DoNotOptimize(y);
      benchmark::DoNotOptimize(f(x, y));
    }
  })->Unit(benchmark::kNanosecond);
  register_case(name, "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = inputs::get();
    kiln::function f([](const kiln::tensor& x, const kiln::tensor& y) { return looped_rounds<Round>(x, y); });
    const kiln::tensor x(in.x), y(in.y);
    if (!check_close(state, in.expected.data(), f(x, y).template to_vector<float>().data(), 10)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(x, y));
  })->Unit(benchmark::kNanosecond);
  register_hand<Round, &hand_rounds<Round>>(name, "hand_plain");
  register_hand<Round, &simd_rounds<Round>>(name, "hand_xsimd");
}

// ---- a dense layer: tanh(x · w + b) on 8x64 · 64x32 -----------------------------------

constexpr int dense_m = 8, dense_k = 64, dense_n = 32;

struct dense_inputs {
  kiln::fixed<float, dense_m, dense_k> x;
  kiln::fixed<float, dense_k, dense_n> w;
  kiln::fixed<float, dense_n> b;
  std::vector<float> expected;
  dense_inputs() {
    fill_pattern(x.data(), x.size, 5);
    fill_pattern(w.data(), w.size, 6);
    fill_pattern(b.data(), b.size, 7);
    expected = kiln::tanh(kiln::matmul(kiln::tensor(x), kiln::tensor(w)) + kiln::tensor(b)).to_vector<float>();
  }
  static const dense_inputs& get() {
    static const dense_inputs inputs;
    return inputs;
  }
};

void hand_dense(const float* x, const float* w, const float* b, float* out) {
  for (int i = 0; i < dense_m; ++i) {
    float row[dense_n];
    for (int j = 0; j < dense_n; ++j) row[j] = b[j];
    for (int k = 0; k < dense_k; ++k)
      for (int j = 0; j < dense_n; ++j) row[j] += x[i * dense_k + k] * w[k * dense_n + j];
    for (int j = 0; j < dense_n; ++j) out[i * dense_n + j] = std::tanh(row[j]);
  }
}

void register_dense() {
  const auto layer = [](const auto& x, const auto& w, const auto& b) { return kiln::tanh(kiln::matmul(x, w) + b); };
  register_case("fixed_dense", "kiln_fixed", 1, [layer](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = dense_inputs::get();
    kiln::function f(layer);
    if (!check_close(state, in.expected.data(), f(in.x, in.w, in.b).data(), dense_m * dense_n)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(in.x, in.w, in.b));
  })->Unit(benchmark::kNanosecond);
  register_case("fixed_dense", "kiln", 1, [layer](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = dense_inputs::get();
    kiln::function f(layer);
    const kiln::tensor x(in.x), w(in.w), b(in.b);
    if (!check_close(state, in.expected.data(), f(x, w, b).to_vector<float>().data(), dense_m * dense_n)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(x, w, b));
  })->Unit(benchmark::kNanosecond);
  register_case("fixed_dense", "hand_plain", 1, [](benchmark::State& state) {
    const auto& in = dense_inputs::get();
    std::array<float, dense_m * dense_n> out{};
    hand_dense(in.x.data(), in.w.data(), in.b.data(), out.data());
    if (!check_close(state, in.expected.data(), out.data(), dense_m * dense_n)) return;
    for (auto _ : state) {
      hand_dense(in.x.data(), in.w.data(), in.b.data(), out.data());
      benchmark::DoNotOptimize(out);
    }
  })->Unit(benchmark::kNanosecond);
#if KILN_BENCH_HAS_EIGEN
  register_case("fixed_dense", "eigen", 1, [](benchmark::State& state) {
    const auto& in = dense_inputs::get();
    using x_t = Eigen::Matrix<float, dense_m, dense_k, Eigen::RowMajor>;
    using w_t = Eigen::Matrix<float, dense_k, dense_n, Eigen::RowMajor>;
    using out_t = Eigen::Matrix<float, dense_m, dense_n, Eigen::RowMajor>;
    const x_t x = Eigen::Map<const x_t>(in.x.data());
    const w_t w = Eigen::Map<const w_t>(in.w.data());
    const Eigen::Matrix<float, 1, dense_n> b = Eigen::Map<const Eigen::Matrix<float, 1, dense_n>>(in.b.data());
    auto layer = [&] {
      out_t out = ((x * w).rowwise() + b).array().tanh().matrix();
      return out;
    };
    const out_t first = layer();
    if (!check_close(state, in.expected.data(), first.data(), dense_m * dense_n)) return;
    for (auto _ : state) benchmark::DoNotOptimize(layer());
  })->Unit(benchmark::kNanosecond);
#endif
}

// ---- a 3-layer MLP: 64 -> 32 (ReLU) -> 32 (ReLU) -> 10 on a batch of 8 --------------

namespace layers = kiln::layers;
using mlp_input = kiln::fixed<float, 8, 64>;

/// The typed model of kiln::layers, its weights set to patterns.
auto make_typed_mlp() {
  auto mlp = layers::fixed_sequential<mlp_input>(layers::fixed_dense<32, layers::fixed_activations::relu>({.seed = 1}),
                                                 layers::fixed_dense<32, layers::fixed_activations::relu>({.seed = 2}),
                                                 layers::fixed_dense<10>({.seed = 3}));
  std::uint32_t seed = 20;
  const auto set = [&](auto& v) {
    auto value = v.value();
    fill_pattern(value.data(), value.size, seed++);
    v.set(value);
  };
  set(mlp.layer<0>().kernel()), set(mlp.layer<0>().bias()), set(mlp.layer<1>().kernel()), set(mlp.layer<1>().bias());
  set(mlp.layer<2>().kernel()), set(mlp.layer<2>().bias());
  return mlp;
}

void register_mlp() {
  static const mlp_input x = [] {
    mlp_input v;
    fill_pattern(v.data(), v.size, 19);
    return v;
  }();
  // The reference: the runtime tier's ops, eagerly, on the same weights.
  static const std::vector<float> expected = [] {
    const auto mlp = make_typed_mlp();
    const auto dense = [](const kiln::tensor& h, const auto& l) {
      return kiln::matmul(h, kiln::tensor(l.kernel().value())) + kiln::tensor(l.bias().value());
    };
    const kiln::tensor h1 = kiln::relu(dense(kiln::tensor(x), mlp.layer<0>()));
    const kiln::tensor h2 = kiln::relu(dense(h1, mlp.layer<1>()));
    return dense(h2, mlp.layer<2>()).to_vector<float>();
  }();
  register_case("fixed_mlp3", "kiln_fixed_model", 1, [](benchmark::State& state) {
    const auto mlp = make_typed_mlp();
    kiln::function f([&](const auto& v) { return mlp(v); });
    mlp_input in = x;
    if (!check_close(state, expected.data(), f(in).data(), 8 * 10)) return;
    for (auto _ : state) {
      benchmark::DoNotOptimize(in);
      benchmark::DoNotOptimize(f(in));
    }
  })->Unit(benchmark::kNanosecond);
  // The same model written with raw typed ops on fixed_variables of the same values.
  register_case("fixed_mlp3", "kiln_fixed", 1, [](benchmark::State& state) {
    const auto mlp = make_typed_mlp();
    kiln::fixed_variable<float, 64, 32> w1(mlp.layer<0>().kernel().value());
    kiln::fixed_variable<float, 32> b1(mlp.layer<0>().bias().value());
    kiln::fixed_variable<float, 32, 32> w2(mlp.layer<1>().kernel().value());
    kiln::fixed_variable<float, 32> b2(mlp.layer<1>().bias().value());
    kiln::fixed_variable<float, 32, 10> w3(mlp.layer<2>().kernel().value());
    kiln::fixed_variable<float, 10> b3(mlp.layer<2>().bias().value());
    kiln::function f([&](const auto& v) {
      const auto h1 = kiln::relu(kiln::matmul(v, w1.read_value()) + b1.read_value());
      const auto h2 = kiln::relu(kiln::matmul(h1, w2.read_value()) + b2.read_value());
      return kiln::matmul(h2, w3.read_value()) + b3.read_value();
    });
    mlp_input in = x;
    if (!check_close(state, expected.data(), f(in).data(), 8 * 10)) return;
    for (auto _ : state) {
      benchmark::DoNotOptimize(in);
      benchmark::DoNotOptimize(f(in));
    }
  })->Unit(benchmark::kNanosecond);
}

// ---- the guides' power(x, 100): 100 matmuls of 10x10 int32 ----------------------------

constexpr int power_n = 10, power_y = 100;
using power_matrix = kiln::fixed<std::int32_t, power_n, power_n>;

struct power_inputs {
  power_matrix x;
  std::vector<std::int32_t> expected;
  power_inputs() {
    for (int i = 0; i < power_n * power_n; ++i) x.data()[i] = std::int32_t((i * 7 + 3) % 3) - 1;
    kiln::tensor result = kiln::eye(power_n, power_n, kiln::int32);
    for (int i = 0; i < power_y; ++i) result = kiln::matmul(kiln::tensor(x), result);
    expected = result.to_vector<std::int32_t>();
  }
  static const power_inputs& get() {
    static const power_inputs inputs;
    return inputs;
  }
};

/// The hand-written triple loop; products wrap modulo 2^32, as kiln's do.
void hand_power(const std::int32_t* x, std::int32_t* result) {
  std::array<std::uint32_t, power_n * power_n> r{}, next{};
  for (int i = 0; i < power_n; ++i) r[std::size_t(i * power_n + i)] = 1;
  for (int step = 0; step < power_y; ++step) {
    for (int i = 0; i < power_n; ++i)
      for (int j = 0; j < power_n; ++j) {
        std::uint32_t sum = 0;
        for (int k = 0; k < power_n; ++k) sum += std::uint32_t(x[i * power_n + k]) * r[std::size_t(k * power_n + j)];
        next[std::size_t(i * power_n + j)] = sum;
      }
    r = next;
  }
  for (int i = 0; i < power_n * power_n; ++i) result[i] = std::int32_t(r[std::size_t(i)]);
}

void register_power() {
  register_case("fixed_power", "kiln_fixed", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = power_inputs::get();
    kiln::function power([](const auto& x, int y) {
      typename kiln::typed::traced_t<power_matrix> result = power_matrix::eye();
      for (int i = 0; i < y; ++i) result = kiln::matmul(x, result);
      return result;
    });
    if (!check_equal(state, in.expected, power(in.x, power_y).data())) return;
    for (auto _ : state) benchmark::DoNotOptimize(power(in.x, power_y));
  })->Unit(benchmark::kMicrosecond);
  register_case("fixed_power", "hand_plain", 1, [](benchmark::State& state) {
    const auto& in = power_inputs::get();
    power_matrix out;
    hand_power(in.x.data(), out.data());
    if (!check_equal(state, in.expected, out.data())) return;
    for (auto _ : state) {
      hand_power(in.x.data(), out.data());
      benchmark::DoNotOptimize(out);
    }
  })->Unit(benchmark::kMicrosecond);
#if KILN_BENCH_HAS_EIGEN
  register_case("fixed_power", "eigen", 1, [](benchmark::State& state) {
    const auto& in = power_inputs::get();
    using matrix = Eigen::Matrix<std::int32_t, power_n, power_n, Eigen::RowMajor>;
    const matrix x = Eigen::Map<const matrix>(in.x.data());
    auto power = [&] {
      matrix result = matrix::Identity();
      for (int i = 0; i < power_y; ++i) result = (x * result).eval();
      return result;
    };
    const matrix first = power();
    if (!check_equal(state, in.expected, first.data())) return;
    for (auto _ : state) benchmark::DoNotOptimize(power());
  })->Unit(benchmark::kMicrosecond);
#endif
}

// ---- tanh(x * 0.5 + 1) * x - 0.25 on 2^20 floats -------------------------------------

constexpr std::int64_t chain_size = std::int64_t(1) << 20;
using chain_vector = kiln::fixed<float, chain_size>;

struct chain_inputs {
  chain_vector x;
  std::vector<float> expected;
  chain_inputs() {
    fill_pattern(x.data(), chain_size, 8);
    expected = (kiln::tanh(kiln::tensor(x) * 0.5f + 1.f) * kiln::tensor(x) - 0.25f).to_vector<float>();
  }
  static const chain_inputs& get() {
    static const chain_inputs inputs;
    return inputs;
  }
};

void hand_chain_xsimd(const float* x, float* out) {
  using batch = xsimd::batch<float>;
  constexpr std::int64_t w = batch::size;
  const batch scale(0.5f), offset(1.f), shift(0.25f);
  std::int64_t i = 0;
  for (; i + w <= chain_size; i += w) {
    const batch v = batch::load_aligned(x + i);
    xsimd::fms(kiln::math::tanh(xsimd::fma(v, scale, offset)), v, shift).store_aligned(out + i);
  }
  // No tail when the size is whole batches (GCC warns of a loop it cannot bound otherwise).
  if constexpr (chain_size % w != 0)
    for (; i < chain_size; ++i) out[i] = std::tanh(x[i] * 0.5f + 1.f) * x[i] - 0.25f;
}

void register_chain_1m() {
  const auto chain = [](const auto& x) { return kiln::tanh(x * 0.5f + 1.f) * x - 0.25f; };
  register_case("fixed_chain_1M", "kiln_fixed", 1, [chain](benchmark::State& state) {
    const auto& in = chain_inputs::get();
    kiln::function f(chain);
    if (!check_close(state, in.expected.data(), f(in.x).data(), chain_size)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(in.x));
  })->Unit(benchmark::kMicrosecond);
  register_case("fixed_chain_1M", "kiln", 1, [chain](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = chain_inputs::get();
    kiln::function f(chain);
    const kiln::tensor x(in.x);
    if (!check_close(state, in.expected.data(), f(x).to_vector<float>().data(), chain_size)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(x));
  })->Unit(benchmark::kMicrosecond);
  register_case("fixed_chain_1M", "hand_xsimd", 1, [](benchmark::State& state) {
    const auto& in = chain_inputs::get();
    chain_vector out;
    hand_chain_xsimd(in.x.data(), out.data());
    if (!check_close(state, in.expected.data(), out.data(), chain_size)) return;
    for (auto _ : state) {
      hand_chain_xsimd(in.x.data(), out.data());
      benchmark::DoNotOptimize(out.data());
    }
  })->Unit(benchmark::kMicrosecond);
}

const bool registered = [] {
  register_x2();
  register_rounds<tanh_round>("fixed_ops50");
  register_rounds<arithmetic_round>("fixed_arith50");
  register_dense();
  register_mlp();
  register_power();
  register_chain_1m();
  return true;
}();

}  // namespace
}  // namespace kiln::bench

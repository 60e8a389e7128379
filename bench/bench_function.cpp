/// \file
/// kiln::function (graph mode) against the same callable run eagerly, hand-written
/// loops and libtorch: the cost of one call (`call_x2`), a long chain of ops on tiny
/// tensors where per-op overhead dominates (`ops50_10`), a fused chain over 16M floats
/// (`chain_16M`), the cost of tracing itself (`trace_20`), the guides' `power(x, 100)`
/// (100 matmuls of 10x10 int32 matrices, `power_100`), a graph loop with a scalar
/// body (`while_scalar`) and a training loop fed by a dataset (`dataset_loop`). The
/// Python peers of the same cases (TorchScript, tf.function, jax.jit) are in peers.py.

#include "bench_support.hpp"

#include <cmath>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#if KILN_BENCH_HAS_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#endif

namespace kiln::bench {
namespace {

// The functions under test are templates so that kiln (traced and eager) and libtorch
// run the very same formula: unqualified `tanh` and `maximum` find kiln's ops for
// kiln::tensor and ATen's (by argument-dependent lookup) for at::Tensor.

/// `x * x + 2`: nothing but call overhead on a scalar.
template <class T>
T x_squared_plus_2(const T& x) {
  return x * x + 2.f;
}

/// `rounds` rounds of five elementwise ops: x = maximum(tanh(x * scale + y) - shift, y).
/// Each round has its own constants, so no round repeats another (no common
/// subexpression) and none is an identity (x * 1, x + 0) that an optimizer may drop.
template <class T>
T rounds_of_five_ops(T x, const T& y, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    const float scale = 0.9f - 0.02f * static_cast<float>(i);
    const float shift = 0.1f + 0.01f * static_cast<float>(i);
    x = maximum(tanh(x * scale + y) - shift, y);
  }
  return x;
}

constexpr int ops50_rounds = 10;
constexpr int trace_20_rounds = 4;

template <class T>
T fifty_ops(const T& x, const T& y) {
  return rounds_of_five_ops(x, y, ops50_rounds);
}

template <class T>
T twenty_ops(const T& x, const T& y) {
  return rounds_of_five_ops(x, y, trace_20_rounds);
}

constexpr float chain_scale = 0.5f;
constexpr float chain_offset = 1.f;
constexpr float chain_shift = 0.25f;

/// `tanh(x * 0.5 + 1) * x - 0.25`: five ops that a fused loop computes in one pass.
template <class T>
T chain(const T& x) {
  return tanh(x * chain_scale + chain_offset) * x - chain_shift;
}

using batch = xsimd::batch<float>;
constexpr std::int64_t lanes = static_cast<std::int64_t>(batch::size);
constexpr std::int64_t array_bytes = large_size * static_cast<std::int64_t>(sizeof(float));
constexpr std::int64_t chain_bytes = 2 * array_bytes;  // one read and one write

void chain_plain(const float* x, float* out, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) out[i] = std::tanh(x[i] * chain_scale + chain_offset) * x[i] - chain_shift;
}

// `begin` is 64-byte aligned (parallel_ranges' chunks are), so are the loads and stores.
// The tanh is the batch kernel kiln's ops call, so the ratio measures the loop, not the tanh.
void chain_xsimd(const float* x, float* out, std::int64_t begin, std::int64_t end) {
  const batch scale(chain_scale), offset(chain_offset), shift(chain_shift);
  std::int64_t i = begin;
  for (; i + lanes <= end; i += lanes) {
    const batch v = batch::load_aligned(x + i);
    xsimd::fms(kiln::math::tanh(xsimd::fma(v, scale, offset)), v, shift).store_aligned(out + i);
  }
  chain_plain(x, out, i, end);
}

/// The two 10-element inputs of ops50_10 and trace_20, as raw arrays and kiln tensors.
struct tiny_operands {
  float_buffer x = make_filled(tiny_size, 0.f);
  float_buffer y = make_filled(tiny_size, 0.f);
  kiln::tensor kiln_x, kiln_y;
  tiny_operands() {
    fill_pattern(x.get(), tiny_size, 3);
    fill_pattern(y.get(), tiny_size, 4);
    kiln_x = to_kiln(x.get(), kiln::shape{tiny_size});
    kiln_y = to_kiln(y.get(), kiln::shape{tiny_size});
  }
  static const tiny_operands& get() {
    static const tiny_operands operands;
    return operands;
  }
};

/// ops50_10's result computed by eager kiln, the reference semantics that a traced
/// function and the other peers must reproduce.
const std::vector<float>& fifty_ops_reference() {
  static const std::vector<float> reference = [] {
    const auto& in = tiny_operands::get();
    return fifty_ops(in.kiln_x, in.kiln_y).to_vector<float>();
  }();
  return reference;
}

/// chain_16M's result computed by the scalar loop, made once.
const std::vector<float>& chain_reference() {
  static const std::vector<float> reference = [] {
    std::vector<float> out(static_cast<std::size_t>(large_size));
    chain_plain(large_arrays::get().a.get(), out.data(), 0, large_size);
    return out;
  }();
  return reference;
}

constexpr float x2_input = 3.f;
constexpr float x2_expected = x2_input * x2_input + 2.f;

void register_call_x2() {
  register_case("call_x2", "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function f(x_squared_plus_2<kiln::tensor>);
    const kiln::tensor x = kiln::constant(x2_input);
    const float first = f(x).item<float>();  // traces
    if (!check_close(state, &x2_expected, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(x));
  })->Unit(benchmark::kNanosecond);
  register_case("call_x2", "kiln_eager", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const kiln::tensor x = kiln::constant(x2_input);
    const float first = x_squared_plus_2(x).item<float>();
    if (!check_close(state, &x2_expected, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(x_squared_plus_2(x));
  })->Unit(benchmark::kNanosecond);
#if KILN_BENCH_HAS_TORCH
  register_case("call_x2", "libtorch", 1, [](benchmark::State& state) {
    at::set_num_threads(1);
    const at::Tensor x = at::scalar_tensor(x2_input, at::kFloat);
    const float first = x_squared_plus_2(x).item<float>();
    if (!check_close(state, &x2_expected, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(x_squared_plus_2(x));
  })->Unit(benchmark::kNanosecond);
#endif
}

void register_ops50() {
  // `kiln_jit` compiles the fused cluster to a native loop (jit_compile); the compile
  // happens in the first call, before timing.
  for (const bool jit : {false, true}) {
    register_case("ops50_10", jit ? "kiln_jit" : "kiln", 1, [jit](benchmark::State& state) {
      kiln::config::set_num_threads(1);
      const auto& in = tiny_operands::get();
      kiln::function f(fifty_ops<kiln::tensor>, {.jit_compile = jit});
      const kiln::tensor first = f(in.kiln_x, in.kiln_y);  // traces
      if (!check_close(state, fifty_ops_reference().data(), first.data<float>(), tiny_size)) return;
      for (auto _ : state) benchmark::DoNotOptimize(f(in.kiln_x, in.kiln_y));
    })->Unit(benchmark::kMicrosecond);
  }
  register_case("ops50_10", "kiln_eager", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = tiny_operands::get();
    for (auto _ : state) benchmark::DoNotOptimize(fifty_ops(in.kiln_x, in.kiln_y));
  })->Unit(benchmark::kMicrosecond);
#if KILN_BENCH_HAS_TORCH
  register_case("ops50_10", "libtorch", 1, [](benchmark::State& state) {
    at::set_num_threads(1);
    const auto& in = tiny_operands::get();
    const at::Tensor x = at::from_blob(in.x.get(), {tiny_size}, at::kFloat);
    const at::Tensor y = at::from_blob(in.y.get(), {tiny_size}, at::kFloat);
    const at::Tensor first = fifty_ops(x, y);
    if (!check_close(state, fifty_ops_reference().data(), first.data_ptr<float>(), tiny_size)) return;
    for (auto _ : state) benchmark::DoNotOptimize(fifty_ops(x, y));
  })->Unit(benchmark::kMicrosecond);
#endif
}

void register_chain(int threads) {
  for (const bool jit : {false, true}) {
    register_case("chain_16M", jit ? "kiln_jit" : "kiln", threads, [threads, jit](benchmark::State& state) {
      kiln::config::set_num_threads(threads);
      const kiln::tensor& x = kiln_operands::get().a;
      kiln::function f(chain<kiln::tensor>, {.jit_compile = jit});
      const kiln::tensor first = f(x);  // traces
      if (!check_close(state, chain_reference().data(), first.data<float>(), large_size)) return;
      for (auto _ : state) benchmark::DoNotOptimize(f(x));
      set_bytes(state, chain_bytes);
    });
  }
  register_case("chain_16M", "kiln_eager", threads, [threads](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    const kiln::tensor& x = kiln_operands::get().a;
    const kiln::tensor first = chain(x);
    if (!check_close(state, chain_reference().data(), first.data<float>(), large_size)) return;
    for (auto _ : state) benchmark::DoNotOptimize(chain(x));
    set_bytes(state, chain_bytes);
  });
  const auto register_hand = [threads](const char* peer, auto loop) {
    register_case("chain_16M", peer, threads, [threads, loop](benchmark::State& state) {
      auto& m = large_arrays::get();
      const auto run = [&] {
        parallel_ranges(threads, large_size, [&](std::int64_t b, std::int64_t e) { loop(m.a.get(), m.c.get(), b, e); });
      };
      run();
      if (!check_close(state, chain_reference().data(), m.c.get(), large_size)) return;
      for (auto _ : state) {
        run();
        benchmark::ClobberMemory();
      }
      set_bytes(state, chain_bytes);
    });
  };
  register_hand("hand_plain", chain_plain);
  register_hand("hand_xsimd", chain_xsimd);
#if KILN_BENCH_HAS_TORCH
  register_case("chain_16M", "libtorch", threads, [threads](benchmark::State& state) {
    at::set_num_threads(threads);
    const at::Tensor x = at::from_blob(large_arrays::get().a.get(), {large_size}, at::kFloat);
    const at::Tensor first = chain(x);
    if (!check_close(state, chain_reference().data(), first.data_ptr<float>(), large_size)) return;
    for (auto _ : state) benchmark::DoNotOptimize(chain(x));
    set_bytes(state, chain_bytes);
  });
#endif
}

void register_trace_20() {
  register_case("trace_20", "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto& in = tiny_operands::get();
    const kiln::tensor_spec spec(kiln::shape{tiny_size}, kiln::float32);
    {
      // What the timed traces build is checked once: run, it agrees with eager kiln.
      kiln::function f(twenty_ops<kiln::tensor>);
      const kiln::tensor traced = f.get_concrete_function(spec, spec)(in.kiln_x, in.kiln_y);
      const kiln::tensor eager = twenty_ops(in.kiln_x, in.kiln_y);
      if (!check_close(state, eager.data<float>(), traced.data<float>(), tiny_size)) return;
    }
    for (auto _ : state) {
      kiln::function f(twenty_ops<kiln::tensor>);
      benchmark::DoNotOptimize(f.get_concrete_function(spec, spec));
    }
  })->Unit(benchmark::kMicrosecond);
}

// The guides' power(x, y): `result = x^y` by y matmuls of a 10x10 int32 matrix with
// entries in {-1, 0, 1}. y is a C++ int, so a trace unrolls the loop into y matmul nodes.
constexpr int power_size = 10, power_exponent = 100;

/// The 10x10 input of power_100: a fixed pattern of -1, 0 and 1.
std::vector<std::int32_t> power_input() {
  std::vector<std::int32_t> x(power_size * power_size);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::int32_t((i * 7 + 3) % 3) - 1;
  return x;
}

/// power_100's result by plain loops; products wrap modulo 2^32 as kiln's and
/// libtorch's integer matmuls do.
const std::vector<std::int32_t>& power_reference() {
  static const std::vector<std::int32_t> reference = [] {
    const std::vector<std::int32_t> x = power_input();
    std::vector<std::uint32_t> result(x.size(), 0), next(x.size());
    for (int i = 0; i < power_size; ++i) result[std::size_t(i * power_size + i)] = 1;
    for (int step = 0; step < power_exponent; ++step) {
      for (int i = 0; i < power_size; ++i)
        for (int j = 0; j < power_size; ++j) {
          std::uint32_t sum = 0;
          for (int k = 0; k < power_size; ++k)
            sum += std::uint32_t(x[std::size_t(i * power_size + k)]) * result[std::size_t(k * power_size + j)];
          next[std::size_t(i * power_size + j)] = sum;
        }
      result.swap(next);
    }
    return std::vector<std::int32_t>(result.begin(), result.end());
  }();
  return reference;
}

kiln::tensor kiln_power(const kiln::tensor& x, int y) {
  kiln::tensor result = kiln::eye(power_size, power_size, kiln::int32);
  for (int i = 0; i < y; ++i) result = kiln::matmul(x, result);
  return result;
}

void register_power() {
  const kiln::tensor x = kiln::constant(power_input(), kiln::shape{power_size, power_size});
  register_case("power_100", "kiln", 1, [x](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function power(kiln_power);
    if (!check_equal(state, power_reference(), power(x, power_exponent).data<std::int32_t>())) return;  // traces
    for (auto _ : state) benchmark::DoNotOptimize(power(x, power_exponent));
  })->Unit(benchmark::kMicrosecond);
  register_case("power_100", "kiln_eager", 1, [x](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    if (!check_equal(state, power_reference(), kiln_power(x, power_exponent).data<std::int32_t>())) return;
    for (auto _ : state) benchmark::DoNotOptimize(kiln_power(x, power_exponent));
  })->Unit(benchmark::kMicrosecond);
#if KILN_BENCH_HAS_TORCH
  register_case("power_100", "libtorch", 1, [](benchmark::State& state) {
    at::set_num_threads(1);
    std::vector<std::int32_t> values = power_input();
    const at::Tensor x = at::from_blob(values.data(), {power_size, power_size}, at::kInt).clone();
    auto power = [&x] {
      at::Tensor result = at::eye(power_size, at::kInt);
      for (int i = 0; i < power_exponent; ++i) result = at::matmul(x, result);
      return result;
    };
    if (!check_equal(state, power_reference(), power().contiguous().data_ptr<std::int32_t>())) return;
    for (auto _ : state) benchmark::DoNotOptimize(power());
  })->Unit(benchmark::kMicrosecond);
#endif
}

// A graph loop whose body is a few scalar ops: `i, total = 0, 0; while i < n:
// total += i * 0.5; i += 1`, timed per call of loop_trips iterations (report.py
// divides). With n = 4096 every partial sum is a
// multiple of 0.5 below 2^23, so float32 holds each exactly and every peer must
// return the same total.
constexpr std::int32_t loop_trips = 4096;
constexpr float loop_total = 0.5f * float(loop_trips) * float(loop_trips - 1) / 2.f;

kiln::tensor scalar_loop(const kiln::tensor& n) {
  auto [i, total] = kiln::while_loop([&](const kiln::tensor& i, const kiln::tensor&) { return i < n; },
                                     [](const kiln::tensor& i, const kiln::tensor& total) {
                                       return std::tuple{i + 1, total + kiln::cast(i, kiln::float32) * 0.5f};
                                     },
                                     kiln::constant(0), kiln::constant(0.f));
  return total;
}

void register_while_scalar() {
  register_case("while_scalar", "kiln", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function f(scalar_loop);
    const kiln::tensor n = kiln::constant(loop_trips);
    const float first = f(n).item<float>();  // traces
    if (!check_close(state, &loop_total, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(f(n));
  })->Unit(benchmark::kMicrosecond);
  register_case("while_scalar", "kiln_eager", 1, [](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const kiln::tensor n = kiln::constant(loop_trips);
    const float first = scalar_loop(n).item<float>();
    if (!check_close(state, &loop_total, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(scalar_loop(n));
  })->Unit(benchmark::kMicrosecond);
#if KILN_BENCH_HAS_TORCH
  register_case("while_scalar", "libtorch", 1, [](benchmark::State& state) {
    at::set_num_threads(1);
    const at::Tensor n = at::scalar_tensor(loop_trips, at::kInt);
    auto loop = [&n] {
      at::Tensor i = at::scalar_tensor(0, at::kInt), total = at::scalar_tensor(0.f, at::kFloat);
      while ((i < n).item<bool>()) {
        total = total + i.to(at::kFloat) * 0.5f;
        i = i + 1;
      }
      return total;
    };
    const float first = loop().item<float>();
    if (!check_close(state, &loop_total, &first, 1)) return;
    for (auto _ : state) benchmark::DoNotOptimize(loop());
  })->Unit(benchmark::kMicrosecond);
#endif
}

// A training-style loop: per batch of 256 rows of 64 float32 features, a few
// elementwise ops and a mean, summed over 100 batches per call. `kiln` feeds the
// batches from a kiln::data::dataset inside one kiln::function (one ReduceDataset
// node); `kiln_per_batch` calls a kiln::function once per batch from a C++ loop;
// `kiln_for_range` indexes a stacked tensor with kiln::for_range in one function.
constexpr std::int64_t loop_batches = 100, batch_rows = 256, batch_features = 64;

template <class T>
T batch_loss(const T& x, const T& loss) {
  return loss + kiln::reduce_mean(kiln::square(kiln::tanh(x * 0.5f + 0.25f) - 0.5f));
}

void register_dataset_loop() {
  const kiln::tensor stacked = kiln::random::stateless_uniform({loop_batches, batch_rows, batch_features}, 11);
  auto reference = [stacked] {
    kiln::tensor loss = kiln::constant(0.f);
    for (std::int64_t i = 0; i < loop_batches; ++i) loss = batch_loss(stacked[i], loss);
    return loss.item<float>();
  };
  register_case("dataset_loop", "kiln", 1, [stacked, reference](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    const auto batches = kiln::data::dataset::from_tensor_slices(stacked).prefetch(1);
    kiln::function train([](const kiln::data::dataset& ds) {
      return kiln::for_each(ds, [](const kiln::tensor& x, const kiln::tensor& loss) { return batch_loss(x, loss); },
                            kiln::constant(0.f));
    });
    const float expected = reference(), first = train(batches).item<float>();  // traces
    if (!check_close(state, &expected, &first, 1, 1e-4f)) return;
    for (auto _ : state) benchmark::DoNotOptimize(train(batches));
  })->Unit(benchmark::kMicrosecond);
  register_case("dataset_loop", "kiln_per_batch", 1, [stacked, reference](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    std::vector<kiln::tensor> batches;
    for (std::int64_t i = 0; i < loop_batches; ++i) batches.push_back(stacked[i]);
    kiln::function step(batch_loss<kiln::tensor>);
    auto run = [&] {
      kiln::tensor loss = kiln::constant(0.f);
      for (const kiln::tensor& x : batches) loss = step(x, loss);
      return loss;
    };
    const float expected = reference(), first = run().item<float>();  // traces
    if (!check_close(state, &expected, &first, 1, 1e-4f)) return;
    for (auto _ : state) benchmark::DoNotOptimize(run());
  })->Unit(benchmark::kMicrosecond);
  register_case("dataset_loop", "kiln_for_range", 1, [stacked, reference](benchmark::State& state) {
    kiln::config::set_num_threads(1);
    kiln::function train([](const kiln::tensor& all) {
      return kiln::for_range(
          loop_batches, [&all](const kiln::tensor& i, const kiln::tensor& loss) { return batch_loss(kiln::gather(all, i), loss); },
          kiln::constant(0.f));
    });
    const float expected = reference(), first = train(stacked).item<float>();  // traces
    if (!check_close(state, &expected, &first, 1, 1e-4f)) return;
    for (auto _ : state) benchmark::DoNotOptimize(train(stacked));
  })->Unit(benchmark::kMicrosecond);
}

const bool registered = [] {
  register_call_x2();
  register_ops50();
  for (int threads : {1, 2}) register_chain(threads);
  register_trace_20();
  register_power();
  register_while_scalar();
  register_dataset_loop();
  return true;
}();

}  // namespace
}  // namespace kiln::bench

/// \file
/// The guides' convolution: input 1x200x200x100 (NHWC), filters 3x3x100x100 (HWIO),
/// stride 1, VALID padding, on 2 threads. libtorch runs it channels-last (oneDNN),
/// which reads the very same NHWC buffer kiln does.

#include "bench_support.hpp"

#if KILN_BENCH_HAS_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#endif

namespace kiln::bench {
namespace {

constexpr std::int64_t height = 200, width = 200, in_channels = 100, out_channels = 100, kernel = 3;
constexpr std::int64_t out_height = height - kernel + 1, out_width = width - kernel + 1;
constexpr double flops = 2.0 * out_height * out_width * out_channels * kernel * kernel * in_channels;
constexpr int threads = 2;

/// NHWC input and HWIO filters shared by every peer.
struct conv_operands {
  float_buffer input = make_filled(height * width * in_channels, 0.f);
  float_buffer filters = make_filled(kernel * kernel * in_channels * out_channels, 0.f);
  conv_operands() {
    fill_pattern(input.get(), height * width * in_channels, 5);
    fill_pattern(filters.get(), kernel * kernel * in_channels * out_channels, 6);
  }
  static conv_operands& get() {
    static conv_operands operands;
    return operands;
  }
};

const bool registered = [] {
  register_case("conv2d_seed", "kiln", threads, [](benchmark::State& state) {
    kiln::config::set_num_threads(threads);
    auto& m = conv_operands::get();
    const kiln::tensor input = to_kiln(m.input.get(), kiln::shape{1, height, width, in_channels});
    const kiln::tensor filters = to_kiln(m.filters.get(), kiln::shape{kernel, kernel, in_channels, out_channels});
    for (auto _ : state) benchmark::DoNotOptimize(kiln::conv2d(input, filters, {1, 1}, "VALID"));
    set_flops(state, flops);
  });
#if KILN_BENCH_HAS_TORCH
  register_case("conv2d_seed", "libtorch", threads, [](benchmark::State& state) {
    at::set_num_threads(threads);
    auto& m = conv_operands::get();
    // NHWC viewed as NCHW is exactly torch's channels-last layout; the filters are
    // rearranged once, outside the timed loop, into the OHWI order oneDNN wants.
    const at::Tensor input =
        at::from_blob(m.input.get(), {1, height, width, in_channels}, at::kFloat).permute({0, 3, 1, 2});
    const at::Tensor weight = at::from_blob(m.filters.get(), {kernel, kernel, in_channels, out_channels}, at::kFloat)
                                  .permute({3, 2, 0, 1})
                                  .contiguous(at::MemoryFormat::ChannelsLast);
    for (auto _ : state) benchmark::DoNotOptimize(at::conv2d(input, weight));
    set_flops(state, flops);
  });
#endif
  return true;
}();

}  // namespace
}  // namespace kiln::bench

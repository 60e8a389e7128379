/// \file
/// What a TensorBoard summary costs inside a kiln::function (kiln/summary.hpp): the
/// call of `x * x + 2` on a scalar (section 7's function) without a summary (`kiln`),
/// with `kiln::summary::scalar` of its result and no default writer
/// (`kiln_summary_no_writer`: the node runs and finds none), and with a default writer
/// (`kiln_summary_writer`: the event is encoded, framed and queued at every call, and
/// the queue goes to the file every 11 events, as TensorFlow's writer flushes).

#include "bench_support.hpp"

#include <filesystem>
#include <string>
#include <unistd.h>

#include <kiln/summary.hpp>

namespace kiln::bench {
namespace {

constexpr float summary_input = 3.f;
constexpr float summary_expected = summary_input * summary_input + 2.f;

kiln::tensor logged_x2(const kiln::tensor& x) {
  kiln::tensor y = x * x + 2.f;
  kiln::summary::scalar("y", y, 1);
  return y;
}

kiln::tensor plain_x2(const kiln::tensor& x) { return x * x + 2.f; }

void run(benchmark::State& state, kiln::tensor (*fn)(const kiln::tensor&)) {
  kiln::config::set_num_threads(1);
  kiln::function f(fn);
  const kiln::tensor x = kiln::constant(summary_input);
  const float first = f(x).item<float>();  // traces
  if (!check_close(state, &summary_expected, &first, 1)) return;
  for (auto _ : state) benchmark::DoNotOptimize(f(x));
}

const bool registered = [] {
  register_case("summary_scalar", "kiln", 1, [](benchmark::State& state) { run(state, plain_x2); })
      ->Unit(benchmark::kNanosecond);
  register_case("summary_scalar", "kiln_summary_no_writer", 1, [](benchmark::State& state) { run(state, logged_x2); })
      ->Unit(benchmark::kNanosecond);
  register_case("summary_scalar", "kiln_summary_writer", 1, [](benchmark::State& state) {
    const std::filesystem::path logdir =
        std::filesystem::temp_directory_path() / ("kiln_bench_summary_" + std::to_string(::getpid()));
    {
      auto writer = kiln::summary::create_file_writer(logdir);
      auto scope = writer.as_default();
      run(state, logged_x2);
    }
    std::filesystem::remove_all(logdir);
  })->Unit(benchmark::kNanosecond);
  return true;
}();

}  // namespace
}  // namespace kiln::bench

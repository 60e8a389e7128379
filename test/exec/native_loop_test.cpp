// Native loops (function_options::jit_compile): which clusters get one, the source
// they compile from, results against eager execution on every path a cluster can take
// (one tile, many tiles and a padded remainder, threads, gathered and broadcast
// operands, results that are also read, streaming stores, float64 and int32), the
// cache on disk, and the fall back to tiles when the compiler cannot be run.

#include "../support/op_check.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using kiln::tensor;
using kiln::testing::random_tensor;
using tensors = std::vector<tensor>;
namespace exec = kiln::detail::exec;

/// A cache directory of this test process, removed at the end of the test case.
class scratch_cache {
 public:
  scratch_cache() : dir_(std::filesystem::temp_directory_path() / ("kiln-native-test-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    ::setenv("KILN_JIT_CACHE", dir_.c_str(), 1);
  }
  ~scratch_cache() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

/// The optimized graph of `fn` for `args`.
template <class F, class... Args>
kiln::graph optimized_graph(F fn, const Args&... args) {
  kiln::function f(fn);
  return kiln::detail::optimize(f.get_concrete_function(args...).graph());
}

/// The native source of the first cluster of `fn`'s plan for `args`.
template <class F, class... Args>
std::string first_cluster_source(F fn, const Args&... args) {
  const kiln::graph g = optimized_graph(fn, args...);
  const exec::graph_outline outline(g);
  const tensors in{args...};
  const auto plan = exec::planner::build_plan(g, outline, in);
  REQUIRE(!plan->clusters.empty());
  return exec::native_source(plan->clusters[0]);
}

/// Runs `fn` with jit_compile and eagerly, and requires the same outputs.
template <class F, class... Args>
void require_native_matches_eager(F fn, const Args&... args) {
  kiln::testing::require_graph_matches_eager(fn, {.jit_compile = true}, args...);
}

tensors chain(const tensor& x) { return {kiln::tanh(x * 0.5f + 1) * x - 0.25f}; }

}  // namespace

TEST_CASE("a native loop keeps intermediates in registers and calls the ops' functors", "[exec][native]") {
  const tensor x = random_tensor(kiln::float32, {1000}, 1);
  const std::string source = first_cluster_source(chain, x);
  INFO(source);
  // The five ops in one expression: the tiled cluster folds the arithmetic into tanh's
  // pass, and the loop computes what that pass computes.
  CHECK(source.find("kiln::ops::tanh{}(kiln::detail::exec::scale_and_shift(m0, s1, s2))") != std::string::npos);
  CHECK(source.find("extern \"C\" void kiln_native_loop") != std::string::npos);
  // One store, of the result; the four intermediates never reach memory.
  std::size_t stores = 0;
  for (std::size_t at = source.find("store_batch"); at != std::string::npos; at = source.find("store_batch", at + 1)) ++stores;
  CHECK(stores == 1);
  // 4 KB of results stay in cache: no streaming stores.
  CHECK(source.find("std::true_type") == std::string::npos);
  // 16 MiB of results are streamed.
  CHECK(first_cluster_source(chain, random_tensor(kiln::float32, {1 << 22}, 2)).find("std::true_type") != std::string::npos);
}

TEST_CASE("clusters without a native loop: one op, strings, mixed dtypes", "[exec][native]") {
  const tensor x = random_tensor(kiln::float32, {100}, 3);
  CHECK(first_cluster_source([](const tensor& x) { return tensors{x * 2.f}; }, x).empty());
  CHECK(first_cluster_source([](const tensor& x) { return tensors{x * 2.f < x + 1.f}; }, x).empty());
  CHECK(first_cluster_source([](const tensor& x) { return tensors{kiln::cast(x * 2.f, kiln::int32) + 1}; }, x).empty());
}

TEST_CASE("jit_compile runs fused clusters as native loops with eager's results", "[exec][native]") {
  scratch_cache cache;
  // A scalar, a padded remainder only, tiles and a remainder, chunks on threads,
  // and results large enough for streaming stores.
  for (kiln::shape s : {kiln::shape{}, kiln::shape{10}, kiln::shape{3, 1001}, kiln::shape{700, 1000}, kiln::shape{1 << 21}}) {
    INFO("shape " << s.str());
    require_native_matches_eager(chain, random_tensor(kiln::float32, s, 4));
  }
  // Compiled in this process: the cache directory is its own.
  CHECK(exec::native_compiler<>::instance().compiled_count() > 0);

  const tensor x = random_tensor(kiln::float32, {40, 33}, 5);
  const kiln::graph g = optimized_graph(chain, x);
  CHECK(kiln::detail::graph_executor(g, true).schedule(tensors{x}) == "{mul add tanh mul sub}");
  CHECK(kiln::detail::graph_executor(g).schedule(tensors{x}) == "[mul add tanh mul sub]");

  SECTION("gathered rows, broadcast scalars, and a result that is also read") {
    const tensor row = random_tensor(kiln::float32, {33}, 6), one = random_tensor(kiln::float32, {}, 7);
    require_native_matches_eager(
        [](const tensor& x, const tensor& row, const tensor& one) {
          tensor h = kiln::maximum(x * row + one, x);
          return tensors{h, kiln::exp(h - one) / (h * h + 1.f)};
        },
        x, row, one);
  }
  SECTION("float64 and int32") {
    require_native_matches_eager([](const tensor& x) { return tensors{kiln::sqrt(x * x + 1.0) - x}; },
                                 random_tensor(kiln::float64, {5, 77}, 8));
    require_native_matches_eager([](const tensor& a, const tensor& b) { return tensors{(a + b) * a - b}; },
                                 random_tensor(kiln::int32, {1000}, 9), random_tensor(kiln::int32, {1000}, 10));
  }
}

TEST_CASE("native loops compute eager's bits: a folded product is rounded before its sum", "[exec][native]") {
  scratch_cache cache;
  const auto fn = [](const tensor& x, const tensor& y) { return tensors{kiln::tanh(x * 0.3f + 0.7f) * y - 0.1f}; };
  const tensor x = random_tensor(kiln::float32, {4096}, 12), y = random_tensor(kiln::float32, {4096}, 13);
  CHECK(first_cluster_source(fn, x, y).find("scale_and_shift(") != std::string::npos);
  kiln::function compiled(fn, {.jit_compile = true});
  const std::vector<float> native = compiled(x, y)[0].to_vector<float>();
  // The cluster ran as a native loop (braces), not as tiles.
  REQUIRE(kiln::detail::graph_executor(optimized_graph(fn, x, y), true).schedule(tensors{x, y}) == "{mul add tanh mul sub}");
  const std::vector<float> eager = fn(x, y)[0].to_vector<float>();
  const std::vector<float> t = kiln::tanh(x * 0.3f + 0.7f).to_vector<float>(), ys = y.to_vector<float>();
  REQUIRE(native.size() == eager.size());
  std::size_t differing = 0, contracted_differs = 0;
  for (std::size_t i = 0; i < eager.size(); ++i) {
    differing += std::memcmp(&native[i], &eager[i], sizeof(float)) != 0;
    volatile float product = t[i] * ys[i];  // rounded on its own
    contracted_differs += std::fma(t[i], ys[i], -0.1f) != product - 0.1f;
  }
  // These inputs tell the two apart: a loop that fused the product into its sum
  // (one rounding) would differ from eager in many elements.
  CHECK(contracted_differs > 100);
  CHECK(differing == 0);
}

TEST_CASE("native loops are found on disk by a later compiler", "[exec][native]") {
  scratch_cache cache;
  const std::string source = first_cluster_source(chain, random_tensor(kiln::float32, {64}, 11));
  exec::native_compiler<> first, later;
  const exec::native_fn compiled = first.load(source);
  REQUIRE(compiled != nullptr);
  CHECK(first.compiled_count() == 1);
  CHECK(later.load(source) != nullptr);
  CHECK(later.compiled_count() == 0);
  CHECK(std::filesystem::exists(cache.dir()));
}

TEST_CASE("without a compiler, jit_compile clusters run tiled with the same results", "[exec][native]") {
  scratch_cache cache;
  ::setenv("KILN_JIT_CXX", "/nonexistent/c++", 1);
  const tensor x = random_tensor(kiln::float32, {300}, 12);
  // A cluster of its own, so no earlier load in this process answers for it.
  const auto fn = [](const tensor& x) { return tensors{kiln::abs(x) * x - kiln::square(x)}; };
  const kiln::graph g = optimized_graph(fn, x);
  CHECK(kiln::detail::graph_executor(g, true).schedule(tensors{x}) == "[square abs mul sub]");
  require_native_matches_eager(fn, x);
  ::unsetenv("KILN_JIT_CXX");
}

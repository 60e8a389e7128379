// A function with collectives saved by kiln::save and loaded by kiln::load runs its
// collectives over the loading program's ranks (test/io checks that a program without
// the distributed component is told what it lacks).

#include <kiln/distributed.hpp>

#if __has_include(<nlohmann/json.hpp>)
#include <kiln/saved_function.hpp>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "../support/op_check.hpp"
#include "world.hpp"

TEST_CASE("a saved function's collectives run over the ranks of the program that loads it") {
  const int r = kiln::testing::world().rank(), n = kiln::testing::world().size();
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("kiln_" + std::to_string(::getpid()) + "_collectives.kiln");
  kiln::function f([](const kiln::tensor& x) {
    return std::tuple(kiln::all_reduce(x, kiln::reduce_op::mean), kiln::all_gather(x), kiln::broadcast(x, 0));
  });
  kiln::save(f, path, kiln::tensor_spec({2}, kiln::float32));
  kiln::loaded_function loaded = kiln::load(path);
  std::filesystem::remove(path);
  const std::vector<kiln::tensor> out = loaded.call_flat(kiln::fill({2}, float(r)));
  REQUIRE(out.size() == 3);
  CHECK(out[0].to_vector<float>() == std::vector<float>(2, float(n - 1) / 2.f));
  std::vector<float> all;
  for (int k = 0; k < n; ++k) all.insert(all.end(), {float(k), float(k)});
  CHECK(out[1].to_vector<float>() == all);
  CHECK(out[2].to_vector<float>() == std::vector<float>(2, 0.f));
}
#endif

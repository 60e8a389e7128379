// libFuzzer target: the fuzzer's input decoded as a random program
// (test/fuzz/program.hpp), run eagerly and as a kiln::function (and with jit_compile
// when KILN_FUZZ_JIT=1); a disagreement, an exception that is not a kiln error, a
// crash or a sanitizer report stops the run with the input saved. scripts/fuzz.sh
// builds and runs it.

#include "../test/fuzz/program.hpp"

#include <cstdio>
#include <cstdlib>

namespace {

void check(const kiln::fuzz::outcome& eager, const kiln::fuzz::outcome& got, const char* how) {
  if (auto why = kiln::fuzz::disagreement(eager, got)) {
    std::fprintf(stderr, "kiln fuzz: %s disagrees with eager execution: %s\n", how, why->c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kiln;
  const fuzz::program p = fuzz::program::decode({data, size});
  const std::vector<tensor> args = p.make_inputs(size);
  const fuzz::outcome eager = fuzz::run_catching(p, args);
  function f([&p](const std::vector<tensor>& xs) { return p(xs); }, {.name = "program"});
  check(eager, fuzz::run_catching(f, args), "kiln::function");
  check(eager, fuzz::run_catching(f, args), "kiln::function, second call");
  static const bool jit = std::getenv("KILN_FUZZ_JIT") && std::getenv("KILN_FUZZ_JIT")[0] == '1';
  if (jit && !eager.error_kind) {
    function g([&p](const std::vector<tensor>& xs) { return p(xs); }, {.name = "program", .jit_compile = true});
    check(eager, fuzz::run_catching(g, args), "kiln::function with jit_compile");
  }
  return 0;
}

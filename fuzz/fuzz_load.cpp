// libFuzzer target: the saved-function loader on hostile files (test/io/load_target.hpp
// says how an input becomes a file). Anything but a kiln::error, a crash, a sanitizer
// report or a hang stops the run with the input saved. scripts/fuzz.sh builds and runs
// it with KILN_FUZZ_TARGET=load.

#include "../test/io/load_target.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / ("kiln_fuzz_load_" + std::to_string(::getpid()));
  kiln::fuzz::load_and_call({data, size}, scratch);
  return 0;
}

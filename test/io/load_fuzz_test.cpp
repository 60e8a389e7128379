// A short, seeded pass of the loader's fuzz target (fuzz/fuzz_load.cpp): hostile and
// damaged saved files, and files with a good checksum over a damaged model, raise
// kiln errors and never crash (CI runs this under AddressSanitizer and UBSan).

#include "load_target.hpp"

#include "../support/op_check.hpp"

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::filesystem::path scratch_path() {
  return std::filesystem::temp_directory_path() / ("kiln_load_fuzz_" + std::to_string(::getpid()));
}

}  // namespace

TEST_CASE("the loader's fuzz target: its first corpus entry and seeded inputs of every kind", "[io][fuzz]") {
  const std::filesystem::path scratch = scratch_path();
  std::ostringstream printed;  // what the sample's print writes, out of the test's way
  kiln::config::set_print_stream(printed);
  // fuzz/corpus_load/nested_60000: the file of 60,000 nested arrays that overflowed
  // the stack (mode 0: the bytes are the file).
  std::vector<std::uint8_t> nested{0, 'K', 'I', 'L', 'N', 'S', 'A', 'V', 'E'};
  const std::uint64_t levels = 60000;
  for (int k = 0; k < 8; ++k) nested.push_back(std::uint8_t((levels + 1) >> (8 * k)));
  nested.insert(nested.end(), levels, 0x81);
  nested.push_back(0x00);
  CHECK_FALSE(kiln::fuzz::load_and_call(nested, scratch));

  // The good file loads and runs, by each way of making a file.
  const kiln::fuzz::saved_contents& good = kiln::fuzz::sample_contents();
  std::vector<std::uint8_t> whole_file{0};
  const std::vector<std::uint8_t> file = kiln::fuzz::file_of(good);
  whole_file.insert(whole_file.end(), file.begin(), file.end());
  CHECK(kiln::fuzz::load_and_call(whole_file, scratch));
  CHECK(kiln::fuzz::load_and_call(std::vector<std::uint8_t>{2}, scratch));

  // Seeded mutations: bytes flipped in the file, the model as given bytes, edits of the
  // model under a good checksum. Any error but a kiln::error fails the test.
  std::mt19937 draw(2026);
  int loaded = 0, refused = 0;
  for (int round = 0; round < 600; ++round) {
    std::vector<std::uint8_t> input;
    switch (round % 3) {
      case 0:
        input = whole_file;
        for (int k = 0; k < 1 + round % 7; ++k) input[1 + draw() % (input.size() - 1)] ^= std::uint8_t(1 + draw() % 255);
        break;
      case 1:
        input = {1};
        input.insert(input.end(), good.model.begin(), good.model.end());
        for (int k = 0; k < 1 + round % 5; ++k) input[1 + draw() % (input.size() - 1)] = std::uint8_t(draw());
        break;
      default:
        input = {2};
        for (int k = 0; k < 2 * (1 + round % 4); ++k) input.push_back(std::uint8_t(draw()));
    }
    INFO("round " << round);
    bool ok = false;
    CHECK_NOTHROW(ok = kiln::fuzz::load_and_call(input, scratch));
    (ok ? loaded : refused) += 1;
  }
  // Both sides are reached: some damage is refused, some edits still load.
  CHECK(loaded > 0);
  CHECK(refused > 0);
  std::filesystem::remove(scratch);
  kiln::config::set_print_stream(std::cerr);
}

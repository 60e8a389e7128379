// What the saved-function loader is fuzzed with (fuzz/fuzz_load.cpp, and a short
// seeded pass in test/io/load_fuzz_test.cpp): the input's first byte chooses how the
// rest becomes a file, so that mutations reach past the header and the checksum:
//   0: the bytes are the file;
//   1: the bytes are the model (CBOR), in a header with the right checksum;
//   2: the bytes edit a good model (each pair: a position and a new byte), and the
//      file gets the right checksum.
// A file that loads has each of its functions called with zeros of its input specs.
// Every failure must be a kiln::error; anything else (another exception, a crash, a
// sanitizer report, a hang) is a defect.

#pragma once

#include <kiln/saved_function.hpp>
#include <nlohmann/json.hpp>  // (kiln/saved_function.hpp does not include it when kiln's library compiles saved functions)

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

namespace kiln::fuzz {

/// A saved file: the magic, the header's length, the header, then the data.
inline std::vector<std::uint8_t> saved_file(const nlohmann::json& header, std::span<const std::uint8_t> data = {}) {
  const std::vector<std::uint8_t> head = nlohmann::json::to_cbor(header);
  std::vector<std::uint8_t> bytes(detail::saved_magic.begin(), detail::saved_magic.end());
  for (int k = 0; k < 8; ++k) bytes.push_back(std::uint8_t(std::uint64_t(head.size()) >> (8 * k)));
  bytes.insert(bytes.end(), head.begin(), head.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

/// A saved file's model (CBOR) and data.
struct saved_contents {
  std::vector<std::uint8_t> model, data;
};

/// The file of `contents`, with the header that makes it pass: format, version,
/// sizes and checksum.
inline std::vector<std::uint8_t> file_of(saved_contents contents) {
  const std::uint64_t checksum = detail::saved_checksum({contents.model, contents.data});
  return saved_file({{"format", detail::saved_format_name},
                     {"version", detail::saved_format_version},
                     {"data_bytes", contents.data.size()},
                     {"checksum", checksum},
                     {"model", nlohmann::json::binary(std::move(contents.model))}},
                    contents.data);
}

/// A good saved function: a variable, a conditional, a loop, a print and several ops.
inline const saved_contents& sample_contents() {
  static const saved_contents sample = [] {
    kiln::variable v(kiln::constant({1.f, 2.f, 3.f}), "v");
    kiln::function f([&](const kiln::tensor& x) {
      kiln::tensor y = kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x * v; }, [&] { return x - v; });
      y = kiln::for_range(3, [](const kiln::tensor&, const kiln::tensor& s) { return s * 0.5f + 1.f; }, y);
      kiln::print("y", y);
      return kiln::reduce_mean(kiln::tanh(y), 0) + kiln::matmul(x, kiln::transpose(x, {1, 0}))[0];
    });
    const std::filesystem::path p = std::filesystem::temp_directory_path() / ("kiln_fuzz_sample_" + std::to_string(::getpid()));
    kiln::save(f, p, kiln::tensor_spec({kiln::none, 3}, kiln::float32));
    std::ifstream is(p, std::ios::binary);
    const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>()};
    std::filesystem::remove(p);
    const std::size_t prefix = detail::saved_magic.size() + 8;
    std::uint64_t head = 0;
    for (std::size_t k = 0; k < 8; ++k) head |= std::uint64_t(bytes[detail::saved_magic.size() + k]) << (8 * k);
    const auto header_end = bytes.begin() + std::ptrdiff_t(prefix + head);
    const nlohmann::json header = nlohmann::json::from_cbor(bytes.begin() + std::ptrdiff_t(prefix), header_end);
    return saved_contents{header["model"].get_binary(), std::vector<std::uint8_t>(header_end, bytes.end())};
  }();
  return sample;
}

/// The file that `input` stands for (see the top of this file).
inline std::vector<std::uint8_t> file_from_input(std::span<const std::uint8_t> input) {
  if (input.empty()) return {};
  const std::span<const std::uint8_t> rest = input.subspan(1);
  switch (input[0] % 3) {
    case 0: return {rest.begin(), rest.end()};
    case 1: return file_of({{rest.begin(), rest.end()}, {}});
    default: {
      saved_contents edited = sample_contents();
      for (std::size_t k = 0; k + 1 < rest.size(); k += 2) edited.model[rest[k] * 131u % edited.model.size()] = rest[k + 1];
      return file_of(std::move(edited));
    }
  }
}

/// Loads the file `input` stands for and calls what loads; returns whether it loaded.
/// Throws what is not a kiln::error.
inline bool load_and_call(std::span<const std::uint8_t> input, const std::filesystem::path& scratch) {
  const std::vector<std::uint8_t> file = file_from_input(input);
  {
    std::ofstream os(scratch, std::ios::binary | std::ios::trunc);
    os.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  }
  std::optional<kiln::loaded_function> loaded;
  try {
    loaded = kiln::load(scratch);
  } catch (const kiln::error&) {
    return false;
  }
  for (const kiln::concrete_function& f : loaded->concrete_functions()) {
    std::vector<kiln::tensor> args;
    for (const kiln::tensor_spec& s : f.structured_input_signature()) {
      kiln::shape dims = s.shape.has_known_rank() ? s.shape : kiln::shape{};
      for (int d = 0; d < dims.rank(); ++d)
        if (dims[d] == kiln::none || dims[d] > 64) dims[d] = 1;
      args.push_back(kiln::zeros(dims, s.dtype));
    }
    try {
      (void)f.call_flat(args);
    } catch (const kiln::error&) {
    }
  }
  return true;
}

}  // namespace kiln::fuzz

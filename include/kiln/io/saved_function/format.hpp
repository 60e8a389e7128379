#pragma once
/// \file
/// The saved-function format's constants (docs/saved_function_format.md), the checksum
/// that tells a corrupted file from a good one, and the loader's error. Also decides
/// whether the reader and writer are compiled here or only declared (a source file
/// compiled against a kiln library that holds them).

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"

// A source file compiled against a compiled kiln whose library holds the reader and
// writer (KILN_LIBRARY_HAS_SAVED_FUNCTIONS, kiln/separate_compilation.hpp) declares them only, and
// parses neither their code nor nlohmann/json.
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_HAS_SAVED_FUNCTIONS) && !defined(KILN_LIBRARY_SOURCE)
#define KILN_DETAIL_SAVED_FUNCTION_CODE 0
#else
#define KILN_DETAIL_SAVED_FUNCTION_CODE 1
#endif

namespace kiln::detail {

/// The format this kiln writes, and the newest it reads.
inline constexpr int saved_format_version = 1;
inline constexpr std::string_view saved_format_name = "kiln.saved_function";

/// What a saved file starts with, before the length of its header.
inline constexpr std::string_view saved_magic = "KILNSAVE";

/// A 64-bit checksum of `parts`, in order: what tells a corrupted file from a good one.
/// Four lanes of 8-byte words, each step a bijection of the lane (xor, multiply by an
/// odd number, xor-shift), so that any one changed bit changes the sum, at memory speed.
inline std::uint64_t saved_checksum(std::initializer_list<std::span<const std::uint8_t>> parts) {
  std::uint64_t lanes[4] = {0x9E3779B97F4A7C15u, 0xC2B2AE3D27D4EB4Fu, 0x165667B19E3779F9u, 0x27D4EB2F165667C5u};
  const auto mix = [](std::uint64_t h, std::uint64_t w) {
    h = (h ^ w) * 0x9FB21C651E98DF25u;
    return h ^ (h >> 29);
  };
  std::uint64_t length = 0;
  for (std::span<const std::uint8_t> part : parts) {
    length += part.size();
    std::size_t i = 0;
    for (; i + 32 <= part.size(); i += 32)
      for (int k = 0; k < 4; ++k) {
        std::uint64_t word;
        std::memcpy(&word, part.data() + i + 8 * std::size_t(k), 8);
        lanes[k] = mix(lanes[k], word);
      }
    for (; i < part.size(); ++i) lanes[0] = mix(lanes[0], part[i]);
  }
  std::uint64_t h = length;
  for (std::uint64_t lane : lanes) h = mix(h, lane);
  return h;
}

/// What the loader raises: the file, then the problem.
[[noreturn]] inline void bad_saved_file(const std::string& path, const std::string& problem) {
  throw value_error("kiln::load: " + path + ": " + problem);
}

}  // namespace kiln::detail

// Readers the summary tests (test/summary, test/io) check kiln's files with, written
// from the formats' specifications and independent of kiln's writers: a protocol-buffer
// decoder, a TFRecord reader that verifies both masked CRC32Cs with a bit-by-bit CRC,
// and a PNG reader for the images kiln writes (stored deflate blocks), which checks
// every chunk's CRC-32 and the stream's Adler-32.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kiln_test {

/// CRC-32 with reflected polynomial `poly`, bit by bit (the specs' definition).
inline std::uint32_t bitwise_crc(std::string_view data, std::uint32_t poly) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ ((crc & 1) ? poly : 0);
  }
  return ~crc;
}
inline std::uint32_t reference_crc32c(std::string_view data) { return bitwise_crc(data, 0x82F63B78u); }
inline std::uint32_t reference_crc32(std::string_view data) { return bitwise_crc(data, 0xEDB88320u); }
inline std::uint32_t reference_masked_crc32c(std::string_view data) {
  const std::uint32_t c = reference_crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/// One field of a decoded message.
struct field {
  int number = 0;
  int wire = 0;             ///< 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  std::uint64_t value = 0;  ///< varint and fixed values
  std::string bytes;        ///< length-delimited contents
  double as_double() const {
    double d;
    std::memcpy(&d, &value, 8);
    return d;
  }
  std::int64_t as_int() const { return std::int64_t(value); }
};

/// A decoded message: its fields in order.
struct message {
  std::vector<field> fields;

  static message parse(std::string_view b) {
    message m;
    std::size_t i = 0;
    auto varint = [&] {
      std::uint64_t v = 0;
      for (int shift = 0;; shift += 7) {
        if (i >= b.size() || shift > 63) throw std::runtime_error("truncated varint");
        const auto c = static_cast<unsigned char>(b[i++]);
        v |= std::uint64_t(c & 0x7F) << shift;
        if (!(c & 0x80)) return v;
      }
    };
    while (i < b.size()) {
      field f;
      const std::uint64_t tag = varint();
      f.number = int(tag >> 3);
      f.wire = int(tag & 7);
      if (f.wire == 0) {
        f.value = varint();
      } else if (f.wire == 1 || f.wire == 5) {
        const std::size_t n = f.wire == 1 ? 8 : 4;
        if (i + n > b.size()) throw std::runtime_error("truncated fixed field");
        for (std::size_t k = 0; k < n; ++k) f.value |= std::uint64_t(static_cast<unsigned char>(b[i + k])) << (8 * k);
        i += n;
      } else if (f.wire == 2) {
        const std::uint64_t n = varint();
        if (n > b.size() - i) throw std::runtime_error("truncated length-delimited field");
        f.bytes = std::string(b.substr(i, n));
        i += n;
      } else {
        throw std::runtime_error("unknown wire type");
      }
      m.fields.push_back(std::move(f));
    }
    return m;
  }
  /// Every field `number`, in order (copies, which outlive a temporary message).
  std::vector<field> all(int number) const {
    std::vector<field> out;
    for (const field& f : fields)
      if (f.number == number) out.push_back(f);
    return out;
  }
  /// The one field `number` (throws when there is none or several).
  field one(int number) const {
    std::vector<field> found = all(number);
    if (found.size() != 1) throw std::runtime_error("field " + std::to_string(number) + " appears " +
                                                    std::to_string(found.size()) + " times");
    return std::move(found[0]);
  }
  bool has(int number) const { return !all(number).empty(); }
  message sub(int number) const { return parse(one(number).bytes); }
};

/// The records of a TFRecord file; throws unless every length and CRC is right.
inline std::vector<std::string> read_records(std::string_view file) {
  std::vector<std::string> out;
  std::size_t i = 0;
  auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= std::uint32_t(static_cast<unsigned char>(file[at + std::size_t(k)])) << (8 * k);
    return v;
  };
  while (i < file.size()) {
    if (file.size() - i < 12) throw std::runtime_error("truncated record header");
    std::uint64_t length = 0;
    for (int k = 0; k < 8; ++k) length |= std::uint64_t(static_cast<unsigned char>(file[i + std::size_t(k)])) << (8 * k);
    if (u32(i + 8) != reference_masked_crc32c(file.substr(i, 8))) throw std::runtime_error("bad length CRC");
    if (file.size() - i - 12 < length + 4) throw std::runtime_error("truncated record");
    const std::string_view data = file.substr(i + 12, length);
    if (u32(i + 12 + length) != reference_masked_crc32c(data)) throw std::runtime_error("bad data CRC");
    out.emplace_back(data);
    i += 12 + length + 4;
  }
  return out;
}

inline std::string file_contents(const std::filesystem::path& path) {
  std::ifstream is(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>()};
}

/// A PNG's header fields and pixels (8-bit samples, rows unfiltered or any PNG filter
/// 0, stored deflate blocks only).
struct png_image {
  std::uint32_t width = 0, height = 0;
  int color_type = -1;
  std::vector<std::uint8_t> samples;  ///< row-major, without the filter bytes
};

inline png_image read_png(std::string_view png) {
  if (png.substr(0, 8) != std::string_view("\x89PNG\r\n\x1a\n", 8)) throw std::runtime_error("not a PNG");
  auto be32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v = (v << 8) | static_cast<unsigned char>(png[at + std::size_t(k)]);
    return v;
  };
  png_image image;
  std::string zlib;
  std::size_t i = 8;
  bool ended = false;
  while (i < png.size()) {
    const std::uint32_t length = be32(i);
    const std::string_view type = png.substr(i + 4, 4);
    const std::string_view data = png.substr(i + 8, length);
    if (be32(i + 8 + length) != reference_crc32(png.substr(i + 4, 4 + length))) throw std::runtime_error("bad chunk CRC");
    if (type == "IHDR") {
      image.width = be32(i + 8);
      image.height = be32(i + 12);
      if (data[8] != 8) throw std::runtime_error("not 8-bit");
      image.color_type = data[9];
    } else if (type == "IDAT") {
      zlib += data;
    } else if (type == "IEND") {
      ended = true;
    }
    i += 12 + length;
  }
  if (!ended) throw std::runtime_error("no IEND");
  if (zlib.size() < 6 || ((static_cast<unsigned char>(zlib[0]) << 8) | static_cast<unsigned char>(zlib[1])) % 31 != 0)
    throw std::runtime_error("bad zlib header");
  std::string raw;
  std::size_t at = 2;
  for (bool final = false; !final;) {
    const auto head = static_cast<unsigned char>(zlib[at]);
    final = head & 1;
    if ((head >> 1) != 0) throw std::runtime_error("not a stored block");
    const unsigned n = static_cast<unsigned char>(zlib[at + 1]) | (static_cast<unsigned char>(zlib[at + 2]) << 8);
    const unsigned complement = static_cast<unsigned char>(zlib[at + 3]) | (static_cast<unsigned char>(zlib[at + 4]) << 8);
    if ((n ^ 0xFFFFu) != complement) throw std::runtime_error("bad stored block length");
    raw += zlib.substr(at + 5, n);
    at += 5 + n;
  }
  std::uint32_t a = 1, b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  std::uint32_t adler = 0;
  for (int k = 0; k < 4; ++k) adler = (adler << 8) | static_cast<unsigned char>(zlib[at + std::size_t(k)]);
  if (adler != ((b << 16) | a) || at + 4 != zlib.size()) throw std::runtime_error("bad Adler-32 or trailing bytes");
  const int channels = std::map<int, int>{{0, 1}, {4, 2}, {2, 3}, {6, 4}}.at(image.color_type);
  const std::size_t row = std::size_t(image.width) * std::size_t(channels);
  if (raw.size() != (row + 1) * image.height) throw std::runtime_error("wrong pixel count");
  for (std::uint32_t y = 0; y < image.height; ++y) {
    if (raw[y * (row + 1)] != 0) throw std::runtime_error("a filtered row");
    for (std::size_t x = 0; x < row; ++x) image.samples.push_back(static_cast<unsigned char>(raw[y * (row + 1) + 1 + x]));
  }
  return image;
}

}  // namespace kiln_test

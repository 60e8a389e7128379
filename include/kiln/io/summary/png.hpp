#pragma once
/// \file
/// A minimal PNG encoder for image summaries: 8-bit grayscale, grayscale with alpha,
/// RGB or RGBA, no interlacing, every row unfiltered, and the zlib stream made of
/// stored (uncompressed) deflate blocks, which every PNG decoder reads. The files are
/// about as large as the pixels; summaries' images are small, and this keeps kiln free
/// of a compression library.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <boost/crc.hpp>

namespace kiln::detail {

/// The PNG encoder of image summaries (`png_encoder`, the one specialization): a
/// template on nothing, so that a program compiles it only where it writes images.
template <class Unused>
struct basic_png_encoder {
  /// Appends `v` to `out` as 4 big-endian bytes (PNG's byte order).
  static void append_big_endian(std::string& out, std::uint32_t v);

  /// Appends a PNG chunk: length, type, data, CRC-32 of type and data.
  static void append_png_chunk(std::string& out, std::string_view type, std::string_view data);

  /// The PNG of an image of `height` rows of `width` pixels of `channels` (1: gray,
  /// 2: gray and alpha, 3: RGB, 4: RGBA) 8-bit samples, row-major, in `pixels`. PNG has
  /// no empty images: `height` and `width` are at least 1 (the caller checks).
  /// \code
  /// const std::uint8_t pixels[] = {0, 128, 255};  // one RGB pixel
  /// std::string png = kiln::detail::png_encoder::encode_png(pixels, 1, 1, 3);
  /// \endcode
  static std::string encode_png(std::span<const std::uint8_t> pixels, std::uint32_t height, std::uint32_t width,
                                int channels);
};
using png_encoder = basic_png_encoder<void>;

template <class Unused>
void basic_png_encoder<Unused>::append_big_endian(std::string& out, std::uint32_t v) {
  const char bytes[4] = {char(v >> 24), char((v >> 16) & 0xFF), char((v >> 8) & 0xFF), char(v & 0xFF)};
  out.append(bytes, 4);
}

template <class Unused>
void basic_png_encoder<Unused>::append_png_chunk(std::string& out, std::string_view type, std::string_view data) {
  append_big_endian(out, std::uint32_t(data.size()));
  boost::crc_32_type crc;
  crc.process_bytes(type.data(), type.size());
  crc.process_bytes(data.data(), data.size());
  out.append(type);
  out.append(data);
  append_big_endian(out, crc.checksum());
}

template <class Unused>
std::string basic_png_encoder<Unused>::encode_png(std::span<const std::uint8_t> pixels, std::uint32_t height,
                                                  std::uint32_t width, int channels) {
  static constexpr char color_type[] = {0, 0, 4, 2, 6};  // by channel count
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  append_big_endian(header, width);
  append_big_endian(header, height);
  header += {8, color_type[channels], 0, 0, 0};  // bit depth, color type, deflate, filters, no interlace
  append_png_chunk(png, "IHDR", header);

  // The zlib stream: its header (deflate, 32 KiB window, no dictionary, a check that
  // makes it a multiple of 31), stored blocks of at most 65535 bytes, then the
  // Adler-32 of the filtered rows (each one starts with its filter, 0: none).
  const std::size_t row = std::size_t(width) * std::size_t(channels);
  const std::size_t filtered = (row + 1) * height;
  std::string zlib("\x78\x01", 2);
  zlib.reserve(2 + filtered + 5 * (filtered / 65535 + 1) + 4);
  std::uint32_t a = 1, b = 0;
  std::size_t block_left = 0, left = filtered;
  auto put = [&](std::uint8_t byte) {
    if (block_left == 0) {  // a new stored block: final flag, LEN and its complement
      block_left = left < 65535 ? left : 65535;
      left -= block_left;
      const auto n = std::uint16_t(block_left);
      const char head[5] = {char(left == 0 ? 1 : 0), char(n & 0xFF), char(n >> 8), char(~n & 0xFF), char((~n >> 8) & 0xFF)};
      zlib.append(head, 5);
    }
    zlib.push_back(char(byte));
    --block_left;
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  };
  for (std::uint32_t y = 0; y < height; ++y) {
    put(0);
    for (std::size_t x = 0; x < row; ++x) put(pixels[y * row + x]);
  }
  append_big_endian(zlib, (b << 16) | a);
  append_png_chunk(png, "IDAT", zlib);
  append_png_chunk(png, "IEND", "");
  return png;
}

}  // namespace kiln::detail

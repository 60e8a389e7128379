#pragma once
/// \file
/// A protocol-buffer encoder, just what TensorBoard's files need: varints,
/// little-endian fixed-width numbers and length-delimited fields (bytes, strings and
/// nested messages), appended to a std::string. Which field numbers a message has is
/// the caller's business (kiln/io/summary/events.hpp, graph_def.hpp, from TensorFlow's
/// .proto files); proto3 leaves a field at its default value out, and so do the callers.
/// kiln's summaries write with this rather than with protobuf's library, so that they
/// need nothing beyond kiln's own dependencies.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln::detail::proto {

/// The wire types of a field's tag.
enum class wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

/// Appends fields to `out` (which it does not clear).
/// \code
/// std::string bytes;
/// kiln::detail::proto::writer w(bytes);
/// w.varint(2, 150);                          // 10 96 01
/// const auto at = w.begin_message(3);        // a nested message as field 3
/// w.string(1, "tag");
/// w.end_message(at);
/// \endcode
template <class = void>
class basic_writer {
 public:
  explicit basic_writer(std::string& out) : out_(out) {}

  /// An unsigned varint, 7 bits a byte, least significant first.
  void raw_varint(std::uint64_t v) {
    char bytes[10];
    int n = 0;
    while (v >= 0x80) {
      bytes[n++] = char((v & 0x7F) | 0x80);
      v >>= 7;
    }
    bytes[n++] = char(v);
    out_.append(bytes, std::size_t(n));
  }
  void tag(int field, wire type) { raw_varint((std::uint64_t(field) << 3) | std::uint64_t(type)); }

  /// An int32, int64, uint64, bool or enum field: a negative number is its 64-bit
  /// two's complement (ten bytes), as protobuf writes int32 and int64.
  void varint(int field, std::int64_t v) {
    tag(field, wire::varint);
    raw_varint(std::uint64_t(v));
  }
  void boolean(int field, bool v) { varint(field, v ? 1 : 0); }
  void fixed64(int field, std::uint64_t v) {
    tag(field, wire::fixed64);
    append_little_endian(v);
  }
  void float64(int field, double v) { fixed64(field, std::bit_cast<std::uint64_t>(v)); }
  void float32(int field, float v) {
    tag(field, wire::fixed32);
    append_little_endian(std::bit_cast<std::uint32_t>(v));
  }
  /// A bytes or string field.
  void bytes(int field, std::string_view v) {
    tag(field, wire::length_delimited);
    raw_varint(v.size());
    out_.append(v);
  }
  void string(int field, std::string_view v) { bytes(field, v); }

  /// Starts nested message `field`: what is written until end_message(the returned
  /// position) becomes its contents. (Its length is known only then: one byte is kept
  /// for it, enough below 128 bytes; a longer message's contents move up by the
  /// length's further bytes.)
  std::size_t begin_message(int field) {
    tag(field, wire::length_delimited);
    out_.push_back('\0');
    return out_.size();
  }
  void end_message(std::size_t start) {
    const std::uint64_t length = out_.size() - start;
    if (length < 0x80) {
      out_[start - 1] = char(length);
      return;
    }
    char bytes[10];
    int n = 0;
    for (std::uint64_t v = length;; v >>= 7) {
      bytes[n++] = char(v >= 0x80 ? (v & 0x7F) | 0x80 : v);
      if (v < 0x80) break;
    }
    out_.replace(start - 1, 1, bytes, std::size_t(n));
  }
  /// Writes nested message `field` with `contents(*this)`.
  template <class F>
  void message(int field, F&& contents) {
    const std::size_t start = begin_message(field);
    contents(*this);
    end_message(start);
  }

  std::string& output() { return out_; }

 private:
  template <class U>
  void append_little_endian(U v) {
    char bytes[sizeof(U)];
    for (std::size_t k = 0; k < sizeof(U); ++k) bytes[k] = char((v >> (8 * k)) & 0xFF);
    out_.append(bytes, sizeof(U));
  }

  std::string& out_;
};
/// (A template on nothing, as everything under kiln/io/summary/: compiled only where a
/// program writes summaries.)
using writer = basic_writer<>;

}  // namespace kiln::detail::proto

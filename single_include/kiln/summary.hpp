// kiln single header, generated from include/kiln/summary.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_SUMMARY_HPP
#define KILN_SINGLE_INCLUDE_KILN_SUMMARY_HPP
// ----- begin kiln/summary.hpp -----
/// \file
/// TensorBoard summaries, as tf.summary: scalars, histograms, text and images written
/// to event files that TensorBoard reads, from eager code and from inside a
/// kiln::function, where a summary is an effect that writes at every call, in program
/// order with prints and variable writes.
///
/// \code
/// auto writer = kiln::summary::create_file_writer("logs/run1");
/// auto scope = writer.as_default();                 // the default writer until scope ends
/// kiln::variable w(kiln::ones({3}), "w");
/// kiln::function step([&](const kiln::tensor& x) {
///   kiln::tensor loss = kiln::reduce_sum(kiln::square(w * x));
///   kiln::summary::scalar("loss", loss, 7);          // at every call
///   kiln::summary::histogram("w", w, 7);
///   return loss;
/// });
/// step(kiln::constant({1.f, 2.f, 3.f}));
/// kiln::summary::text("note", "hello", 0);         // eagerly: written at once
/// \endcode
/// then `tensorboard --logdir logs`.
///
/// An optional part of kiln, outside kiln/kiln.hpp (it needs nothing beyond kiln's own
/// dependencies: the protocol buffers, the TFRecord framing and its CRC32C, and the PNG
/// encoder are kiln/io/summary/'s). Differences from TensorFlow: the default
/// writer is looked up when a summary node runs rather than when it is traced, so a
/// function traced without a writer writes when called under one, and a function saved
/// with summaries and loaded by another program writes to that program's default
/// writer; a summary returns a bool tensor (true when it wrote); integer images hold
/// values in [0, 255] (kiln has no uint8); a flush does not wait for the disk (fsync).
/// docs/design_notes.md, "TensorBoard summaries", has the rest.

#include <chrono>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"
#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
// ----- begin kiln/exec/summary_op.hpp -----
/// \file
/// The special op of TensorBoard summaries (kiln/summary.hpp), and the hook through
/// which it reaches a writer. A summary node holds what it writes (its kind, tag,
/// description and the kind's parameter) and takes its value and step as inputs; when
/// it runs it looks up the default writer of the calling thread, so that a function
/// traced, or saved and loaded, without a writer writes to whichever writer is the
/// default at each call. The writers themselves (event files, protocol buffers, PNG)
/// live in kiln/io/summary/, above this layer: they fill the hook, so that this header
/// (which saved functions, ONNX export and training loops include to recognise or
/// write summaries) carries none of their code.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>


namespace kiln::detail {

/// What a summary shows in TensorBoard: a curve of scalars, a histogram, text or images.
enum class summary_kind : unsigned char { scalar, histogram, text, image };

/// The graph op of each kind, as a graph listing shows it.
inline std::string_view summary_op_name(summary_kind kind) {
  switch (kind) {
    case summary_kind::histogram: return "WriteHistogramSummary";
    case summary_kind::text: return "WriteTextSummary";
    case summary_kind::image: return "WriteImageSummary";
    default: return "WriteScalarSummary";
  }
}

/// What a summary writes besides its value and step.
struct summary_spec {
  summary_kind kind = summary_kind::scalar;
  std::string tag;          ///< the name TensorBoard shows
  std::string description;  ///< shown beside the plot (Markdown); may be empty
  int parameter = 0;        ///< histogram: the bucket count; image: max_outputs; otherwise 0
};

/// Why a summary cannot take a value or a step: nothing, or which rule it breaks.
struct summary_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks a summary's value (`value_type`, `value_shape`) and step against what its
/// kind takes. Partial shapes (None dims, unknown rank) pass when a value of some
/// fitting shape would: the node checks the concrete shapes again when it runs.
/// (Messages are made only on failure: a node runs this at every call. Like the other
/// functions here, a template on nothing, compiled only where a program uses it.)
template <class = void>
summary_failure check_summary_inputs(const summary_spec& s, dtype value_type, const shape& value_shape,
                                            dtype step_type, const shape& step_shape) {
  auto fail = [&](summary_failure::kind_t kind, const std::string& problem) {
    static constexpr std::string_view kinds[] = {"scalar", "histogram", "text", "image"};
    return summary_failure{kind, "kiln::summary::" + std::string(kinds[int(s.kind)]) + " '" + s.tag + "': " + problem};
  };
  auto value = [&] { return std::string(name(value_type)) + " " + value_shape.str(); };
  if (step_type != int32 && step_type != int64)
    return fail(summary_failure::wrong_dtype, "the step must be an int32 or int64 scalar, got " +
                                                  std::string(name(step_type)) + " " + step_shape.str());
  if (step_shape.has_known_rank() && step_shape.rank() != 0)
    return fail(summary_failure::wrong_shape, "the step must be a scalar, got shape " + step_shape.str());
  switch (s.kind) {
    case summary_kind::scalar:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the value must be numeric, got " + value());
      if (value_shape.has_known_rank() && value_shape.rank() != 0)
        return fail(summary_failure::wrong_shape, "the value must be a scalar, got shape " + value_shape.str());
      break;
    case summary_kind::histogram:
      if (value_type == string) return fail(summary_failure::wrong_dtype, "the values must be numeric, got " + value());
      break;
    case summary_kind::text:
      if (value_type != string)
        return fail(summary_failure::wrong_dtype, "the value must be a string tensor, got " + value());
      break;
    case summary_kind::image:
      if (value_type == string || value_type == bool_)
        return fail(summary_failure::wrong_dtype,
                    "the images must be float32 or float64 (in [0, 1]) or int32 or int64 (in [0, 255]), got " + value());
      if (value_shape.has_known_rank()) {
        if (value_shape.rank() != 4)
          return fail(summary_failure::wrong_shape,
                      "the images must be of rank 4 (count, height, width, channels), got shape " + value_shape.str());
        const std::int64_t channels = value_shape[3];
        if (channels != none && (channels < 1 || channels > 4))
          return fail(summary_failure::wrong_shape,
                      "the images must have 1 (gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA) channels, got shape " +
                          value_shape.str());
        if (value_shape[1] == 0 || value_shape[2] == 0)
          return fail(summary_failure::wrong_shape,
                      "an image must be at least 1 pixel high and wide, got shape " + value_shape.str());
      }
      break;
  }
  return {};
}

/// Raises the error of `f`: kiln::type_error for a dtype and kiln::value_error for a
/// shape (as TensorFlow's summaries raise, eagerly and while tracing), or
/// kiln::invalid_argument_error for a shape found wrong only when a graph runs.
template <class = void>
[[noreturn]] void throw_summary_failure(const summary_failure& f, bool running_graph) {
  if (running_graph) throw invalid_argument_error(f.message);
  if (f.kind == summary_failure::wrong_dtype) throw type_error(f.message);
  throw value_error(f.message);
}

/// Where summaries go: a writer, reached through a function pointer that the writer
/// sets (kiln/io/summary/writer.hpp), so that code below it writes without its code.
struct summary_target {
  /// Writes `value` as summary `spec` at `step`; returns whether it wrote. A value the
  /// writer cannot show (an integer pixel outside [0, 255], a NaN in a histogram)
  /// raises kiln::invalid_argument_error.
  bool (*write)(summary_target& self, const summary_spec& spec, const tensor& value, std::int64_t step) = nullptr;
  /// Writes a serialized GraphDef (TensorBoard's graph view).
  void (*write_graph)(summary_target& self, std::string_view graph_def) = nullptr;
  /// Hands what is queued to the file.
  void (*flush)(summary_target& self) = nullptr;
};

/// This thread's default writer (null when none): what kiln::summary::file_writer's
/// as_default() sets for its lifetime, as tf.summary's default writer is per thread.
inline summary_target*& default_summary_target() {
  thread_local summary_target* target = nullptr;
  return target;
}

/// How code below kiln/summary.hpp (a training loop given a log directory) opens a
/// writer on a directory: `summary_file_opener<>::open(logdir)`, a shared
/// summary_target. Declared here, defined by kiln/summary.hpp; such code names it as a
/// defaulted template argument and checks that it is complete where it is
/// instantiated, as concrete_function::save does with saved_function_io, so that a
/// program that never includes kiln/summary.hpp compiles none of the writer, and one
/// that asks for a log directory without it gets a compile error that says so:
/// \code
/// template <class Opener = kiln::detail::summary_file_opener<>>
/// std::shared_ptr<kiln::detail::summary_target> open_log(const std::filesystem::path& logdir) {
///   if constexpr (requires { Opener::open(logdir); })
///     return Opener::open(logdir);
///   else
///     static_assert(sizeof(Opener*) == 0, "a log directory needs #include <kiln/summary.hpp>");
/// }
/// \endcode
template <class = void>
struct summary_file_opener;

/// The hook for training loops (kiln::fit): writes each (tag, value) pair as a scalar
/// summary at `step` to `target` (a writer, from summary_file_opener or the thread's
/// default one when null); returns false when there is no writer. Tags are as tf.keras' TensorBoard callback
/// names them (`epoch_loss`, `epoch_accuracy`) by the caller's choice.
/// \code
/// const std::pair<std::string, double> logs[] = {{"epoch_loss", 0.25}, {"epoch_accuracy", 0.9}};
/// kiln::detail::write_scalar_summaries(logs, 3);  // false: no default writer here
/// \endcode
template <class = void>
bool write_scalar_summaries(std::span<const std::pair<std::string, double>> values, std::int64_t step,
                            summary_target* target = nullptr) {
  if (!target) target = default_summary_target();
  if (!target) return false;
  for (const auto& [tag, v] : values) {
    tensor t(float64, shape{});
    *static_cast<double*>(t.raw_data()) = v;
    target->write(*target, summary_spec{summary_kind::scalar, tag, {}, 0}, t, step);
  }
  return true;
}

/// The step of a summary as an integer: an int32 or int64 scalar (checked before).
template <class = void>
std::int64_t summary_step(const tensor& step) {
  if (step.device() != device::cpu) return summary_step(step.to(device::cpu));
  return step.dtype() == int32 ? std::int64_t(*static_cast<const std::int32_t*>(step.raw_data()))
                               : *static_cast<const std::int64_t*>(step.raw_data());
}

/// Writes a summary to the default writer at every run: its inputs are the value and
/// the step, its one result a bool scalar, true when it wrote (false without a writer).
class summary_op final : public special_op {
 public:
  template <class = void>
  explicit summary_op(summary_spec spec) : special_op(std::type_identity<summary_op>()), spec_(std::move(spec)) {
    for (int k = 0; k < 2; ++k) {
      written_[k] = tensor(bool_, shape{});
      *static_cast<bool*>(written_[k].raw_data()) = k == 1;
    }
  }
  std::string_view name() const { return summary_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  tensor run(std::span<const tensor* const> in) const {
    summary_target* target = default_summary_target();
    if (!target) return written_[0];
    const tensor& value = *in[0];
    const tensor& step = *in[1];
    if (summary_failure f = check_summary_inputs(spec_, value.dtype(), value.shape(), step.dtype(), step.shape()))
      throw_summary_failure(f, true);  // (only a shape the trace left partial can fail here)
    return written_[target->write(*target, spec_, value, summary_step(step)) ? 1 : 0];
  }
  const summary_spec& spec() const { return spec_; }

  static std::array<std::string_view, 4> op_names() {
    return {summary_op_name(summary_kind::scalar), summary_op_name(summary_kind::histogram),
            summary_op_name(summary_kind::text), summary_op_name(summary_kind::image)};
  }
  /// Saved as what it writes besides its inputs; the kind is in the op's name, the
  /// writer is the loading program's default one.
  template <class Out>
  void save(Out& out) const {
    out.set("tag", spec_.tag);
    out.set("description", spec_.description);
    out.set("parameter", spec_.parameter);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    summary_kind kind = summary_kind::scalar;
    for (auto k : {summary_kind::scalar, summary_kind::histogram, summary_kind::text, summary_kind::image})
      if (summary_op_name(k) == in.op()) kind = k;
    summary_spec spec{kind, in.text("tag"), in.text("description"), in.integer("parameter", 0, INT32_MAX)};
    if (in.input_count() != 2) in.fail(in.op() + " takes two inputs, a value and a step");
    const node &value = in.input(0), &step = in.input(1);
    if (summary_failure f = check_summary_inputs(spec, value.dtype(), value.shape(), step.dtype(), step.shape()))
      in.fail(f.message);
    in.expect_results({{bool_, shape{}}});
    return std::make_shared<summary_op>(std::move(spec));
  }
  /// What TensorBoard's graph shows of it: its tag.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("tag", spec_.tag);
  }
  static constexpr std::string_view onnx_refusal = "writes a TensorBoard summary; an ONNX model writes no files";

 private:
  summary_spec spec_;
  tensor written_[2];  // false, true: results shared by every run, allocated once
};

}  // namespace kiln::detail
// ----- end kiln/exec/summary_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_SUMMARY_OP_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_EVENTS_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_EVENTS_HPP
// ----- begin kiln/io/summary/events.hpp -----
/// \file
/// TensorBoard's `Event` protocol buffers, as TensorFlow 2.12's tf.summary writes them
/// (field numbers from tensorflow/core/util/event.proto, framework/summary.proto and
/// framework/tensor.proto): an event holds its wall time, its step and one summary
/// value, which is a tag, a `TensorProto` and metadata naming the TensorBoard plugin
/// that shows it (`scalars`, `histograms`, `text`, `images`). What each kind makes of
/// its value is what TensorBoard's own summary functions compute: a float32 scalar, a
/// [k, 3] float64 table of histogram buckets, the string tensor itself, and the
/// strings (width, height, PNG...) of images. test/summary compares these bytes with
/// TensorFlow's.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_PNG_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_PNG_HPP
// ----- begin kiln/io/summary/png.hpp -----
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
// ----- end kiln/io/summary/png.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_PNG_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_PROTOBUF_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_PROTOBUF_HPP
// ----- begin kiln/io/summary/protobuf.hpp -----
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
// ----- end kiln/io/summary/protobuf.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_PROTOBUF_HPP

namespace kiln::detail {

/// The encoding of summaries as `Event` protocol buffers (`event_encoder`, the one
/// specialization): a template on nothing, so that a program compiles it only where it
/// writes summaries.
template <class Unused>
struct basic_event_encoder {
  /// TensorFlow's `DataType` enum value of a kiln dtype.
  static int tensorflow_dtype(dtype t);

  /// A `TensorShapeProto` (dims; None is -1) as field `field`.
  static void write_tensor_shape(proto::writer& w, int field, const shape& dims);

  /// A `TensorProto` as field `field`: numbers as `tensor_content` (their little-endian
  /// bytes, as TensorFlow's summaries write them), strings as `string_val`.
  static void write_tensor_proto(proto::writer& w, int field, dtype type, const shape& dims, std::string_view content,
                                 std::span<const std::string> strings = {});
  /// The `TensorProto` of an eager tensor.
  static void write_tensor_proto(proto::writer& w, int field, const tensor& value);

  /// Element `i` of a numeric (or bool) tensor on the CPU, as a `T`.
  template <class T>
  static T numeric_element(const tensor& v, std::int64_t i);

  /// tensorboard's histogram buckets (its `summary_v2._buckets`): `buckets` rows of
  /// (left edge, right edge, count), row-major. Equal widths between the least and the
  /// greatest value, the last bucket closed, its right edge exactly the greatest value;
  /// when every value is the same, every edge is that value and the last bucket counts
  /// them all; no values give rows of zeros. Non-finite values raise
  /// kiln::invalid_argument_error (TensorFlow would make meaningless buckets of them).
  static std::vector<double> histogram_buckets(std::span<const double> data, int buckets, std::string_view tag);

  /// The 8-bit samples of images as tf.summary.image makes them: floats scaled by 255.5
  /// and saturated into [0, 255] (tf.image.convert_image_dtype with saturate=True; NaN
  /// gives 0), integers as they are, which must lie in [0, 255] (kiln has no uint8, so
  /// integer tensors stand for uint8 images) or kiln::invalid_argument_error.
  static std::vector<std::uint8_t> image_samples(const tensor& images, std::int64_t count, std::string_view tag);

  /// The TensorBoard plugin that shows each kind.
  static std::string_view summary_plugin(summary_kind kind);

  /// Writes the `TensorProto` of summary `spec` of `value` (what TensorBoard's summary
  /// function of that kind passes to tf.summary.write) as field `field`.
  static void write_summary_tensor(proto::writer& w, int field, const summary_spec& spec, const tensor& value);

  /// Appends to `out` the `Event` of summary `spec` of `value` at `step` and `wall_time`
  /// (seconds since 1970): its one `Summary.Value` holds the tag, the tensor and the
  /// `SummaryMetadata` (the plugin's name, and the description when there is one).
  static void write_summary_event(std::string& out, double wall_time, std::int64_t step, const summary_spec& spec,
                                  const tensor& value);

  /// The `Event` that opens an event file: its format version, "brain.Event:2".
  static void write_file_version_event(std::string& out, double wall_time);

  /// An `Event` holding a serialized `GraphDef` (what TensorBoard's graph view reads).
  static void write_graph_event(std::string& out, double wall_time, std::string_view graph_def);
};
using event_encoder = basic_event_encoder<void>;

template <class Unused>
int basic_event_encoder<Unused>::tensorflow_dtype(dtype t) {
  switch (t) {
    case bool_: return 10;    // DT_BOOL
    case int32: return 3;     // DT_INT32
    case int64: return 9;     // DT_INT64
    case float32: return 1;   // DT_FLOAT
    case float64: return 2;   // DT_DOUBLE
    default: return 7;        // DT_STRING
  }
}

template <class Unused>
void basic_event_encoder<Unused>::write_tensor_shape(proto::writer& w, int field, const shape& dims) {
  w.message(field, [&](proto::writer& m) {
    if (!dims.has_known_rank()) {
      m.boolean(3, true);  // unknown_rank
      return;
    }
    for (std::int64_t d : dims)
      m.message(2, [&](proto::writer& dim) {
        if (d != 0) dim.varint(1, d);
      });
  });
}

template <class Unused>
void basic_event_encoder<Unused>::write_tensor_proto(proto::writer& w, int field, dtype type, const shape& dims,
                                                     std::string_view content, std::span<const std::string> strings) {
  w.message(field, [&](proto::writer& t) {
    t.varint(1, tensorflow_dtype(type));
    write_tensor_shape(t, 2, dims);
    if (type == string) {
      for (const std::string& s : strings) t.bytes(8, s);
    } else if (!content.empty()) {
      t.bytes(4, content);
    }
  });
}

template <class Unused>
void basic_event_encoder<Unused>::write_tensor_proto(proto::writer& w, int field, const tensor& value) {
  if (value.device() != device::cpu) return write_tensor_proto(w, field, value.to(device::cpu));
  const tensor& v = value;
  if (v.dtype() == string) {
    const auto* first = static_cast<const std::string*>(v.raw_data());
    write_tensor_proto(w, field, string, v.shape(), {}, std::span(first, std::size_t(v.size())));
  } else {
    write_tensor_proto(w, field, v.dtype(), v.shape(),
                       std::string_view(static_cast<const char*>(v.raw_data()), std::size_t(v.size()) * size_of(v.dtype())));
  }
}

template <class Unused>
template <class T>
T basic_event_encoder<Unused>::numeric_element(const tensor& v, std::int64_t i) {
  const void* p = v.raw_data();
  switch (v.dtype()) {
    case bool_: return T(static_cast<const bool*>(p)[i]);
    case int32: return T(static_cast<const std::int32_t*>(p)[i]);
    case int64: return T(static_cast<const std::int64_t*>(p)[i]);
    case float32: return T(static_cast<const float*>(p)[i]);
    default: return T(static_cast<const double*>(p)[i]);
  }
}

template <class Unused>
std::vector<double> basic_event_encoder<Unused>::histogram_buckets(std::span<const double> data, int buckets,
                                                                   std::string_view tag) {
  const std::size_t k = std::size_t(std::max(buckets, 0));
  std::vector<double> table(3 * k, 0.0);
  if (data.empty() || k == 0) return table;
  double lo = data[0], hi = data[0];
  for (double x : data) {
    if (!std::isfinite(x))
      throw invalid_argument_error("kiln::summary::histogram '" + std::string(tag) + "': the values hold " +
                                   (std::isnan(x) ? "NaN" : "an infinity") + ", which has no bucket");
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  const double range = hi - lo;
  if (range == 0) {
    for (std::size_t b = 0; b < k; ++b) table[3 * b] = table[3 * b + 1] = hi;
    table[3 * k - 1] = double(data.size());
    return table;
  }
  // As TensorFlow computes them: the width is range / k, an index floor((x - lo) /
  // width) clamped to the last bucket, edge i is lo + i * (range / k) but the last, hi.
  const double width = range / double(k);
  for (double x : data) {
    // (NaN and infinities stay out of the integer conversion: a width that underflows
    // to 0, or a range that overflows, makes them.)
    const double index = std::floor((x - lo) / width);
    table[3 * (index >= 0 && index < double(k - 1) ? std::size_t(index) : index >= 0 ? k - 1 : 0) + 2] += 1;
  }
  for (std::size_t b = 0; b < k; ++b) {
    table[3 * b] = b == 0 ? lo : lo + width * double(b);
    table[3 * b + 1] = b + 1 == k ? hi : lo + width * double(b + 1);
  }
  return table;
}

template <class Unused>
std::vector<std::uint8_t> basic_event_encoder<Unused>::image_samples(const tensor& images, std::int64_t count,
                                                                     std::string_view tag) {
  const std::int64_t per_image = images.shape()[1] * images.shape()[2] * images.shape()[3];
  std::vector<std::uint8_t> out(std::size_t(count * per_image));
  const bool floats = images.dtype() == float32 || images.dtype() == float64;
  for (std::int64_t i = 0; i < count * per_image; ++i) {
    if (floats) {  // (in the images' own precision, as TensorFlow multiplies)
      const double x = images.dtype() == float32 ? double(static_cast<const float*>(images.raw_data())[i] * 255.5f)
                                                 : static_cast<const double*>(images.raw_data())[i] * 255.5;
      out[std::size_t(i)] = x >= 255 ? 255 : x > 0 ? std::uint8_t(x) : 0;
    } else {
      const std::int64_t x = numeric_element<std::int64_t>(images, i);
      if (x < 0 || x > 255)
        throw invalid_argument_error("kiln::summary::image '" + std::string(tag) + "': an integer image holds " +
                                     std::to_string(x) + ", outside [0, 255]");
      out[std::size_t(i)] = std::uint8_t(x);
    }
  }
  return out;
}

template <class Unused>
std::string_view basic_event_encoder<Unused>::summary_plugin(summary_kind kind) {
  switch (kind) {
    case summary_kind::histogram: return "histograms";
    case summary_kind::text: return "text";
    case summary_kind::image: return "images";
    default: return "scalars";
  }
}

template <class Unused>
void basic_event_encoder<Unused>::write_summary_tensor(proto::writer& w, int field, const summary_spec& spec,
                                                       const tensor& value) {
  if (value.device() != device::cpu) return write_summary_tensor(w, field, spec, value.to(device::cpu));
  const tensor& v = value;
  switch (spec.kind) {
    case summary_kind::scalar: {
      float x;
      if (v.dtype() == float32) {
        x = *static_cast<const float*>(v.raw_data());
      } else if (v.dtype() == float64) {
        // Rounded to float32, as TensorFlow's cast; beyond its range, an infinity (a C++
        // conversion of such a double is undefined).
        const double d = *static_cast<const double*>(v.raw_data());
        constexpr double largest = std::numeric_limits<float>::max();
        constexpr double overflow = largest + 0x1p103;  // half a float ulp past it: rounds to infinity
        x = d >= overflow    ? std::numeric_limits<float>::infinity()
            : d <= -overflow ? -std::numeric_limits<float>::infinity()
            : d > largest    ? float(largest)
            : d < -largest   ? -float(largest)
                             : float(d);
      } else {
        x = numeric_element<float>(v, 0);
      }
      char bytes[4];
      std::memcpy(bytes, &x, 4);
      write_tensor_proto(w, field, float32, shape{}, std::string_view(bytes, 4));
      break;
    }
    case summary_kind::histogram: {
      std::vector<double> data(std::size_t(v.size()));
      for (std::int64_t i = 0; i < v.size(); ++i) data[std::size_t(i)] = numeric_element<double>(v, i);
      const std::vector<double> table = histogram_buckets(data, spec.parameter, spec.tag);
      write_tensor_proto(w, field, float64, shape{std::int64_t(table.size() / 3), 3},
                         std::string_view(reinterpret_cast<const char*>(table.data()), table.size() * sizeof(double)));
      break;
    }
    case summary_kind::text:
      write_tensor_proto(w, field, v);
      break;
    case summary_kind::image: {
      const std::int64_t height = v.shape()[1], width = v.shape()[2], channels = v.shape()[3];
      const std::int64_t count = std::min<std::int64_t>(v.shape()[0], std::max(spec.parameter, 0));
      const std::vector<std::uint8_t> samples = image_samples(v, count, spec.tag);
      std::vector<std::string> strings{std::to_string(width), std::to_string(height)};
      const std::size_t per_image = std::size_t(height * width * channels);
      for (std::int64_t i = 0; i < count; ++i)
        strings.push_back(basic_png_encoder<Unused>::encode_png(
            std::span(samples).subspan(std::size_t(i) * per_image, per_image), std::uint32_t(height),
            std::uint32_t(width), int(channels)));
      write_tensor_proto(w, field, string, shape{std::int64_t(strings.size())}, {}, strings);
      break;
    }
  }
}

template <class Unused>
void basic_event_encoder<Unused>::write_summary_event(std::string& out, double wall_time, std::int64_t step,
                                                      const summary_spec& spec, const tensor& value) {
  proto::writer w(out);
  w.float64(1, wall_time);
  if (step != 0) w.varint(2, step);
  w.message(5, [&](proto::writer& summary) {     // Event.summary
    summary.message(1, [&](proto::writer& v) {   // Summary.value
      v.string(1, spec.tag);                      // tag
      write_summary_tensor(v, 8, spec, value);    // tensor
      v.message(9, [&](proto::writer& meta) {     // metadata
        meta.message(1, [&](proto::writer& plugin) { plugin.string(1, summary_plugin(spec.kind)); });
        if (!spec.description.empty()) meta.string(3, spec.description);
      });
    });
  });
}

template <class Unused>
void basic_event_encoder<Unused>::write_file_version_event(std::string& out, double wall_time) {
  proto::writer w(out);
  w.float64(1, wall_time);
  w.string(3, "brain.Event:2");
}

template <class Unused>
void basic_event_encoder<Unused>::write_graph_event(std::string& out, double wall_time, std::string_view graph_def) {
  proto::writer w(out);
  w.float64(1, wall_time);
  w.bytes(4, graph_def);
}

}  // namespace kiln::detail
// ----- end kiln/io/summary/events.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_EVENTS_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_GRAPH_DEF_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_GRAPH_DEF_HPP
// ----- begin kiln/io/summary/graph_def.hpp -----
/// \file
/// A kiln::graph as a TensorFlow `GraphDef` (tensorflow/core/framework/graph.proto,
/// node_def.proto, attr_value.proto, function.proto), for TensorBoard's graph view.
///
/// Each node is a `NodeDef` named as in kiln's listing, with kiln's op names
/// (`add`, `matmul`, `ReadVariableOp`, `cond`, `while`, ...), its inputs (a further
/// result of a special op is `name:k`, TensorFlow's spelling of output k, so `Result`
/// nodes are not nodes of their own) and attributes: `_output_shapes` (what
/// TensorBoard draws on the edges), `dtype` and `shape` of placeholders, `dtype` and
/// `value` of constants, `T` (the first input's dtype) of ops, the op's own
/// attributes (`axis`, `perm`, `to`, ...), the variable a variable op reads or writes
/// (`shared_name`) and a summary's `tag`. Effects (variable writes, prints,
/// summaries, callbacks) take a control input (`^name`) from the effect before them:
/// the program order the executor keeps, drawn as TensorFlow draws its automatic
/// control dependencies. The branches of a `cond` and the condition and body of a
/// `while` are functions of the graph's library (`FunctionDef`s, named after their
/// node and label), which the node names in its `then_branch`/`else_branch` or
/// `cond`/`body` attribute, as TensorFlow's `If` and `While` nodes do.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP
// ----- begin kiln/io/special_ops.hpp -----
/// \file
/// The special ops that files and other runtimes know: the one list that kiln::save,
/// kiln::load, kiln::onnx and TensorBoard's graph look a special node up in. Each op says
/// itself how it is saved, rebuilt, lowered to ONNX or refused, and what TensorBoard
/// shows of it (the members kiln::special_op lists); a consumer finds the op's entry (by
/// the op's kind, or by the name its nodes take when it loads a file) and calls it, so no
/// consumer names an op. A new special op is its own file and one entry here; an op
/// missing here is refused by name ("cannot save yet", "has no ONNX operator").
/// An optional part's header: it includes the ops' headers that kiln/kiln.hpp does not.

#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#ifndef KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#define KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
// ----- begin kiln/exec/collective_op.hpp -----
/// \file
/// The special op of collectives across ranks (kiln/distributed.hpp: `kiln::all_reduce`,
/// `all_gather`, `broadcast`, `reduce_scatter`), and the hook through which it reaches
/// the transport. A collective node holds what it does (its kind, reduce op, root and
/// group) and takes its tensors as inputs; when it runs it hands them to the engine that
/// kiln/distribute/ installs (MPI for host tensors, NCCL for device ones). This header
/// holds no transport code and needs no MPI, so that the consumers of graphs that must
/// recognise the node (saved functions) include it alone, and a program built without
/// the distributed component that meets such a node says what it lacks.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


namespace kiln {

/// How `kiln::all_reduce` and `kiln::reduce_scatter` combine the ranks' values:
/// TensorFlow's `tf.distribute.ReduceOp` (sum, mean) and the collectives' max and min.
/// \code kiln::reduce_op op = kiln::reduce_op::mean; \endcode
enum class reduce_op : unsigned char { sum, mean, max, min };

/// `sum`, `mean`, `max`, `min`.
/// \code kiln::name(kiln::reduce_op::max) == "max" \endcode
inline std::string_view name(reduce_op op) {
  static constexpr std::string_view names[] = {"sum", "mean", "max", "min"};
  return names[int(op)];
}

}  // namespace kiln

namespace kiln::detail {

/// What a collective does with its tensors.
enum class collective_kind : unsigned char {
  all_reduce,      ///< every rank gets the reduction of every rank's tensors
  all_gather,      ///< every rank gets every rank's tensor, stacked along axis 0 in rank order
  broadcast,       ///< every rank gets the root's tensor
  reduce_scatter,  ///< rank r gets block r (along axis 0) of the reduction
  reduce,          ///< the root gets the reduction, the others zeros (broadcast's gradient)
};

/// The graph op of each kind, as a graph listing shows it (TensorFlow's collective ops'
/// names; `CollectiveReduce` is NCCL's `Reduce`, which TensorFlow's graphs call
/// NcclReduce).
inline std::string_view collective_op_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastV2",
                                               "CollectiveReduceScatterV2", "CollectiveReduce"};
  return names[int(kind)];
}
/// The function of each kind, as messages name it.
inline std::string_view collective_api_name(collective_kind kind) {
  static constexpr std::string_view names[] = {"kiln::all_reduce", "kiln::all_gather", "kiln::broadcast",
                                               "kiln::reduce_scatter", "kiln::broadcast's gradient"};
  return names[int(kind)];
}

/// A collective as a node holds it.
struct collective_spec {
  collective_kind kind = collective_kind::all_reduce;
  reduce_op op = reduce_op::sum;  ///< all_reduce, reduce_scatter, reduce
  int root = 0;                   ///< broadcast, reduce: the rank (in the group) whose tensor counts
  /// The group: the world ranks of its members in the group's rank order; empty for
  /// every rank of the world.
  std::vector<int> members;
  /// The transport's state of the group (kiln/distribute/): set for a collective the
  /// program made, null for one loaded from a file, whose group `members` finds.
  std::shared_ptr<void> group;
  /// Where the program calls it (a hash of its source file, line and column, and the
  /// line): ranks that reach a collective from different places have lost step, since
  /// every rank runs the same program.
  std::uint64_t site = 0;
  std::uint32_t line = 0;
};

/// The `site` of a collective called at `file`, `line`, `column`.
inline std::uint64_t collective_site(std::string_view file, std::uint32_t line, std::uint32_t column) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (char c : file) hash = (hash ^ std::uint8_t(c)) * 1099511628211ull;
  for (std::uint32_t v : {line, column})
    for (int b = 0; b < 4; ++b) hash = (hash ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  return hash;
}

/// Why a collective cannot take its inputs: nothing, or which rule they break.
struct collective_failure {
  enum kind_t : unsigned char { none, wrong_dtype, wrong_shape } kind = none;
  std::string message;
  explicit operator bool() const { return kind != none; }
};

/// Checks the dtype and shape of a collective's inputs (one tensor, or several of one
/// dtype for an all_reduce) in a group of `group_size` ranks, and gives the results'
/// shapes in `results`. Partial shapes pass when some shape of them would.
/// (A template on nothing, compiled only where a program uses it.)
template <class = void>
collective_failure check_collective(const collective_spec& s, std::span<const std::pair<dtype, shape>> inputs,
                                    int group_size, std::vector<std::pair<dtype, shape>>* results = nullptr) {
  const std::string who(collective_api_name(s.kind));
  auto fail = [&](collective_failure::kind_t kind, const std::string& problem) {
    return collective_failure{kind, who + ": " + problem};
  };
  if (inputs.empty()) return fail(collective_failure::wrong_shape, "no tensors given");
  if (s.kind != collective_kind::all_reduce && inputs.size() != 1)
    return fail(collective_failure::wrong_shape, "takes one tensor, got " + std::to_string(inputs.size()));
  const dtype t = inputs[0].first;
  for (const auto& [type, dims] : inputs)
    if (type != t)
      return fail(collective_failure::wrong_dtype, "the tensors of one all_reduce share a dtype, got " +
                                                       std::string(name(t)) + " and " + std::string(name(type)));
  const bool reduces = s.kind == collective_kind::all_reduce || s.kind == collective_kind::reduce_scatter ||
                       s.kind == collective_kind::reduce;
  if (reduces && !dtypes::numeric.contains(t))
    return fail(collective_failure::wrong_dtype, "reduce_op::" + std::string(name(s.op)) +
                                                     " needs int32, int64, float32 or float64 tensors, got " +
                                                     std::string(name(t)));
  if (s.kind == collective_kind::reduce && !is_floating(t))
    return fail(collective_failure::wrong_dtype, "takes float32 or float64 tensors, got " + std::string(name(t)));
  if ((s.kind == collective_kind::broadcast || s.kind == collective_kind::reduce) &&
      (s.root < 0 || s.root >= group_size))
    return fail(collective_failure::wrong_shape, "root " + std::to_string(s.root) + " is not a rank of a group of " +
                                                     std::to_string(group_size));
  const shape& first = inputs[0].second;
  if (s.kind == collective_kind::all_gather || s.kind == collective_kind::reduce_scatter) {
    if (first.has_known_rank() && first.rank() == 0)
      return fail(collective_failure::wrong_shape, "needs a tensor of rank 1 or more (it works along axis 0), got a scalar");
    if (s.kind == collective_kind::reduce_scatter && first.has_known_rank() && first[0] != none &&
        first[0] % group_size != 0)
      return fail(collective_failure::wrong_shape, "the first dim of shape " + first.str() +
                                                       " does not divide into " + std::to_string(group_size) +
                                                       " equal blocks, one per rank");
  }
  if (results) {
    results->clear();
    for (const auto& [type, dims] : inputs) {
      shape out = dims;
      if (dims.has_known_rank() && dims.rank() > 0 && dims[0] != none) {
        std::vector<std::int64_t> d(dims.begin(), dims.end());
        if (s.kind == collective_kind::all_gather) d[0] *= group_size;
        if (s.kind == collective_kind::reduce_scatter) d[0] /= group_size;
        out = shape(std::span<const std::int64_t>(d));
      }
      results->emplace_back(type, out);
    }
  }
  return {};
}

class collective_op;

/// Where collectives run: the transport that kiln/distribute/ installs when a program
/// includes kiln/distributed.hpp (null otherwise).
struct collective_engine {
  /// Runs `op` on eager inputs and writes one tensor per result into `results`.
  void (*run)(const collective_op& op, std::span<const tensor* const> inputs, std::span<tensor> results) = nullptr;
  /// The number of ranks of a group (`members` empty: the world).
  int (*group_size)(const std::vector<int>& members) = nullptr;
};
inline std::atomic<const collective_engine*>& collective_engine_slot() {
  static std::atomic<const collective_engine*> engine{nullptr};
  return engine;
}

/// What a program without the distributed component says when it meets a collective.
[[noreturn]] inline void throw_no_collective_engine(std::string_view where, std::string_view op) {
  throw unavailable_error(std::string(where) + std::string(op) +
                          " is a collective across ranks, which needs kiln's distributed component: "
                          "#include <kiln/distributed.hpp> and link the CMake target kiln::distributed");
}

/// A collective across ranks: its inputs are the tensors it combines, its results one per
/// input. It has effects: every rank must run the same collectives in the same order, so
/// they run in program order and are never pruned, folded or merged.
class collective_op final : public special_op {
 public:
  explicit collective_op(collective_spec spec) : special_op(std::type_identity<collective_op>()), spec_(std::move(spec)) {}
  std::string_view name() const { return collective_op_name(spec_.kind); }
  bool has_effects() const { return true; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine("", name());
    std::vector<tensor> out(in.size());
    engine->run(*this, in, out);
    return out;
  }
  const collective_spec& spec() const { return spec_; }

  static std::array<std::string_view, 5> op_names() {
    return {collective_op_name(collective_kind::all_reduce), collective_op_name(collective_kind::all_gather),
            collective_op_name(collective_kind::broadcast), collective_op_name(collective_kind::reduce_scatter),
            collective_op_name(collective_kind::reduce)};
  }
  /// Saved as what it does; the kind is in the op's name, the group is its world ranks
  /// (empty: the world).
  template <class Out>
  void save(Out& out) const {
    out.set("reduce", std::string(kiln::name(spec_.op)));
    out.set("root", spec_.root);
    out.set("members", spec_.members);
    out.set("site", spec_.site);
    out.set("line", spec_.line);
  }
  /// Rebuilt only where the distributed component runs collectives, which tells the
  /// size of its group.
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    collective_kind kind = collective_kind::all_reduce;
    for (auto k : {collective_kind::all_reduce, collective_kind::all_gather, collective_kind::broadcast,
                   collective_kind::reduce_scatter, collective_kind::reduce})
      if (collective_op_name(k) == in.op()) kind = k;
    const collective_engine* engine = collective_engine_slot().load(std::memory_order_acquire);
    if (!engine) throw_no_collective_engine(in.context(), in.op());
    collective_spec spec{kind, reduce_op::sum, in.integer("root", 0, INT32_MAX), {}, nullptr, in.unsigned_integer("site"),
                         std::uint32_t(in.integer("line", 0, INT32_MAX))};
    const std::string reduce = in.text("reduce");
    bool known = false;
    for (auto o : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min})
      if (kiln::name(o) == reduce) spec.op = o, known = true;
    if (!known) in.fail("unknown reduce op \"" + reduce + "\"");
    for (int m : in.integers("members", 0, INT32_MAX)) spec.members.push_back(m);
    std::vector<std::pair<dtype, shape>> given, made;
    for (int k = 0; k < in.input_count(); ++k) given.emplace_back(in.input(k).dtype(), in.input(k).shape());
    int size = 0;
    try {
      size = engine->group_size(spec.members);
    } catch (const error& e) {
      in.fail(e.what());
    }
    if (collective_failure f = check_collective(spec, given, size, &made)) in.fail(f.message);
    in.expect_results(made);
    return std::make_shared<collective_op>(std::move(spec));
  }
  static constexpr std::string_view onnx_refusal =
      "exchanges tensors with other processes (a collective); an ONNX model runs in one";

 private:
  collective_spec spec_;
};

}  // namespace kiln::detail
// ----- end kiln/exec/collective_op.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_EXEC_COLLECTIVE_OP_HPP
#include "kiln/kiln.hpp"

namespace kiln::detail {

/// Every special op that a saved function, an ONNX model or TensorBoard's graph may meet.
using known_special_ops =
    boost::mp11::mp_list<read_variable_op, assign_variable_op, print_op, host_callback_op, cond_op, while_op,
                         random_uniform_op, summary_op, collective_op, reduce_dataset_op, iterator_get_next_op,
                         typed::described_op>;

/// A consumer's entry for one op of known_special_ops, and how to tell that op.
template <class Entry>
struct known_special_op {
  bool (*is)(const special_op& op);  ///< whether `op` is this kind of op
  Entry entry;
};

/// A consumer's entries: `Entry::template of<Op>()` for each op of known_special_ops, in
/// its order. Made on first use.
template <class Entry>
const std::vector<known_special_op<Entry>>& special_op_entries() {
  static const std::vector<known_special_op<Entry>> entries = [] {
    std::vector<known_special_op<Entry>> e;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          e.push_back({[](const special_op& op) { return op.as<Op>() != nullptr; }, Entry::template of<Op>()});
        });
    return e;
  }();
  return entries;
}

/// The entry of `op`'s kind, or null for a kind that known_special_ops does not list.
/// By kind rather than by name: a typed trace's graph describes its steps with the
/// runtime tier's names (typed::described_op).
template <class Entry>
const Entry* special_op_entry(const special_op& op) {
  for (const known_special_op<Entry>& k : special_op_entries<Entry>())
    if (k.is(op)) return &k.entry;
  return nullptr;
}

/// The entry of the op whose nodes take the name `name` (`Op::op_names()`), as a file
/// names it, or null for a name that no op of known_special_ops takes.
template <class Entry>
const Entry* special_op_entry(std::string_view name) {
  static const std::unordered_map<std::string_view, const Entry*> by_name = [] {
    std::unordered_map<std::string_view, const Entry*> t;
    std::size_t k = 0;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          for (std::string_view n : Op::op_names()) t.emplace(n, &special_op_entries<Entry>()[k].entry);
          ++k;
        });
    return t;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

}  // namespace kiln::detail
// ----- end kiln/io/special_ops.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SPECIAL_OPS_HPP

namespace kiln::detail {

// ---- AttrValue ----------------------------------------------------------------------

/// The writers of `AttrValue`s (`attr_writer`, the one specialization): a template on
/// nothing, as the rest of this header, so that a program compiles them only where it
/// writes a graph.
template <class Unused>
struct basic_attr_writer {
  using event_encoder = basic_event_encoder<Unused>;

  /// One `AttrValue` (as the value of a NodeDef's attr map entry `key`).
  template <class F>
  static void write_attr(proto::writer& w, std::string_view key, F&& value);
  static void write_type_attr(proto::writer& w, std::string_view key, dtype t);
  static void write_string_attr(proto::writer& w, std::string_view key, std::string_view s);
  static void write_ints_attr(proto::writer& w, std::string_view key, std::span<const std::int64_t> values);
  static void write_shapes_attr(proto::writer& w, std::string_view key, std::span<const shape> shapes);
  static void write_function_attr(proto::writer& w, std::string_view key, std::string_view function);

  /// An op's own attribute (one of the types of its `attribute_fields()`).
  static void write_op_attr(proto::writer& w, std::string_view key, dtype v);
  static void write_op_attr(proto::writer& w, std::string_view key, const shape& v);
  static void write_op_attr(proto::writer& w, std::string_view key, const int_list& v);
  static void write_op_attr(proto::writer& w, std::string_view key, std::int64_t v);
  static void write_op_attr(proto::writer& w, std::string_view key, double v);
  static void write_op_attr(proto::writer& w, std::string_view key, bool v);
  static void write_op_attr(proto::writer& w, std::string_view key, const reduction_axes& v);
  static void write_op_attr(proto::writer& w, std::string_view key, ops::padding v);

  template <class Op>
  static void write_op_attrs(proto::writer& w, const Op& op);
};
using attr_writer = basic_attr_writer<void>;

template <class Unused>
template <class F>
void basic_attr_writer<Unused>::write_attr(proto::writer& w, std::string_view key, F&& value) {
  w.message(5, [&](proto::writer& entry) {  // NodeDef.attr (map<string, AttrValue>)
    entry.string(1, key);
    entry.message(2, value);
  });
}

template <class Unused>
void basic_attr_writer<Unused>::write_type_attr(proto::writer& w, std::string_view key, dtype t) {
  write_attr(w, key, [&](proto::writer& a) { a.varint(6, event_encoder::tensorflow_dtype(t)); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_string_attr(proto::writer& w, std::string_view key, std::string_view s) {
  write_attr(w, key, [&](proto::writer& a) { a.bytes(2, s); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_ints_attr(proto::writer& w, std::string_view key,
                                                std::span<const std::int64_t> values) {
  write_attr(w, key, [&](proto::writer& a) {
    a.message(1, [&](proto::writer& list) {  // AttrValue.list
      if (values.empty()) return;
      list.message(3, [&](proto::writer& packed) {  // ListValue.i, packed
        for (std::int64_t v : values) packed.raw_varint(std::uint64_t(v));
      });
    });
  });
}

template <class Unused>
void basic_attr_writer<Unused>::write_shapes_attr(proto::writer& w, std::string_view key,
                                                  std::span<const shape> shapes) {
  write_attr(w, key, [&](proto::writer& a) {
    a.message(1, [&](proto::writer& list) {
      for (const shape& s : shapes) event_encoder::write_tensor_shape(list, 7, s);  // ListValue.shape
    });
  });
}

template <class Unused>
void basic_attr_writer<Unused>::write_function_attr(proto::writer& w, std::string_view key, std::string_view function) {
  write_attr(w, key, [&](proto::writer& a) { a.message(10, [&](proto::writer& f) { f.string(1, function); }); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, dtype v) {
  write_type_attr(w, key, v);
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, const shape& v) {
  write_attr(w, key, [&](proto::writer& a) { event_encoder::write_tensor_shape(a, 7, v); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, const int_list& v) {
  write_ints_attr(w, key, std::span<const std::int64_t>(v.begin(), v.end()));
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, std::int64_t v) {
  write_attr(w, key, [&](proto::writer& a) { a.varint(3, v); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, double v) {
  write_attr(w, key, [&](proto::writer& a) { a.float32(4, float(v)); });  // AttrValue.f is a float
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, bool v) {
  write_attr(w, key, [&](proto::writer& a) { a.boolean(5, v); });
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, const reduction_axes& v) {
  if (v.all())
    write_string_attr(w, key, "all");
  else
    write_op_attr(w, key, v.list());
}

template <class Unused>
void basic_attr_writer<Unused>::write_op_attr(proto::writer& w, std::string_view key, ops::padding v) {
  write_string_attr(w, key, v == ops::padding::same ? "SAME" : "VALID");
}

template <class Unused>
template <class Op>
void basic_attr_writer<Unused>::write_op_attrs(proto::writer& w, const Op& op) {
  if constexpr (requires { Op::attribute_fields(); })
    std::apply([&](const auto&... a) { (write_op_attr(w, a.name, op.*a.member), ...); }, Op::attribute_fields());
}

// ---- GraphDef -----------------------------------------------------------------------

/// How the graph writer reaches a special op (an entry of special_op_entries): the string
/// attributes the op's `describe(out)` gives TensorBoard (`shared_name`, `tag`), if any.
struct tensorboard_special_op {
  void (*describe)(proto::writer& d, const special_op& op) = nullptr;

  template <class Op>
  static tensorboard_special_op of() {
    struct out {
      proto::writer& d;
      void set_text(std::string_view key, std::string_view value) { attr_writer::write_string_attr(d, key, value); }
    };
    tensorboard_special_op e;
    e.describe = [](proto::writer& d, const special_op& op) {
      if constexpr (requires(out& o) { std::declval<const Op&>().describe(o); })
        if (const Op* o = op.as<Op>()) {
          out attributes{d};
          o->describe(attributes);
        }
    };
    return e;
  }
};

/// Writes graphs as `NodeDef`s, and their subgraphs as `FunctionDef`s into `library`
/// (`graph_def_writer`, the one specialization: a template on nothing, compiled only
/// where a program writes a graph).
template <class Unused>
class basic_graph_def_writer {
 public:
  /// The serialized `GraphDef` of `g`, its conditionals' and loops' graphs as functions.
  /// \code
  /// kiln::function f([](const kiln::tensor& x) { return x * 2 + 1; });
  /// std::string bytes = kiln::detail::graph_def_writer::graph_def_of(f.get_concrete_function(kiln::constant(1.f)).graph());
  /// \endcode
  static std::string graph_def_of(const graph& g) { return basic_graph_def_writer().graph_def(g); }


  /// The serialized `GraphDef` of `g`.
  std::string graph_def(const graph& g) {
    std::string out;
    proto::writer w(out);
    write_nodes(w, 1, g, false);  // GraphDef.node
    if (!library_.empty()) {
      const std::size_t at = w.begin_message(2);  // GraphDef.library (FunctionDefLibrary)
      out += library_;
      w.end_message(at);
    }
    return out;
  }

 private:
  using attrs = basic_attr_writer<Unused>;
  using event_encoder = basic_event_encoder<Unused>;

  // How a node's output is named: in a graph `name` (output 0) or `name:k`; in a
  // function body `name:output:k`, and an argument by its name alone.
  static std::string reference(const graph& g, int id, bool in_function) {
    const node& n = g.node_at(id);
    std::string base = n.name();
    int k = 0;
    if (n.kind() == node_kind::result) {
      k = 1;
      while (id - k >= 0 && g.node_at(id - k).kind() == node_kind::result) ++k;
      base = g.node_at(id - k).name();
    }
    if (!in_function) return k == 0 ? base : base + ":" + std::to_string(k);
    if (n.kind() == node_kind::placeholder) return base;
    return base + ":output:" + std::to_string(k);
  }

  static std::string label_attr(const std::string& label) {
    return label == "then" || label == "else" ? label + "_branch" : label;
  }

  void write_nodes(proto::writer& w, int field, const graph& g, bool in_function) {
    std::string previous_effect;
    const auto& nodes = g.nodes();
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const node& n = nodes[i];
      if (n.kind() == node_kind::result) continue;                    // output k of its special node
      if (in_function && n.kind() == node_kind::placeholder) continue;  // an argument of the function
      w.message(field, [&](proto::writer& d) {
        d.string(1, n.name());
        d.string(2, n.op());
        for (int in : n.input_ids()) d.string(3, reference(g, in, in_function));
        const bool effect = n.kind() == node_kind::special && n.special().has_effects();
        if (effect && !previous_effect.empty()) d.string(3, "^" + previous_effect);
        std::vector<shape> shapes;
        switch (n.kind()) {
          case node_kind::placeholder:
            attrs::write_type_attr(d, "dtype", n.dtype());
            attrs::write_op_attr(d, "shape", n.shape());
            shapes.push_back(n.shape());
            break;
          case node_kind::constant:
            attrs::write_type_attr(d, "dtype", n.dtype());
            attrs::write_attr(d, "value", [&](proto::writer& a) { event_encoder::write_tensor_proto(a, 8, n.value()); });
            shapes.push_back(n.shape());
            break;
          case node_kind::op:
            attrs::write_type_attr(d, "T", n.input_ids().empty() ? n.dtype() : g.node_at(n.input_ids()[0]).dtype());
            ops::visit([&](const auto& op) { attrs::write_op_attrs(d, op); }, n.operation());
            shapes.push_back(n.shape());
            break;
          case node_kind::identity:
            attrs::write_type_attr(d, "T", n.dtype());
            shapes.push_back(n.shape());
            break;
          default: {  // special
            const special_op& s = n.special();
            if (n.result_count() > 0) attrs::write_type_attr(d, "dtype", n.dtype());
            for (int k = 0; k < n.result_count(); ++k) shapes.push_back(nodes[i + std::size_t(k)].shape());
            if (const auto* entry = special_op_entry<tensorboard_special_op>(s)) entry->describe(d, s);
            for (const auto& [label, sub] : s.subgraphs())
              attrs::write_function_attr(d, label_attr(label), add_function(*sub, n.name() + "_" + label));
            break;
          }
        }
        attrs::write_shapes_attr(d, "_output_shapes", shapes);
        if (effect) previous_effect = n.name();
      });
    }
  }

  // Adds `g` to the library as a function named after `base`; returns its name.
  std::string add_function(const graph& g, const std::string& base) {
    const std::string name = base + "_" + std::to_string(function_count_++);
    std::string def;
    proto::writer w(def);
    w.message(1, [&](proto::writer& signature) {  // FunctionDef.signature (OpDef)
      signature.string(1, name);
      for (int id : g.arguments())
        signature.message(2, [&](proto::writer& arg) {  // input_arg (ArgDef)
          arg.string(1, g.node_at(id).name());
          arg.varint(3, event_encoder::tensorflow_dtype(g.node_at(id).dtype()));
        });
      for (std::size_t k = 0; k < g.outputs().size(); ++k)
        signature.message(3, [&](proto::writer& arg) {  // output_arg
          arg.string(1, "output_" + std::to_string(k));
          arg.varint(3, event_encoder::tensorflow_dtype(g.node_at(g.outputs()[k]).dtype()));
        });
    });
    write_nodes(w, 3, g, true);  // FunctionDef.node_def (after the nested functions it adds)
    for (std::size_t k = 0; k < g.outputs().size(); ++k)
      w.message(4, [&](proto::writer& ret) {  // FunctionDef.ret (map<string, string>)
        ret.string(1, "output_" + std::to_string(k));
        ret.string(2, reference(g, g.outputs()[k], true));
      });
    proto::writer library(library_);
    library.bytes(1, def);  // FunctionDefLibrary.function
    return name;
  }

  std::string library_;
  int function_count_ = 0;
};

using graph_def_writer = basic_graph_def_writer<void>;

}  // namespace kiln::detail
// ----- end kiln/io/summary/graph_def.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_GRAPH_DEF_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_WRITER_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_WRITER_HPP
// ----- begin kiln/io/summary/writer.hpp -----
/// \file
/// An event file and its writer: what kiln::summary::create_file_writer makes.
///
/// As TensorFlow's summary file writer: the file is
/// `<logdir>/events.out.tfevents.<seconds>.<host>.<pid>.<n><suffix>` (n counts the
/// writers this process made, the suffix is `.v2` unless told otherwise), created with
/// the log directory when the writer is made, and it starts with the file_version
/// event. Events are framed as TFRecords into a queue in memory; the queue goes to the
/// file when it holds more than `max_queue` events, when `flush_millis` have passed
/// since the last flush (checked at each write), on flush(), when a default-writer
/// scope ends and when the last handle on the writer goes. A flush hands the bytes to
/// the operating system (fflush), which is what TensorBoard reads; unlike TensorFlow,
/// it does not wait for them to reach the disk (fsync), which costs milliseconds.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>

#include <unistd.h>

#ifndef KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_RECORD_HPP
#define KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_RECORD_HPP
// ----- begin kiln/io/summary/record.hpp -----
/// \file
/// TFRecord framing, as TensorFlow's event files use it: each record is its length
/// (uint64, little-endian), the masked CRC32C of those 8 bytes, the data, and the
/// masked CRC32C of the data (both uint32, little-endian). CRC32C is the Castagnoli
/// CRC (iSCSI's), computed by the processor where it can (SSE 4.2) and by Boost.CRC
/// otherwise; the mask rotates it and adds a constant, so
/// that a CRC over bytes that contain CRCs stays well distributed (TensorFlow's
/// `crc32c::Mask`).

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <boost/crc.hpp>
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace kiln::detail {

/// TFRecord framing and its checksums (`record_format`, the one specialization): a
/// template on nothing, so that a program compiles them only where it writes records.
template <class Unused>
struct basic_record_format {
  /// The CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected, initial and final xor
  /// 0xFFFFFFFF) of `data`, by Boost.CRC's table, a byte at a time.
  /// \code kiln::detail::record_format::crc32c_by_table("123456789") == 0xE3069283u \endcode
  static std::uint32_t crc32c_by_table(std::string_view data);

#if defined(__SSE4_2__)
  /// The same CRC by SSE 4.2's crc32 instruction, 8 bytes at a time: about ten times
  /// faster than the table, which took a fifth of a scalar summary's time.
  static std::uint32_t crc32c_by_instruction(std::string_view data);
#endif

  /// CRC32C of `data`: by the processor's instruction where the build has it (SSE 4.2),
  /// otherwise by Boost.CRC's table.
  /// \code kiln::detail::record_format::crc32c("123456789") == 0xE3069283u \endcode
  static std::uint32_t crc32c(std::string_view data);

  /// TensorFlow's masked CRC: the CRC rotated right by 15 bits, plus 0xA282EAD8.
  static std::uint32_t masked_crc32c(std::string_view data);

  /// Appends `data` to `out` as one TFRecord.
  /// \code
  /// std::string file;
  /// kiln::detail::record_format::append_record(file, "payload");  // 8 + 4 + 7 + 4 bytes
  /// \endcode
  static void append_record(std::string& out, std::string_view data);
};
using record_format = basic_record_format<void>;

template <class Unused>
std::uint32_t basic_record_format<Unused>::crc32c_by_table(std::string_view data) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

#if defined(__SSE4_2__)
template <class Unused>
std::uint32_t basic_record_format<Unused>::crc32c_by_instruction(std::string_view data) {
  std::uint64_t crc = 0xFFFFFFFFu;
  const char* p = data.data();
  std::size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    crc = _mm_crc32_u64(crc, word);
  }
  auto c = std::uint32_t(crc);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, static_cast<unsigned char>(*p));
  return ~c;
}
#endif

template <class Unused>
std::uint32_t basic_record_format<Unused>::crc32c(std::string_view data) {
#if defined(__SSE4_2__)
  return crc32c_by_instruction(data);
#else
  return crc32c_by_table(data);
#endif
}

template <class Unused>
std::uint32_t basic_record_format<Unused>::masked_crc32c(std::string_view data) {
  const std::uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

template <class Unused>
void basic_record_format<Unused>::append_record(std::string& out, std::string_view data) {
  char header[12];
  const std::uint64_t length = data.size();
  for (int k = 0; k < 8; ++k) header[k] = char((length >> (8 * k)) & 0xFF);
  const std::uint32_t length_crc = masked_crc32c(std::string_view(header, 8));
  for (int k = 0; k < 4; ++k) header[8 + k] = char((length_crc >> (8 * k)) & 0xFF);
  out.append(header, 12);
  out.append(data);
  const std::uint32_t data_crc = masked_crc32c(data);
  char footer[4];
  for (int k = 0; k < 4; ++k) footer[k] = char((data_crc >> (8 * k)) & 0xFF);
  out.append(footer, 4);
}

}  // namespace kiln::detail
// ----- end kiln/io/summary/record.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_RECORD_HPP

namespace kiln::summary {

/// How a writer names and flushes its event file, with tf.summary.create_file_writer's
/// arguments and defaults.
/// \code auto writer = kiln::summary::create_file_writer("logs", {.max_queue = 100}); \endcode
struct writer_options {
  int max_queue = 10;                             ///< events kept in memory before a flush
  std::chrono::milliseconds flush_millis{120000};  ///< longest time between flushes (checked at each write)
  std::string filename_suffix = ".v2";            ///< after the writer's number in the file name
};

}  // namespace kiln::summary

namespace kiln::detail {

/// The state every handle on a writer shares; it is the summary_target that
/// summary nodes write to while it is the default writer. (A template on nothing:
/// compiled only where a program makes a writer.)
template <class Unused = void>
class basic_event_file_writer final : public summary_target {
 public:
  basic_event_file_writer(const std::filesystem::path& logdir, summary::writer_options options)
      : logdir_(logdir), options_(std::move(options)) {
    write = [](summary_target& self, const summary_spec& spec, const tensor& value, std::int64_t step) {
      static_cast<basic_event_file_writer&>(self).write_summary(spec, value, step);
      return true;
    };
    write_graph = [](summary_target& self, std::string_view graph_def) {
      static_cast<basic_event_file_writer&>(self).write_graph_def(graph_def);
    };
    flush = [](summary_target& self) { static_cast<basic_event_file_writer&>(self).flush_file(); };
    std::error_code error;
    std::filesystem::create_directories(logdir_, error);
    if (error)
      throw invalid_argument_error("kiln::summary::create_file_writer: cannot create the directory " + logdir_.string() +
                                   ": " + error.message());
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
    static std::atomic<int> writers{0};
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%010lld",
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count()));
    path_ = logdir_ / ("events.out.tfevents." + std::string(seconds) + "." + host + "." + std::to_string(getpid()) +
                       "." + std::to_string(writers++) + options_.filename_suffix);
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) throw invalid_argument_error("kiln::summary::create_file_writer: cannot create " + path_.string());
    const double now = summary_wall_time();
    encoder::write_file_version_event(scratch_, now);
    basic_record_format<Unused>::append_record(queue_, scratch_);
    try {
      flush_locked(now);
    } catch (...) {  // (no destructor runs for an object whose constructor throws)
      std::fclose(file_);
      throw;
    }
  }
  basic_event_file_writer(const basic_event_file_writer&) = delete;
  basic_event_file_writer& operator=(const basic_event_file_writer&) = delete;
  ~basic_event_file_writer() {
    try {
      std::lock_guard lock(mutex_);
      flush_locked(summary_wall_time());
    } catch (...) {  // (a destructor does not throw; the file is closed below all the same)
    }
    std::fclose(file_);
  }

  const std::filesystem::path& logdir() const { return logdir_; }
  /// The event file.
  const std::filesystem::path& path() const { return path_; }

  /// Encodes and queues one summary (kiln::invalid_argument_error for a value that
  /// cannot be shown, before anything is queued).
  void write_summary(const summary_spec& spec, const tensor& value, std::int64_t step) {
    const double now = summary_wall_time();
    std::lock_guard lock(mutex_);
    scratch_.clear();
    encoder::write_summary_event(scratch_, now, step, spec, value);
    enqueue(now);
  }
  /// Queues an event holding the serialized GraphDef `graph_def`.
  void write_graph_def(std::string_view graph_def) {
    const double now = summary_wall_time();
    std::lock_guard lock(mutex_);
    scratch_.clear();
    encoder::write_graph_event(scratch_, now, graph_def);
    enqueue(now);
  }
  /// Writes the queued events to the file.
  void flush_file() {
    const double now = summary_wall_time();
    std::lock_guard lock(mutex_);
    flush_locked(now);
  }

 private:
  using encoder = basic_event_encoder<Unused>;

  // Seconds since 1970, to the microsecond (an event's wall_time).
  static double summary_wall_time();

  // Frames the event in scratch_ into the queue; flushes as TensorFlow's writer does,
  // timed by the clock the event's wall time was read from (`now`, in seconds).
  void enqueue(double now) {
    basic_record_format<Unused>::append_record(queue_, scratch_);
    ++queued_;
    if (queued_ > options_.max_queue || (now - last_flush_) * 1000 > double(options_.flush_millis.count()))
      flush_locked(now);
  }
  void flush_locked(double now) {
    last_flush_ = now;
    if (queue_.empty()) return;
    const bool ok = std::fwrite(queue_.data(), 1, queue_.size(), file_) == queue_.size() && std::fflush(file_) == 0;
    queue_.clear();
    queued_ = 0;
    if (!ok) throw invalid_argument_error("kiln::summary: cannot write to " + path_.string());
  }

  std::filesystem::path logdir_, path_;
  summary::writer_options options_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
  std::string scratch_;  // the event being written
  std::string queue_;    // framed events not yet in the file
  int queued_ = 0;
  double last_flush_ = 0;  // seconds, as summary_wall_time()
};
using event_file_writer = basic_event_file_writer<>;

template <class Unused>
double basic_event_file_writer<Unused>::summary_wall_time() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return double(std::chrono::duration_cast<std::chrono::microseconds>(now).count()) / 1e6;
}

}  // namespace kiln::detail
// ----- end kiln/io/summary/writer.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_IO_SUMMARY_WRITER_HPP

namespace kiln::summary {

/// A summary's step: a C++ integer, an int32 or int64 scalar tensor (which may be
/// symbolic inside a function), or a kiln::variable holding one, such as an optimizer's
/// `iterations()` (read when the summary runs).
/// \code
/// kiln::optimizers::sgd opt({.learning_rate = 0.1});
/// kiln::summary::step_value a = 3, b = kiln::constant(std::int64_t(4)), c = opt.iterations();
/// \endcode
class step_value {
 public:
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  step_value(I step) : value_(kiln::constant(static_cast<std::int64_t>(step))) {}
  step_value(const tensor& step) : value_(step) {}
  step_value(const variable& step) : value_(step.read_value()) {}
  const tensor& get() const { return value_; }

 private:
  tensor value_;
};

/// Options of kiln::summary::histogram, as tf.summary.histogram's arguments.
struct histogram_options {
  int buckets = 30;         ///< equal-width buckets between the least and greatest value (0: none)
  std::string description{};  ///< shown beside the plot (Markdown)
};

/// Options of kiln::summary::image, as tf.summary.image's arguments.
struct image_options {
  int max_outputs = 3;      ///< at most this many of the batch's images are written
  std::string description{};  ///< shown beside the images (Markdown)
};

namespace detail {
/// How the summary functions write (`summary_writes`, the one specialization): a
/// template on nothing, compiled only where a program writes summaries.
template <class Unused>
struct basic_summary_writes {
  // Records a summary node while tracing, or writes at once.
  static tensor write(kiln::detail::summary_spec spec, const tensor& value, const step_value& step);
};
using summary_writes = basic_summary_writes<void>;

template <class Unused>
tensor basic_summary_writes<Unused>::write(kiln::detail::summary_spec spec, const tensor& value,
                                           const step_value& step) {
  const tensor& s = step.get();
  if (!value.defined() || !s.defined())
    throw invalid_argument_error("kiln::summary: '" + spec.tag + "' was given an empty tensor as its " +
                                 (value.defined() ? "step" : "value"));
  if (kiln::detail::summary_failure f = kiln::detail::check_summary_inputs(spec, value.dtype(), value.shape(), s.dtype(), s.shape()))
    kiln::detail::throw_summary_failure(f, false);
  if (kiln::detail::trace_context* trace = kiln::detail::trace_context::current()) {
    const tensor inputs[] = {value, s};
    return trace->record_special(std::make_shared<kiln::detail::summary_op>(std::move(spec)), inputs,
                                 {{bool_, shape{}}})[0];
  }
  value.require_value("kiln::summary");
  s.require_value("kiln::summary");
  kiln::detail::summary_target* target = kiln::detail::default_summary_target();
  const bool written = target && target->write(*target, spec, value, kiln::detail::summary_step(s));
  return kiln::constant(written);
}
}  // namespace detail

/// Writes a scalar (any numeric dtype, written as float32) to the default writer, as
/// tf.summary.scalar; TensorBoard plots the values of one `name` against their steps.
/// Returns a bool scalar: true when written, false when there is no default writer.
/// A value or step of the wrong dtype raises kiln::type_error, of the wrong shape
/// kiln::value_error.
/// \code
/// kiln::summary::scalar("loss", 0.25, 10);
/// kiln::summary::scalar("accuracy", kiln::constant(0.5f), kiln::constant(10));
/// \endcode
template <class Unused = void>
tensor scalar(std::string_view name, const tensor& value, const step_value& step, std::string_view description = {}) {
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::scalar, std::string(name), std::string(description), 0}, value, step);
}
template <class T>
  requires std::is_arithmetic_v<T>
tensor scalar(std::string_view name, T value, const step_value& step, std::string_view description = {}) {
  return scalar(name, kiln::constant(value), step, description);
}

/// Writes the histogram of a tensor's values (any shape, any numeric dtype), as
/// tf.summary.histogram: `buckets` rows of (left edge, right edge, count), computed
/// as TensorBoard computes them, shown by its Histograms and Distributions dashboards.
/// A NaN or infinity among the values raises kiln::invalid_argument_error when written.
/// \code kiln::summary::histogram("weights", kiln::random::uniform({100}, -1, 1), 0, {.buckets = 10}); \endcode
template <class Unused = void>
tensor histogram(std::string_view name, const tensor& values, const step_value& step, histogram_options options = {}) {
  if (options.buckets < 0)
    throw value_error("kiln::summary::histogram '" + std::string(name) + "': buckets must be >= 0, got " +
                      std::to_string(options.buckets));
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::histogram, std::string(name), std::move(options.description), options.buckets},
      values, step);
}

/// Writes a string tensor as text, as tf.summary.text: a scalar is one paragraph
/// (Markdown), a vector or matrix a table.
/// \code kiln::summary::text("config", "learning rate: 0.01", 0); \endcode
template <class Unused = void>
tensor text(std::string_view name, const tensor& value, const step_value& step, std::string_view description = {}) {
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::text, std::string(name), std::string(description), 0}, value, step);
}
template <class = void>
tensor text(std::string_view name, std::string_view value, const step_value& step, std::string_view description = {}) {
  return text(name, kiln::constant(std::string(value)), step, description);
}

/// Writes images, as tf.summary.image: a rank-4 tensor (count, height, width,
/// channels; 1 channel: gray, 2: gray and alpha, 3: RGB, 4: RGBA), float32 or float64
/// in [0, 1] (scaled and clamped as tf.image.convert_image_dtype does) or int32 or
/// int64 in [0, 255] (kiln has no uint8; another value raises
/// kiln::invalid_argument_error when written); the first `max_outputs` images are
/// written as PNGs.
/// \code kiln::summary::image("samples", kiln::zeros({2, 28, 28, 1}), 0, {.max_outputs = 2}); \endcode
template <class Unused = void>
tensor image(std::string_view name, const tensor& images, const step_value& step, image_options options = {}) {
  if (options.max_outputs < 0)
    throw value_error("kiln::summary::image '" + std::string(name) + "': max_outputs must be >= 0, got " +
                      std::to_string(options.max_outputs));
  return detail::basic_summary_writes<Unused>::write(
      {kiln::detail::summary_kind::image, std::string(name), std::move(options.description), options.max_outputs},
      images, step);
}

/// Writes a graph to the default writer, for TensorBoard's graph view: its nodes,
/// ops, attributes and shapes, the branches and bodies of `cond` and `while` nodes
/// as functions of its library (kiln/io/summary/graph_def.hpp), as tf.summary.graph
/// and tf.summary.trace_export show a tf.function's graph. Returns false when there
/// is no default writer.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2 + 1; });
/// kiln::summary::graph(f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)));
/// \endcode
template <class Unused = void>
bool graph(const kiln::graph& g) {
  kiln::detail::summary_target* target = kiln::detail::default_summary_target();
  if (!target) return false;
  target->write_graph(*target, kiln::detail::basic_graph_def_writer<Unused>::graph_def_of(g));
  return true;
}
/// The graph of a concrete function (of either tier).
template <class Function>
  requires requires(const Function& f) { f.graph(); }
bool graph(const Function& f) {
  return graph(kiln::graph(f.graph()));
}

class file_writer;
template <class = void>
file_writer create_file_writer(const std::filesystem::path& logdir, writer_options options = {});

/// While it lives, its writer is the default writer of the thread that made it (as
/// `with writer.as_default():`); then the one before is again, and the writer is
/// flushed. It cannot be copied or moved, so scopes end in the reverse order of their
/// start, on their thread.
class default_writer_scope {
 public:
  default_writer_scope(const default_writer_scope&) = delete;
  default_writer_scope& operator=(const default_writer_scope&) = delete;
  ~default_writer_scope() {
    kiln::detail::default_summary_target() = previous_;
    try {
      writer_->flush_file();
    } catch (...) {  // (a destructor does not throw; flush() reports a failed write)
    }
  }

 private:
  friend class file_writer;
template <class = void>
file_writer create_file_writer(const std::filesystem::path& logdir, writer_options options = {});
  explicit default_writer_scope(std::shared_ptr<kiln::detail::event_file_writer> w)
      : writer_(std::move(w)), previous_(kiln::detail::default_summary_target()) {
    kiln::detail::default_summary_target() = writer_.get();
  }
  std::shared_ptr<kiln::detail::event_file_writer> writer_;
  kiln::detail::summary_target* previous_;
};

/// A writer of one event file in a log directory (tf.summary.SummaryWriter). Copies
/// share the file; the last one to go flushes and closes it.
/// \code
/// kiln::summary::file_writer writer = kiln::summary::create_file_writer("logs");
/// {
///   auto scope = writer.as_default();
///   kiln::summary::scalar("x", 1, 0);
/// }
/// writer.flush();
/// \endcode
class file_writer {
 public:
  /// Makes this the default writer of this thread until the returned scope ends.
  [[nodiscard]] default_writer_scope as_default() const { return default_writer_scope(state_); }
  /// Writes the queued events to the file.
  void flush() const { state_->flush_file(); }
  /// The log directory, and the event file in it.
  const std::filesystem::path& logdir() const { return state_->logdir(); }
  const std::filesystem::path& path() const { return state_->path(); }

 private:
  template <class>
  friend file_writer create_file_writer(const std::filesystem::path&, writer_options);
  explicit file_writer(std::shared_ptr<kiln::detail::event_file_writer> s) : state_(std::move(s)) {}
  std::shared_ptr<kiln::detail::event_file_writer> state_;
};

/// A writer of a new event file in `logdir` (created if missing), as
/// tf.summary.create_file_writer; a directory or file that cannot be created raises
/// kiln::invalid_argument_error.
/// \code auto writer = kiln::summary::create_file_writer("logs/train"); \endcode
template <class>
file_writer create_file_writer(const std::filesystem::path& logdir, writer_options options) {
  return file_writer(std::make_shared<kiln::detail::event_file_writer>(logdir, std::move(options)));
}

/// Writes the default writer's queued events to its file (tf.summary.flush); false
/// when there is no default writer.
/// \code kiln::summary::flush(); \endcode
template <class = void>
bool flush() {
  kiln::detail::summary_target* target = kiln::detail::default_summary_target();
  if (target) target->flush(*target);
  return target != nullptr;
}

}  // namespace kiln::summary

namespace kiln::detail {
/// How code below this header (a training loop given a log directory) opens a writer
/// (declared in kiln/exec/summary_op.hpp).
template <class T>
struct summary_file_opener {
  static std::shared_ptr<summary_target> open(const std::filesystem::path& logdir) {
    return std::make_shared<event_file_writer>(logdir, summary::writer_options{});
  }
  /// kiln::fit's log: the values of `logs` named with `prefix` (none, or "val_") as
  /// `epoch_<name>` scalars at the epoch's index, Keras' TensorBoard callback's tags.
  template <class Logs>
  static void write_epoch_logs(summary_target& target, const Logs& logs, std::string_view prefix) {
    std::vector<std::pair<std::string, double>> values;
    for (const auto& [name, v] : logs.values)
      if (name.starts_with("val_") == !prefix.empty()) values.emplace_back("epoch_" + name.substr(prefix.size()), v);
    write_scalar_summaries(values, logs.epoch, &target);
  }
};
}  // namespace kiln::detail
// ----- end kiln/summary.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_SUMMARY_HPP

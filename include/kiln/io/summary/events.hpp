#pragma once
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

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/exec/summary_op.hpp"
#include "kiln/io/summary/png.hpp"
#include "kiln/io/summary/protobuf.hpp"

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

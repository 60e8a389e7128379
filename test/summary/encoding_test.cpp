// What kiln::summary writes, byte by byte: CRC32C against the iSCSI specification's
// vectors and a bit-by-bit CRC, TFRecord framing and Event protocol buffers against
// what TensorFlow 2.12 writes (tensorflow_fixtures.hpp, made by make_fixtures.py),
// histogram buckets and image pixels against TensorFlow's, PNGs read back by a reader
// written from the PNG and zlib specifications, and graphs as GraphDefs.

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <kiln/summary.hpp>
#include <limits>
#include <string>
#include <vector>

#include "../support/op_check.hpp"
#include "tensorflow_fixtures.hpp"
#include "../support/event_reader.hpp"

namespace {

namespace fixtures = kiln_test::tensorflow_fixtures;
using kiln::testing::require_throws;
using kiln_test::message;

std::string hex(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

kiln::detail::summary_spec spec(kiln::detail::summary_kind kind, std::string tag, int parameter = 0,
                                std::string description = {}) {
  return {kind, std::move(tag), std::move(description), parameter};
}

// The Event kiln writes for one summary, at wall time 1.5 as the fixtures are.
std::string event_of(const kiln::detail::summary_spec& s, const kiln::tensor& value, std::int64_t step) {
  std::string out;
  kiln::detail::event_encoder::write_summary_event(out, 1.5, step, s, value);
  return out;
}

// The TensorProto of an Event's one summary value.
message tensor_of(std::string_view event) { return message::parse(event).sub(5).sub(1).sub(8); }

std::vector<double> doubles_of(const std::string& bytes) {
  std::vector<double> out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), out.size() * 8);
  return out;
}

TEST_CASE("CRC32C gives the iSCSI specification's check values") {
  // Each way this build computes it: Boost.CRC's table, and the processor's
  // instruction where the build has it (which crc32c() then uses).
  std::vector<std::uint32_t (*)(std::string_view)> ways = {kiln::detail::record_format::crc32c_by_table, kiln::detail::record_format::crc32c};
#if defined(__SSE4_2__)
  ways.push_back(kiln::detail::record_format::crc32c_by_instruction);
#endif
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending += char(i);
    descending += char(31 - i);
  }
  for (auto crc32c : ways) {
    // RFC 3720, appendix B.4, and the common check value of "123456789".
    CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
    CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
    CHECK(crc32c(ascending) == 0x46DD794Eu);
    CHECK(crc32c(descending) == 0x113FDB5Cu);
    CHECK(crc32c("123456789") == 0xE3069283u);
    CHECK(crc32c("") == 0u);
    // Any length, content and alignment, against the bit-by-bit definition.
    std::string data;
    for (int n = 0; n < 300; ++n) {
      const std::string_view part = std::string_view(data).substr(std::size_t(n % 7));
      CHECK(crc32c(data) == kiln_test::reference_crc32c(data));
      CHECK(crc32c(part) == kiln_test::reference_crc32c(part));
      data += char((n * 131 + 7) & 0xFF);
    }
  }
  std::string data;
  for (int n = 0; n < 40; ++n, data += char(n * 37))
    CHECK(kiln::detail::record_format::masked_crc32c(data) == kiln_test::reference_masked_crc32c(data));
}

TEST_CASE("TFRecord framing matches the first record of TensorFlow's event file") {
  const std::string_view tf = fixtures::first_record;
  const std::string_view payload = tf.substr(12, tf.size() - 16);
  std::string framed;
  kiln::detail::record_format::append_record(framed, payload);
  CHECK(hex(framed) == hex(tf));
  // An empty record: the length 0 and the CRCs of 8 zero bytes and of nothing.
  std::string empty;
  kiln::detail::record_format::append_record(empty, "");
  REQUIRE(empty.size() == 16);
  CHECK(kiln_test::read_records(empty) == std::vector<std::string>{""});
}

TEST_CASE("the protocol-buffer encoder writes varints, fixed numbers and nested messages") {
  std::string out;
  kiln::detail::proto::writer w(out);
  w.varint(1, 150);  // the protobuf documentation's example: 08 96 01
  CHECK(hex(out) == "089601");
  out.clear();
  w.varint(2, -1);  // int64 -1: ten bytes
  CHECK(hex(out) == "10ffffffffffffffffff01");
  out.clear();
  w.varint(16, 1);  // field 16: a two-byte tag
  CHECK(hex(out) == "800101");
  out.clear();
  w.float64(1, 1.5);
  w.float32(2, -2.f);
  CHECK(hex(out) == "09000000000000f83f15000000c0");
  out.clear();
  w.string(3, "hi");
  CHECK(hex(out) == "1a026869");
  out.clear();
  // A nested message longer than 127 bytes has a two-byte length.
  w.message(4, [](kiln::detail::proto::writer& m) { m.bytes(1, std::string(200, 'x')); });
  CHECK(hex(out.substr(0, 6)) == "22cb010ac801");
  CHECK(out.size() == 3 + 3 + 200);
  out.clear();
  w.message(5, [](kiln::detail::proto::writer&) {});  // empty: tag and length 0
  CHECK(hex(out) == "2a00");
}

TEST_CASE("scalar and text events are TensorFlow's bytes") {
  using kind = kiln::detail::summary_kind;
  CHECK(hex(event_of(spec(kind::scalar, "loss"), kiln::constant(0.5f), 3)) == hex(fixtures::scalar_float));
  CHECK(hex(event_of(spec(kind::scalar, "loss"), kiln::constant(2), 4)) == hex(fixtures::scalar_int32));
  CHECK(hex(event_of(spec(kind::scalar, "a/b"), kiln::constant(-1.25), -7)) == hex(fixtures::scalar_float64_negative));
  CHECK(hex(event_of(spec(kind::scalar, "lr", 0, "the rate"), kiln::constant(1e-3), 12345678901)) ==
        hex(fixtures::scalar_described));
  CHECK(hex(event_of(spec(kind::text, "note"), kiln::constant("hello"), 2)) == hex(fixtures::text_scalar));
  const kiln::tensor table = kiln::constant(std::vector<std::string>{"a", "bc", "", "d\xc3\xa9"
                                                                                  "f"},
                                            kiln::shape{2, 2});
  CHECK(hex(event_of(spec(kind::text, "table"), table, 0)) == hex(fixtures::text_matrix));
}

TEST_CASE("a float64 scalar beyond float32's range is an infinity, as TensorFlow's cast makes it") {
  using kind = kiln::detail::summary_kind;
  auto written = [](double v) {
    float f;
    std::memcpy(&f, tensor_of(event_of(spec(kind::scalar, "s"), kiln::constant(v), 0)).one(4).bytes.data(), 4);
    return f;
  };
  const double largest = std::numeric_limits<float>::max();
  CHECK(written(1e300) == std::numeric_limits<float>::infinity());
  CHECK(written(-1e300) == -std::numeric_limits<float>::infinity());
  CHECK(written(largest) == std::numeric_limits<float>::max());
  CHECK(written(largest + 0x1p102) == std::numeric_limits<float>::max());  // less than half an ulp past: rounds back
  CHECK(written(largest + 0x1p103) == std::numeric_limits<float>::infinity());  // half an ulp: to even, infinity
  CHECK(std::isnan(written(NAN)));
  CHECK(written(0.1) == 0.1f);
}

TEST_CASE("histogram buckets are TensorFlow's") {
  struct input {
    const fixtures::histogram_case* expected;
    kiln::tensor values;
  };
  auto floats = [](const std::vector<double>& v, kiln::shape s) {
    return kiln::constant(std::vector<float>(v.begin(), v.end()), s);
  };
  auto ints = [](const std::vector<double>& v, kiln::shape s) {
    return kiln::constant(std::vector<std::int32_t>(v.begin(), v.end()), s);
  };
  const std::vector<input> inputs = {
      {&fixtures::histogram_four, floats(fixtures::histogram_four.values, {4})},
      {&fixtures::histogram_single_value, floats(fixtures::histogram_single_value.values, {2})},
      {&fixtures::histogram_empty, floats({}, {0})},
      {&fixtures::histogram_normal, floats(fixtures::histogram_normal.values, {100})},
      {&fixtures::histogram_integers, ints(fixtures::histogram_integers.values, {7, 9})},
  };
  for (const input& in : inputs) {
    const auto& expected = *in.expected;
    const std::string event = event_of(spec(kiln::detail::summary_kind::histogram, "h", expected.buckets), in.values, 1);
    const message t = tensor_of(event);
    CHECK(t.one(1).value == 2);  // DT_DOUBLE
    const auto dims = t.sub(2).all(2);
    REQUIRE(dims.size() == 2);
    CHECK(message::parse(dims[0].bytes).one(1).value == std::uint64_t(expected.buckets));
    CHECK(message::parse(dims[1].bytes).one(1).value == 3);
    const std::vector<double> table = doubles_of(t.one(4).bytes);
    REQUIRE(table.size() == expected.table.size());
    for (std::size_t k = 0; k < table.size(); ++k) {
      INFO("entry " << k << " of " << table.size());
      if (k % 3 == 2)
        CHECK(table[k] == expected.table[k]);  // counts, exactly
      else
        CHECK(table[k] == Approx(expected.table[k]).epsilon(1e-14).margin(1e-300));  // edges: 1 ulp of rounding
    }
    // Everything but the table is TensorFlow's metadata.
    CHECK(hex(message::parse(event).sub(5).sub(1).one(9).bytes) == "0a0c0a0a686973746f6772616d73");
  }
  // A range beyond double's: every value in the first bucket, no undefined conversion.
  const message huge = tensor_of(event_of(spec(kiln::detail::summary_kind::histogram, "h", 3), kiln::constant({-1e308, 1e308}), 1));
  const std::vector<double> huge_table = doubles_of(huge.one(4).bytes);
  CHECK(huge_table[2] + huge_table[5] + huge_table[8] == 2);
  // No buckets: an empty table, as TensorFlow's for buckets=0.
  const message none = tensor_of(event_of(spec(kiln::detail::summary_kind::histogram, "h", 0), kiln::ones({3}), 1));
  CHECK_FALSE(none.has(4));
  require_throws<kiln::invalid_argument_error>(
      [] { return event_of(spec(kiln::detail::summary_kind::histogram, "w", 30), kiln::constant({1.f, NAN}), 1); },
      {"histogram 'w'", "NaN"});
  require_throws<kiln::invalid_argument_error>(
      [] { return event_of(spec(kiln::detail::summary_kind::histogram, "w", 30), kiln::constant({INFINITY, 1.f}), 1); },
      {"histogram 'w'", "infinity"});
}

TEST_CASE("an image event holds TensorFlow's width, height and pixels, as a PNG") {
  const kiln::tensor images =
      kiln::constant(std::vector<float>(fixtures::image_input.begin(), fixtures::image_input.end()), {1, 2, 2, 3});
  const std::string event = event_of(spec(kiln::detail::summary_kind::image, "img", 3), images, 5);
  const message mine = message::parse(event), theirs = message::parse(fixtures::image_without_png);
  CHECK(mine.one(1).as_double() == theirs.one(1).as_double());
  CHECK(mine.one(2).value == theirs.one(2).value);
  const message value = mine.sub(5).sub(1), their_value = theirs.sub(5).sub(1);
  CHECK(value.one(1).bytes == their_value.one(1).bytes);  // tag
  CHECK(hex(value.one(9).bytes) == hex(their_value.one(9).bytes));  // metadata: the images plugin
  const message t = value.sub(8), their_t = their_value.sub(8);
  CHECK(t.one(1).value == their_t.one(1).value);  // DT_STRING
  CHECK(hex(t.one(2).bytes) == hex(their_t.one(2).bytes));  // shape (3,)
  const auto strings = t.all(8);
  REQUIRE(strings.size() == 3);
  CHECK(strings[0].bytes == fixtures::image_width);
  CHECK(strings[1].bytes == fixtures::image_height);
  const kiln_test::png_image png = kiln_test::read_png(strings[2].bytes);
  CHECK(png.width == 2);
  CHECK(png.height == 2);
  CHECK(png.color_type == 2);  // RGB
  CHECK(std::vector<double>(png.samples.begin(), png.samples.end()) == fixtures::image_pixels);
}

TEST_CASE("images: gray, gray and alpha, RGBA, integers, max_outputs, and large images in several blocks") {
  using kind = kiln::detail::summary_kind;
  auto pngs_of = [](const kiln::tensor& images, int max_outputs) {
    const message t = tensor_of(event_of(spec(kind::image, "i", max_outputs), images, 0));
    std::vector<kiln_test::png_image> out;
    const auto strings = t.all(8);
    for (std::size_t k = 2; k < strings.size(); ++k) out.push_back(kiln_test::read_png(strings[k].bytes));
    return out;
  };
  // Two int32 gray images of 2x3, written as they are.
  const std::vector<std::int32_t> gray = {0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255};
  const auto two = pngs_of(kiln::constant(gray, {2, 2, 3, 1}), 3);
  REQUIRE(two.size() == 2);
  CHECK(two[0].color_type == 0);
  CHECK(two[0].width == 3);
  CHECK(two[0].height == 2);
  CHECK(two[0].samples == std::vector<std::uint8_t>{0, 1, 2, 3, 4, 5});
  CHECK(two[1].samples == std::vector<std::uint8_t>{250, 251, 252, 253, 254, 255});
  CHECK(pngs_of(kiln::constant(gray, {2, 2, 3, 1}), 1).size() == 1);  // max_outputs
  CHECK(pngs_of(kiln::constant(gray, {2, 2, 3, 1}), 0).empty());
  // int64 gray and alpha, float64 RGBA: 0.5 * 255.5 = 127.75 -> 127, 1 -> 255.
  CHECK(pngs_of(kiln::constant(std::vector<std::int64_t>{7, 8}, {1, 1, 1, 2}), 3)[0].color_type == 4);
  const auto rgba = pngs_of(kiln::constant(std::vector<double>{0.5, 1.0, 0.0, 0.25}, {1, 1, 1, 4}), 3);
  CHECK(rgba[0].color_type == 6);
  CHECK(rgba[0].samples == std::vector<std::uint8_t>{127, 255, 0, 63});
  // 120,000 bytes of pixels: two stored blocks.
  std::vector<std::int32_t> big(200 * 200 * 3);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::int32_t((i * 7) % 256);
  const auto large = pngs_of(kiln::constant(big, {1, 200, 200, 3}), 1);
  REQUIRE(large.size() == 1);
  CHECK(large[0].width == 200);
  CHECK(std::vector<std::int32_t>(large[0].samples.begin(), large[0].samples.end()) == big);
  require_throws<kiln::invalid_argument_error>(
      [] { return event_of(spec(kind::image, "bad", 3), kiln::constant(std::vector<std::int32_t>{0, 256}, {1, 1, 2, 1}), 0); },
      {"image 'bad'", "256", "[0, 255]"});
  require_throws<kiln::invalid_argument_error>(
      [] { return event_of(spec(kind::image, "bad", 3), kiln::constant(std::vector<std::int32_t>{-1}, {1, 1, 1, 1}), 0); },
      {"image 'bad'", "-1"});
}

#if KILN_HAS_THRUST
TEST_CASE("a summary of a tensor on the GPU writes what the same tensor on the CPU writes") {
  using kind = kiln::detail::summary_kind;
  const std::vector<std::pair<kiln::detail::summary_spec, kiln::tensor>> cases = {
      {spec(kind::scalar, "s"), kiln::constant(2.5)},
      {spec(kind::histogram, "h", 4), kiln::constant({1.f, 2.f, 2.f, 5.f})},
      {spec(kind::text, "t"), kiln::constant("on the host: strings never live on the GPU")},
      {spec(kind::image, "i", 3), kiln::constant(std::vector<float>{0.f, 0.5f, 1.f, 0.25f}, {1, 2, 2, 1})},
  };
  for (const auto& [s, value] : cases) {
    INFO(s.tag);
    const kiln::tensor there = value.dtype() == kiln::string ? value : value.to(kiln::device::gpu);
    CHECK(hex(event_of(s, there, 3)) == hex(event_of(s, value, 3)));
  }
  // The step may live there too.
  CHECK(kiln::detail::summary_step(kiln::constant(std::int64_t(7)).to(kiln::device::gpu)) == 7);
}
#endif

TEST_CASE("a graph becomes a GraphDef: nodes, inputs, attributes, and control flow as library functions") {
  kiln::variable v(kiln::constant(2.f), "v");
  kiln::function f([&](const kiln::tensor& x) {
    const kiln::tensor y = kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x * v; }, [&] { return -x; });
    const auto [i, z] = kiln::while_loop([](const kiln::tensor& i, const kiln::tensor&) { return i < 3; },
                                         [](const kiln::tensor& i, const kiln::tensor& z) {
                                           return std::tuple{i + 1, z * 2.f};
                                         },
                                         kiln::constant(0), y);
    v.assign_add(kiln::constant(1.f));
    kiln::print("z:", z);
    return z + kiln::cast(i, kiln::float32);
  });
  const kiln::graph g = f.get_concrete_function(kiln::tensor_spec({kiln::none, 2}, kiln::float32)).graph();
  const message def = message::parse(kiln::detail::graph_def_writer::graph_def_of(g));
  std::vector<message> nodes;
  for (const auto& n : def.all(1)) nodes.push_back(message::parse(n.bytes));
  // Every node but the loop's second result, which is `while:1` to its readers.
  std::size_t results = 0;
  for (const kiln::node& n : g.nodes()) results += n.kind() == kiln::node_kind::result;
  REQUIRE(results == 1);
  REQUIRE(nodes.size() == g.nodes().size() - 1);
  auto find = [&](std::string_view op) -> const message& {
    for (const message& n : nodes)
      if (n.one(2).bytes == op) return n;
    FAIL("no " << op << " node");
    return nodes[0];
  };
  auto attr = [](const message& n, std::string_view key) {
    for (const auto& entry : n.all(5)) {
      const message e = message::parse(entry.bytes);
      if (e.one(1).bytes == key) return e.sub(2);
    }
    throw std::runtime_error("no attribute " + std::string(key));
  };
  const message& x = find("Placeholder");
  CHECK(x.one(1).bytes == "x0");
  CHECK(attr(x, "dtype").one(6).value == 1);  // DT_FLOAT
  const message shape = attr(x, "shape").sub(7);
  CHECK(message::parse(shape.all(2)[0].bytes).one(1).as_int() == -1);  // None
  CHECK(message::parse(shape.all(2)[1].bytes).one(1).as_int() == 2);
  // The cond names its branches, the loop its condition and body: library functions.
  const message& c = find("cond");
  const std::string then_name = attr(c, "then_branch").sub(10).one(1).bytes;
  const std::string else_name = attr(c, "else_branch").sub(10).one(1).bytes;
  const message& w = find("while");
  const std::string cond_name = attr(w, "cond").sub(10).one(1).bytes;
  const std::string body_name = attr(w, "body").sub(10).one(1).bytes;
  std::vector<std::string> functions;
  for (const auto& fn : def.sub(2).all(1)) functions.push_back(message::parse(fn.bytes).sub(1).one(1).bytes);
  CHECK(functions.size() == 4);
  for (const std::string& name : {then_name, else_name, cond_name, body_name})
    CHECK(std::count(functions.begin(), functions.end(), name) == 1);
  // The loop's two results: `while` and `while:1`; the cast reads the first, the
  // output's add the second (the loop's variables are i, then z).
  CHECK(find("cast").one(3).bytes == "while");
  bool reads_second = false;
  for (const message& n : nodes)
    for (const auto& in : n.all(3)) reads_second = reads_second || in.bytes == "while:1";
  CHECK(reads_second);
  // Effects in program order: the print after the assignment.
  const auto print_inputs = find("PrintV2").all(3);
  CHECK(print_inputs.back().bytes == "^" + find("AssignAddVariableOp").one(1).bytes);
  CHECK(attr(find("AssignAddVariableOp"), "shared_name").one(2).bytes == "v");
  // A function body names its nodes' outputs `node:output:k`, its arguments by name.
  for (const auto& fn : def.sub(2).all(1)) {
    const message function = message::parse(fn.bytes);
    if (function.sub(1).one(1).bytes != body_name) continue;
    const auto args = function.sub(1).all(2);
    CHECK(args.size() == 2);
    for (const auto& node : function.all(3))
      for (const auto& in : message::parse(node.bytes).all(3))
        CHECK((in.bytes.find(":output:") != std::string::npos || in.bytes.rfind("^", 0) == 0 ||
               in.bytes == message::parse(args[0].bytes).one(1).bytes ||
               in.bytes == message::parse(args[1].bytes).one(1).bytes));
    CHECK(function.all(4).size() == 2);  // ret: the next i and z
  }
}

TEST_CASE("a GraphDef holds an op's float attribute as AttrValue's float") {
  kiln::function f([](const kiln::tensor& x) { return kiln::leaky_relu(x, 0.25); });
  const kiln::graph g = f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)).graph();
  const message def = message::parse(kiln::detail::graph_def_writer::graph_def_of(g));
  bool found = false;
  for (const auto& n : def.all(1)) {
    const message node = message::parse(n.bytes);
    if (node.one(2).bytes != "leaky_relu") continue;
    for (const auto& entry : node.all(5)) {
      const message e = message::parse(entry.bytes);
      if (e.one(1).bytes != "alpha") continue;
      found = true;
      const std::uint32_t bits = std::uint32_t(e.sub(2).one(4).value);  // AttrValue.f: a float, fixed32
      CHECK(std::bit_cast<float>(bits) == 0.25f);
    }
  }
  CHECK(found);
}

// The string attribute `key` of the first node of op `op` in GraphDef `def`, or "(none)".
std::string text_attribute(const message& def, std::string_view op, std::string_view key) {
  for (const auto& n : def.all(1)) {
    const message node = message::parse(n.bytes);
    if (node.one(2).bytes != op) continue;
    for (const auto& entry : node.all(5)) {
      const message e = message::parse(entry.bytes);
      if (e.one(1).bytes == key) return e.sub(2).one(2).bytes;  // AttrValue.s
    }
    return "(none)";
  }
  return "(no " + std::string(op) + " node)";
}

TEST_CASE("a GraphDef shows the variable of a typed trace's variable steps, as the runtime tier's") {
  kiln::fixed_variable<float, 2> total(kiln::fixed<float, 2>::ones(), "total");
  kiln::function accumulate([&](const auto& x) {
    total.assign(total.read_value() + x);
    return total.read_value();
  });
  const kiln::graph g = accumulate.get_concrete_function(kiln::spec<float, 2>{}).graph();
  const message def = message::parse(kiln::detail::graph_def_writer::graph_def_of(g));
  CHECK(text_attribute(def, "ReadVariableOp", "shared_name") == "total");
  CHECK(text_attribute(def, "AssignVariableOp", "shared_name") == "total");
}

TEST_CASE("a GraphDef shows the elements a dataset loop or an iterator was traced for") {
  using kiln::data::dataset;
  kiln::function total([] {
    return dataset::range(4).reduce(kiln::constant(std::int64_t(0)),
                                    [](const kiln::tensor& s, const kiln::tensor& x) { return s + x; });
  });
  const message reduce_def = message::parse(kiln::detail::graph_def_writer::graph_def_of(total.get_concrete_function().graph()));
  CHECK(text_attribute(reduce_def, "ReduceDataset", "element_spec") == "(int64 ())");
  kiln::function next([](const kiln::data::iterator& it) { return it.get_next()[0]; });
  const kiln::data::iterator it =
      dataset::from_tensor_slices(std::tuple{kiln::ones({3, 2}), kiln::constant({1, 2, 3})}).make_iterator();
  const message next_def = message::parse(kiln::detail::graph_def_writer::graph_def_of(next.get_concrete_function(it).graph()));
  CHECK(text_attribute(next_def, "IteratorGetNext", "element_spec") == "(float32 (2,), int32 ())");
}

}  // namespace

// Saved functions (kiln/saved_function.hpp): a concrete function written to a file and
// loaded without its callable computes the same bits, keeps its variables, control
// flow, prints and summaries; a damaged, newer or inconsistent file raises a kiln error naming
// the file and the problem.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <kiln/saved_function.hpp>
#include <kiln/summary.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../support/event_reader.hpp"
#include "../support/op_check.hpp"

namespace {

using kiln::testing::require_throws;

// A file in the system's temporary directory, removed when the test ends.
class temporary_file {
 public:
  explicit temporary_file(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("kiln_" + std::to_string(::getpid()) + "_" + name)) {}
  ~temporary_file() { std::filesystem::remove(path_); }
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

std::vector<std::uint8_t> bytes_of(const std::filesystem::path& p) {
  std::ifstream is(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::filesystem::path& p, const std::vector<std::uint8_t>& b) {
  std::ofstream os(p, std::ios::binary | std::ios::trunc);
  os.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Bit for bit: a loaded function runs the same ops through the same optimizer and executor.
void require_identical(const kiln::tensor& a, const kiln::tensor& b) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  if (a.dtype() == kiln::string) {
    REQUIRE(a.to_vector<std::string>() == b.to_vector<std::string>());
    return;
  }
  const auto bytes = std::size_t(a.size()) * kiln::size_of(a.dtype());
  REQUIRE(std::memcmp(a.raw_data(), b.raw_data(), bytes) == 0);
}

// A saved file's parts: its header (CBOR) and the tensors' bytes after it
// (docs/saved_function_format.md).
struct saved_parts {
  nlohmann::json header;
  std::vector<std::uint8_t> data;
};
saved_parts parts_of(const std::filesystem::path& p) {
  const std::vector<std::uint8_t> bytes = bytes_of(p);
  std::uint64_t head = 0;
  for (int k = 0; k < 8; ++k) head |= std::uint64_t(bytes[std::size_t(8 + k)]) << (8 * k);
  return {nlohmann::json::from_cbor(bytes.begin() + 16, bytes.begin() + 16 + std::ptrdiff_t(head)),
          std::vector<std::uint8_t>(bytes.begin() + 16 + std::ptrdiff_t(head), bytes.end())};
}
void write_parts(const std::filesystem::path& p, const saved_parts& parts) {
  const std::vector<std::uint8_t> head = nlohmann::json::to_cbor(parts.header);
  std::vector<std::uint8_t> bytes{'K', 'I', 'L', 'N', 'S', 'A', 'V', 'E'};
  for (int k = 0; k < 8; ++k) bytes.push_back(std::uint8_t(std::uint64_t(head.size()) >> (8 * k)));
  bytes.insert(bytes.end(), head.begin(), head.end());
  bytes.insert(bytes.end(), parts.data.begin(), parts.data.end());
  write_bytes(p, bytes);
}

// The model of a saved file, edited by `edit`, written back with a good checksum: how
// the tests make files that are well-formed but say something wrong.
void edit_model(const std::filesystem::path& p, const std::function<void(nlohmann::json&)>& edit) {
  saved_parts parts = parts_of(p);
  nlohmann::json model = nlohmann::json::from_cbor(parts.header["model"].get_binary());
  edit(model);
  std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(model);
  parts.header["checksum"] = kiln::detail::saved_checksum({bytes, parts.data});
  parts.header["model"] = nlohmann::json::binary(std::move(bytes));
  write_parts(p, parts);
}

kiln::tensor floats(std::initializer_list<float> v, kiln::shape s) {
  return kiln::reshape(kiln::constant(std::vector<float>(v)), s);
}

TEST_CASE("a loaded function computes the saved function's bits, with ops that have attributes") {
  const kiln::tensor w = kiln::random::uniform({4, 3}, -1.f, 1.f, kiln::float32, 7);
  kiln::function model([&](const kiln::tensor& x, const kiln::tensor& ids) {
    kiln::tensor h = kiln::tanh(kiln::matmul(x, w) * 0.5f + 1.f);
    kiln::tensor t = kiln::transpose(kiln::concat({h, h * 2.f}, 1), {1, 0});
    kiln::tensor s = kiln::reduce_sum(t, 1, true) + kiln::reduce_max(kiln::slice(t, {0, 0}, {2, -1}));
    kiln::tensor g = kiln::gather(kiln::reshape(s, {-1}), ids);
    return std::tuple{kiln::cast(g, kiln::float64), kiln::argmax(t, 0), kiln::stack({g, g}, 1)};
  });
  const kiln::tensor x = kiln::random::uniform({5, 4}, -2.f, 2.f, kiln::float32, 11);
  const kiln::tensor ids = kiln::constant(std::vector<std::int32_t>{0, 5, 2});
  temporary_file file("attributes.kiln");
  kiln::save(model, file.path(),
             std::tuple{kiln::tensor_spec({kiln::none, 4}, kiln::float32), kiln::tensor_spec({3}, kiln::int32)});

  const kiln::loaded_function loaded = kiln::load(file.path());
  for (int rows : {1, 5, 9}) {
    const kiln::tensor xs = kiln::random::uniform({rows, 4}, -2.f, 2.f, kiln::float32, rows);
    const auto [a, b, c] = model(xs, ids);
    const std::vector<kiln::tensor> got = loaded.call_flat(xs, ids);
    REQUIRE(got.size() == 3);
    require_identical(got[0], a);
    require_identical(got[1], b);
    require_identical(got[2], c);
  }
  (void)x;
}

TEST_CASE("a loaded function prints its signatures in the seeds' format and rejects arguments none accepts") {
  kiln::function twice([](const kiln::tensor& a) { return a + a; });
  temporary_file file("signatures.kiln");
  kiln::save(twice, file.path(), kiln::tensor_spec({kiln::none}, kiln::int32), kiln::tensor_spec({}, kiln::float32));
  const kiln::loaded_function loaded = kiln::load(file.path());
  CHECK(loaded.pretty_printed_concrete_signatures() == twice.pretty_printed_concrete_signatures());
  CHECK(loaded.pretty_printed_concrete_signatures().find("x0: int32 Tensor, shape=(None,)") != std::string::npos);
  require_identical(loaded(kiln::constant(std::vector<std::int32_t>{1, 2, 3})),
                    kiln::constant(std::vector<std::int32_t>{2, 4, 6}));
  require_identical(loaded(kiln::constant(1.5f)), kiln::constant(3.f));
  require_throws<kiln::invalid_argument_error>(
      [&] { return loaded(kiln::constant(1.0)); },
      {"no saved signature accepts (float64 ()", "x0: float32 Tensor, shape=()"});
}

TEST_CASE("a loaded function's variables keep their saved values, and it reads and writes them") {
  kiln::variable total(kiln::zeros({2}), "total");
  kiln::variable calls(0, "calls");
  kiln::function accumulate([&](const kiln::tensor& x) {
    calls.assign_add(1);
    total.assign_add(x);
    return total.read_value() * 2.f;
  });
  (void)accumulate(kiln::ones({2}));
  temporary_file file("variables.kiln");
  accumulate.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)).save(file.str());

  const kiln::loaded_function loaded = kiln::load(file.path());
  REQUIRE(loaded.variables().size() == 2);
  require_identical(loaded.variable("total").read_value(), kiln::ones({2}));
  require_identical(loaded(floats({1, 2}, {2})), floats({4, 6}, {2}));
  require_identical(loaded.variable("calls").read_value(), kiln::constant(2));
  loaded.variable("total").assign(kiln::zeros({2}));
  require_identical(loaded(floats({1, 2}, {2})), floats({2, 4}, {2}));
  // The program that saved them keeps its own.
  require_identical(total.read_value(), kiln::ones({2}));
  require_identical(calls.read_value(), kiln::constant(1));
  require_throws<kiln::value_error>([&] { return loaded.variable("missing").read_value(); }, {"missing"});
}

TEST_CASE("conditionals, loops with early exits and prints survive saving") {
  kiln::function collatz([](const kiln::tensor& n) {
    auto [steps, last] = kiln::while_loop(
        [](const kiln::tensor&, const kiln::tensor& v) { return v > 1; },
        [](const kiln::tensor& s, const kiln::tensor& v) {
          kiln::tensor next = kiln::cond((v % 2) == 0, [&] { return kiln::floordiv(v, 2); }, [&] { return v * 3 + 1; });
          return kiln::break_if(s >= 1000, s + 1, next);
        },
        kiln::constant(0), n);
    kiln::print("steps:", steps);
    return steps + last * 0;
  });
  temporary_file file("collatz.kiln");
  kiln::save(collatz, file.path(), kiln::tensor_spec({}, kiln::int32));
  const kiln::loaded_function loaded = kiln::load(file.path());
  std::ostringstream printed;
  kiln::config::set_print_stream(printed);
  for (int n : {1, 6, 27}) require_identical(loaded(kiln::constant(n)), collatz(kiln::constant(n)));
  kiln::config::set_print_stream(std::cout);
  CHECK(printed.str() == "steps: 0\nsteps: 0\nsteps: 8\nsteps: 8\nsteps: 111\nsteps: 111\n");
}

TEST_CASE("a tensor_array written in a loop survives saving (the seeds' dynamic RNN)") {
  kiln::function rnn([](const kiln::tensor& input, const kiln::tensor& initial) {
    const kiln::tensor by_time = kiln::transpose(input, {1, 0, 2});
    const kiln::tensor steps = kiln::shape_of(by_time)[0];
    kiln::tensor_array states(kiln::float32, steps);
    auto [last, all] = kiln::for_range(
        steps,
        [&](const kiln::tensor& i, const kiln::tensor& state, const kiln::tensor_array& written) {
          kiln::tensor next = kiln::tanh(kiln::gather(by_time, i) + state);
          return std::tuple{next, written.write(i, next)};
        },
        initial, states);
    return kiln::transpose(all.stack(), {1, 0, 2});
  });
  temporary_file file("rnn.kiln");
  kiln::save(rnn, file.path(), std::tuple{kiln::tensor_spec({2, kiln::none, 4}, kiln::float32),
                                          kiln::tensor_spec({2, 4}, kiln::float32)});
  const kiln::loaded_function loaded = kiln::load(file.path());
  for (int steps : {1, 3, 6}) {
    const kiln::tensor input = kiln::random::uniform({2, steps, 4}, -1, 1, kiln::float32, steps);
    const kiln::tensor initial = kiln::random::uniform({2, 4}, -1, 1, kiln::float32, 100 + steps);
    require_identical(loaded(input, initial), rnn(input, initial));
  }
}

TEST_CASE("random draws in a saved function: a seeded op starts its sequence over, a generator goes on") {
  kiln::function noisy([](const kiln::tensor& x) { return x + kiln::random::uniform({3}, 0, 1, kiln::float32, 42); });
  auto generator = kiln::random::generator::from_seed(7);
  kiln::function drawn([&](const kiln::tensor& x) { return x * generator.uniform({3}, -1, 1); });
  const kiln::tensor x = kiln::zeros({3});
  const kiln::tensor first = noisy(x), second = noisy(x);
  (void)drawn(x);
  temporary_file seeded("seeded.kiln"), stateful("stateful.kiln");
  kiln::save(noisy, seeded.path(), kiln::tensor_spec({3}, kiln::float32));
  kiln::save(drawn, stateful.path(), kiln::tensor_spec({3}, kiln::float32));

  const kiln::loaded_function loaded_noisy = kiln::load(seeded.path());
  require_identical(loaded_noisy(x), first);
  require_identical(loaded_noisy(x), second);
  // The generator was saved after one draw: the loaded function draws what the
  // original draws next.
  const kiln::loaded_function loaded_drawn = kiln::load(stateful.path());
  const kiln::tensor ones = kiln::ones({3});
  require_identical(loaded_drawn(ones), drawn(ones));
  require_identical(loaded_drawn(ones), drawn(ones));
}

TEST_CASE("a function that calls back into C++ cannot be saved, and save says so") {
  kiln::function f([](const kiln::tensor& x) {
    return kiln::host_callback([](const kiln::tensor& v) { return v; }, {kiln::tensor_spec({}, kiln::float32)}, x);
  });
  temporary_file file("callback.kiln");
  require_throws<kiln::unavailable_error>(
      [&] {
        kiln::save(f, file.path(), kiln::tensor_spec({}, kiln::float32));
        return 0;
      },
      {"host_callback", "cannot"});
}

// A file that loads, for the tests that damage it.
void save_sample(const temporary_file& file) {
  kiln::variable v(floats({1, 2, 3}, {3}), "v");
  kiln::function f([&](const kiln::tensor& x) {
    kiln::tensor y = kiln::cond(
        kiln::reduce_sum(x) > 0.f, [&] { return x * v; }, [&] { return x - v; });
    return kiln::reduce_mean(y, 0) + kiln::constant(std::vector<float>{0.25f, 0.5f, 0.75f})[1];
  });
  kiln::save(f, file.path(), kiln::tensor_spec({kiln::none, 3}, kiln::float32));
}

TEST_CASE("a truncated saved file raises kiln::value_error naming the file") {
  temporary_file file("truncated.kiln");
  save_sample(file);
  const std::vector<std::uint8_t> whole = bytes_of(file.path());
  REQUIRE(kiln::load(file.path()).concrete_functions().size() == 1);
  for (std::size_t length = 0; length < whole.size(); length += 1 + length / 16) {
    INFO("first " << length << " of " << whole.size() << " bytes");
    write_bytes(file.path(), std::vector<std::uint8_t>(whole.begin(), whole.begin() + std::ptrdiff_t(length)));
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); }, {file.str()});
  }
}

TEST_CASE("a saved file with any one bit flipped raises a kiln error, never loads") {
  temporary_file file("flipped.kiln");
  save_sample(file);
  const std::vector<std::uint8_t> whole = bytes_of(file.path());
  int value_errors = 0, unavailable = 0;
  for (std::size_t at = 0; at < whole.size(); at += 1 + at / 64) {
    for (int bit : {0, 3, 7}) {
      std::vector<std::uint8_t> damaged = whole;
      damaged[at] ^= std::uint8_t(1u << bit);
      write_bytes(file.path(), damaged);
      INFO("bit " << bit << " of byte " << at << " of " << whole.size());
      try {
        (void)kiln::load(file.path());
        FAIL("loaded");
      } catch (const kiln::value_error& e) {
        CHECK_THAT(e.what(), Catch::Matchers::Contains(file.str()));
        ++value_errors;
      } catch (const kiln::unavailable_error& e) {
        CHECK_THAT(e.what(), Catch::Matchers::Contains(file.str()));
        ++unavailable;
      }
    }
  }
  CHECK(value_errors > 0);
}

TEST_CASE("a file from a newer kiln, an unknown op or a node its op does not give raises a clear error") {
  temporary_file file("edited.kiln");
  save_sample(file);

  SECTION("a newer format version") {
    saved_parts parts = parts_of(file.path());
    parts.header["version"] = kiln::detail::saved_format_version + 1;
    write_parts(file.path(), parts);
    require_throws<kiln::unavailable_error>([&] { return kiln::load(file.path()); },
                                            {file.str(), "format version 2", "newer than this kiln reads (1)"});
  }
  SECTION("an op this kiln does not have") {
    edit_model(file.path(), [](nlohmann::json& m) {
      for (auto& n : m["functions"][0]["graph"]["nodes"])
        if (n["kind"] == "op") {
          n["op"] = "frobnicate";
          break;
        }
    });
    require_throws<kiln::unavailable_error>([&] { return kiln::load(file.path()); },
                                            {file.str(), "unknown op \"frobnicate\""});
  }
  SECTION("a node whose dtype its op does not give") {
    edit_model(file.path(), [](nlohmann::json& m) {
      for (auto& n : m["functions"][0]["graph"]["nodes"])
        if (n["kind"] == "op" && n["op"] == "reduce_mean") n["dtype"] = "float64";
    });
    require_throws<kiln::value_error>(
        [&] { return kiln::load(file.path()); },
        {file.str(), "(reduce_mean) is float64 (3,) in the file, but its op gives float32 (3,)"});
  }
  SECTION("a variable whose value has another shape") {
    edit_model(file.path(), [](nlohmann::json& m) { m["variables"][0]["shape"] = {4}; });
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); },
                                      {file.str(), "variable 'v'", "(3,)", "(4,)"});
  }
  SECTION("a variable read whose result is not the variable's") {
    edit_model(file.path(), [](nlohmann::json& m) {
      for (auto& branch : {"then", "else"})
        for (auto& n : m["functions"][0]["graph"]["nodes"])
          if (n["kind"] == "special" && n["op"] == "cond")
            for (auto& inner : n["special"][branch]["nodes"])
              if (inner["kind"] == "special" && inner["op"] == "ReadVariableOp") inner["results"][0]["shape"] = {2};
    });
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); },
                                      {file.str(), "result 0 is float32 (2,)"});
  }
  SECTION("a value whose bytes lie outside the file") {
    edit_model(file.path(), [](nlohmann::json& m) { m["variables"][0]["value"]["offset"] = 1u << 20; });
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); }, {file.str(), "lie outside the file's"});
  }
  SECTION("a node that reads a later node") {
    edit_model(file.path(), [](nlohmann::json& m) { m["functions"][0]["graph"]["nodes"][1]["inputs"] = {5}; });
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); }, {file.str(), "an input is 5"});
  }
  SECTION("a file that is not there") {
    std::filesystem::remove(file.path());
    require_throws<kiln::invalid_argument_error>([&] { return kiln::load(file.path()); }, {"cannot open", file.str()});
  }
  SECTION("a version too large for an integer type is still a newer format") {
    saved_parts parts = parts_of(file.path());
    parts.header["version"] = std::uint64_t(1) << 63;
    write_parts(file.path(), parts);
    require_throws<kiln::unavailable_error>([&] { return kiln::load(file.path()); },
                                            {file.str(), "format version 9223372036854775808", "newer than this kiln reads"});
  }
  SECTION("a function that returns nothing yet lists outputs") {
    edit_model(file.path(), [](nlohmann::json& m) { m["functions"][0]["returns_void"] = true; });
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); }, {file.str(), "returns nothing but lists outputs"});
  }
}

TEST_CASE("a directory, or anything but a regular file, is refused by name") {
  const std::filesystem::path directory = std::filesystem::temp_directory_path();
  require_throws<kiln::invalid_argument_error>([&] { return kiln::load(directory); }, {directory.string(), "not a regular file"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::load("/dev/null"); }, {"/dev/null", "not a regular file"});
}

// `KILNSAVE`, the header's length, then `levels` nested one-element CBOR arrays.
std::vector<std::uint8_t> nested_arrays(std::size_t levels) {
  std::vector<std::uint8_t> document(levels, 0x81);  // an array of one element
  document.push_back(0x00);                          // the innermost element: 0
  std::vector<std::uint8_t> bytes{'K', 'I', 'L', 'N', 'S', 'A', 'V', 'E'};
  for (int k = 0; k < 8; ++k) bytes.push_back(std::uint8_t(std::uint64_t(document.size()) >> (8 * k)));
  bytes.insert(bytes.end(), document.begin(), document.end());
  return bytes;
}

TEST_CASE("deeply nested CBOR raises a kiln error instead of overflowing the stack") {
  temporary_file file("nested.kiln");
  // The file of 60,000 levels that used to end in SIGSEGV, and deeper ones.
  for (std::size_t levels : {std::size_t(60000), std::size_t(100000), std::size_t(1000000)}) {
    INFO(levels << " levels");
    write_bytes(file.path(), nested_arrays(levels));
    require_throws<kiln::value_error>([&] { return kiln::load(file.path()); }, {file.str(), "the header nests deeper than"});
  }
  // The same nesting inside a model whose checksum is right: refused when read.
  save_sample(file);
  saved_parts parts = parts_of(file.path());
  std::vector<std::uint8_t> model(100000, 0x81);
  model.push_back(0x00);
  parts.header["checksum"] = kiln::detail::saved_checksum({model, parts.data});
  parts.header["model"] = nlohmann::json::binary(std::move(model));
  write_parts(file.path(), parts);
  require_throws<kiln::value_error>([&] { return kiln::load(file.path()); }, {file.str(), "the model nests deeper than"});
}

TEST_CASE("a loaded function keeps its summaries and writes them to the loading program's default writer") {
  temporary_file file("summaries.kiln");
  kiln::function f([](const kiln::tensor& x, const kiln::tensor& step) {
    kiln::summary::scalar("sum", kiln::reduce_sum(x), step, "the sum");
    kiln::summary::histogram("x", x, step, {.buckets = 2});
    kiln::summary::image("x/image", kiln::reshape(x, {1, 1, 2, 1}), step, {.max_outputs = 1});
    kiln::summary::text("note", "saved", step);
    return x * 2.f;
  });
  kiln::save(f, file.str(), std::tuple{kiln::tensor_spec({2}, kiln::float32), kiln::tensor_spec({}, kiln::int64)});
  const kiln::loaded_function loaded = kiln::load(file.path());
  const kiln::tensor x = kiln::constant({0.25f, 0.5f});
  require_identical(loaded.call_flat(x, kiln::constant(std::int64_t(1)))[0], f(x, kiln::constant(std::int64_t(1))));

  const std::filesystem::path logdir = file.path().string() + "_logs";
  std::filesystem::remove_all(logdir);
  {
    auto writer = kiln::summary::create_file_writer(logdir);
    auto scope = writer.as_default();
    for (std::int64_t step = 3; step < 5; ++step) (void)loaded.call_flat(x, kiln::constant(step));
  }
  // Per call, in program order: the four summaries at their step.
  std::vector<std::pair<std::string, std::int64_t>> written;
  const auto records = kiln_test::read_records(kiln_test::file_contents(std::filesystem::directory_iterator(logdir)->path()));
  std::filesystem::remove_all(logdir);
  for (std::size_t k = 1; k < records.size(); ++k) {
    const kiln_test::message e = kiln_test::message::parse(records[k]);
    written.emplace_back(e.sub(5).sub(1).one(1).bytes, e.one(2).as_int());
  }
  CHECK(written == std::vector<std::pair<std::string, std::int64_t>>{
                       {"sum", 3}, {"x", 3}, {"x/image", 3}, {"note", 3}, {"sum", 4}, {"x", 4}, {"x/image", 4}, {"note", 4}});

  // A summary node the loader cannot run: a scalar of strings.
  edit_model(file.path(), [](nlohmann::json& m) {
    for (auto& n : m["functions"][0]["graph"]["nodes"])
      if (n["kind"] == "special" && n["op"] == "WriteTextSummary") n["op"] = "WriteScalarSummary";
  });
  require_throws<kiln::value_error>([&] { return kiln::load(file.path()); },
                                    {file.str(), "scalar 'note'", "numeric", "string"});
}

// A collective node (kiln/distributed.hpp), recorded here by hand: this program is
// built without the distributed component, which alone has the API that makes them.
TEST_CASE("a program without the distributed component that loads or runs a collective is told what it lacks") {
  temporary_file file("collective.kiln");
  kiln::function total([](const kiln::tensor& x) {
    const kiln::detail::collective_spec spec{kiln::detail::collective_kind::all_reduce, kiln::reduce_op::mean, 0, {}, nullptr,
                                             kiln::detail::collective_site("train.cpp", 12, 3), 12};
    const kiln::tensor in[] = {x};
    return kiln::detail::trace_context::current()->record_special(std::make_shared<kiln::detail::collective_op>(spec), in,
                                                                  {{x.dtype(), x.shape()}})[0] + 1.f;
  });
  kiln::save(total, file.path(), kiln::tensor_spec({2}, kiln::float32));
  const saved_parts saved = parts_of(file.path());
  const nlohmann::json model = nlohmann::json::from_cbor(saved.header["model"].get_binary());
  bool found = false;
  for (const auto& n : model["functions"][0]["graph"]["nodes"])
    if (n["kind"] == "special" && n["op"] == "CollectiveReduceV2") {
      found = true;
      CHECK(n["special"]["reduce"] == "mean");
      CHECK(n["special"]["line"] == 12);
    }
  CHECK(found);
  require_throws<kiln::unavailable_error>([&] { return kiln::load(file.path()); },
                                          {file.str(), "node", "CollectiveReduceV2 is a collective across ranks",
                                           "#include <kiln/distributed.hpp>", "kiln::distributed"});
  require_throws<kiln::unavailable_error>([&] { return total(kiln::ones({2})); },
                                          {"CollectiveReduceV2", "kiln::distributed"});
}

}  // namespace

// kiln::summary as tf.summary: writers, default-writer scopes, summaries eagerly and
// inside functions (at every call, in program order with variable writes, looked up
// when they run), the errors they raise, the event file's name, first record and
// flushing, and graphs.
//
// The case "the TensorBoard check's log directory" also writes a log directory for
// test/summary/run_tensorboard.py to read with TensorBoard's own reader, to the
// directory $KILN_SUMMARY_LOGDIR names when it is set.

#include <cstdlib>
#include <filesystem>
#include <kiln/summary.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../support/op_check.hpp"
#include "../support/event_reader.hpp"

namespace {

using kiln::tensor;
using kiln::testing::require_throws;
using kiln_test::message;

// A fresh log directory, removed when the test ends.
class temporary_logdir {
 public:
  explicit temporary_logdir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("kiln_summary_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::remove_all(path_);
  }
  ~temporary_logdir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// One summary event as read back from a file.
struct event {
  std::int64_t step = 0;
  std::string tag, plugin;
  message tensor;
};

// The events of a writer's file after the first (the file version), read with the
// test's own readers; every record's CRCs are checked.
std::vector<event> events_in(const std::filesystem::path& file) {
  const std::vector<std::string> records = kiln_test::read_records(kiln_test::file_contents(file.string()));
  REQUIRE(!records.empty());
  CHECK(message::parse(records[0]).one(3).bytes == "brain.Event:2");
  std::vector<event> out;
  for (std::size_t k = 1; k < records.size(); ++k) {
    const message e = message::parse(records[k]);
    if (!e.has(5)) continue;  // (a graph)
    const message value = e.sub(5).sub(1);
    out.push_back({e.has(2) ? e.one(2).as_int() : 0, value.one(1).bytes, value.sub(9).sub(1).one(1).bytes, value.sub(8)});
  }
  return out;
}
std::vector<event> events_of(const kiln::summary::file_writer& w) {
  w.flush();
  return events_in(w.path());
}

float float_of(const message& t) {
  float f;
  REQUIRE(t.one(4).bytes.size() == 4);
  std::memcpy(&f, t.one(4).bytes.data(), 4);
  return f;
}

TEST_CASE("without a default writer a summary does nothing and returns false") {
  CHECK_FALSE(kiln::summary::scalar("x", 1.f, 0).item<bool>());
  CHECK_FALSE(kiln::summary::histogram("h", kiln::ones({3}), 0).item<bool>());
  CHECK_FALSE(kiln::summary::text("t", "hi", 0).item<bool>());
  CHECK_FALSE(kiln::summary::image("i", kiln::zeros({1, 2, 2, 3}), 0).item<bool>());
  CHECK_FALSE(kiln::summary::flush());
  kiln::function f([](const tensor& x) { return kiln::summary::scalar("x", x, 0); });
  CHECK_FALSE(f(kiln::constant(1.f)).item<bool>());
  CHECK_FALSE(kiln::summary::graph(f.get_concrete_function(kiln::constant(1.f))));
}

TEST_CASE("an event file is named as TensorFlow names it and starts with the file version") {
  temporary_logdir dir("names");
  const auto writer = kiln::summary::create_file_writer(dir.path() / "nested" / "run");  // directories made
  CHECK(writer.logdir() == dir.path() / "nested" / "run");
  CHECK(writer.path().parent_path() == writer.logdir());
  const std::string name = writer.path().filename().string();
  CHECK(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^.]*(\..*)?\.)" + std::to_string(::getpid()) +
                                          R"(\.\d+\.v2)")));
  // The first record is in the file at once: TensorBoard sees the run.
  const auto records = kiln_test::read_records(kiln_test::file_contents(writer.path().string()));
  REQUIRE(records.size() == 1);
  const message first = message::parse(records[0]);
  CHECK(first.one(3).bytes == "brain.Event:2");
  CHECK(std::abs(first.one(1).as_double() - double(std::time(nullptr))) < 60);
  // Writers number their files; a suffix replaces .v2.
  const auto other = kiln::summary::create_file_writer(dir.path(), {.filename_suffix = ".eval"});
  CHECK(other.path().filename().string().ends_with(".eval"));
  CHECK(other.path() != writer.path());
  require_throws<kiln::invalid_argument_error>(
      [&] { return kiln::summary::create_file_writer(writer.path() / "under_a_file"); }, {"cannot create", "under_a_file"});
}

TEST_CASE("eager summaries write at once, with their steps, to the default writer of the scope") {
  temporary_logdir dir("eager");
  auto writer = kiln::summary::create_file_writer(dir.path());
  {
    auto scope = writer.as_default();
    CHECK(kiln::summary::scalar("loss", 0.5, 1).item<bool>());
    CHECK(kiln::summary::scalar("loss", kiln::constant(std::int64_t(3)), kiln::constant(std::int64_t(2))).item<bool>());
    kiln::variable step(kiln::constant(std::int64_t(7)), "step");
    CHECK(kiln::summary::text("note", "seven", step).item<bool>());
  }
  CHECK_FALSE(kiln::summary::scalar("loss", 1.0, 4).item<bool>());  // the scope is over
  const auto events = events_in(writer.path());                      // flushed when the scope ended
  REQUIRE(events.size() == 3);
  CHECK(events[0].tag == "loss");
  CHECK(events[0].plugin == "scalars");
  CHECK(events[0].step == 1);
  CHECK(float_of(events[0].tensor) == 0.5f);
  CHECK(events[1].step == 2);
  CHECK(float_of(events[1].tensor) == 3.f);
  CHECK(events[2].plugin == "text");
  CHECK(events[2].step == 7);
  CHECK(events[2].tensor.one(8).bytes == "seven");
}

TEST_CASE("inside a function a summary writes at every call, in program order with variable writes") {
  temporary_logdir dir("function");
  auto writer = kiln::summary::create_file_writer(dir.path());
  auto scope = writer.as_default();
  kiln::variable v(0.f, "v");
  kiln::function f(
      [&](const tensor& x, const tensor& step) {
        v.assign_add(x);
        kiln::summary::scalar("v/after_first", v, step);
        v.assign_add(x);
        kiln::summary::scalar("v/after_second", v, step);
        kiln::summary::histogram("x", kiln::stack({x, x * 2.f}), step, {.buckets = 2});
        return kiln::summary::text("label", kiln::constant("call"), step);
      },
      {.name = "f"});
  for (int call = 0; call < 3; ++call) CHECK(f(kiln::constant(1.f), kiln::constant(call)).item<bool>());
  CHECK(f.tracing_count() == 1);
  const auto events = events_of(writer);
  REQUIRE(events.size() == 12);
  for (int call = 0; call < 3; ++call) {
    const event* e = &events[std::size_t(4 * call)];
    CHECK(e[0].tag == "v/after_first");
    CHECK(e[0].step == call);
    CHECK(float_of(e[0].tensor) == float(2 * call + 1));
    CHECK(e[1].tag == "v/after_second");
    CHECK(float_of(e[1].tensor) == float(2 * call + 2));
    CHECK(e[2].plugin == "histograms");
    CHECK(e[2].step == call);
    CHECK(e[3].tensor.one(8).bytes == "call");
  }
}

TEST_CASE("summaries run in program order with prints and host callbacks") {
  // A writer that logs to the stream prints go to: the order of both is the program's.
  struct logging_target : kiln::detail::summary_target {
    std::ostream* log = nullptr;
  };
  std::ostringstream log;
  std::ostream& previous_stream = kiln::config::print_stream();
  kiln::config::set_print_stream(log);
  logging_target target;
  target.log = &log;
  target.write = [](kiln::detail::summary_target& self, const kiln::detail::summary_spec& spec, const tensor&,
                    std::int64_t step) {
    *static_cast<logging_target&>(self).log << "summary " << spec.tag << " at " << step << "\n";
    return true;
  };
  kiln::detail::summary_target* previous = std::exchange(kiln::detail::default_summary_target(), &target);
  kiln::function f([&](const tensor& x) {
    kiln::print("first", x);
    kiln::summary::scalar("a", x, 1);
    kiln::print("second");
    kiln::summary::text("b", "t", 2);
    kiln::host_callback([&] { log << "callback\n"; }, {});
    kiln::summary::histogram("c", x, 3);
  });
  f(kiln::constant(1));
  f(kiln::constant(2));
  kiln::detail::default_summary_target() = previous;
  kiln::config::set_print_stream(previous_stream);
  CHECK(log.str() ==
        "first 1\nsummary a at 1\nsecond\nsummary b at 2\ncallback\nsummary c at 3\n"
        "first 2\nsummary a at 1\nsecond\nsummary b at 2\ncallback\nsummary c at 3\n");
}

TEST_CASE("the default writer is looked up when a summary runs, not when it is traced") {
  temporary_logdir dir("lookup");
  kiln::function f([](const tensor& x) { return kiln::summary::scalar("x", x, 5); });
  CHECK_FALSE(f(kiln::constant(1.f)).item<bool>());  // traced and run without a writer
  auto first = kiln::summary::create_file_writer(dir.path() / "first");
  auto second = kiln::summary::create_file_writer(dir.path() / "second");
  {
    auto outer = first.as_default();
    CHECK(f(kiln::constant(2.f)).item<bool>());
    {
      auto inner = second.as_default();  // nested: the inner one, then the outer one again
      CHECK(f(kiln::constant(3.f)).item<bool>());
    }
    CHECK(f(kiln::constant(4.f)).item<bool>());
    // Per thread, as tf.summary's default writer: another thread has none.
    bool other_thread = true;
    std::thread([&] { other_thread = f(kiln::constant(5.f)).item<bool>(); }).join();
    CHECK_FALSE(other_thread);
  }
  CHECK_FALSE(f(kiln::constant(6.f)).item<bool>());
  CHECK(f.tracing_count() == 1);
  const auto in_first = events_of(first), in_second = events_of(second);
  REQUIRE(in_first.size() == 2);
  CHECK(float_of(in_first[0].tensor) == 2.f);
  CHECK(float_of(in_first[1].tensor) == 4.f);
  REQUIRE(in_second.size() == 1);
  CHECK(float_of(in_second[0].tensor) == 3.f);
}

TEST_CASE("a step may be an optimizer's iterations, read when the summary runs") {
  temporary_logdir dir("iterations");
  auto writer = kiln::summary::create_file_writer(dir.path());
  auto scope = writer.as_default();
  kiln::variable w(kiln::constant(1.f), "w");
  kiln::optimizers::sgd opt({.learning_rate = 0.25});
  kiln::function train_step([&] {
    kiln::gradient_tape tape;
    const tensor loss = kiln::square(w);
    opt.apply_gradients(tape.gradient(loss, std::vector{w}), {w});
    kiln::summary::scalar("loss", loss, opt.iterations());
  });
  for (int k = 0; k < 3; ++k) train_step();
  const auto events = events_of(writer);
  REQUIRE(events.size() == 3);
  // w: 1, 0.5, 0.25 (w -= 0.25 * 2w); the steps count the updates: 1, 2, 3.
  for (int k = 0; k < 3; ++k) {
    CHECK(events[std::size_t(k)].step == k + 1);
    CHECK(float_of(events[std::size_t(k)].tensor) == std::pow(0.25f, float(k)));
  }
}

TEST_CASE("a summary in a branch writes only when its branch runs") {
  temporary_logdir dir("cond");
  auto writer = kiln::summary::create_file_writer(dir.path());
  auto scope = writer.as_default();
  kiln::function f([](const tensor& x, const tensor& step) {
    return kiln::cond(
        x > 0.f, [&] { return kiln::summary::scalar("positive", x, step); },
        [&] { return kiln::summary::scalar("other", x, step); });
  });
  for (int k = 0; k < 4; ++k) CHECK(f(kiln::constant(k % 2 ? 1.f : -1.f), kiln::constant(k)).item<bool>());
  const auto events = events_of(writer);
  REQUIRE(events.size() == 4);
  for (int k = 0; k < 4; ++k) {
    CHECK(events[std::size_t(k)].tag == (k % 2 ? "positive" : "other"));
    CHECK(events[std::size_t(k)].step == k);
  }
}

TEST_CASE("summaries reject what TensorFlow's reject: dtypes, shapes, image ranks and channels, steps") {
  temporary_logdir dir("errors");
  auto writer = kiln::summary::create_file_writer(dir.path());
  auto scope = writer.as_default();
  // Eagerly and while tracing alike (the checks need only dtypes and shapes).
  for (bool traced : {false, true}) {
    INFO((traced ? "while tracing" : "eagerly"));
    auto run = [&](auto summary) {
      return [summary, traced] {
        if (!traced) return summary();
        kiln::function f([&] { return summary(); });
        return f();
      };
    };
    require_throws<kiln::value_error>(run([] { return kiln::summary::scalar("s", kiln::constant({1.f, 2.f}), 0); }),
                                      {"scalar 's'", "must be a scalar", "(2,)"});
    require_throws<kiln::type_error>(run([] { return kiln::summary::scalar("s", kiln::constant("a"), 0); }),
                                     {"scalar 's'", "numeric", "string"});
    require_throws<kiln::type_error>(run([] { return kiln::summary::histogram("h", kiln::constant("a"), 0); }),
                                     {"histogram 'h'", "numeric"});
    require_throws<kiln::type_error>(run([] { return kiln::summary::text("t", kiln::constant(1), 0); }),
                                     {"text 't'", "string tensor", "int32"});
    require_throws<kiln::value_error>(run([] { return kiln::summary::image("i", kiln::zeros({2, 2, 3}), 0); }),
                                      {"image 'i'", "rank 4", "(2, 2, 3)"});
    require_throws<kiln::value_error>(run([] { return kiln::summary::image("i", kiln::zeros({1, 2, 2, 5}), 0); }),
                                      {"image 'i'", "channels", "(1, 2, 2, 5)"});
    require_throws<kiln::value_error>(run([] { return kiln::summary::image("i", kiln::zeros({1, 0, 2, 3}), 0); }),
                                      {"image 'i'", "1 pixel"});
    require_throws<kiln::type_error>(
        run([] { return kiln::summary::image("i", kiln::cast(kiln::zeros({1, 2, 2, 3}), kiln::bool_), 0); }),
        {"image 'i'", "bool"});
    require_throws<kiln::type_error>(run([] { return kiln::summary::scalar("s", 1.f, kiln::constant(1.5f)); }),
                                     {"scalar 's'", "step", "int32 or int64", "float32"});
    require_throws<kiln::value_error>(run([] { return kiln::summary::scalar("s", 1.f, kiln::constant({1, 2})); }),
                                      {"scalar 's'", "step must be a scalar", "(2,)"});
  }
  require_throws<kiln::value_error>([] { return kiln::summary::histogram("h", kiln::ones({2}), 0, {.buckets = -1}); },
                                    {"histogram 'h'", "buckets", "-1"});
  require_throws<kiln::value_error>([] { return kiln::summary::image("i", kiln::zeros({1, 1, 1, 1}), 0, {.max_outputs = -2}); },
                                    {"image 'i'", "max_outputs"});
  // A rank the trace left unknown is checked when the graph runs; a None dim is
  // still a dim, never a scalar (TensorFlow's assert_scalar reads the static rank too).
  kiln::function partial([](const tensor& x) { return kiln::summary::scalar("p", x, 0); },
                         {.input_signature = std::vector{kiln::tensor_spec(kiln::unknown_rank, kiln::float32)}});
  CHECK(partial(kiln::constant(1.f)).item<bool>());
  require_throws<kiln::invalid_argument_error>([&] { return partial(kiln::constant({1.f, 2.f})); },
                                               {"scalar 'p'", "must be a scalar", "(2,)"});
  kiln::function vector([](const tensor& x) { return kiln::summary::scalar("v", x, 0); },
                        {.input_signature = std::vector{kiln::tensor_spec({kiln::none}, kiln::float32)}});
  require_throws<kiln::value_error>([&] { return vector(kiln::constant({1.f})); }, {"scalar 'v'", "(None,)"});
  // Values that have no picture: raised when written, from the graph too.
  kiln::function pixels([](const tensor& x) { return kiln::summary::image("px", x, 0); });
  require_throws<kiln::invalid_argument_error>(
      [&] { return pixels(kiln::constant(std::vector<std::int32_t>{300}, {1, 1, 1, 1})); }, {"image 'px'", "300"});
  kiln::function nan([](const tensor& x) { return kiln::summary::histogram("nan", x, 0); });
  require_throws<kiln::invalid_argument_error>([&] { return nan(kiln::constant({NAN})); }, {"histogram 'nan'", "NaN"});
}

TEST_CASE("events wait in a queue of max_queue events, or until flush_millis, a flush or the scope's end") {
  temporary_logdir dir("queue");
  auto count = [](const kiln::summary::file_writer& w) {
    return kiln_test::read_records(kiln_test::file_contents(w.path().string())).size();
  };
  auto writer = kiln::summary::create_file_writer(dir.path(), {.max_queue = 2});
  auto scope = writer.as_default();
  kiln::summary::scalar("a", 1, 1);
  kiln::summary::scalar("a", 2, 2);
  CHECK(count(writer) == 1);  // the file version alone
  kiln::summary::scalar("a", 3, 3);  // a third event: more than max_queue
  CHECK(count(writer) == 4);
  kiln::summary::scalar("a", 4, 4);
  CHECK(count(writer) == 4);
  CHECK(kiln::summary::flush());
  CHECK(count(writer) == 5);
  auto timed = kiln::summary::create_file_writer(dir.path(), {.flush_millis = std::chrono::milliseconds(0)});
  auto timed_scope = timed.as_default();
  kiln::summary::scalar("b", 1, 1);  // flush_millis passed: written at once
  CHECK(count(timed) == 2);
  // The last copy of a writer flushes as it goes.
  std::filesystem::path path;
  {
    auto short_lived = kiln::summary::create_file_writer(dir.path() / "short");
    path = short_lived.path();
    auto s = short_lived.as_default();
    auto copy = short_lived;
    kiln::summary::text("t", "kept", 0);
  }
  REQUIRE(events_in(path).size() == 1);
}

TEST_CASE("graph() writes a function's graph for TensorBoard's graph view") {
  temporary_logdir dir("graph");
  auto writer = kiln::summary::create_file_writer(dir.path());
  auto scope = writer.as_default();
  kiln::function f([](const tensor& x) { return kiln::tanh(x * 2.f + 1.f); });
  const auto concrete = f.get_concrete_function(kiln::tensor_spec({3}, kiln::float32));
  CHECK(kiln::summary::graph(concrete));
  CHECK(kiln::summary::graph(concrete.graph()));
  writer.flush();
  const auto records = kiln_test::read_records(kiln_test::file_contents(writer.path().string()));
  REQUIRE(records.size() == 3);
  const message def = message::parse(message::parse(records[1]).one(4).bytes);
  // x, two constants, multiply, add, tanh, Identity.
  REQUIRE(def.all(1).size() == concrete.graph().nodes().size());
  std::vector<std::string> ops;
  for (const auto& n : def.all(1)) ops.push_back(message::parse(n.bytes).one(2).bytes);
  std::vector<std::string> expected;
  for (const kiln::node& n : concrete.graph().nodes()) expected.emplace_back(n.op());
  CHECK(ops == expected);
}

TEST_CASE("the training loops' hook writes named scalars to the default writer or a writer it opens") {
  const std::pair<std::string, double> logs[] = {{"epoch_loss", 0.25}, {"epoch_accuracy", 0.75}};
  CHECK_FALSE(kiln::detail::write_scalar_summaries(logs, 1));
  temporary_logdir dir("hook");
  std::shared_ptr<kiln::detail::summary_target> opened = kiln::detail::summary_file_opener<>::open(dir.path());
  CHECK(kiln::detail::write_scalar_summaries(logs, 3, opened.get()));
  opened->flush(*opened);
  const auto files = std::vector(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator());
  REQUIRE(files.size() == 1);
  const auto events = events_in(files[0].path());
  REQUIRE(events.size() == 2);
  CHECK(events[0].tag == "epoch_loss");
  CHECK(events[0].step == 3);
  CHECK(float_of(events[0].tensor) == 0.25f);
  CHECK(events[1].tag == "epoch_accuracy");
  CHECK(float_of(events[1].tensor) == 0.75f);
}

TEST_CASE("fit with a log_dir writes each epoch's loss and metrics where Keras' TensorBoard callback does") {
  temporary_logdir dir("fit");
  kiln::layers::sequential model({kiln::layers::dense(4, {.activation = kiln::relu}), kiln::layers::dense(1)});
  kiln::optimizers::sgd opt({.learning_rate = 0.05});
  const tensor x = kiln::reshape(kiln::cast(kiln::range(32), kiln::float32), {16, 2}) * 0.05f;
  const tensor y = kiln::cast(kiln::reduce_sum(x, 1, true) > 0.8f, kiln::float32);
  const auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{x, y}).batch(8);
  const kiln::history h =
      kiln::fit(model, kiln::losses::mean_squared_error<>, opt, ds,
                {.epochs = 3, .validation_data = ds, .verbose = 0,
                 .metrics = {kiln::metrics::binary_accuracy()}, .log_dir = dir.path()});
  for (const std::string run : {"train", "validation"}) {
    INFO(run);
    const auto files = std::vector(std::filesystem::directory_iterator(dir.path() / run), std::filesystem::directory_iterator());
    REQUIRE(files.size() == 1);
    const std::vector<event> events = events_in(files[0].path());
    REQUIRE(events.size() == 6);  // loss and binary_accuracy, 3 epochs
    const std::string prefix = run == "train" ? "" : "val_";
    for (std::size_t k = 0; k < events.size(); ++k) {
      const std::size_t epoch = k / 2;
      CHECK(events[k].step == std::int64_t(epoch));
      CHECK(events[k].plugin == "scalars");
      CHECK((events[k].tag == "epoch_loss" || events[k].tag == "epoch_binary_accuracy"));
      const std::string name = prefix + events[k].tag.substr(6);
      CHECK(float_of(events[k].tensor) == float(h.values.at(name).at(epoch)));
    }
  }
}

// What run_tensorboard.py reads with TensorBoard and checks by its own formulas (the
// script states each expected value): a function called at steps 0 to 4 writes
//   scalars  "loss" = step * 0.5 + 1 and "count" = step (int64, written as float32),
//   a histogram "values" of range(10) * (step + 1), 5 buckets,
//   text "phase" = "training", and eagerly text "note" = "step <step>",
//   an image "gradient": 1 image of 3 rows and 4 columns of RGB pixels whose samples
//     are (row * 4 + column) / 11 * (channel + 1) / 3 (floats, scaled to 8 bits),
// and the graph of a function with a `cond` and a `while` (its node count and its
// four library functions).
TEST_CASE("the TensorBoard check's log directory") {
  const char* env = std::getenv("KILN_SUMMARY_LOGDIR");
  temporary_logdir fallback("tensorboard");
  const std::filesystem::path logdir = env ? std::filesystem::path(env) : fallback.path();
  std::filesystem::remove_all(logdir);
  {
    auto writer = kiln::summary::create_file_writer(logdir);
    auto scope = writer.as_default();
    kiln::function step_fn([](const tensor& step) {
      const tensor s = kiln::cast(step, kiln::float32);
      kiln::summary::scalar("loss", s * 0.5f + 1.f, step);
      kiln::summary::scalar("count", step, step);
      kiln::summary::histogram("values", kiln::cast(kiln::range(10), kiln::float32) * (s + 1.f), step, {.buckets = 5});
      kiln::summary::text("phase", "training", step);
      const tensor index = kiln::cast(kiln::reshape(kiln::range(12), {3, 4, 1}), kiln::float32) / 11.f;
      const tensor scale = kiln::constant({1.f, 2.f, 3.f}) / 3.f;
      kiln::summary::image("gradient", kiln::reshape(index * scale, {1, 3, 4, 3}), step);
    });
    for (std::int64_t step = 0; step < 5; ++step) {
      step_fn(kiln::constant(step));
      kiln::summary::text("note", "step " + std::to_string(step), step);  // eagerly, beside the traced ones
    }
    kiln::function controlled([](const tensor& x) {
      const tensor y = kiln::cond(kiln::reduce_sum(x) > 0.f, [&] { return x * 2.f; }, [&] { return x - 1.f; });
      return kiln::while_loop([](const tensor& v) { return kiln::reduce_sum(v) < 100.f; },
                              [](const tensor& v) { return v * 3.f; }, y);
    });
    const auto concrete = controlled.get_concrete_function(kiln::tensor_spec({2}, kiln::float32));
    REQUIRE(kiln::summary::graph(concrete));
    // (The script expects this many GraphDef nodes: these, less the loop's Result nodes.)
    std::size_t nodes = 0;
    for (const kiln::node& n : concrete.graph().nodes()) nodes += n.kind() != kiln::node_kind::result;
    CHECK(nodes == 7);
  }
  const auto events = events_in(std::filesystem::directory_iterator(logdir)->path());
  CHECK(events.size() == 5 * 6);
}

}  // namespace

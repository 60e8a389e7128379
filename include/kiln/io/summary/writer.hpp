#pragma once
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

#include "kiln/core/error.hpp"
#include "kiln/exec/summary_op.hpp"
#include "kiln/io/summary/events.hpp"
#include "kiln/io/summary/record.hpp"

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

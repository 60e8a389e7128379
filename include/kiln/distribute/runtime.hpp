#pragma once
/// \file
/// The MPI side of kiln's distributed component: starting MPI on first use and ending
/// it at exit, the groups of ranks that collectives run over, and the *agreement* that
/// starts every collective: the ranks exchange a short description of what each is
/// about to do (which collective, the dtype and shapes, its place in the group's
/// sequence) before any tensor moves, so that ranks that disagree get an error naming
/// the collective and both sides instead of a wrong sum or a hang, and a rank that
/// never arrives is noticed when the group's timeout passes (docs/distributed.md).
///
/// Without a launcher (`mpirun`, `srun`, ...) a program is a world of one and MPI is
/// not started at all, so it behaves as it did before it used the component.

// kiln calls MPI's C functions: MPI's C++ bindings (deprecated since MPI 2.2) would add
// compile time and warnings to every file that includes kiln/distributed.hpp.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#endif

#include "kiln/core/error.hpp"

namespace kiln::distribute::detail {

/// Whether this process was started by an MPI launcher: Open MPI's mpirun, a PMI or
/// PMIx launcher (MPICH's hydra, Slurm's srun --mpi=...), MVAPICH; or `KILN_MPI=1`.
inline bool launched_by_mpi() {
  if (const char* forced = std::getenv("KILN_MPI")) return std::string_view(forced) == "1";
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(variable)) return true;
  return false;
}

/// How long a collective waits for every rank of its group to arrive, from
/// `KILN_COLLECTIVE_TIMEOUT` (seconds) or 600 s; see kiln::distribute::set_timeout.
inline std::chrono::nanoseconds timeout_from_environment() {
  if (const char* text = std::getenv("KILN_COLLECTIVE_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    if (end != text && seconds > 0 && seconds < 1e9)
      return std::chrono::nanoseconds(std::int64_t(seconds * 1e9));
    std::fprintf(stderr, "kiln: KILN_COLLECTIVE_TIMEOUT=%s is not a positive number of seconds; using 600\n", text);
  }
  return std::chrono::seconds(600);
}

/// A group of ranks as the runtime keeps it: its communicator (kiln's own duplicate,
/// so that kiln's traffic never meets the program's own MPI calls) and where it is in
/// its sequence of collectives.
struct group_state {
  MPI_Comm comm = MPI_COMM_NULL;  ///< null in a world of one without MPI
  int rank = 0;
  int size = 1;
  std::vector<int> members;    ///< world ranks in the group's rank order; empty for the world
  std::uint64_t sequence = 0;  ///< collectives started on this group
  std::string broken;          ///< why the group cannot be used any more (empty while it can)
  std::int64_t timeout = 0;    ///< in nanoseconds; 0: the runtime's
  std::shared_ptr<void> nccl;  ///< its NCCL communicator, once made (kiln/distribute/nccl.hpp)
};

/// What each rank tells the others before a collective: equal on every rank when they
/// agree. A plain struct of fixed size, sent as bytes (every rank runs the same build).
struct collective_descriptor {
  std::uint64_t sequence = 0;     ///< the collective's place in its group's sequence
  std::uint64_t shapes_hash = 0;  ///< of every input's dims
  std::uint64_t site = 0;         ///< where the program calls it (collective_spec::site)
  std::int64_t tensors = 0;       ///< inputs (several for a bucketed all_reduce)
  std::int64_t elements = 0;      ///< in all inputs
  std::int64_t string_bytes = 0;  ///< characters in all inputs (string tensors)
  std::int64_t dims[8] = {};      ///< the first input's dims
  std::int32_t root = 0;
  std::uint32_t line = 0;  ///< the line of `site`
  std::uint8_t kind = 0, op = 0, type = 0, rank = 0;
  std::uint8_t device = 0;  ///< 0 host, 1 device memory
  std::uint8_t padding[3] = {};
};
static_assert(sizeof(collective_descriptor) == 128, "the agreement exchanges 128 bytes per rank");

/// What kiln's collectives need of MPI: the world and its groups, one lock for every
/// MPI call kiln makes (kiln asks for MPI_THREAD_SERIALIZED), and the timeout.
class runtime {
 public:
  /// The runtime, started on first use. Never destroyed: MPI outlives static objects,
  /// and MPI_Finalize runs at exit (std::atexit) when kiln started MPI.
  static runtime& get() {
    static runtime* instance = new runtime();
    return *instance;
  }

  /// Whether collectives go through MPI (false: a world of one without a launcher).
  bool uses_mpi() const { return uses_mpi_; }
  int world_rank() const { return world_->rank; }
  int world_size() const { return world_->size; }
  /// Held around every MPI call kiln makes, so that threads take turns.
  std::recursive_mutex& mutex() { return mutex_; }

  std::chrono::nanoseconds timeout() const { return std::chrono::nanoseconds(timeout_.load(std::memory_order_relaxed)); }
  void set_timeout(std::chrono::nanoseconds t) { timeout_.store(t.count(), std::memory_order_relaxed); }

  /// The world's group.
  const std::shared_ptr<group_state>& world() const { return world_; }

  /// The group of world ranks `members` (in its rank order; empty: the world) that the
  /// collectives of graphs loaded from files run over: made on first use, which every
  /// member does at the same point of its program (where the first such collective runs).
  std::shared_ptr<group_state> group_of(const std::vector<int>& members) {
    if (members.empty()) return world_;
    std::lock_guard lock(mutex_);
    if (auto it = groups_.find(members); it != groups_.end()) return it->second;
    for (int r : members)
      if (r < 0 || r >= world_->size)
        throw invalid_argument_error("kiln::distribute: rank " + std::to_string(r) + " of a group is not a rank of the world (" +
                                     std::to_string(world_->size) + " ranks)");
    auto g = std::make_shared<group_state>();
    g->members = members;
    g->size = int(members.size());
    const auto me = std::find(members.begin(), members.end(), world_->rank);
    g->rank = me == members.end() ? -1 : int(me - members.begin());
    if (uses_mpi_ && g->rank >= 0) {
      MPI_Group world_group, sub;
      MPI_Comm_group(world_->comm, &world_group);
      MPI_Group_incl(world_group, int(members.size()), members.data(), &sub);
      check(MPI_Comm_create_group(world_->comm, sub, 0x6b696c6e, &g->comm), "MPI_Comm_create_group");
      MPI_Group_free(&sub);
      MPI_Group_free(&world_group);
      MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    }
    groups_.emplace(members, g);
    return g;
  }

  /// MPI_Comm_split of `parent`: the ranks that give the same `color` form a new group,
  /// ranked by `key`. Every rank of `parent` calls it.
  std::shared_ptr<group_state> split(const std::shared_ptr<group_state>& parent, int color, int key) {
    std::lock_guard lock(mutex_);
    if (!parent->broken.empty()) throw unavailable_error("communicator::split: " + parent->broken);
    if (!uses_mpi_ || parent->size == 1) return parent;  // one rank: the group of itself
    MPI_Comm comm = MPI_COMM_NULL;
    check(MPI_Comm_split(parent->comm, color, key, &comm), "MPI_Comm_split");
    int size = 0;
    MPI_Comm_size(comm, &size);
    std::vector<int> ranks(static_cast<std::size_t>(size)), in_world(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) ranks[std::size_t(r)] = r;
    MPI_Group group, world_group;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(world_->comm, &world_group);
    MPI_Group_translate_ranks(group, size, ranks.data(), world_group, in_world.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    auto g = std::make_shared<group_state>();
    g->comm = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &g->rank);
    g->size = size;
    g->members = in_world;
    return g;
  }

  /// Throws kiln::unavailable_error naming `what` when an MPI call failed.
  static void check(int code, std::string_view what) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw unavailable_error("kiln::distribute: " + std::string(what) + " failed: " + std::string(text, std::size_t(length)));
  }

  /// Exchanges `mine` with every rank of `g` (an MPI_Iallgather, polled until the
  /// timeout): the agreement that starts collective `what`. Raises
  /// kiln::unavailable_error when the group is broken or the timeout passes (the group
  /// is then broken: a rank left behind would pair its next collective with this one),
  /// and kiln::invalid_argument_error when the ranks are at different places of the
  /// group's sequence (a rank skipped a collective; the group is then broken too).
  /// Holds mutex() while it waits.
  std::vector<collective_descriptor> agree(group_state& g, collective_descriptor mine, std::string_view what,
                                           std::string (*describe)(const collective_descriptor&)) {
    std::vector<collective_descriptor> all(std::size_t(g.size));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, g.comm, &request),
          "MPI_Iallgather");
    const auto start = std::chrono::steady_clock::now();
    const auto limit = g.timeout > 0 ? std::chrono::nanoseconds(g.timeout) : timeout();
    for (int spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      if (spins < 2000) continue;
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= limit) {
        // The request stays posted: MPI cannot cancel a collective. The group is
        // unusable from now on; MPI_Finalize at exit tolerates the pending request.
        g.broken = "collective #" + std::to_string(mine.sequence) + " (" + std::string(what) + ") timed out";
        throw unavailable_error(std::string(what) + ": not every rank of " + group_name(g) + " joined collective #" +
                                std::to_string(mine.sequence) + " within " + seconds(limit) +
                                " (communicator::set_timeout, KILN_COLLECTIVE_TIMEOUT): a rank skipped it, is "
                                "stuck, or ended; this group cannot run collectives any more");
      }
      // Spin first (the others are usually about to arrive), then yield, then sleep
      // briefly so that ranks sharing cores with a late one leave it the CPU.
      if (waited < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r].sequence != mine.sequence) {
        g.broken = "its ranks lost step (a rank skipped a collective)";
        throw invalid_argument_error(std::string(what) + ": the ranks of " + group_name(g) +
                                     " are at different collectives: rank " + std::to_string(g.rank) + " is at #" +
                                     std::to_string(mine.sequence) + " (" + describe(mine) + "), rank " +
                                     std::to_string(r) + " at #" + std::to_string(all[r].sequence) + " (" +
                                     describe(all[r]) +
                                     "); a rank skipped a collective, and this group cannot run collectives any more");
      }
    return all;
  }

  /// `the world (4 ranks)` or `the group of world ranks [0, 2] (2 ranks)`.
  static std::string group_name(const group_state& g) {
    std::string text = g.members.empty() ? "the world" : "the group of world ranks [";
    if (!g.members.empty()) {
      for (std::size_t k = 0; k < g.members.size(); ++k) text += (k ? ", " : "") + std::to_string(g.members[k]);
      text += "]";
    }
    return text + " (" + std::to_string(g.size) + (g.size == 1 ? " rank)" : " ranks)");
  }

 private:
  runtime() : timeout_(timeout_from_environment().count()) {
    world_ = std::make_shared<group_state>();
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
      throw unavailable_error("kiln::distribute: MPI was finalized before kiln's first collective; "
                              "collectives need MPI until the program ends");
    if (!initialized && launched_by_mpi()) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      std::atexit(&finalize_at_exit);
      initialized = 1;
      started_mpi() = true;
    }
    if (!initialized) return;  // a world of one
    uses_mpi_ = true;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &world_->comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(world_->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(world_->comm, &world_->rank);
    MPI_Comm_size(world_->comm, &world_->size);
    if (started_mpi() && world_->size > 1) {
      job_rank() = world_->rank;
      job_size() = world_->size;
      std::set_terminate(&end_job);
    }
  }

  static bool& started_mpi() {
    static bool started = false;
    return started;
  }
  static int& job_rank() {
    static int rank = 0;
    return rank;
  }
  static int& job_size() {
    static int size = 1;
    return size;
  }
  static void finalize_at_exit() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  // An exception that leaves main (or any std::terminate) on one rank ends the whole
  // job with its message at once, rather than leaving the others to wait for it.
  [[noreturn]] static void end_job() {
    std::string what = "std::terminate was called";
    if (std::exception_ptr e = std::current_exception()) {
      std::string type = "an exception";
#if __has_include(<cxxabi.h>)
      if (const std::type_info* t = abi::__cxa_current_exception_type()) {
        int status = 0;
        char* readable = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
        type = status == 0 && readable ? readable : t->name();
        std::free(readable);
      }
#endif
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        what = "uncaught " + type + ": " + x.what();
      } catch (...) {
        what = "uncaught " + type;
      }
    }
    std::fprintf(stderr, "kiln: rank %d of %d ends the job: %s\n", job_rank(), job_size(), what.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }
  static std::string seconds(std::chrono::nanoseconds t) {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", double(t.count()) / 1e9);
    return text;
  }

  bool uses_mpi_ = false;
  std::recursive_mutex mutex_;
  std::atomic<std::int64_t> timeout_;
  std::shared_ptr<group_state> world_;
  std::map<std::vector<int>, std::shared_ptr<group_state>> groups_;
};

}  // namespace kiln::distribute::detail

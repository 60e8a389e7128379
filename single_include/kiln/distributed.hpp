// kiln single header, generated from include/kiln/distributed.hpp by `python3 scripts/amalgamate.py`.
// Do not edit: change the headers under include/ and regenerate.
#pragma once
#ifndef KILN_SINGLE_INCLUDE_KILN_DISTRIBUTED_HPP
#define KILN_SINGLE_INCLUDE_KILN_DISTRIBUTED_HPP
// ----- begin kiln/distributed.hpp -----
/// \file
/// Data-parallel training across processes: collectives
/// (`kiln::all_reduce`, `all_gather`, `broadcast`, `reduce_scatter`) eagerly and as graph
/// nodes, groups of ranks (`kiln::distribute::communicator`) and the strategy
/// `kiln::distribute::data_parallel`. One process per rank, started by an MPI launcher:
///
///     mpirun -np 4 ./train
///
/// \code
/// kiln::distribute::data_parallel strategy;
/// auto shard = kiln::data::dataset::range(1000).shard(strategy.size(), strategy.rank());
/// kiln::tensor total = kiln::all_reduce(kiln::constant(1.f));  // the number of ranks
/// \endcode
///
/// An optional part of kiln, outside kiln/kiln.hpp: it needs MPI (Open MPI, Debian's
/// `libopenmpi-dev`), and its CMake target is `kiln::distributed`. Without a launcher a
/// program is a world of one and does not start MPI: its collectives give their inputs
/// back and the strategy's optimizer is the optimizer itself. Tensors on the gpu travel
/// through host memory, or through NCCL in CUDA builds with `KILN_HAS_NCCL`
/// (kiln/distribute/nccl.hpp: compiled, not yet run on a GPU).
/// docs/distributed.md has the design: the agreement before each collective, the
/// timeout, the reduction order, the strategy, and a scaling model.

#include "kiln/kiln.hpp"
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
#ifndef KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_RUNTIME_HPP
#define KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_RUNTIME_HPP
// ----- begin kiln/distribute/runtime.hpp -----
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
// ----- end kiln/distribute/runtime.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_RUNTIME_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_COMMUNICATOR_HPP
#define KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_COMMUNICATOR_HPP
// ----- begin kiln/distribute/communicator.hpp -----
/// \file
/// `kiln::distribute::communicator`: a group of ranks that collectives run over, the
/// world (every process of the job) or a part of it; and the timeout of collectives.

#include <chrono>
#include <memory>
#include <utility>
#include <vector>


namespace kiln::distribute {

/// A group of ranks (TensorFlow's collective group, MPI's communicator): `world()`, every
/// process of the job, or a part of it made by `split`. Copies are the same group.
/// The first use starts MPI when the program runs under a launcher (`mpirun`); without
/// one, the world is this process alone.
/// \code
/// const auto& world = kiln::distribute::communicator::world();
/// std::cout << "rank " << world.rank() << " of " << world.size() << "\n";
/// kiln::distribute::communicator pairs = world.split(world.rank() / 2);  // ranks {0, 1}, {2, 3}, ...
/// \endcode
class communicator {
 public:
  /// Every rank of the job.
  static const communicator& world() {
    static const communicator w(detail::runtime::get().world());
    return w;
  }

  /// This process's rank in the group, from 0.
  int rank() const { return state_->rank; }
  /// How many ranks the group has.
  int size() const { return state_->size; }
  /// The group's ranks as world ranks, in the group's order (empty for the world).
  const std::vector<int>& members() const { return state_->members; }

  /// The group of the ranks of this one that give the same `color`, ranked by `key`
  /// (ties by their rank here), as MPI_Comm_split: every rank of this group calls it.
  /// Each split makes a new group, whose collectives never meet another group's.
  communicator split(int color, int key = 0) const {
    return communicator(detail::runtime::get().split(state_, color, key));
  }

  /// Waits until every rank of the group has arrived (an all_reduce of nothing), with
  /// the collectives' timeout.
  void barrier() const;

  /// How long this group's collectives wait for every rank to arrive (by default
  /// kiln::distribute::timeout()); set it alike on every rank of the group.
  /// \code kiln::distribute::communicator::world().split(0).set_timeout(std::chrono::seconds(5)); \endcode
  void set_timeout(std::chrono::nanoseconds timeout) const {
    if (timeout <= std::chrono::nanoseconds::zero())
      throw invalid_argument_error("communicator::set_timeout: the timeout must be positive");
    std::lock_guard lock(detail::runtime::get().mutex());
    state_->timeout = timeout.count();
  }

  /// The runtime's state of the group (for kiln's collectives).
  const std::shared_ptr<detail::group_state>& state() const { return state_; }

 private:
  explicit communicator(std::shared_ptr<detail::group_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::group_state> state_;
};

/// How long a collective waits for every rank of its group to arrive before it raises
/// kiln::unavailable_error (and its group can run no more collectives): 600 s unless
/// the environment variable `KILN_COLLECTIVE_TIMEOUT` gives seconds, or the group has a
/// timeout of its own (communicator::set_timeout). Set it on every rank; it applies to
/// collectives that start after.
/// \code kiln::distribute::set_timeout(std::chrono::seconds(30)); \endcode
inline void set_timeout(std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero())
    throw invalid_argument_error("kiln::distribute::set_timeout: the timeout must be positive");
  detail::runtime::get().set_timeout(timeout);
}
/// The timeout of collectives.
/// \code auto t = kiln::distribute::timeout(); \endcode
inline std::chrono::nanoseconds timeout() { return detail::runtime::get().timeout(); }

}  // namespace kiln::distribute
// ----- end kiln/distribute/communicator.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_COMMUNICATOR_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_NCCL_HPP
#define KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_NCCL_HPP
// ----- begin kiln/distribute/nccl.hpp -----
/// \file
/// Collectives on device memory through NCCL, in CUDA builds that define
/// `KILN_HAS_NCCL` (CMake does for CUDA sources when it finds NCCL beside the CUDA
/// toolkit) and link `libnccl`. Elsewhere, and for what NCCL does not take here (an
/// integer mean, strings), device tensors travel through host memory and MPI.
///
/// Compiled, not yet run: this path waits for a GPU machine to be tested on
/// (docs/distributed.md, "NCCL and the GPU"). The agreement before each collective stays
/// on MPI; each group gets an NCCL communicator on first use, from an ncclUniqueId that
/// its rank 0 broadcasts over the group's MPI communicator; each rank uses the device
/// `local rank % device count`. NCCL's reduction order is its own (ring or tree, fixed
/// for a topology and a size), not the rank order of the MPI path.

#if KILN_HAS_NCCL && KILN_THRUST_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <memory>
#include <span>
#include <string>


namespace kiln::distribute::detail {

inline void check_nccl(ncclResult_t status, const char* what) {
  if (status == ncclSuccess) return;
  throw unavailable_error(std::string("kiln::distribute: ") + what + " failed: " + ncclGetErrorString(status));
}
inline void check_device(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw unavailable_error(std::string("kiln::distribute: ") + what + " failed: " + cudaGetErrorString(status));
}

/// A group's NCCL communicator, destroyed with the group.
struct nccl_group {
  ncclComm_t comm = nullptr;
  ~nccl_group() {
    if (comm) (void)ncclCommDestroy(comm);
  }
};

/// The NCCL communicator of group `g`, made on first use by every rank of the group.
inline ncclComm_t nccl_comm_of(group_state& g) {
  if (g.nccl) return static_cast<nccl_group*>(g.nccl.get())->comm;
  int devices = 0;
  check_device(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices == 0) throw unavailable_error("kiln::distribute: a collective on gpu tensors, but no GPU is visible");
  int local = 0;
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(variable)) {
      local = std::atoi(v);
      break;
    }
  check_device(cudaSetDevice(local % devices), "cudaSetDevice");
  ncclUniqueId id{};
  if (g.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  runtime::check(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, g.comm), "MPI_Bcast");
  auto made = std::make_shared<nccl_group>();
  check_nccl(ncclCommInitRank(&made->comm, g.size, id, g.rank), "ncclCommInitRank");
  g.nccl = made;
  return made->comm;
}

/// NCCL's type for a dtype's elements (bool as bytes).
inline ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case int32: return ncclInt32;
    case int64: return ncclInt64;
    case float32: return ncclFloat32;
    case float64: return ncclFloat64;
    default: return ncclUint8;
  }
}
inline ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::mean: return ncclAvg;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    default: return ncclSum;
  }
}

/// Whether NCCL runs collective `s` on tensors of dtype `t` here.
inline bool nccl_takes(const kiln::detail::collective_spec& s, dtype t) {
  if (t == string) return false;
  if (s.op == reduce_op::mean && !is_floating(t)) return false;  // an integer mean truncates: the host path
  return true;
}

/// Runs collective `s` on device tensors `in` (agreed on by every rank), writing one
/// device tensor per result into `results`, whose shapes `shapes` gives.
inline void run_on_nccl(group_state& g, const kiln::detail::collective_spec& s, std::span<const tensor* const> in,
                        std::span<tensor> results, std::span<const std::pair<dtype, shape>> shapes) {
  using kiln::detail::collective_kind;
  ncclComm_t comm = nccl_comm_of(g);
  const cudaStream_t stream = cudaStreamPerThread;
  const dtype t = in[0]->dtype();
  for (std::size_t k = 0; k < results.size(); ++k) results[k] = tensor(shapes[k].first, shapes[k].second, device::gpu);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (std::size_t k = 0; k < in.size(); ++k) {
    const void* send = in[k]->raw_data();
    void* receive = results[k].raw_data();
    const auto count = std::size_t(in[k]->size());
    switch (s.kind) {
      case collective_kind::all_reduce:
        check_nccl(ncclAllReduce(send, receive, count, nccl_type(t), nccl_op(s.op), comm, stream), "ncclAllReduce");
        break;
      case collective_kind::all_gather:
        check_nccl(ncclAllGather(send, receive, count, nccl_type(t), comm, stream), "ncclAllGather");
        break;
      case collective_kind::broadcast:
        check_nccl(ncclBroadcast(send, receive, count, nccl_type(t), s.root, comm, stream), "ncclBroadcast");
        break;
      case collective_kind::reduce_scatter:
        check_nccl(ncclReduceScatter(send, receive, std::size_t(results[k].size()), nccl_type(t), nccl_op(s.op), comm,
                                     stream),
                   "ncclReduceScatter");
        break;
      case collective_kind::reduce:
        check_nccl(ncclReduce(send, receive, count, nccl_type(t), ncclSum, s.root, comm, stream), "ncclReduce");
        break;
    }
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  if (s.kind == collective_kind::reduce && g.rank != s.root)  // NCCL leaves the others' results unwritten
    for (tensor& r : results)
      check_device(cudaMemsetAsync(r.raw_data(), 0, std::size_t(r.size()) * size_of(t), stream), "cudaMemsetAsync");
  check_device(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace kiln::distribute::detail

#endif
// ----- end kiln/distribute/nccl.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_NCCL_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_COLLECTIVES_HPP
#define KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_COLLECTIVES_HPP
// ----- begin kiln/distribute/collectives.hpp -----
/// \file
/// Collectives across ranks: `kiln::all_reduce`, `all_gather`, `broadcast` and
/// `reduce_scatter` (TensorFlow's CollectiveReduceV2 and its kin). Eagerly they run at
/// once; while a kiln::function traces they record a collective node
/// (kiln/exec/collective_op.hpp) that runs at every call, in program order. This file
/// also holds what runs the node (the engine over MPI) and the collectives' gradients.
///
/// Every collective starts with the ranks' agreement (kiln/distribute/runtime.hpp): a
/// rank whose collective, dtype or shapes differ from the others' makes every rank raise
/// kiln::invalid_argument_error naming the collective and what each rank gave.
///
/// The order of a floating-point sum is fixed and the same on every rank: element i of
/// an all_reduce (or reduce_scatter) is `((x_0 + x_1) + x_2) + ... + x_{n-1}` over the
/// ranks' values in rank order, then divided by n for a mean. The sum runs as a
/// reduce-scatter (an MPI_Alltoallv: rank j receives the j-th block of every rank's
/// tensor and sums it in rank order) followed by an MPI_Allgatherv of the blocks, which
/// moves the bytes a ring all-reduce moves. Integer sums, max and min are exact in any
/// order and go through MPI_Allreduce.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"

namespace kiln::distribute::detail {

using kiln::detail::collective_failure;
using kiln::detail::collective_kind;
using kiln::detail::collective_op;
using kiln::detail::collective_spec;

/// The MPI datatype of a kiln dtype's elements (bool as bytes; strings travel as
/// lengths and characters).
inline MPI_Datatype mpi_type(dtype t) {
  switch (t) {
    case int32: return MPI_INT32_T;
    case int64: return MPI_INT64_T;
    case float32: return MPI_FLOAT;
    case float64: return MPI_DOUBLE;
    default: return MPI_BYTE;
  }
}

/// `all_reduce(sum) of float32 (2, 3)`, `all_reduce(mean) of 6 float32 tensors (269322
/// elements)`: what a rank's descriptor says, for messages.
inline std::string describe(const collective_descriptor& d) {
  static constexpr std::string_view kinds[] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter", "reduce"};
  std::string text = d.kind < 5 ? std::string(kinds[d.kind]) : std::string("barrier");
  if (d.kind == 255) return text;
  const auto k = collective_kind(d.kind);
  if (k == collective_kind::all_reduce || k == collective_kind::reduce_scatter || k == collective_kind::reduce)
    text += "(" + std::string(name(reduce_op(d.op))) + ")";
  if (k == collective_kind::broadcast || k == collective_kind::reduce) text += " from root " + std::to_string(d.root);
  const std::string type(d.type < dtype_count ? name(dtype(d.type)) : std::string_view("?"));
  if (d.tensors == 1) {
    shape s;
    for (int i = 0; i < d.rank && i < max_rank; ++i) s.push_back(d.dims[i]);
    text += " of " + type + " " + s.str();
  } else {
    text += " of " + std::to_string(d.tensors) + " " + type + " tensors (" + std::to_string(d.elements) + " elements)";
  }
  if (d.device) text += " on the gpu";
  if (d.line) text += " at line " + std::to_string(d.line);
  return text;
}

/// What this rank is about to do, for the agreement.
inline collective_descriptor descriptor_of(const collective_spec& s, std::uint64_t sequence,
                                           std::span<const tensor* const> in) {
  collective_descriptor d;
  d.sequence = sequence;
  d.kind = std::uint8_t(s.kind);
  d.op = std::uint8_t(s.op);
  d.root = s.root;
  d.site = s.site;
  d.line = s.line;
  d.tensors = std::int64_t(in.size());
  d.type = std::uint8_t(in[0]->dtype());
  d.rank = std::uint8_t(in[0]->rank());
  d.device = in[0]->device() == device::cpu ? 0 : 1;
  for (int i = 0; i < in[0]->rank(); ++i) d.dims[i] = in[0]->shape()[i];
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a over each input's dtype, rank and dims
  auto mix = [&](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) hash = (hash ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  for (const tensor* t : in) {
    d.elements += t->size();
    mix(std::uint64_t(t->dtype()));
    mix(std::uint64_t(t->rank()));
    for (std::int64_t dim : t->shape().dims()) mix(std::uint64_t(dim));
    if (t->dtype() == string)
      for (std::int64_t i = 0; i < t->size(); ++i) d.string_bytes += std::int64_t(t->data<std::string>()[i].size());
  }
  d.shapes_hash = hash;
  return d;
}

/// Raises kiln::invalid_argument_error, on every rank alike, unless every rank is about
/// to run the same collective, called from the same place of the program, on tensors of
/// the same dtypes and shapes (and devices).
inline void check_agreement(const group_state& g, std::span<const collective_descriptor> all, std::string_view what) {
  auto same = [](const collective_descriptor& a, const collective_descriptor& b) {
    return a.kind == b.kind && a.op == b.op && a.root == b.root && a.site == b.site && a.type == b.type && a.rank == b.rank &&
           a.tensors == b.tensors && a.elements == b.elements && a.shapes_hash == b.shapes_hash &&
           a.device == b.device && std::equal(std::begin(a.dims), std::end(a.dims), std::begin(b.dims));
  };
  if (std::all_of(all.begin(), all.end(), [&](const collective_descriptor& d) { return same(d, all[0]); })) return;
  // Ranks that gave the same, as `ranks 0, 2 give X; rank 1 gives Y`.
  std::vector<std::vector<int>> classes;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) { return same(all[std::size_t(c[0])], all[r]); });
    if (it == classes.end())
      classes.push_back({int(r)});
    else
      it->push_back(int(r));
  }
  std::string text;
  for (const auto& c : classes) {
    text += text.empty() ? "" : "; ";
    text += c.size() == 1 ? "rank " : "ranks ";
    for (std::size_t k = 0; k < c.size(); ++k) text += (k ? ", " : "") + std::to_string(c[k]);
    text += (c.size() == 1 ? " gives " : " give ") + describe(all[std::size_t(c[0])]);
  }
  throw invalid_argument_error(std::string(what) + ": the ranks of " + runtime::group_name(g) +
                               " disagree at collective #" + std::to_string(all[0].sequence) + ": " + text);
}

/// Raises the error of `f`: kiln::type_error for a dtype, and for a shape
/// kiln::value_error while tracing or kiln::invalid_argument_error when it runs.
[[noreturn]] inline void throw_failure(const collective_failure& f, bool tracing) {
  if (f.kind == collective_failure::wrong_dtype) throw type_error(f.message);
  if (tracing) throw value_error(f.message);
  throw invalid_argument_error(f.message);
}

/// A count MPI can take (an int), or kiln::invalid_argument_error naming the collective.
inline int mpi_count(std::int64_t count, std::string_view what) {
  if (count > std::int64_t(INT32_MAX))
    throw invalid_argument_error(std::string(what) + ": " + std::to_string(count) +
                                 " elements per rank in one block are more than MPI counts (2^31 - 1)");
  return int(count);
}

/// Scratch memory of a group, kept between collectives (held under the runtime's lock),
/// so that a training step in steady state does not allocate it again.
inline void* scratch(group_state& g, std::size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  (void)g;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

/// out[e] = ((x_0[e] + x_1[e]) + x_2[e]) + ... in rank order (x_me is `own`, x_r for
/// another rank r is `received + r * stride`), divided by the count for a mean: one pass,
/// in SIMD batches (each lane adds and divides as a scalar would, so the bits are the
/// same whatever the element's place).
template <class T>
void sum_in_rank_order(T* out, const T* own, const T* received, std::int64_t count, std::int64_t stride, int me, int size,
                       bool mean) {
  auto block = [&](int r) { return r == me ? own : received + std::int64_t(r) * stride; };
  using batch = xsimd::batch<T>;
  constexpr std::int64_t lanes = std::int64_t(batch::size);
  const batch divisor = batch(T(size));
  std::int64_t e = 0;
  for (; e + lanes <= count; e += lanes) {
    batch sum = batch::load_unaligned(block(0) + e) + batch::load_unaligned(block(1) + e);
    for (int r = 2; r < size; ++r) sum += batch::load_unaligned(block(r) + e);
    if (mean) sum = sum / divisor;
    sum.store_unaligned(out + e);
  }
  for (; e < count; ++e) {
    T sum = block(0)[e] + block(1)[e];
    for (int r = 2; r < size; ++r) sum += block(r)[e];
    out[e] = mean ? sum / T(size) : sum;
  }
}

/// The tensors of a bucket read as one row of elements, without copying them.
template <class T>
struct element_row {
  std::vector<const T*> parts;
  std::vector<std::int64_t> starts;  ///< where each part starts in the row, then the row's length

  explicit element_row(std::span<const tensor* const> tensors) {
    std::int64_t at = 0;
    for (const tensor* t : tensors) {
      if (t->size() == 0) continue;
      parts.push_back(static_cast<const T*>(t->raw_data()));
      starts.push_back(at);
      at += t->size();
    }
    starts.push_back(at);
  }
  /// f(pointer, count, offset from `begin`) for each part's share of [begin, end).
  template <class F>
  void each(std::int64_t begin, std::int64_t end, F&& f) const {
    std::size_t k = std::size_t(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin());
    for (k = k == 0 ? 0 : k - 1; k < parts.size() && starts[k] < end; ++k) {
      const std::int64_t from = std::max(begin, starts[k]), to = std::min(end, starts[k + 1]);
      if (from < to) f(parts[k] + (from - starts[k]), to - from, from - begin);
    }
  }
};

/// The all-reduce (sum or mean) of a row of floats in rank order, as the file comment
/// says: in segments of at most 2^27 elements, rank j receives block j of the segment
/// from every rank (sends and receives straight from and into the tensors, split where
/// they end, rather than an MPI_Alltoallv of a packed copy), sums the blocks in rank
/// order, and an MPI_Allgatherv gives every rank every block.
template <class T>
void ordered_all_reduce(group_state& g, const element_row<T>& in, T* out, bool mean) {
  const int n = g.size, me = g.rank;
  const std::int64_t count = in.starts.back();
  constexpr std::int64_t segment = std::int64_t(1) << 27;
  const auto ranks = static_cast<std::size_t>(n);
  std::vector<int> counts(ranks), displs(ranks);
  std::vector<MPI_Request> requests;
  for (std::int64_t start = 0; start < count; start += segment) {
    const std::int64_t length = std::min(segment, count - start);
    for (int j = 0, offset = 0; j < n; ++j) {
      counts[std::size_t(j)] = int(length / n + (j < length % n));
      displs[std::size_t(j)] = offset;
      offset += counts[std::size_t(j)];
    }
    const int mine = counts[std::size_t(me)];
    const std::int64_t my_begin = start + displs[std::size_t(me)];
    // Slot j of `received` holds rank j's block `me` (slot `me` is unused).
    T* received = static_cast<T*>(scratch(g, ranks * std::size_t(mine) * sizeof(T) + sizeof(T)));
    requests.clear();
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      in.each(my_begin, my_begin + mine, [&](const T*, std::int64_t c, std::int64_t at) {
        requests.emplace_back();
        runtime::check(MPI_Irecv(received + std::int64_t(j) * mine + at, int(c), mpi_type(dtype_of<T>), j, 0, g.comm,
                                 &requests.back()),
                       "MPI_Irecv");
      });
    }
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const std::int64_t begin = start + displs[std::size_t(j)];
      in.each(begin, begin + counts[std::size_t(j)], [&](const T* p, std::int64_t c, std::int64_t) {
        requests.emplace_back();
        runtime::check(MPI_Isend(p, int(c), mpi_type(dtype_of<T>), j, 0, g.comm, &requests.back()), "MPI_Isend");
      });
    }
    runtime::check(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    // Summed part by part of this rank's own block, which may span several tensors.
    in.each(my_begin, my_begin + mine, [&](const T* own, std::int64_t c, std::int64_t at) {
      sum_in_rank_order(out + my_begin + at, own, received + at, c, mine, me, n, mean);
    });
    runtime::check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out + start, counts.data(), displs.data(),
                                  mpi_type(dtype_of<T>), g.comm),
                   "MPI_Allgatherv");
  }
}

inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

/// An exact reduction (integers, or max and min), through MPI_Allreduce in segments;
/// an integer mean truncates toward zero, as reduce_mean's.
template <class T>
void exact_all_reduce(group_state& g, const T* in, T* out, std::int64_t count, reduce_op op) {
  constexpr std::int64_t segment = std::int64_t(1) << 30;
  for (std::int64_t start = 0; start < count; start += segment)
    runtime::check(MPI_Allreduce(in + start, out + start, int(std::min(segment, count - start)), mpi_type(dtype_of<T>),
                                 mpi_op(op), g.comm),
                   "MPI_Allreduce");
  if (op == reduce_op::mean)
    for (std::int64_t e = 0; e < count; ++e) out[e] = ops::mean_of<T>(out[e], g.size);
}

/// A string tensor's characters and their lengths, packed for MPI.
struct packed_strings {
  std::vector<std::int64_t> lengths;
  std::vector<char> bytes;
};
inline packed_strings pack(const tensor& t) {
  packed_strings p;
  const std::string* s = t.data<std::string>();
  for (std::int64_t i = 0; i < t.size(); ++i) {
    p.lengths.push_back(std::int64_t(s[i].size()));
    p.bytes.insert(p.bytes.end(), s[i].begin(), s[i].end());
  }
  return p;
}
inline void unpack(tensor& out, std::int64_t first, const std::int64_t* lengths, std::int64_t count, const char* bytes) {
  auto* s = static_cast<std::string*>(out.raw_data());
  for (std::int64_t i = 0; i < count; ++i) {
    s[first + i].assign(bytes, std::size_t(lengths[i]));
    bytes += lengths[i];
  }
}

/// The group collective `s` runs over.
inline std::shared_ptr<group_state> group_for(const collective_spec& s) {
  if (s.group) return std::static_pointer_cast<group_state>(s.group);
  return runtime::get().group_of(s.members);
}

/// The number of ranks of group `members` (of a loaded graph).
inline int group_size_of(const std::vector<int>& members) { return runtime::get().group_of(members)->size; }

/// The spec of a collective called at `where`.
inline collective_spec spec_at(collective_kind kind, reduce_op op, int root, const communicator& group,
                               const std::source_location& where) {
  return {kind, op, root, group.members(), group.state(), kiln::detail::collective_site(where.file_name(), where.line(), where.column()),
          where.line()};
}

/// The collectives' runtime (`collective_runs`, the one specialization): running them
/// eagerly, recording their nodes and their gradients. A template on nothing, compiled
/// only where a program includes kiln/distribute.
template <class Unused>
struct basic_collective_runs {
  /// Runs collective `op` on eager tensors (the engine's entry point, and what the node
  /// runs): the agreement, the checks, then the transfer. Tensors on the gpu travel
  /// through host memory.
  static void run_collective(const collective_op& op, std::span<const tensor* const> given, std::span<tensor> results);

  /// The backward pass of a collective, from its spec, the inputs and the gradients of its
  /// (floating-point) results: the collectives TensorFlow differentiates them with. The
  /// gradient of an all-sum is an all-sum and of an all-mean an all-mean (as
  /// tf.distribute's ReplicaContext.all_reduce); of an all-gather, the reduce-scatter
  /// (sum) of the gradients, each rank's own block of their sum; of a broadcast, their sum
  /// on the root (NCCL's Reduce, as NcclBroadcast's gradient) and zeros elsewhere; of a
  /// reduce-scatter, the all-gather of the gradients. Max and min have none, as in
  /// TensorFlow: differentiating through them raises kiln::unavailable_error.
  static std::vector<tensor> collective_backward(const void* self, std::span<const tensor>, std::span<const tensor> dys);

  /// Records a collective on the gradient tapes recording on this thread.
  static void record_on_tapes(const collective_spec& spec, std::span<const tensor> inputs, std::span<const tensor> outputs);

  /// What a replayed trace's collective nodes hand to the tapes (their entries of
  /// kiln::detail::special_gradients).
  static void record_collective_on_tapes(const special_op& op, std::span<const tensor> inputs,
                                         std::span<const tensor> outputs);

  /// Runs collective `spec` on `inputs` eagerly, or records its node while a function
  /// traces; the gradient tapes recording see it as one differentiable op.
  static std::vector<tensor> collective(const collective_spec& spec, std::span<const tensor> inputs);
};
using collective_runs = basic_collective_runs<void>;

template <class Unused>
void basic_collective_runs<Unused>::run_collective(const collective_op& op, std::span<const tensor* const> given,
                                                   std::span<tensor> results) {
  const collective_spec& s = op.spec();
  const std::string what(kiln::detail::collective_api_name(s.kind));
  runtime& rt = runtime::get();
  const std::shared_ptr<group_state> group = group_for(s);
  group_state& g = *group;
  if (g.rank < 0)
    throw invalid_argument_error(what + ": this process (world rank " + std::to_string(rt.world_rank()) +
                                 ") is not a rank of " + runtime::group_name(g));
  for (const tensor* t : given) t->require_value(what);
  const device place = given[0]->device();
  for (const tensor* t : given)
    if (t->device() != place)
      throw invalid_argument_error(what + ": the tensors of one collective are on one device, got " +
                                   std::string(name(place)) + " and " + std::string(name(t->device())));

  std::lock_guard lock(rt.mutex());
  if (!g.broken.empty())
    throw unavailable_error(what + ": " + runtime::group_name(g) + " cannot run collectives any more: " + g.broken);
  const std::uint64_t sequence = g.sequence++;
  std::vector<collective_descriptor> all;
  if (g.size > 1) {
    all = rt.agree(g, descriptor_of(s, sequence, given), what, &describe);
    check_agreement(g, all, what);
  }
  std::vector<std::pair<dtype, shape>> specs;
  for (const tensor* t : given) specs.emplace_back(t->dtype(), t->shape());
  std::vector<std::pair<dtype, shape>> out_specs;
  if (collective_failure f = kiln::detail::check_collective(s, specs, g.size, &out_specs)) throw_failure(f, false);

  if (g.size == 1) {  // every kind is the identity on one rank
    for (std::size_t k = 0; k < given.size(); ++k) results[k] = *given[k];
    return;
  }
#if KILN_HAS_NCCL && KILN_THRUST_CUDA
  if (place == device::gpu && nccl_takes(s, given[0]->dtype())) return run_on_nccl(g, s, given, results, out_specs);
#endif
  // Elsewhere device tensors travel through host memory.
  std::vector<tensor> host;
  std::vector<const tensor*> in(given.begin(), given.end());
  if (place != device::cpu) {
    for (const tensor* x : given) host.push_back(x->to(device::cpu));
    for (std::size_t k = 0; k < in.size(); ++k) in[k] = &host[k];
  }
  const dtype t = in[0]->dtype();
  const auto element = size_of(t);
  switch (s.kind) {
    case collective_kind::all_reduce:
    case collective_kind::reduce: {
      std::int64_t total = 0;
      for (const tensor* x : in) total += x->size();
      tensor reduced = kiln::detail::allocate_result(what, t, shape{total});
      ops::visit_numeric(t, [&]<class T>() {
        if constexpr (std::is_floating_point_v<T>) {
          if (s.op == reduce_op::sum || s.op == reduce_op::mean) {
            ordered_all_reduce(g, element_row<T>(in), static_cast<T*>(reduced.raw_data()), s.op == reduce_op::mean);
            return;
          }
        }
        // Exact reductions go through MPI_Allreduce, of one buffer: a bucket is packed.
        const void* source = in[0]->raw_data();
        tensor packed;
        if (in.size() > 1) {
          packed = kiln::detail::allocate_result(what, t, shape{total});
          std::int64_t at = 0;
          for (const tensor* x : in) {
            if (x->size() > 0)
              std::memcpy(static_cast<char*>(packed.raw_data()) + at * std::int64_t(element), x->raw_data(),
                          std::size_t(x->size()) * element);
            at += x->size();
          }
          source = packed.raw_data();
        }
        exact_all_reduce(g, static_cast<const T*>(source), static_cast<T*>(reduced.raw_data()), total, s.op);
      });
      if (s.kind == collective_kind::reduce && g.rank != s.root && total > 0)
        std::memset(reduced.raw_data(), 0, std::size_t(total) * element);  // (floats: all-zero bytes are 0.0)
      std::int64_t at = 0;
      for (std::size_t k = 0; k < in.size(); ++k) {
        results[k] = reduced.share(in[k]->shape(), at);
        at += in[k]->size();
      }
      break;
    }
    case collective_kind::all_gather: {
      const shape& result_shape = out_specs[0].second;
      tensor out = kiln::detail::allocate_result(what, t, result_shape);
      const std::int64_t count = in[0]->size();
      if (t == string) {
        const packed_strings mine = pack(*in[0]);
        std::vector<std::int64_t> lengths(std::size_t(count * g.size) + 1);
        runtime::check(MPI_Allgather(mine.lengths.data(), mpi_count(count, what), MPI_INT64_T, lengths.data(),
                                     mpi_count(count, what), MPI_INT64_T, g.comm),
                       "MPI_Allgather");
        std::vector<int> byte_counts(static_cast<std::size_t>(g.size)), byte_displs(static_cast<std::size_t>(g.size));
        std::int64_t bytes = 0;
        for (int r = 0; r < g.size; ++r) {
          byte_counts[std::size_t(r)] = mpi_count(all[std::size_t(r)].string_bytes, what);
          byte_displs[std::size_t(r)] = mpi_count(bytes, what);
          bytes += all[std::size_t(r)].string_bytes;
        }
        std::vector<char> characters(std::size_t(bytes) + 1);
        runtime::check(MPI_Allgatherv(mine.bytes.data(), mpi_count(std::int64_t(mine.bytes.size()), what), MPI_CHAR,
                                      characters.data(), byte_counts.data(), byte_displs.data(), MPI_CHAR, g.comm),
                       "MPI_Allgatherv");
        for (int r = 0; r < g.size; ++r)
          unpack(out, count * r, lengths.data() + count * r, count, characters.data() + byte_displs[std::size_t(r)]);
      } else {
        const int n = mpi_count(count * std::int64_t(element), what);
        runtime::check(MPI_Allgather(in[0]->raw_data(), n, MPI_BYTE, out.raw_data(), n, MPI_BYTE, g.comm), "MPI_Allgather");
      }
      results[0] = out;
      break;
    }
    case collective_kind::broadcast: {
      tensor out = kiln::detail::allocate_result(what, t, in[0]->shape());
      const std::int64_t count = in[0]->size();
      const bool root = g.rank == s.root;
      if (t == string) {
        packed_strings p;
        if (root) p = pack(*in[0]);
        p.lengths.resize(std::size_t(count));
        p.bytes.resize(std::size_t(all[std::size_t(s.root)].string_bytes));
        runtime::check(MPI_Bcast(p.lengths.data(), mpi_count(count, what), MPI_INT64_T, s.root, g.comm), "MPI_Bcast");
        runtime::check(MPI_Bcast(p.bytes.data(), mpi_count(std::int64_t(p.bytes.size()), what), MPI_CHAR, s.root, g.comm),
                       "MPI_Bcast");
        unpack(out, 0, p.lengths.data(), count, p.bytes.data());
      } else {
        const std::int64_t bytes = count * std::int64_t(element);
        if (root && bytes > 0) std::memcpy(out.raw_data(), in[0]->raw_data(), std::size_t(bytes));
        constexpr std::int64_t segment = std::int64_t(1) << 30;
        for (std::int64_t start = 0; start < bytes; start += segment)
          runtime::check(MPI_Bcast(static_cast<char*>(out.raw_data()) + start, int(std::min(segment, bytes - start)),
                                   MPI_BYTE, s.root, g.comm),
                         "MPI_Bcast");
      }
      results[0] = out;
      break;
    }
    case collective_kind::reduce_scatter: {
      tensor out = kiln::detail::allocate_result(what, t, out_specs[0].second);
      const std::int64_t block = out.size();
      const int b = mpi_count(block, what);
      ops::visit_numeric(t, [&]<class T>() {
        const T* source = static_cast<const T*>(in[0]->raw_data());
        T* target = static_cast<T*>(out.raw_data());
        if constexpr (std::is_floating_point_v<T>) {
          if (s.op == reduce_op::sum || s.op == reduce_op::mean) {
            // Rank j receives block j of every rank (its own included) and sums them in rank order.
            T* received = static_cast<T*>(scratch(g, std::size_t(g.size) * std::size_t(block) * sizeof(T) + sizeof(T)));
            runtime::check(MPI_Alltoall(source, b, mpi_type(t), received, b, mpi_type(t), g.comm), "MPI_Alltoall");
            sum_in_rank_order(target, received + std::int64_t(g.rank) * block, received, block, block, g.rank, g.size,
                              s.op == reduce_op::mean);
            return;
          }
        }
        runtime::check(MPI_Reduce_scatter_block(source, target, b, mpi_type(t), mpi_op(s.op), g.comm),
                       "MPI_Reduce_scatter_block");
        if (s.op == reduce_op::mean)
          for (std::int64_t e = 0; e < block; ++e) target[e] = ops::mean_of<T>(target[e], g.size);
      });
      results[0] = out;
      break;
    }
  }
  if (place != device::cpu)
    for (tensor& r : results) r = r.to(place);
}

template <class Unused>
std::vector<tensor> basic_collective_runs<Unused>::collective_backward(const void* self, std::span<const tensor>,
                                                                       std::span<const tensor> dys) {
  const collective_spec& s = *static_cast<const collective_spec*>(self);
  const std::string what(kiln::detail::collective_api_name(s.kind));
  auto with = [&](collective_kind kind, reduce_op op) {
    const std::source_location here = std::source_location::current();
    return collective_spec{kind, op, s.root, s.members, s.group,
                           kiln::detail::collective_site(here.file_name(), here.line(), std::uint32_t(kind)), here.line()};
  };
  const bool differentiable = s.op == reduce_op::sum || s.op == reduce_op::mean;
  if (!differentiable && (s.kind == collective_kind::all_reduce || s.kind == collective_kind::reduce_scatter))
    throw unavailable_error(what + ": reduce_op::" + std::string(name(s.op)) +
                            " has no gradient (TensorFlow differentiates the sum and the mean of a collective only)");
  switch (s.kind) {
    case collective_kind::all_reduce: return collective(with(collective_kind::all_reduce, s.op), dys);
    case collective_kind::all_gather: return collective(with(collective_kind::reduce_scatter, reduce_op::sum), dys);
    case collective_kind::broadcast: return collective(with(collective_kind::reduce, reduce_op::sum), dys);
    case collective_kind::reduce: return collective(with(collective_kind::broadcast, reduce_op::sum), dys);
    case collective_kind::reduce_scatter: {
      std::vector<tensor> g = collective(with(collective_kind::all_gather, reduce_op::sum), dys);
      if (s.op == reduce_op::mean) g[0] = g[0] / kiln::constant(double(group_for(s)->size), g[0].dtype());
      return g;
    }
  }
  return {};
}

template <class Unused>
void basic_collective_runs<Unused>::record_on_tapes(const collective_spec& spec, std::span<const tensor> inputs,
                                                    std::span<const tensor> outputs) {
  if (!is_floating(inputs[0].dtype())) return;
  auto call = std::make_shared<kiln::detail::differentiable_call>();
  call->self = std::make_shared<const collective_spec>(spec);
  call->backward = &collective_backward;
  kiln::detail::tape_runtime::record_call_on_active_tapes(call, inputs, outputs);
}

template <class Unused>
void basic_collective_runs<Unused>::record_collective_on_tapes(const special_op& op, std::span<const tensor> inputs,
                                                               std::span<const tensor> outputs) {
  const auto* c = op.as<collective_op>();
  if (!c || inputs.empty()) return;
  // On one rank a collective gives its inputs themselves, which the tapes already know.
  if (!outputs[0].is_symbolic() && group_for(c->spec())->size == 1) return;
  record_on_tapes(c->spec(), inputs, outputs);
}

template <class Unused>
std::vector<tensor> basic_collective_runs<Unused>::collective(const collective_spec& spec,
                                                              std::span<const tensor> inputs) {
  const std::string what(kiln::detail::collective_api_name(spec.kind));
  if (inputs.empty()) throw invalid_argument_error(what + ": no tensors given");
  for (const tensor& t : inputs)
    if (!t.defined()) throw invalid_argument_error(what + ": an empty tensor was given");
  const int size = group_for(spec)->size;
  std::vector<tensor> outputs;
  if (kiln::detail::trace_context* trace = kiln::detail::trace_context::current()) {
    std::vector<std::pair<dtype, shape>> specs, results;
    for (const tensor& t : inputs) specs.emplace_back(t.dtype(), t.shape());
    if (collective_failure f = kiln::detail::check_collective(spec, specs, size, &results)) throw_failure(f, true);
    outputs = trace->record_special(std::make_shared<collective_op>(spec), inputs, results);
  } else {
    std::vector<const tensor*> pointers;
    for (const tensor& t : inputs) pointers.push_back(&t);
    outputs.resize(inputs.size());
    run_collective(collective_op(spec), pointers, outputs);
    if (size == 1) return outputs;  // its inputs themselves: nothing for a tape to record
  }
  if (kiln::detail::recording_tapes() > 0) record_on_tapes(spec, inputs, outputs);
  return outputs;
}

/// What kiln::distribute installs when a program includes it: the engine that runs
/// collective nodes, and how replayed ones reach the gradient tapes (their entries of
/// kiln::detail::special_gradients).
inline const kiln::detail::collective_engine engine{&collective_runs::run_collective, &group_size_of};
inline const bool engine_installed = [] {
  kiln::detail::collective_engine_slot().store(&engine, std::memory_order_release);
  constexpr auto record = &collective_runs::record_collective_on_tapes;
  static kiln::detail::special_gradient gradients[] = {
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::all_reduce), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::all_gather), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::broadcast), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::reduce_scatter), record},
      {kiln::detail::collective_op_name(kiln::detail::collective_kind::reduce), record}};
  for (kiln::detail::special_gradient& g : gradients) kiln::detail::register_special_gradient(g);
  return true;
}();

}  // namespace kiln::distribute::detail

namespace kiln {

/// Combines `x` across the ranks of `group` (every rank by default): each rank gets
/// the sum, mean, max or min of every rank's `x` (TensorFlow's
/// `tf.distribute.ReplicaContext.all_reduce`, CollectiveReduceV2). Every rank of the
/// group must call it, in the same order as its other collectives and from the same
/// place of the program (`where`: ranks that reach one collective from different lines
/// pass one std::source_location), with the same dtype (int32, int64, float32 or
/// float64; another raises kiln::type_error) and shape; ranks that disagree raise
/// kiln::invalid_argument_error naming what each gave.
/// A float sum is taken in rank order, the same bits on every rank
/// (kiln/distribute/collectives.hpp); an integer mean truncates toward zero. Eagerly it
/// runs at once; in a kiln::function it is a node that runs at every call. The
/// gradient of a sum is the all-reduce sum of the gradients, of a mean their mean;
/// max and min have none.
/// \code
/// const auto& world = kiln::distribute::communicator::world();
/// kiln::tensor total = kiln::all_reduce(kiln::constant(float(world.rank() + 1)));  // 1 + 2 + ... + size
/// kiln::tensor top = kiln::all_reduce(kiln::constant(world.rank()), kiln::reduce_op::max);
/// \endcode
template <class Unused = void>
tensor all_reduce(const tensor& x, reduce_op op = reduce_op::sum,
                  const distribute::communicator& group = distribute::communicator::world(),
                  std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::all_reduce, op, 0, group, where), in)[0];
}

/// The all-reduce of several tensors of one dtype in one transfer (a *bucket*, as
/// Horovod fuses tensors): each result is the all_reduce of its tensor.
/// \code
/// std::vector<kiln::tensor> grads{kiln::ones({2, 3}), kiln::zeros({4})};
/// std::vector<kiln::tensor> means = kiln::all_reduce(grads, kiln::reduce_op::mean);
/// \endcode
template <class Unused = void>
std::vector<tensor> all_reduce(const std::vector<tensor>& xs, reduce_op op = reduce_op::sum,
                               const distribute::communicator& group = distribute::communicator::world(),
                               std::source_location where = std::source_location::current()) {
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::all_reduce, op, 0, group, where), xs);
}

/// Every rank's `x`, stacked along axis 0 in rank order (CollectiveGatherV2): shape
/// `(size * d0, d1, ...)` for `x` of shape `(d0, d1, ...)`, the same on every rank. Any
/// dtype, strings included; `x` must have rank 1 or more and the same shape on every
/// rank. Its gradient is each rank's own block of the sum of the gradients.
/// \code kiln::tensor ranks = kiln::all_gather(kiln::constant({kiln::distribute::communicator::world().rank()})); \endcode
template <class Unused = void>
tensor all_gather(const tensor& x, const distribute::communicator& group = distribute::communicator::world(),
                  std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::all_gather, reduce_op::sum, 0, group, where), in)[0];
}

/// Rank `root`'s `x`, on every rank (CollectiveBcastSend/RecvV2 in one op): the other
/// ranks' `x` gives the dtype and shape, which must be the root's. Any dtype, strings
/// included. Its gradient is the sum of the gradients on the root, zeros elsewhere.
/// \code kiln::tensor seed = kiln::broadcast(kiln::constant(std::int64_t(42)), 0); \endcode
template <class Unused = void>
tensor broadcast(const tensor& x, int root = 0, const distribute::communicator& group = distribute::communicator::world(),
                 std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::broadcast, reduce_op::sum, root, group, where), in)[0];
}

/// The all-reduce of `x` cut along axis 0 into one block per rank, rank r keeping block
/// r (CollectiveReduceScatterV2): for `x` of shape `(d0, ...)` with d0 a multiple of the
/// group's size, shape `(d0 / size, ...)`. Numeric dtypes; a float sum in rank order as
/// all_reduce's. Its gradient (sum, mean) is the all-gather of the gradients.
/// \code
/// const int size = kiln::distribute::communicator::world().size();
/// kiln::tensor mine = kiln::reduce_scatter(kiln::ones({2 * size}));  // 2 elements, each `size`
/// \endcode
template <class Unused = void>
tensor reduce_scatter(const tensor& x, reduce_op op = reduce_op::sum,
                      const distribute::communicator& group = distribute::communicator::world(),
                      std::source_location where = std::source_location::current()) {
  const tensor in[] = {x};
  return distribute::detail::basic_collective_runs<Unused>::collective(
      distribute::detail::spec_at(detail::collective_kind::reduce_scatter, op, 0, group, where), in)[0];
}

}  // namespace kiln

namespace kiln::distribute {

inline void communicator::barrier() const {
  detail::runtime& rt = detail::runtime::get();
  if (size() == 1) return;
  std::lock_guard lock(rt.mutex());
  if (!state_->broken.empty())
    throw unavailable_error("communicator::barrier: " + detail::runtime::group_name(*state_) +
                            " cannot run collectives any more: " + state_->broken);
  detail::collective_descriptor d;
  d.sequence = state_->sequence++;
  d.kind = 255;
  const auto all = rt.agree(*state_, d, "communicator::barrier", &detail::describe);
  detail::check_agreement(*state_, all, "communicator::barrier");
}

}  // namespace kiln::distribute
// ----- end kiln/distribute/collectives.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_COLLECTIVES_HPP
#ifndef KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_DATA_PARALLEL_HPP
#define KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_DATA_PARALLEL_HPP
// ----- begin kiln/distribute/data_parallel.hpp -----
/// \file
/// `kiln::distribute::data_parallel`: synchronous data-parallel training, one replica
/// of the model per rank (TensorFlow's MultiWorkerMirroredStrategy, Horovod's
/// DistributedOptimizer). Each rank trains on its own part of every global batch; the
/// strategy's optimizer averages the gradients over the ranks before applying them, so
/// every rank applies the same update to the same weights.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace kiln::distribute {

/// Options of kiln::distribute::data_parallel.
struct data_parallel_options {
  /// The ranks that train together: every rank, or a group (communicator::split).
  communicator group = communicator::world();
  /// Gradients are averaged in buckets of at most this many bytes, one all-reduce per
  /// bucket (a larger gradient is a bucket of its own): fewer, larger transfers for
  /// many small tensors, at the cost of a copy of each bucket. PyTorch's DDP uses 25 MiB.
  std::size_t bucket_bytes = std::size_t(25) << 20;
  /// The rank (in `group`) whose variables every rank starts from.
  int root = 0;
};

template <class Optimizer>
class distributed_optimizer;
class data_parallel_scope;

/// Synchronous data parallelism over the ranks of a group (every rank by default): one
/// process per rank under `mpirun`, or a world of one without it, which trains exactly
/// as it would without the strategy.
///
/// - `rank()`, `size()`: this replica and how many train together.
/// - `ds.shard(size(), rank())` (or `split_batch`) gives each rank its part of the data;
///   with `batch(b)` after `shard`, the ranks' step k together hold global batch k of
///   `size() * b` elements.
/// - `optimizer(opt).apply_gradients(grads, vars)` averages each gradient over the
///   ranks (in buckets, the sum in rank order, then divided by the size), then lets
///   `opt` apply the averages. Variables it has not seen before are first given the
///   root's values (`broadcast_variables`).
/// - `reduce(op, value)` combines a loss or a metric over the ranks for reporting.
/// - `scope()` makes the strategy the one kiln's training loops and checkpoints see
///   (kiln/train/replicas.hpp).
///
/// \code
/// kiln::distribute::data_parallel strategy;
/// kiln::variable w(kiln::constant({0.5f, -0.5f}), "w");
/// strategy.broadcast_variables({w});  // every rank starts from rank 0's values
/// kiln::optimizers::adam adam({.learning_rate = 1e-2});
/// auto opt = strategy.optimizer(adam);
/// kiln::function train_step([&](const kiln::tensor& x, const kiln::tensor& y) {
///   kiln::gradient_tape tape;
///   kiln::tensor loss = kiln::reduce_mean(kiln::square(kiln::reduce_sum(w * x, 1) - y));
///   opt.apply_gradients(tape.gradient(loss, std::vector{w}), {w});
///   return loss;
/// });
/// \endcode
class data_parallel {
 public:
  explicit data_parallel(data_parallel_options options = {}) : state_(std::make_shared<state>(std::move(options))) {
    const int n = state_->options.group.size();
    if (state_->options.root < 0 || state_->options.root >= n)
      throw invalid_argument_error("data_parallel: root " + std::to_string(state_->options.root) +
                                   " is not a rank of a group of " + std::to_string(n));
    if (state_->options.bucket_bytes == 0) throw invalid_argument_error("data_parallel: bucket_bytes must be positive");
  }

  /// This replica's rank, from 0.
  int rank() const { return group().rank(); }
  /// How many replicas train together.
  int size() const { return group().size(); }
  /// The ranks that train together.
  const communicator& group() const { return state_->options.group; }
  const data_parallel_options& options() const { return state_->options; }

  /// `opt` wrapped so that `apply_gradients` averages the gradients over the ranks
  /// first. The wrapper refers to `opt`, which must outlive it. (Copies of a strategy
  /// are the same strategy.)
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// kiln::optimizers::sgd sgd({.learning_rate = 0.1});
  /// kiln::variable v(1.f);
  /// strategy.optimizer(sgd).apply_gradients({kiln::constant(2.f)}, {v});  // v: 1 - 0.1 * 2 on every rank
  /// \endcode
  template <class Optimizer>
  distributed_optimizer<Optimizer> optimizer(Optimizer& opt) const {
    static_assert(requires(const std::vector<tensor>& g, const std::vector<variable>& v) { opt.apply_gradients(g, v); },
                  "kiln::distribute::data_parallel::optimizer: wraps an optimizer, whose apply_gradients(grads, vars) "
                  "takes a std::vector<kiln::tensor> and a std::vector<kiln::variable>");
    return distributed_optimizer<Optimizer>(opt, *this);
  }

  /// Gives every rank the root's values of `vars` (a broadcast per variable), eagerly,
  /// even while a function traces (as kiln::init_scope); the strategy's optimizer then
  /// does not broadcast them again. Every rank calls it with the same variables.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// kiln::variable b(kiln::zeros({4}), "b");
  /// strategy.broadcast_variables({b});
  /// \endcode
  template <class = void>
  void broadcast_variables(const std::vector<variable>& vars) const { share_variables(vars, true); }

  /// The gradients averaged over the ranks: an all-reduce mean per bucket of gradients
  /// of one dtype (options().bucket_bytes), in their order; undefined ones stay
  /// undefined (every rank must leave the same ones undefined). One rank: `grads` itself.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// std::vector<kiln::tensor> mean = strategy.average_gradients({kiln::ones({3}), kiln::ones({2, 2})});
  /// \endcode
  template <class = void>
  std::vector<tensor> average_gradients(const std::vector<tensor>& grads) const {
    if (size() == 1) return grads;
    std::vector<tensor> out = grads;
    // Buckets: consecutive gradients of one dtype, up to bucket_bytes each.
    std::vector<std::size_t> bucket;
    std::size_t bytes = 0;
    auto flush = [&] {
      if (bucket.empty()) return;
      std::vector<tensor> in;
      for (std::size_t k : bucket) in.push_back(grads[k]);
      std::vector<tensor> reduced = kiln::all_reduce(in, reduce_op::mean, group());
      for (std::size_t i = 0; i < bucket.size(); ++i) out[bucket[i]] = std::move(reduced[i]);
      bucket.clear();
      bytes = 0;
    };
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const tensor& g = grads[k];
      if (!g.defined()) continue;
      const bool sized = g.shape().is_fully_defined();
      const std::size_t size = sized ? std::size_t(g.size()) * size_of(g.dtype()) : state_->options.bucket_bytes;
      if (!bucket.empty() && (grads[bucket[0]].dtype() != g.dtype() || bytes + size > state_->options.bucket_bytes)) flush();
      bucket.push_back(k);
      bytes += size;
    }
    flush();
    return out;
  }

  /// This rank's rows of a global batch (its first dim, which must be known): of n
  /// rows, rank r gets rows [r * n / size, (r + 1) * n / size), as `np.array_split`
  /// cuts them. With n a multiple of size() every rank gets n / size() rows, and the
  /// ranks' averaged gradient is the gradient of the whole batch's mean loss.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// kiln::tensor mine = strategy.split_batch(kiln::ones({8, 3}));  // 8 / size rows
  /// \endcode
  template <class = void>
  tensor split_batch(const tensor& global_batch) const {
    const shape& s = global_batch.shape();
    if (!s.has_known_rank() || s.rank() == 0 || s[0] == none)
      throw value_error("data_parallel::split_batch: a batch with a known first dim is needed, got shape " + s.str());
    const auto [begin, end] = rows(s[0]);
    int_list first{begin}, count{end - begin};
    for (int d = 1; d < s.rank(); ++d) first.push_back(0), count.push_back(-1);
    return kiln::slice(global_batch, first, count);
  }
  /// The rows [begin, end) of a global batch of `n` rows that split_batch gives this rank.
  /// \code auto [begin, end] = kiln::distribute::data_parallel().rows(128); \endcode
  std::pair<std::int64_t, std::int64_t> rows(std::int64_t n) const {
    const std::int64_t r = rank(), k = size(), base = n / k, extra = n % k;
    const std::int64_t begin = r * base + std::min(r, extra);
    return {begin, begin + base + (r < extra ? 1 : 0)};
  }

  /// `value` combined over the ranks (an all_reduce), for reporting a loss or a metric:
  /// `reduce(reduce_op::mean, loss)` is the mean of the ranks' losses.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// double mean_loss = strategy.reduce(kiln::reduce_op::mean, 0.25);
  /// \endcode
  template <class = void>
  tensor reduce(reduce_op op, const tensor& value) const { return kiln::all_reduce(value, op, group()); }
  template <class = void>
  double reduce(reduce_op op, double value) const {
    return reduce(op, kiln::constant(value)).item<double>();
  }

  /// Makes this strategy the one kiln::fit and checkpoints use on this thread.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// auto scope = strategy.scope();
  /// \endcode
  template <class = void>
  [[nodiscard]] data_parallel_scope scope() const;

 private:
  template <class>
  friend class distributed_optimizer;
  struct state {
    explicit state(data_parallel_options o) : options(std::move(o)) {}
    data_parallel_options options;
    std::mutex mutex;
    std::vector<const void*> seen;  ///< the identities of the variables every rank holds alike
  };
  // Broadcasts the variables of `vars` not seen before (all of them when `every`).
  template <class = void>
  void share_variables(const std::vector<variable>& vars, bool every) const {
    if (size() == 1) return;
    std::vector<variable> fresh;
    {
      std::lock_guard lock(state_->mutex);
      for (const variable& v : vars) {
        if (!v) throw invalid_argument_error("data_parallel: a variable is an empty handle");
        const bool seen = std::find(state_->seen.begin(), state_->seen.end(), v.identity()) != state_->seen.end();
        if (seen && !every) continue;
        if (!seen) state_->seen.push_back(v.identity());
        fresh.push_back(v);
      }
    }
    if (fresh.empty()) return;
    init_scope now;  // at once, even while a function traces: every rank traces it at the same point
    for (const variable& v : fresh) {
      tensor value;
      try {
        value = v.read_value();
      } catch (const value_error&) {
        throw value_error("data_parallel: variable '" + v.name() +
                          "' gets its value only when the function being traced first runs, so the ranks could not "
                          "start from the same value; create it before the first call (or call "
                          "broadcast_variables on it after)");
      }
      v.assign(kiln::broadcast(value, state_->options.root, group()));
    }
  }

  std::shared_ptr<state> state_;
};

/// While it lives, its strategy is the one kiln's training loops and checkpoints see
/// on this thread (kiln/train/replicas.hpp); then the one before is again. It cannot
/// be copied or moved, so scopes end in the reverse order of their start. Made by
/// data_parallel::scope().
class data_parallel_scope {
 public:
  data_parallel_scope(const data_parallel_scope&) = delete;
  data_parallel_scope& operator=(const data_parallel_scope&) = delete;
  ~data_parallel_scope() { kiln::detail::current_replica_context() = previous_; }

 private:
  friend class data_parallel;
  template <class = void>
  explicit data_parallel_scope(const data_parallel& strategy)
      : strategy_(strategy), previous_(kiln::detail::current_replica_context()) {
    context_.rank = strategy.rank();
    context_.size = strategy.size();
    context_.self = this;
    context_.average_gradients = [](const void* self, const std::vector<tensor>& grads) {
      return of(self).average_gradients(grads);
    };
    context_.broadcast_variables = [](const void* self, const std::vector<variable>& vars) {
      of(self).broadcast_variables(vars);
    };
    context_.mean = [](const void* self, std::span<double> values) {
      if (values.empty()) return;
      const tensor t = kiln::constant(std::vector<double>(values.begin(), values.end()));
      const std::vector<double> means = of(self).reduce(reduce_op::mean, t).to_vector<double>();
      std::copy(means.begin(), means.end(), values.begin());
    };
    context_.barrier = [](const void* self) { of(self).group().barrier(); };
    kiln::detail::current_replica_context() = &context_;
  }
  static const data_parallel& of(const void* self) { return static_cast<const data_parallel_scope*>(self)->strategy_; }
  data_parallel strategy_;
  kiln::detail::replica_context context_;
  const kiln::detail::replica_context* previous_;
};

template <class>
data_parallel_scope data_parallel::scope() const {
  return data_parallel_scope(*this);
}

/// An optimizer whose `apply_gradients` averages the gradients over the ranks of its
/// strategy first (Horovod's DistributedOptimizer): made by data_parallel::optimizer.
/// On one rank it is the optimizer itself.
/// \code
/// kiln::distribute::data_parallel strategy;
/// kiln::optimizers::adam adam;
/// kiln::distribute::distributed_optimizer<kiln::optimizers::adam> opt = strategy.optimizer(adam);
/// opt.iterations();  // adam's
/// \endcode
template <class Optimizer>
class distributed_optimizer {
 public:
  distributed_optimizer(Optimizer& opt, const data_parallel& strategy) : optimizer_(&opt), strategy_(strategy) {}

  /// Gives unseen variables the root's values, averages `grads` over the ranks
  /// (data_parallel::average_gradients), then applies them with the wrapped optimizer.
  /// Every rank calls it with the same variables, and gradients of the same dtypes and
  /// shapes (defined for the same variables); a disagreement raises
  /// kiln::invalid_argument_error naming the all-reduce.
  template <class = void>
  void apply_gradients(const std::vector<tensor>& grads, const std::vector<variable>& vars) {
    if (strategy_.size() == 1) return optimizer_->apply_gradients(grads, vars);
    if (grads.size() != vars.size())
      throw invalid_argument_error("distributed_optimizer.apply_gradients: " + std::to_string(grads.size()) +
                                   " gradients for " + std::to_string(vars.size()) + " variables");
    strategy_.share_variables(vars, false);
    optimizer_->apply_gradients(strategy_.average_gradients(grads), vars);
  }
  /// The wrapped optimizer's step count.
  const variable& iterations() const { return optimizer_->iterations(); }
  /// The wrapped optimizer.
  Optimizer& inner() const { return *optimizer_; }

 private:
  Optimizer* optimizer_;
  data_parallel strategy_;
};

}  // namespace kiln::distribute
// ----- end kiln/distribute/data_parallel.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DISTRIBUTE_DATA_PARALLEL_HPP
// ----- end kiln/distributed.hpp -----
#endif  // KILN_SINGLE_INCLUDE_KILN_DISTRIBUTED_HPP

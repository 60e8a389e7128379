#pragma once
/// \file
/// Runs a graph on concrete tensors. The first call with new argument dtypes, devices
/// and shapes builds a plan (kiln/exec/plan.hpp) and caches it; later calls find it
/// with a few comparisons and run it in a workspace kept from earlier calls: fused
/// clusters tile by tile (large ones over the thread pool), other ops through
/// function pointers chosen at planning. Tensors off the CPU, and shapes a rule
/// rejects, run node by node through detail::execute, which raises eager's errors.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/small_vector.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/exec/jit.hpp"
#include "kiln/exec/plan.hpp"
#include "kiln/exec/planner.hpp"
#include "kiln/exec/workspace.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail {

/// Runs one graph, from any number of threads at once.
/// \code
/// kiln::function twice([](const kiln::tensor& x) { return x + x; });
/// const kiln::graph g = twice.get_concrete_function(kiln::constant(2.f)).graph();
/// kiln::detail::graph_executor run(g);
/// std::vector<kiln::tensor> out = run.run(std::vector<kiln::tensor>{kiln::constant(2.f)});  // [4]
/// \endcode
/// (A template on nothing, as the planner's functions are, so that a program compiles
/// the executor and the planner only where it runs a graph.)
template <class = void>
class basic_graph_executor {
 public:
  /// Plans kept per executor; calls with yet other shapes plan for themselves.
  static constexpr int max_cached_plans = 32;

  /// With `native_loops`, fused clusters are compiled to native loops (kiln/exec/jit.hpp).
  /// Runs take their workspaces from `pool`, which other executors may share (a
  /// function's traces do), or from a pool of their own.
  explicit basic_graph_executor(const graph& g, jit_switch native_loops = {},
                                std::shared_ptr<exec::workspace_pool> pool = nullptr)
      : graph_(&g), outline_(g), native_(native_loops),
        pool_(pool ? std::move(pool) : std::make_shared<exec::workspace_pool>()) {}
  basic_graph_executor(const basic_graph_executor&) = delete;
  basic_graph_executor& operator=(const basic_graph_executor&) = delete;

  /// Runs the graph on `args` (one eager tensor per placeholder) and returns the outputs.
  std::vector<tensor> run(std::span<const tensor> args) const;

  /// The same, with the outputs in `outputs` (cleared first): a caller that keeps the
  /// vector makes a call in steady state allocate nothing but what the kernels need.
  void run(std::span<const tensor> args, std::vector<tensor>& outputs) const;

  /// The same, where the run may consume the first `consumed.size()` arguments
  /// (`consumed` is their storage): the caller does not read them afterwards, so an op
  /// may write one in place when no one else holds its buffer (a loop's variables).
  void run(std::span<const tensor> args, std::vector<tensor>& outputs, std::span<tensor> consumed) const;

  /// How many plans this executor has cached (one per argument shape set seen).
  int cached_plans() const;

  /// The schedule for `args`, one step per word: an op's name, or a fused cluster
  /// as its ops in brackets (braces for a native loop); `interpreted` when the graph
  /// runs node by node.
  /// For example `"[mul add] matmul [tanh]"`.
  std::string schedule(std::span<const tensor> args) const;

 private:
  // A workspace for one run: taken from the idle slot without locking in the common
  // single-caller case, returned with the call's fresh values released.
  class lease {
   public:
    lease(exec::workspace_pool& pool, const exec::execution_plan& p) : pool_(pool), plan_(p), ws_(pool.acquire()) {}
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      for (int v : plan_.fresh) ws_->value(v) = tensor();
      pool_.give_back(ws_);
    }
    exec::workspace* operator->() const { return ws_; }
    exec::workspace& operator*() const { return *ws_; }

   private:
    exec::workspace_pool& pool_;
    const exec::execution_plan& plan_;
    exec::workspace* ws_;
  };

  const exec::execution_plan& find_plan(std::span<const tensor> args, std::unique_ptr<exec::execution_plan>& transient) const;
  // The plan of a call that runs node by node without being planned.
  static const exec::execution_plan& unplanned();
  const exec::execution_plan* find_cached(std::span<const tensor> args, int count) const;

  static std::span<const tensor* const> gather_inputs(const std::vector<int>& ids, exec::workspace& ws);

  // Runs op step `s` in place when the value it may write (see op_step::in_place) has
  // its buffer to itself: a value of the call, or an argument given to consume.
  // Returns false, having done nothing, when it cannot.
  static bool run_in_place(const exec::op_step& s, exec::workspace& ws, std::span<tensor> consumed);

  void run_op(const exec::op_step& s, const exec::execution_plan& p, exec::workspace& ws) const;

  // Runs the special op of node `id` and stores its results in the values of `id`
  // and the Result nodes after it, which `results` gives side by side from `first`.
  void run_special(int id, std::span<const tensor* const> inputs, std::span<tensor> results, std::size_t first) const;

  void run_cluster(const exec::fused_cluster& c, const exec::execution_plan& p, exec::workspace& ws) const;

  static void run_chunk(const exec::fused_cluster& c, void* const* bases, char* buffers, void** table, std::int64_t lo,
                        std::int64_t hi);

  // Tiles ahead that prefetch_tile asks for: one tile of a five-op chain takes about
  // as long as a trip to memory, and with two threads sharing the bus one tile ahead
  // measured 1.45x the hand loop on 16M floats, two tiles 1.16x.
  static constexpr std::int64_t prefetch_distance = 2;

  // Asks for the memory of the streamed operands of the tile from `t` on, `len`
  // elements, while the current tile computes: the hardware prefetcher sees no
  // stream during a compute-bound op, so without this every tile would start with
  // a wait for memory. (A single pass streams: the hardware keeps up, and on AMD Zen 4
  // these prefetches made a folded chain 1.45x slower than none.)
  // Written operands too, so that their stores do not wait for the lines to be read
  // for ownership.
  static void prefetch_tile(const exec::fused_cluster& c, void* const* bases, std::int64_t t, std::int64_t len);

  // GCC may delete a loop whose only effect is __builtin_prefetch (C++ loops are
  // assumed to finish, and a prefetch is no side effect), so on x86 the prefetch is
  // an asm statement the compiler must keep.
  static void prefetch_line(const char* p);

  static void run_code(const exec::fused_cluster& c, void* const* table, std::int64_t len);

  // The last `len` (< padded_elements) elements of a cluster, from `t` on: inputs are
  // copied to staging buffers and padded with their last element, the code runs on
  // padded_elements, and the results are copied back.
  static void run_staged(const exec::fused_cluster& c, void* const* bases, char* staging, void** table, std::int64_t t,
                         std::int64_t len);

  // Node by node on eager tensors, as eager execution runs them: the path for
  // tensors off the CPU, and for calls whose shapes some op's rule rejects.
  std::vector<tensor> interpret(std::span<const tensor> args, const exec::execution_plan* p = nullptr,
                                std::span<tensor> consumed = {}) const;

  // The error in flight, raised again naming graph node `id`, as TensorFlow's graph
  // errors name their node.
  [[noreturn]] KILN_COLD KILN_NOINLINE void rethrow_at_node(int id) const {
    rethrow_with_prefix("node '" + graph_->node_at(id).name() + "': ");
  }

  const graph* graph_;
  exec::graph_outline outline_;
  bool native_ = false;

  mutable std::mutex plans_mutex_;  // guards owned_plans_ and publishing new plans
  mutable std::vector<std::unique_ptr<exec::execution_plan>> owned_plans_;
  mutable std::array<std::atomic<const exec::execution_plan*>, max_cached_plans> cached_{};
  mutable std::atomic<int> cached_count_{0};
  mutable std::atomic<const exec::execution_plan*> recent_{nullptr};

  std::shared_ptr<exec::workspace_pool> pool_;
};

using graph_executor = basic_graph_executor<>;

#if KILN_DEFINE_LIBRARY
template <class Lazy>
void basic_graph_executor<Lazy>::run(std::span<const tensor> args, std::vector<tensor>& outputs,
                                     std::span<tensor> consumed) const {
  outputs.clear();
  if (args.size() != graph_->arguments().size())
    throw invalid_argument_error("the graph takes " + std::to_string(graph_->arguments().size()) + " arguments, got " +
                                 std::to_string(args.size()));
  // check_numerics names the op that produced a NaN or an Inf, so every op's
  // result must exist: node by node, no fusion.
  const bool eager = std::all_of(args.begin(), args.end(), [](const tensor& a) { return a.defined() && !a.is_symbolic(); });
  if (debugging::check_numerics_enabled() || !eager) {
    outputs = interpret(args, nullptr, consumed);
    return;
  }
  std::unique_ptr<exec::execution_plan> transient;
  const exec::execution_plan& p = find_plan(args, transient);
  if (p.interpreted) {
    outputs = interpret(args, &p, consumed);
    return;
  }

  lease ws(*pool_, p);
  if (ws->bound_plan != p.id) ws->bind(*graph_, p);
  const auto& arguments = graph_->arguments();
  for (std::size_t i = 0; i < args.size(); ++i) ws->refs[std::size_t(arguments[i])] = &args[i];
  for (const exec::plan_step& s : p.steps) {
    if (const auto* op = std::get_if<exec::op_step>(&s.action)) {
      try {
        if (!op->in_place || !run_in_place(*op, *ws, consumed)) run_op(*op, p, *ws);
      } catch (const error&) {
        rethrow_at_node(op->value);
      }
    } else if (const auto* cluster = std::get_if<exec::cluster_step>(&s.action)) {
      run_cluster(p.clusters[std::size_t(cluster->cluster)], p, *ws);
    } else if (const auto* special = std::get_if<exec::special_step>(&s.action)) {
      try {
        run_special(special->value, gather_inputs(special->inputs, *ws), ws->values, ws->index_of(special->value));
      } catch (const error&) {
        rethrow_at_node(special->value);
      }
    }
    for (int r : s.release) ws->value(r) = tensor();
  }
  outputs.reserve(p.outputs.size());
  for (int v : p.outputs) outputs.push_back(*ws->refs[std::size_t(v)]);
}
#endif

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
std::vector<tensor> basic_graph_executor<Unused>::run(std::span<const tensor> args) const {
  std::vector<tensor> outputs;
  run(args, outputs);
  return outputs;
}

template <class Unused>
void basic_graph_executor<Unused>::run(std::span<const tensor> args, std::vector<tensor>& outputs) const {
  run(args, outputs, {});
}

template <class Unused>
int basic_graph_executor<Unused>::cached_plans() const {
  return cached_count_.load(std::memory_order_acquire);
}

template <class Unused>
std::string basic_graph_executor<Unused>::schedule(std::span<const tensor> args) const {
  std::unique_ptr<exec::execution_plan> transient;
  const exec::execution_plan& p = find_plan(args, transient);
  if (p.interpreted) return "interpreted";
  std::string s;
  for (const exec::plan_step& step : p.steps) {
    if (!s.empty()) s += ' ';
    const auto* cluster = std::get_if<exec::cluster_step>(&step.action);
    if (!cluster) {
      const auto* op = std::get_if<exec::op_step>(&step.action);
      const int value = op ? op->value : std::get<exec::special_step>(step.action).value;
      s += graph_->node_at(value).op();
      continue;
    }
    const exec::fused_cluster& c = p.clusters[std::size_t(cluster->cluster)];
    s += c.native ? '{' : '[';
    for (int id : c.nodes) s += std::string(graph_->node_at(id).op()) + ' ';
    s.back() = c.native ? '}' : ']';
  }
  return s;
}

template <class Unused>
auto basic_graph_executor<Unused>::find_plan(std::span<const tensor> args,
                                             std::unique_ptr<exec::execution_plan>& transient) const
    -> const exec::execution_plan& {
  if (const exec::execution_plan* p = recent_.load(std::memory_order_acquire); p && p->accepts(args)) return *p;
  const int seen = cached_count_.load(std::memory_order_acquire);
  if (const exec::execution_plan* p = find_cached(args, seen)) return *p;
  // Past the cache, arguments whose shapes keep changing (a loop body over a growing
  // tensor_array) would be planned at every call, which costs more than running the
  // graph node by node; on a GPU a plan also holds the constants copied there. A full
  // cache no longer changes, so the search above was complete: such a call, made once
  // per iteration, neither locks nor searches again.
  auto on_cpu = [](const tensor& a) { return a.device() == device::cpu; };
  if (seen == max_cached_plans && std::all_of(args.begin(), args.end(), on_cpu)) return unplanned();
  std::lock_guard lock(plans_mutex_);
  const int count = cached_count_.load(std::memory_order_relaxed);
  if (const exec::execution_plan* p = find_cached(args, count)) return *p;  // planned by another thread meanwhile
  if (count == max_cached_plans && std::all_of(args.begin(), args.end(), on_cpu)) return unplanned();
  auto fresh = exec::planner::build_plan(*graph_, outline_, args);
  if (native_)
    if (const exec::native_loop_compiler compile = hooks().native_loops.load(std::memory_order_acquire))
      compile(*fresh);
  if (count == max_cached_plans) {
    transient = std::move(fresh);
    return *transient;
  }
  const exec::execution_plan* p = owned_plans_.emplace_back(std::move(fresh)).get();
  cached_[std::size_t(count)].store(p, std::memory_order_release);
  cached_count_.store(count + 1, std::memory_order_release);
  recent_.store(p, std::memory_order_release);
  return *p;
}

template <class Unused>
auto basic_graph_executor<Unused>::unplanned() -> const exec::execution_plan& {
  static const exec::execution_plan p = [] {
    exec::execution_plan q;
    q.interpreted = true;
    return q;
  }();
  return p;
}

template <class Unused>
auto basic_graph_executor<Unused>::find_cached(std::span<const tensor> args, int count) const
    -> const exec::execution_plan* {
  for (int i = 0; i < count; ++i) {
    const exec::execution_plan* p = cached_[std::size_t(i)].load(std::memory_order_acquire);
    if (p->accepts(args)) {
      recent_.store(p, std::memory_order_release);
      return p;
    }
  }
  return nullptr;
}

template <class Unused>
auto basic_graph_executor<Unused>::gather_inputs(const std::vector<int>& ids, exec::workspace& ws)
    -> std::span<const tensor* const> {
  for (std::size_t k = 0; k < ids.size(); ++k) ws.inputs[k] = ws.refs[std::size_t(ids[k])];
  return {ws.inputs.data(), ids.size()};
}

template <class Unused>
bool basic_graph_executor<Unused>::run_in_place(const exec::op_step& s, exec::workspace& ws,
                                                std::span<tensor> consumed) {
  tensor* x = s.argument < 0                              ? &ws.value(s.inputs[0])
              : std::size_t(s.argument) < consumed.size() ? &consumed[std::size_t(s.argument)]
                                                          : nullptr;
  if (!x || !x->sole_owner()) return false;
  ws.value(s.value) = s.in_place(s.op, *x, gather_inputs(s.inputs, ws));
  return true;
}

template <class Unused>
void basic_graph_executor<Unused>::run_op(const exec::op_step& s, const exec::execution_plan& p,
                                          exec::workspace& ws) const {
  tensor& out = ws.value(s.value);
  if (s.allocate) {
    const exec::value_info& v = p.values[s.value];
    out = allocate_result(graph_->node_at(s.value).op(), v.type, v.dims);
  }
  s.run(s.op, gather_inputs(s.inputs, ws), out);
}

template <class Unused>
void basic_graph_executor<Unused>::run_special(int id, std::span<const tensor* const> inputs, std::span<tensor> results,
                                               std::size_t first) const {
  const node& n = graph_->node_at(id);
  n.special().run(inputs, results.subspan(first, std::size_t(n.result_count())));
}

template <class Unused>
void basic_graph_executor<Unused>::run_cluster(const exec::fused_cluster& c, const exec::execution_plan& p,
                                               exec::workspace& ws) const {
  for (const exec::cluster_check& k : c.checks) {
    try {
      k.fn(k.op, gather_inputs(k.inputs, ws));
    } catch (const error&) {
      rethrow_at_node(k.node);
    }
  }
  for (int v : c.allocated) {
    const exec::value_info& info = p.values[v];
    try {
      ws.value(v) = allocate_result(graph_->node_at(v).op(), info.type, info.dims);
    } catch (const error&) {  // out of memory
      rethrow_at_node(v);
    }
  }
  if (c.size == 0) return;
  void** bases = ws.bases.data();
  for (const auto* list : {&c.streamed, &c.broadcast})
    for (const exec::cluster_operand& o : *list) bases[o.entry] = ws.refs[std::size_t(o.value)]->raw_data();
  for (const exec::gathered_operand& o : c.gathered) bases[o.entry] = ws.refs[std::size_t(o.value)]->raw_data();

  // Chunks of whole tiles, each with its own scratch; one chunk runs inline.
  std::int64_t chunks = 1;
  if (c.size > backend::cpu::elementwise_grain)
    chunks = balanced_chunks(c.size, backend::cpu::elementwise_grain, config::num_threads());
  const std::int64_t per_chunk = ((c.size + chunks - 1) / chunks + c.tile - 1) / c.tile * c.tile;
  chunks = (c.size + per_chunk - 1) / per_chunk;
  char* buffers = nullptr;
  void** tables = nullptr;
  ws.reserve_chunks(c, chunks, buffers, tables);
  auto chunk = [&](std::int64_t k) {
    run_chunk(c, bases, buffers + std::size_t(k) * c.chunk_bytes(), tables + k * c.table_stride(), k * per_chunk,
              std::min(c.size, (k + 1) * per_chunk));
  };
  if (chunks == 1) {
    chunk(0);
  } else {
    parallel_for(chunks, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t k = lo; k < hi; ++k) chunk(k);
    });
  }
}

template <class Unused>
void basic_graph_executor<Unused>::run_chunk(const exec::fused_cluster& c, void* const* bases, char* buffers,
                                             void** table, std::int64_t lo, std::int64_t hi) {
  for (int b = 0; b < c.buffers; ++b) table[b] = buffers + std::size_t(b) * c.buffer_bytes;
  for (const exec::cluster_operand& o : c.broadcast) table[o.entry] = bases[o.entry];
  for (std::int64_t t = lo; t < hi; t += c.tile) {
    const std::int64_t len = std::min(c.tile, hi - t);
    const std::int64_t whole = len / exec::padded_elements * exec::padded_elements;
    if (whole > 0) {
      for (const exec::cluster_operand& o : c.streamed)
        table[o.entry] = static_cast<char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes);
      for (const exec::gathered_operand& o : c.gathered)
        o.read.gather(o.read, bases[o.entry], table[o.entry], t, whole);
      if (const std::int64_t ahead = t + prefetch_distance * c.tile; !c.single_pass() && ahead < hi)
        prefetch_tile(c, bases, ahead, std::min(c.tile, hi - ahead));
      run_code(c, table, whole);
    }
    if (whole < len)
      run_staged(c, bases, buffers + std::size_t(c.buffers) * c.buffer_bytes, table, t + whole, len - whole);
  }
}

template <class Unused>
void basic_graph_executor<Unused>::prefetch_tile(const exec::fused_cluster& c, void* const* bases, std::int64_t t,
                                                 std::int64_t len) {
  constexpr std::int64_t line = 64;
  for (const exec::cluster_operand& o : c.streamed) {
    const char* p = static_cast<const char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes);
    const std::int64_t bytes = len * std::int64_t(o.element_bytes);
    for (std::int64_t b = 0; b < bytes; b += line) prefetch_line(p + b);
  }
}

template <class Unused>
void basic_graph_executor<Unused>::prefetch_line(const char* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

template <class Unused>
void basic_graph_executor<Unused>::run_code(const exec::fused_cluster& c, void* const* table, std::int64_t len) {
  if (c.native) return c.native(table, len);
  for (const exec::instruction& i : c.code) {
    if (i.compound) {
      i.compound(i.op, i.contig, i.fold, table[i.out], table, i.in.data(), len);
    } else {
      // Entry by entry: one wide load of entries just stored could not be forwarded
      // from those stores and would wait for every older one, the tile's included.
      const void* operands[3];
      for (int k = 0; k < i.arity; ++k) operands[k] = table[i.in[std::size_t(k)]];
      i.fn(i.op, i.contig, table[i.out], operands, len, false);
    }
  }
}

template <class Unused>
void basic_graph_executor<Unused>::run_staged(const exec::fused_cluster& c, void* const* bases, char* staging,
                                              void** table, std::int64_t t, std::int64_t len) {
  // Copies of the last element in words of its size: a memcpy call per element cost
  // more than the ops of a one-element cluster (a loop's counter and scalars).
  auto pad = [len](char* p, std::size_t bytes) {
    auto fill = [&]<class Word>(std::type_identity<Word>) {
      Word last;
      std::memcpy(&last, p + (len - 1) * std::int64_t(sizeof(Word)), sizeof(Word));
      for (std::int64_t i = len; i < exec::padded_elements; ++i)
        std::memcpy(p + i * std::int64_t(sizeof(Word)), &last, sizeof(Word));
    };
    switch (bytes) {
      case 1:
        return fill(std::type_identity<std::uint8_t>());
      case 4:
        return fill(std::type_identity<std::uint32_t>());
      case 8:
        return fill(std::type_identity<std::uint64_t>());
      default:
        for (std::int64_t i = len; i < exec::padded_elements; ++i)
          std::memcpy(p + i * bytes, p + (len - 1) * bytes, bytes);
    }
  };
  for (std::size_t k = 0; k < c.streamed.size(); ++k) {
    const exec::cluster_operand& o = c.streamed[k];
    char* s = staging + k * exec::staging_bytes;
    table[o.entry] = s;
    if (o.written) continue;
    std::memcpy(s, static_cast<const char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes),
                std::size_t(len) * o.element_bytes);
    pad(s, o.element_bytes);
  }
  for (const exec::gathered_operand& o : c.gathered) {
    o.read.gather(o.read, bases[o.entry], table[o.entry], t, len);
    pad(static_cast<char*>(table[o.entry]), o.read.element_bytes);
  }
  run_code(c, table, exec::padded_elements);
  for (std::size_t k = 0; k < c.streamed.size(); ++k) {
    const exec::cluster_operand& o = c.streamed[k];
    if (o.written)
      std::memcpy(static_cast<char*>(bases[o.entry]) + t * std::int64_t(o.element_bytes),
                  staging + k * exec::staging_bytes, std::size_t(len) * o.element_bytes);
  }
}

template <class Unused>
std::vector<tensor> basic_graph_executor<Unused>::interpret(std::span<const tensor> args, const exec::execution_plan* p,
                                                            std::span<tensor> consumed) const {
  const graph& g = *graph_;
  std::vector<tensor> values(g.nodes().size());
  for (std::size_t i = 0; i < args.size(); ++i)
    values[std::size_t(g.arguments()[i])] = i < consumed.size() ? std::move(consumed[i]) : args[i];
  auto needed_constant = [&](int i) { return outline_.needed[i] && g.node_at(i).kind() == node_kind::constant; };
  for (int i = 0; i < outline_.needed.size(); ++i)
    if (needed_constant(i)) values[std::size_t(i)] = g.node_at(i).value();
  if (p)
    for (const auto& [id, moved] : p->moved_constants) values[std::size_t(id)] = moved;
  // A constant may be an op's result folded at trace time.
  const bool checking = debugging::check_numerics_enabled();
  if (checking)
    for (int i = 0; i < outline_.needed.size(); ++i)
      if (needed_constant(i)) check_numerics(g.node_at(i).op(), values[std::size_t(i)], g.node_at(i).name());
  for (std::size_t k = 0; k < outline_.ops.size(); ++k) {
    const int id = outline_.ops[k];
    const node& n = g.node_at(id);
    small_vector<const tensor*, 4> inputs;
    inputs.reserve(n.input_ids().size());
    for (int in : n.input_ids()) inputs.emplace_back(&values[std::size_t(in)]);
    try {
      const std::span<const tensor* const> in(inputs.begin(), inputs.size());
      if (n.kind() == node_kind::special) {
        run_special(id, in, values, std::size_t(id));
      } else if (n.kind() == node_kind::op) {
        // An op that may write its first input in place (set_item, pad_rows) does,
        // when this node reads it last and it has its buffer to itself.
        tensor& x = values[std::size_t(n.input_ids().empty() ? id : n.input_ids()[0])];
        const exec::in_place_fn in_place =
            !n.input_ids().empty() && outline_.last_reader[n.input_ids()[0]] == int(k) && x.sole_owner()
                ? in_place_of(n.operation())
                : nullptr;
        values[std::size_t(id)] = in_place ? in_place(n.operation().address(), x, in) : execute_any(n.operation(), in);
      }
    } catch (const error&) {
      rethrow_at_node(id);
    }
    if (checking)
      for (int r = id; r < id + std::max(n.result_count(), 1); ++r)
        check_numerics(n.op(), values[std::size_t(r)], n.name());
    for (int r : outline_.release(k)) values[std::size_t(r)] = tensor();
  }
  std::vector<tensor> outputs;
  outputs.reserve(outline_.outputs.size());
  for (int v : outline_.outputs) outputs.push_back(values[std::size_t(v)]);
  return outputs;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// The function pointers through which a lower layer reaches code of a higher one,
/// all in one struct: `detail::hooks()`. Each is null until the higher layer fills it,
/// where a program first uses what it serves (makes a gradient tape, traces a loop,
/// turns jit_compile or check_numerics on), so that a program that never does compiles
/// none of the code behind it, and no header includes a layer above its own.
///
/// A caller loads a hook and calls it when set; the tape hooks, all set together before
/// a thread's first tape counts itself, are called unchecked behind tapes_recording().

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"

namespace kiln {

class graph;
class tensor_array;
struct loop_options;

namespace ops {
class any_op;
}  // namespace ops

namespace detail {

template <class>
struct basic_concrete_state;
using concrete_state = basic_concrete_state<void>;
struct cond_branches;
class while_op;
class trace_context;
struct traced_subgraph;
struct loop_calls;

namespace exec {
struct execution_plan;
}  // namespace exec

/// Counts the gradient tapes recording on the calling thread (kiln/autodiff/tape.hpp).
using tape_counter = int& (*)();
/// Records an eager or traced op on the tapes of its thread, which may replace `out`
/// by a copy (detail::unaliased_for_tapes).
using tape_recorder = void (*)(const ops::any_op& op, std::span<const tensor* const> in, tensor& out);
/// Watches a kiln::variable's value read (the variable's identity and the value) on
/// the tapes of its thread, as TensorFlow's tapes watch trainable variables.
using variable_read_recorder = void (*)(const void* variable, const tensor& value);
/// Records a call of a kiln::function (its trace `c`) on the tapes of its thread.
using call_recorder = void (*)(const concrete_state& c, std::span<const tensor> inputs, std::span<const tensor> outputs);
/// Records a traced `cond` node (its branches, kiln/exec/control_flow.hpp) on the tapes
/// recording in its trace.
using cond_recorder = void (*)(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                               std::span<const tensor> outputs);
/// Records a traced `while` node on the tapes recording in its trace.
using loop_recorder = void (*)(const while_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs);
/// Runs graph `g` node by node, so that the tapes recording see each op.
using graph_replayer = std::vector<tensor> (*)(const graph& g, std::span<const tensor> args);
/// Records a `cond` into trace `trace` (detail::record_cond, kiln/trace/control_flow.hpp).
using cond_tracer = std::vector<tensor> (*)(trace_context& trace, const tensor& pred, traced_subgraph& then_graph,
                                            traced_subgraph& else_graph);
/// Traces a `while` loop (detail::trace_while_loop, kiln/trace/control_flow.hpp).
using loop_tracer = std::vector<tensor> (*)(trace_context&, std::size_t, const loop_options&, std::vector<tensor>,
                                            std::vector<const tensor_array*>, std::vector<std::pair<dtype, shape>>,
                                            std::vector<std::optional<shape>>, bool, loop_calls&);
/// Compiles the clusters of a plan that native loops handle (kiln/exec/jit.hpp).
namespace exec {
using native_loop_compiler = void (*)(execution_plan&);
}  // namespace exec
/// Checks an op's result for NaN and Inf (detail::check_numerics, kiln/eager/check_numerics.hpp).
using numerics_check = void (*)(std::string_view op, const tensor& result, std::string_view node);

/// Every hook, each with who fills it and why it is a hook.
struct runtime_hooks {
  // Filled by kiln::gradient_tape's constructor (kiln/autodiff/tape.hpp), when a
  // program makes its first tape: ops, function calls, control flow and variable reads
  // (all below autodiff) reach the tapes of their thread, and a program without tapes
  // compiles no backward pass.

  /// How many tapes record on this thread; read through tapes_recording().
  std::atomic<tape_counter> tape_count{nullptr};
  /// Every op run or recorded (ops/op_table.hpp, eager/apply.hpp) while tapes record.
  std::atomic<tape_recorder> tape{nullptr};
  /// A kiln::variable read (trace/effects.hpp) while tapes record.
  std::atomic<variable_read_recorder> variable_read{nullptr};
  /// A kiln::function call without effects (trace/runtime_tier.hpp): one
  /// differentiable op, its backward pass kiln/autodiff/function_gradient.hpp's.
  std::atomic<call_recorder> call{nullptr};
  /// A `cond` node traced (trace/control_flow.hpp) or replayed (autodiff/replay.hpp).
  std::atomic<cond_recorder> cond{nullptr};
  /// A `while` node traced (trace/control_flow.hpp) or replayed (autodiff/replay.hpp).
  std::atomic<loop_recorder> loop{nullptr};
  /// A kiln::function call with effects, or inside a trace, run op by op
  /// (trace/runtime_tier.hpp) so that the tapes see each op (autodiff/replay.hpp).
  std::atomic<graph_replayer> replay{nullptr};

  /// Filled by the tracer (kiln/trace/control_flow.hpp) when a program first traces a
  /// `cond`: the gradient of a `cond` node (autodiff/function_gradient.hpp) records its
  /// own with it, so that a program that makes tapes but traces no cond compiles none.
  std::atomic<cond_tracer> trace_cond{nullptr};
  /// Filled by the tracer (kiln/trace/control_flow.hpp) when a program first traces a
  /// loop: the gradient of a `while` node (autodiff/function_gradient.hpp) traces its
  /// own loops with it, so that a program with tapes but no loops compiles no loop tracer.
  std::atomic<loop_tracer> trace_loop{nullptr};

  /// Filled by function_options::jit_compile (kiln/exec/jit.hpp) where a program turns
  /// it on: executors (exec/executor.hpp) compile native loops through it, so that a
  /// program that never does compiles none of jit.hpp's functions.
  std::atomic<exec::native_loop_compiler> native_loops{nullptr};

  /// Filled by kiln::debugging::enable_check_numerics (kiln/eager/check_numerics.hpp)
  /// and emptied by disable_check_numerics: every eager op checks its result through
  /// it, so that a program that never enables it compiles none of the check.
  std::atomic<numerics_check> check_numerics{nullptr};
};

/// The hooks of this program.
inline runtime_hooks& hooks() {
  static runtime_hooks table;
  return table;
}

/// Whether a gradient tape records on this thread: false until a program makes its
/// first tape, then as kiln/autodiff/tape.hpp counts them.
inline bool tapes_recording() {
  const tape_counter count = hooks().tape_count.load(std::memory_order_relaxed);
  return count && count() > 0;
}

}  // namespace detail

}  // namespace kiln

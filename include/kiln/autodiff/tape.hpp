#pragma once
/// \file
/// Reverse-mode gradients of eager code: kiln::gradient_tape records the eager ops
/// that read watched tensors (or results of recorded ops) while it is alive, and
/// `gradient` runs each recorded op's formula (kiln/autodiff/backward.hpp) from the
/// target back to the sources, as TensorFlow's GradientTape does.
///
/// A tape knows an eager tensor by its elements' address, dtype and shape: the tape
/// holds every tensor it recorded, so no recorded buffer is reused while it lives. It
/// knows a symbolic tensor by its trace and node: a tape made inside a kiln::function
/// records the ops the trace records, and `gradient` adds the backward pass to the same
/// graph. Reading a kiln::variable while a tape records watches the value read, as
/// TensorFlow's tapes watch trainable variables. The ops a tape runs to compute
/// gradients go through the kernel table and are recorded by the other tapes of the
/// thread, which is how nested tapes give higher-order gradients.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autodiff/backward.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/graph/node_index.hpp"
#include "kiln/ops/op_table.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {

/// What `gradient_tape::gradient` gives for a source the target does not depend on:
/// an undefined tensor (`none`, TensorFlow's default) or zeros of the source's shape.
enum class unconnected_gradients { none, zero };

/// Options of a gradient_tape: a persistent tape may compute gradients more than once.
struct gradient_tape_options {
  bool persistent = false;
};

class gradient_tape;
class variable;

namespace detail {

template <class>
struct basic_concrete_state;
using concrete_state = basic_concrete_state<void>;

/// A kiln::function call as the tapes record it: the backward pass of its trace
/// (kiln/autodiff/function_gradient.hpp), behind a function pointer.
struct differentiable_call {
  /// Owns what `backward` needs (the trace's backward function).
  std::shared_ptr<const void> self;
  /// Gives the gradients of the call's floating-point inputs and of each variable in
  /// `variables`, in that order, from the call's `inputs` and one gradient per
  /// floating-point output.
  std::vector<tensor> (*backward)(const void* self, std::span<const tensor> inputs, std::span<const tensor> output_grads);
  /// The variables the trace reads (their identities), with their dtypes and shapes.
  std::vector<std::tuple<const void*, dtype, shape>> variables;
};


/// A tensor as a tape knows it: an eager one by its elements, a symbolic one by the
/// value of the trace it stands for; or a variable read inside a kiln::function call.
struct tape_key {
  const void* data = nullptr;
  std::uint64_t trace_id = 0;
  int node = -1;
  dtype type;
  shape dims;
  KILN_LIBRARY_INLINE explicit tape_key(const tensor& t);
  /// The reads of the variable with identity `variable` inside function calls.
  KILN_LIBRARY_INLINE static tape_key of_variable(const void* variable, dtype t, const shape& s);
  friend bool operator==(const tape_key& a, const tape_key& b) {
    return a.data == b.data && a.trace_id == b.trace_id && a.node == b.node && a.type == b.type && a.dims == b.dims;
  }
  /// A hash of what tells keys apart but the dims (values of one buffer or node with
  /// other shapes are rare: they share a hash and compare unequal).
  KILN_LIBRARY_INLINE std::size_t hash() const;

 private:
  tape_key(dtype t, const shape& s) : type(t), dims(s) {}
};

/// Tensors by tape_key, as a tape keeps what it recorded and the gradients it sums:
/// entries in one array, found through a node_index, so that recording an op or
/// accumulating a gradient allocates nothing (a std::map allocated a node per entry
/// and compared shapes on every step down its tree).
/// \code
/// kiln::detail::tape_table table;
/// const kiln::tensor x = kiln::constant(1.f);
/// table.emplace(kiln::detail::tape_key(x), x);
/// table.find(kiln::detail::tape_key(x));  // points to x
/// \endcode
class tape_table {
 public:
  /// The tensor kept under `key`, or null.
  KILN_LIBRARY_INLINE tensor* find(const tape_key& key);
  KILN_LIBRARY_INLINE const tensor* find(const tape_key& key) const;
  KILN_LIBRARY_INLINE bool contains(const tape_key& key) const;
  /// Keeps `t` under `key` unless a tensor is kept there; returns the one kept and
  /// whether it is `t`.
  KILN_LIBRARY_INLINE std::pair<tensor*, bool> emplace(const tape_key& key, const tensor& t);
  KILN_LIBRARY_INLINE void clear();

 private:
  std::vector<std::pair<tape_key, tensor>> entries_;
  node_index index_;
};

/// How many gradient tapes record on this thread; the layers below read it through
/// detail::tapes_recording() (kiln/core/hooks.hpp), which a tape fills with it.
KILN_LIBRARY_INLINE int& recording_tapes();

/// The tapes recording on this thread, innermost last.
KILN_LIBRARY_INLINE std::vector<gradient_tape*>& active_tapes();

/// What the tapes of a thread record, and how backward passes are traced
/// (`tape_runtime`, the one specialization): the functions the hooks above point to
/// once a tape is made, and those they share. A template on nothing, so that a program
/// compiles it only where it makes a tape (the tape's constructor names it), and a
/// compiled kiln compiles all of it with one explicit instantiation
/// (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_tape_runtime {
  /// Records op `op`'s result `out` on the tapes that watch its inputs (here).
  static void record_on_active_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out);
  /// Hands a read of the variable with identity `variable` to the tapes (here).
  static void watch_on_active_tapes(const void* variable, const tensor& value);
  /// Records a call described by `call` on the tapes of this thread (here).
  static void record_call_on_active_tapes(const std::shared_ptr<const differentiable_call>& call,
                                          std::span<const tensor> in, std::span<const tensor> out);
  /// Records a call of concrete function `c` (kiln/autodiff/function_gradient.hpp).
  static void record_function_call(const concrete_state& c, std::span<const tensor> inputs,
                                   std::span<const tensor> outputs);
  /// Records a `cond` node (kiln/autodiff/function_gradient.hpp).
  static void record_cond_on_tapes(const tensor& pred, cond_branches branches, std::span<const tensor> captures,
                                   std::span<const tensor> outputs);
  /// Records a `while` node (kiln/autodiff/function_gradient.hpp).
  static void record_loop_on_tapes(const while_op& op, std::span<const tensor> inputs, std::span<const tensor> outputs);
  /// Hands special node `n` to the tapes (kiln/autodiff/replay.hpp).
  static void record_special_on_tapes(const node& n, std::span<const tensor> value, std::size_t at, std::size_t count);
  /// Runs graph `g` node by node for the tapes (kiln/autodiff/replay.hpp).
  static std::vector<tensor> replay(const graph& g, std::span<const tensor> args);
  /// Registers the kernels of the ops the tapes' formulas share (detail::tape_ops; here).
  static void register_tape_kernels();
  /// The gradients of `target` with respect to `sources`, then to each variable of
  /// `ids`: the sum over its values read while `tape` recorded and its reads inside
  /// recorded function calls (undefined where the target depends on none; here).
  static std::vector<tensor> gradients_with_variables(gradient_tape& tape, const tensor& target,
                                                      std::vector<tensor> sources,
                                                      const std::vector<std::tuple<const void*, dtype, shape>>& ids);
  /// The gradients of `target` with respect to `sources` on `tape`; `variables`, when
  /// given, adds the gradient of each variable's reads inside function calls after
  /// those of `sources` (here).
  static std::vector<tensor> gradients_of(gradient_tape& tape, const tensor& target, const std::vector<tensor>& sources,
                                          const std::vector<std::tuple<const void*, dtype, shape>>* variables = nullptr);
  /// The vector-Jacobian product of a graph (kiln/autodiff/function_gradient.hpp).
  static std::vector<tensor> vector_jacobian_product(const graph& g, std::span<const tensor> args,
                                                     const std::vector<tensor>& sources,
                                                     std::span<const tensor> output_grads,
                                                     const std::vector<std::tuple<const void*, dtype, shape>>& variables,
                                                     std::vector<bool>* connected = nullptr);
};
using tape_runtime = basic_tape_runtime<void>;

/// `g` summed over the dims it was broadcast along, as a tensor of shape `to`.
KILN_LIBRARY_INLINE tensor unbroadcast(const tensor& g, const shape& to);

/// `a + b`, or whichever is defined.
KILN_LIBRARY_INLINE tensor sum_defined(const tensor& a, const tensor& b);

/// Registers detail::tape_ops, when a tape is made.
template <class... Ops>
void register_tape_ops(boost::mp11::mp_list<Ops...>) {
  (register_kernels_on_use<Ops>(), ...);
}
#if KILN_DEFINE_LIBRARY
template <class Unused>
void basic_tape_runtime<Unused>::register_tape_kernels() {
  register_tape_ops(tape_ops{});
}
#endif

}  // namespace detail

/// Records eager ops on watched tensors while alive; `gradient` differentiates a
/// target with respect to sources, as TensorFlow's `tf.GradientTape`.
/// \code
/// kiln::tensor x = kiln::constant(3.f);
/// kiln::gradient_tape tape;
/// tape.watch(x);
/// kiln::tensor y = x * x;
/// std::cout << tape.gradient(y, x);  // tensor(6.0, shape=(), dtype=float32)
/// \endcode
class gradient_tape {
 public:
  // A template, and what it names depends on `Lazy`, so that only a program that makes
  // a tape compiles the formulas' ops and the backward pass of functions.
  template <class Lazy = void>
  explicit gradient_tape(gradient_tape_options options = {})
      : persistent_(options.persistent),
        trace_id_(detail::trace_context::current() ? detail::trace_context::current()->id() : 0) {
    detail::basic_tape_runtime<Lazy>::register_tape_kernels();
    detail::hooks().tape_count.store(&detail::recording_tapes, std::memory_order_relaxed);
    detail::hooks().tape.store(&detail::basic_tape_runtime<Lazy>::record_on_active_tapes, std::memory_order_relaxed);
    detail::hooks().variable_read.store(&detail::basic_tape_runtime<Lazy>::watch_on_active_tapes, std::memory_order_relaxed);
    detail::hooks().call.store(&detail::basic_tape_runtime<Lazy>::record_function_call, std::memory_order_relaxed);
    detail::hooks().cond.store(&detail::basic_tape_runtime<Lazy>::record_cond_on_tapes, std::memory_order_relaxed);
    detail::hooks().loop.store(&detail::basic_tape_runtime<Lazy>::record_loop_on_tapes, std::memory_order_relaxed);
    detail::hooks().replay.store(&detail::basic_tape_runtime<Lazy>::replay, std::memory_order_relaxed);
    detail::active_tapes().push_back(this);
    ++detail::recording_tapes();
  }
  gradient_tape(const gradient_tape&) = delete;
  gradient_tape& operator=(const gradient_tape&) = delete;
  KILN_LIBRARY_INLINE ~gradient_tape();

  /// Records the ops that read `t` from now on (floating-point tensors only; inside a
  /// kiln::function, symbolic ones too).
  template <class = void>
  void watch(const tensor& t) {
    if (t.defined() && is_floating(t.dtype())) tracked_.emplace(detail::tape_key(t), t);
  }

  /// The gradient of `target` (summed when it is not a scalar) with respect to
  /// `source`: a tensor of the source's shape, or per `unconnected` when the target
  /// does not depend on it (an undefined tensor by default; integer sources never do).
  template <class = void>
  tensor gradient(const tensor& target, const tensor& source,
                  unconnected_gradients unconnected = unconnected_gradients::none) {
    return gradient(target, std::vector<tensor>{source}, unconnected)[0];
  }
  /// Gradients of `target` with respect to each of `sources`.
  template <class Unused = void>
  std::vector<tensor> gradient(const tensor& target, const std::vector<tensor>& sources,
                               unconnected_gradients unconnected = unconnected_gradients::none) {
    std::vector<tensor> out = detail::basic_tape_runtime<Unused>::gradients_of(*this, target, sources);
    for (std::size_t k = 0; k < sources.size(); ++k)
      if (!out[k].defined() && sources[k].defined())
        out[k] = unconnected_gradient(sources[k].dtype(), sources[k].shape(), sources[k].device(), unconnected);
    return out;
  }

  /// The gradient of `target` with respect to variable `v`: the sum over the values
  /// of `v` read while the tape recorded (variables are watched when read).
  /// \code
  /// kiln::variable v(3.f);
  /// kiln::gradient_tape tape;
  /// kiln::tensor y = v * v;
  /// tape.gradient(y, v);  // tensor(6.0, shape=(), dtype=float32)
  /// \endcode
  template <std::same_as<variable> Variable>
  tensor gradient(const tensor& target, const Variable& v, unconnected_gradients unconnected = unconnected_gradients::none) {
    return gradient(target, std::vector<Variable>{v}, unconnected)[0];
  }
  /// Gradients of `target` with respect to each of `vars`, as `apply_gradients` takes them.
  template <std::same_as<variable> Variable>
  std::vector<tensor> gradient(const tensor& target, const std::vector<Variable>& vars,
                               unconnected_gradients unconnected = unconnected_gradients::none) {
    std::vector<std::tuple<const void*, dtype, shape>> ids;
    for (const Variable& v : vars) {
      if (!v) throw invalid_argument_error("gradient_tape.gradient: a source variable is an empty handle");
      ids.emplace_back(v.identity(), v.dtype(), v.shape());
    }
    std::vector<tensor> out = detail::tape_runtime::gradients_with_variables(*this, target, {}, ids);
    for (std::size_t k = 0; k < vars.size(); ++k)
      if (!out[k].defined()) out[k] = unconnected_gradient(vars[k].dtype(), vars[k].shape(), kiln::device::cpu, unconnected);
    return out;
  }

 private:
  template <class>
  friend struct detail::basic_tape_runtime;

  // A source the target does not depend on: zeros on request, else an undefined tensor.
  KILN_LIBRARY_INLINE static tensor unconnected_gradient(dtype t, const shape& s, kiln::device d, unconnected_gradients unconnected);
  template <class = void>
  void watch_read(const void* variable, const tensor& value) {
    if (!records(value)) return;
    const detail::tape_key key(value);
    auto [begin, end] = variable_reads_.equal_range(variable);
    if (std::none_of(begin, end, [&](const auto& read) { return detail::tape_key(read.second) == key; }))
      variable_reads_.emplace(variable, value);
    watch(value);
  }

  // A recorded op, or a recorded function call (`call` set, `op` unused): its `inputs`
  // and then its `outputs` are the tensors of values_ from `first` on (one array for
  // the whole tape instead of two vectors per entry).
  struct entry {
    ops::any_op op;
    std::shared_ptr<const detail::differentiable_call> call;
    std::size_t first = 0;
    std::uint32_t inputs = 0;
    std::uint32_t outputs = 0;
  };
  KILN_LIBRARY_INLINE std::span<const tensor> inputs_of(const entry& e) const;
  KILN_LIBRARY_INLINE std::span<const tensor> outputs_of(const entry& e) const;

  // A tape records the values of where it was made: eager ones outside a function,
  // the trace's own inside one (not those of a function traced while it records).
  KILN_LIBRARY_INLINE bool records(const tensor& t) const;

  template <class = void>
  void record(const ops::any_op& op, std::span<const tensor* const> in, const tensor& out) {
    if (!records(out)) return;
    bool reads_tracked = false;
    for (const tensor* t : in) reads_tracked = reads_tracked || tracked_.contains(detail::tape_key(*t));
    if (!reads_tracked) return;
    entries_.push_back(entry{op, nullptr, values_.size(), std::uint32_t(in.size()), 1});
    for (const tensor* t : in) values_.push_back(*t);
    values_.push_back(out);
    tracked_.emplace(detail::tape_key(out), out);
  }

  // A kiln::function call: recorded when it reads a tracked tensor or a variable
  // (variables are watched when read).
  template <class = void>
  void record_call(const std::shared_ptr<const detail::differentiable_call>& call, std::span<const tensor> in,
                   std::span<const tensor> out) {
    if (std::ranges::none_of(out, [&](const tensor& t) { return records(t); })) return;
    bool reads_tracked = !call->variables.empty();
    for (const tensor& t : in) reads_tracked = reads_tracked || tracked_.contains(detail::tape_key(t));
    if (!reads_tracked) return;
    entries_.push_back(entry{ops::any_op(), call, values_.size(), std::uint32_t(in.size()), std::uint32_t(out.size())});
    values_.insert(values_.end(), in.begin(), in.end());
    values_.insert(values_.end(), out.begin(), out.end());
    for (const tensor& t : out)
      if (is_floating(t.dtype())) tracked_.emplace(detail::tape_key(t), t);
  }

  // Adds `g` to the gradient kept under `key`.
  template <class = void>
  static void accumulate(detail::tape_table& grads, const detail::tape_key& key, const tensor& g) {
    if (!g.defined()) return;  // unconnected
    auto [at, fresh] = grads.emplace(key, g);
    if (!fresh) *at = detail::sum_defined(*at, g);
  }

  template <class = void>
  void backpropagate_call(const entry& e, detail::tape_table& grads) const {
    auto reached = [&](const tensor& y) { return is_floating(y.dtype()) && grads.contains(detail::tape_key(y)); };
    if (std::ranges::none_of(outputs_of(e), reached)) return;
    std::vector<tensor> dys;
    for (const tensor& y : outputs_of(e))
      if (is_floating(y.dtype())) dys.push_back(reached(y) ? *grads.find(detail::tape_key(y)) : detail::zeros_shaped_like(y));
    const std::vector<tensor> g = e.call->backward(e.call->self.get(), inputs_of(e), dys);
    std::size_t k = 0;
    for (const tensor& x : inputs_of(e))
      if (is_floating(x.dtype())) accumulate(grads, detail::tape_key(x), g[k++]);
    for (const auto& [id, t, s] : e.call->variables) accumulate(grads, detail::tape_key::of_variable(id, t, s), g[k++]);
  }

  // Runs each recorded op's formula from the last to the first, for the inputs that
  // lead back to a watched tensor only (a formula skips the others, as a captured
  // constant's: computing them would add nodes that the optimizer prunes again).
  template <class = void>
  void backpropagate(const tensor& target, detail::tape_table& grads) const {
    grads.emplace(detail::tape_key(target),
                  detail::one_filled("gradient", detail::like_shape("gradient", target), target.dtype(), target.device()));
    std::vector<tensor> in_grads;
    std::vector<char> needed;
    for (auto e = entries_.rbegin(); e != entries_.rend(); ++e) {
      if (e->call) {
        backpropagate_call(*e, grads);
        continue;
      }
      const tensor* found = grads.find(detail::tape_key(outputs_of(*e)[0]));
      if (!found) continue;
      const tensor dy = *found;
      const std::span<const tensor> inputs = inputs_of(*e);
      in_grads.assign(inputs.size(), tensor());
      needed.assign(inputs.size(), 0);
      for (std::size_t i = 0; i < inputs.size(); ++i)
        needed[i] = is_floating(inputs[i].dtype()) && tracked_.contains(detail::tape_key(inputs[i]));
      detail::kernels_of(e->op).backward.load(std::memory_order_acquire)(e->op, inputs, outputs_of(*e)[0], dy, needed,
                                                                          in_grads);
      for (std::size_t i = 0; i < inputs.size(); ++i)
        if (needed[i] && in_grads[i].defined())
          accumulate(grads, detail::tape_key(inputs[i]), detail::unbroadcast(in_grads[i], inputs[i].shape()));
    }
  }

  KILN_LIBRARY_INLINE void pause();
  KILN_LIBRARY_INLINE void resume();

  bool persistent_ = false;
  std::uint64_t trace_id_;  ///< the trace the tape was made in, 0 outside one
  bool used_ = false;
  bool recording_ = true;
  std::vector<entry> entries_;
  std::vector<tensor> values_;    ///< the entries' inputs and outputs
  detail::tape_table tracked_;  ///< watched tensors and results of recorded ops, held
  std::multimap<const void*, tensor> variable_reads_;  ///< each variable's values read while recording
};

#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE gradient_tape::~gradient_tape() {
  auto& tapes = detail::active_tapes();
  std::erase(tapes, this);
  if (recording_) --detail::recording_tapes();
}

template <class Unused>
std::vector<tensor> detail::basic_tape_runtime<Unused>::gradients_with_variables(
    gradient_tape& tape, const tensor& target, std::vector<tensor> sources,
    const std::vector<std::tuple<const void*, dtype, shape>>& ids) {
  const std::size_t given = sources.size();
  std::vector<std::size_t> first{given};  // where each variable's reads start in `sources`
  for (const auto& [id, t, s] : ids) {
    auto [begin, end] = tape.variable_reads_.equal_range(id);
    for (auto it = begin; it != end; ++it) sources.push_back(it->second);
    first.push_back(sources.size());
  }
  std::vector<tensor> per_source = gradients_of(tape, target, sources, &ids);
  std::vector<tensor> out(per_source.begin(), per_source.begin() + std::ptrdiff_t(given));
  for (std::size_t k = 0; k < ids.size(); ++k) {
    tensor sum = per_source[sources.size() + k];  // the reads inside function calls
    for (std::size_t r = first[k]; r < first[k + 1]; ++r) sum = detail::sum_defined(sum, per_source[r]);
    out.push_back(sum);
  }
  return out;
}
template <class Unused>
std::vector<tensor> detail::basic_tape_runtime<Unused>::gradients_of(
    gradient_tape& tape, const tensor& target, const std::vector<tensor>& sources,
    const std::vector<std::tuple<const void*, dtype, shape>>* variables) {
  if (!target.defined()) throw invalid_argument_error("gradient_tape.gradient: the target is an empty tensor");
  for (std::size_t k = 0; k < sources.size(); ++k)
    if (!sources[k].defined())
      throw invalid_argument_error("gradient_tape.gradient: source " + std::to_string(k) + " is an empty tensor");
  if (tape.used_ && !tape.persistent_)
    throw invalid_argument_error(
        "gradient_tape: a non-persistent tape computes one set of gradients; make it with {.persistent = true}");
  tape.used_ = true;
  detail::tape_table grads;
  {
    // The ops that compute gradients are not this tape's to record (the other tapes
    // of the thread record them).
    struct paused {
      gradient_tape& tape;
      ~paused() { tape.resume(); }
    } guard{(tape.pause(), tape)};
    if (is_floating(target.dtype()) && tape.tracked_.contains(detail::tape_key(target))) tape.backpropagate(target, grads);
  }
  std::vector<tensor> out;
  for (const tensor& s : sources) {
    const tensor* g = nullptr;
    if (s.defined() && tape.tracked_.contains(detail::tape_key(s))) g = grads.find(detail::tape_key(s));
    out.push_back(g ? *g : tensor());
  }
  if (variables)
    for (const auto& [id, t, s] : *variables) {
      const tensor* g = grads.find(detail::tape_key::of_variable(id, t, s));
      out.push_back(g ? *g : tensor());
    }
  if (!tape.persistent_) tape.entries_.clear(), tape.values_.clear(), tape.tracked_.clear(), tape.variable_reads_.clear();
  return out;
}
#endif

namespace detail {

/// A copy of eager `x` (numbers, not strings) in a buffer of its own, on x's device.
KILN_LIBRARY_INLINE tensor fresh_copy(const tensor& x);

/// `out`, or while gradient tapes record, a copy of it when it is a floating-point
/// view of one of its eager inputs' buffers. Tapes tell eager tensors apart by buffer
/// address, dtype and shape, and a view can share all three with another tensor on
/// the tape (`m[0]` read twice; `reshape(x, {1, n})[0]` and `x`), whose gradient would
/// then be counted twice.
KILN_LIBRARY_INLINE tensor unaliased_for_tapes(tensor out, std::span<const tensor* const> in);

#if KILN_DEFINE_LIBRARY
template <class Unused>
void basic_tape_runtime<Unused>::record_on_active_tapes(const ops::any_op& op, std::span<const tensor* const> in, tensor& out) {
  out = unaliased_for_tapes(std::move(out), in);
  for (gradient_tape* tape : active_tapes()) tape->record(op, in, out);
}

template <class Unused>
void basic_tape_runtime<Unused>::watch_on_active_tapes(const void* variable, const tensor& value) {
  for (gradient_tape* tape : active_tapes()) tape->watch_read(variable, value);
}
#endif

/// Records a call described by `call` on the tapes of this thread.
#if KILN_DEFINE_LIBRARY
template <class Unused>
void basic_tape_runtime<Unused>::record_call_on_active_tapes(const std::shared_ptr<const differentiable_call>& call,
                                                             std::span<const tensor> in, std::span<const tensor> out) {
  for (gradient_tape* tape : active_tapes()) tape->record_call(call, in, out);
}
#endif

}  // namespace detail

/// `x`, cut off from every gradient tape: gradients do not flow through the result.
/// \code kiln::tensor frozen = kiln::stop_gradient(kiln::constant({1.f, 2.f})); \endcode
KILN_LIBRARY_INLINE tensor stop_gradient(const tensor& x);

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE tape_key::tape_key(const tensor& t) : type(t.dtype()), dims(t.shape()) {
  if (t.is_symbolic())
    trace_id = t.symbol()->trace_id, node = t.symbol()->node;
  else
    data = t.raw_data();
}

KILN_LIBRARY_INLINE tape_key tape_key::of_variable(const void* variable, dtype t, const shape& s) {
  tape_key k(t, s);
  k.data = variable;
  k.trace_id = ~std::uint64_t{0};
  return k;
}

KILN_LIBRARY_INLINE std::size_t tape_key::hash() const {
  return std::size_t(reinterpret_cast<std::uintptr_t>(data)) ^ std::size_t(trace_id * 0x9e3779b97f4a7c15ull) ^
         (std::size_t(std::uint32_t(node)) << 8) ^ std::size_t(type);
}

KILN_LIBRARY_INLINE tensor* tape_table::find(const tape_key& key) {
  int found = -1;
  index_.for_each(key.hash(), [&](int id) { return entries_[std::size_t(id)].first == key && (found = id, true); });
  return found < 0 ? nullptr : &entries_[std::size_t(found)].second;
}

KILN_LIBRARY_INLINE const tensor* tape_table::find(const tape_key& key) const {
  return const_cast<tape_table&>(*this).find(key);
}

KILN_LIBRARY_INLINE bool tape_table::contains(const tape_key& key) const { return find(key) != nullptr; }

KILN_LIBRARY_INLINE std::pair<tensor*, bool> tape_table::emplace(const tape_key& key, const tensor& t) {
  if (tensor* known = find(key)) return {known, false};
  index_.insert(key.hash(), int(entries_.size()));
  entries_.emplace_back(key, t);
  return {&entries_.back().second, true};
}

KILN_LIBRARY_INLINE void tape_table::clear() {
  entries_.clear();
  index_.clear();
}

KILN_LIBRARY_INLINE int& recording_tapes() {
  thread_local int count = 0;
  return count;
}

KILN_LIBRARY_INLINE std::vector<gradient_tape*>& active_tapes() {
  thread_local std::vector<gradient_tape*> tapes;
  return tapes;
}

KILN_LIBRARY_INLINE tensor unbroadcast(const tensor& g, const shape& to) {
  if (g.shape() == to) return g;
  const int lead = g.rank() - to.rank();
  int_list axes;
  for (int d = 0; d < g.rank(); ++d)
    if (d < lead || (to[d - lead] == 1 && g.shape()[d] != 1)) axes.push_back(d);
  tensor summed = g;
  if (!axes.empty()) {
    const tensor* in[] = {&g};
    summed = run_registered(ops::reduce_sum(reduction_axes(axes), false), in);
  }
  const tensor* in[] = {&summed};
  return run_registered(ops::reshape{to}, in);
}

KILN_LIBRARY_INLINE tensor sum_defined(const tensor& a, const tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  const tensor* in[] = {&a, &b};
  return run_registered(ops::add{}, in);
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE tensor gradient_tape::unconnected_gradient(dtype t, const shape& s, kiln::device d,
                                                               unconnected_gradients unconnected) {
  if (unconnected == unconnected_gradients::zero && is_floating(t)) return detail::zero_filled("gradient", s, t, d);
  return {};
}

KILN_LIBRARY_INLINE std::span<const tensor> gradient_tape::inputs_of(const entry& e) const {
  return {values_.data() + e.first, e.inputs};
}

KILN_LIBRARY_INLINE std::span<const tensor> gradient_tape::outputs_of(const entry& e) const {
  return {values_.data() + e.first + e.inputs, e.outputs};
}

KILN_LIBRARY_INLINE bool gradient_tape::records(const tensor& t) const {
  return recording_ && is_floating(t.dtype()) && (t.is_symbolic() ? t.symbol()->trace_id : 0) == trace_id_;
}

KILN_LIBRARY_INLINE void gradient_tape::pause() {
  if (recording_) --detail::recording_tapes(), recording_ = false;
}

KILN_LIBRARY_INLINE void gradient_tape::resume() {
  if (!recording_) ++detail::recording_tapes(), recording_ = true;
}

}  // namespace kiln

namespace kiln::detail {

KILN_LIBRARY_INLINE tensor fresh_copy(const tensor& x) {
  tensor copy(x.dtype(), x.shape());
  const tensor host = x.device() == device::cpu ? x : x.to(device::cpu);
  if (x.size() > 0) std::memcpy(copy.raw_data(), host.raw_data(), std::size_t(x.size()) * size_of(x.dtype()));
  return x.device() == device::cpu ? copy : copy.to(x.device());
}

KILN_LIBRARY_INLINE tensor unaliased_for_tapes(tensor out, std::span<const tensor* const> in) {
  if (out.is_symbolic() || !is_floating(out.dtype())) return out;
  bool view = false;
  for (const tensor* t : in) view = view || out.shares_buffer_with(*t);
  return view ? fresh_copy(out) : out;
}

}  // namespace kiln::detail

namespace kiln {

KILN_LIBRARY_INLINE tensor stop_gradient(const tensor& x) {
  if (!x.defined() || x.is_symbolic() || !is_floating(x.dtype())) return x;
  return detail::fresh_copy(x);
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

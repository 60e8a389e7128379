#pragma once
/// \file
/// Reverse-mode gradients of eager code: kiln::gradient_tape records the eager ops
/// that read watched tensors (or results of recorded ops) while it is alive, and
/// `gradient` runs each recorded op's formula (kiln/autodiff/backward.hpp) from the
/// target back to the sources, as TensorFlow's GradientTape does.
///
/// A tape knows a tensor by its elements' address, dtype and shape: the tape holds
/// every tensor it recorded, so no recorded buffer is reused while it lives. The ops
/// a tape runs to compute gradients go through the kernel table and are recorded by
/// the other tapes of the thread, which is how nested tapes give higher-order
/// gradients.

#include <cstring>
#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autodiff/backward.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/exec/kernel_table.hpp"

namespace kiln {

/// What `gradient_tape::gradient` gives for a source the target does not depend on:
/// an undefined tensor (`none`, TensorFlow's default) or zeros of the source's shape.
enum class unconnected_gradients { none, zero };

/// Options of a gradient_tape: a persistent tape may compute gradients more than once.
struct gradient_tape_options {
  bool persistent = false;
};

class gradient_tape;

namespace detail {

/// A tensor as a tape knows it.
struct tape_key {
  const void* data;
  dtype type;
  shape dims;
  explicit tape_key(const tensor& t) : data(t.raw_data()), type(t.dtype()), dims(t.shape()) {}
  friend bool operator<(const tape_key& a, const tape_key& b) {
    if (a.data != b.data || a.type != b.type) return std::tie(a.data, a.type) < std::tie(b.data, b.type);
    return std::ranges::lexicographical_compare(a.dims.dims(), b.dims.dims());
  }
};

/// The tapes recording on this thread, innermost last.
inline std::vector<gradient_tape*>& active_tapes() {
  thread_local std::vector<gradient_tape*> tapes;
  return tapes;
}

inline void record_on_active_tapes(const ops::any_op& op, std::span<const tensor* const> in, const tensor& out);

/// `g` summed over the dims it was broadcast along, as a tensor of shape `to`.
inline tensor unbroadcast(const tensor& g, const shape& to) {
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

/// The ops the gradient formulas run, registered when a tape is made.
template <class = void>
void register_gradient_ops() {
  register_kernels_on_use<ops::add>();
  register_kernels_on_use<ops::subtract>();
  register_kernels_on_use<ops::multiply>();
  register_kernels_on_use<ops::divide>();
  register_kernels_on_use<ops::negate>();
  register_kernels_on_use<ops::log>();
  register_kernels_on_use<ops::pow>();
  register_kernels_on_use<ops::cast>();
  register_kernels_on_use<ops::greater>();
  register_kernels_on_use<ops::greater_equal>();
  register_kernels_on_use<ops::less>();
  register_kernels_on_use<ops::less_equal>();
  register_kernels_on_use<ops::where>();
  register_kernels_on_use<ops::reshape>();
  register_kernels_on_use<ops::transpose>();
  register_kernels_on_use<ops::matmul>();
  register_kernels_on_use<ops::reduce_sum>();
}

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
  template <class = void>
  explicit gradient_tape(gradient_tape_options options = {}) : persistent_(options.persistent) {
    detail::register_gradient_ops();
    detail::tape_hook().store(&detail::record_on_active_tapes, std::memory_order_relaxed);
    detail::active_tapes().push_back(this);
    ++detail::recording_tapes();
  }
  gradient_tape(const gradient_tape&) = delete;
  gradient_tape& operator=(const gradient_tape&) = delete;
  ~gradient_tape() {
    auto& tapes = detail::active_tapes();
    std::erase(tapes, this);
    if (recording_) --detail::recording_tapes();
  }

  /// Records the ops that read `t` from now on (floating-point tensors only).
  void watch(const tensor& t) {
    if (t.defined() && !t.is_symbolic() && is_floating(t.dtype())) tracked_.emplace(detail::tape_key(t), t);
  }

  /// The gradient of `target` (summed when it is not a scalar) with respect to
  /// `source`: a tensor of the source's shape, or per `unconnected` when the target
  /// does not depend on it (an undefined tensor by default; integer sources never do).
  tensor gradient(const tensor& target, const tensor& source,
                  unconnected_gradients unconnected = unconnected_gradients::none) {
    return gradient(target, std::vector<tensor>{source}, unconnected)[0];
  }
  /// Gradients of `target` with respect to each of `sources`.
  std::vector<tensor> gradient(const tensor& target, const std::vector<tensor>& sources,
                               unconnected_gradients unconnected = unconnected_gradients::none) {
    if (used_ && !persistent_)
      throw invalid_argument_error(
          "gradient_tape: a non-persistent tape computes one set of gradients; make it with {.persistent = true}");
    used_ = true;
    if (target.is_symbolic())
      throw unavailable_error("gradient_tape: the target is symbolic; tapes inside a kiln::function are not supported yet");
    std::map<detail::tape_key, tensor> grads;
    {
      // The ops that compute gradients are not this tape's to record (the other tapes
      // of the thread record them).
      struct paused {
        gradient_tape& tape;
        ~paused() { tape.resume(); }
      } guard{(pause(), *this)};
      if (is_floating(target.dtype()) && tracked_.count(detail::tape_key(target))) backpropagate(target, grads);
    }
    std::vector<tensor> out;
    for (const tensor& s : sources) {
      auto it = s.defined() && !s.is_symbolic() ? grads.find(detail::tape_key(s)) : grads.end();
      if (it != grads.end() && tracked_.count(it->first))
        out.push_back(it->second);
      else if (unconnected == unconnected_gradients::zero && s.defined() && is_floating(s.dtype()))
        out.push_back(detail::zero_filled("gradient", s.shape(), s.dtype(), s.device()));
      else
        out.emplace_back();
    }
    if (!persistent_) entries_.clear(), tracked_.clear();
    return out;
  }

 private:
  friend void detail::record_on_active_tapes(const ops::any_op&, std::span<const tensor* const>, const tensor&);

  struct entry {
    ops::any_op op;
    std::vector<tensor> inputs;
    tensor output;
  };

  void record(const ops::any_op& op, std::span<const tensor* const> in, const tensor& out) {
    if (!recording_ || !is_floating(out.dtype())) return;
    bool reads_tracked = false;
    for (const tensor* t : in) reads_tracked = reads_tracked || tracked_.count(detail::tape_key(*t)) > 0;
    if (!reads_tracked) return;
    entry e{op, {}, out};
    for (const tensor* t : in) e.inputs.push_back(*t);
    entries_.push_back(std::move(e));
    tracked_.emplace(detail::tape_key(out), out);
  }

  void backpropagate(const tensor& target, std::map<detail::tape_key, tensor>& grads) const {
    grads.emplace(detail::tape_key(target), detail::one_filled("gradient", target.shape(), target.dtype(), target.device()));
    for (auto e = entries_.rbegin(); e != entries_.rend(); ++e) {
      auto it = grads.find(detail::tape_key(e->output));
      if (it == grads.end()) continue;
      const tensor dy = it->second;
      std::vector<tensor> in_grads(e->inputs.size());
      detail::kernels_of(e->op).backward.load(std::memory_order_acquire)(e->op, e->inputs, e->output, dy, in_grads);
      for (std::size_t i = 0; i < e->inputs.size(); ++i) {
        const tensor& x = e->inputs[i];
        if (!in_grads[i].defined() || !is_floating(x.dtype())) continue;
        tensor g = detail::unbroadcast(in_grads[i], x.shape());
        auto [at, fresh] = grads.emplace(detail::tape_key(x), g);
        if (!fresh) {
          const tensor* sum[] = {&at->second, &g};
          at->second = detail::run_registered(ops::add{}, sum);
        }
      }
    }
  }

  void pause() {
    if (recording_) --detail::recording_tapes(), recording_ = false;
  }
  void resume() {
    if (!recording_) ++detail::recording_tapes(), recording_ = true;
  }

  bool persistent_ = false;
  bool used_ = false;
  bool recording_ = true;
  std::vector<entry> entries_;
  std::map<detail::tape_key, tensor> tracked_;  ///< watched tensors and results of recorded ops, held
};

namespace detail {

inline void record_on_active_tapes(const ops::any_op& op, std::span<const tensor* const> in, const tensor& out) {
  for (gradient_tape* tape : active_tapes()) tape->record(op, in, out);
}

}  // namespace detail

/// `x`, cut off from every gradient tape: gradients do not flow through the result.
/// \code kiln::tensor frozen = kiln::stop_gradient(x); \endcode
inline tensor stop_gradient(const tensor& x) {
  if (!x.defined() || x.is_symbolic() || !is_floating(x.dtype())) return x;
  tensor copy(x.dtype(), x.shape());
  const tensor host = x.device() == kiln::device::cpu ? x : x.to(kiln::device::cpu);
  if (x.size() > 0) std::memcpy(copy.raw_data(), host.raw_data(), std::size_t(x.size()) * size_of(x.dtype()));
  return x.device() == kiln::device::cpu ? copy : copy.to(x.device());
}

}  // namespace kiln

#pragma once
/// \file
/// The special ops of state and effects: reading and writing a
/// variable, printing and calling back into C++. Each is one object that runs eagerly
/// and as a graph node; the graph keeps effects in program order and never prunes them.

#include <array>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/hooks.hpp"
#include "kiln/core/print.hpp"
#include "kiln/eager/apply.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/elementwise.hpp"

namespace kiln {

KILN_LIBRARY_INLINE tensor stop_gradient(const tensor& x);  // kiln/autodiff/tape.hpp, reached only while tapes record

namespace detail {

/// What a kiln::variable handle points to: its value, swapped (never written in
/// place) by every assignment, so a value read earlier stays what it was.
class variable_state {
 public:
  variable_state(std::string name, dtype type, shape dims) : name_(std::move(name)), type_(type), dims_(std::move(dims)) {}

  const std::string& name() const { return name_; }
  dtype type() const { return type_; }
  /// As declared at creation; partial when the initial value was symbolic with None dims.
  const shape& dims() const { return dims_; }

  tensor read() const {
    std::lock_guard lock(mutex_);
    if (!value_.defined())
      throw value_error("variable " + label() + " is read before its initial value is set (a variable created while "
                        "tracing gets it when the function first runs)");
    return value_;
  }
  /// Replaces the value with `f(old value)` (the old value is undefined before
  /// initialization) under the variable's lock; returns the new value.
  template <class F>
  tensor update(F&& f) {
    std::lock_guard lock(mutex_);
    value_ = f(value_);
    return value_;
  }
  /// `'name' float32 (2,)`, as messages show the variable.
  KILN_LIBRARY_INLINE std::string label() const;

  /// Raises kiln::invalid_argument_error unless `x` fits this variable's dtype and
  /// shape; a symbolic `x` (a write being traced) only needs a shape that may fit,
  /// and the write checks the value's when the graph runs, as TensorFlow does.
  KILN_LIBRARY_INLINE void check(std::string_view op, const tensor& x) const;

 private:
  std::string name_;
  dtype type_;
  shape dims_;
  mutable std::mutex mutex_;
  tensor value_;
};

/// Reads a variable: its current value.
class read_variable_op final : public special_op {
 public:
  explicit read_variable_op(std::shared_ptr<variable_state> v)
      : special_op(std::type_identity<read_variable_op>()), var_(std::move(v)) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  bool has_effects() const { return false; }
  tensor run(std::span<const tensor* const>) const { return var_->read(); }
  /// The variable it reads (whose address is the kiln::variable's identity).
  const std::shared_ptr<variable_state>& state() const { return var_; }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 1> op_names();
  /// Saved as the variable, by its place among the saved function's variables.
  template <class Out>
  void save(Out& out) const {
    out.set_variable("variable", var_);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    auto v = in.variable("variable");
    in.expect_results({{v->type(), v->dims()}});
    if (in.input_count() != 0) in.fail(in.op() + " takes no inputs");
    return std::make_shared<read_variable_op>(std::move(v));
  }
  /// What TensorBoard's graph shows of it: the variable's name.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("shared_name", var_->name());
  }
  /// In ONNX, the variable's current value (an initializer: ONNX has no state).
  template <class Onnx, class Graph>
  std::vector<std::string> to_onnx(Onnx& onnx, Graph&, const node&, const graph&, const std::vector<std::string>&) const {
    return {onnx.variable(var_)};
  }

 private:
  std::shared_ptr<variable_state> var_;
};

/// How an assignment combines the variable's value with its input.
enum class assign_mode : unsigned char {
  assign,      ///< `v.assign(x)`
  add,         ///< `v.assign_add(x)`
  subtract,    ///< `v.assign_sub(x)`
  initialize,  ///< the initial value of a variable created while tracing: set on the first run only
};

/// Writes a variable; its result is the new value. The members that run the
/// assignment are templates, compiled only where a program writes a variable.
class assign_variable_op final : public special_op {
 public:
  template <class = void>
  assign_variable_op(std::shared_ptr<variable_state> v, assign_mode mode)
      : special_op(std::type_identity<assign_variable_op>()), var_(std::move(v)), mode_(mode) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  /// The op name of each mode.
  KILN_LIBRARY_INLINE static std::string_view name_of(assign_mode mode);
  static constexpr assign_mode modes[] = {assign_mode::assign, assign_mode::add, assign_mode::subtract,
                                          assign_mode::initialize};
  bool has_effects() const { return true; }
  template <class = void>
  tensor run(std::span<const tensor* const> in) const { return apply(*in[0]); }
  /// The variable it writes (how, name() says).
  const std::shared_ptr<variable_state>& state() const { return var_; }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 4> op_names();
  /// Saved as the variable, by its place among the saved function's variables; the
  /// mode is in the op's name.
  template <class Out>
  void save(Out& out) const {
    out.set_variable("variable", var_);
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    assign_mode mode = assign_mode::assign;
    for (assign_mode m : modes)
      if (name_of(m) == in.op()) mode = m;
    auto v = in.variable("variable");
    in.expect_results({{v->type(), v->dims()}});
    if (in.input_count() != 1) in.fail(in.op() + " takes one input");
    return std::make_shared<assign_variable_op>(std::move(v), mode);
  }
  /// What TensorBoard's graph shows of it: the variable's name.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("shared_name", var_->name());
  }
  static constexpr std::string_view onnx_refusal = "assigns a variable; an ONNX model has no state";

  /// The assignment on an eager value; a value of another dtype or shape raises
  /// kiln::invalid_argument_error. What a variable holds is never a value a gradient
  /// tape tracks (as in TensorFlow, gradients do not flow through an assignment): the
  /// sums run their kernels directly, unseen by tapes, and an assigned value is copied
  /// while a tape records on this thread.
  template <class = void>
  tensor apply(const tensor& x) const {
    var_->check(name(), x);
    return var_->update([&](const tensor& old) {
      const tensor* in[] = {&old, &x};
      switch (mode_) {
        case assign_mode::add: return (void)require(old), execute(ops::add{}, in);
        case assign_mode::subtract: return (void)require(old), execute(ops::subtract{}, in);
        case assign_mode::initialize: return old.defined() ? old : x;
        default: return tapes_recording() ? stop_gradient(x) : x;
      }
    });
  }

 private:
  KILN_LIBRARY_INLINE const tensor& require(const tensor& old) const;
  std::shared_ptr<variable_state> var_;
  assign_mode mode_;
};

/// Writes one line to config::print_stream() at every run.
class print_op final : public special_op {
 public:
  explicit print_op(std::vector<print_piece> pieces)
      : special_op(std::type_identity<print_op>()), pieces_(std::move(pieces)) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  bool has_effects() const { return true; }
  KILN_LIBRARY_INLINE std::vector<tensor> run(std::span<const tensor* const> in) const;
  const std::vector<print_piece>& pieces() const { return pieces_; }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 1> op_names();
  /// Saved as its pieces: text, and which input each prints (-1: none).
  template <class Out>
  void save(Out& out) const {
    out.set_items("pieces", pieces_.size(), [&](Out& item, std::size_t k) {
      item.set("text", pieces_[k].text);
      item.set("input", pieces_[k].input);
    });
  }
  template <class In>
  static std::shared_ptr<const special_op> load(In& in) {
    std::vector<print_piece> pieces;
    for (const In& p : in.items("pieces")) pieces.push_back({p.text("text"), p.integer("input", -1, in.input_count() - 1)});
    in.expect_results({});
    return std::make_shared<print_op>(std::move(pieces));
  }
  /// Left out of an ONNX model: no ONNX op writes to the console.
  template <class Onnx, class Graph>
  std::vector<std::string> to_onnx(Onnx&, Graph&, const node& n, const graph&, const std::vector<std::string>&) const {
    return std::vector<std::string>(std::size_t(n.result_count()));
  }

 private:
  std::vector<print_piece> pieces_;
};

/// Calls a C++ function on eager tensors at every run (kiln::host_callback).
class host_callback_op final : public special_op {
 public:
  using callback = std::function<std::vector<tensor>(std::span<const tensor* const>)>;
  template <class = void>
  host_callback_op(callback fn, std::vector<std::pair<dtype, shape>> results)
      : special_op(std::type_identity<host_callback_op>()), fn_(std::move(fn)), results_(std::move(results)) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  bool has_effects() const { return true; }
  /// Calls the function and checks its results against the specs (compiled once in a
  /// compiled kiln: KILN_LIBRARY_INLINE).
  KILN_LIBRARY_INLINE std::vector<tensor> run(std::span<const tensor* const> in) const;
  const std::vector<std::pair<dtype, shape>>& results() const { return results_; }

  KILN_LIBRARY_INLINE static std::array<std::string_view, 1> op_names();
  static constexpr std::string_view save_refusal = "calls back into C++ (host_callback), which a saved function cannot hold";
  static constexpr std::string_view onnx_refusal = "calls back into C++";

 private:
  callback fn_;
  std::vector<std::pair<dtype, shape>> results_;
};

#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE std::vector<tensor> host_callback_op::run(std::span<const tensor* const> in) const {
  std::vector<tensor> out = fn_(in);
  if (out.size() != results_.size())
    throw invalid_argument_error("host_callback: the function returned " + std::to_string(out.size()) +
                                 " tensors, but out_specs has " + std::to_string(results_.size()));
  for (std::size_t k = 0; k < out.size(); ++k) {
    const auto& [type, dims] = results_[k];
    if (!out[k].defined() || out[k].is_symbolic() || out[k].dtype() != type || !dims.accepts(out[k].shape()))
      throw invalid_argument_error("host_callback: result " + std::to_string(k) + " is " +
                                   (out[k].defined() ? std::string(kiln::name(out[k].dtype())) + " " + out[k].shape().str()
                                                     : std::string("an empty tensor")) +
                                   ", but out_specs says " + std::string(kiln::name(type)) + " " + dims.str());
  }
  return out;
}
#endif

}  // namespace detail
}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string variable_state::label() const {
  return "'" + name_ + "' " + std::string(kiln::name(type_)) + " " + dims_.str();
}

KILN_LIBRARY_INLINE void variable_state::check(std::string_view op, const tensor& x) const {
  const bool fits = x.is_symbolic() ? dims_.is_compatible_with(x.shape()) : dims_.accepts(x.shape());
  if (x.dtype() != type_ || !fits)
    throw invalid_argument_error(std::string(op) + ": variable " + label() + " cannot take a " +
                                 std::string(kiln::name(x.dtype())) + " " + x.shape().str() +
                                 " value; the dtype and shape of a variable are fixed");
}

KILN_LIBRARY_INLINE std::string_view read_variable_op::name() const { return "ReadVariableOp"; }

KILN_LIBRARY_INLINE std::array<std::string_view, 1> read_variable_op::op_names() { return {"ReadVariableOp"}; }

KILN_LIBRARY_INLINE std::string_view assign_variable_op::name() const { return name_of(mode_); }

KILN_LIBRARY_INLINE std::string_view assign_variable_op::name_of(assign_mode mode) {
  switch (mode) {
    case assign_mode::add:
      return "AssignAddVariableOp";
    case assign_mode::subtract:
      return "AssignSubVariableOp";
    case assign_mode::initialize:
      return "InitializeVariableOp";
    default:
      return "AssignVariableOp";
  }
}

KILN_LIBRARY_INLINE std::array<std::string_view, 4> assign_variable_op::op_names() {
  return {name_of(modes[0]), name_of(modes[1]), name_of(modes[2]), name_of(modes[3])};
}

KILN_LIBRARY_INLINE const tensor& assign_variable_op::require(const tensor& old) const {
  if (!old.defined()) throw value_error(std::string(name()) + ": variable " + var_->label() + " has no value yet");
  return old;
}

KILN_LIBRARY_INLINE std::string_view print_op::name() const { return "PrintV2"; }

KILN_LIBRARY_INLINE std::vector<tensor> print_op::run(std::span<const tensor* const> in) const {
  write_print_line(print_line(pieces_, in));
  return {};
}

KILN_LIBRARY_INLINE std::array<std::string_view, 1> print_op::op_names() { return {"PrintV2"}; }

KILN_LIBRARY_INLINE std::string_view host_callback_op::name() const { return "HostCallback"; }

KILN_LIBRARY_INLINE std::array<std::string_view, 1> host_callback_op::op_names() { return {"HostCallback"}; }

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// State and effects: `kiln::variable`, `kiln::print` and
/// `kiln::host_callback`. Outside a trace they act at once; while tracing they
/// record their special op (kiln/exec/effects.hpp) so that they act at every run.

#include <concepts>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/spec.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln {
class variable;

namespace detail {
template <class>
struct saved_function_io;

/// What creating and writing a kiln::variable does (`variable_writes`, the one
/// specialization): a template on nothing, as op functions are, so that the kernels of
/// the arithmetic assignments compile only where a program writes a variable, and a
/// compiled kiln compiles all of it with one explicit instantiation
/// (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_variable_writes {
  /// Makes `v` hold `initial` (a symbolic one: a write recorded into the trace).
  static void initialize(variable& v, const tensor& initial, std::string name);
  /// Writes `x` into `v` as `mode` says, eagerly or into the trace in progress.
  static tensor write(const variable& v, assign_mode mode, const tensor& x);
  /// Records the write of `x` into the trace in progress.
  static tensor record_write(const variable& v, assign_mode mode, const tensor& x);
};
using variable_writes = basic_variable_writes<void>;
}  // namespace detail

/// Mutable state shared by every copy of the handle: a tensor whose dtype and shape
/// are fixed at creation. Usable wherever a tensor is (`v * x`, `1 + v`). Inside a
/// kiln::function, reads and writes run at every call, in program order; a variable
/// may be created during the first trace only, and must outlive it (keep it in
/// state the callable captured), else the call raises kiln::value_error.
/// \code
/// kiln::variable v(1.f);
/// v.assign_add(kiln::constant(2.f));  // v is now 3
/// kiln::tensor y = v * 2.f;            // 6
/// \endcode
class variable {
 public:
  /// An empty handle, for state filled on first use: `if (!c.v) c.v = kiln::variable(0);`.
  variable() = default;
  /// A variable holding `initial`. While tracing, `initial` may be symbolic: the
  /// variable then takes its value when the function first runs. (The members that
  /// write are templates, as op functions are, so that the kernels of the arithmetic
  /// assignments compile only where a program writes a variable.)
  template <class Unused = void>
  explicit variable(const tensor& initial, std::string name = "Variable") {
    detail::basic_variable_writes<Unused>::initialize(*this, initial, std::move(name));
  }
  /// A scalar variable: `kiln::variable v(0)`, `kiln::variable w(1.5f, "w")`.
  template <class T>
    requires std::is_arithmetic_v<T>
  explicit variable(T initial, std::string name = "Variable") : variable(kiln::constant(initial), std::move(name)) {}

  /// True when the handle holds a variable.
  explicit operator bool() const { return handle_ != nullptr; }

  /// The current value (while tracing, a read that runs at every call). The gradient
  /// tapes recording on this thread watch the value read.
  tensor read_value() const {
    const auto& s = state();
    detail::trace_context* trace = detail::trace_context::current();
    tensor value = trace ? trace->record_special(std::make_shared<detail::read_variable_op>(s), {}, {{s->type(), s->dims()}})[0]
                         : s->read();
    if (detail::tapes_recording()) detail::hooks().variable_read.load(std::memory_order_relaxed)(identity(), value);
    return value;
  }
  /// The value, as a tensor: what makes a variable usable wherever a tensor is.
  operator tensor() const { return read_value(); }

  /// Sets the value to `x` (same dtype and shape, else kiln::invalid_argument_error); returns it.
  template <class = void>
  tensor assign(const tensor& x) const { return write(detail::assign_mode::assign, x); }
  /// Adds `x` to the value; returns the new value.
  template <class = void>
  tensor assign_add(const tensor& x) const { return write(detail::assign_mode::add, x); }
  /// Subtracts `x` from the value; returns the new value.
  template <class = void>
  tensor assign_sub(const tensor& x) const { return write(detail::assign_mode::subtract, x); }
  template <class T>
    requires std::is_arithmetic_v<T>
  tensor assign(T x) const { return assign(scalar(x)); }
  template <class T>
    requires std::is_arithmetic_v<T>
  tensor assign_add(T x) const { return assign_add(scalar(x)); }
  template <class T>
    requires std::is_arithmetic_v<T>
  tensor assign_sub(T x) const { return assign_sub(scalar(x)); }

  KILN_LIBRARY_INLINE kiln::dtype dtype() const;
  KILN_LIBRARY_INLINE const kiln::shape& shape() const;
  KILN_LIBRARY_INLINE const std::string& name() const;

  /// What identifies the variable in a kiln::function signature: every copy of a
  /// handle is the same variable.
  KILN_LIBRARY_INLINE const void* identity() const;

 private:
  // What the caller's copies share: a variable created while tracing must keep one
  // alive after the trace (the graph holds the state itself, not this).
  struct handle {
    std::shared_ptr<detail::variable_state> state;
  };
  // A loaded function's variables (kiln/saved_function.hpp) are handles on the states
  // its graphs read and write.
  template <class>
  friend struct detail::saved_function_io;
  template <class>
  friend struct detail::basic_variable_writes;
  explicit variable(std::shared_ptr<detail::variable_state> s)
      : handle_(std::make_shared<handle>(handle{std::move(s)})) {}

  KILN_LIBRARY_INLINE const std::shared_ptr<detail::variable_state>& state() const;
  template <class T>
  tensor scalar(T x) const {
    return kiln::constant(x, state()->type());
  }
  template <class Unused = void>
  tensor write(detail::assign_mode mode, const tensor& x) const {
    return detail::basic_variable_writes<Unused>::write(*this, mode, x);
  }

  std::shared_ptr<handle> handle_;
};

#if KILN_DEFINE_LIBRARY
template <class Unused>
void detail::basic_variable_writes<Unused>::initialize(variable& v, const tensor& initial, std::string name) {
  if (!initial.defined()) throw invalid_argument_error("variable: the initial value is an empty tensor");
  v.handle_ = std::make_shared<variable::handle>();
  v.handle_->state = std::make_shared<detail::variable_state>(std::move(name), initial.dtype(), initial.shape());
  detail::trace_context* trace = detail::trace_context::current();
  if (trace) trace->note_created_variable(v.handle_);
  if (initial.is_symbolic()) {
    record_write(v, detail::assign_mode::initialize, initial);
  } else {
    v.handle_->state->update([&](const tensor&) { return initial; });
  }
}

template <class Unused>
tensor detail::basic_variable_writes<Unused>::write(const variable& v, assign_mode mode, const tensor& x) {
  const auto& s = v.state();
  if (!x.defined()) throw invalid_argument_error("variable: cannot assign an empty tensor to " + s->label());
  if (detail::trace_context::current() || x.is_symbolic()) return record_write(v, mode, x);
  return detail::assign_variable_op(s, mode).apply(x);
}

template <class Unused>
tensor detail::basic_variable_writes<Unused>::record_write(const variable& v, assign_mode mode, const tensor& x) {
  const auto& s = v.state();
  detail::trace_context* trace = detail::trace_context::current();
  if (!trace) throw type_error("variable: a symbolic tensor was used outside the trace that made it");
  auto op = std::make_shared<detail::assign_variable_op>(s, mode);
  s->check(op->name(), x);  // at trace time, as the op would at run time
  const tensor inputs[] = {x};
  return trace->record_special(std::move(op), inputs, {{s->type(), s->dims()}})[0];
}
#endif

/// Prints its arguments, separated by spaces, then a newline, to
/// config::print_stream(), as tf.print does: strings as they are, tensors as their
/// values (`1`, `[1 2 3]`, `[[1 2] [3 4]]`). Outside a function it prints at once;
/// inside one it prints at every call (a C++ `std::cout` there prints only while tracing).
/// \code kiln::print("Executed with", kiln::constant({1, 2}));  // Executed with [1 2] \endcode
template <class... Args>
void print(const Args&... args) {
  std::vector<detail::print_piece> pieces;
  std::vector<tensor> inputs;
  (detail::add_print_piece(args, pieces, inputs), ...);
  if (detail::trace_context* trace = detail::trace_context::current()) {
    trace->record_special(std::make_shared<detail::print_op>(std::move(pieces)), inputs, {});
    return;
  }
  std::vector<const tensor*> in;
  for (const tensor& t : inputs) in.push_back(&t);
  detail::write_print_line(detail::print_line(pieces, in));
}

namespace detail {
// The callback's results as a list: nothing, one tensor, or a tuple of tensors.
template <class R>
std::vector<tensor> callback_results(R&& r) {
  using U = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<U, tensor>) {
    return {std::forward<R>(r)};
  } else {
    return std::apply([](auto&&... t) { return std::vector<tensor>{tensor(t)...}; }, std::forward<R>(r));
  }
}
}  // namespace detail

/// Runs C++ function `fn` on concrete tensors at every execution (TensorFlow's
/// tf.py_function): `fn` takes one `const kiln::tensor&` per input and returns
/// nothing (empty `out_specs`), a tensor (one spec) or a tuple of tensors. Returns
/// one tensor per spec; results that do not match `out_specs` raise
/// kiln::invalid_argument_error.
/// \code
/// std::vector<kiln::tensor> seen;
/// kiln::host_callback([&](const kiln::tensor& x) { seen.push_back(x); }, {}, kiln::constant(1.f));
/// \endcode
template <class F, class... Inputs>
std::vector<tensor> host_callback(F fn, const std::vector<tensor_spec>& out_specs, const Inputs&... inputs) {
  static_assert((std::is_convertible_v<const Inputs&, tensor> && ...), "kiln::host_callback: the inputs are tensors");
  using R = std::invoke_result_t<F&, decltype((void(inputs), std::declval<const tensor&>()))...>;
  auto call = [fn = std::move(fn)](std::span<const tensor* const> in) mutable -> std::vector<tensor> {
    return [&]<std::size_t... I>(std::index_sequence<I...>) -> std::vector<tensor> {
      if constexpr (std::is_void_v<R>) {
        fn(*in[I]...);
        return {};
      } else {
        return detail::callback_results(fn(*in[I]...));
      }
    }(std::index_sequence_for<Inputs...>{});
  };
  std::vector<std::pair<dtype, shape>> results;
  for (const tensor_spec& s : out_specs) results.emplace_back(s.dtype, s.shape);
  auto op = std::make_shared<detail::host_callback_op>(std::move(call), std::move(results));
  const tensor args[] = {tensor(inputs)..., tensor()};
  std::span<const tensor> in(args, sizeof...(Inputs));
  if (detail::trace_context* trace = detail::trace_context::current()) return trace->record_special(op, in, op->results());
  std::vector<const tensor*> pointers;
  for (const tensor& t : in) {
    t.require_value("host_callback");
    pointers.push_back(&t);
  }
  return op->run(pointers);
}

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE kiln::dtype variable::dtype() const { return state()->type(); }

KILN_LIBRARY_INLINE const kiln::shape& variable::shape() const { return state()->dims(); }

KILN_LIBRARY_INLINE const std::string& variable::name() const { return state()->name(); }

KILN_LIBRARY_INLINE const void* variable::identity() const { return state().get(); }

KILN_LIBRARY_INLINE const std::shared_ptr<detail::variable_state>& variable::state() const {
  if (!handle_) throw value_error("variable: the handle is empty (default-constructed)");
  return handle_->state;
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

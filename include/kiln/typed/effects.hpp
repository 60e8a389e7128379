#pragma once
/// \file
/// State and effects of the compile-time tier: `kiln::fixed_variable<T, Dims...>` and
/// kiln::print of typed values. In a typed trace they are steps, so they happen at
/// every call, in program order. A plain kiln::variable used with typed values is a
/// compile error that names fixed_variable.

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/print.hpp"
#include "kiln/typed/control_flow.hpp"
#include "kiln/typed/unfused_ops.hpp"

namespace kiln {

/// A variable whose element type and shape are compile-time, for functions called with
/// `fixed` arguments. Copies share the value. Inside a typed trace
/// `read_value`, `assign`, `assign_add` and `assign_sub` run at every call, in program
/// order, and give the value read or written; outside one, `value()` reads it and
/// `set(x)` writes it.
/// \code
/// kiln::fixed_variable<float, 3> total;
/// kiln::function add_to([&](const auto& x) { return total.assign_add(x); });
/// add_to(kiln::fixed<float, 3>::ones());
/// add_to(kiln::fixed<float, 3>::ones());  // total.value() is [2 2 2]
/// \endcode
namespace typed {

/// A fixed_variable's value and name, shared by its copies and the traces using it.
template <class V>
struct variable_state {
  V value;
  std::string name;
};

/// A step reading the variable in place: it points slot `slot` at the value, which a
/// later write or host callback of the trace copies first for the steps that still
/// read it (recorder::protect_reads_in_place). Holds the state, so the trace keeps
/// the variable alive.
template <class V>
struct variable_read {
  std::shared_ptr<variable_state<V>> target;
  int slot;
  variable_read(std::shared_ptr<variable_state<V>> t, int s) : target(std::move(t)), slot(s) {}
  static void run(const void* data, frame f) {
    const auto& a = *static_cast<const variable_read*>(data);
    const_cast<void**>(f)[a.slot] = a.target->value.data();  // frames are writable (keep_values_read_in_place)
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& a = *static_cast<const variable_read*>(data);
    sink.bind(a.slot, sink.effect("ReadVariableOp", a.target->name, false, {}, {{V::dtype, V::shape()}})[0]);
  }
};

/// A step writing slot `slot` to the variable, after giving the reads in place that
/// `redirects` names a copy of the value they read.
template <class V>
struct variable_write {
  std::shared_ptr<variable_state<V>> target;
  int slot;
  std::vector<redirect> redirects;
  static void run(const void* data, frame f) {
    const auto& a = *static_cast<const variable_write*>(data);
    keep_values_read_in_place(a.redirects, f);
    std::memcpy(a.target->value.data(), f[a.slot], bytes_of<V>);
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& a = *static_cast<const variable_write*>(data);
    sink.effect("AssignVariableOp", a.target->name, true, {sink.value(a.slot, V::dims_type::values)},
                {{V::dtype, V::shape()}});
  }
};

}  // namespace typed

template <class T, std::int64_t... Dims>
class fixed_variable {
 public:
  using value_type = fixed<T, Dims...>;
  using symbol_type = typed::symbol_for<value_type>;

  /// A variable holding `initial` (zeros by default).
  explicit fixed_variable(const value_type& initial = value_type(), std::string name = "Variable")
      : state_(std::make_shared<state>(state{initial, std::move(name)})) {}

  /// The value now (outside a function).
  value_type value() const { return state_->value; }
  /// Sets the value now (outside a function).
  void set(const value_type& x) { state_->value = x; }
  const std::string& name() const { return state_->name; }

  /// The value at this point of every run of the trace. It is read in place, not
  /// copied: a write of the variable later in the trace (or a host callback, which
  /// might write it) first gives the steps that use this value a copy of it.
  symbol_type read_value() const {
    typed::recorder& r = recorder_for("read_value");
    return read_in_place(r, true);
  }
  /// Writes `x` (a typed operand of this type) and gives the value written.
  template <class X>
    requires typed::operand<X>
  symbol_type assign(const X& x) {
    recorder_for("assign");
    const symbol_type written(typed::expression_of<T, false>(x));
    typed::recorder& r = typed::current_recorder();
    auto write = std::make_unique<typed::variable_write<value_type>>(
        typed::variable_write<value_type>{state_, written.slot(), r.protect_reads_in_place(state_.get())});
    r.push(typed::step_of(std::move(write)));
    return written;
  }
  /// Adds `x` to the value and gives the sum.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_add(const X& x) {
    // The value read is used by the sum alone, computed before the write: no copy.
    return assign(read_in_place(recorder_for("assign_add"), false) + x);
  }
  /// Subtracts `x` from the value and gives the difference.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_sub(const X& x) {
    return assign(read_in_place(recorder_for("assign_sub"), false) - x);
  }

 private:
  using state = typed::variable_state<value_type>;
  /// A slot that reads the value in place; `kept` when a later write must give the
  /// steps reading it a copy.
  symbol_type read_in_place(typed::recorder& r, bool kept) const {
    const int out = r.add_slot(0);  // no workspace: it points at the value
    r.push(typed::step_of(std::make_unique<const typed::variable_read<value_type>>(state_, out)));
    if (kept) r.add_read_in_place(state_.get(), out, state_->value.data(), typed::bytes_of<value_type>);
    return symbol_type(out);
  }
  static typed::recorder& recorder_for(const char* member) {
    typed::recorder* r = typed::recorder::current();
    if (!r)
      throw type_error(std::string("kiln::fixed_variable::") + member +
                       ": only inside a function called with fixed arguments; outside one, read with value() and write "
                       "with set()");
    return *r;
  }

  std::shared_ptr<state> state_;
};

namespace typed {

/// A print step: the line of `pieces`, whose inputs are read from slots as tensors.
struct print_step {
  struct input {
    int slot;
    kiln::dtype dtype;
    kiln::shape shape;
  };
  std::vector<detail::print_piece> pieces;
  std::vector<input> inputs;
  KILN_LIBRARY_INLINE static void run(const void* data, frame f);
  KILN_LIBRARY_INLINE static void describe(const void* data, description_sink& sink);
};

}  // namespace typed

/// kiln::print in a typed trace: typed values are printed as they are at every call.
/// \code kiln::function f([](const auto& x) { kiln::print("x is", x); return x * 2; }); \endcode
template <class... Args>
  requires(typed::lazy<Args> || ...)
void print(const Args&... args) {
  auto data = std::make_unique<typed::print_step>();
  std::vector<tensor> unused;
  (
      [&](const auto& a) {
        using A = std::remove_cvref_t<decltype(a)>;
        if constexpr (typed::operand<A>) {
          using V = typed::value_of<A>;
          data->pieces.push_back({{}, int(data->inputs.size())});
          data->inputs.push_back({typed::slot_of(a), V::dtype, V::shape()});
        } else {
          detail::add_print_piece(a, data->pieces, unused);
        }
      }(args),
      ...);
  typed::current_recorder().push(typed::step_of(std::move(data)));
}

namespace typed {

/// Whether `R` is what a typed host callback may return: nothing, a `fixed`, or a
/// std::tuple of them.
template <class R>
inline constexpr bool callback_result = std::is_void_v<R> || fixed_value<R>;
template <class... R>
inline constexpr bool callback_result<std::tuple<R...>> = (fixed_value<R> && ...);

/// How many values a callback's result `R` holds.
template <class R>
inline constexpr std::size_t result_count = 1;
template <>
inline constexpr std::size_t result_count<void> = 0;
template <class... R>
inline constexpr std::size_t result_count<std::tuple<R...>> = sizeof...(R);

/// A `fixed` of type `V` holding a copy of the value at `p`.
template <class V>
V copy_of(const void* p) {
  V v(uninitialized);
  std::memcpy(v.data(), p, bytes_of<V>);
  return v;
}

/// A host callback step: `fn` on copies of the slots `in` as `fixed` values, its
/// results written to the slots `out`. A callback may set any fixed_variable, so the
/// values read in place before it are copied first (`redirects`).
template <class F, class R, class... In>
struct callback_step {
  static constexpr std::size_t results = result_count<R>;
  mutable F fn;  // a callback may keep state of its own, as a C++ function may
  std::array<int, sizeof...(In)> in;
  std::array<int, results> out;
  std::vector<redirect> redirects;
  static void run(const void* data, frame f) {
    const auto& c = *static_cast<const callback_step*>(data);
    keep_values_read_in_place(c.redirects, f);
    auto call = [&]<std::size_t... I>(std::index_sequence<I...>) -> R { return c.fn(copy_of<In>(f[c.in[I]])...); };
    if constexpr (results == 0) {
      call(std::index_sequence_for<In...>());
    } else {
      const auto values = as_tuple(call(std::index_sequence_for<In...>()));
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (std::memcpy(f[c.out[K]], std::get<K>(values).data(), bytes_of<std::tuple_element_t<K, std::remove_cvref_t<decltype(values)>>>), ...);
      }(std::make_index_sequence<results>());
    }
  }
  static void describe(const void* data, description_sink& sink) {
    const auto& c = *static_cast<const callback_step*>(data);
    const auto nodes = slot_values<In...>(sink, c.in);
    std::vector<std::pair<kiln::dtype, kiln::shape>> specs;
    if constexpr (results > 0) {
      using values = decltype(as_tuple(std::declval<R>()));
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (specs.emplace_back(std::tuple_element_t<K, values>::dtype, std::tuple_element_t<K, values>::shape()), ...);
      }(std::make_index_sequence<results>());
    }
    const std::vector<int> ids = sink.effect("HostCallback", {}, true, {nodes.begin(), nodes.end()}, specs);
    for (std::size_t k = 0; k < results; ++k) sink.bind(c.out[k], ids[k]);
  }
};

}  // namespace typed

/// kiln::host_callback on typed values (TensorFlow's tf.py_function): C++ function
/// `fn` runs at every call of the trace, in program order, on `fixed` copies of the
/// inputs' values, and returns nothing, a `fixed` or a std::tuple of them, which the
/// trace goes on with. On `fixed` values outside a function it runs at once.
/// \code
/// kiln::function f([&](const auto& x) {
///   return kiln::host_callback([](const kiln::fixed<float, 3>& v) { return v * 2.f; }, x + 1.f);
/// });
/// \endcode
template <class F, typed::operand... Inputs>
  requires(sizeof...(Inputs) > 0)
auto host_callback(F fn, const Inputs&... inputs) {
  using R = std::invoke_result_t<F&, const typed::value_of<Inputs>&...>;
  static_assert(typed::callback_result<R>,
                "kiln::host_callback: on typed values the callback returns nothing, a kiln::fixed or a std::tuple of them");
  if constexpr (!typed::callback_result<R>) {
    return typed::rule_error{};
  } else if constexpr (typed::eager<Inputs...>) {
    return fn(typed::value_of<Inputs>(inputs)...);
  } else {
    using step_t = typed::callback_step<F, R, typed::value_of<Inputs>...>;
    typed::recorder& r = typed::current_recorder();
    auto data = std::make_unique<step_t>(step_t{std::move(fn), {typed::slot_of(inputs)...}, {}, {}});
    data->redirects = r.protect_reads_in_place(nullptr);
    if constexpr (step_t::results == 0) {
      r.push(typed::step_of(std::move(data)));
    } else {
      using results_t = decltype(typed::as_tuple(std::declval<R>()));
      auto symbols = [&]<std::size_t... K>(std::index_sequence<K...>) {
        return std::tuple{typed::symbol_for<std::tuple_element_t<K, results_t>>(
            data->out[K] = r.add_slot(typed::bytes_of<std::tuple_element_t<K, results_t>>))...};
      }(std::make_index_sequence<step_t::results>());
      r.push(typed::step_of(std::move(data)));
      return typed::unwrap(std::move(symbols));
    }
  }
}

// A kiln::variable holds a runtime kiln::tensor; typed values take a fixed_variable.
#define KILN_VARIABLE_WITH_TYPED(sym)                                                                          \
  template <typed::operand X>                                                                                  \
  auto operator sym(const variable&, const X&) {                                                               \
    static_assert(typed::always_false<X>,                                                                      \
                  "kiln: a kiln::variable cannot be used with fixed arguments; use kiln::fixed_variable<T, Dims...>"); \
    return typed::rule_error{};                                                                                \
  }                                                                                                            \
  template <typed::operand X>                                                                                  \
  auto operator sym(const X&, const variable&) {                                                               \
    static_assert(typed::always_false<X>,                                                                      \
                  "kiln: a kiln::variable cannot be used with fixed arguments; use kiln::fixed_variable<T, Dims...>"); \
    return typed::rule_error{};                                                                                \
  }
KILN_VARIABLE_WITH_TYPED(+)
KILN_VARIABLE_WITH_TYPED(-)
KILN_VARIABLE_WITH_TYPED(*)
KILN_VARIABLE_WITH_TYPED(/)
KILN_VARIABLE_WITH_TYPED(<)
KILN_VARIABLE_WITH_TYPED(>)
#undef KILN_VARIABLE_WITH_TYPED

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::typed {

KILN_LIBRARY_INLINE void print_step::run(const void* data, frame f) {
  const auto& p = *static_cast<const print_step*>(data);
  std::vector<tensor> values;
  std::vector<const tensor*> in;
  values.reserve(p.inputs.size());
  for (const input& i : p.inputs) {
    tensor& t = values.emplace_back(i.dtype, i.shape);
    std::memcpy(t.view().data, f[i.slot], std::size_t(i.shape.num_elements()) * size_of(i.dtype));
  }
  for (const tensor& t : values) in.push_back(&t);
  detail::write_print_line(detail::print_line(p.pieces, in));
}

KILN_LIBRARY_INLINE void print_step::describe(const void* data, description_sink& sink) {
  std::vector<int> inputs;
  for (const input& i : static_cast<const print_step*>(data)->inputs)
    inputs.push_back(sink.value(i.slot, i.shape.dims()));
  sink.effect("PrintV2", {}, true, std::move(inputs), {});
}

}  // namespace kiln::typed
#endif  // KILN_DEFINE_LIBRARY

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
#include "kiln/typed/kernels.hpp"

namespace kiln {

/// A variable whose element type and shape are compile-time, for functions called with
/// `fixed` arguments (API.md section 4). Copies share the value. Inside a typed trace
/// `read_value`, `assign`, `assign_add` and `assign_sub` run at every call, in program
/// order, and give the value read or written; outside one, `value()` reads it and
/// `set(x)` writes it.
/// \code
/// kiln::fixed_variable<float, 3> total;
/// kiln::function add_to([&](const auto& x) { return total.assign_add(x); });
/// add_to(kiln::fixed<float, 3>::ones());
/// add_to(kiln::fixed<float, 3>::ones());  // total.value() is [2 2 2]
/// \endcode
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

  /// The value at this point of every run of the trace.
  symbol_type read_value() const {
    typed::recorder& r = recorder_for("read_value");
    const int out = r.add_slot(bytes);
    r.push({&access::read, std::make_shared<const access>(access{state_, out})});
    return symbol_type(out);
  }
  /// Writes `x` (a typed operand of this type) and gives the value written.
  template <class X>
    requires typed::operand<X>
  symbol_type assign(const X& x) {
    recorder_for("assign");
    const symbol_type written(typed::expression_of<T, false>(x));
    typed::current_recorder().push({&access::write, std::make_shared<const access>(access{state_, written.slot()})});
    return written;
  }
  /// Adds `x` to the value and gives the sum.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_add(const X& x) {
    recorder_for("assign_add");
    return assign(read_value() + x);
  }
  /// Subtracts `x` from the value and gives the difference.
  template <class X>
    requires typed::operand<X>
  symbol_type assign_sub(const X& x) {
    recorder_for("assign_sub");
    return assign(read_value() - x);
  }

 private:
  static constexpr std::size_t bytes = sizeof(T) * std::size_t(value_type::size);
  struct state {
    value_type value;
    std::string name;
  };
  /// A read or write of the variable from or to slot `slot`; holds the state, so the
  /// trace keeps the variable alive.
  struct access {
    std::shared_ptr<state> target;
    int slot;
    static void read(const void* data, typed::frame f) {
      const auto& a = *static_cast<const access*>(data);
      std::memcpy(f[a.slot], a.target->value.data(), bytes);
    }
    static void write(const void* data, typed::frame f) {
      const auto& a = *static_cast<const access*>(data);
      std::memcpy(a.target->value.data(), f[a.slot], bytes);
    }
  };
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
  static void run(const void* data, frame f) {
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
};

}  // namespace typed

/// kiln::print in a typed trace: typed values are printed as they are at every call.
/// \code kiln::function f([](const auto& x) { kiln::print("x is", x); return x * 2; }); \endcode
template <class... Args>
  requires(typed::lazy<Args> || ...)
void print(const Args&... args) {
  auto data = std::make_shared<typed::print_step>();
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
  typed::current_recorder().push({&typed::print_step::run, std::move(data)});
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

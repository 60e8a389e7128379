#pragma once
/// \file
/// `kiln::ops::any_op`: any op of the registry, as graph nodes and the op table
/// (kiln/ops/op_table.hpp) hold it.

#include <array>
#include <atomic>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kiln/ops/registry.hpp"

namespace kiln {

namespace ops {

/// Any op of the registry, as a graph node stores it: which op (its position in
/// `all_ops`) and the op, shared by the copies (an op never changes once made).
/// A class of kiln's own rather than a std::variant of the registry: libstdc++'s
/// variant instantiates its storage and special members by recursion over every
/// alternative, which every source file that includes kiln paid. Read it with
/// ops::holds_alternative, `unchecked` and ops::visit.
/// \code
/// kiln::ops::any_op op = kiln::ops::add{};
/// assert(kiln::ops::holds_alternative<kiln::ops::add>(op) && kiln::ops::name_of(op) == "add");
/// \endcode
class any_op {
 public:
  /// How many ops the registry has.
  static constexpr std::size_t size = boost::mp11::mp_size<all_ops>::value;
  /// The position of op type `Op`.
  template <class Op>
  static constexpr std::size_t position_of = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    std::size_t i = 0;
    (void)((std::is_same_v<Op, Ops> ? false : (++i, true)) && ...);
    return i;
  }(static_cast<all_ops*>(nullptr));

  /// Holds no op (index() is `size`); what a node that is not a registry op keeps.
  any_op() = default;
  template <class Op>
    requires registered<Op>
  any_op(Op op) : box_(make_box(std::move(op))), index_(position_of<Op>) {}
  template <class Op>
  any_op(std::in_place_type_t<Op>, Op op) : any_op(std::move(op)) {}
  any_op(const any_op& other) noexcept : box_(other.box_), index_(other.index_) {
    if (box_) box_->references.fetch_add(1, std::memory_order_relaxed);
  }
  any_op(any_op&& other) noexcept : box_(std::exchange(other.box_, nullptr)), index_(std::exchange(other.index_, size)) {}
  any_op& operator=(any_op other) noexcept {
    std::swap(box_, other.box_);
    std::swap(index_, other.index_);
    return *this;
  }
  ~any_op() {
    if (box_ && box_->references.fetch_sub(1, std::memory_order_acq_rel) == 1) box_->destroy(box_);
  }

  /// The position of the op held in `all_ops`.
  std::size_t index() const { return index_; }
  /// The op held, which must be an `Op`.
  template <class Op>
  const Op& unchecked() const {
    return static_cast<const box<Op>*>(box_)->op;
  }
  /// The address of the op held (null for none), for code that reaches the op
  /// through its type-erased rules (detail::op_rules) rather than its type.
  const void* address() const { return box_ ? box_->op : nullptr; }

 private:
  struct box_base {
    std::atomic<std::size_t> references{1};
    void (*destroy)(box_base*);
    const void* op;  ///< the derived box's op
  };
  template <class Op>
  struct box : box_base {
    explicit box(Op o) : box_base{{1}, [](box_base* b) { delete static_cast<box*>(b); }, &op}, op(std::move(o)) {}
    Op op;
  };
  // An op without members (add, multiply: most nodes of a graph) is one box shared by
  // every node that holds it, which its own reference keeps alive: tracing a graph of
  // 10^5 such ops made 10^5 allocations for them.
  template <class Op>
  static box_base* make_box(Op op) {
    if constexpr (std::is_empty_v<Op> && std::is_trivially_copyable_v<Op>) {
      static box<Op> shared{op};
      shared.references.fetch_add(1, std::memory_order_relaxed);
      return &shared;
    } else {
      return new box<Op>(std::move(op));
    }
  }
  box_base* box_ = nullptr;
  std::size_t index_ = size;
};

/// Whether `op` holds an `Op`.
template <class Op>
bool holds_alternative(const any_op& op) {
  return op.index() == any_op::position_of<Op>;
}

/// `f(the op that op holds)`, as std::visit, through one table of function pointers
/// per visitor type.
/// \code kiln::ops::visit([](const auto& o) { return o.name; }, kiln::ops::any_op(kiln::ops::add{})) == "add" \endcode
template <class F>
decltype(auto) visit(F&& f, const any_op& op) {
  return []<class... Ops>(F& g, const any_op& o, boost::mp11::mp_list<Ops...>*) -> decltype(auto) {
    using result = std::invoke_result_t<F&, const boost::mp11::mp_front<all_ops>&>;
    static constexpr result (*table[])(F&, const any_op&) = {
        [](F& h, const any_op& x) -> result { return h(x.unchecked<Ops>()); }...};
    return table[o.index()](g, o);
  }(f, op, static_cast<all_ops*>(nullptr));
}

/// The registry name of the op that `op` holds: `add`, `matmul`; "" when it holds none.
inline std::string_view name_of(const any_op& op) {
  static constexpr auto names = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    return std::array<std::string_view, sizeof...(Ops) + 1>{Ops::name..., ""};
  }(static_cast<all_ops*>(nullptr));
  return names[op.index()];
}

/// ops::value_operand of the op that `op` holds: the operand whose dtype selects its kernel.
inline int value_operand_of(const any_op& op) {
  static constexpr auto operands = []<class... Ops>(boost::mp11::mp_list<Ops...>*) {
    return std::array<int, sizeof...(Ops)>{value_operand<Ops>...};
  }(static_cast<all_ops*>(nullptr));
  return operands[op.index()];
}

}  // namespace ops

}  // namespace kiln

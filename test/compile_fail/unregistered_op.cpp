// An op type without its row in the op registry, called like any op: one short error
// that says where the row goes, naming the op in its instantiation, instead of pages
// from std::variant's constructor over every registered op.
// expect-first-error: static assertion failed: kiln: this op has no row in the op registry: add F\(<op>\) to its family's list in kiln/ops/op_list.hpp
// expect-early: Op = kiln::ops::twice
// max-lines: 20
#include <kiln/kiln.hpp>

namespace kiln::ops {
struct twice : elementwise_op<1, numeric, result_rule::same, numeric> {
  static constexpr std::string_view name = "twice";
  template <class T> T operator()(T a) const { return a + a; }
};
}  // namespace kiln::ops

kiln::tensor y = kiln::detail::apply(kiln::ops::twice{}, kiln::ones({2}));

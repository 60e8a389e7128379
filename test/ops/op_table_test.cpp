// Graphs reach kernels through the kernel table, which an op's first call fills: a
// program compiles the kernels of the ops it calls. A graph op whose row is empty
// (a graph made elsewhere) must raise kiln::unavailable_error naming the op.

#include "../support/op_check.hpp"


namespace {

using kiln::testing::require_same;
using kiln::testing::require_throws;

// Empties one op's row of the kernel table while alive, as in a program that never
// calls the op, and restores it even when a failed check unwinds the test.
class without_kernels {
 public:
  template <class Op>
  static without_kernels of() {
    return without_kernels(kiln::detail::kernel_table()[kiln::ops::any_op::position_of<Op>]);
  }
  ~without_kernels() {
    row_.entry = entry_;
    row_.execute = execute_;
  }
  without_kernels(const without_kernels&) = delete;
  without_kernels& operator=(const without_kernels&) = delete;

 private:
  explicit without_kernels(kiln::detail::op_kernels& row)
      : row_(row), execute_(row.execute.exchange(nullptr)), entry_(row.entry.exchange(nullptr)) {}
  kiln::detail::op_kernels& row_;
  kiln::detail::op_kernels::execute_fn execute_;
  kiln::detail::op_kernels::entry_fn entry_;
};

}  // namespace

TEST_CASE("an op's first call fills its row of the kernel table") {
  (void)kiln::floormod(kiln::constant(7), kiln::constant(3));
  const auto& row = kiln::detail::kernel_table()[kiln::ops::any_op::position_of<kiln::ops::floormod>];
  CHECK(row.execute != nullptr);
  CHECK(row.entry != nullptr);
}

TEST_CASE("a graph op without kernels in this program raises unavailable_error naming the op") {
  kiln::function f([](const kiln::tensor& x) { return x % 3; }, {.name = "f", .arg_names = {"x"}});
  // The op's first call registers it; after that an emptied row stays empty.
  (void)kiln::floormod(kiln::constant(1), kiln::constant(1));
  {
    auto missing = without_kernels::of<kiln::ops::floormod>();
    require_throws<kiln::unavailable_error>([&] { return f(kiln::constant({7, -7})); },
                                            {"floormod", "no kernel", "KILN_INSTANTIATE_KERNELS"});
  }
  // The row is back: the same function traces and runs.
  require_same(f(kiln::constant({7, -7})), kiln::constant({1, 2}));
}

TEST_CASE("ops::any_op holds one op of the registry and shares it with its copies") {
  const kiln::ops::any_op empty;
  CHECK(empty.index() == kiln::ops::any_op::size);
  CHECK(kiln::ops::name_of(empty).empty());
  CHECK(empty.address() == nullptr);
  CHECK_FALSE(kiln::detail::same_op(empty, empty));
  require_throws<kiln::internal_error>([&] { (void)kiln::detail::kernels_of(empty); }, {"holds no op"});

  const kiln::ops::any_op sum = kiln::ops::reduce_sum(kiln::reduction_axes({1}), true);
  kiln::ops::any_op copy = sum;
  CHECK(&copy.unchecked<kiln::ops::reduce_sum>() == &sum.unchecked<kiln::ops::reduce_sum>());
  CHECK(copy.address() == &sum.unchecked<kiln::ops::reduce_sum>());
  CHECK(kiln::ops::holds_alternative<kiln::ops::reduce_sum>(copy));
  CHECK_FALSE(kiln::ops::holds_alternative<kiln::ops::add>(copy));
  CHECK(kiln::ops::name_of(copy) == "reduce_sum");
  CHECK(kiln::ops::visit([](const auto& op) { return std::string(op.name); }, copy) == "reduce_sum");
  const kiln::ops::any_op moved = std::move(copy);
  CHECK(copy.index() == kiln::ops::any_op::size);  // NOLINT(bugprone-use-after-move): a moved-from op holds none
  CHECK(kiln::ops::holds_alternative<kiln::ops::reduce_sum>(moved));
  copy = kiln::ops::add{};
  CHECK(kiln::ops::name_of(copy) == "add");
  CHECK(kiln::ops::name_of(moved) == "reduce_sum");
}

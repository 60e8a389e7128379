// The ONNX exporter finds a special op by its kind in kiln/io/special_ops.hpp's list, and
// the op lowers itself or says why ONNX cannot express it: an op the list does not hold
// is refused with an error naming it.

#include <kiln/onnx.hpp>
#include <string>

#include "../support/op_check.hpp"
#include "unknown_special_op.hpp"

TEST_CASE("ONNX export: every special op that the exporter knows lowers itself or says why it cannot") {
  int refused = 0;
  boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, kiln::detail::known_special_ops>>(
      [&]<class Op>(std::type_identity<Op>) {
        constexpr bool refuses = requires { Op::onnx_refusal; };
        constexpr bool lowers = requires { &Op::template to_onnx<kiln::onnx::detail::exporter, onnx::GraphProto>; };
        CHECK(refuses != lowers);
        refused += refuses;
      });
  // A variable's assignment, a host callback, a random draw, a summary, a collective, a
  // dataset loop, an iterator, a typed trace's step.
  CHECK(refused == 8);
}

TEST_CASE("ONNX export: a special op that the exporter does not know is refused by name") {
  kiln::function f([](const kiln::tensor& x) { return special_ops_test::doubled(x) + 1.f; });
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] { return kiln::onnx::to_model(f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32))); },
      {"kiln::onnx::export_model: node DoublingForTests", "has no ONNX operator"});
}

TEST_CASE("ONNX export: a dataset loop or iterator is refused, saying why") {
  using kiln::data::dataset;
  kiln::function total([] {
    return dataset::range(4).reduce(kiln::constant(std::int64_t(0)),
                                    [](const kiln::tensor& s, const kiln::tensor& x) { return s + x; });
  });
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] { return kiln::onnx::to_model(total.get_concrete_function()); },
      {"kiln::onnx::export_model: node ReduceDataset", "loops over a dataset", "an ONNX model cannot hold"});
  kiln::function next([](const kiln::data::iterator& it) { return it.get_next()[0] * 2; });
  const kiln::data::iterator it = dataset::range(3).make_iterator();
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] { return kiln::onnx::to_model(next.get_concrete_function(it)); },
      {"kiln::onnx::export_model: node IteratorGetNext", "advances an iterator over a dataset", "no state"});
}

TEST_CASE("ONNX export: a typed trace's step, named as a runtime tier's op, is refused as what it is") {
  using lowering = kiln::onnx::detail::exporter::special_lowering;
  const kiln::typed::described_op cond("cond", false);
  const lowering* entry = kiln::detail::special_op_entry<lowering>(cond);
  REQUIRE(entry);
  CHECK(!entry->lower);
  CHECK(std::string(entry->refusal).find("a step of a typed trace") != std::string::npos);
  // The runtime tier's `cond` of that name lowers itself (to If).
  const lowering* runtime_cond = kiln::detail::special_op_entry<lowering>("cond");
  REQUIRE(runtime_cond);
  CHECK(runtime_cond->lower);
  CHECK(runtime_cond->refusal.empty());
}

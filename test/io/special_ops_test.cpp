// Special ops describe themselves: the saved-function writer and reader find an op by its
// name in kiln/io/special_ops.hpp's list and call its own save and load; an op the list
// does not hold is refused by name; a replayed special node reaches the gradient tapes
// through the entry that the layer holding its backward registers for its name.

#include <atomic>
#include <filesystem>
#include <kiln/saved_function.hpp>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../support/op_check.hpp"
#include "unknown_special_op.hpp"

TEST_CASE("every special op that files know has names of its own, and saves and loads itself or says why not") {
  std::multiset<std::string_view> names;
  int refused = 0;
  boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, kiln::detail::known_special_ops>>(
      [&]<class Op>(std::type_identity<Op>) {
        for (std::string_view n : Op::op_names()) names.insert(n);
        constexpr bool refuses = requires { Op::save_refusal; };
        constexpr bool loads = requires { &Op::template load<int>; };
        CHECK(refuses != loads);
        refused += refuses;
      });
  // TensorFlow's names for the nodes, where TensorFlow has them.
  const std::set<std::string_view> expected = {
      "ReadVariableOp",       "AssignVariableOp",       "AssignAddVariableOp",     "AssignSubVariableOp",
      "InitializeVariableOp", "PrintV2",                "HostCallback",            "cond",
      "while",                "RandomUniform",          "StatefulUniform",         "RandomStandardNormal",
      "StatefulStandardNormal", "TruncatedNormal",      "StatefulTruncatedNormal", "WriteScalarSummary",
      "WriteHistogramSummary", "WriteTextSummary",      "WriteImageSummary",       "CollectiveReduceV2",
      "CollectiveGatherV2",   "CollectiveBcastV2",      "CollectiveReduceScatterV2", "CollectiveReduce",
      "ReduceDataset",        "IteratorGetNext"};
  CHECK(names.size() == expected.size());  // no name twice
  CHECK(std::set<std::string_view>(names.begin(), names.end()) == expected);
  CHECK(refused == 4);  // the host callback, the dataset loop, the iterator, the typed trace's steps
}

namespace special_ops_test {

// What a consumer's entry of an op holds here: the op's save_refusal, if it has one.
struct save_refusal_entry {
  std::string_view refusal;
  template <class Op>
  static save_refusal_entry of() {
    if constexpr (requires { Op::save_refusal; })
      return {Op::save_refusal};
    else
      return {"(none)"};
  }
};

}  // namespace special_ops_test

TEST_CASE("a typed trace's step is found by its kind, not by the runtime tier's name it takes") {
  using special_ops_test::save_refusal_entry;
  const kiln::typed::described_op read("ReadVariableOp", false, {}, "v");
  const save_refusal_entry* by_kind = kiln::detail::special_op_entry<save_refusal_entry>(read);
  REQUIRE(by_kind);
  CHECK(std::string(by_kind->refusal).find("a step of a typed trace") != std::string::npos);
  const save_refusal_entry* by_name = kiln::detail::special_op_entry<save_refusal_entry>("ReadVariableOp");
  REQUIRE(by_name);
  CHECK(by_name->refusal == "(none)");  // the runtime tier's variable read, which saves itself
  CHECK(kiln::detail::special_op_entry<save_refusal_entry>(special_ops_test::doubling_op()) == nullptr);
}

TEST_CASE("a dataset loop or iterator inside a function is refused when saved, saying why") {
  using kiln::data::dataset;
  const auto path = std::filesystem::temp_directory_path() / ("kiln_" + std::to_string(::getpid()) + "_dataset.kiln");
  kiln::function total([] {
    return dataset::range(4).reduce(kiln::constant(std::int64_t(0)),
                                    [](const kiln::tensor& s, const kiln::tensor& x) { return s + x; });
  });
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] {
        kiln::save(total.get_concrete_function(), path);
        return 0;
      },
      {"kiln::save: node ReduceDataset", "loops over a dataset", "a saved function cannot hold"});
  kiln::function next([](const kiln::data::iterator& it) { return it.get_next()[0] * 2; });
  const kiln::data::iterator it = dataset::range(3).make_iterator();
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] {
        kiln::save(next.get_concrete_function(it), path);
        return 0;
      },
      {"kiln::save: node IteratorGetNext", "advances an iterator over a dataset", "a saved function cannot hold"});
  std::filesystem::remove(path);
}

TEST_CASE("a special op that files do not know is refused by name when saved") {
  kiln::function f([](const kiln::tensor& x) { return special_ops_test::doubled(x) + 1.f; });
  const auto path = std::filesystem::temp_directory_path() / ("kiln_" + std::to_string(::getpid()) + "_unknown.kiln");
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] {
        kiln::save(f, path, kiln::tensor_spec({2}, kiln::float32));
        return 0;
      },
      {"kiln::save: node DoublingForTests", "is a DoublingForTests, which kiln cannot save yet"});
  std::filesystem::remove(path);
}

TEST_CASE("a replayed special node reaches the gradient tapes through the entry registered for its name") {
  static std::atomic<int> recorded{0};
  static std::vector<float> seen_input, seen_result;
  static kiln::detail::special_gradient entry{
      "DoublingForTests", [](const kiln::special_op& op, std::span<const kiln::tensor> inputs,
                             std::span<const kiln::tensor> results) {
        if (op.name() != "DoublingForTests" || inputs.size() != 1 || results.size() != 1) return;
        seen_input = inputs[0].to_vector<float>();
        seen_result = results[0].to_vector<float>();
        ++recorded;
      }};
  kiln::function f([](const kiln::tensor& x) { return special_ops_test::doubled(x); });
  const kiln::tensor x = kiln::constant({1.f, 3.f});
  {
    // Without an entry the node has no gradient: the tapes never hear of it.
    kiln::gradient_tape tape;
    tape.watch(x);
    (void)f(x);
  }
  CHECK(recorded == 0);
  kiln::detail::register_special_gradient(entry);
  {
    kiln::gradient_tape tape;
    tape.watch(x);
    const kiln::tensor y = f(x);
    CHECK(y.to_vector<float>() == std::vector<float>{2.f, 6.f});
  }
  CHECK(recorded == 1);
  CHECK(seen_input == std::vector<float>{1.f, 3.f});
  CHECK(seen_result == std::vector<float>{2.f, 6.f});
}

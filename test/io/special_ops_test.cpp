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
      "CollectiveGatherV2",   "CollectiveBcastV2",      "CollectiveReduceScatterV2", "CollectiveReduce"};
  CHECK(names.size() == expected.size());  // no name twice
  CHECK(std::set<std::string_view>(names.begin(), names.end()) == expected);
  CHECK(refused == 1);  // the host callback
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

// The ONNX exporter finds a special op by its name in kiln/io/special_ops.hpp's list: an op
// the list does not hold is refused with an error naming it.

#include <kiln/onnx.hpp>

#include "../support/op_check.hpp"
#include "unknown_special_op.hpp"

TEST_CASE("ONNX export: a special op that the exporter does not know is refused by name") {
  kiln::function f([](const kiln::tensor& x) { return special_ops_test::doubled(x) + 1.f; });
  kiln::testing::require_throws<kiln::unavailable_error>(
      [&] { return kiln::onnx::to_model(f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32))); },
      {"kiln::onnx::export_model: node DoublingForTests", "has no ONNX operator"});
}

// Each op that the ONNX exporter lowers to one operator carries that operator's name
// beside its own (`onnx_name`, kiln/ops/op.hpp), also where the exporter lowers it in
// its own way (with attributes, or a change of layout around it); the exported node
// is that operator, with the op's attributes.

#include <kiln/onnx.hpp>
#include <set>
#include <string>

#include "../support/op_check.hpp"

namespace {

// The op's `onnx_name`, or "(none)".
template <class Op>
std::string onnx_name() {
  if constexpr (requires { Op::onnx_name; })
    return std::string(Op::onnx_name);
  else
    return "(none)";
}

// The operators of the nodes of model `m`, but for the Identity of each output.
std::multiset<std::string> operators_of(const onnx::ModelProto& m) {
  std::multiset<std::string> out;
  for (const onnx::NodeProto& n : m.graph().node())
    if (n.op_type() != "Identity") out.insert(n.op_type());
  return out;
}

// The attributes' names of the one node of `m` whose operator is `op_type`.
std::set<std::string> attributes_of(const onnx::ModelProto& m, const std::string& op_type) {
  std::set<std::string> out;
  for (const onnx::NodeProto& n : m.graph().node())
    if (n.op_type() == op_type)
      for (const onnx::AttributeProto& a : n.attribute()) out.insert(a.name());
  return out;
}

}  // namespace

TEST_CASE("ONNX export: every op lowered to one operator by the exporter's own code carries its name") {
  namespace ops = kiln::ops;
  // The ops that the exporter lowers in their own way, each to one operator (ONNX's
  // operator names, from its operator list).
  CHECK(onnx_name<ops::add>() == "Add");
  CHECK(onnx_name<ops::relu>() == "Relu");
  CHECK(onnx_name<ops::gelu>() == "Gelu");
  CHECK(onnx_name<ops::elu>() == "Elu");
  CHECK(onnx_name<ops::leaky_relu>() == "LeakyRelu");
  CHECK(onnx_name<ops::cast>() == "Cast");
  CHECK(onnx_name<ops::divide>() == "Div");
  CHECK(onnx_name<ops::argmax>() == "ArgMax");
  CHECK(onnx_name<ops::reshape>() == "Reshape");
  CHECK(onnx_name<ops::transpose>() == "Transpose");
  CHECK(onnx_name<ops::index>() == "Gather");
  CHECK(onnx_name<ops::slice>() == "Slice");
  CHECK(onnx_name<ops::shape_of>() == "Shape");
  CHECK(onnx_name<ops::conv2d>() == "Conv");
  CHECK(onnx_name<ops::max_pool>() == "MaxPool");
  CHECK(onnx_name<ops::avg_pool>() == "AveragePool");
  // The ops that ONNX computes as a composition of operators carry none.
  CHECK(onnx_name<ops::silu>() == "(none)");
  CHECK(onnx_name<ops::square>() == "(none)");
  CHECK(onnx_name<ops::not_equal>() == "(none)");
  CHECK(onnx_name<ops::floordiv>() == "(none)");
  CHECK(onnx_name<ops::floormod>() == "(none)");
  CHECK(onnx_name<ops::relu_grad>() == "(none)");
  CHECK(onnx_name<ops::stack>() == "(none)");
}

TEST_CASE("ONNX export: the node an op lowers to is its onnx_name, with the op's attributes") {
  using kiln::tensor;
  const auto model = [](auto& f, const auto&... specs) {
    return kiln::onnx::to_model(f.get_concrete_function(specs...));
  };
  const kiln::tensor_spec matrix({2, 3}, kiln::float32), image({1, 4, 4, 2}, kiln::float32);

  kiln::function add([](const tensor& x, const tensor& y) { return x + y; });
  CHECK(operators_of(model(add, matrix, matrix)) == std::multiset<std::string>{onnx_name<kiln::ops::add>()});

  kiln::function relu([](const tensor& x) { return kiln::relu(x); });
  CHECK(operators_of(model(relu, matrix)) == std::multiset<std::string>{onnx_name<kiln::ops::relu>()});

  kiln::function cast([](const tensor& x) { return kiln::cast(x, kiln::int32); });
  const onnx::ModelProto cast_model = model(cast, matrix);
  CHECK(operators_of(cast_model) == std::multiset<std::string>{onnx_name<kiln::ops::cast>()});
  CHECK(attributes_of(cast_model, "Cast") == std::set<std::string>{"to"});

  // Reshape takes its shape as an input; a 0 in it sets `allowzero`.
  kiln::function reshape([](const tensor& x) { return kiln::reshape(x, {3, 0}); });
  const onnx::ModelProto reshape_model = model(reshape, kiln::tensor_spec({0, 3}, kiln::float32));
  CHECK(operators_of(reshape_model) == std::multiset<std::string>{onnx_name<kiln::ops::reshape>()});
  CHECK(attributes_of(reshape_model, "Reshape") == std::set<std::string>{"allowzero"});

  kiln::function transpose([](const tensor& x) { return kiln::transpose(x, {1, 0}); });
  const onnx::ModelProto transpose_model = model(transpose, matrix);
  CHECK(operators_of(transpose_model) == std::multiset<std::string>{onnx_name<kiln::ops::transpose>()});
  CHECK(attributes_of(transpose_model, "Transpose") == std::set<std::string>{"perm"});

  kiln::function argmax([](const tensor& x) { return kiln::argmax(x, 1); });
  const onnx::ModelProto argmax_model = model(argmax, matrix);
  CHECK(operators_of(argmax_model) == std::multiset<std::string>{onnx_name<kiln::ops::argmax>()});
  CHECK(attributes_of(argmax_model, "ArgMax") == std::set<std::string>{"axis", "keepdims"});

  // NHWC and HWIO transposed to ONNX's NCHW and OIHW around the operator, and back.
  kiln::function conv([](const tensor& x, const tensor& w) { return kiln::conv2d(x, w, 1, "SAME"); });
  const onnx::ModelProto conv_model = model(conv, image, kiln::tensor_spec({2, 2, 2, 3}, kiln::float32));
  CHECK(operators_of(conv_model) ==
        std::multiset<std::string>{"Transpose", "Transpose", onnx_name<kiln::ops::conv2d>(), "Transpose"});
  CHECK(attributes_of(conv_model, "Conv") == std::set<std::string>{"strides", "auto_pad"});

  kiln::function max_pool([](const tensor& x) { return kiln::max_pool2d(x, 2, 2, "VALID"); });
  const onnx::ModelProto pool_model = model(max_pool, image);
  CHECK(operators_of(pool_model) ==
        std::multiset<std::string>{"Transpose", onnx_name<kiln::ops::max_pool>(), "Transpose"});
  CHECK(attributes_of(pool_model, "MaxPool") == std::set<std::string>{"kernel_shape", "strides", "auto_pad"});
}

// The guides' reason for graphs, "you can use your TensorFlow graph in environments that
// don't have a Python interpreter": kiln writes a traced function as an ONNX model,
// for onnxruntime, TensorRT and other runtimes. A dense layer and the guides' tanh loop
// are exported, read back and described; a function that assigns a variable cannot be
// exported, ONNX models having no state.
//
// Run a model in Python with onnxruntime:
//   import numpy as np, onnxruntime as ort
//   s = ort.InferenceSession("dense.onnx")
//   print(s.run(None, {"x": np.ones((2, 3), np.float32)}))

#include <fstream>
#include <iostream>
#include <kiln/onnx.hpp>
#include <map>
#include <string>

namespace {

std::string describe(const onnx::ValueInfoProto& v) {
  std::string dims;
  for (const auto& d : v.type().tensor_type().shape().dim())
    dims += (dims.empty() ? "" : ", ") + (d.has_dim_value() ? std::to_string(d.dim_value()) : std::string("None"));
  const auto type = onnx::TensorProto::DataType(v.type().tensor_type().elem_type());
  return v.name() + ": " + onnx::TensorProto::DataType_Name(type) + " (" + dims + ")";
}

// How many nodes of each operator a graph holds, its subgraphs' included.
void count_ops(const onnx::GraphProto& g, std::map<std::string, int>& ops) {
  for (const onnx::NodeProto& n : g.node()) {
    ++ops[n.op_type()];
    for (const onnx::AttributeProto& a : n.attribute())
      if (a.has_g()) count_ops(a.g(), ops);
  }
}

// Reads the model at `path` back and prints what another runtime will see.
void describe_file(const std::string& path) {
  onnx::ModelProto model;
  std::ifstream is(path, std::ios::binary);
  if (!model.ParseFromIstream(&is)) {
    std::cout << path << ": not an ONNX model\n";
    return;
  }
  std::cout << path << ": opset " << model.opset_import(0).version() << ", produced by " << model.producer_name()
            << "\n";
  for (const auto& in : model.graph().input()) std::cout << "  input  " << describe(in) << "\n";
  for (const auto& out : model.graph().output()) std::cout << "  output " << describe(out) << "\n";
  for (const auto& init : model.graph().initializer())
    if (init.dims_size() > 0) std::cout << "  weight " << init.name() << " (" << init.dims_size() << "-D)\n";
  std::map<std::string, int> ops;
  count_ops(model.graph(), ops);
  std::cout << "  operators:";
  for (const auto& [op, count] : ops) std::cout << " " << op << (count > 1 ? " x" + std::to_string(count) : "");
  std::cout << "\n";
}

}  // namespace

int main() {
  using kiln::tensor;

  // The guides' dense layer: its variables are written with their current values.
  kiln::variable w(kiln::random::uniform({3, 2}, -1, 1, kiln::float32, 1), "w");
  kiln::variable b(kiln::zeros({2}), "b");
  kiln::function dense([&](const tensor& x) { return kiln::relu(kiln::matmul(x, w) + b); },
                       {.name = "dense", .arg_names = {"x"}});
  const auto dense_concrete = dense.get_concrete_function(kiln::tensor_spec({kiln::none, 3}, kiln::float32));
  kiln::onnx::export_model(dense_concrete, "dense.onnx");
  describe_file("dense.onnx");
  std::cout << "  kiln computes " << dense_concrete(kiln::ones({2, 3})) << "\n";

  // "A simple loop" of Better performance with tf.function: tanh until the sum drops to
  // 1, one ONNX Loop.
  kiln::function tanh_loop(
      [](const tensor& x) {
        return kiln::while_loop([](const tensor& v) { return kiln::reduce_sum(v) > 1.f; },
                                [](const tensor& v) { return kiln::tanh(v); }, x);
      },
      {.name = "f", .arg_names = {"x"}});
  kiln::onnx::export_model(tanh_loop.get_concrete_function(kiln::tensor_spec({5}, kiln::float32)), "tanh_loop.onnx");
  describe_file("tanh_loop.onnx");

  // A kiln::cond: one ONNX If, each branch a graph.
  kiln::function relu_by_cond(
      [](const tensor& x) {
        return kiln::cond(
            kiln::greater(x, 0), [&] { return x; }, [&] { return kiln::zeros_like(x); });
      },
      {.name = "simple_relu", .arg_names = {"x"}});
  kiln::onnx::export_model(relu_by_cond.get_concrete_function(kiln::tensor_spec({}, kiln::float32)), "relu.onnx");
  describe_file("relu.onnx");

  // State does not export: ONNX models are pure functions of their inputs.
  kiln::variable counter(kiln::constant(0), "counter");
  kiln::function count([&](const tensor& x) {
    counter.assign_add(x);
    return counter.read_value();
  });
  try {
    kiln::onnx::export_model(count.get_concrete_function(kiln::constant(1)), "count.onnx");
  } catch (const kiln::unavailable_error& e) {
    std::cout << "kiln::unavailable_error: " << e.what() << "\n";
  }
}

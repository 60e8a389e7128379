// ONNX export (kiln/onnx.hpp): the examples' graphs become ONNX models with the
// operators expected (`cond` as If, `while` as Loop), and a node ONNX cannot express
// raises kiln::unavailable_error naming it.
//
// The case "the examples' graphs run in onnxruntime" also writes each model with its
// inputs and kiln's outputs, in ONNX's test-data layout, to $KILN_ONNX_CASES_DIR when
// that is set: test/io/run_onnxruntime.py runs them there and compares.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <kiln/onnx.hpp>
#include <kiln/summary.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../support/op_check.hpp"

namespace {

using kiln::tensor;
using kiln::testing::require_throws;

// One graph to export, the input sets to run it on and kiln's outputs for each.
struct onnx_case {
  std::string name;
  kiln::concrete_function function;
  std::vector<std::vector<tensor>> inputs;
  std::vector<std::vector<tensor>> outputs;
  std::map<std::string, std::size_t> operators;  ///< how many nodes of these ONNX operators the model has
};

// Traces `fn` for the first input set, and runs that trace on every set.
template <class F, class... Tuples>
onnx_case make_case(const std::string& name, F& fn, const Tuples&... input_sets) {
  onnx_case c{name,
              std::apply([&](const auto&... in) { return fn.get_concrete_function(in...); },
                         std::get<0>(std::forward_as_tuple(input_sets...))),
              {},
              {},
              {}};
  const auto add = [&](const auto& set) {
    c.inputs.push_back(std::apply([](const auto&... in) { return std::vector<tensor>{in...}; }, set));
    c.outputs.push_back(std::apply([&](const auto&... in) { return c.function.call_flat(in...); }, set));
  };
  (add(input_sets), ...);
  return c;
}

// The ONNX operators a model uses, its subgraphs' included.
void collect_ops(const onnx::GraphProto& g, std::multiset<std::string>& ops) {
  for (const onnx::NodeProto& n : g.node()) {
    ops.insert(n.op_type());
    for (const onnx::AttributeProto& a : n.attribute())
      if (a.has_g()) collect_ops(a.g(), ops);
  }
}

void write_proto(const google::protobuf::Message& m, const std::filesystem::path& path) {
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  REQUIRE(m.SerializeToOstream(&os));
}

// <dir>/<case>/model.onnx and test_data_set_<k>/{input,output}_<i>.pb.
void write_case(const std::filesystem::path& dir, const onnx_case& c) {
  const std::filesystem::path root = dir / c.name;
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  // Both ends of the opsets kiln writes: the default (newest) and the oldest.
  kiln::onnx::export_model(c.function, root / "model.onnx");
  kiln::onnx::export_model(c.function, root / ("model_opset" + std::to_string(kiln::onnx::oldest_opset) + ".onnx"),
                           {.opset = kiln::onnx::oldest_opset});
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    const std::filesystem::path set = root / ("test_data_set_" + std::to_string(k));
    std::filesystem::create_directories(set);
    for (std::size_t i = 0; i < c.inputs[k].size(); ++i)
      write_proto(kiln::onnx::to_tensor(c.inputs[k][i]), set / ("input_" + std::to_string(i) + ".pb"));
    for (std::size_t i = 0; i < c.outputs[k].size(); ++i)
      write_proto(kiln::onnx::to_tensor(c.outputs[k][i]), set / ("output_" + std::to_string(i) + ".pb"));
  }
}

tensor uniform(const kiln::shape& s, float low, float high, std::uint64_t seed) {
  return kiln::random::uniform(s, low, high, kiln::float32, seed);
}

TEST_CASE("ONNX export: a TensorBoard summary cannot be exported, and the error names it") {
  kiln::function logged([](const tensor& x) {
    kiln::summary::scalar("loss", kiln::reduce_sum(x), 0);
    return x + 1.f;
  });
  require_throws<kiln::unavailable_error>(
      [&] { return kiln::onnx::to_model(logged.get_concrete_function(kiln::tensor_spec({2}, kiln::float32))); },
      {"WriteScalarSummary", "TensorBoard summary"});
}

}  // namespace

TEST_CASE("the examples' graphs run in onnxruntime") {
  std::vector<onnx_case> cases;

  // The seeds' dense layer, its weights variables.
  kiln::variable w(uniform({3, 2}, -1, 1, 1), "w"), b(uniform({2}, -1, 1, 2), "b");
  kiln::function dense([&](const tensor& x) { return kiln::relu(kiln::matmul(x, w) + b); });
  cases.push_back(make_case("dense", dense, std::tuple{uniform({4, 3}, -2, 2, 3)}));
  cases.back().operators = {{"MatMul", 1}, {"Relu", 1}};

  // examples/mlp.cpp: the loss and the predicted classes of the quadrant classifier.
  kiln::variable w1(uniform({2, 16}, -1, 1, 4), "w1"), b1(uniform({16}, -1, 1, 5), "b1");
  kiln::variable w2(uniform({16, 2}, -1, 1, 6), "w2"), b2(uniform({2}, -1, 1, 7), "b2");
  kiln::function mlp([&](const tensor& x, const tensor& y) {
    const tensor logits = kiln::matmul(kiln::tanh(kiln::matmul(x, w1) + b1), w2) + b2;
    return std::tuple{kiln::reduce_mean(kiln::sparse_softmax_cross_entropy(y, logits)), kiln::argmax(logits, 1),
                      kiln::softmax(logits)};
  });
  cases.push_back(
      make_case("mlp", mlp, std::tuple{uniform({8, 2}, -1, 1, 8), kiln::constant({0, 1, 1, 0, 1, 0, 0, 1})}));

  // examples/loops.cpp: the seeds' loops, each one Loop.
  kiln::function for_in_tfrange([] {
    return kiln::for_range(
        5, [](const tensor& i, const tensor& x) { return x + i; }, kiln::constant(0));
  });
  cases.push_back(make_case("for_in_tfrange", for_in_tfrange, std::tuple{}));
  kiln::function while_tf_cond([](const tensor& x) {
    return kiln::while_loop([](const tensor& v) { return v > 0; }, [](const tensor& v) { return v - 1; }, x);
  });
  cases.push_back(
      make_case("while_tf_cond", while_tf_cond, std::tuple{kiln::constant(5)}, std::tuple{kiln::constant(-2)}));
  kiln::function while_tf_true_tf_break([](const tensor& x) {
    return kiln::while_loop([](const tensor&) { return kiln::constant(true); },
                            [](const tensor& v) { return kiln::break_if(kiln::equal(v, 0), v - 1); }, x);
  });
  cases.push_back(make_case("while_tf_true_tf_break", while_tf_true_tf_break, std::tuple{kiln::constant(5)},
                            std::tuple{kiln::constant(0)}));
  cases.back().operators = {{"Loop", 1}, {"If", 1}};  // the If of the break
  // 001's tanh loop, whose print ONNX leaves out.
  kiln::function tanh_loop([](const tensor& x) {
    return kiln::while_loop([](const tensor& v) { return kiln::reduce_sum(v) > 1.f; },
                            [](const tensor& v) {
                              kiln::print(v);
                              return kiln::tanh(v);
                            },
                            x);
  });
  cases.push_back(make_case("tanh_loop", tanh_loop, std::tuple{uniform({5}, 0, 0.5f, 11)}));
  cases.back().operators = {{"Loop", 1}};
  // examples/dynamic_rnn.cpp, its length a tensor: a tensor_array written in a loop.
  kiln::function dynamic_rnn(
      [](const tensor& input_data, const tensor& initial_state) {
        const tensor by_time = kiln::transpose(input_data, {1, 0, 2});
        const tensor steps = kiln::shape_of(by_time)[0];
        kiln::tensor_array states(kiln::float32, steps);
        auto [state, all] = kiln::for_range(
            steps,
            [&](const tensor& i, const tensor& state, const kiln::tensor_array& written) {
              const tensor next = kiln::gather(by_time, i) + state;
              return std::tuple{next, written.write(i, next)};
            },
            initial_state, states);
        return kiln::transpose(all.stack(), {1, 0, 2});
      },
      {.input_signature =
           std::vector<kiln::tensor_spec>{{{2, kiln::none, 4}, kiln::float32}, {{2, 4}, kiln::float32}}});
  cases.push_back(make_case("dynamic_rnn", dynamic_rnn, std::tuple{uniform({2, 3, 4}, 0, 1, 12), kiln::zeros({2, 4})},
                            std::tuple{uniform({2, 7, 4}, 0, 1, 13), uniform({2, 4}, 0, 1, 14)}));

  // examples/conditionals.cpp: kiln::cond on a tensor, each branch on one input set.
  kiln::function maybe_tensor_cond([](const tensor& x) {
    return kiln::cond(
        x < 0, [&] { return -x; }, [&] { return x; });
  });
  cases.push_back(
      make_case("maybe_tensor_cond", maybe_tensor_cond, std::tuple{kiln::constant(-3)}, std::tuple{kiln::constant(4)}));
  cases.back().operators = {{"If", 1}};
  kiln::function simple_relu([](const tensor& x) {
    return kiln::cond(
        kiln::greater(x, 0), [&] { return x; }, [&] { return kiln::zeros_like(x); });
  });
  cases.push_back(
      make_case("simple_relu", simple_relu, std::tuple{kiln::constant(-1.5f)}, std::tuple{kiln::constant(2.5f)}));

  // The elementwise ops, on floats and on integers (whose division, floor division and
  // remainder take kiln's rules, not C's).
  const auto elementwise = [](const tensor& x, const tensor& y) {
    const bool floating = kiln::is_floating(x.dtype());
    std::vector<tensor> out = {x + y,
                               x - y,
                               x * y,
                               x / y,
                               kiln::floordiv(x, y),
                               x % y,
                               kiln::maximum(x, y),
                               kiln::minimum(x, y),
                               -x,
                               kiln::abs(x),
                               kiln::square(x),
                               kiln::relu(x),
                               kiln::where(x < y, x, y),
                               kiln::logical_and(x <= y, kiln::logical_not(x == y)),
                               kiln::logical_or(x > y, x >= y),
                               x != y,
                               kiln::cast(x, kiln::float64),
                               kiln::pow(kiln::abs(x), kiln::cast(kiln::constant(2), x.dtype()))};
    if (floating) {
      for (const tensor& t :
           {kiln::exp(x), kiln::log(kiln::abs(x) + 1.f), kiln::sqrt(kiln::abs(y)), kiln::tanh(x), kiln::sigmoid(y),
            kiln::erf(x), kiln::gelu(x), kiln::gelu(x, true), kiln::softplus(x), kiln::silu(x), kiln::elu(x, 0.5),
            kiln::leaky_relu(x)})
        out.push_back(t);
    }
    return out;
  };
  kiln::function elementwise_fn(elementwise);
  const tensor xf = kiln::constant({{-7.5f, -2.f, 0.f, 3.25f}, {5.f, -1.f, 2.f, 9.f}});
  const tensor yf = kiln::constant({2.f, -3.f, 1.5f, -0.5f});
  cases.push_back(make_case("elementwise_float", elementwise_fn, std::tuple{xf, yf}));
  const tensor xi = kiln::constant({{-7, -2, 0, 3}, {5, -1, 2, 9}});
  const tensor yi = kiln::constant({2, -3, 1, -4});
  cases.push_back(make_case("elementwise_int", elementwise_fn, std::tuple{xi, yi}));
  cases.back().operators = {{"Mod", 2}};

  // Shape ops and reductions.
  kiln::function shapes([](const tensor& x, const tensor& indices) {
    return std::vector<tensor>{kiln::reshape(x, {3, kiln::none}),
                               kiln::transpose(x, {2, 0, 1}),
                               kiln::transpose(x),
                               kiln::concat({x, x * 2.f}, 1),
                               kiln::stack({x, x}, -1),
                               kiln::slice(x, {0, 1, 1}, {2, -1, 2}),
                               kiln::gather(x, indices, 2),
                               x[1],
                               kiln::shape_of(x),
                               kiln::reduce_sum(x, 0, true),
                               kiln::reduce_mean(x),
                               kiln::reduce_max(x, {1, 2}),
                               kiln::reduce_min(x, -1),
                               kiln::argmax(x, 1),
                               kiln::argmax(x, {}, true)};
  });
  cases.push_back(make_case("shapes", shapes, std::tuple{uniform({2, 3, 4}, -1, 1, 15), kiln::constant({3, 0, 2})}));

  // A model of kiln layers: its variables export as initializers like any others.
  namespace layers = kiln::layers;
  layers::sequential model({layers::conv2d(3, 3, {.activation = kiln::relu}), layers::max_pooling2d(2),
                            layers::flatten(), layers::layer_normalization(),
                            layers::dense(4, {.activation = kiln::gelu}), layers::dense(2, {.activation = "softmax"})});
  kiln::function model_fn([&](const tensor& x) { return model(x); });
  cases.push_back(make_case("layers", model_fn, std::tuple{uniform({2, 6, 6, 2}, -1, 1, 16)}));

  // unsorted_segment_sum (gather's gradient), negative ids dropped, over the first dims
  // and from an inner axis.
  kiln::function segments([](const tensor& x, const tensor& ids, const tensor& row_ids) {
    return std::tuple{kiln::unsorted_segment_sum(x, ids, 4),
                      kiln::detail::apply(kiln::ops::unsorted_segment_sum{3, 1}, x, row_ids)};
  });
  cases.push_back(
      make_case("unsorted_segment_sum", segments,
                std::tuple{uniform({5, 3, 2}, -1, 1, 18), kiln::constant({0, 2, -1, 2, 0}), kiln::constant({1, -1, 1})},
                std::tuple{uniform({5, 3, 2}, -1, 1, 19), kiln::constant({3, 3, 3, 3, 3}), kiln::constant({0, 2, 2})}));
  cases.back().operators = {{"ScatterND", 2}};
  kiln::function int_segments([](const tensor& x, const tensor& ids) { return kiln::unsorted_segment_sum(x, ids, 3); });
  cases.push_back(
      make_case("unsorted_segment_sum_int", int_segments,
                std::tuple{kiln::constant({{1, 2}, {3, 4}, {5, 6}, {7, 8}}), kiln::constant({2, 0, 2, -1})}));

  // conv2d, NHWC with HWIO filters, both paddings.
  kiln::function convolutions([](const tensor& x, const tensor& f) {
    return std::tuple{kiln::conv2d(x, f, 2, "SAME"), kiln::conv2d(x, f, 1, "VALID")};
  });
  cases.push_back(make_case("conv2d", convolutions,
                            std::tuple{uniform({2, 7, 6, 3}, -1, 1, 16), uniform({3, 2, 3, 5}, -1, 1, 17)}));
  cases.back().operators = {{"Conv", 2}};

  // Pooling: windows that overlap, strides past them, and SAME padding, whose averages
  // count the elements inside the image only.
  kiln::function pooling([](const tensor& x) {
    return std::tuple{kiln::max_pool2d(x, 3, 2, "SAME"), kiln::max_pool2d(x, {2, 3}, {1, 4}, "VALID"),
                      kiln::avg_pool2d(x, 3, 2, "SAME"), kiln::avg_pool2d(x, 2, 2, "VALID")};
  });
  cases.push_back(make_case("pooling", pooling, std::tuple{uniform({2, 7, 6, 3}, -1, 1, 20)}));
  cases.back().operators = {{"MaxPool", 2}, {"AveragePool", 2}};

  // crop_or_pad (the gradients' cut and pad) from either end, on floats and ints.
  kiln::function windows([](const tensor& x, const tensor& like) {
    return std::tuple{kiln::crop_or_pad(x, like, {-1, 1}, {0, 1}),
                      kiln::crop_or_pad(kiln::cast(x, kiln::int32), like, {2, -3}, {1, 0})};
  });
  cases.push_back(make_case("crop_or_pad", windows, std::tuple{uniform({3, 4}, -4, 4, 18), kiln::zeros({4, 3})}));
  cases.back().operators = {{"Pad", 2}};

  // Strings: concatenation and comparison.
  kiln::function strings([](const tensor& s) { return std::tuple{s + kiln::constant("!"), kiln::equal(s, "b")}; });
  cases.push_back(make_case("strings", strings, std::tuple{kiln::constant({"a", "b", "c"})}));

  for (const onnx_case& c : cases) {
    INFO(c.name);
    const onnx::ModelProto m = kiln::onnx::to_model(c.function);
    CHECK(m.opset_import(0).version() == kiln::onnx::newest_opset);
    CHECK(m.ir_version() == kiln::onnx::ir_version_of(kiln::onnx::newest_opset));
    std::multiset<std::string> ops;
    collect_ops(m.graph(), ops);
    for (const auto& [op, count] : c.operators) CHECK(ops.count(op) == count);
    CHECK(m.graph().input_size() == int(c.inputs[0].size()));
    CHECK(m.graph().output_size() == int(c.outputs[0].size()));
  }
  if (const char* dir = std::getenv("KILN_ONNX_CASES_DIR"))
    for (const onnx_case& c : cases) write_case(dir, c);
}

TEST_CASE("ONNX export: variables become initializers with their current values") {
  kiln::variable scale(kiln::constant({1.f, 2.f}), "scale");
  kiln::function scaled([&](const tensor& x) { return x * scale; });
  const auto concrete = scaled.get_concrete_function(kiln::tensor_spec({2}, kiln::float32));
  scale.assign(kiln::constant({3.f, 4.f}));
  const onnx::ModelProto m = kiln::onnx::to_model(concrete);
  const onnx::TensorProto* found = nullptr;
  for (const onnx::TensorProto& t : m.graph().initializer())
    if (t.name() == "scale") found = &t;
  REQUIRE(found);
  REQUIRE(found->data_type() == onnx::TensorProto::FLOAT);
  std::vector<float> values(2);
  REQUIRE(found->raw_data().size() == sizeof(float) * values.size());
  std::memcpy(values.data(), found->raw_data().data(), found->raw_data().size());
  CHECK(values == std::vector<float>{3.f, 4.f});
}

TEST_CASE("ONNX export: a node ONNX cannot express raises an error naming it") {
  using kiln::unavailable_error;
  kiln::variable counter(kiln::constant(0.f), "counter");
  kiln::function assigns([&](const tensor& x) {
    counter.assign_add(x);
    return counter.read_value();
  });
  require_throws<unavailable_error>(
      [&] { return kiln::onnx::to_model(assigns.get_concrete_function(kiln::constant(1.f))); },
      {"kiln::onnx::export_model", "AssignAddVariableOp", "assigns a variable"});

  kiln::function noisy([](const tensor& x) { return x + kiln::random::uniform({3}, 0, 1, kiln::float32, 42); });
  require_throws<unavailable_error>(
      [&] { return kiln::onnx::to_model(noisy.get_concrete_function(kiln::tensor_spec({3}, kiln::float32))); },
      {"RandomUniform", "random numbers"});

  kiln::function calls_back([](const tensor& x) {
    return kiln::host_callback([](const tensor& v) { return v; }, {kiln::tensor_spec({}, kiln::float32)}, x)[0];
  });
  require_throws<unavailable_error>(
      [&] { return kiln::onnx::to_model(calls_back.get_concrete_function(kiln::constant(1.f))); },
      {"HostCallback", "calls back into C++"});

  kiln::function int_conv([](const tensor& x, const tensor& f) { return kiln::conv2d(x, f, 1, "VALID"); });
  require_throws<unavailable_error>(
      [&] {
        return kiln::onnx::to_model(int_conv.get_concrete_function(kiln::ones({1, 3, 3, 1}, kiln::int32),
                                                                   kiln::ones({2, 2, 1, 1}, kiln::int32)));
      },
      {"conv2d", "int32", "ONNX's Conv takes floats"});

  kiln::function two_axes([](const tensor& x) { return kiln::argmax(x, {0, 2}); });
  require_throws<unavailable_error>(
      [&] {
        return kiln::onnx::to_model(two_axes.get_concrete_function(kiln::ones({2, 3, 4})));
      },
      {"argmax", "[0, 2]", "one axis or all"});
}

TEST_CASE("ONNX export: a file that cannot be written raises an error naming it") {
  kiln::function twice([](const tensor& x) { return x * 2.f; });
  require_throws<kiln::invalid_argument_error>(
      [&] {
        kiln::onnx::export_model(twice.get_concrete_function(kiln::constant(1.f)), "/nonexistent/dir/twice.onnx");
        return 0;
      },
      {"/nonexistent/dir/twice.onnx"});
}

TEST_CASE("ONNX export: the opset is a choice from oldest_opset to newest_opset") {
  kiln::function twice([](const tensor& x) { return x * 2.f; });
  const auto concrete = twice.get_concrete_function(kiln::tensor_spec({3}, kiln::float32));
  // IR versions as ONNX's releases pair them with opsets (onnx.helper.VERSION_TABLE).
  const std::map<std::int64_t, std::int64_t> ir_of_opset = {{21, 10}, {22, 10}, {23, 11}, {24, 12},
                                                            {25, 13}, {26, 13}, {27, 13}, {28, 14}};
  CHECK(kiln::onnx::oldest_opset == ir_of_opset.begin()->first);
  CHECK(kiln::onnx::newest_opset == ir_of_opset.rbegin()->first);
  for (const auto& [opset, ir] : ir_of_opset) {
    INFO("opset " << opset);
    const onnx::ModelProto m = kiln::onnx::to_model(concrete, {.opset = opset});
    REQUIRE(m.opset_import_size() == 1);
    CHECK(m.opset_import(0).version() == opset);
    CHECK(m.ir_version() == ir);
  }
  for (std::int64_t outside : {kiln::onnx::oldest_opset - 1, kiln::onnx::newest_opset + 1})
    require_throws<kiln::invalid_argument_error>(
        [&] { return kiln::onnx::to_model(concrete, {.opset = outside}); },
        {"kiln::onnx::export_model", "opset " + std::to_string(outside), "21 to 28"});
}

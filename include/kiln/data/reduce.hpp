#pragma once
/// \file
/// The ReduceDataset op and the fold behind `kiln::for_each(ds, ...)` and
/// `dataset::reduce`: eagerly a C++ loop over the elements, while tracing one node
/// whose body is traced once, as AutoGraph turns `for x in dataset` into a reduce.

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/data/pipeline.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/trace/control_flow.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln::detail {

/// The loop of a ReduceDataset node: inputs are the dataset's handle, the loop
/// state's initial values, then the tensors the body captured. The body graph takes
/// an element's components, the state and the captures, and gives the next state.
/// The pipeline comes from the handle at every run, so a trace given a dataset as an
/// argument runs on the dataset of each call; the op also holds the pipeline it was
/// traced with, which keeps a dataset made or captured while tracing alive. A
/// template on nothing, as subgraph's members are.
template <class Unused>
class basic_reduce_dataset_op final : public special_op {
 public:
  basic_reduce_dataset_op(std::shared_ptr<const dataset_stage> traced, int state_size, graph body)
      : special_op(std::type_identity<basic_reduce_dataset_op>()), traced_(std::move(traced)), state_size_(state_size),
        body_(std::move(body)),
        effects_(body_.traced().has_effects() || traced_->has_effects()) {}
  std::string_view name() const;
  bool has_effects() const { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const;
  std::vector<tensor> run(std::span<const tensor* const> in) const;

  static std::array<std::string_view, 1> op_names();
  /// Its dataset is a pipeline of C++ objects (sources, functions) of this program, named
  /// by a handle that means nothing to another one.
  static constexpr std::string_view save_refusal =
      "loops over a dataset, a pipeline of C++ objects of this program, which a saved function cannot hold";
  static constexpr std::string_view onnx_refusal =
      "loops over a dataset, a pipeline of C++ objects of this program, which an ONNX model cannot hold";
  /// What TensorBoard's graph shows of it: the elements it was traced for.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("element_spec", components_text(traced_->element_spec()));
  }

 private:
  std::shared_ptr<const dataset_stage> traced_;
  int state_size_;
  subgraph body_;
  bool effects_;
};
using reduce_dataset_op = basic_reduce_dataset_op<void>;

/// The parameters of a function traced for an element of `spec`: `args_0`, ...
KILN_LIBRARY_INLINE std::vector<tensor_spec> element_parameters(std::span<const tensor_spec> spec);

/// As tf.data's reduce: a loop variable that the body makes less specific (a dim, or
/// the rank, that depends on the elements) takes the body's spec, and the body is
/// traced again for it; returns whether one did. Anything else is left for
/// check_loop_specs to reject.
KILN_LIBRARY_INLINE bool relax_loop_specs(std::vector<value_spec>& specs, std::span<const value_spec> got);

/// Runs `invoke(element, state)` over the elements of dataset `ds` (a
/// kiln::data::dataset) from `initial`, each result the next state (nothing when the
/// state is empty); `loop` names the loop in errors. Eagerly a C++ loop; while
/// tracing, one ReduceDataset node whose body is `invoke` traced once.
template <class Dataset, class State, class Invoke>
State fold_dataset(const Dataset& ds, State initial, Invoke invoke, std::string_view loop) {
  constexpr bool stateless = std::tuple_size_v<State> == 0;
  std::vector<tensor> initial_leaves = leaves_of(initial);
  std::vector<value_spec> specs = specs_of(initial_leaves);
  trace_context* trace = trace_context::current();
  if (!trace) {
    State current = std::move(initial);
    for (const auto& e : ds) {
      if constexpr (stateless) invoke(e, current);
      else current = next_state(current, leaves_of(invoke(e, current)), specs, {}, 0, loop);
    }
    return current;
  }
  const std::size_t components = ds.element_spec().size();
  traced_subgraph body;
  auto trace_body = [&] {
    std::vector<tensor_spec> params = element_parameters(ds.element_spec());
    for (std::size_t k = 0; k < initial_leaves.size(); ++k)
      params.emplace_back(specs[k].second, specs[k].first, parameter_name(initial_leaves[k]));
    body = {};
    trace_subgraph(
        [&](std::span<const tensor> p) {
          const tensor* next = p.data() + components;
          const State state = rebuild_output(initial, next);
          if constexpr (stateless) {
            invoke(p.first(components), state);
            return std::tuple<>{};
          } else {
            return invoke(p.first(components), state);
          }
        },
        std::span<const tensor_spec>(params), body);
  };
  trace_body();
  while (relax_loop_specs(specs, body.outputs)) trace_body();
  check_loop_specs(body.outputs, specs, {}, 0, loop);
  std::vector<tensor> inputs{ds.handle()};
  inputs.insert(inputs.end(), initial_leaves.begin(), initial_leaves.end());
  inputs.insert(inputs.end(), body.captures.begin(), body.captures.end());
  auto op = std::make_shared<reduce_dataset_op>(ds.pipeline(), int(initial_leaves.size()), std::move(body.g));
  std::vector<tensor> out = trace->record_special(std::move(op), inputs, specs);
  const tensor* next = out.data();
  return rebuild_output(initial, next);
}

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
std::string_view basic_reduce_dataset_op<Unused>::name() const {
  return "ReduceDataset";
}

template <class Unused>
auto basic_reduce_dataset_op<Unused>::subgraphs() const -> std::vector<std::pair<std::string, const graph*>> {
  return {{"body", &body_.traced()}};
}

template <class Unused>
std::vector<tensor> basic_reduce_dataset_op<Unused>::run(std::span<const tensor* const> in) const {
  const std::shared_ptr<const dataset_stage> stage = dataset_registry::get().find(*in[0], "ReduceDataset", "dataset");
  check_traced_spec(name(), "dataset", stage->element_spec(), traced_->element_spec());
  const std::size_t components = traced_->element_spec().size(), n = std::size_t(state_size_);
  // The body's arguments: an element's components, the state, the captures.
  std::vector<tensor> args(components);
  for (std::size_t k = 1; k < in.size(); ++k) args.push_back(*in[k]);
  element_iterator pass = stage->iterate();
  while (std::optional<dataset_element> e = pass.next()) {
    for (std::size_t k = 0; k < components; ++k) args[k] = std::move((*e)[k]);
    std::vector<tensor> next = body_.run(args);
    for (std::size_t k = 0; k < n; ++k) args[components + k] = std::move(next[k]);
  }
  return {args.begin() + std::ptrdiff_t(components), args.begin() + std::ptrdiff_t(components + n)};
}

template <class Unused>
auto basic_reduce_dataset_op<Unused>::op_names() -> std::array<std::string_view, 1> {
  return {"ReduceDataset"};
}

KILN_LIBRARY_INLINE std::vector<tensor_spec> element_parameters(std::span<const tensor_spec> spec) {
  std::vector<tensor_spec> out;
  for (std::size_t k = 0; k < spec.size(); ++k)
    out.emplace_back(spec[k].shape, spec[k].dtype, "args_" + std::to_string(k));
  return out;
}

KILN_LIBRARY_INLINE bool relax_loop_specs(std::vector<value_spec>& specs, std::span<const value_spec> got) {
  bool relaxed = false;
  for (std::size_t k = 0; k < specs.size() && k < got.size(); ++k)
    if (got[k].first == specs[k].first && got[k].second != specs[k].second && got[k].second.accepts(specs[k].second)) {
      specs[k].second = got[k].second;
      relaxed = true;
    }
  return relaxed;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

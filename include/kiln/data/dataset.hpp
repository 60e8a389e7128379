#pragma once
/// \file
/// `kiln::data::dataset`, a small tf.data: a pipeline of elements (each a tuple of
/// tensors) built from sources (`range`, `from_tensor_slices`, `from_tensors`,
/// `from_generator`) and transformations (`map`, `batch`, `shuffle`, `prefetch`,
/// `take`). Outside a function it is a C++ range; inside one, `kiln::for_each` and
/// `dataset::reduce` record one `ReduceDataset` node whose body is traced once, as
/// AutoGraph turns `for x in dataset` into `dataset.reduce`, instead of unrolling.
///
/// A dataset reaches a graph through its *handle*, an int64 scalar naming its
/// pipeline in a registry of live pipelines (TensorFlow's variant tensor): a dataset
/// argument of a kiln::function is keyed by its element spec and its handle becomes
/// an argument of the graph, so a trace runs on whichever dataset a call passes.

#include <atomic>
#include <concepts>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/exec/control_flow.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/trace/control_flow.hpp"
#include "kiln/trace/random.hpp"
#include "kiln/trace/spec.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln::detail {

/// One element of a dataset: its components, in order.
using dataset_element = std::vector<tensor>;

/// "(int32 (), float32 (2,))", as errors show an element spec.
inline std::string components_text(std::span<const tensor_spec> specs) {
  std::vector<value_spec> v;
  for (const tensor_spec& s : specs) v.emplace_back(s.dtype, s.shape);
  return specs_text(v);
}

/// Raises kiln::invalid_argument_error unless `element` fits `spec`, naming both.
inline void check_element(std::string_view stage, const dataset_element& element, std::span<const tensor_spec> spec) {
  bool fits = element.size() == spec.size();
  for (std::size_t k = 0; fits && k < spec.size(); ++k) fits = spec[k].accepts(element[k].dtype(), element[k].shape());
  if (!fits)
    throw invalid_argument_error(std::string(stage) + ": an element is " + specs_text(specs_of(element)) +
                                 " but the dataset's element spec is " + components_text(spec));
}

/// One pass over a dataset: pulls its elements in order. Holds any callable that
/// gives the next element, or nothing at the end of the pass. Type-erased through
/// function pointers rather than virtual functions, for special_op's reason.
class element_iterator {
 public:
  template <class Next>
    requires std::is_invocable_r_v<std::optional<dataset_element>, Next&>
  explicit element_iterator(Next next)
      : state_(new Next(std::move(next)), [](void* p) { delete static_cast<Next*>(p); }),
        next_([](void* p) -> std::optional<dataset_element> { return (*static_cast<Next*>(p))(); }) {}
  /// The next element, or nothing at the end of the pass.
  std::optional<dataset_element> next() { return next_(state_.get()); }

 private:
  std::unique_ptr<void, void (*)(void*)> state_;
  std::optional<dataset_element> (*next_)(void*);
};

/// One stage of a pipeline: a source, or a transformation of the stage before it.
/// Immutable once built, so every copy of a dataset and every graph shares it; each
/// pass has its own element_iterator. A derived stage defines `iterate()` and passes
/// `std::type_identity<itself>` to this base (a table entry, as special_op does).
class dataset_stage {
 public:
  dataset_stage(const dataset_stage&) = delete;
  dataset_stage& operator=(const dataset_stage&) = delete;

  /// TensorFlow's name of the stage's op: `RangeDataset`, `MapDataset`, ...
  const std::string& kind() const { return kind_; }
  /// One spec per component; `none` dims (or an unknown rank) where elements differ.
  const std::vector<tensor_spec>& element_spec() const { return spec_; }
  /// Starts a pass over the elements.
  element_iterator iterate() const { return iterate_(*this); }
  /// True when a pass calls C++ code that may have effects (a generator), so that a
  /// graph runs its loop even when no output needs it, as TensorFlow keeps a
  /// py_function.
  bool has_effects() const { return effects_; }

 protected:
  template <class Stage>
  dataset_stage(std::type_identity<Stage>, std::string kind, std::vector<tensor_spec> spec, bool effects)
      : kind_(std::move(kind)), spec_(std::move(spec)), effects_(effects),
        iterate_([](const dataset_stage& s) { return static_cast<const Stage&>(s).iterate(); }) {}
  // Owners hold the derived type (std::make_shared), so no virtual destructor.
  ~dataset_stage() = default;

 private:
  std::string kind_;
  std::vector<tensor_spec> spec_;
  bool effects_;
  element_iterator (*iterate_)(const dataset_stage&);
};

/// The pipelines that dataset handles name: a handle's value is its key here. Weak,
/// so that a handle never keeps a pipeline alive; a ReduceDataset node holds the
/// pipeline it was traced with itself.
class dataset_registry {
 public:
  static dataset_registry& get() {
    static dataset_registry r;
    return r;
  }
  /// Registers `stage` and returns its key.
  std::int64_t add(const std::shared_ptr<const dataset_stage>& stage) {
    std::lock_guard lock(mutex_);
    std::erase_if(stages_, [](const auto& entry) { return entry.second.expired(); });
    stages_.emplace(next_key_, stage);
    return next_key_++;
  }
  /// The pipeline that `handle` names; kiln::invalid_argument_error when it is gone.
  std::shared_ptr<const dataset_stage> find(const tensor& handle) {
    const std::int64_t key = handle.item<std::int64_t>();
    std::lock_guard lock(mutex_);
    auto it = stages_.find(key);
    std::shared_ptr<const dataset_stage> stage = it == stages_.end() ? nullptr : it->second.lock();
    if (!stage)
      throw invalid_argument_error("ReduceDataset: dataset handle " + std::to_string(key) +
                                   " names no live dataset; keep a dataset alive while a function runs on it");
    return stage;
  }

 private:
  std::mutex mutex_;
  std::map<std::int64_t, std::weak_ptr<const dataset_stage>> stages_;
  std::int64_t next_key_ = 1;
};

/// The pass of a stage whose elements are computed from their position.
template <class Element>
element_iterator indexed_elements(std::int64_t count, Element element) {
  return element_iterator([count, element = std::move(element), position = std::int64_t(0)]() mutable {
    return position < count ? std::optional<dataset_element>(element(position++)) : std::nullopt;
  });
}

/// `dataset::range`: int64 scalars start, start + delta, ... up to limit (excluded).
class range_stage final : public dataset_stage {
 public:
  template <class = void>
  range_stage(std::int64_t start, std::int64_t limit, std::int64_t delta)
      : dataset_stage(std::type_identity<range_stage>(), "RangeDataset", {tensor_spec(shape{}, int64)}, false),
        start_(start), delta_(delta) {
    if (delta == 0) throw invalid_argument_error("dataset::range: delta must not be 0");
    // Python's range length: ceil((limit - start) / delta), at least 0.
    const std::int64_t span = delta > 0 ? limit - start : start - limit;
    const std::int64_t step = delta > 0 ? delta : -delta;
    count_ = span <= 0 ? 0 : (span + step - 1) / step;
  }
  template <class = void>
  element_iterator iterate() const {
    return indexed_elements(count_, [start = start_, delta = delta_](std::int64_t i) {
      return dataset_element{kiln::constant(start + i * delta)};
    });
  }

 private:
  std::int64_t start_, delta_, count_ = 0;
};

/// The spec of one slice along the first dim of each of `components`, which must
/// be eager tensors of rank 1 or more that agree in their first dim.
inline std::vector<tensor_spec> slice_spec(std::span<const tensor> components) {
  if (components.empty()) throw value_error("dataset::from_tensor_slices: give at least one tensor");
  std::vector<tensor_spec> out;
  for (const tensor& c : components) {
    c.require_value("dataset::from_tensor_slices");
    if (c.rank() < 1) throw value_error("dataset::from_tensor_slices: slicing needs tensors of rank 1 or more, got a scalar");
    if (c.shape()[0] != components[0].shape()[0])
      throw value_error("dataset::from_tensor_slices: the components must have the same first dim, got " +
                        components[0].shape().str() + " and " + c.shape().str());
    out.emplace_back(shape(c.shape().dims().subspan(1)), c.dtype());
  }
  return out;
}

/// `dataset::from_tensor_slices`: element i is slice i of every component. Its
/// members are templates, as op functions are: they run x[i].
class slices_stage final : public dataset_stage {
 public:
  template <class = void>
  explicit slices_stage(std::vector<tensor> components)
      : dataset_stage(std::type_identity<slices_stage>(), "TensorSliceDataset", slice_spec(components), false),
        count_(components[0].shape()[0]),
        components_(std::move(components)) {}
  template <class = void>
  element_iterator iterate() const {
    return indexed_elements(count_, [this](std::int64_t i) {
      dataset_element e;
      for (const tensor& c : components_) e.push_back(c[i]);
      return e;
    });
  }

 private:
  std::int64_t count_;
  std::vector<tensor> components_;
};

/// `dataset::from_tensors`: one element, the components themselves.
class tensors_stage final : public dataset_stage {
 public:
  template <class = void>
  explicit tensors_stage(std::vector<tensor> components)
      : dataset_stage(std::type_identity<tensors_stage>(), "TensorDataset", spec_of(components), false),
        components_(std::move(components)) {}
  template <class = void>
  element_iterator iterate() const {
    return indexed_elements(1, [this](std::int64_t) { return components_; });
  }

 private:
  static std::vector<tensor_spec> spec_of(std::span<const tensor> components) {
    if (components.empty()) throw value_error("dataset::from_tensors: give at least one tensor");
    std::vector<tensor_spec> out;
    for (const tensor& c : components) {
      c.require_value("dataset::from_tensors");
      out.emplace_back(c.shape(), c.dtype());
    }
    return out;
  }
  std::vector<tensor> components_;
};

/// `dataset::from_generator`: each pass calls `start()` for a fresh source of
/// elements and checks each against the output specs.
class generator_stage final : public dataset_stage {
 public:
  using next_element = std::function<std::optional<dataset_element>()>;
  template <class = void>
  generator_stage(std::function<next_element()> start, std::vector<tensor_spec> spec)
      : dataset_stage(std::type_identity<generator_stage>(), "FlatMapDataset", std::move(spec), true),
        start_(std::move(start)) {
    if (element_spec().empty()) throw value_error("dataset::from_generator: give at least one output spec");
  }
  template <class = void>
  element_iterator iterate() const {
    return element_iterator([source = start_(), this] {
      std::optional<dataset_element> e = source();
      if (e) check_element("dataset::from_generator", *e, element_spec());
      return e;
    });
  }

 private:
  std::function<next_element()> start_;
};

/// A transformation: a stage that reads the elements of `input`.
class transform_stage : public dataset_stage {
 protected:
  /// A stage with effects when its input has them or `effects`.
  template <class Stage>
  transform_stage(std::type_identity<Stage> self, std::string kind, std::vector<tensor_spec> spec,
                  std::shared_ptr<const dataset_stage> input, bool effects = false)
      : dataset_stage(self, std::move(kind), std::move(spec), effects || input->has_effects()), input_(std::move(input)) {}

  /// A pass whose elements are `step(input pass)`, pulled one output at a time.
  template <class Step>
  element_iterator transformed(Step step) const {
    return element_iterator(
        [input = input_->iterate(), step = std::move(step)]() mutable -> std::optional<dataset_element> {
          return step(input);
        });
  }
  const std::shared_ptr<const dataset_stage>& input() const { return input_; }

 private:
  std::shared_ptr<const dataset_stage> input_;
};

/// `dataset::map`: each element through a function traced once into a subgraph. Its
/// members are templates, as subgraph's are: they optimize and run a graph.
class map_stage final : public transform_stage {
 public:
  template <class = void>
  map_stage(std::shared_ptr<const dataset_stage> input, graph fn, std::vector<tensor_spec> spec)
      : transform_stage(std::type_identity<map_stage>(), "MapDataset", std::move(spec), std::move(input),
                        fn.has_effects()),
        fn_(std::move(fn)) {}
  template <class = void>
  element_iterator iterate() const {
    return transformed([this](element_iterator& in) -> std::optional<dataset_element> {
      std::optional<dataset_element> e = in.next();
      if (!e) return std::nullopt;
      return fn_.run(*e);
    });
  }

 private:
  subgraph fn_;
};

/// `dataset::batch`: `size` consecutive elements stacked along a new first dim; the
/// last batch may be smaller unless `drop_remainder`. Its members are templates, as
/// op functions are: they run stack.
class batch_stage final : public transform_stage {
 public:
  template <class = void>
  batch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t size, bool drop_remainder)
      : transform_stage(std::type_identity<batch_stage>(), "BatchDataset",
                        batched_spec(input->element_spec(), size, drop_remainder), input),
        size_(size),
        drop_remainder_(drop_remainder) {}
  template <class = void>
  element_iterator iterate() const {
    return transformed([this](element_iterator& in) -> std::optional<dataset_element> {
      std::vector<dataset_element> rows;
      while (std::int64_t(rows.size()) < size_) {
        std::optional<dataset_element> e = in.next();
        if (!e) break;
        rows.push_back(std::move(*e));
      }
      if (rows.empty() || (drop_remainder_ && std::int64_t(rows.size()) < size_)) return std::nullopt;
      dataset_element batch;
      for (std::size_t k = 0; k < rows[0].size(); ++k) {
        std::vector<tensor> column;
        for (const dataset_element& row : rows) {
          if (row[k].shape() != rows[0][k].shape())
            throw invalid_argument_error("dataset::batch: cannot batch component " + std::to_string(k) +
                                         " of shapes " + rows[0][k].shape().str() + " and " + row[k].shape().str() +
                                         " (map the elements to one shape first)");
          column.push_back(row[k]);
        }
        batch.push_back(kiln::stack(column));
      }
      return batch;
    });
  }

 private:
  static std::vector<tensor_spec> batched_spec(std::vector<tensor_spec> spec, std::int64_t size, bool drop_remainder) {
    if (size <= 0) throw invalid_argument_error("dataset::batch: batch_size must be positive, got " + std::to_string(size));
    for (tensor_spec& s : spec) {
      if (!s.shape.has_known_rank()) continue;
      shape batched{drop_remainder ? size : none};
      for (std::int64_t d : s.shape.dims()) batched.push_back(d);
      s.shape = batched;
    }
    return spec;
  }
  std::int64_t size_;
  bool drop_remainder_;
};

/// `dataset::shuffle`: TensorFlow's buffer shuffle: fill a buffer of `buffer_size`
/// elements, then repeatedly hand out a random one and refill its place. Each pass
/// draws from its own stream (the pass number mixed into the seed), so passes differ
/// and the sequence of passes is the same at every run of a program.
class shuffle_stage final : public transform_stage {
 public:
  template <class = void>
  shuffle_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size, std::uint64_t seed,
                bool reshuffle_each_iteration)
      : transform_stage(std::type_identity<shuffle_stage>(), "ShuffleDataset", input->element_spec(), input),
        buffer_size_(buffer_size), seed_(seed),
        reshuffle_(reshuffle_each_iteration) {
    if (buffer_size <= 0)
      throw invalid_argument_error("dataset::shuffle: buffer_size must be positive, got " + std::to_string(buffer_size));
  }
  template <class = void>
  element_iterator iterate() const {
    const std::uint64_t pass = reshuffle_ ? passes_.fetch_add(1) : 0;
    // The index is taken by modulo of splitmix64's numbers, so the order is the same
    // on every platform and standard library (a std:: distribution's is not).
    std::uint64_t state = seed_ + pass * 0xD1B54A32D192ED03u;
    return transformed([this, state, buffer = std::vector<dataset_element>()](
                           element_iterator& in) mutable -> std::optional<dataset_element> {
      while (std::int64_t(buffer.size()) < buffer_size_) {
        std::optional<dataset_element> e = in.next();
        if (!e) break;
        buffer.push_back(std::move(*e));
      }
      if (buffer.empty()) return std::nullopt;
      const std::size_t pick = std::size_t(splitmix64(state) % buffer.size());
      std::swap(buffer[pick], buffer.back());
      dataset_element out = std::move(buffer.back());
      buffer.pop_back();
      return out;
    });
  }

 private:
  std::int64_t buffer_size_;
  std::uint64_t seed_;
  bool reshuffle_;
  mutable std::atomic<std::uint64_t> passes_{0};
};

/// `dataset::take`: the first `count` elements (all of them for a negative count).
class take_stage final : public transform_stage {
 public:
  template <class = void>
  take_stage(std::shared_ptr<const dataset_stage> input, std::int64_t count)
      : transform_stage(std::type_identity<take_stage>(), "TakeDataset", input->element_spec(), input), count_(count) {}
  template <class = void>
  element_iterator iterate() const {
    return transformed([count = count_, taken = std::int64_t(0)](element_iterator& in) mutable {
      if (count >= 0 && taken >= count) return std::optional<dataset_element>();
      ++taken;
      return in.next();
    });
  }

 private:
  std::int64_t count_;
};

/// `dataset::prefetch`: the elements of its input, unchanged. kiln produces elements
/// on the thread that consumes them, so prefetching has nothing to overlap with; the
/// stage keeps pipelines written for TensorFlow as they are.
class prefetch_stage final : public transform_stage {
 public:
  template <class = void>
  prefetch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size)
      : transform_stage(std::type_identity<prefetch_stage>(), "PrefetchDataset", input->element_spec(), input) {
    if (buffer_size < 0)
      throw invalid_argument_error("dataset::prefetch: buffer_size must be 0 or more, got " + std::to_string(buffer_size));
  }
  template <class = void>
  element_iterator iterate() const { return input()->iterate(); }
};

/// The component tensors of `value`: a tensor, or a tuple, pair, array or vector of
/// them; C++ numbers become tensors of `spec`'s dtypes when a spec is given.
template <class V>
void append_components(const V& value, dataset_element& out, std::span<const tensor_spec> spec) {
  using U = std::remove_cvref_t<V>;
  if constexpr (std::is_same_v<U, tensor>) {
    out.push_back(value);
  } else if constexpr (std::is_arithmetic_v<U>) {
    const std::size_t k = out.size();
    out.push_back(k < spec.size() ? kiln::constant(value, spec[k].dtype) : kiln::constant(value));
  } else {
    static_assert(is_tuple_like<U>::value || is_vector<U>::value,
                  "a dataset element is a tensor, a C++ number, or a tuple, pair, array or vector of those");
    for_each_element(value, [&](const auto& e) { append_components(e, out, spec); });
  }
}
template <class V>
dataset_element components_of(const V& value, std::span<const tensor_spec> spec = {}) {
  dataset_element out;
  append_components(value, out, spec);
  return out;
}

/// How many element components kiln passes to a function as separate arguments.
inline constexpr std::size_t max_components = 8;
// A class rather than an alias that drops its argument: nvcc's host code loses the
// pack of `alias<I>...` when the alias does not depend on I.
template <std::size_t>
struct component_argument {
  using type = const tensor&;
};

/// Calls a function with the components of an element as separate arguments:
/// `fn(before..., components..., after...)`, for whichever component counts `fn`
/// accepts (a C++ call's arity is fixed; an element's is not until run time).
template <class Fn, class Before, class After>
struct component_call;
template <class Fn, class... Before, class... After>
struct component_call<Fn, std::tuple<Before...>, std::tuple<After...>> {
  /// Whether `fn` takes elements of `N` components.
  template <std::size_t N>
  static constexpr bool accepts = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::is_invocable_v<Fn&, const Before&..., typename component_argument<I>::type..., const After&...>;
  }(std::make_index_sequence<N>{});

  // The smallest component count `fn` takes (0 for none): it gives the result type.
  template <std::size_t N = 1>
  static constexpr std::size_t first_accepted() {
    if constexpr (N > max_components) return 0;
    else if constexpr (accepts<N>) return N;
    else return first_accepted<N + 1>();
  }
  static constexpr std::size_t arity = first_accepted();
  static_assert(arity != 0, "kiln::data: the function must take the components of a dataset element as separate "
                            "kiln::tensor arguments (at most 8), with the loop or reduce state around them");
  using result = decltype([]<std::size_t... I>(std::index_sequence<I...>) {
    return std::type_identity<std::invoke_result_t<Fn&, const Before&..., typename component_argument<I>::type..., const After&...>>{};
  }(std::make_index_sequence<arity>{}));
  using type = typename result::type;

  /// The component counts `fn` takes, as messages list them: "1", "1 or 2".
  static std::string accepted_counts() {
    std::string s;
    [&]<std::size_t... N>(std::index_sequence<N...>) {
      ((accepts<N + 1> ? (void)(s += (s.empty() ? "" : " or ") + std::to_string(N + 1)) : void()), ...);
    }(std::make_index_sequence<max_components>{});
    return s;
  }

  /// Raises kiln::value_error unless `fn` accepts `count` components, naming both.
  static void check(std::size_t count, std::string_view who) {
    bool ok = false;
    [&]<std::size_t... N>(std::index_sequence<N...>) { ((ok = ok || (count == N + 1 && accepts<N + 1>)), ...); }(
        std::make_index_sequence<max_components>{});
    if (!ok)
      throw value_error(std::string(who) + ": the function takes " + accepted_counts() +
                        " tensor(s) per element, but the dataset's elements have " + std::to_string(count));
  }

  /// `fn(before..., element[0], ..., after...)`; check() tells beforehand whether
  /// `fn` takes the element's component count.
  template <std::size_t N = 1>
  static type call(Fn& fn, std::span<const tensor> element, const Before&... before, const After&... after) {
    if constexpr (N > max_components) {
      throw internal_error("kiln::data: an element of " + std::to_string(element.size()) + " components");
    } else {
      if constexpr (accepts<N>) {
        if (element.size() == N)
          return [&]<std::size_t... I>(std::index_sequence<I...>) -> type {
            return fn(before..., element[I]..., after...);
          }(std::make_index_sequence<N>{});
      }
      return call<N + 1>(fn, element, before..., after...);
    }
  }
};

/// The loop of a ReduceDataset node: inputs are the dataset's handle, the loop
/// state's initial values, then the tensors the body captured. The body graph takes
/// an element's components, the state and the captures, and gives the next state.
/// The pipeline comes from the handle at every run, so a trace given a dataset as an
/// argument runs on the dataset of each call; the op also holds the pipeline it was
/// traced with, which keeps a dataset made or captured while tracing alive. Its
/// members are templates, as subgraph's are.
class reduce_dataset_op final : public special_op {
 public:
  template <class = void>
  reduce_dataset_op(std::shared_ptr<const dataset_stage> traced, int state_size, graph body)
      : special_op(std::type_identity<reduce_dataset_op>()), traced_(std::move(traced)), state_size_(state_size),
        body_(std::move(body)),
        effects_(body_.traced().has_effects() || traced_->has_effects()) {}
  std::string_view name() const { return "ReduceDataset"; }
  bool has_effects() const { return effects_; }
  std::vector<std::pair<std::string, const graph*>> subgraphs() const { return {{"body", &body_.traced()}}; }
  template <class = void>
  std::vector<tensor> run(std::span<const tensor* const> in) const {
    const std::shared_ptr<const dataset_stage> stage = dataset_registry::get().find(*in[0]);
    check_spec(stage->element_spec());
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

 private:
  // A dataset passed at run time must give elements the body was traced for.
  void check_spec(std::span<const tensor_spec> got) const {
    std::span<const tensor_spec> traced = traced_->element_spec();
    bool fits = got.size() == traced.size();
    for (std::size_t k = 0; fits && k < got.size(); ++k)
      fits = got[k].dtype == traced[k].dtype && traced[k].shape.accepts(got[k].shape);
    if (!fits)
      throw invalid_argument_error("ReduceDataset: the dataset's elements are " + components_text(got) +
                                   " but the function was traced for " + components_text(traced));
  }

  std::shared_ptr<const dataset_stage> traced_;
  int state_size_;
  subgraph body_;
  bool effects_;
};

/// The parameters of a function traced for an element of `spec`: `args_0`, ...
inline std::vector<tensor_spec> element_parameters(std::span<const tensor_spec> spec) {
  std::vector<tensor_spec> out;
  for (std::size_t k = 0; k < spec.size(); ++k) out.emplace_back(spec[k].shape, spec[k].dtype, "args_" + std::to_string(k));
  return out;
}

}  // namespace kiln::detail

namespace kiln::data {
class dataset;
}

namespace kiln::detail {
template <class State, class Invoke>
State fold_dataset(const data::dataset& ds, State initial, Invoke invoke, std::string_view loop);
}

namespace kiln::data {

/// A tf.data pipeline: a value (copies share one immutable pipeline) whose elements
/// are tuples of tensors, described by `element_spec()`. Iterate it with a C++ `for`
/// outside a function; inside one, `kiln::for_each(ds, ...)` and `ds.reduce(...)`
/// become one `ReduceDataset` node. As a kiln::function argument it is keyed by its
/// element spec: datasets of one spec share a trace, and each call runs on its own.
/// \code
/// auto ds = kiln::data::dataset::range(10).map([](auto x) { return x * 2; }).batch(4);
/// for (const auto& element : ds) std::cout << element[0] << "\n";  // [0 2 4 6], [8 10 12 14], [16 18]
/// \endcode
class dataset {
 public:
  /// An element: one tensor per component.
  using element = detail::dataset_element;

  /// int64 scalars `start, start + delta, ...` up to `limit` (excluded), as
  /// tf.data.Dataset.range; a zero `delta` raises kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(1, 8, 3);  // 1, 4, 7 \endcode
  template <class = void>
  static dataset range(std::int64_t start, std::int64_t limit, std::int64_t delta = 1) {
    return dataset(std::make_shared<detail::range_stage>(start, limit, delta));
  }
  /// `0, 1, ..., limit - 1`.
  /// \code kiln::data::dataset::range(5);  // 0, 1, 2, 3, 4 \endcode
  template <class = void>
  static dataset range(std::int64_t limit) { return range(0, limit); }

  /// One element per index of the first dim: element `i` holds `c[i]` of every
  /// component `c` (a tensor, or a tuple, pair, array or vector of tensors, which
  /// must agree in their first dim).
  /// \code
  /// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})});
  /// // (1, 3.f), (2, 4.f)
  /// \endcode
  template <class Components>
  static dataset from_tensor_slices(const Components& components) {
    return dataset(std::make_shared<detail::slices_stage>(detail::components_of(components)));
  }

  /// One element: the components themselves (a tensor, or a tuple, pair, array or
  /// vector of tensors), as tf.data.Dataset.from_tensors.
  /// \code kiln::data::dataset::from_tensors(kiln::constant({1, 2, 3}));  // one element, [1 2 3] \endcode
  template <class Components>
  static dataset from_tensors(const Components& components) {
    return dataset(std::make_shared<detail::tensors_stage>(detail::components_of(components)));
  }

  /// Elements that C++ code makes at run time, as tf.data.Dataset.from_generator:
  /// each pass calls `generator()`, which returns either a range of elements (a
  /// std::vector) or a callable giving one std::optional element per call, empty at
  /// the end. An element is a tensor, a C++ number, or a tuple of those; C++ numbers
  /// take the dtypes of `output_specs`. Elements that do not fit the specs raise
  /// kiln::invalid_argument_error. Inside a function the generator runs at every
  /// call, never at trace time.
  /// \code
  /// auto ds = kiln::data::dataset::from_generator(
  ///     [] { return std::vector<std::pair<int, int>>{{1, 1}, {2, 3}}; },
  ///     {kiln::tensor_spec({}, kiln::int32), kiln::tensor_spec({}, kiln::int32)});
  /// \endcode
  template <class Generator>
  static dataset from_generator(Generator generator, std::vector<tensor_spec> output_specs) {
    using R = std::invoke_result_t<Generator&>;
    auto start = [generator = std::move(generator), specs = output_specs]() mutable -> detail::generator_stage::next_element {
      if constexpr (std::is_invocable_v<R&>) {
        return [source = generator(), specs]() mutable -> std::optional<element> {
          auto e = source();
          if (!e) return std::nullopt;
          return detail::components_of(*e, specs);
        };
      } else {
        return [items = std::make_shared<const R>(generator()), index = std::size_t(0), specs]() mutable
               -> std::optional<element> {
          if (index == items->size()) return std::nullopt;
          return detail::components_of((*items)[index++], specs);
        };
      }
    };
    return dataset(std::make_shared<detail::generator_stage>(std::move(start), std::move(output_specs)));
  }

  /// from_generator with elements of dtypes `output_types` and any shapes, as
  /// `from_generator(gen, (tf.int32, tf.int32))`.
  /// \code kiln::data::dataset::from_generator([] { return std::vector<int>{1, 2}; }, {kiln::int32}); \endcode
  template <class Generator>
  static dataset from_generator(Generator generator, const std::vector<dtype>& output_types) {
    std::vector<tensor_spec> specs;
    for (dtype t : output_types) specs.emplace_back(unknown_rank, t);
    return from_generator(std::move(generator), std::move(specs));
  }

  /// Each element through `fn(components...)`, which returns a tensor or a tuple of
  /// tensors. `fn` is traced once, here, into a graph that runs per element (C++
  /// side effects in it happen once); it may use eager tensors it captures, not
  /// symbolic ones of a function being traced.
  /// \code auto squares = kiln::data::dataset::range(4).map([](auto x) { return x * x; });  // 0, 1, 4, 9 \endcode
  template <class Fn>
  dataset map(Fn fn) const {
    using call = detail::component_call<Fn, std::tuple<>, std::tuple<>>;
    static_assert(!std::is_void_v<typename call::type>, "dataset::map: the function must return a tensor or a tuple of tensors");
    call::check(element_spec().size(), "dataset::map");
    init_scope outside_any_trace;  // the pipeline holds values, not symbols of the trace in progress
    detail::traced_subgraph traced;
    const std::vector<tensor_spec> params = detail::element_parameters(element_spec());
    detail::trace_subgraph([&](std::span<const tensor> p) { return call::call(fn, p); }, std::span<const tensor_spec>(params),
                           traced);
    if (traced.outputs.empty()) throw value_error("dataset::map: the function must return at least one tensor");
    std::vector<tensor_spec> spec;
    for (const auto& [type, dims] : traced.outputs) spec.emplace_back(dims, type);
    return dataset(std::make_shared<detail::map_stage>(stage_, std::move(traced.g), std::move(spec)));
  }

  /// `batch_size` consecutive elements stacked along a new first dim; the last batch
  /// is smaller unless `drop_remainder` (then the batch dim of the spec is known).
  /// A batch_size below 1 raises kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(5).batch(2);  // [0 1], [2 3], [4] \endcode
  template <class = void>
  dataset batch(std::int64_t batch_size, bool drop_remainder = false) const {
    return dataset(std::make_shared<detail::batch_stage>(stage_, batch_size, drop_remainder));
  }

  /// The elements in random order, from a buffer of `buffer_size` (TensorFlow's
  /// algorithm). With a `seed` the order is the same at every run of the program;
  /// with `reshuffle_each_iteration` each pass (each epoch, each function call)
  /// draws a new order, reproducibly.
  /// \code kiln::data::dataset::range(10).shuffle(10, 42); \endcode
  template <class = void>
  dataset shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const {
    return dataset(std::make_shared<detail::shuffle_stage>(stage_, buffer_size, seed ? *seed : detail::fresh_seed(),
                                                           reshuffle_each_iteration));
  }

  /// The same elements: kiln makes elements on the thread that consumes them, so
  /// there is nothing to prefetch; kept so that TensorFlow pipelines read the same.
  /// \code kiln::data::dataset::range(4).prefetch(1); \endcode
  template <class = void>
  dataset prefetch(std::int64_t buffer_size) const {
    return dataset(std::make_shared<detail::prefetch_stage>(stage_, buffer_size));
  }

  /// The first `count` elements (all of them for a negative count).
  /// \code kiln::data::dataset::range(10).take(3);  // 0, 1, 2 \endcode
  template <class = void>
  dataset take(std::int64_t count) const { return dataset(std::make_shared<detail::take_stage>(stage_, count)); }

  /// One spec per component of an element.
  /// \code kiln::data::dataset::range(3).element_spec()[0].dtype == kiln::int64 \endcode
  const std::vector<tensor_spec>& element_spec() const { return stage_->element_spec(); }

  /// Folds the elements into a state, as tf.data.Dataset.reduce: `fn(state,
  /// components...)` gives the next state, which must keep its dtypes and shapes.
  /// Inside a function this is one `ReduceDataset` node.
  /// \code kiln::data::dataset::range(5).reduce(kiln::constant(std::int64_t(0)), [](auto s, auto x) { return s + x; });  // 10 \endcode
  template <class State, class Fn>
  auto reduce(const State& initial, Fn fn) const {
    using S = detail::output_t<State>;
    using call = detail::component_call<Fn, std::tuple<S>, std::tuple<>>;
    call::check(element_spec().size(), "dataset::reduce");
    auto invoke = [&fn](std::span<const tensor> e, const std::tuple<S>& s) { return call::call(fn, e, std::get<0>(s)); };
    return std::get<0>(detail::fold_dataset(*this, std::tuple<S>{detail::as_output(initial)}, invoke, "dataset::reduce"));
  }

  /// A pass over the elements, for a C++ `for`. Inside a function being traced it
  /// reads the dataset at trace time and the loop unrolls, as a C++ loop does; use
  /// kiln::for_each for a loop in the graph.
  class iterator {
   public:
    using value_type = element;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    const element& operator*() const { return *current_; }
    const element* operator->() const { return &*current_; }
    iterator& operator++() {
      init_scope eager;
      current_ = pass_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return !current_; }

   private:
    friend class dataset;
    explicit iterator(std::shared_ptr<detail::element_iterator> pass) : pass_(std::move(pass)) { ++*this; }
    std::shared_ptr<detail::element_iterator> pass_;
    std::optional<element> current_;
  };
  /// Starts a pass over the elements.
  /// \code for (const auto& e : kiln::data::dataset::range(3)) std::cout << e[0];  // tensors 0, 1, 2 \endcode
  iterator begin() const {
    init_scope eager;
    return iterator(std::make_shared<detail::element_iterator>(stage_->iterate()));
  }
  std::default_sentinel_t end() const { return {}; }

  /// The int64 scalar naming the pipeline at run time; symbolic inside a function
  /// that takes the dataset as an argument.
  const tensor& handle() const { return handle_; }
  /// Appends the element spec to a kiln::function's cache key.
  void append_spec_key(std::vector<std::uint64_t>& key) const {
    key.push_back(element_spec().size());
    for (const tensor_spec& s : element_spec()) detail::add_shape(key, s.dtype, s.shape);
  }
  /// This dataset, reached through `handle` (a function's placeholder for it).
  dataset with_handle(const tensor& handle) const {
    dataset d = *this;
    d.handle_ = handle;
    return d;
  }
  /// The pipeline as traced: what a ReduceDataset node keeps.
  const std::shared_ptr<const detail::dataset_stage>& pipeline() const { return stage_; }

  /// `<RangeDataset shapes: (), types: int64>`, `<FlatMapDataset shapes: ((), ()),
  /// types: (int32, int32)>`: TensorFlow's text, with kiln's dtype names.
  friend std::ostream& operator<<(std::ostream& os, const dataset& d) {
    const auto& spec = d.element_spec();
    auto list = [&](auto text_of) {
      if (spec.size() == 1) return text_of(spec[0]);
      std::string s = "(";
      for (std::size_t k = 0; k < spec.size(); ++k) s += (k ? ", " : "") + text_of(spec[k]);
      return s + ")";
    };
    return os << "<" << d.stage_->kind() << " shapes: " << list([](const tensor_spec& s) { return s.shape.str(); })
              << ", types: " << list([](const tensor_spec& s) { return std::string(name(s.dtype)); }) << ">";
  }

 private:
  explicit dataset(std::shared_ptr<const detail::dataset_stage> stage)
      : stage_(std::move(stage)), handle_(kiln::constant(detail::dataset_registry::get().add(stage_))) {}

  std::shared_ptr<const detail::dataset_stage> stage_;
  tensor handle_;
};

}  // namespace kiln::data

namespace kiln::detail {

/// As tf.data's reduce: a loop variable that the body makes less specific (a dim, or
/// the rank, that depends on the elements) takes the body's spec, and the body is
/// traced again for it; returns whether one did. Anything else is left for
/// check_loop_specs to reject.
inline bool relax_loop_specs(std::vector<value_spec>& specs, std::span<const value_spec> got) {
  bool relaxed = false;
  for (std::size_t k = 0; k < specs.size() && k < got.size(); ++k)
    if (got[k].first == specs[k].first && got[k].second != specs[k].second && got[k].second.accepts(specs[k].second)) {
      specs[k].second = got[k].second;
      relaxed = true;
    }
  return relaxed;
}

/// Runs `invoke(element, state)` over the elements of `ds` from `initial`, each
/// result the next state (nothing when the state is empty); `loop` names the loop in
/// errors. Eagerly a C++ loop; while tracing, one ReduceDataset node whose body is
/// `invoke` traced once.
template <class State, class Invoke>
State fold_dataset(const data::dataset& ds, State initial, Invoke invoke, std::string_view loop) {
  constexpr bool stateless = std::tuple_size_v<State> == 0;
  std::vector<tensor> initial_leaves = leaves_of(initial);
  std::vector<value_spec> specs = specs_of(initial_leaves);
  trace_context* trace = trace_context::current();
  if (!trace) {
    State current = std::move(initial);
    for (const data::dataset::element& e : ds) {
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

namespace kiln {

/// `for element in dataset` with loop variables: `body(components..., vars...)` gives
/// the next values (one value, or a std::tuple for several; nothing when there are
/// no loop variables). Returns the final values like kiln::for_range. Inside a
/// function it is one `ReduceDataset` node whose body is traced once, as AutoGraph
/// turns the loop into `dataset.reduce`. A loop variable whose shape the body makes
/// less specific (it depends on elements of unknown shape) takes that shape, as in
/// tf.data; any other change of dtype or shape raises kiln::value_error naming both
/// specs.
/// \code
/// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({1, 5})});
/// kiln::tensor loss = kiln::for_each(ds, [](auto x, auto y, auto loss) { return loss + kiln::abs(y - x); },
///                                    kiln::constant(0));  // 3
/// \endcode
template <class Body, class... Vars>
auto for_each(const data::dataset& ds, Body body, const Vars&... vars) {
  using state = std::tuple<detail::output_t<Vars>...>;
  using call = detail::component_call<Body, std::tuple<>, state>;
  call::check(ds.element_spec().size(), "for_each");
  auto invoke = [&body](std::span<const tensor> e, const state& s) {
    return std::apply([&](const auto&... v) { return call::call(body, e, v...); }, s);
  };
  auto out = detail::fold_dataset(ds, state{detail::as_output(vars)...}, invoke, "for_each");
  if constexpr (sizeof...(Vars) > 0) return detail::loop_result(std::move(out));
}

/// `for element in values` over a C++ range: a C++ loop, which unrolls while tracing
/// (AutoGraph's loop over Python data). `body(element parts..., vars...)`, a tuple or
/// pair element passed as its parts, gives the next values as for a dataset.
/// \code
/// std::vector<std::pair<int, int>> data{{1, 1}, {2, 3}};
/// kiln::for_each(data, [](int x, int y, auto loss) { return loss + (y - x); }, kiln::constant(0));  // 1
/// \endcode
template <std::ranges::input_range Range, class Body, class... Vars>
  requires(!std::same_as<std::remove_cvref_t<Range>, data::dataset>)
auto for_each(const Range& values, Body body, const Vars&... vars) {
  using state = std::tuple<detail::output_t<Vars>...>;
  state current{detail::as_output(vars)...};
  std::vector<detail::value_spec> specs = detail::specs_of(detail::leaves_of(current));
  for (const auto& value : values) {
    auto step = [&](const auto&... parts) {
      return std::apply([&](const auto&... v) { return body(parts..., v...); }, current);
    };
    auto call = [&] {
      if constexpr (detail::is_tuple_like<std::remove_cvref_t<decltype(value)>>::value) return std::apply(step, value);
      else return step(value);
    };
    if constexpr (sizeof...(Vars) == 0) call();
    else current = detail::next_state(current, detail::leaves_of(call()), specs, {}, 0, "for_each");
  }
  if constexpr (sizeof...(Vars) > 0) return detail::loop_result(std::move(current));
}

}  // namespace kiln

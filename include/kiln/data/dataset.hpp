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

#include <concepts>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <ostream>

#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/data/components.hpp"
#include "kiln/data/reduce.hpp"
#include "kiln/data/stages.hpp"

namespace kiln::data {
class dataset;
template <std::size_t N>
class dataset_of;
class iterator;
template <std::size_t N>
class iterator_of;
}  // namespace kiln::data

namespace kiln::detail {
/// How many components the elements made from a C++ `V` have, when the type says:
/// one for a tensor or a number, a tuple's size; 0 (known at run time only) for a vector.
template <class V>
constexpr std::size_t arity_of() {
  using U = std::remove_cvref_t<V>;
  if constexpr (is_tuple_like<U>::value) return std::tuple_size_v<U>;
  else if constexpr (is_vector<U>::value) return 0;
  else return 1;
}
/// A dataset whose elements have `N` components (data::dataset_of), or any number (data::dataset) for 0.
template <std::size_t N>
struct dataset_for_arity {
  using type = data::dataset_of<N>;
};
template <>
struct dataset_for_arity<0> {
  using type = data::dataset;
};
template <std::size_t N>
using dataset_for = typename dataset_for_arity<N>::type;
}  // namespace kiln::detail

namespace kiln::data {

/// A tf.data pipeline: a value (copies share one immutable pipeline) whose elements
/// are tuples of tensors, described by `element_spec()`. Iterate it with a C++ `for`
/// outside a function; inside one, `kiln::for_each(ds, ...)` and `ds.reduce(...)`
/// become one `ReduceDataset` node (a C++ `for` there raises kiln::type_error: it
/// would read the dataset once, while tracing). As a kiln::function argument it is
/// keyed by its element spec: datasets of one spec share a trace, and each call runs
/// on its own. Where the element's component count is known from the C++ types
/// (`range`, `from_tensor_slices` of a tuple, `map` returning a tuple, ...) the
/// factories return a `dataset_of<N>`, whose elements are `std::array`s of tensors, so
/// structured bindings work; a `dataset` holds either, its elements `std::vector`s.
/// \code
/// auto ds = kiln::data::dataset::range(10).map([](auto x) { return x * 2; }).batch(4);
/// for (const auto& element : ds) std::cout << element[0] << "\n";  // [0 2 4 6], [8 10 12 14], [16 18]
/// auto pairs = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})});
/// for (auto [x, y] : pairs) std::cout << x << " " << y << "\n";
/// \endcode
class dataset {
 public:
  /// An element: one tensor per component.
  using element = detail::dataset_element;

  /// int64 scalars `start, start + delta, ...` up to `limit` (excluded), as
  /// tf.data.Dataset.range; a zero `delta` raises kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(1, 8, 3);  // 1, 4, 7 \endcode
  template <class = void>
  static dataset_of<1> range(std::int64_t start, std::int64_t limit, std::int64_t delta = 1);
  /// `0, 1, ..., limit - 1`.
  /// \code kiln::data::dataset::range(5);  // 0, 1, 2, 3, 4 \endcode
  template <class = void>
  static dataset_of<1> range(std::int64_t limit);

  /// One element per index of the first dim: element `i` holds `c[i]` of every
  /// component `c` (a tensor, or a tuple, pair, array or vector of tensors, which
  /// must agree in their first dim).
  /// \code
  /// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3.f, 4.f})});
  /// // (1, 3.f), (2, 4.f)
  /// \endcode
  template <class Components>
  static detail::dataset_for<detail::arity_of<Components>()> from_tensor_slices(const Components& components) {
    return detail::dataset_for<detail::arity_of<Components>()>(
        dataset(std::make_shared<detail::slices_stage>(detail::components_of(components))));
  }

  /// One element: the components themselves (a tensor, or a tuple, pair, array or
  /// vector of tensors), as tf.data.Dataset.from_tensors.
  /// \code kiln::data::dataset::from_tensors(kiln::constant({1, 2, 3}));  // one element, [1 2 3] \endcode
  template <class Components>
  static detail::dataset_for<detail::arity_of<Components>()> from_tensors(const Components& components) {
    return detail::dataset_for<detail::arity_of<Components>()>(
        dataset(std::make_shared<detail::tensors_stage>(detail::components_of(components))));
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
  static auto from_generator(Generator generator, std::vector<tensor_spec> output_specs) {
    using R = std::invoke_result_t<Generator&>;
    using item = decltype([] {
      if constexpr (std::is_invocable_v<R&>) return std::type_identity<typename std::invoke_result_t<R&>::value_type>{};
      else return std::type_identity<typename R::value_type>{};
    }());
    using result = detail::dataset_for<detail::arity_of<typename item::type>()>;
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
    return result(dataset(std::make_shared<detail::generator_stage>(std::move(start), std::move(output_specs))));
  }

  /// from_generator with elements of dtypes `output_types` and any shapes, as
  /// `from_generator(gen, (tf.int32, tf.int32))`.
  /// \code kiln::data::dataset::from_generator([] { return std::vector<int>{1, 2}; }, {kiln::int32}); \endcode
  template <class Generator>
  static auto from_generator(Generator generator, const std::vector<dtype>& output_types) {
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
  auto map(Fn fn) const {
    using call = detail::component_call<Fn, std::tuple<>, std::tuple<>>;
    using result = detail::dataset_for<detail::arity_of<typename call::type>()>;
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
    return result(dataset(std::make_shared<detail::map_stage>(stage_, std::move(traced.g), std::move(spec))));
  }

  /// `batch_size` consecutive elements stacked along a new first dim; the last batch
  /// is smaller unless `drop_remainder` (then the batch dim of the spec is known).
  /// A batch_size below 1 raises kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(5).batch(2);  // [0 1], [2 3], [4] \endcode
  template <class Unused = void>
  dataset batch(std::int64_t batch_size, bool drop_remainder = false) const {
    return dataset(std::make_shared<detail::basic_batch_stage<Unused>>(stage_, batch_size, drop_remainder));
  }

  /// The elements in random order, from a buffer of `buffer_size` (TensorFlow's
  /// algorithm). With a `seed` the order is the same at every run of the program;
  /// with `reshuffle_each_iteration` each pass (each epoch, each function call)
  /// draws a new order, reproducibly.
  /// \code kiln::data::dataset::range(10).shuffle(10, 42); \endcode
  template <class Unused = void>
  dataset shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const {
    return dataset(std::make_shared<detail::basic_shuffle_stage<Unused>>(
        stage_, buffer_size, seed ? *seed : detail::fresh_seed(), reshuffle_each_iteration));
  }

  /// The same elements: kiln makes elements on the thread that consumes them, so
  /// there is nothing to prefetch; kept so that TensorFlow pipelines read the same.
  /// \code kiln::data::dataset::range(4).prefetch(1); \endcode
  template <class Unused = void>
  dataset prefetch(std::int64_t buffer_size) const {
    return dataset(std::make_shared<detail::basic_prefetch_stage<Unused>>(stage_, buffer_size));
  }

  /// The first `count` elements (all of them for a negative count).
  /// \code kiln::data::dataset::range(10).take(3);  // 0, 1, 2 \endcode
  template <class Unused = void>
  dataset take(std::int64_t count) const { return dataset(std::make_shared<detail::basic_take_stage<Unused>>(stage_, count)); }

  /// Every `num_shards`-th element from element `index`, as tf.data.Dataset.shard:
  /// how each worker reads its part of the data. `num_shards` must be positive and
  /// `index` in [0, num_shards), else kiln::invalid_argument_error.
  /// \code kiln::data::dataset::range(10).shard(3, 1);  // 1, 4, 7 \endcode
  template <class Unused = void>
  dataset shard(std::int64_t num_shards, std::int64_t index) const {
    return dataset(std::make_shared<detail::basic_shard_stage<Unused>>(stage_, num_shards, index));
  }

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

  /// A C++ `for`'s pass over the elements: each a std::vector of its components.
  using const_iterator = detail::element_cursor<element>;
  /// Starts a pass over the elements, outside a function only: inside one being
  /// traced, the loop would read the dataset at trace time and unroll, and a later
  /// call with another dataset of the same spec would reuse that unrolled graph;
  /// there kiln::for_each or reduce() make one ReduceDataset node instead.
  /// \code for (const auto& e : kiln::data::dataset::range(3)) std::cout << e[0];  // tensors 0, 1, 2 \endcode
  KILN_LIBRARY_INLINE const_iterator begin() const;
  KILN_LIBRARY_INLINE std::default_sentinel_t end() const;

  /// An iterator over the elements (TensorFlow's `iter(ds)`): each get_next() gives
  /// the next element, also inside a function, where it is a node that advances at
  /// every call. (Defined in kiln/data/iterator.hpp.)
  /// \code
  /// kiln::data::iterator it = kiln::data::dataset::range(3).make_iterator();
  /// kiln::tensor first = it.get_next()[0];  // 0
  /// \endcode
  iterator make_iterator() const;

  /// The int64 scalar naming the pipeline at run time; symbolic inside a function
  /// that takes the dataset as an argument.
  const tensor& handle() const { return handle_; }
  /// Appends the element spec to a kiln::function's cache key.
  KILN_LIBRARY_INLINE void append_spec_key(std::vector<std::uint64_t>& key) const;
  /// This dataset, reached through `handle` (a function's placeholder for it).
  KILN_LIBRARY_INLINE dataset with_handle(const tensor& handle) const;
  /// The pipeline as traced: what a ReduceDataset node keeps.
  const std::shared_ptr<const detail::dataset_stage>& pipeline() const { return stage_; }
  /// How a function's signature shows a dataset argument, as TensorFlow does:
  /// `DatasetSpec(TensorSpec(shape=(), dtype=tf.int64, name=None), TensorShape([]))`.
  /// \code kiln::data::dataset::range(3).signature_text(); \endcode
  KILN_LIBRARY_INLINE std::string signature_text() const;

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

/// A dataset whose elements have `N` components, known from the C++ types that made
/// it: its elements are `std::array<kiln::tensor, N>`, so a C++ `for` can bind them
/// (`for (auto [x, y] : ds)`), and the transformations that keep the component count
/// give a `dataset_of<N>` again. It is a kiln::data::dataset wherever one is taken.
/// \code
/// auto ds = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3, 4})}).batch(2);
/// for (auto [x, y] : ds) std::cout << x + y << "\n";  // [4 6]
/// \endcode
template <std::size_t N>
class dataset_of : public dataset {
  static_assert(N > 0, "kiln::data::dataset_of: a dataset element has at least one component");

 public:
  /// An element: its `N` components.
  using element = std::array<tensor, N>;

  /// `d`, whose elements must have `N` components, else kiln::value_error.
  /// \code kiln::data::dataset_of<1> ds(kiln::data::dataset(kiln::data::dataset::range(3))); \endcode
  explicit dataset_of(dataset d) : dataset(std::move(d)) {
    if (element_spec().size() != N)
      throw value_error("kiln::data::dataset_of<" + std::to_string(N) + ">: the dataset's elements have " +
                        std::to_string(element_spec().size()) + " components");
  }

  /// As dataset::batch.
  template <class = void>
  dataset_of batch(std::int64_t batch_size, bool drop_remainder = false) const {
    return dataset_of(dataset::batch(batch_size, drop_remainder));
  }
  /// As dataset::shuffle.
  template <class = void>
  dataset_of shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                     bool reshuffle_each_iteration = true) const {
    return dataset_of(dataset::shuffle(buffer_size, seed, reshuffle_each_iteration));
  }
  /// As dataset::prefetch.
  template <class = void>
  dataset_of prefetch(std::int64_t buffer_size) const { return dataset_of(dataset::prefetch(buffer_size)); }
  /// As dataset::take.
  template <class = void>
  dataset_of take(std::int64_t count) const { return dataset_of(dataset::take(count)); }
  /// As dataset::shard.
  template <class = void>
  dataset_of shard(std::int64_t num_shards, std::int64_t index) const { return dataset_of(dataset::shard(num_shards, index)); }

  /// A C++ `for`'s pass over the elements, as dataset::begin.
  using const_iterator = detail::element_cursor<element>;
  const_iterator begin() const { return const_iterator(*pipeline()); }
  std::default_sentinel_t end() const { return {}; }
  /// As dataset::make_iterator, its elements `std::array`s (kiln/data/iterator.hpp).
  iterator_of<N> make_iterator() const;

  /// This dataset, reached through `handle` (a function's placeholder for it).
  dataset_of with_handle(const tensor& handle) const { return dataset_of(dataset::with_handle(handle)); }
};

// dataset's members that give a dataset_of, which is complete only here.
template <class Unused>
dataset_of<1> dataset::range(std::int64_t start, std::int64_t limit, std::int64_t delta) {
  return dataset_of<1>(dataset(std::make_shared<detail::basic_range_stage<Unused>>(start, limit, delta)));
}
template <class>
dataset_of<1> dataset::range(std::int64_t limit) {
  return range(0, limit);
}

}  // namespace kiln::data

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
  requires(!std::derived_from<std::remove_cvref_t<Range>, data::dataset>)
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

#if KILN_DEFINE_LIBRARY
namespace kiln::data {

KILN_LIBRARY_INLINE auto dataset::begin() const -> const_iterator { return const_iterator(*stage_); }

KILN_LIBRARY_INLINE std::default_sentinel_t dataset::end() const { return {}; }

KILN_LIBRARY_INLINE void dataset::append_spec_key(std::vector<std::uint64_t>& key) const {
  key.push_back(element_spec().size());
  for (const tensor_spec& s : element_spec()) detail::add_shape(key, s.dtype, s.shape);
}

KILN_LIBRARY_INLINE dataset dataset::with_handle(const tensor& handle) const {
  dataset d = *this;
  d.handle_ = handle;
  return d;
}

KILN_LIBRARY_INLINE std::string dataset::signature_text() const {
  return "DatasetSpec(" + detail::element_spec_text(element_spec()) + ", TensorShape([]))";
}

}  // namespace kiln::data
#endif  // KILN_DEFINE_LIBRARY

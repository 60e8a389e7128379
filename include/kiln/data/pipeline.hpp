#pragma once
/// \file
/// What a dataset is made of: elements, one pass over them (`element_iterator`), the
/// stages of a pipeline (`dataset_stage`) and the registry of live pipelines that
/// dataset handles name (TensorFlow's variant tensors).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/spec.hpp"
#include "kiln/trace/control_flow.hpp"

namespace kiln::detail {

/// One element of a dataset: its components, in order.
using dataset_element = std::vector<tensor>;

/// "(int32 (), float32 (2,))", as errors show an element spec.
KILN_LIBRARY_INLINE std::string components_text(std::span<const tensor_spec> specs);

/// Raises kiln::invalid_argument_error unless `element` fits `spec`, naming both.
KILN_LIBRARY_INLINE void check_element(std::string_view stage, const dataset_element& element, std::span<const tensor_spec> spec);

/// Raises kiln::invalid_argument_error naming op `op` unless the elements of spec
/// `got`, of the dataset or iterator (`what`) a node was given when it runs, fit the
/// spec `traced` that the node was traced for.
KILN_LIBRARY_INLINE void check_traced_spec(std::string_view op, std::string_view what, std::span<const tensor_spec> got,
                              std::span<const tensor_spec> traced);

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
  KILN_LIBRARY_INLINE std::optional<dataset_element> next();

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
  KILN_LIBRARY_INLINE element_iterator iterate() const;
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

/// The objects that handles name (a dataset's pipeline, an iterator's state), as
/// TensorFlow's variant and resource tensors do: a handle's value is its key here.
/// Weak, so that a handle never keeps an object alive; a graph node holds the object
/// it was traced with itself.
template <class T>
class handle_registry {
 public:
  static handle_registry& get() {
    static handle_registry r;
    return r;
  }
  /// Registers `object` and returns its key.
  std::int64_t add(const std::shared_ptr<T>& object) {
    std::lock_guard lock(mutex_);
    std::erase_if(objects_, [](const auto& entry) { return entry.second.expired(); });
    objects_.emplace(next_key_, object);
    return next_key_++;
  }
  /// The object that `handle` names; kiln::invalid_argument_error naming op `op`
  /// and the kind of object (`what`) when it is gone.
  std::shared_ptr<T> find(const tensor& handle, std::string_view op, std::string_view what) {
    const std::int64_t key = handle.item<std::int64_t>();
    std::lock_guard lock(mutex_);
    auto it = objects_.find(key);
    std::shared_ptr<T> object = it == objects_.end() ? nullptr : it->second.lock();
    if (!object)
      throw invalid_argument_error(std::string(op) + ": " + std::string(what) + " handle " + std::to_string(key) +
                                   " names no live " + std::string(what) + "; keep a " + std::string(what) +
                                   " alive while a function runs on it");
    return object;
  }

 private:
  std::mutex mutex_;
  std::map<std::int64_t, std::weak_ptr<T>> objects_;
  std::int64_t next_key_ = 1;
};
/// The live pipelines, which dataset handles name.
using dataset_registry = handle_registry<const dataset_stage>;

/// `TensorSpec(shape=(), dtype=tf.int64, name=None)` for one component, a tuple of
/// them for several: an element spec as TensorFlow's DatasetSpec and IteratorSpec show it.
KILN_LIBRARY_INLINE std::string element_spec_text(std::span<const tensor_spec> spec);

/// A C++ `for`'s pass over a dataset, handing out its elements as `Element`: a
/// std::vector of tensors, or a std::array of as many as every element has. Made
/// outside a trace only (see dataset::begin).
template <class Element>
class element_cursor {
 public:
  using value_type = Element;
  using difference_type = std::ptrdiff_t;
  element_cursor() = default;
  /// Starts a pass over `stage`'s elements; kiln::type_error inside a trace.
  explicit element_cursor(const dataset_stage& stage) {
    if (trace_context::current())
      throw type_error("a C++ for over a kiln::data::dataset inside a kiln::function would read the dataset once, "
                       "while tracing, and unroll its elements into the graph; use kiln::for_each(ds, body, vars...) or "
                       "ds.reduce(initial, fn), which become one ReduceDataset node that runs at every call");
    init_scope eager;
    pass_ = std::make_shared<element_iterator>(stage.iterate());
    ++*this;
  }
  const Element& operator*() const { return *current_; }
  const Element* operator->() const { return &*current_; }
  element_cursor& operator++() {
    init_scope eager;
    std::optional<dataset_element> e = pass_->next();
    if (!e) {
      current_.reset();
    } else if constexpr (std::is_same_v<Element, dataset_element>) {
      current_ = std::move(*e);
    } else {
      current_.emplace();
      std::move(e->begin(), e->end(), current_->begin());  // the dataset_of checked the component count
    }
    return *this;
  }
  void operator++(int) { ++*this; }
  bool operator==(std::default_sentinel_t) const { return !current_; }

 private:
  std::shared_ptr<element_iterator> pass_;
  std::optional<Element> current_;
};

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string components_text(std::span<const tensor_spec> specs) {
  std::vector<value_spec> v;
  for (const tensor_spec& s : specs) v.emplace_back(s.dtype, s.shape);
  return specs_text(v);
}

KILN_LIBRARY_INLINE void check_element(std::string_view stage, const dataset_element& element,
                                       std::span<const tensor_spec> spec) {
  bool fits = element.size() == spec.size();
  for (std::size_t k = 0; fits && k < spec.size(); ++k) fits = spec[k].accepts(element[k].dtype(), element[k].shape());
  if (!fits)
    throw invalid_argument_error(std::string(stage) + ": an element is " + specs_text(specs_of(element)) +
                                 " but the dataset's element spec is " + components_text(spec));
}

KILN_LIBRARY_INLINE void check_traced_spec(std::string_view op, std::string_view what, std::span<const tensor_spec> got,
                                           std::span<const tensor_spec> traced) {
  bool fits = got.size() == traced.size();
  for (std::size_t k = 0; fits && k < got.size(); ++k)
    fits = got[k].dtype == traced[k].dtype && traced[k].shape.accepts(got[k].shape);
  if (!fits)
    throw invalid_argument_error(std::string(op) + ": the " + std::string(what) + "'s elements are " +
                                 components_text(got) + " but the function was traced for " + components_text(traced));
}

KILN_LIBRARY_INLINE std::optional<dataset_element> element_iterator::next() { return next_(state_.get()); }

KILN_LIBRARY_INLINE element_iterator dataset_stage::iterate() const { return iterate_(*this); }

KILN_LIBRARY_INLINE std::string element_spec_text(std::span<const tensor_spec> spec) {
  if (spec.size() == 1) return spec[0].str();
  std::string s = "(";
  for (std::size_t k = 0; k < spec.size(); ++k) s += (k ? ", " : "") + spec[k].str();
  return s + ")";
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

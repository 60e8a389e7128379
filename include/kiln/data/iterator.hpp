#pragma once
/// \file
/// `kiln::data::iterator`, TensorFlow's `iter(dataset)`: one pass over a dataset that
/// every `get_next()` advances, eagerly and inside functions. There, as in
/// TensorFlow, the iterator is a resource (a handle naming its state) and get_next an
/// `IteratorGetNext` node with effects, so it advances at every call of the graph,
/// and an iterator passed as a function argument is keyed by its element spec.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/pipeline.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln::detail {

/// What a kiln::data::iterator's copies share: a pass over a dataset's elements and
/// the spec they have.
class iterator_state {
 public:
  // The pass starts outside any trace: a source may run C++ code and ops (a generator).
  explicit iterator_state(std::shared_ptr<const dataset_stage> stage)
      : stage_(std::move(stage)), pass_([&] {
          init_scope eager;
          return stage_->iterate();
        }()) {}

  /// The next element, or nothing past the end; one caller at a time.
  KILN_LIBRARY_INLINE std::optional<dataset_element> next();
  const std::vector<tensor_spec>& element_spec() const { return stage_->element_spec(); }

 private:
  std::shared_ptr<const dataset_stage> stage_;  // a pass reads its stages
  std::mutex mutex_;
  element_iterator pass_;
};

/// The live iterators, which iterator handles name.
using iterator_registry = handle_registry<iterator_state>;

/// The element `state` gives next, or kiln::out_of_range_error past the end (as
/// TensorFlow's OutOfRangeError: "End of sequence").
KILN_LIBRARY_INLINE dataset_element next_element(iterator_state& state, std::string_view who);

/// `it.get_next()` inside a function: its input is the iterator's handle, its results
/// the element's components. The iterator comes from the handle at every run (an
/// iterator argument gives another one at each call); the op also holds the one it
/// was traced with, which keeps an iterator captured while tracing alive.
class iterator_get_next_op final : public special_op {
 public:
  explicit iterator_get_next_op(std::shared_ptr<iterator_state> traced)
      : special_op(std::type_identity<iterator_get_next_op>()), traced_(std::move(traced)) {}
  KILN_LIBRARY_INLINE std::string_view name() const;
  /// It advances the iterator: never pruned, in program order with other effects.
  bool has_effects() const { return true; }
  KILN_LIBRARY_INLINE std::vector<tensor> run(std::span<const tensor* const> in) const;

  KILN_LIBRARY_INLINE static std::array<std::string_view, 1> op_names();
  /// Its iterator is a pass over a pipeline of C++ objects of this program, named by a
  /// handle that means nothing to another one.
  static constexpr std::string_view save_refusal =
      "advances an iterator over a dataset, a pipeline of C++ objects of this program, which a saved function "
      "cannot hold";
  static constexpr std::string_view onnx_refusal =
      "advances an iterator over a dataset; an ONNX model has no state and no datasets";
  /// What TensorBoard's graph shows of it: the elements it gives.
  template <class Out>
  void describe(Out& out) const {
    out.set_text("element_spec", components_text(traced_->element_spec()));
  }

 private:
  std::shared_ptr<iterator_state> traced_;
};

}  // namespace kiln::detail

namespace kiln::data {

/// TensorFlow's `iter(ds)`: a pass over a dataset that each get_next() advances.
/// Copies share the pass. Inside a kiln::function, get_next() is a node that advances
/// the iterator at every call (the guides' `good_consume_next`); as a function
/// argument an iterator is keyed by its element spec, so iterators of one spec share
/// a trace. Past the end, get_next() raises kiln::out_of_range_error, eagerly and
/// when a graph runs.
/// \code
/// kiln::data::iterator it = kiln::data::dataset::from_tensor_slices(kiln::constant({1, 2, 3})).make_iterator();
/// kiln::function consume([](const kiln::data::iterator& i) { kiln::print("Value:", i.get_next()[0]); });
/// consume(it);  // Value: 1
/// consume(it);  // Value: 2
/// \endcode
class iterator {
 public:
  /// An iterator over nothing; get_next() raises kiln::value_error.
  iterator() = default;
  /// A new pass over `ds` (what dataset::make_iterator gives).
  explicit iterator(const dataset& ds)
      : state_(std::make_shared<detail::iterator_state>(ds.pipeline())),
        handle_(kiln::constant(detail::iterator_registry::get().add(state_))) {}

  /// The next element, one tensor per component; inside a function being traced, an
  /// `IteratorGetNext` node's symbolic results. kiln::out_of_range_error past the end.
  KILN_LIBRARY_INLINE dataset::element get_next() const;

  /// One spec per component of an element.
  KILN_LIBRARY_INLINE const std::vector<tensor_spec>& element_spec() const;

  /// The int64 scalar naming the iterator at run time; symbolic inside a function
  /// that takes the iterator as an argument.
  const tensor& handle() const { return handle_; }
  /// Appends what keys an iterator argument to a kiln::function's cache key: that it
  /// is an iterator, and its element spec.
  KILN_LIBRARY_INLINE void append_spec_key(std::vector<std::uint64_t>& key) const;
  /// This iterator, reached through `handle` (a function's placeholder for it).
  KILN_LIBRARY_INLINE iterator with_handle(const tensor& handle) const;
  /// How a function's signature shows an iterator argument, as TensorFlow does:
  /// `IteratorSpec(TensorSpec(shape=(), dtype=tf.int32, name=None),)`.
  KILN_LIBRARY_INLINE std::string signature_text() const;

 private:
  std::shared_ptr<detail::iterator_state> state_;
  tensor handle_;
};

/// An iterator over a dataset_of<N>: its elements are `std::array`s of `N` tensors.
/// \code
/// auto it = kiln::data::dataset::from_tensor_slices(std::tuple{kiln::constant({1, 2}), kiln::constant({3, 4})}).make_iterator();
/// auto [x, y] = it.get_next();  // 1, 3
/// \endcode
template <std::size_t N>
class iterator_of : public iterator {
 public:
  iterator_of() = default;
  explicit iterator_of(const dataset_of<N>& ds) : iterator(ds) {}
  /// As iterator::get_next.
  std::array<tensor, N> get_next() const {
    dataset::element e = iterator::get_next();
    std::array<tensor, N> out;
    std::move(e.begin(), e.end(), out.begin());  // the dataset_of checked the component count
    return out;
  }
  /// As iterator::with_handle.
  iterator_of with_handle(const tensor& handle) const {
    iterator_of i = *this;
    static_cast<iterator&>(i) = iterator::with_handle(handle);
    return i;
  }
};

/// `it.get_next()`, as TensorFlow's `next(it)`.
/// \code kiln::tensor x = kiln::data::get_next(kiln::data::dataset::range(2).make_iterator())[0];  // 0 \endcode
template <class Iterator>
  requires std::derived_from<Iterator, iterator>
auto get_next(const Iterator& it) {
  return it.get_next();
}

#if KILN_DEFINE_LIBRARY
KILN_LIBRARY_INLINE iterator dataset::make_iterator() const { return iterator(*this); }
#endif  // KILN_DEFINE_LIBRARY

template <std::size_t N>
iterator_of<N> dataset_of<N>::make_iterator() const {
  return iterator_of<N>(*this);
}

}  // namespace kiln::data

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::optional<dataset_element> iterator_state::next() {
  std::lock_guard lock(mutex_);
  init_scope eager;  // a pass may run ops (a map's function)
  return pass_.next();
}

KILN_LIBRARY_INLINE dataset_element next_element(iterator_state& state, std::string_view who) {
  std::optional<dataset_element> e = state.next();
  if (!e) throw out_of_range_error(std::string(who) + ": End of sequence");
  return std::move(*e);
}

KILN_LIBRARY_INLINE std::string_view iterator_get_next_op::name() const { return "IteratorGetNext"; }

KILN_LIBRARY_INLINE std::vector<tensor> iterator_get_next_op::run(std::span<const tensor* const> in) const {
  const std::shared_ptr<iterator_state> state = iterator_registry::get().find(*in[0], name(), "iterator");
  check_traced_spec(name(), "iterator", state->element_spec(), traced_->element_spec());
  return next_element(*state, name());
}

KILN_LIBRARY_INLINE std::array<std::string_view, 1> iterator_get_next_op::op_names() { return {"IteratorGetNext"}; }

}  // namespace kiln::detail

namespace kiln::data {

KILN_LIBRARY_INLINE dataset::element iterator::get_next() const {
  if (!state_) throw value_error("kiln::data::iterator: get_next on an iterator over nothing (default-constructed)");
  if (detail::trace_context* trace = detail::trace_context::current()) {
    std::vector<std::pair<dtype, shape>> results;
    for (const tensor_spec& s : element_spec()) results.emplace_back(s.dtype, s.shape);
    const tensor inputs[] = {handle_};
    return trace->record_special(std::make_shared<detail::iterator_get_next_op>(state_), inputs, results);
  }
  if (handle_.is_symbolic())
    throw type_error("kiln::data::iterator: an iterator a function received was used outside the trace that made it");
  return detail::next_element(*state_, "kiln::data::iterator::get_next");
}

KILN_LIBRARY_INLINE const std::vector<tensor_spec>& iterator::element_spec() const {
  if (!state_)
    throw value_error("kiln::data::iterator: an iterator over nothing (default-constructed) has no element spec");
  return state_->element_spec();
}

KILN_LIBRARY_INLINE void iterator::append_spec_key(std::vector<std::uint64_t>& key) const {
  key.push_back(~std::uint64_t(element_spec().size()));  // unlike a dataset's first word
  for (const tensor_spec& s : element_spec()) detail::add_shape(key, s.dtype, s.shape);
}

KILN_LIBRARY_INLINE iterator iterator::with_handle(const tensor& handle) const {
  iterator i = *this;
  i.handle_ = handle;
  return i;
}

KILN_LIBRARY_INLINE std::string iterator::signature_text() const {
  return "IteratorSpec(" + detail::element_spec_text(element_spec()) + ",)";
}

}  // namespace kiln::data
#endif  // KILN_DEFINE_LIBRARY

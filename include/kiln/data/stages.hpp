#pragma once
/// \file
/// The stages of a dataset pipeline: the sources (`range`, `from_tensor_slices`,
/// `from_tensors`, `from_generator`) and the transformations (`map`, `batch`,
/// `shuffle`, `take`, `prefetch`), each one pass at a time.
///
/// Each stage is a class template on nothing (`basic_batch_stage<Unused>`, named
/// `batch_stage` for its one specialization), so that a program compiles a stage's
/// members only where it builds that stage.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/data/pipeline.hpp"
#include "kiln/exec/control_flow.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/trace/random.hpp"

namespace kiln::detail {

/// The pass of a stage whose elements are computed from their position.
template <class Element>
element_iterator indexed_elements(std::int64_t count, Element element) {
  return element_iterator([count, element = std::move(element), position = std::int64_t(0)]() mutable {
    return position < count ? std::optional<dataset_element>(element(position++)) : std::nullopt;
  });
}

/// `dataset::range`: int64 scalars start, start + delta, ... up to limit (excluded).
template <class Unused>
class basic_range_stage final : public dataset_stage {
 public:
  basic_range_stage(std::int64_t start, std::int64_t limit, std::int64_t delta);
  element_iterator iterate() const;

 private:
  std::int64_t start_, delta_, count_ = 0;
};
using range_stage = basic_range_stage<void>;

/// The spec of one slice along the first dim of each of `components`, which must
/// be eager tensors of rank 1 or more that agree in their first dim.
KILN_LIBRARY_INLINE std::vector<tensor_spec> slice_spec(std::span<const tensor> components);

/// `dataset::from_tensor_slices`: element i is slice i of every component. A
/// template on nothing, as op functions are: it runs x[i].
template <class Unused>
class basic_slices_stage final : public dataset_stage {
 public:
  explicit basic_slices_stage(std::vector<tensor> components)
      : dataset_stage(std::type_identity<basic_slices_stage>(), "TensorSliceDataset", slice_spec(components), false),
        count_(components[0].shape()[0]),
        components_(std::move(components)) {}
  element_iterator iterate() const;

 private:
  std::int64_t count_;
  std::vector<tensor> components_;
};
using slices_stage = basic_slices_stage<void>;

/// `dataset::from_tensors`: one element, the components themselves.
template <class Unused>
class basic_tensors_stage final : public dataset_stage {
 public:
  explicit basic_tensors_stage(std::vector<tensor> components)
      : dataset_stage(std::type_identity<basic_tensors_stage>(), "TensorDataset", spec_of(components), false),
        components_(std::move(components)) {}
  element_iterator iterate() const;

 private:
  static std::vector<tensor_spec> spec_of(std::span<const tensor> components);
  std::vector<tensor> components_;
};
using tensors_stage = basic_tensors_stage<void>;

/// `dataset::from_generator`: each pass calls `start()` for a fresh source of
/// elements and checks each against the output specs.
template <class Unused>
class basic_generator_stage final : public dataset_stage {
 public:
  using next_element = std::function<std::optional<dataset_element>()>;
  basic_generator_stage(std::function<next_element()> start, std::vector<tensor_spec> spec)
      : dataset_stage(std::type_identity<basic_generator_stage>(), "FlatMapDataset", std::move(spec), true),
        start_(std::move(start)) {
    if (element_spec().empty()) throw value_error("dataset::from_generator: give at least one output spec");
  }
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
using generator_stage = basic_generator_stage<void>;

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

/// `dataset::map`: each element through a function traced once into a subgraph. A
/// template on nothing, as subgraph's members are: it optimizes and runs a graph.
template <class Unused>
class basic_map_stage final : public transform_stage {
 public:
  basic_map_stage(std::shared_ptr<const dataset_stage> input, graph fn, std::vector<tensor_spec> spec)
      : transform_stage(std::type_identity<basic_map_stage>(), "MapDataset", std::move(spec), std::move(input),
                        fn.has_effects()),
        fn_(std::move(fn)) {}
  element_iterator iterate() const;

 private:
  subgraph fn_;
};
using map_stage = basic_map_stage<void>;

/// `dataset::batch`: `size` consecutive elements stacked along a new first dim; the
/// last batch may be smaller unless `drop_remainder`. A template on nothing, as op
/// functions are: it runs stack.
template <class Unused>
class basic_batch_stage final : public transform_stage {
 public:
  basic_batch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t size, bool drop_remainder)
      : transform_stage(std::type_identity<basic_batch_stage>(), "BatchDataset",
                        batched_spec(input->element_spec(), size, drop_remainder), input),
        size_(size),
        drop_remainder_(drop_remainder) {}
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
using batch_stage = basic_batch_stage<void>;

/// `dataset::shuffle`: TensorFlow's buffer shuffle: fill a buffer of `buffer_size`
/// elements, then repeatedly hand out a random one and refill its place. Each pass
/// draws from its own stream (the pass number mixed into the seed), so passes differ
/// and the sequence of passes is the same at every run of a program.
template <class Unused>
class basic_shuffle_stage final : public transform_stage {
 public:
  basic_shuffle_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size, std::uint64_t seed,
                bool reshuffle_each_iteration);
  element_iterator iterate() const;

 private:
  std::int64_t buffer_size_;
  std::uint64_t seed_;
  bool reshuffle_;
  mutable std::atomic<std::uint64_t> passes_{0};
};
using shuffle_stage = basic_shuffle_stage<void>;

/// `dataset::shard`: every `num_shards`-th element from element `index`.
template <class Unused>
class basic_shard_stage final : public transform_stage {
 public:
  basic_shard_stage(std::shared_ptr<const dataset_stage> input, std::int64_t num_shards, std::int64_t index);
  element_iterator iterate() const;

 private:
  std::int64_t num_shards_, index_;
};
using shard_stage = basic_shard_stage<void>;

/// `dataset::take`: the first `count` elements (all of them for a negative count).
template <class Unused>
class basic_take_stage final : public transform_stage {
 public:
  basic_take_stage(std::shared_ptr<const dataset_stage> input, std::int64_t count)
      : transform_stage(std::type_identity<basic_take_stage>(), "TakeDataset", input->element_spec(), input), count_(count) {}
  element_iterator iterate() const;

 private:
  std::int64_t count_;
};
using take_stage = basic_take_stage<void>;

/// `dataset::prefetch`: the elements of its input, unchanged. kiln produces elements
/// on the thread that consumes them, so prefetching has nothing to overlap with; the
/// stage keeps pipelines written for TensorFlow as they are.
template <class Unused>
class basic_prefetch_stage final : public transform_stage {
 public:
  basic_prefetch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size);
  element_iterator iterate() const;
};
using prefetch_stage = basic_prefetch_stage<void>;

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

template <class Unused>
basic_range_stage<Unused>::basic_range_stage(std::int64_t start, std::int64_t limit, std::int64_t delta)
    : dataset_stage(std::type_identity<basic_range_stage>(), "RangeDataset", {tensor_spec(shape{}, int64)}, false),
      start_(start),
      delta_(delta) {
  if (delta == 0) throw invalid_argument_error("dataset::range: delta must not be 0");
  // Python's range length: ceil((limit - start) / delta), at least 0.
  const std::int64_t span = delta > 0 ? limit - start : start - limit;
  const std::int64_t step = delta > 0 ? delta : -delta;
  count_ = span <= 0 ? 0 : (span + step - 1) / step;
}

template <class Unused>
auto basic_range_stage<Unused>::iterate() const -> element_iterator {
  return indexed_elements(count_, [start = start_, delta = delta_](std::int64_t i) {
    return dataset_element{kiln::constant(start + i * delta)};
  });
}

KILN_LIBRARY_INLINE std::vector<tensor_spec> slice_spec(std::span<const tensor> components) {
  if (components.empty()) throw value_error("dataset::from_tensor_slices: give at least one tensor");
  std::vector<tensor_spec> out;
  for (const tensor& c : components) {
    c.require_value("dataset::from_tensor_slices");
    if (c.rank() < 1)
      throw value_error("dataset::from_tensor_slices: slicing needs tensors of rank 1 or more, got a scalar");
    if (c.shape()[0] != components[0].shape()[0])
      throw value_error("dataset::from_tensor_slices: the components must have the same first dim, got " +
                        components[0].shape().str() + " and " + c.shape().str());
    out.emplace_back(shape(c.shape().dims().subspan(1)), c.dtype());
  }
  return out;
}

template <class Unused>
auto basic_slices_stage<Unused>::iterate() const -> element_iterator {
  return indexed_elements(count_, [this](std::int64_t i) {
    dataset_element e;
    for (const tensor& c : components_) e.push_back(c[i]);
    return e;
  });
}

template <class Unused>
auto basic_tensors_stage<Unused>::iterate() const -> element_iterator {
  return indexed_elements(1, [this](std::int64_t) { return components_; });
}

template <class Unused>
auto basic_tensors_stage<Unused>::spec_of(std::span<const tensor> components) -> std::vector<tensor_spec> {
  if (components.empty()) throw value_error("dataset::from_tensors: give at least one tensor");
  std::vector<tensor_spec> out;
  for (const tensor& c : components) {
    c.require_value("dataset::from_tensors");
    out.emplace_back(c.shape(), c.dtype());
  }
  return out;
}

template <class Unused>
auto basic_map_stage<Unused>::iterate() const -> element_iterator {
  return transformed([this](element_iterator& in) -> std::optional<dataset_element> {
    std::optional<dataset_element> e = in.next();
    if (!e) return std::nullopt;
    return fn_.run(*e);
  });
}

template <class Unused>
basic_shuffle_stage<Unused>::basic_shuffle_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size,
                                                 std::uint64_t seed, bool reshuffle_each_iteration)
    : transform_stage(std::type_identity<basic_shuffle_stage>(), "ShuffleDataset", input->element_spec(), input),
      buffer_size_(buffer_size),
      seed_(seed),
      reshuffle_(reshuffle_each_iteration) {
  if (buffer_size <= 0)
    throw invalid_argument_error("dataset::shuffle: buffer_size must be positive, got " + std::to_string(buffer_size));
}

template <class Unused>
auto basic_shuffle_stage<Unused>::iterate() const -> element_iterator {
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

template <class Unused>
basic_shard_stage<Unused>::basic_shard_stage(std::shared_ptr<const dataset_stage> input, std::int64_t num_shards,
                                             std::int64_t index)
    : transform_stage(std::type_identity<basic_shard_stage>(), "ShardDataset", input->element_spec(), input),
      num_shards_(num_shards),
      index_(index) {
  if (num_shards <= 0)
    throw invalid_argument_error("dataset::shard: num_shards must be positive, got " + std::to_string(num_shards));
  if (index < 0 || index >= num_shards)
    throw invalid_argument_error("dataset::shard: index must be in [0, " + std::to_string(num_shards) + "), got " +
                                 std::to_string(index));
}

template <class Unused>
auto basic_shard_stage<Unused>::iterate() const -> element_iterator {
  return transformed(
      [num_shards = num_shards_, index = index_, position = std::int64_t(0)](element_iterator& in) mutable {
        std::optional<dataset_element> e;
        // The elements before this shard's next one are read and dropped.
        while ((e = in.next()) && position++ % num_shards != index) {
        }
        return e;
      });
}

template <class Unused>
auto basic_take_stage<Unused>::iterate() const -> element_iterator {
  return transformed([count = count_, taken = std::int64_t(0)](element_iterator& in) mutable {
    if (count >= 0 && taken >= count) return std::optional<dataset_element>();
    ++taken;
    return in.next();
  });
}

template <class Unused>
basic_prefetch_stage<Unused>::basic_prefetch_stage(std::shared_ptr<const dataset_stage> input, std::int64_t buffer_size)
    : transform_stage(std::type_identity<basic_prefetch_stage>(), "PrefetchDataset", input->element_spec(), input) {
  if (buffer_size < 0)
    throw invalid_argument_error("dataset::prefetch: buffer_size must be 0 or more, got " +
                                 std::to_string(buffer_size));
}

template <class Unused>
auto basic_prefetch_stage<Unused>::iterate() const -> element_iterator {
  return input()->iterate();
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

#pragma once
/// \file
/// `kiln::distribute::data_parallel`: synchronous data-parallel training, one replica
/// of the model per rank (TensorFlow's MultiWorkerMirroredStrategy, Horovod's
/// DistributedOptimizer). Each rank trains on its own part of every global batch; the
/// strategy's optimizer averages the gradients over the ranks before applying them, so
/// every rank applies the same update to the same weights.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/distribute/collectives.hpp"
#include "kiln/distribute/communicator.hpp"
#include "kiln/train/replicas.hpp"

namespace kiln::distribute {

/// Options of kiln::distribute::data_parallel.
struct data_parallel_options {
  /// The ranks that train together: every rank, or a group (communicator::split).
  communicator group = communicator::world();
  /// Gradients are averaged in buckets of at most this many bytes, one all-reduce per
  /// bucket (a larger gradient is a bucket of its own): fewer, larger transfers for
  /// many small tensors, at the cost of a copy of each bucket. PyTorch's DDP uses 25 MiB.
  std::size_t bucket_bytes = std::size_t(25) << 20;
  /// The rank (in `group`) whose variables every rank starts from.
  int root = 0;
};

template <class Optimizer>
class distributed_optimizer;
class data_parallel_scope;

/// Synchronous data parallelism over the ranks of a group (every rank by default): one
/// process per rank under `mpirun`, or a world of one without it, which trains exactly
/// as it would without the strategy.
///
/// - `rank()`, `size()`: this replica and how many train together.
/// - `ds.shard(size(), rank())` (or `split_batch`) gives each rank its part of the data;
///   with `batch(b)` after `shard`, the ranks' step k together hold global batch k of
///   `size() * b` elements.
/// - `optimizer(opt).apply_gradients(grads, vars)` averages each gradient over the
///   ranks (in buckets, the sum in rank order, then divided by the size), then lets
///   `opt` apply the averages. Variables it has not seen before are first given the
///   root's values (`broadcast_variables`).
/// - `reduce(op, value)` combines a loss or a metric over the ranks for reporting.
/// - `scope()` makes the strategy the one kiln's training loops and checkpoints see
///   (kiln/train/replicas.hpp).
///
/// \code
/// kiln::distribute::data_parallel strategy;
/// kiln::variable w(kiln::constant({0.5f, -0.5f}), "w");
/// strategy.broadcast_variables({w});  // every rank starts from rank 0's values
/// kiln::optimizers::adam adam({.learning_rate = 1e-2});
/// auto opt = strategy.optimizer(adam);
/// kiln::function train_step([&](const kiln::tensor& x, const kiln::tensor& y) {
///   kiln::gradient_tape tape;
///   kiln::tensor loss = kiln::reduce_mean(kiln::square(kiln::reduce_sum(w * x, 1) - y));
///   opt.apply_gradients(tape.gradient(loss, std::vector{w}), {w});
///   return loss;
/// });
/// \endcode
class data_parallel {
 public:
  explicit data_parallel(data_parallel_options options = {}) : state_(std::make_shared<state>(std::move(options))) {
    const int n = state_->options.group.size();
    if (state_->options.root < 0 || state_->options.root >= n)
      throw invalid_argument_error("data_parallel: root " + std::to_string(state_->options.root) +
                                   " is not a rank of a group of " + std::to_string(n));
    if (state_->options.bucket_bytes == 0) throw invalid_argument_error("data_parallel: bucket_bytes must be positive");
  }

  /// This replica's rank, from 0.
  int rank() const { return group().rank(); }
  /// How many replicas train together.
  int size() const { return group().size(); }
  /// The ranks that train together.
  const communicator& group() const { return state_->options.group; }
  const data_parallel_options& options() const { return state_->options; }

  /// `opt` wrapped so that `apply_gradients` averages the gradients over the ranks
  /// first. The wrapper refers to `opt`, which must outlive it. (Copies of a strategy
  /// are the same strategy.)
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// kiln::optimizers::sgd sgd({.learning_rate = 0.1});
  /// kiln::variable v(1.f);
  /// strategy.optimizer(sgd).apply_gradients({kiln::constant(2.f)}, {v});  // v: 1 - 0.1 * 2 on every rank
  /// \endcode
  template <class Optimizer>
  distributed_optimizer<Optimizer> optimizer(Optimizer& opt) const {
    static_assert(requires(const std::vector<tensor>& g, const std::vector<variable>& v) { opt.apply_gradients(g, v); },
                  "kiln::distribute::data_parallel::optimizer: wraps an optimizer, whose apply_gradients(grads, vars) "
                  "takes a std::vector<kiln::tensor> and a std::vector<kiln::variable>");
    return distributed_optimizer<Optimizer>(opt, *this);
  }

  /// Gives every rank the root's values of `vars` (a broadcast per variable), eagerly,
  /// even while a function traces (as kiln::init_scope); the strategy's optimizer then
  /// does not broadcast them again. Every rank calls it with the same variables.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// kiln::variable b(kiln::zeros({4}), "b");
  /// strategy.broadcast_variables({b});
  /// \endcode
  template <class = void>
  void broadcast_variables(const std::vector<variable>& vars) const { share_variables(vars, true); }

  /// The gradients averaged over the ranks: an all-reduce mean per bucket of gradients
  /// of one dtype (options().bucket_bytes), in their order; undefined ones stay
  /// undefined (every rank must leave the same ones undefined). One rank: `grads` itself.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// std::vector<kiln::tensor> mean = strategy.average_gradients({kiln::ones({3}), kiln::ones({2, 2})});
  /// \endcode
  template <class = void>
  std::vector<tensor> average_gradients(const std::vector<tensor>& grads) const {
    if (size() == 1) return grads;
    std::vector<tensor> out = grads;
    // Buckets: consecutive gradients of one dtype, up to bucket_bytes each.
    std::vector<std::size_t> bucket;
    std::size_t bytes = 0;
    auto flush = [&] {
      if (bucket.empty()) return;
      std::vector<tensor> in;
      for (std::size_t k : bucket) in.push_back(grads[k]);
      std::vector<tensor> reduced = kiln::all_reduce(in, reduce_op::mean, group());
      for (std::size_t i = 0; i < bucket.size(); ++i) out[bucket[i]] = std::move(reduced[i]);
      bucket.clear();
      bytes = 0;
    };
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const tensor& g = grads[k];
      if (!g.defined()) continue;
      const bool sized = g.shape().is_fully_defined();
      const std::size_t size = sized ? std::size_t(g.size()) * size_of(g.dtype()) : state_->options.bucket_bytes;
      if (!bucket.empty() && (grads[bucket[0]].dtype() != g.dtype() || bytes + size > state_->options.bucket_bytes)) flush();
      bucket.push_back(k);
      bytes += size;
    }
    flush();
    return out;
  }

  /// This rank's rows of a global batch (its first dim, which must be known): of n
  /// rows, rank r gets rows [r * n / size, (r + 1) * n / size), as `np.array_split`
  /// cuts them. With n a multiple of size() every rank gets n / size() rows, and the
  /// ranks' averaged gradient is the gradient of the whole batch's mean loss.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// kiln::tensor mine = strategy.split_batch(kiln::ones({8, 3}));  // 8 / size rows
  /// \endcode
  template <class = void>
  tensor split_batch(const tensor& global_batch) const {
    const shape& s = global_batch.shape();
    if (!s.has_known_rank() || s.rank() == 0 || s[0] == none)
      throw value_error("data_parallel::split_batch: a batch with a known first dim is needed, got shape " + s.str());
    const auto [begin, end] = rows(s[0]);
    int_list first{begin}, count{end - begin};
    for (int d = 1; d < s.rank(); ++d) first.push_back(0), count.push_back(-1);
    return kiln::slice(global_batch, first, count);
  }
  /// The rows [begin, end) of a global batch of `n` rows that split_batch gives this rank.
  /// \code auto [begin, end] = kiln::distribute::data_parallel().rows(128); \endcode
  std::pair<std::int64_t, std::int64_t> rows(std::int64_t n) const {
    const std::int64_t r = rank(), k = size(), base = n / k, extra = n % k;
    const std::int64_t begin = r * base + std::min(r, extra);
    return {begin, begin + base + (r < extra ? 1 : 0)};
  }

  /// `value` combined over the ranks (an all_reduce), for reporting a loss or a metric:
  /// `reduce(reduce_op::mean, loss)` is the mean of the ranks' losses.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// double mean_loss = strategy.reduce(kiln::reduce_op::mean, 0.25);
  /// \endcode
  template <class = void>
  tensor reduce(reduce_op op, const tensor& value) const { return kiln::all_reduce(value, op, group()); }
  template <class = void>
  double reduce(reduce_op op, double value) const {
    return reduce(op, kiln::constant(value)).item<double>();
  }

  /// Makes this strategy the one kiln::fit and checkpoints use on this thread.
  /// \code
  /// kiln::distribute::data_parallel strategy;
  /// auto scope = strategy.scope();
  /// \endcode
  template <class = void>
  [[nodiscard]] data_parallel_scope scope() const;

 private:
  template <class>
  friend class distributed_optimizer;
  struct state {
    explicit state(data_parallel_options o) : options(std::move(o)) {}
    data_parallel_options options;
    std::mutex mutex;
    std::vector<const void*> seen;  ///< the identities of the variables every rank holds alike
  };
  // Broadcasts the variables of `vars` not seen before (all of them when `every`).
  template <class = void>
  void share_variables(const std::vector<variable>& vars, bool every) const {
    if (size() == 1) return;
    std::vector<variable> fresh;
    {
      std::lock_guard lock(state_->mutex);
      for (const variable& v : vars) {
        if (!v) throw invalid_argument_error("data_parallel: a variable is an empty handle");
        const bool seen = std::find(state_->seen.begin(), state_->seen.end(), v.identity()) != state_->seen.end();
        if (seen && !every) continue;
        if (!seen) state_->seen.push_back(v.identity());
        fresh.push_back(v);
      }
    }
    if (fresh.empty()) return;
    init_scope now;  // at once, even while a function traces: every rank traces it at the same point
    for (const variable& v : fresh) {
      tensor value;
      try {
        value = v.read_value();
      } catch (const value_error&) {
        throw value_error("data_parallel: variable '" + v.name() +
                          "' gets its value only when the function being traced first runs, so the ranks could not "
                          "start from the same value; create it before the first call (or call "
                          "broadcast_variables on it after)");
      }
      v.assign(kiln::broadcast(value, state_->options.root, group()));
    }
  }

  std::shared_ptr<state> state_;
};

/// While it lives, its strategy is the one kiln's training loops and checkpoints see
/// on this thread (kiln/train/replicas.hpp); then the one before is again. It cannot
/// be copied or moved, so scopes end in the reverse order of their start. Made by
/// data_parallel::scope().
class data_parallel_scope {
 public:
  data_parallel_scope(const data_parallel_scope&) = delete;
  data_parallel_scope& operator=(const data_parallel_scope&) = delete;
  ~data_parallel_scope() { kiln::detail::current_replica_context() = previous_; }

 private:
  friend class data_parallel;
  template <class = void>
  explicit data_parallel_scope(const data_parallel& strategy)
      : strategy_(strategy), previous_(kiln::detail::current_replica_context()) {
    context_.rank = strategy.rank();
    context_.size = strategy.size();
    context_.self = this;
    context_.average_gradients = [](const void* self, const std::vector<tensor>& grads) {
      return of(self).average_gradients(grads);
    };
    context_.broadcast_variables = [](const void* self, const std::vector<variable>& vars) {
      of(self).broadcast_variables(vars);
    };
    context_.mean = [](const void* self, std::span<double> values) {
      if (values.empty()) return;
      const tensor t = kiln::constant(std::vector<double>(values.begin(), values.end()));
      const std::vector<double> means = of(self).reduce(reduce_op::mean, t).to_vector<double>();
      std::copy(means.begin(), means.end(), values.begin());
    };
    context_.barrier = [](const void* self) { of(self).group().barrier(); };
    kiln::detail::current_replica_context() = &context_;
  }
  static const data_parallel& of(const void* self) { return static_cast<const data_parallel_scope*>(self)->strategy_; }
  data_parallel strategy_;
  kiln::detail::replica_context context_;
  const kiln::detail::replica_context* previous_;
};

template <class>
data_parallel_scope data_parallel::scope() const {
  return data_parallel_scope(*this);
}

/// An optimizer whose `apply_gradients` averages the gradients over the ranks of its
/// strategy first (Horovod's DistributedOptimizer): made by data_parallel::optimizer.
/// On one rank it is the optimizer itself.
/// \code
/// kiln::distribute::data_parallel strategy;
/// kiln::optimizers::adam adam;
/// kiln::distribute::distributed_optimizer<kiln::optimizers::adam> opt = strategy.optimizer(adam);
/// opt.iterations();  // adam's
/// \endcode
template <class Optimizer>
class distributed_optimizer {
 public:
  distributed_optimizer(Optimizer& opt, const data_parallel& strategy) : optimizer_(&opt), strategy_(strategy) {}

  /// Gives unseen variables the root's values, averages `grads` over the ranks
  /// (data_parallel::average_gradients), then applies them with the wrapped optimizer.
  /// Every rank calls it with the same variables, and gradients of the same dtypes and
  /// shapes (defined for the same variables); a disagreement raises
  /// kiln::invalid_argument_error naming the all-reduce.
  template <class = void>
  void apply_gradients(const std::vector<tensor>& grads, const std::vector<variable>& vars) {
    if (strategy_.size() == 1) return optimizer_->apply_gradients(grads, vars);
    if (grads.size() != vars.size())
      throw invalid_argument_error("distributed_optimizer.apply_gradients: " + std::to_string(grads.size()) +
                                   " gradients for " + std::to_string(vars.size()) + " variables");
    strategy_.share_variables(vars, false);
    optimizer_->apply_gradients(strategy_.average_gradients(grads), vars);
  }
  /// The wrapped optimizer's step count.
  const variable& iterations() const { return optimizer_->iterations(); }
  /// The wrapped optimizer.
  Optimizer& inner() const { return *optimizer_; }

 private:
  Optimizer* optimizer_;
  data_parallel strategy_;
};

}  // namespace kiln::distribute

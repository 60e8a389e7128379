#pragma once
/// \file
/// `kiln::distribute::communicator`: a group of ranks that collectives run over, the
/// world (every process of the job) or a part of it; and the timeout of collectives.

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/distribute/runtime.hpp"

namespace kiln::distribute {

/// A group of ranks (TensorFlow's collective group, MPI's communicator): `world()`, every
/// process of the job, or a part of it made by `split`. Copies are the same group.
/// The first use starts MPI when the program runs under a launcher (`mpirun`); without
/// one, the world is this process alone.
/// \code
/// const auto& world = kiln::distribute::communicator::world();
/// std::cout << "rank " << world.rank() << " of " << world.size() << "\n";
/// kiln::distribute::communicator pairs = world.split(world.rank() / 2);  // ranks {0, 1}, {2, 3}, ...
/// \endcode
class communicator {
 public:
  /// Every rank of the job.
  static const communicator& world() {
    static const communicator w(detail::runtime::get().world());
    return w;
  }

  /// This process's rank in the group, from 0.
  int rank() const { return state_->rank; }
  /// How many ranks the group has.
  int size() const { return state_->size; }
  /// The group's ranks as world ranks, in the group's order (empty for the world).
  const std::vector<int>& members() const { return state_->members; }

  /// The group of the ranks of this one that give the same `color`, ranked by `key`
  /// (ties by their rank here), as MPI_Comm_split: every rank of this group calls it.
  /// Each split makes a new group, whose collectives never meet another group's.
  communicator split(int color, int key = 0) const {
    return communicator(detail::runtime::get().split(state_, color, key));
  }

  /// Waits until every rank of the group has arrived (an all_reduce of nothing), with
  /// the collectives' timeout.
  void barrier() const;

  /// How long this group's collectives wait for every rank to arrive (by default
  /// kiln::distribute::timeout()); set it alike on every rank of the group.
  /// \code kiln::distribute::communicator::world().split(0).set_timeout(std::chrono::seconds(5)); \endcode
  void set_timeout(std::chrono::nanoseconds timeout) const {
    if (timeout <= std::chrono::nanoseconds::zero())
      throw invalid_argument_error("communicator::set_timeout: the timeout must be positive");
    std::lock_guard lock(detail::runtime::get().mutex());
    state_->timeout = timeout.count();
  }

  /// The runtime's state of the group (for kiln's collectives).
  const std::shared_ptr<detail::group_state>& state() const { return state_; }

 private:
  explicit communicator(std::shared_ptr<detail::group_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::group_state> state_;
};

/// How long a collective waits for every rank of its group to arrive before it raises
/// kiln::unavailable_error (and its group can run no more collectives): 600 s unless
/// the environment variable `KILN_COLLECTIVE_TIMEOUT` gives seconds, or the group has a
/// timeout of its own (communicator::set_timeout). Set it on every rank; it applies to
/// collectives that start after.
/// \code kiln::distribute::set_timeout(std::chrono::seconds(30)); \endcode
inline void set_timeout(std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero())
    throw invalid_argument_error("kiln::distribute::set_timeout: the timeout must be positive");
  detail::runtime::get().set_timeout(timeout);
}
/// The timeout of collectives.
/// \code auto t = kiln::distribute::timeout(); \endcode
inline std::chrono::nanoseconds timeout() { return detail::runtime::get().timeout(); }

}  // namespace kiln::distribute

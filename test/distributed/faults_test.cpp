// Ranks that disagree: a collective whose shapes, dtypes or kind differ between ranks,
// or that one rank skips, raises a kiln:: error naming the collective and what each rank
// gave, on every rank, never a wrong sum; a rank that never arrives is noticed when its
// group's timeout passes. (A rank that throws out of main, dies or leaves ends the job:
// test/distributed_faults/, run under mpirun one fault at a time.) On one rank nothing
// can disagree, and these tests check that the same calls simply run.

#include <kiln/distributed.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "../support/op_check.hpp"
#include "world.hpp"

namespace {

using kiln::testing::require_throws;
using kiln::testing::world;

// After a disagreement the world goes on: the next collective pairs as it should.
void require_world_works() {
  const int n = world().size();
  CHECK(kiln::all_reduce(kiln::constant(1)).item<int>() == n);
}

}  // namespace

TEST_CASE("ranks that give different shapes get an error naming the collective and each rank's shape") {
  const int r = world().rank(), n = world().size();
  const kiln::tensor x = r == n - 1 ? kiln::ones({3, 2}) : kiln::ones({2, 3});
  if (n == 1) {
    CHECK(kiln::all_reduce(x).shape() == kiln::shape{3, 2});
  } else {
    require_throws<kiln::invalid_argument_error>(
        [&] { return kiln::all_reduce(x); },
        {"kiln::all_reduce", "disagree", "of float32 (2, 3)", "rank " + std::to_string(n - 1) + " gives all_reduce(sum) of float32 (3, 2)"});
  }
  require_world_works();
}

TEST_CASE("ranks that give different dtypes get an error naming both, even a dtype the collective refuses") {
  const int r = world().rank(), n = world().size();
  const kiln::tensor x = r == 0 ? kiln::constant({true, false}) : kiln::constant({1.f, 2.f});
  if (n == 1) {
    require_throws<kiln::type_error>([&] { return kiln::all_reduce(x); }, {"kiln::all_reduce", "bool"});
  } else {
    // The agreement comes first, so rank 0's bool does not leave the others waiting.
    require_throws<kiln::invalid_argument_error>([&] { return kiln::all_reduce(x); },
                                                 {"kiln::all_reduce", "disagree", "of bool (2,)", "of float32 (2,)"});
  }
  require_world_works();
}

TEST_CASE("ranks at different collectives, or one that skipped a collective, get an error naming both") {
  const int r = world().rank(), n = world().size();
  const kiln::tensor x = kiln::ones({4});
  if (n == 1) {
    CHECK(kiln::all_gather(x).shape() == kiln::shape{4});
    return;
  }
  // Different kinds at the same point.
  require_throws<kiln::invalid_argument_error>(
      [&] { return r == 0 ? kiln::all_gather(x) : kiln::all_reduce(x); },
      {"disagree", "rank 0 gives all_gather", "all_reduce(sum) of float32 (4,)"});
  require_world_works();
  // Rank 0 skips an all_reduce of the same shape as the next: what it runs next comes
  // from another line of the program, which gives it away.
  auto step = [&] {
    if (r != 0) (void)kiln::all_reduce(x);
    return kiln::all_reduce(x);
  };
  require_throws<kiln::invalid_argument_error>(step, {"kiln::all_reduce", "disagree", "at line"});
  require_world_works();
}

TEST_CASE("a rank that never joins a collective is noticed when the group's timeout passes") {
  const int r = world().rank(), n = world().size();
  // A group of its own, so that the world stays usable: only rank 0 calls, and waits.
  const kiln::distribute::communicator group = world().split(0);
  group.set_timeout(std::chrono::milliseconds(1500));
  if (r == 0) {
    const auto start = std::chrono::steady_clock::now();
    if (n == 1) {
      CHECK(kiln::all_reduce(kiln::constant(1.f), kiln::reduce_op::sum, group).item<float>() == 1.f);
    } else {
      require_throws<kiln::unavailable_error>(
          [&] { return kiln::all_reduce(kiln::constant(1.f), kiln::reduce_op::sum, group); },
          {"kiln::all_reduce", "not every rank", "joined collective #0 within 1.5 s", "cannot run collectives any more"});
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      CHECK(waited >= 1.5);
      CHECK(waited < 30);
      // The group is broken: its next collective fails at once.
      require_throws<kiln::unavailable_error>([&] { return kiln::all_gather(kiln::ones({1}), group); },
                                              {"kiln::all_gather", "cannot run collectives any more", "timed out"});
    }
  }
  require_world_works();
}

TEST_CASE("a collective on a group this rank is not in is an error naming the group") {
  const int r = world().rank(), n = world().size();
  const kiln::distribute::communicator mine = world().split(r);  // a group of one per rank
  CHECK(mine.size() == 1);
  CHECK(kiln::all_reduce(kiln::constant(r), kiln::reduce_op::sum, mine).item<int>() == r);
  // A collective node whose group (from a saved graph) names ranks: only they run it.
  kiln::detail::collective_spec spec{kiln::detail::collective_kind::all_reduce, kiln::reduce_op::sum, 0, {n}, nullptr, 0, 0};
  const kiln::tensor one = kiln::constant(1.f);
  const kiln::tensor* in[] = {&one};
  require_throws<kiln::invalid_argument_error>(
      [&] { return (kiln::detail::collective_op(spec).run(in), 0); },
      {"kiln::distribute", "rank " + std::to_string(n), "not a rank of the world"});
  require_world_works();
}

// What the distributed tests share (one unity translation unit holds them all).
#pragma once

#include <kiln/distributed.hpp>

namespace kiln::testing {

/// Every rank of the job: one process when a test runs alone, N under mpirun.
inline const kiln::distribute::communicator& world() { return kiln::distribute::communicator::world(); }

}  // namespace kiln::testing

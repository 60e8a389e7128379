#pragma once
/// \file
/// Data-parallel training across processes: collectives
/// (`kiln::all_reduce`, `all_gather`, `broadcast`, `reduce_scatter`) eagerly and as graph
/// nodes, groups of ranks (`kiln::distribute::communicator`) and the strategy
/// `kiln::distribute::data_parallel`. One process per rank, started by an MPI launcher:
///
///     mpirun -np 4 ./train
///
/// \code
/// kiln::distribute::data_parallel strategy;
/// auto shard = kiln::data::dataset::range(1000).shard(strategy.size(), strategy.rank());
/// kiln::tensor total = kiln::all_reduce(kiln::constant(1.f));  // the number of ranks
/// \endcode
///
/// An optional part of kiln, outside kiln/kiln.hpp: it needs MPI (Open MPI, Debian's
/// `libopenmpi-dev`), and its CMake target is `kiln::distributed`. Without a launcher a
/// program is a world of one and does not start MPI: its collectives give their inputs
/// back and the strategy's optimizer is the optimizer itself. Tensors on the gpu travel
/// through host memory, or through NCCL in CUDA builds with `KILN_HAS_NCCL`
/// (kiln/distribute/nccl.hpp: compiled, not yet run on a GPU).
/// docs/distributed.md has the design: the agreement before each collective, the
/// timeout, the reduction order, the strategy, and a scaling model.

#include "kiln/kiln.hpp"
#include "kiln/exec/collective_op.hpp"
#include "kiln/distribute/runtime.hpp"
#include "kiln/distribute/communicator.hpp"
#include "kiln/distribute/nccl.hpp"
#include "kiln/distribute/collectives.hpp"
#include "kiln/train/replicas.hpp"
#include "kiln/distribute/data_parallel.hpp"

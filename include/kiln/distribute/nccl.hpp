#pragma once
/// \file
/// Collectives on device memory through NCCL, in CUDA builds that define
/// `KILN_HAS_NCCL` (CMake does for CUDA sources when it finds NCCL beside the CUDA
/// toolkit) and link `libnccl`. Elsewhere, and for what NCCL does not take here (an
/// integer mean, strings), device tensors travel through host memory and MPI.
///
/// Compiled, not yet run: this path waits for a GPU machine to be tested on
/// (docs/distributed.md, "NCCL and the GPU"). The agreement before each collective stays
/// on MPI; each group gets an NCCL communicator on first use, from an ncclUniqueId that
/// its rank 0 broadcasts over the group's MPI communicator; each rank uses the device
/// `local rank % device count`. NCCL's reduction order is its own (ring or tree, fixed
/// for a topology and a size), not the rank order of the MPI path.

#if KILN_HAS_NCCL && KILN_THRUST_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/distribute/runtime.hpp"
#include "kiln/exec/collective_op.hpp"

namespace kiln::distribute::detail {

inline void check_nccl(ncclResult_t status, const char* what) {
  if (status == ncclSuccess) return;
  throw unavailable_error(std::string("kiln::distribute: ") + what + " failed: " + ncclGetErrorString(status));
}
inline void check_device(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw unavailable_error(std::string("kiln::distribute: ") + what + " failed: " + cudaGetErrorString(status));
}

/// A group's NCCL communicator, destroyed with the group.
struct nccl_group {
  ncclComm_t comm = nullptr;
  ~nccl_group() {
    if (comm) (void)ncclCommDestroy(comm);
  }
};

/// The NCCL communicator of group `g`, made on first use by every rank of the group.
inline ncclComm_t nccl_comm_of(group_state& g) {
  if (g.nccl) return static_cast<nccl_group*>(g.nccl.get())->comm;
  int devices = 0;
  check_device(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices == 0) throw unavailable_error("kiln::distribute: a collective on gpu tensors, but no GPU is visible");
  int local = 0;
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(variable)) {
      local = std::atoi(v);
      break;
    }
  check_device(cudaSetDevice(local % devices), "cudaSetDevice");
  ncclUniqueId id{};
  if (g.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  runtime::check(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, g.comm), "MPI_Bcast");
  auto made = std::make_shared<nccl_group>();
  check_nccl(ncclCommInitRank(&made->comm, g.size, id, g.rank), "ncclCommInitRank");
  g.nccl = made;
  return made->comm;
}

/// NCCL's type for a dtype's elements (bool as bytes).
inline ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case int32: return ncclInt32;
    case int64: return ncclInt64;
    case float32: return ncclFloat32;
    case float64: return ncclFloat64;
    default: return ncclUint8;
  }
}
inline ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::mean: return ncclAvg;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    default: return ncclSum;
  }
}

/// Whether NCCL runs collective `s` on tensors of dtype `t` here.
inline bool nccl_takes(const kiln::detail::collective_spec& s, dtype t) {
  if (t == string) return false;
  if (s.op == reduce_op::mean && !is_floating(t)) return false;  // an integer mean truncates: the host path
  return true;
}

/// Runs collective `s` on device tensors `in` (agreed on by every rank), writing one
/// device tensor per result into `results`, whose shapes `shapes` gives.
inline void run_on_nccl(group_state& g, const kiln::detail::collective_spec& s, std::span<const tensor* const> in,
                        std::span<tensor> results, std::span<const std::pair<dtype, shape>> shapes) {
  using kiln::detail::collective_kind;
  ncclComm_t comm = nccl_comm_of(g);
  const cudaStream_t stream = cudaStreamPerThread;
  const dtype t = in[0]->dtype();
  for (std::size_t k = 0; k < results.size(); ++k) results[k] = tensor(shapes[k].first, shapes[k].second, device::gpu);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (std::size_t k = 0; k < in.size(); ++k) {
    const void* send = in[k]->raw_data();
    void* receive = results[k].raw_data();
    const auto count = std::size_t(in[k]->size());
    switch (s.kind) {
      case collective_kind::all_reduce:
        check_nccl(ncclAllReduce(send, receive, count, nccl_type(t), nccl_op(s.op), comm, stream), "ncclAllReduce");
        break;
      case collective_kind::all_gather:
        check_nccl(ncclAllGather(send, receive, count, nccl_type(t), comm, stream), "ncclAllGather");
        break;
      case collective_kind::broadcast:
        check_nccl(ncclBroadcast(send, receive, count, nccl_type(t), s.root, comm, stream), "ncclBroadcast");
        break;
      case collective_kind::reduce_scatter:
        check_nccl(ncclReduceScatter(send, receive, std::size_t(results[k].size()), nccl_type(t), nccl_op(s.op), comm,
                                     stream),
                   "ncclReduceScatter");
        break;
      case collective_kind::reduce:
        check_nccl(ncclReduce(send, receive, count, nccl_type(t), ncclSum, s.root, comm, stream), "ncclReduce");
        break;
    }
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  if (s.kind == collective_kind::reduce && g.rank != s.root)  // NCCL leaves the others' results unwritten
    for (tensor& r : results)
      check_device(cudaMemsetAsync(r.raw_data(), 0, std::size_t(r.size()) * size_of(t), stream), "cudaMemsetAsync");
  check_device(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace kiln::distribute::detail

#endif

#pragma once
/// \file
/// Where a tensor's buffer lives and its ops run.

#include <ostream>
#include <string_view>

namespace kiln {

/// The device of a tensor: `cpu` runs the xsimd kernels, `gpu` the Thrust kernels
/// (on CUDA when compiled by nvcc, on the host device system otherwise).
/// \code kiln::ones({2}).device() == kiln::device::cpu \endcode
enum class device : unsigned char { cpu, gpu };

constexpr std::string_view name(device d) { return d == device::cpu ? "cpu" : "gpu"; }
inline std::ostream& operator<<(std::ostream& os, device d) { return os << name(d); }

}  // namespace kiln

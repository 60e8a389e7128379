#pragma once
/// \file
/// `kiln::debugging::enable_check_numerics()`: while on, every op's float result is
/// scanned and the first op that produces a NaN or an Inf raises
/// kiln::invalid_argument_error naming it, eagerly and in graphs (which then run
/// node by node so that the op can be named). A debugging mode: each check reads
/// the whole result once more.

#include <atomic>
#include <cmath>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {
namespace detail {
/// Raises kiln::invalid_argument_error when the float tensor `result` of op `op`
/// holds a NaN or an Inf; `node` names the graph node, empty for an eager op.
KILN_LIBRARY_INLINE void check_numerics(std::string_view op, const tensor& result, std::string_view node = {});

}  // namespace detail

namespace debugging {
/// From now on, every op checks its float results and raises
/// kiln::invalid_argument_error naming the first op that produces a NaN or an Inf.
/// \code
/// kiln::debugging::enable_check_numerics();
/// kiln::log(kiln::constant(0.f));  // throws: "check_numerics: op log produced Inf ..."
/// \endcode
KILN_LIBRARY_INLINE void enable_check_numerics();
/// Turns the checks of enable_check_numerics() off again.
/// \code kiln::debugging::disable_check_numerics(); \endcode
KILN_LIBRARY_INLINE void disable_check_numerics();
/// Whether enable_check_numerics() is in effect.
/// \code kiln::debugging::check_numerics_enabled() == false  // unless enabled \endcode
KILN_LIBRARY_INLINE bool check_numerics_enabled();
}  // namespace debugging

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE void check_numerics(std::string_view op, const tensor& result, std::string_view node) {
  if (!is_floating(result.dtype()) || !result.defined() || result.is_symbolic() || result.size() == 0) return;
  const tensor host = result.to(kiln::device::cpu);
  bool nan = false, inf = false;
  auto scan = [&]<class T>(const T* p) {
    for (std::int64_t i = 0, n = host.size(); i < n && !nan; ++i) {
      nan = nan || std::isnan(p[i]);
      inf = inf || std::isinf(p[i]);
    }
  };
  if (result.dtype() == float32)
    scan(host.data<float>());
  else
    scan(host.data<double>());
  if (!nan && !inf) return;
  std::string where = "op " + std::string(op);
  if (!node.empty()) where += " (node " + std::string(node) + ")";
  throw invalid_argument_error("check_numerics: " + where + " produced " + (nan ? "NaN" : "Inf") + " in its " +
                               std::string(name(result.dtype())) + " " + result.shape().str() + " result");
}

}  // namespace kiln::detail

namespace kiln::debugging {

KILN_LIBRARY_INLINE void enable_check_numerics() { detail::hooks().check_numerics = &detail::check_numerics; }

KILN_LIBRARY_INLINE void disable_check_numerics() { detail::hooks().check_numerics = nullptr; }

KILN_LIBRARY_INLINE bool check_numerics_enabled() {
  return detail::hooks().check_numerics.load(std::memory_order_relaxed) != nullptr;
}

}  // namespace kiln::debugging
#endif  // KILN_DEFINE_LIBRARY

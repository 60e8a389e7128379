#pragma once
/// \file
/// The compile-time tier alone: `kiln::fixed`, its ops, `kiln::function` called with
/// `fixed` arguments, control flow, `kiln::fixed_variable` and `kiln::print` on typed
/// values. It compiles in a fraction of kiln/kiln.hpp's time (bench/compile_cost.md):
/// the runtime tier's graphs, executor and optimizer are left out, so a function
/// called with kiln::tensor arguments needs kiln/kiln.hpp. Both may be included in one
/// file, in either order.
/// \code
/// #include <kiln/fixed.hpp>
/// kiln::function dense([](const auto& x, const auto& w, const auto& b) { return kiln::tanh(kiln::matmul(x, w) + b); });
/// auto y = dense(kiln::fixed<float, 8, 64>::ones(), kiln::fixed<float, 64, 32>::ones(), kiln::fixed<float, 32>::zeros());
/// \endcode

#include "kiln/config.hpp"
#include "kiln/typed/fixed.hpp"
#include "kiln/typed/expr.hpp"
#include "kiln/typed/ops.hpp"
#include "kiln/typed/trace.hpp"
#include "kiln/typed/unfused_ops.hpp"
#include "kiln/typed/control_flow.hpp"
#include "kiln/typed/effects.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/typed/function_calls.hpp"

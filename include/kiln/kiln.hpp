#pragma once
/// \file
/// The umbrella header: `#include <kiln/kiln.hpp>` gives the whole public API.

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/print.hpp"

#include "kiln/ops/op.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/ops/factories.hpp"

#include "kiln/backend/backend.hpp"
#include "kiln/backend/reference/elementwise.hpp"
#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/backend/reference/reduction.hpp"
#include "kiln/backend/cpu/reduction.hpp"
#include "kiln/backend/reference/shape_ops.hpp"
#include "kiln/backend/cpu/shape_ops.hpp"
#include "kiln/backend/reference/linalg.hpp"
#include "kiln/backend/cpu/linalg.hpp"
#if KILN_HAS_THRUST
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/backend/thrust/elementwise.hpp"
#include "kiln/backend/thrust/reduction.hpp"
#include "kiln/backend/thrust/shape_ops.hpp"
#include "kiln/backend/thrust/linalg.hpp"
#endif

#include "kiln/eager/apply.hpp"
#include "kiln/eager/truth_value.hpp"

#include "kiln/graph/graph.hpp"
#include "kiln/trace/trace_context.hpp"
#include "kiln/exec/tile.hpp"
#include "kiln/exec/plan.hpp"
#include "kiln/exec/workspace.hpp"
#include "kiln/exec/executor.hpp"
#include "kiln/passes/optimize.hpp"
#include "kiln/trace/spec.hpp"
#include "kiln/trace/signature.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/kernels.hpp"

#pragma once
/// \file
/// The umbrella header: `#include <kiln/kiln.hpp>` gives the whole public API, its
/// layers included bottom-up: a folder's headers include only folders listed above it.

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/print.hpp"
#include "kiln/core/spec.hpp"
#include "kiln/core/hooks.hpp"

#include "kiln/ops/op.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/reduction.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/ops/linalg.hpp"
#include "kiln/ops/nn.hpp"
#include "kiln/ops/pooling.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/ops/tensor_array.hpp"
#include "kiln/ops/any_op.hpp"
#include "kiln/ops/op_table.hpp"

#include "kiln/backend/backend.hpp"
#include "kiln/backend/reference/elementwise.hpp"
#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/backend/reference/reduction.hpp"
#include "kiln/backend/cpu/reduction.hpp"
#include "kiln/backend/reference/shape_ops.hpp"
#include "kiln/backend/cpu/shape_ops.hpp"
#include "kiln/backend/reference/linalg.hpp"
#include "kiln/backend/cpu/linalg.hpp"
#include "kiln/backend/reference/pooling.hpp"
#include "kiln/backend/cpu/pooling.hpp"
#if KILN_HAS_THRUST
#include "kiln/backend/thrust/memory.hpp"
#include "kiln/backend/thrust/elementwise.hpp"
#include "kiln/backend/thrust/reduction.hpp"
#include "kiln/backend/thrust/shape_ops.hpp"
#include "kiln/backend/thrust/linalg.hpp"
#include "kiln/backend/thrust/pooling.hpp"
#endif

#include "kiln/eager/apply.hpp"
#include "kiln/eager/check_numerics.hpp"
#include "kiln/eager/truth_value.hpp"

#include "kiln/graph/graph.hpp"

#include "kiln/passes/optimize.hpp"

#include "kiln/exec/tile.hpp"
#include "kiln/exec/plan.hpp"
#include "kiln/exec/planner.hpp"
#include "kiln/exec/workspace.hpp"
#include "kiln/exec/executor.hpp"
#include "kiln/exec/effects.hpp"
#include "kiln/exec/control_flow.hpp"

#include "kiln/trace/trace_context.hpp"
#include "kiln/trace/signature.hpp"
#include "kiln/trace/function.hpp"
#include "kiln/trace/runtime_tier.hpp"
#include "kiln/trace/effects.hpp"
#include "kiln/trace/random.hpp"
#include "kiln/trace/control_flow.hpp"

#include "kiln/typed/fixed.hpp"
#include "kiln/typed/expr.hpp"
#include "kiln/typed/ops.hpp"
#include "kiln/typed/trace.hpp"
#include "kiln/typed/unfused_ops.hpp"
#include "kiln/typed/effects.hpp"
#include "kiln/typed/control_flow.hpp"
#include "kiln/typed/graph.hpp"
#include "kiln/typed/function_calls.hpp"

#include "kiln/autodiff/backward.hpp"
#include "kiln/autodiff/tape.hpp"
#include "kiln/autodiff/replay.hpp"
#include "kiln/autodiff/function_gradient.hpp"

#include "kiln/data/dataset.hpp"
#include "kiln/data/iterator.hpp"

#include "kiln/train/optimizers.hpp"

#include "kiln/models/initializers.hpp"
#include "kiln/models/losses.hpp"
#include "kiln/models/metrics.hpp"
#include "kiln/models/module.hpp"
#include "kiln/models/layers.hpp"
#include "kiln/models/fixed_layers.hpp"
#include "kiln/models/fit.hpp"

#include "kiln/separate_compilation.hpp"

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

#include "kiln/ops/op.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/shape_ops.hpp"
#include "kiln/ops/registry.hpp"

#include "kiln/backend/backend.hpp"
#include "kiln/backend/reference/elementwise.hpp"
#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/backend/reference/shape_ops.hpp"
#include "kiln/backend/cpu/shape_ops.hpp"

#include "kiln/eager/apply.hpp"

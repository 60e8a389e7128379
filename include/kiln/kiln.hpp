#pragma once
/// \file
/// The umbrella header: `#include <kiln/kiln.hpp>` gives the whole public API.

#include "kiln/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/parallel.hpp"

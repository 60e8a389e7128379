#pragma once
/// \file
/// Control flow: `kiln::cond`, `kiln::while_loop`,
/// `kiln::for_range` and `kiln::break_if`. Outside a trace they run as C++ control
/// flow on eager tensors; while tracing, branches, conditions and bodies are traced
/// once each into subgraphs of a `cond` or `while` node (kiln/exec/control_flow.hpp),
/// with the tensors they use from the enclosing trace passed in as captures.
///
/// Its parts, one concern each: kiln/trace/subgraph.hpp (the subgraph tracing both
/// share), kiln/trace/loop_state.hpp (break_if, loop_options, loop variables),
/// kiln/trace/cond.hpp, kiln/trace/while_loop.hpp and kiln/trace/for_range.hpp.

#include "kiln/trace/cond.hpp"
#include "kiln/trace/for_range.hpp"
#include "kiln/trace/loop_state.hpp"
#include "kiln/trace/subgraph.hpp"
#include "kiln/trace/while_loop.hpp"

#pragma once
/// \file
/// What a symbolic tensor points to: one value of a graph being traced.

#include <cstdint>
#include <string>

#include "kiln/config.hpp"

namespace kiln::detail {

/// The graph value a symbolic tensor stands for. `trace_id` names the trace that
/// made it, so a symbolic tensor that escapes its trace is recognised when it is
/// used elsewhere.
struct symbol {
  std::uint64_t trace_id = 0;
  int node = -1;
  /// TensorFlow's tensor name, `a:0` (the node's name and the output index), or only
  /// the node's name when `output` gives the index: a name of up to 15 characters
  /// stays in the string (no allocation per traced op), and `multiply_12345:0` is 16.
  std::string name;
  int output = -1;  ///< the output index that `name` leaves out, or -1: none
};

/// TensorFlow's name of the value a symbol stands for: `a:0`, `while:1`.
KILN_LIBRARY_INLINE std::string value_name(const symbol& s);

/// The name of the node a symbol stands for: `while` for `while:1`.
KILN_LIBRARY_INLINE std::string node_name(const symbol& s);

/// True when `a` and `b` stand for the same value of the same trace.
KILN_LIBRARY_INLINE bool same_value(const symbol& a, const symbol& b);

}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail {

KILN_LIBRARY_INLINE std::string value_name(const symbol& s) {
  return s.output < 0 ? s.name : s.name + ":" + std::to_string(s.output);
}

KILN_LIBRARY_INLINE std::string node_name(const symbol& s) {
  return s.output >= 0 ? s.name : s.name.substr(0, s.name.find(':'));
}

KILN_LIBRARY_INLINE bool same_value(const symbol& a, const symbol& b) {
  return a.trace_id == b.trace_id && a.node == b.node;
}

}  // namespace kiln::detail
#endif  // KILN_DEFINE_LIBRARY

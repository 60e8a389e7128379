#pragma once
/// \file
/// A graph of elementwise ops on one-element values, compiled to a flat list of
/// scalar calls over a register file. A loop whose condition and body are such
/// graphs (counters, accumulators, convergence tests) runs them with this instead of
/// an executor, whose per-run bookkeeping (finding the plan, leasing a workspace,
/// creating result tensors) costs several times a few scalar ops.

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "kiln/exec/tile.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/op_table.hpp"

namespace kiln::detail::exec {

/// One value of any non-string dtype.
struct scalar_value {
  alignas(8) unsigned char bytes[8];
};

class scalar_program {
 public:
  /// The program of `g`, or nothing when some node is not a placeholder, a constant,
  /// an output or an elementwise op of one element, or is an op whose value check its
  /// scalar function does not make (integer division by zero, negative powers: those
  /// it makes, raising the same error). A placeholder nothing reads may be of any
  /// dtype and shape (a loop's condition is given every loop variable, growing
  /// tensor_arrays among them, and may read only a counter).
  template <class = void>
  static std::optional<scalar_program> compile(const graph& g) {
    scalar_program p;
    const auto& nodes = g.nodes();
    std::vector<char> read(nodes.size(), 0);
    for (const node& n : nodes)
      for (int in : n.input_ids()) read[std::size_t(in)] = 1;
    for (int out : g.outputs()) read[std::size_t(out)] = 1;
    p.initial_.resize(nodes.size());
    // The register each node's value is read from: its own, or for an Identity its
    // input's (a copy of an 8-byte register just written with 4 bytes would stall on
    // store forwarding, and cost a quarter of a scalar loop).
    std::vector<int> source(nodes.size());
    for (std::size_t id = 0; id < nodes.size(); ++id) source[id] = int(id);
    for (std::size_t id = 0; id < nodes.size(); ++id) {
      const node& n = nodes[id];
      if (n.kind() == node_kind::placeholder && !read[id]) continue;
      if (n.dtype() == string || !n.shape().is_fully_defined() || n.shape().num_elements() != 1) return std::nullopt;
      switch (n.kind()) {
        case node_kind::placeholder:
          break;
        case node_kind::constant:
          if (n.value().device() != kiln::device::cpu) return std::nullopt;
          std::memcpy(p.initial_[id].bytes, n.value().raw_data(), size_of(n.dtype()));
          break;
        case node_kind::identity:
          source[id] = source[std::size_t(n.input_ids()[0])];
          break;
        case node_kind::op: {
          const std::span<const int> in = n.input_ids();
          const dtype operand = nodes[std::size_t(in[std::size_t(ops::value_operand_of(n.operation()))])].dtype();
          const op_entry e = entry_of(n.operation(), operand, n.dtype());
          // Elementwise value checks reject integer operands only (division by zero,
          // negative powers): on floats the op needs none.
          if (!e.scalar || (e.check && !is_floating(operand) && !e.scalar_checks) || in.size() > 3) return std::nullopt;
          instruction i{e.scalar, e.op, int(id), {-1, -1, -1}};
          for (std::size_t k = 0; k < in.size(); ++k) i.in[k] = source[std::size_t(in[k])];
          p.code_.push_back(i);
          break;
        }
        default:
          return std::nullopt;
      }
    }
    p.arguments_ = g.arguments();
    for (int a : p.arguments_) p.reads_.push_back(read[std::size_t(a)]);
    for (int out : g.outputs()) p.outputs_.push_back(source[std::size_t(out)]);
    return p;
  }

  /// A register file holding the program's constants, for run().
  std::vector<scalar_value> registers() const { return initial_; }
  /// The register of argument `k`.
  int argument(std::size_t k) const { return arguments_[k]; }
  /// Whether the program reads argument `k` (one it does not may be of any shape).
  bool reads(std::size_t k) const { return reads_[k] != 0; }
  /// The register of output `k`.
  int output(std::size_t k) const { return outputs_[k]; }

  /// Runs the program on `r`, whose argument registers are set.
  void run(std::vector<scalar_value>& r) const {
    for (const instruction& i : code_) {
      const void* const in[3] = {register_at(r, i.in[0]), register_at(r, i.in[1]), register_at(r, i.in[2])};
      i.fn(i.op, r[std::size_t(i.out)].bytes, in);
    }
  }

 private:
  struct instruction {
    scalar_fn fn;
    const void* op;  ///< the op object in the graph node
    int out;
    int in[3];
  };

  static const void* register_at(std::vector<scalar_value>& r, int k) { return k < 0 ? nullptr : r[std::size_t(k)].bytes; }

  std::vector<scalar_value> initial_;
  std::vector<instruction> code_;
  std::vector<int> arguments_, outputs_;
  std::vector<char> reads_;  ///< per argument: whether the program reads it
};

}  // namespace kiln::detail::exec

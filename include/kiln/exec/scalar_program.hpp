#pragma once
/// \file
/// A graph of elementwise ops on one-element values, compiled to a flat list of
/// scalar calls over a register file. A loop whose condition and body are such
/// graphs (counters, accumulators, convergence tests) runs them with this instead of
/// an executor, whose per-run bookkeeping (finding the plan, leasing a workspace,
/// creating result tensors) costs several times a few scalar ops. The graphs may also
/// grow, write and read vectors of such values, as a loop that records one value per
/// iteration in a tensor_array (a loop gradient's forward pass) and its backward loop
/// do: `pad_rows`, `set_item` and `gather` of one element, in place on arrays that
/// registers address.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "kiln/exec/tile.hpp"
#include "kiln/graph/graph.hpp"
#include "kiln/ops/op_table.hpp"
#include "kiln/ops/shape_ops.hpp"

namespace kiln::detail::exec {

/// One value of any non-string dtype, or the address of an array (a kiln::tensor).
struct scalar_value {
  alignas(8) unsigned char bytes[8];
};

class scalar_program {
 public:
  /// The program of `g`, or nothing when some node the outputs need is not a
  /// placeholder, a constant, an output, an elementwise op of one element, or one of
  /// the array ops below, or is an op whose value check its scalar function does not
  /// make (integer division by zero, negative powers: those it makes, raising the
  /// same error). Nodes the graph does not need are left out, as an executor's plan
  /// prunes them (a special op with effects is needed, and is never scalar). A
  /// placeholder nothing needed reads may be of any dtype and shape: a loop's
  /// condition is given every loop variable, growing tensor_arrays among them, and
  /// may read only a counter; the backward loop of a recurrence whose gradient needs
  /// none of its recorded values is given them all.
  ///
  /// Arrays are vectors (rank 1, not one element) of a non-string dtype, which a
  /// register addresses: placeholders; `pad_rows` and `set_item` of one, which write
  /// it in place, so that it must have no other reader; and `gather` of one element
  /// of one, on axis 0 at a scalar index.
  template <class = void>
  static std::optional<scalar_program> compile(const graph& g) {
    scalar_program p;
    const auto& nodes = g.nodes();
    const std::vector<char> needed = g.needed_nodes();
    auto vector = [](const node& n) {
      return n.dtype() != string && n.shape().has_known_rank() && n.shape().rank() == 1 &&
             !(n.shape().is_fully_defined() && n.shape().num_elements() == 1);
    };
    auto one_element = [](const node& n) {
      return n.dtype() != string && n.shape().is_fully_defined() && n.shape().num_elements() == 1;
    };
    // The register each node's value is read from: its own, or for an Identity its
    // input's (a copy of an 8-byte register just written with 4 bytes would stall on
    // store forwarding, and cost a quarter of a scalar loop), or for an array op that
    // writes in place the array's; whether that register addresses an array. And the
    // node whose value each node is (an Identity's input's), with how many needed
    // nodes and outputs read it: an array written in place must have one reader, the
    // op that writes it.
    std::vector<int> source(nodes.size()), value_of(nodes.size()), readers(nodes.size(), 0), written;
    std::vector<char> array(nodes.size(), 0), writes(nodes.size(), 0);
    p.initial_.resize(nodes.size());
    for (std::size_t id = 0; id < nodes.size(); ++id) {
      source[id] = value_of[id] = int(id);
      const node& n = nodes[id];
      if (!needed[id]) continue;  // an argument nothing reads, or a node no output needs
      const std::span<const int> in = n.input_ids();
      auto from = [&](std::size_t k) { return source[std::size_t(in[k])]; };
      if (n.kind() == node_kind::identity) value_of[id] = value_of[std::size_t(in[0])];
      else
        for (int k : in) ++readers[std::size_t(value_of[std::size_t(k)])];
      auto scalar = [&](std::size_t k) { return !array[std::size_t(from(k))] && one_element(nodes[std::size_t(in[k])]); };
      auto index = [&](std::size_t k) { return scalar(k) && is_integer(nodes[std::size_t(in[k])].dtype()); };
      switch (n.kind()) {
        case node_kind::identity:
          source[id] = from(0);
          continue;
        case node_kind::placeholder:
          array[id] = vector(n);
          if (!array[id] && !one_element(n)) return std::nullopt;
          continue;
        case node_kind::constant:
          if (!one_element(n) || n.value().device() != kiln::device::cpu) return std::nullopt;
          std::memcpy(p.initial_[id].bytes, n.value().raw_data(), size_of(n.dtype()));
          continue;
        case node_kind::op:
          break;
        default:
          return std::nullopt;
      }
      const std::size_t bytes = size_of(n.dtype());
      if (ops::holds_alternative<ops::gather>(n.operation())) {
        // One element on axis 0, at a scalar index (the executor's error names its shape).
        if (!array[std::size_t(from(0))] || !index(1) || !one_element(n) ||
            n.operation().unchecked<ops::gather>().axis != 0 || nodes[std::size_t(in[1])].shape().rank() != 0)
          return std::nullopt;
        p.code_.push_back({array_step<gather_step>(bytes, nodes[std::size_t(in[1])].dtype()), nullptr, int(id),
                           {from(0), from(1), -1}});
        continue;
      }
      const bool pad = ops::holds_alternative<ops::pad_rows>(n.operation());
      if (pad || ops::holds_alternative<ops::set_item>(n.operation())) {
        // Written in place: its array becomes the node's value.
        if (!array[std::size_t(from(0))] || !vector(n) || !index(1)) return std::nullopt;
        if (!pad && (!scalar(2) || nodes[std::size_t(in[2])].dtype() != n.dtype())) return std::nullopt;
        const dtype index_type = nodes[std::size_t(in[1])].dtype();
        p.code_.push_back({pad ? array_step<pad_rows_step>(bytes, index_type) : array_step<set_item_step>(bytes, index_type),
                           nullptr, from(0), {from(0), from(1), pad ? -1 : from(2)}});
        source[id] = from(0);
        writes[std::size_t(from(0))] = 1;
        written.push_back(value_of[std::size_t(in[0])]);
        continue;
      }
      if (!one_element(n)) return std::nullopt;
      const dtype operand = nodes[std::size_t(in[std::size_t(ops::value_operand_of(n.operation()))])].dtype();
      const op_entry e = entry_of(n.operation(), operand, n.dtype());
      // Elementwise value checks reject integer operands only (division by zero,
      // negative powers): on floats the op needs none.
      if (!e.scalar || (e.check && !is_floating(operand) && !e.scalar_checks) || in.size() > 3) return std::nullopt;
      instruction i{e.scalar, e.op, int(id), {-1, -1, -1}};
      for (std::size_t k = 0; k < in.size(); ++k) {
        if (!scalar(k)) return std::nullopt;
        i.in[k] = from(k);
      }
      p.code_.push_back(i);
    }
    for (int out : g.outputs()) ++readers[std::size_t(value_of[std::size_t(out)])];
    for (int v : written)
      if (readers[std::size_t(v)] != 1) return std::nullopt;
    p.arguments_ = g.arguments();
    for (int a : p.arguments_) {
      p.reads_.push_back(needed[std::size_t(a)]);
      p.argument_arrays_.push_back(array[std::size_t(a)]);
      p.writes_.push_back(writes[std::size_t(a)]);
    }
    for (int out : g.outputs()) {
      p.outputs_.push_back(source[std::size_t(out)]);
      p.output_arrays_.push_back(array[std::size_t(source[std::size_t(out)])]);
    }
    return p;
  }

  /// A register file holding the program's constants, for run().
  std::vector<scalar_value> registers() const { return initial_; }
  /// The register of argument `k`.
  int argument(std::size_t k) const { return arguments_[k]; }
  /// Whether the program reads argument `k` (one it does not may be of any shape).
  bool reads(std::size_t k) const { return reads_[k] != 0; }
  /// Whether argument `k` is an array (its register holds a tensor's address).
  bool argument_is_array(std::size_t k) const { return argument_arrays_[k] != 0; }
  /// Whether the program writes argument `k`, an array, in place.
  bool writes(std::size_t k) const { return writes_[k] != 0; }
  /// Whether the program writes some argument in place.
  bool writes_arguments() const { return std::find(writes_.begin(), writes_.end(), 1) != writes_.end(); }
  /// The register of output `k`.
  int output(std::size_t k) const { return outputs_[k]; }
  /// Whether output `k` is an array (its register holds a tensor's address).
  bool output_is_array(std::size_t k) const { return output_arrays_[k] != 0; }

  /// Whether `t` can be an array of a program: a vector of values on the CPU.
  static bool holds_array(const tensor& t) {
    return t.defined() && !t.is_symbolic() && t.device() == kiln::device::cpu && t.rank() == 1 && t.dtype() != string;
  }
  /// Whether `t` can live in a register: one element, on the CPU.
  static bool holds_scalar(const tensor& t) {
    return t.defined() && !t.is_symbolic() && t.device() == kiln::device::cpu && t.size() == 1;
  }
  /// Whether `t` can be argument `k`: anything when the program does not read it.
  bool accepts(std::size_t k, const tensor& t) const {
    return !reads(k) || (argument_is_array(k) ? holds_array(t) : holds_scalar(t));
  }
  /// Sets argument `k` in `r` to `t`, which it accepts: its value, or for an array its
  /// address (the program changes an array it writes: give it one the caller owns).
  void set_argument(std::size_t k, const tensor& t, std::vector<scalar_value>& r) const {
    if (!reads(k)) return;
    if (argument_is_array(k))
      set_address(r[std::size_t(arguments_[k])], t);
    else
      std::memcpy(r[std::size_t(arguments_[k])].bytes, t.raw_data(), size_of(t.dtype()));
  }
  /// Makes register `r` address array `t` (which a program may write in place).
  static void set_address(scalar_value& r, const tensor& t) {
    const tensor* p = &t;
    std::memcpy(r.bytes, &p, sizeof p);
  }
  /// The array register `r` addresses.
  static tensor& array_at(const scalar_value& r) {
    tensor* t;
    std::memcpy(&t, r.bytes, sizeof t);
    return *t;
  }

  /// Runs the program on `r`, whose arguments are set.
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

  // The array ops, as scalar functions on registers: in[0] addresses the array, in[1]
  // holds the index (or row count), in[2] set_item's value; gather writes `out`. Each
  // makes the executor's value check and raises its error. An array that another
  // tensor shares is copied before a write.
  struct pad_rows_step {
    template <std::size_t Bytes>
    static void run(tensor& a, std::int64_t rows, void*, const void*) {
      ops::check_pad_rows(rows, a.shape());
      if (rows > a.shape()[0]) a = ops::pad_rows::grow(std::move(a), rows);
    }
  };
  struct set_item_step {
    template <std::size_t Bytes>
    static void run(tensor& a, std::int64_t i, void*, const void* value) {
      ops::check_set_item_index(i, a.shape());
      if (!a.sole_owner()) {
        tensor own(a.dtype(), a.shape());
        std::memcpy(own.raw_data(), a.raw_data(), std::size_t(a.size()) * Bytes);
        a = std::move(own);
      }
      std::memcpy(static_cast<char*>(a.raw_data()) + std::size_t(i) * Bytes, value, Bytes);
    }
  };
  struct gather_step {
    template <std::size_t Bytes>
    static void run(tensor& a, std::int64_t i, void* out, const void*) {
      ops::check_gather_indices(&i, kiln::shape{}, 0, a.shape());
      std::memcpy(out, static_cast<const char*>(a.raw_data()) + std::size_t(i) * Bytes, Bytes);
    }
  };
  template <class Step, std::size_t Bytes, class Index>
  static void array_fn(const void*, void* out, const void* const* in) {
    Index i;
    std::memcpy(&i, in[1], sizeof i);
    Step::template run<Bytes>(array_at(*static_cast<const scalar_value*>(in[0])), std::int64_t(i), out, in[2]);
  }
  template <class Step, class Index>
  static scalar_fn array_fn_for(std::size_t bytes) {
    return bytes == 8 ? &array_fn<Step, 8, Index> : bytes == 4 ? &array_fn<Step, 4, Index> : &array_fn<Step, 1, Index>;
  }
  template <class Step>
  static scalar_fn array_step(std::size_t bytes, dtype index) {
    return index == int64 ? array_fn_for<Step, std::int64_t>(bytes) : array_fn_for<Step, std::int32_t>(bytes);
  }

  std::vector<scalar_value> initial_;
  std::vector<instruction> code_;
  std::vector<int> arguments_, outputs_;
  // Per argument: whether the program reads it, whether it is an array, whether the
  // program writes it in place; per output, whether it is an array.
  std::vector<char> reads_, argument_arrays_, writes_, output_arrays_;
};

}  // namespace kiln::detail::exec

#pragma once
/// \file
/// Folded arithmetic: `x * a + b` next to an elementwise op of a fused cluster runs in
/// that op's pass, on registers, instead of passes of its own over the tile. Every
/// part of the feature lives here: what a fold is (folded_arithmetic), which nodes of
/// a cluster fold (fold_arithmetic, called by the planner), how a tile computes it
/// (the compound kernels behind compound_fn) and how a native loop spells it
/// (scale_and_shift_source). Tiles and native loops both round through
/// scale_and_shift, so neither changes a bit of eager's results.

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/backend/cpu/elementwise.hpp"
#include "kiln/exec/node_map.hpp"

namespace kiln::detail::exec {

/// A scale or shift of folded_arithmetic: table entry `entry`, read as one broadcast
/// value or element by element, and negated when `negated`. Entry -1 is the identity:
/// 1 for a scale (-1 when negated), -0 for a shift (x + -0 is x for every x, -0 too).
struct fold_operand {
  int entry = -1;
  bool contiguous = false;
  bool negated = false;
};

/// Scalar arithmetic that runs in the pass of the op around it: the pass computes
/// post(op(pre(x))) with pre(x) = x * pre_scale + pre_shift (unary ops only) and
/// post(r) = r * scale + shift. Each product and sum is rounded on its own, as the
/// separate ops round them. Only unary ops read a contiguous scale or shift.
/// For example, `tanh(x * 0.5 + 1) * x - 0.25` is a tanh with pre 0.5, 1 and post scale x,
/// shift 0.25 negated.
struct folded_arithmetic {
  bool pre = false;
  fold_operand pre_scale, pre_shift, scale, shift;
};

/// Runs an elementwise op with folded arithmetic on `len` elements, a multiple of
/// padded_elements; `table` and `in` as for an instruction (kiln/exec/plan.hpp).
using compound_fn = void (*)(const void* op, unsigned contig, const folded_arithmetic& fold, void* out, void* const* table,
                             const int* in, std::int64_t len);

/// Whether a compiler barrier can keep a product in a register of its own: without it
/// GCC contracts `a * b + c` into one fused multiply-add, rounded once, and folded
/// arithmetic would no longer compute eager's bits.
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
inline constexpr bool can_fold_arithmetic = true;
#else
inline constexpr bool can_fold_arithmetic = false;
#endif

template <class B>
B rounded(B v) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(v.data));
#elif defined(__aarch64__)
  asm("" : "+w"(v.data));
#endif
  return v;
}

/// r * scale + shift, each rounded on its own: the one place folded arithmetic is
/// computed, in tiles and native loops.
template <class B>
B scale_and_shift(const B& r, const B& scale, const B& shift) {
  return ops::add{}(rounded(ops::multiply{}(r, scale)), shift);
}

/// A broadcast fold operand as a batch.
template <class T, class B = xsimd::batch<T>>
B fold_splat(const fold_operand& o, void* const* table, T identity) {
  if (o.entry < 0) return o.negated ? ops::negate{}(B(identity)) : B(identity);
  const B v(*static_cast<const T*>(table[o.entry]));
  return o.negated ? ops::negate{}(v) : v;
}

/// Where a compound kernel reads a fold operand's batch for element i (a batch_source),
/// negated when `negated`.
template <class T>
struct fold_source {
  using B = xsimd::batch<T>;
  backend::cpu::batch_source<T> source;
  bool negated;

  fold_source(const fold_operand& o, void* const* table, T identity)
      : source(o.contiguous ? static_cast<const T*>(table[o.entry]) : nullptr,
               o.contiguous ? B() : fold_splat<T>(o, table, identity)),
        negated(o.contiguous && o.negated) {}

  B operator[](std::int64_t i) const { return negated ? ops::negate{}(source[i]) : source[i]; }
};

// ---- Tiles: the compound kernels ----
// The operands' contiguity is read at run time (batch_source), not instantiated per
// combination.

// Without pre arithmetic, pre_scale and pre_shift are 1 and -0.0, which give every
// value back bit for bit: one loop per op and type rather than one with and one without.
template <class Op, class T>
KILN_FLATTEN void compound_unary(const Op& op, const folded_arithmetic& f, T* KILN_RESTRICT out, const T* x, void* const* table,
                                 std::int64_t len) {
  using B = xsimd::batch<T>;
  const T one = T(1), minus_zero = T(-0.0);
  const B pre_scale = fold_splat<T>(f.pre_scale, table, one), pre_shift = fold_splat<T>(f.pre_shift, table, minus_zero);
  const fold_source<T> scale(f.scale, table, one), shift(f.shift, table, minus_zero);
  for (std::int64_t i = 0; i < len; i += std::int64_t(B::size)) {
    const B v = scale_and_shift(B::load_unaligned(x + i), pre_scale, pre_shift);
    scale_and_shift(B(op(v)), scale[i], shift[i]).store_unaligned(out + i);
  }
}

template <class Op, class T>
KILN_FLATTEN void compound_binary(const Op& op, const folded_arithmetic& f, T* KILN_RESTRICT out, const T* a, const T* b,
                                  unsigned contig, void* const* table, std::int64_t len) {
  using B = xsimd::batch<T>;
  const B scale = fold_splat<T>(f.scale, table, T(1)), shift = fold_splat<T>(f.shift, table, T(-0.0));
  const backend::cpu::batch_source<T> first(a, (contig & 1u) != 0), second(b, (contig & 2u) != 0);
  for (std::int64_t i = 0; i < len; i += std::int64_t(B::size))
    scale_and_shift(op(first[i], second[i]), scale, shift).store_unaligned(out + i);
}

/// The compound_fn of an op with a SIMD kernel for T.
template <class Op, class T>
void run_compound(const void* p, unsigned contig, const folded_arithmetic& f, void* out, void* const* table, const int* in,
                  std::int64_t len) {
  const Op& op = *static_cast<const Op*>(p);
  T* o = static_cast<T*>(out);
  auto operand = [&](int k) { return static_cast<const T*>(table[in[k]]); };
  if constexpr (Op::arity == 1) {
    compound_unary(op, f, o, operand(0), table, len);
  } else {
    compound_binary(op, f, o, operand(0), operand(1), contig, table, len);
  }
}

// ---- Native loops: the same arithmetic as source text ----

/// `x * scale + shift` as a native loop's source, through scale_and_shift as the
/// compound kernels compute it; `operand(entry, contiguous)` names the register
/// holding a table entry.
/// For example `kiln::detail::exec::scale_and_shift(v0, s3, B(T(-0.0)))`.
template <class = void>
std::string scale_and_shift_source(const std::string& x, const fold_operand& scale, const fold_operand& shift,
                                   auto&& operand) {
  auto value = [&](const fold_operand& o, const char* identity) {
    const std::string v = o.entry < 0 ? std::string("B(T(") + identity + "))" : operand(o.entry, o.contiguous);
    return o.negated ? "kiln::ops::negate{}(" + v + ")" : v;
  };
  return "kiln::detail::exec::scale_and_shift(" + x + ", " + value(scale, "1") + ", " + value(shift, "-0.0") + ")";
}

// ---- Planning: which nodes fold ----

/// The folds of one cluster, by node: whether it was folded, and for an op that runs,
/// the value its pass reads instead of its input (pre), the value it defines (the
/// last of its post arithmetic), how many nodes it took in, and the folded
/// arithmetic, with node ids where the plan later puts table entries.
/// Indexed by the nodes of one cluster (local_ids: its members and their inputs).
struct folds {
  local_map<bool> folded;
  local_map<int> input, result, count;
  local_map<folded_arithmetic> arithmetic;
};

enum class folded_op { none, add, subtract, multiply };

/// Folds scalar arithmetic around the ops of a cluster of graph `g` whose members are
/// `members` (in graph order; `inside(v)` says whether value v is one of them).
/// `values[id]` gives a node's `type` and `dims`, `entries[id].compound` whether its op
/// has compound kernels, `in_memory[id]` whether its value must reach memory; `local`
/// numbers the members and their inputs. (`g` is generic so that native loops include
/// this file without kiln::graph.)
///
/// A node folds when its value is read once, by the op it folds into (or is produced
/// by it), and never reaches memory. Before a unary op: a product and a sum with
/// one-element operands. After any op: a product, then a sum, with one-element
/// operands, or after a unary op also with cluster-shaped operands computed before
/// it, since the folded pass runs at the op's place.
folds fold_arithmetic(const auto& g, const std::vector<int>& members, const auto& values, const auto& entries,
                      const node_map<bool>& in_memory, auto inside, const local_ids& local) {
  folds f{local_map<bool>(local, false), local_map<int>(local, -1), local_map<int>(local, -1), local_map<int>(local, 0),
          local_map<folded_arithmetic>(local)};
  if (!can_fold_arithmetic) return f;
  // Which arithmetic node `id` is, if it may be folded into an op of dtype `t`.
  auto arithmetic_of = [&](int id, dtype t) {
    if (values[id].type != t || !entries[id].compound) return folded_op::none;
    for (int in : g.node_at(id).input_ids())
      if (values[in].type != t) return folded_op::none;
    // Found by argument-dependent lookup: this header leaves kiln/graph/graph.hpp out,
    // so that a native loop's source includes no more than it needs.
    const auto& op = g.node_at(id).operation();
    if (holds_alternative<ops::add>(op)) return folded_op::add;
    if (holds_alternative<ops::subtract>(op)) return folded_op::subtract;
    if (holds_alternative<ops::multiply>(op)) return folded_op::multiply;
    return folded_op::none;
  };
  local_map<int> reads(local, 0), reader(local, -1), place(local, -1);
  for (std::size_t k = 0; k < members.size(); ++k) {
    place[members[k]] = int(k);
    for (int in : g.node_at(members[k]).input_ids()) {
      ++reads[in];
      reader[in] = members[k];
    }
  }
  auto read_once = [&](int v) { return inside(v) && !in_memory[v] && reads[v] == 1; };
  auto one_element = [&](int v) { return !inside(v) && values[v].dims.num_elements() == 1; };

  // Pre: the sum, then the product, that make a unary op's input.
  for (int u : members) {
    if (!entries[u].compound || g.node_at(u).input_ids().size() != 1) continue;
    const dtype t = values[u].type;
    folded_arithmetic& a = f.arithmetic[u];
    int x = g.node_at(u).input_ids()[0];
    for (bool shift_open = true; read_once(x) && !f.folded[x];) {
      const folded_op kind = arithmetic_of(x, t);
      if (kind == folded_op::none || (kind != folded_op::multiply && !shift_open)) break;
      const auto& in = g.node_at(x).input_ids();  // two operands: add, subtract and multiply are binary
      const int s = one_element(in[1]) ? 1 : one_element(in[0]) ? 0 : -1;
      if (s < 0) break;
      if (kind == folded_op::multiply) {
        a.pre_scale.entry = in[std::size_t(s)];
      } else {
        a.pre_shift = {in[std::size_t(s)], false, kind == folded_op::subtract && s == 1};
        a.pre_scale.negated = kind == folded_op::subtract && s == 0;  // s - v is (-v) + s
        shift_open = false;
      }
      a.pre = true;
      f.folded[x] = true;
      ++f.count[u];
      x = in[std::size_t(1 - s)];
      if (kind == folded_op::multiply) break;
    }
    if (a.pre) f.input[u] = x;
  }

  // Post: the product, then the sum, that the op's result goes through.
  for (int h : members) {
    if (f.folded[h] || !entries[h].compound) continue;
    const auto& hin = g.node_at(h).input_ids();
    const bool unary = hin.size() == 1;
    if (!unary && (hin.size() != 2 || (one_element(hin[0]) && one_element(hin[1])))) continue;
    const dtype t = values[h].type;
    folded_arithmetic& a = f.arithmetic[h];
    int v = h;
    bool scaled = false, shifted = false;
    while (read_once(v) && !shifted) {
      const int r = reader[v];
      const folded_op kind = arithmetic_of(r, t);
      if (kind == folded_op::none || f.folded[r] || (kind == folded_op::multiply && scaled)) break;
      const auto& in = g.node_at(r).input_ids();
      const int k = in[0] == v ? 1 : 0;  // the other operand
      const int o = in[std::size_t(k)];
      const bool contiguous = !one_element(o);
      if (contiguous && (!unary || (inside(o) && place[o] >= place[h]))) break;
      if (kind == folded_op::multiply) {
        a.scale = {o, contiguous, a.scale.negated};
        scaled = true;
      } else {
        a.shift = {o, contiguous, kind == folded_op::subtract && k == 1};
        if (kind == folded_op::subtract && k == 0) a.scale.negated = !a.scale.negated;  // o - v is (-v) + o
        shifted = true;
      }
      f.folded[r] = true;
      ++f.count[h];
      place[r] = place[h];
      v = r;
    }
    if (v != h) f.result[h] = v;
  }
  return f;
}

}  // namespace kiln::detail::exec

#pragma once
/// \file
/// The special ops that files and other runtimes know: the one list that kiln::save,
/// kiln::load, kiln::onnx and TensorBoard's graph look a special node up in. Each op says
/// itself how it is saved, rebuilt, lowered to ONNX or refused, and what TensorBoard
/// shows of it (the members kiln::special_op lists); a consumer finds the op's entry (by
/// the op's kind, or by the name its nodes take when it loads a file) and calls it, so no
/// consumer names an op. A new special op is its own file and one entry here; an op
/// missing here is refused by name ("cannot save yet", "has no ONNX operator").
/// An optional part's header: it includes the ops' headers that kiln/kiln.hpp does not.

#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include "kiln/exec/collective_op.hpp"  // (not in kiln.hpp: the optional kiln/distributed.hpp runs collectives)
#include "kiln/exec/summary_op.hpp"  // (not in kiln.hpp: the optional kiln/summary.hpp writes summaries)
#include "kiln/kiln.hpp"

namespace kiln::detail {

/// Every special op that a saved function, an ONNX model or TensorBoard's graph may meet.
using known_special_ops =
    boost::mp11::mp_list<read_variable_op, assign_variable_op, print_op, host_callback_op, cond_op, while_op,
                         random_uniform_op, summary_op, collective_op, reduce_dataset_op, iterator_get_next_op,
                         typed::described_op>;

/// A consumer's entry for one op of known_special_ops, and how to tell that op.
template <class Entry>
struct known_special_op {
  bool (*is)(const special_op& op);  ///< whether `op` is this kind of op
  Entry entry;
};

/// A consumer's entries: `Entry::template of<Op>()` for each op of known_special_ops, in
/// its order. Made on first use.
template <class Entry>
const std::vector<known_special_op<Entry>>& special_op_entries() {
  static const std::vector<known_special_op<Entry>> entries = [] {
    std::vector<known_special_op<Entry>> e;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          e.push_back({[](const special_op& op) { return op.as<Op>() != nullptr; }, Entry::template of<Op>()});
        });
    return e;
  }();
  return entries;
}

/// The entry of `op`'s kind, or null for a kind that known_special_ops does not list.
/// By kind rather than by name: a typed trace's graph describes its steps with the
/// runtime tier's names (typed::described_op).
template <class Entry>
const Entry* special_op_entry(const special_op& op) {
  for (const known_special_op<Entry>& k : special_op_entries<Entry>())
    if (k.is(op)) return &k.entry;
  return nullptr;
}

/// The entry of the op whose nodes take the name `name` (`Op::op_names()`), as a file
/// names it, or null for a name that no op of known_special_ops takes.
template <class Entry>
const Entry* special_op_entry(std::string_view name) {
  static const std::unordered_map<std::string_view, const Entry*> by_name = [] {
    std::unordered_map<std::string_view, const Entry*> t;
    std::size_t k = 0;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          for (std::string_view n : Op::op_names()) t.emplace(n, &special_op_entries<Entry>()[k].entry);
          ++k;
        });
    return t;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

}  // namespace kiln::detail

#pragma once
/// \file
/// The special ops that files and other runtimes know: the one list that kiln::save,
/// kiln::load and kiln::onnx look a special node up in, by the op names its nodes take.
/// Each op says itself how it is saved, rebuilt, lowered to ONNX or refused (the members
/// kiln::special_op lists); a consumer finds the op's entry by name and calls it, so no
/// consumer names an op. A new special op is its own file and one entry here; an op
/// missing here is refused by name ("cannot save yet", "has no ONNX operator").
/// An optional part's header: it includes the ops' headers that kiln/kiln.hpp does not.

#include <string_view>
#include <type_traits>
#include <unordered_map>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include "kiln/exec/collective_op.hpp"  // (not in kiln.hpp: the optional kiln/distributed.hpp runs collectives)
#include "kiln/exec/summary_op.hpp"  // (not in kiln.hpp: the optional kiln/summary.hpp writes summaries)
#include "kiln/kiln.hpp"

namespace kiln::detail {

/// Every special op that a saved function or an ONNX model may meet.
using known_special_ops = boost::mp11::mp_list<read_variable_op, assign_variable_op, print_op, host_callback_op,
                                               cond_op, while_op, random_uniform_op, summary_op, collective_op>;

/// A consumer's table of the known special ops: `Entry::template of<Op>()` for each op
/// of known_special_ops, under each name in `Op::op_names()`. Made on first use.
template <class Entry>
const std::unordered_map<std::string_view, Entry>& special_op_table() {
  static const std::unordered_map<std::string_view, Entry> table = [] {
    std::unordered_map<std::string_view, Entry> t;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, known_special_ops>>(
        [&]<class Op>(std::type_identity<Op>) {
          for (std::string_view name : Op::op_names()) t.emplace(name, Entry::template of<Op>());
        });
    return t;
  }();
  return table;
}

/// The entry of the special op named `name` in a consumer's table, or null for an op
/// that known_special_ops does not list.
template <class Entry>
const Entry* special_op_entry(std::string_view name) {
  const auto& table = special_op_table<Entry>();
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace kiln::detail

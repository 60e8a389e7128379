#pragma once
// A special op that no consumer of graphs knows (the io tests' stand-in for a new special
// op before its entry in kiln/io/special_ops.hpp), and a traced call of it.

#include <kiln/kiln.hpp>
#include <memory>
#include <span>
#include <string_view>

namespace special_ops_test {

// A special op that no consumer knows: what a new special op is before its list entry.
class doubling_op final : public kiln::special_op {
 public:
  doubling_op() : special_op(std::type_identity<doubling_op>()) {}
  std::string_view name() const { return "DoublingForTests"; }
  bool has_effects() const { return true; }  // so that a call under a tape replays its trace node by node
  kiln::tensor run(std::span<const kiln::tensor* const> in) const { return *in[0] * 2.f; }
};

kiln::tensor doubled(const kiln::tensor& x) {
  kiln::detail::trace_context* trace = kiln::detail::trace_context::current();
  if (!trace) return x * 2.f;
  const kiln::tensor inputs[] = {x};
  return trace->record_special(std::make_shared<doubling_op>(), inputs, {{x.dtype(), x.shape()}})[0];
}

}  // namespace special_ops_test

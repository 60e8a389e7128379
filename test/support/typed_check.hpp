#pragma once
// Helpers of the compile-time tier's tests: random `fixed` values made without kiln's
// kernels, and `check`, which runs one generic lambda on `fixed` values (eager and
// traced) and on kiln::tensors and compares.

#include "op_check.hpp"

namespace kiln::testing {

/// A `fixed` of type `X` from random_tensor's values.
template <class X>
X random_fixed(std::uint32_t seed, value_range range = value_range::any) {
  return X(random_tensor(X::dtype, X::shape(), seed, range));
}

/// `fn` on `args` as `fixed` values, traced with `fixed` arguments, and on tensors.
/// Eager ops give the tensor's bits. A fused trace may differ in the last bits: the
/// compiler may contract a multiply and an add into one fused multiply-add, as it
/// does in hand-written loops.
template <class Fn, class... X>
void check_both_tiers(Fn fn, const X&... args) {
  INFO("shapes " << (X::shape().str() + ...));
  const tensor expected = fn(tensor(args)...);
  require_same(tensor(fn(args...)), expected, 0);
  kiln::function traced(fn);
  const double contracted = expected.dtype() == float32 ? 1e-6 : 1e-14;
  require_same(tensor(traced(args...)), expected, contracted);
  require_same(tensor(traced(args...)), expected, contracted);  // the trace, run again
  REQUIRE(traced.tracing_count() == 1);
}

}  // namespace kiln::testing

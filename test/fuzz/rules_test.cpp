// Every op's dtype and shape rules against its kernels, on random inputs and
// attributes. A rule that rejects its inputs must make every backend raise the error
// the contract names for a running op (invalid_argument_error), and the same inputs
// traced must raise the tracing error (type_error for dtypes, value_error for shapes). A rule
// that accepts must lead, on every backend, to a result of the rule's dtype and
// shape that matches the reference backend's, or to an invalid_argument_error from a
// check of the input values (an index out of range) on every backend alike. Under
// AddressSanitizer (CI's sanitized build), where every buffer is allocated at its
// exact size (KILN_ADDRESS_SANITIZER), this also proves that no kernel reached
// through an accepting rule reads or writes outside its buffers.
//
// KILN_FUZZ_RULE_CASES sets the number of cases per op (default 2000) and
// KILN_FUZZ_FIRST_SEED the first seed; a failure prints the seed that reruns it.

#include "../support/op_check.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace kiln;
using kiln::testing::environment_number;

namespace {

/// Draws the random choices of one case.
struct chooser {
  std::mt19937 gen;
  explicit chooser(std::uint32_t seed) : gen(seed) {}
  /// A number in [0, n).
  int below(int n) { return int(gen() % std::uint32_t(n)); }
  /// A number in [low, high].
  std::int64_t between(std::int64_t low, std::int64_t high) { return low + std::int64_t(gen() % std::uint64_t(high - low + 1)); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen) < p; }

  dtype any_dtype() {
    static constexpr dtype all[] = {bool_, int32, int64, float32, float64, string};
    return all[below(6)];
  }
  /// Mostly int32 or int64, as indices are; sometimes not, which the rules must refuse.
  dtype index_dtype() { return chance(0.9) ? (chance(0.5) ? int32 : int64) : any_dtype(); }
  /// Mostly `like` (operands of one dtype), sometimes any.
  dtype dtype_like(dtype like) { return chance(0.85) ? like : any_dtype(); }

  std::int64_t dim() {
    static constexpr std::int64_t dims[] = {0, 1, 1, 2, 2, 3, 3, 4, 5};
    return dims[below(9)];
  }
  shape any_shape(int max_rank = 4) {
    shape s;
    for (int d = 0, rank = below(max_rank + 1); d < rank; ++d) s.push_back(dim());
    return s;
  }
  /// Mostly a shape that broadcasts with `base` (the same, without leading dims, or
  /// with 1s), sometimes any shape.
  shape shape_like(const shape& base) {
    switch (below(6)) {
      case 0:
      case 1:
      case 2: return base;
      case 3: return shape(base.dims().subspan(std::size_t(below(base.rank() + 1))));
      case 4: {
        shape s = base;
        if (s.rank() > 0) s[below(s.rank())] = 1;
        return s;
      }
      default: return any_shape();
    }
  }
  /// An axis for rank `rank`, sometimes out of range.
  std::int64_t axis(int rank) { return between(-rank - 1, rank); }
  int_list axes(int rank) {
    int_list a;
    for (int k = 0, n = below(4); k < n; ++k) a.push_back(axis(rank));
    return a;
  }
};

/// One op application: the op with its attributes, and its inputs' dtypes and shapes.
template <class Op>
struct op_case {
  Op op{};
  std::vector<dtype> dtypes;
  std::vector<shape> shapes;
  /// Inputs that are indices (drawn as small integers, some out of range).
  std::vector<bool> indices;

  void add(dtype t, shape s, bool is_index = false) {
    dtypes.push_back(t);
    shapes.push_back(std::move(s));
    indices.push_back(is_index);
  }
};

// What each op is given: `make_case(std::type_identity<Op>, chooser&)`, one overload per
// op or family. Shapes are drawn to satisfy the rule more often than not, so both
// sides of every rule are reached.

template <class Op>
  requires ops::elementwise<Op>
op_case<Op> make_case(std::type_identity<Op>, chooser& c) {
  op_case<Op> k;
  if constexpr (std::is_same_v<Op, ops::cast>) k.op = ops::cast(c.any_dtype());
  const dtype t = c.any_dtype();
  const shape base = c.any_shape();
  for (int i = 0; i < Op::arity; ++i) {
    // where's condition is bool
    const dtype ti = std::is_same_v<Op, ops::where> && i == 0 ? (c.chance(0.9) ? bool_ : c.any_dtype()) : c.dtype_like(t);
    k.add(ti, i == 0 ? base : c.shape_like(base));
  }
  return k;
}

op_case<ops::reshape> make_case(std::type_identity<ops::reshape>, chooser& c) {
  op_case<ops::reshape> k;
  const shape x = c.any_shape();
  k.add(c.any_dtype(), x);
  if (c.chance(0.6)) {  // the dims of x, shuffled, one maybe merged, split or inferred
    std::vector<std::int64_t> dims(x.begin(), x.end());
    std::shuffle(dims.begin(), dims.end(), c.gen);
    shape s(dims);
    if (s.rank() >= 2 && c.chance(0.3)) {
      const std::int64_t merged = s[0] * s[1];
      s = shape(s.dims().subspan(1));
      s[0] = merged;
    }
    if (s.rank() < max_rank && c.chance(0.2)) s.push_back(1);
    if (s.rank() > 0 && c.chance(0.3)) s[c.below(s.rank())] = -1;  // inferred
    k.op.new_shape = s;
  } else {
    shape s;
    for (int d = 0, rank = c.below(5); d < rank; ++d) s.push_back(c.chance(0.2) ? -1 : c.dim());
    k.op.new_shape = s;
  }
  return k;
}

op_case<ops::transpose> make_case(std::type_identity<ops::transpose>, chooser& c) {
  op_case<ops::transpose> k;
  const shape x = c.any_shape(5);
  k.add(c.any_dtype(), x);
  if (c.chance(0.6)) {
    std::vector<std::int64_t> p(std::size_t(x.rank()));
    for (int d = 0; d < x.rank(); ++d) p[std::size_t(d)] = d;
    std::shuffle(p.begin(), p.end(), c.gen);
    if (!p.empty() && c.chance(0.1)) p[0] = p.back();  // a repeat
    k.op.perm = int_list(std::span<const std::int64_t>(p));
  } else if (c.chance(0.3)) {
    k.op.perm = {};
  } else {
    k.op.perm = c.axes(x.rank());
  }
  return k;
}

/// concat and stack: one to four inputs of nearly one shape.
template <class Op>
  requires(std::is_same_v<Op, ops::concat> || std::is_same_v<Op, ops::stack>)
op_case<Op> make_case(std::type_identity<Op>, chooser& c) {
  op_case<Op> k;
  const shape base = c.any_shape();
  const dtype t = c.any_dtype();
  const std::int64_t axis = c.axis(base.rank() + (std::is_same_v<Op, ops::stack> ? 1 : 0));
  k.op.axis = axis;
  for (int i = 0, n = 1 + c.below(4); i < n; ++i) {
    shape s = base;
    const int a = ops::normalize_axis(axis, s.rank());
    if (std::is_same_v<Op, ops::concat> && a >= 0 && c.chance(0.6)) s[a] = c.dim();
    if (c.chance(0.1)) s = c.any_shape();
    k.add(c.dtype_like(t), s);
  }
  return k;
}

op_case<ops::gather> make_case(std::type_identity<ops::gather>, chooser& c) {
  op_case<ops::gather> k;
  const shape x = c.any_shape();
  k.op.axis = c.axis(x.rank());
  k.add(c.any_dtype(), x);
  k.add(c.index_dtype(), c.any_shape(2), true);
  return k;
}

op_case<ops::unsorted_segment_sum> make_case(std::type_identity<ops::unsorted_segment_sum>, chooser& c) {
  op_case<ops::unsorted_segment_sum> k;
  const shape data = c.any_shape();
  k.op.axis = c.between(-1, data.rank());
  k.op.num_segments = c.between(-1, 5);
  shape ids = c.any_shape(2);
  if (c.chance(0.7) && k.op.axis >= 0 && k.op.axis <= data.rank()) {
    const auto rest = data.dims().subspan(std::size_t(k.op.axis));
    ids = shape(rest.first(std::size_t(c.below(int(rest.size()) + 1))));
  }
  k.add(c.any_dtype(), data);
  k.add(c.index_dtype(), ids, true);
  return k;
}

op_case<ops::index> make_case(std::type_identity<ops::index>, chooser& c) {
  op_case<ops::index> k;
  k.add(c.any_dtype(), c.any_shape());
  k.op.i = c.between(-6, 6);
  return k;
}

op_case<ops::slice> make_case(std::type_identity<ops::slice>, chooser& c) {
  op_case<ops::slice> k;
  const shape x = c.any_shape();
  k.add(c.any_dtype(), x);
  const int rank = c.chance(0.9) ? x.rank() : c.below(5);
  for (int d = 0; d < rank; ++d) {
    const std::int64_t dim = d < x.rank() ? x[d] : 3;
    const std::int64_t begin = c.between(-1, dim + 1);
    k.op.begin.push_back(begin);
    k.op.size.push_back(c.chance(0.25) ? -1 : c.between(-2, dim - begin + 1));
  }
  if (c.chance(0.05)) k.op.size.push_back(1);  // lists of different lengths
  return k;
}

op_case<ops::shape_of> make_case(std::type_identity<ops::shape_of>, chooser& c) {
  op_case<ops::shape_of> k;
  k.add(c.any_dtype(), c.any_shape());
  return k;
}

op_case<ops::set_item> make_case(std::type_identity<ops::set_item>, chooser& c) {
  op_case<ops::set_item> k;
  const shape x = c.any_shape();
  const dtype t = c.any_dtype();
  k.add(t, x);
  k.add(c.index_dtype(), c.chance(0.9) ? shape{} : c.any_shape(2), true);
  k.add(c.dtype_like(t), c.chance(0.8) && x.rank() > 0 ? shape(x.dims().subspan(1)) : c.any_shape());
  return k;
}

op_case<ops::crop_or_pad> make_case(std::type_identity<ops::crop_or_pad>, chooser& c) {
  const shape x = c.any_shape();
  const int rank = x.has_known_rank() ? x.rank() : int(c.below(4));
  op_case<ops::crop_or_pad> k;
  for (int d = 0; d < rank; ++d) {
    k.op.offset.push_back(std::int64_t(c.below(7)) - 3);
    k.op.align.push_back(c.chance(0.95) ? std::int64_t(c.below(2)) : 2);
  }
  if (c.chance(0.05)) k.op.align.push_back(0);
  k.add(c.any_dtype(), x);
  k.add(c.any_dtype(), c.chance(0.9) ? c.any_shape(rank) : c.any_shape());
  return k;
}

op_case<ops::pad_rows> make_case(std::type_identity<ops::pad_rows>, chooser& c) {
  op_case<ops::pad_rows> k;
  k.add(c.any_dtype(), c.any_shape());
  k.add(c.index_dtype(), c.chance(0.9) ? shape{} : c.any_shape(2), true);
  return k;
}

template <class Op>
  requires std::derived_from<Op, ops::reduction_op>
op_case<Op> make_case(std::type_identity<Op>, chooser& c) {
  op_case<Op> k;
  const shape x = c.any_shape();
  k.add(c.any_dtype(), x);
  k.op = Op(c.chance(0.25) ? reduction_axes() : reduction_axes(c.axes(x.rank())), c.chance(0.5));
  return k;
}

op_case<ops::matmul> make_case(std::type_identity<ops::matmul>, chooser& c) {
  op_case<ops::matmul> k;
  const dtype t = c.any_dtype();
  if (c.chance(0.8)) {
    const shape batch = c.any_shape(2);
    const std::int64_t m = c.dim(), inner = c.dim(), n = c.dim();
    shape a = batch, b = c.shape_like(batch);
    a.push_back(m), a.push_back(inner);
    b.push_back(c.chance(0.9) ? inner : c.dim()), b.push_back(n);
    k.add(t, a);
    k.add(c.dtype_like(t), b);
  } else {
    k.add(t, c.any_shape());
    k.add(c.dtype_like(t), c.any_shape());
  }
  return k;
}

op_case<ops::conv2d> make_case(std::type_identity<ops::conv2d>, chooser& c) {
  op_case<ops::conv2d> k;
  const dtype t = c.any_dtype();
  k.op.stride_h = c.between(0, 3);
  k.op.stride_w = c.between(0, 3);
  k.op.pad = c.chance(0.5) ? ops::padding::valid : ops::padding::same;
  if (c.chance(0.8)) {
    const std::int64_t channels = c.between(0, 3);
    k.add(t, shape{c.between(0, 2), c.between(0, 6), c.between(0, 6), channels});
    k.add(c.dtype_like(t), shape{c.between(1, 4), c.between(1, 4), c.chance(0.9) ? channels : c.dim(), c.between(0, 3)});
  } else {
    k.add(t, c.any_shape(5));
    k.add(c.dtype_like(t), c.any_shape(5));
  }
  return k;
}

/// The pooling ops and their gradients' ops: windows and strides from 0 (refused) to
/// 3 over small NHWC images; a gradient operand mostly of the shape the rule wants.
template <class Op>
  requires std::derived_from<Op, ops::pool_window>
op_case<Op> make_case(std::type_identity<Op>, chooser& c) {
  op_case<Op> k;
  const dtype t = c.chance(0.8) ? (c.chance(0.5) ? float32 : float64) : c.any_dtype();
  k.op.window_h = c.between(0, 3);
  k.op.window_w = c.between(0, 3);
  k.op.stride_h = c.between(0, 3);
  k.op.stride_w = c.between(0, 3);
  k.op.pad = c.chance(0.5) ? ops::padding::valid : ops::padding::same;
  const shape x = c.chance(0.85) ? shape{c.between(0, 2), c.between(0, 6), c.between(0, 6), c.between(0, 3)} : c.any_shape(5);
  k.add(t, x);
  if constexpr (Op::arity == 2) {
    shape second = x;
    const shape_result pooled = k.op.pooled_shape(x);
    if (!std::is_same_v<Op, ops::max_pool_grad_grad> && pooled.ok() && pooled.value.has_known_rank()) second = pooled.value;
    if (c.chance(0.1)) second = c.any_shape(5);
    k.add(c.dtype_like(t), second);
  }
  return k;
}

/// How a run ended: with a value, or with which kind of kiln error.
struct outcome {
  std::string kind;  // "value", "type_error", "value_error", "invalid_argument_error", or what else
  tensor value;
  std::string message;
};

template <class B, class Op>
outcome run_catching(const Op& op, const std::vector<tensor>& inputs) {
  std::vector<const tensor*> ptrs;
  for (const tensor& t : inputs) ptrs.push_back(&t);
  try {
    return {"value", detail::run_on<B>(op, std::span<const tensor* const>(ptrs)), ""};
  } catch (const type_error& e) {
    return {"type_error", {}, e.what()};
  } catch (const invalid_argument_error& e) {
    return {"invalid_argument_error", {}, e.what()};
  } catch (const value_error& e) {
    return {"value_error", {}, e.what()};
  } catch (const std::exception& e) {
    return {"unexpected exception", {}, e.what()};
  }
}

/// Tallies per op, so that a generator that stopped reaching one side of a rule fails.
struct tally {
  int accepted = 0, produced = 0, rejected = 0;
};

template <class Op>
void check_rules_of(std::uint32_t first_seed, std::int64_t cases, tally& counts) {
  for (std::int64_t n = 0; n < cases; ++n) {
    const std::uint32_t seed = first_seed + std::uint32_t(n);
    chooser c(seed * 2654435761u ^ std::uint32_t(std::hash<std::string_view>{}(Op::name)));
    const op_case<Op> k = make_case(std::type_identity<Op>{}, c);

    std::vector<tensor> inputs;
    for (std::size_t i = 0; i < k.dtypes.size(); ++i) {
      if (k.indices[i] && is_integer(k.dtypes[i])) {
        inputs.push_back(kiln::testing::random_tensor(k.dtypes[i], k.shapes[i], seed + std::uint32_t(i)));
        // indices in [-2, 6]: mostly in range of the small dims drawn, some not
        visit_dtype(k.dtypes[i], [&]<class T>() {
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            T* p = inputs.back().view().template as<T>();
            for (std::int64_t e = 0; e < inputs.back().size(); ++e) p[e] = T(c.between(-2, 6));
          }
        });
      } else {
        const auto range = c.chance(0.5) ? kiln::testing::value_range::nonzero : kiln::testing::value_range::any;
        inputs.push_back(kiln::testing::random_tensor(k.dtypes[i], k.shapes[i], seed + std::uint32_t(i), range));
      }
    }

    // What the rules say, called directly.
    std::string expected = "value";
    shape rule_shape;
    if (const dtype_result dt = k.op.result_dtype(k.dtypes); !dt.ok()) {
      expected = "type_error";
    } else {
      try {
        const shape_result sh = k.op.result_shape(k.shapes);
        if (!sh.ok() || !sh.value.count_fits()) expected = "value_error";
        rule_shape = sh.value;
      } catch (const value_error&) {
        expected = "value_error";
      }
    }

    std::string inputs_text;
    for (const tensor& t : inputs) inputs_text += " " + kiln::testing::describe(t) + ";";
    INFO(Op::name << " seed " << seed << " (KILN_FUZZ_FIRST_SEED=" << seed << " KILN_FUZZ_RULE_CASES=1 reruns it)"
                  << ", inputs" << inputs_text);
    const outcome reference = run_catching<backend::reference_backend>(k.op, inputs);
    INFO("reference: " << reference.kind << " " << reference.message);
    if (expected == "value") {
      ++counts.accepted;
      // An accepting rule leaves only the value checks to fail.
      REQUIRE((reference.kind == "value" || reference.kind == "invalid_argument_error"));
      if (reference.kind == "value") {
        ++counts.produced;
        REQUIRE(reference.value.dtype() == k.op.result_dtype(k.dtypes).value);
        INFO("rule's shape " << rule_shape << ", result's " << reference.value.shape());
        REQUIRE(rule_shape.accepts(reference.value.shape()));  // where the rule knows the dims
      }
    } else {
      ++counts.rejected;
      // Running, TensorFlow's InvalidArgumentError; recorded into a trace, its
      // TypeError or ValueError.
      REQUIRE(reference.kind == "invalid_argument_error");
      std::vector<const tensor*> ptrs;
      for (const tensor& t : inputs) ptrs.push_back(&t);
      std::string traced = "none";
      try {
        (void)detail::infer(k.op, std::span<const tensor* const>(ptrs), detail::rule_errors::trace);
      } catch (const type_error&) {
        traced = "type_error";
      } catch (const value_error&) {
        traced = "value_error";
      }
      REQUIRE(traced == expected);
    }

    const auto same_as_reference = [&](const outcome& got) {
      INFO("got: " << got.kind << " " << got.message);
      REQUIRE(got.kind == reference.kind);
      // float32 sums of a few hundred elements in another order, and SIMD exp, log, tanh
      if (got.kind == "value") kiln::testing::require_same(got.value, reference.value, 1e-4);
    };
    {
      INFO("backend cpu");
      same_as_reference(run_catching<backend::cpu_backend>(k.op, inputs));
    }
#if KILN_HAS_THRUST
    if constexpr (backend::supports<backend::thrust_backend, Op>) {
      if (const auto on_gpu = kiln::testing::copies_on_gpu(inputs)) {
        INFO("backend thrust");
        outcome got = run_catching<backend::thrust_backend>(k.op, *on_gpu);
        if (got.kind == "value") got.value = got.value.to(device::cpu);
        same_as_reference(got);
      }
    }
#endif
  }
}

template <class... Ops>
void check_rules(boost::mp11::mp_list<Ops...>) {
  const auto first = std::uint32_t(environment_number("KILN_FUZZ_FIRST_SEED", 1));
  const std::int64_t cases = environment_number("KILN_FUZZ_RULE_CASES", 2000);
  std::map<std::string_view, tally> counts;
  (check_rules_of<Ops>(first, cases, counts[Ops::name]), ...);
  if (cases < 100) return;  // a rerun of a few seeds proves nothing about coverage
  for (const auto& [op, n] : counts) {
    INFO(op << ": " << n.accepted << " accepted (" << n.produced << " with a value), " << n.rejected << " rejected");
    CHECK(n.produced > cases / 20);
    if (op != ops::shape_of::name) CHECK(n.rejected > cases / 20);  // shape_of takes anything
  }
}

}  // namespace

TEST_CASE("every op's rules agree with its kernels on random shapes, dtypes and attributes", "[fuzz]") {
  check_rules(ops::all_ops{});
}

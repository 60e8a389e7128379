#pragma once
/// \file
/// The one op list: every op type of kiln::ops, one entry each, as X-macros that the
/// code which must name every op expands instead of repeating the names. The
/// elementwise ops with a public function of their own are entries `F(public_name, op)`,
/// and from them come the op families `F(op)` below, the public functions of both tiers
/// (on kiln::tensor: kiln/ops/elementwise.hpp and kiln/ops/activations.hpp; on typed
/// operands: kiln/typed/ops.hpp) and their operators. The families give the registry's
/// type lists (kiln/ops/registry.hpp), the kernels a compiled library instantiates
/// (kiln/separate_compilation.hpp), and the files cmake/kiln_library.cmake compiles them in. A test
/// of the ops folder fails when the CMake file's families drift from these, and the
/// fuzzer's programs (test/fuzz/program.hpp) fail to compile when an op listed here is
/// neither one of their steps nor one they name as left out.
///
/// A new elementwise op is its struct in kiln::ops (its name, its ONNX name when it is
/// one ONNX operator, its rules, functor and gradient), one entry in one list here (and
/// in KILN_OPERATORS if it has an operator), and its line in the fuzzer's programs.
/// Ops with attributes (`cast`, `gelu`, `elu`, `leaky_relu`) and `where` have
/// hand-written functions, which take more than operands.

/// The elementwise ops of kiln/ops/elementwise.hpp whose function takes one operand:
/// `F(public_name, op)`, the function `kiln::public_name(x)` in both tiers running
/// `kiln::ops::op`.
///
/// | function | computes |
/// |---|---|
/// | `negative(x)`, also `-x` | elementwise negation |
/// | `abs(x)` | absolute value |
/// | `exp(x)` | e to the x, for floats |
/// | `log(x)` | natural logarithm, for floats |
/// | `sqrt(x)` | square root, for floats |
/// | `square(x)` | `x * x` |
/// | `tanh(x)` | hyperbolic tangent, for floats |
/// | `sigmoid(x)` | `1 / (1 + exp(-x))`, for floats |
/// | `relu(x)` | `maximum(x, 0)` |
/// | `logical_not(b)` | negation of a bool tensor |
///
/// \code
/// const kiln::tensor x = kiln::constant({-1.f, 4.f});
/// const kiln::tensor y = kiln::sqrt(kiln::abs(x));  // [1 2]
/// const auto z = kiln::relu(-kiln::fixed<float, 2>{1.f, -2.f});  // [0 2]
/// \endcode
#define KILN_MATH_UNARY_FUNCTIONS(F)                                                                             \
  F(negative, negate) F(abs, abs) F(exp, exp) F(log, log) F(sqrt, sqrt) F(square, square) F(tanh, tanh)        \
  F(sigmoid, sigmoid) F(relu, relu) F(logical_not, logical_not)

/// The activations of kiln/ops/activations.hpp whose function takes one operand, for
/// floats: `F(public_name, op)` as KILN_MATH_UNARY_FUNCTIONS.
///
/// | function | computes |
/// |---|---|
/// | `erf(x)` | the Gauss error function (`tf.math.erf`) |
/// | `softplus(x)` | `log(exp(x) + 1)`, without overflow |
/// | `silu(x)` | `x * sigmoid(x)` (swish) |
///
/// \code
/// const kiln::tensor y = kiln::softplus(kiln::constant({0.f}));  // [0.693147]
/// \endcode
#define KILN_ACTIVATION_FUNCTIONS(F) F(erf, erf) F(softplus, softplus) F(silu, silu)

/// Every elementwise op whose function takes one operand.
#define KILN_UNARY_FUNCTIONS(F) KILN_MATH_UNARY_FUNCTIONS(F) KILN_ACTIVATION_FUNCTIONS(F)

/// The elementwise ops whose function takes two operands: `F(public_name, op)`, the
/// function `kiln::public_name(x, y)` in both tiers running `kiln::ops::op`, operands
/// broadcast together; a C++ scalar on either side takes the other operand's dtype.
///
/// | function | computes |
/// |---|---|
/// | `add(x, y)`, also `x + y` | sum; concatenates string tensors |
/// | `subtract(x, y)`, also `x - y` | difference |
/// | `multiply(x, y)`, also `x * y` | product |
/// | `divide(x, y)`, also `x / y` | true division (integers give float64) |
/// | `floordiv(x, y)` | division rounding down: `floordiv(7, -2)` is -4 |
/// | `floormod(x, y)`, also `x % y` | the remainder, with the divisor's sign |
/// | `pow(x, y)` | x to the power y |
/// | `maximum(x, y)`, `minimum(x, y)` | the larger, the smaller value |
/// | `equal(x, y)`, also `x == y`; `not_equal`, `!=` | comparison, giving bools |
/// | `less`, `<`; `less_equal`, `<=`; `greater`, `>`; `greater_equal`, `>=` | comparison, giving bools |
/// | `logical_and(a, b)`, `logical_or(a, b)` | on bool tensors |
///
/// \code
/// const kiln::tensor x = kiln::constant({7, -7});
/// const kiln::tensor q = kiln::floordiv(x, 2), r = x % 2;  // [3 -4], [1 1]
/// const kiln::tensor m = kiln::maximum(x, 0);               // [7 0]
/// const auto s = kiln::pow(kiln::fixed<double, 2>{2.0, 3.0}, 2.0);  // [4 9]
/// \endcode
#define KILN_BINARY_FUNCTIONS(F)                                                                                 \
  F(add, add) F(subtract, subtract) F(multiply, multiply) F(divide, divide) F(floordiv, floordiv)              \
  F(floormod, floormod) F(pow, pow) F(maximum, maximum) F(minimum, minimum) F(equal, equal)                    \
  F(not_equal, not_equal) F(less, less) F(less_equal, less_equal) F(greater, greater)                          \
  F(greater_equal, greater_equal) F(logical_and, logical_and) F(logical_or, logical_or)

/// The binary operators of both tiers, `F(symbol, public_name)`: `x symbol y` is
/// `kiln::public_name(x, y)`, with a C++ scalar on either side (unary `-x` is
/// `kiln::negative(x)`).
/// \code
/// const kiln::tensor x = kiln::constant({1.f, 2.f});
/// const kiln::tensor y = (x * 2.f + 1.f) / x;                     // [3 2.5]
/// const auto b = kiln::fixed<int, 2>{1, 2} >= kiln::fixed<int, 2>{2, 2};  // [false true]
/// \endcode
#define KILN_OPERATORS(F)                                                                                        \
  F(+, add) F(-, subtract) F(*, multiply) F(/, divide) F(%, floormod) F(==, equal) F(!=, not_equal) F(<, less)  \
  F(<=, less_equal) F(>, greater) F(>=, greater_equal)

// `F(op)` for each entry `F(public_name, op)` of a function list: the list is expanded
// with `F KILN_DETAIL_OP_OF` for its `F`, which leaves `F (op)`, called once the
// expansion is rescanned.
#define KILN_DETAIL_OP_OF(public_name, op) (op)
#define KILN_DETAIL_RESCAN(...) __VA_ARGS__
#define KILN_DETAIL_OPS_OF(FUNCTIONS, F) KILN_DETAIL_RESCAN(FUNCTIONS(F KILN_DETAIL_OP_OF))

// The op families: `F(op)` once per op type of kiln::ops, for code that must name every
// op (kiln/separate_compilation.hpp declares and instantiates each op's kernels family by family).

/// The elementwise ops with one input (`cast` included).
#define KILN_UNARY_OPS(F) \
  KILN_DETAIL_OPS_OF(KILN_UNARY_FUNCTIONS, F) F(cast) F(gelu) F(elu) F(leaky_relu)
/// The elementwise ops with two or three inputs.
#define KILN_BINARY_OPS(F) KILN_DETAIL_OPS_OF(KILN_BINARY_FUNCTIONS, F) F(where) F(relu_grad)
/// The shape ops.
#define KILN_SHAPE_OPS(F)                                                                                        \
  F(reshape) F(transpose) F(concat) F(stack) F(gather) F(unsorted_segment_sum) F(index) F(slice) F(shape_of)     \
  F(set_item) F(pad_rows) F(crop_or_pad)
/// The reductions.
#define KILN_REDUCTION_OPS(F) F(reduce_sum) F(reduce_mean) F(reduce_max) F(reduce_min) F(argmax)
/// Linear algebra and NN ops: products, convolution, pooling and the ops pooling's
/// gradients run.
#define KILN_LINALG_OPS(F) \
  F(matmul) F(conv2d) F(max_pool) F(avg_pool) F(max_pool_grad) F(max_pool_grad_grad) F(avg_pool_grad)
/// Every op kiln defines.
#define KILN_ALL_OPS(F) KILN_UNARY_OPS(F) KILN_BINARY_OPS(F) KILN_SHAPE_OPS(F) KILN_REDUCTION_OPS(F) KILN_LINALG_OPS(F)

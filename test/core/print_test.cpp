// Printing tensors: `operator<<` against TensorFlow's eager print (values as NumPy's
// str() writes them), and detail::format_values against tf.print. Every expected
// string is written by hand from those formats (the NumPy ones were checked against
// NumPy 1.24 itself).

#include "../support/op_check.hpp"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string printed(const kiln::tensor& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

template <class T>
kiln::tensor iota(const kiln::shape& s) {
  std::vector<T> v(static_cast<std::size_t>(s.num_elements()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = T(i);
  return kiln::constant(v, s);
}

// A symbolic tensor, as the tracer makes them, standing for graph value `name`.
kiln::tensor symbolic(kiln::dtype t, const kiln::shape& s, std::string name = "x:0") {
  return kiln::tensor(t, s, std::make_shared<const kiln::detail::symbol>(kiln::detail::symbol{1, 0, std::move(name)}));
}

// One printing case: a tensor and what `operator<<` writes for it.
struct print_case {
  kiln::tensor x;
  std::string expected;
};

void check_printed(std::initializer_list<print_case> cases) {
  for (const print_case& c : cases) CHECK(printed(c.x) == c.expected);
}

// One tf.print case: a tensor, the layout and what format_values writes for it.
struct values_case {
  kiln::tensor x;
  bool single_line;
  std::string expected;
};

void check_values(std::initializer_list<values_case> cases) {
  for (const values_case& c : cases) CHECK(kiln::detail::format_values(c.x, c.single_line) == c.expected);
}

constexpr double quiet_nan = std::numeric_limits<double>::quiet_NaN();
constexpr double infinity = std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("tensors print as in the seeds", "[print]") {
  check_printed({
    {kiln::constant(2), "tensor(2, shape=(), dtype=int32)"},
    {kiln::constant(2.2f), "tensor(2.2, shape=(), dtype=float32)"},
    {kiln::constant("aa"), "tensor(b'aa', shape=(), dtype=string)"},
    {kiln::constant({4, 1}), "tensor([4 1], shape=(2,), dtype=int32)"},
    {kiln::constant({1.f, 2.f}), "tensor([1. 2.], shape=(2,), dtype=float32)"},
    {kiln::constant({1, 2, 3, 4, 5}), "tensor([1 2 3 4 5], shape=(5,), dtype=int32)"},
    {kiln::constant({{1, 2}, {3, 4}}), "tensor(\n[[1 2]\n [3 4]], shape=(2, 2), dtype=int32)"},
    {kiln::constant(20.f), "tensor(20.0, shape=(), dtype=float32)"},
  });
}

TEST_CASE("integers print right-aligned to a shared width", "[print]") {
  check_printed({
    {kiln::constant(-5), "tensor(-5, shape=(), dtype=int32)"},
    {kiln::constant({1, 10}), "tensor([ 1 10], shape=(2,), dtype=int32)"},
    {kiln::constant({-1, 2}), "tensor([-1  2], shape=(2,), dtype=int32)"},
    {kiln::constant(std::vector<std::int64_t>{-4000000000, 7}), "tensor([-4000000000           7], shape=(2,), dtype=int64)"},
    {kiln::constant(std::int64_t{1} << 62), "tensor(4611686018427387904, shape=(), dtype=int64)"},
  });
}

TEST_CASE("float scalars print as Python writes them, at their own precision", "[print]") {
  check_printed({
    {kiln::constant(0.1f), "tensor(0.1, shape=(), dtype=float32)"},
    {kiln::constant(0.1 + 0.2), "tensor(0.30000000000000004, shape=(), dtype=float64)"},
    {kiln::constant(-0.0), "tensor(-0.0, shape=(), dtype=float64)"},
    {kiln::constant(123456.789), "tensor(123456.789, shape=(), dtype=float64)"},
    {kiln::constant(1e16), "tensor(1e+16, shape=(), dtype=float64)"},
    {kiln::constant(1.5e-5), "tensor(1.5e-05, shape=(), dtype=float64)"},
    {kiln::constant(9999999999999998.0), "tensor(9999999999999998.0, shape=(), dtype=float64)"},
    {kiln::constant(1e-300), "tensor(1e-300, shape=(), dtype=float64)"},
    {kiln::constant(float(quiet_nan)), "tensor(nan, shape=(), dtype=float32)"},
    {kiln::constant(infinity), "tensor(inf, shape=(), dtype=float64)"},
    {kiln::constant(-infinity), "tensor(-inf, shape=(), dtype=float64)"},
    // float32 digits are the shortest that read back as the float, zeros filling up
    // to the point (TensorFlow 2.12 prints these; the exact values are 123456792,
    // 999999986991104 and 16777216)
    {kiln::constant(123456789.f), "tensor(123456790.0, shape=(), dtype=float32)"},
    {kiln::constant(1e15f), "tensor(1000000000000000.0, shape=(), dtype=float32)"},
    {kiln::constant(16777217.f), "tensor(16777216.0, shape=(), dtype=float32)"},
    {kiln::constant(-2.5e9f), "tensor(-2500000000.0, shape=(), dtype=float32)"},
    {kiln::constant(1e16f), "tensor(1e+16, shape=(), dtype=float32)"},
  });
}

TEST_CASE("float arrays share a notation and a width", "[print]") {
  check_printed({
      // positional, points aligned, at most 8 fraction digits
      {kiln::constant({1.5f, 2.f}), "tensor([1.5 2. ], shape=(2,), dtype=float32)"},
      {kiln::constant({0.25, -1.5}), "tensor([ 0.25 -1.5 ], shape=(2,), dtype=float64)"},
      {kiln::constant({0.1f, 0.2f}), "tensor([0.1 0.2], shape=(2,), dtype=float32)"},
      {kiln::constant({0.1 + 0.2, 1.0}), "tensor([0.3 1. ], shape=(2,), dtype=float64)"},
      {kiln::constant({0.5, 500.0}), "tensor([  0.5 500. ], shape=(2,), dtype=float64)"},
      {kiln::constant({0.0, -0.0}), "tensor([ 0. -0.], shape=(2,), dtype=float64)"},
      {kiln::constant({0.3f, 1.f / 3.f}), "tensor([0.3        0.33333334], shape=(2,), dtype=float32)"},
      {kiln::constant({3e7f, 0.5f}), "tensor([3.e+07 5.e-01], shape=(2,), dtype=float32)"},
      {kiln::constant({16777217.f, 16777216.f}), "tensor([16777216. 16777216.], shape=(2,), dtype=float32)"},
      // scientific: the smallest non-zero magnitude below 1e-4 ...
      {kiln::constant({1e-5, 1.5}), "tensor([1.0e-05 1.5e+00], shape=(2,), dtype=float64)"},
      // ... or the largest at least 1e8 ...
      {kiln::constant({1e8f, 1.f}), "tensor([1.e+08 1.e+00], shape=(2,), dtype=float32)"},
      {kiln::constant({123456789.f, 1.f}), "tensor([1.2345679e+08 1.0000000e+00], shape=(2,), dtype=float32)"},
      {kiln::constant({1e15f, 1.5f}), "tensor([1.0e+15 1.5e+00], shape=(2,), dtype=float32)"},
      // ... or largest / smallest above 1000; mantissas share their digit count
      {kiln::constant({0.5, 1000.0}), "tensor([5.e-01 1.e+03], shape=(2,), dtype=float64)"},
      {kiln::constant({0.5, 1000.5}), "tensor([5.0000e-01 1.0005e+03], shape=(2,), dtype=float64)"},
      {kiln::constant({1e20f, -3.25e-7f}), "tensor([ 1.00e+20 -3.25e-07], shape=(2,), dtype=float32)"},
      // a three-digit exponent widens every exponent
      {kiln::constant({1.0, 1e-300, 1e300}), "tensor([1.e+000 1.e-300 1.e+300], shape=(3,), dtype=float64)"},
      // nan and inf are right-aligned in the shared width
      {kiln::constant({float(quiet_nan), 1.5f, float(-infinity)}), "tensor([ nan  1.5 -inf], shape=(3,), dtype=float32)"},
      {kiln::constant({quiet_nan, infinity}), "tensor([nan inf], shape=(2,), dtype=float64)"},
      {kiln::constant({-infinity, quiet_nan}), "tensor([-inf  nan], shape=(2,), dtype=float64)"},
  });
}

TEST_CASE("bools and strings print as NumPy writes them", "[print]") {
  check_printed({
      {kiln::constant(true), "tensor(True, shape=(), dtype=bool)"},
      {kiln::constant({true, false}), "tensor([ True False], shape=(2,), dtype=bool)"},
      {kiln::constant({true, true}), "tensor([ True  True], shape=(2,), dtype=bool)"},
      {kiln::constant({"a", "bc"}), "tensor([b'a' b'bc'], shape=(2,), dtype=string)"},
      {kiln::constant("it's"), "tensor(b\"it's\", shape=(), dtype=string)"},
      {kiln::constant("tab\tquote'\"\\"), "tensor(b'tab\\tquote\\'\"\\\\', shape=(), dtype=string)"},
      {kiln::constant(std::string("\x01\xff", 2)), "tensor(b'\\x01\\xff', shape=(), dtype=string)"},
  });
}

TEST_CASE("higher ranks, empty tensors and long rows", "[print]") {
  check_printed({
      {iota<std::int32_t>({2, 2, 2}), "tensor(\n[[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]], shape=(2, 2, 2), dtype=int32)"},
      {kiln::constant({{1.5f}, {-2.f}}), "tensor(\n[[ 1.5]\n [-2. ]], shape=(2, 1), dtype=float32)"},
      {kiln::zeros({0}), "tensor([], shape=(0,), dtype=float32)"},
      {kiln::zeros({2, 0}, kiln::int32), "tensor([], shape=(2, 0), dtype=int32)"},
      // rows wrap at 75 columns
      {kiln::range(30),
       "tensor(\n[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23\n"
       " 24 25 26 27 28 29], shape=(30,), dtype=int32)"},
  });
}

TEST_CASE("more than 1000 elements are summarized", "[print]") {
  CHECK(printed(kiln::range(1000)).find("...") == std::string::npos);
  check_printed({
      {kiln::range(2000), "tensor([   0    1    2 ... 1997 1998 1999], shape=(2000,), dtype=int32)"},
      {iota<std::int32_t>({100, 11}),
       "tensor(\n"
       "[[   0    1    2 ...    8    9   10]\n"
       " [  11   12   13 ...   19   20   21]\n"
       " [  22   23   24 ...   30   31   32]\n"
       " ...\n"
       " [1067 1068 1069 ... 1075 1076 1077]\n"
       " [1078 1079 1080 ... 1086 1087 1088]\n"
       " [1089 1090 1091 ... 1097 1098 1099]], shape=(100, 11), dtype=int32)"},
      // only the elements shown decide the width
      {kiln::fill({2000}, 1.5f), "tensor([1.5 1.5 1.5 ... 1.5 1.5 1.5], shape=(2000,), dtype=float32)"},
  });
}

TEST_CASE("symbolic, undefined and GPU tensors", "[print]") {
  check_printed({
      {symbolic(kiln::int32, {}, "a:0"), "Tensor(\"a:0\", shape=(), dtype=int32)"},
      {symbolic(kiln::float32, {kiln::none, 3}), "Tensor(\"x:0\", shape=(None, 3), dtype=float32)"},
      {symbolic(kiln::string, kiln::unknown_rank, "add_1:0"), "Tensor(\"add_1:0\", shape=<unknown>, dtype=string)"},
      {kiln::tensor(), "tensor(<undefined>)"},
  });
  kiln::testing::require_throws<kiln::type_error>(
      [] { return kiln::detail::format_values(symbolic(kiln::int32, {}), true); }, {"symbolic tensor has no value"});
#if KILN_HAS_THRUST
  check_printed({{kiln::constant({4, 1}).to(kiln::device::gpu), "tensor([4 1], shape=(2,), dtype=int32)"}});
  check_values({{kiln::constant({4, 1}).to(kiln::device::gpu), true, "[4 1]"}});
#endif
}

TEST_CASE("format_values writes values as tf.print does", "[print][tf.print]") {
  check_values({
      // scalars, rows and nested rows, unpadded
      {kiln::constant(1), true, "1"},
      {kiln::constant({1, 2, 3}), true, "[1 2 3]"},
      {kiln::constant({{1, 2}, {3, 4}}), true, "[[1 2] [3 4]]"},
      {kiln::constant({{1, 2}, {3, 4}}), false, "[[1 2]\n [3 4]]"},
      {iota<std::int32_t>({2, 2, 2}), true, "[[[0 1] [2 3]] [[4 5] [6 7]]]"},
      {iota<std::int32_t>({2, 2, 2}), false, "[[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]]"},
      {kiln::constant({-1, 10}), true, "[-1 10]"},
      {kiln::zeros({0}), true, "[]"},
      // every axis longer than 6 shows its 3 first and last items
      {kiln::range(6), true, "[0 1 2 3 4 5]"},
      {kiln::range(10), true, "[0 1 2 ... 7 8 9]"},
      {iota<std::int32_t>({8, 2}), true, "[[0 1] [2 3] [4 5] ... [10 11] [12 13] [14 15]]"},
      {iota<std::int32_t>({8, 2}), false, "[[0 1]\n [2 3]\n [4 5]\n ...\n [10 11]\n [12 13]\n [14 15]]"},
      // floats in TensorFlow's C++ text: 6 significant digits, 9 (17) when those do not read back
      {kiln::constant({0.666458249f, 0.405638f, 0.18005164f}), true, "[0.666458249 0.405638 0.18005164]"},
      {kiln::constant({1.f, 2.5f}), true, "[1 2.5]"},
      {kiln::constant(1e20f), true, "1e+20"},
      {kiln::constant(0.1), true, "0.1"},
      {kiln::constant(0.1 + 0.2), true, "0.30000000000000004"},
      {kiln::constant({quiet_nan, infinity, -infinity}), true, "[nan inf -inf]"},
      // bools as 1 and 0, strings quoted and escaped
      {kiln::constant({true, false}), true, "[1 0]"},
      {kiln::constant("a"), true, "\"a\""},
      {kiln::constant({"a", "b\n\"c\""}), true, "[\"a\" \"b\\n\\\"c\\\"\"]"},
      {kiln::constant(std::string("\x01", 1)), true, "\"\\001\""},
  });
}

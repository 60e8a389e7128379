// Sizes a program cannot have: element counts that overflow int64, byte counts that
// no memory can address, and allocations that fail. Each is a kiln error naming
// the op (where there is one) and the size, never a wrapped count or a crash.

#include "../support/op_check.hpp"

#include <cstdint>

using namespace kiln;
using kiln::testing::require_throws;

// Under a sanitizer, an allocation too large for any machine fails (returns null, as
// the C library's does) instead of aborting the program, so that what kiln makes of
// the failure is tested there too. Read only by sanitized builds of this executable.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }

namespace {
constexpr std::int64_t two_to(int k) { return std::int64_t{1} << k; }
}  // namespace

TEST_CASE("a shape whose element count overflows int64 is refused where it is made") {
  require_throws<value_error>([] { return shape{two_to(40), two_to(40)}; }, {"(1099511627776, 1099511627776)", "int64"});
  require_throws<value_error>([] { return shape{two_to(32), two_to(31)}; }, {"(4294967296, 2147483648)"});
  CHECK(shape{two_to(31), two_to(31)}.num_elements() == two_to(62));  // the largest power of two that fits
  static_assert(shape{two_to(31), two_to(31)}.count_fits());          // the check also runs at compile time
  CHECK(shape{two_to(40), 0, two_to(40)}.num_elements() == 0);        // a zero dim: no elements at all
  CHECK(shape{two_to(40), none, two_to(22)}.count_fits());            // a spec's unknown dims do not count
  // Built dim by dim, a shape may pass through a count that overflows (a zero dim may
  // follow): what uses it checks it.
  shape grown{two_to(40)};
  grown.push_back(two_to(40));
  CHECK_FALSE(grown.count_fits());
  require_throws<value_error>([&] { return kiln::zeros(grown); }, {"(1099511627776, 1099511627776)", "int64"});
  grown.push_back(0);
  CHECK(grown.count_fits());
  CHECK(kiln::zeros(grown).size() == 0);
  require_throws<value_error>([] { return kiln::zeros({two_to(40), two_to(40)}); }, {"(1099511627776, 1099511627776)"});
}

TEST_CASE("an allocation that fails is a resource_exhausted_error naming the op and the size") {
  // 2^49 bytes: more than a 47-bit address space, so no allocator can succeed.
  require_throws<resource_exhausted_error>([] { return kiln::zeros({two_to(47)}); },
                                           {"zeros", "(140737488355328,)", "562949953421312 bytes", "cpu"});
  require_throws<resource_exhausted_error>([] { return kiln::ones({two_to(47)}, int64); }, {"ones", "int64"});
  // More bytes than a ptrdiff_t counts: refused before asking for memory.
  require_throws<resource_exhausted_error>([] { return kiln::zeros({two_to(62)}, float64); },
                                           {"zeros", "4611686018427387904 float64 elements", "more bytes than memory can address"});
  // An op's result: a segment count that no memory holds.
  const tensor data = kiln::constant({1.f, 2.f});
  const tensor ids = kiln::constant({0, 1});
  require_throws<resource_exhausted_error>([&] { return kiln::unsorted_segment_sum(data, ids, two_to(47)); },
                                           {"unsorted_segment_sum", "(140737488355328,)", "bytes"});
  // Nothing is left half-done: the allocator serves the next request.
  CHECK(kiln::ones({1000}).to_vector<float>() == std::vector<float>(1000, 1.f));
}

TEST_CASE("an op whose result would have more elements than int64 counts names itself and its inputs") {
  const tensor tall = kiln::zeros({two_to(40), 0}), wide = kiln::zeros({0, two_to(40)});
  require_throws<invalid_argument_error>([&] { return kiln::matmul(tall, wide); },
                              {"matmul", "(1099511627776, 1099511627776)", "(1099511627776, 0)", "(0, 1099511627776)"});
  kiln::function f([](const tensor& a, const tensor& b) { return kiln::matmul(a, b); });
  require_throws<value_error>([&] { return f(tall, wide); }, {"matmul", "(1099511627776, 1099511627776)"});
  const tensor rows = kiln::zeros({two_to(62), 0});
  require_throws<invalid_argument_error>([&] { return kiln::concat({rows, rows}, 0); }, {"concat", "int64"});
  // Rules that build their result dim by dim, where a zero dim comes last.
  CHECK(kiln::stack({rows, rows, rows}).shape() == shape{3, two_to(62), 0});
  CHECK(kiln::reshape(kiln::zeros({0}), {two_to(47), two_to(47), 0}).shape() == shape{two_to(47), two_to(47), 0});
}

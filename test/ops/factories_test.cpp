// The factories (constant, zeros, ones, fill, eye, range,
// zeros_like, ones_like, random::uniform) and the truth value of a tensor, checked
// against hand-written values, with every error path.

#include "../support/op_check.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Every error check goes through one std::function type, so that require_throws is
// instantiated once per error kind rather than once per lambda.
template <class E>
void require_throws(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  kiln::testing::require_throws<E>(f, parts);
}

// A symbolic tensor, as the tracer makes them; its symbol is never looked at here.
kiln::tensor symbolic(kiln::dtype t, const kiln::shape& s) {
  static const int anchor = 0;
  auto* sym = reinterpret_cast<const kiln::detail::symbol*>(&anchor);
  return kiln::tensor(t, s, std::shared_ptr<const kiln::detail::symbol>(sym, [](const kiln::detail::symbol*) {}));
}

template <class T>
void require_tensor(const kiln::tensor& x, kiln::dtype t, const kiln::shape& s, const std::vector<T>& values) {
  INFO("got " << x);
  REQUIRE(x.dtype() == t);
  REQUIRE(x.shape() == s);
  REQUIRE(x.device() == kiln::device::cpu);
  CHECK(x.to_vector<T>() == values);
}

}  // namespace

TEST_CASE("constant from C++ scalars", "[factories][constant]") {
  require_tensor<bool>(kiln::constant(true), kiln::bool_, {}, {true});
  require_tensor<std::int32_t>(kiln::constant(-7), kiln::int32, {}, {-7});
  require_tensor<std::int64_t>(kiln::constant(std::int64_t{1} << 40), kiln::int64, {}, {std::int64_t{1} << 40});
  require_tensor<float>(kiln::constant(2.5f), kiln::float32, {}, {2.5f});
  require_tensor<double>(kiln::constant(0.1), kiln::float64, {}, {0.1});
  CHECK(kiln::constant(3).item<int>() == 3);
}

TEST_CASE("constant from strings", "[factories][constant]") {
  require_tensor<std::string>(kiln::constant("a"), kiln::string, {}, {"a"});
  require_tensor<std::string>(kiln::constant(std::string("bc")), kiln::string, {}, {"bc"});
  require_tensor<std::string>(kiln::constant(std::string_view("d")), kiln::string, {}, {"d"});
  require_tensor<std::string>(kiln::constant(""), kiln::string, {}, {""});
  require_tensor<std::string>(kiln::constant({"a", "b"}), kiln::string, {2}, {"a", "b"});
  require_tensor<std::string>(kiln::constant({{std::string("x")}, {std::string("y")}}), kiln::string, {2, 1}, {"x", "y"});
}

TEST_CASE("constant from nested braced lists", "[factories][constant]") {
  require_tensor<std::int32_t>(kiln::constant({4, 1}), kiln::int32, {2}, {4, 1});
  require_tensor<float>(kiln::constant({{1.f, 2.f}, {3.f, 4.f}}), kiln::float32, {2, 2}, {1, 2, 3, 4});
  require_tensor<bool>(kiln::constant({{{true}, {false}}, {{false}, {true}}}), kiln::bool_, {2, 2, 1},
                       {true, false, false, true});
  require_tensor<double>(kiln::constant({{{{1.0, 2.0, 3.0}}}}), kiln::float64, {1, 1, 1, 3}, {1, 2, 3});
  require_tensor<std::int64_t>(kiln::constant({std::int64_t{5}}), kiln::int64, {1}, {5});
  require_tensor<float>(kiln::constant(std::initializer_list<float>{}), kiln::float32, {0}, {});
  require_tensor<float>(kiln::constant(std::initializer_list<std::initializer_list<float>>{{}, {}}), kiln::float32,
                        {2, 0}, {});

  require_throws<kiln::value_error>([] { return kiln::constant({{1, 2}, {3}}); },
                                    {"constant", "ragged", "axis 1", "2 and 1"});
  require_throws<kiln::value_error>([] { return kiln::constant({{{1, 2}, {3, 4}}, {{5, 6}, {7}}}); },
                                    {"ragged", "axis 2", "2 and 1"});
  require_throws<kiln::value_error>([] { return kiln::constant({{{1}}, {{2}, {3}}}); }, {"ragged", "axis 1"});
}

TEST_CASE("constant from a vector and a shape", "[factories][constant]") {
  require_tensor<float>(kiln::constant(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}), kiln::float32, {2, 3},
                        {1, 2, 3, 4, 5, 6});
  require_tensor<bool>(kiln::constant(std::vector<bool>{true, false}, {2, 1}), kiln::bool_, {2, 1}, {true, false});
  require_tensor<std::string>(kiln::constant(std::vector<const char*>{"p", "q"}, {2}), kiln::string, {2}, {"p", "q"});
  require_tensor<std::int32_t>(kiln::constant(std::vector<int>{7}, kiln::shape{}), kiln::int32, {}, {7});
  require_tensor<std::int32_t>(kiln::constant(std::vector<int>{4, 1}), kiln::int32, {2}, {4, 1});
  require_tensor<double>(kiln::constant(std::vector<double>{}, {0, 3}), kiln::float64, {0, 3}, {});

  require_throws<kiln::value_error>([] { return kiln::constant(std::vector<float>{1, 2, 3, 4, 5}, {2, 3}); },
                                    {"constant", "5 values", "(2, 3)", "6 elements"});
  require_throws<kiln::value_error>([] { return kiln::constant(std::vector<float>{1, 2}, {kiln::none}); },
                                    {"constant", "fully defined", "(None,)"});
}

TEST_CASE("constant converts to a requested dtype as tf.constant does", "[factories][constant]") {
  require_tensor<float>(kiln::constant(1, kiln::float32), kiln::float32, {}, {1.f});
  require_tensor<double>(kiln::constant({1, 2}, kiln::float64), kiln::float64, {2}, {1.0, 2.0});
  require_tensor<std::int64_t>(kiln::constant(-3, kiln::int64), kiln::int64, {}, {-3});
  require_tensor<std::int32_t>(kiln::constant(std::int64_t{-5}, kiln::int32), kiln::int32, {}, {-5});
  require_tensor<std::int32_t>(kiln::constant({true, false}, kiln::int32), kiln::int32, {2}, {1, 0});
  require_tensor<float>(kiln::constant(0.5, kiln::float32), kiln::float32, {}, {0.5f});
  require_tensor<double>(kiln::constant(std::vector<float>{1.5f}, {1}, kiln::float64), kiln::float64, {1}, {1.5});
  require_tensor<std::string>(kiln::constant("s", kiln::string), kiln::string, {}, {"s"});

  require_throws<kiln::type_error>([] { return kiln::constant(1.5, kiln::int32); }, {"constant", "1.5 (float64)", "int32"});
  require_throws<kiln::type_error>([] { return kiln::constant({1.f, 2.f}, kiln::int64); }, {"1 (float32)", "int64"});
  require_throws<kiln::type_error>([] { return kiln::constant(1, kiln::bool_); }, {"1 (int32)", "bool"});
  require_throws<kiln::type_error>([] { return kiln::constant("a", kiln::int32); }, {"\"a\" (string)", "int32"});
  require_throws<kiln::type_error>([] { return kiln::constant(1, kiln::string); }, {"1 (int32)", "string"});
  require_throws<kiln::value_error>([] { return kiln::constant(std::int64_t{3000000000}, kiln::int32); },
                                    {"constant", "3000000000 (int64)", "out of range", "int32"});
}

TEST_CASE("zeros, ones and fill", "[factories]") {
  require_tensor<float>(kiln::zeros({2, 3}), kiln::float32, {2, 3}, std::vector<float>(6, 0.f));
  require_tensor<std::int64_t>(kiln::zeros({2}, kiln::int64), kiln::int64, {2}, {0, 0});
  require_tensor<bool>(kiln::zeros({1}, kiln::bool_), kiln::bool_, {1}, {false});
  require_tensor<std::string>(kiln::zeros({2}, kiln::string), kiln::string, {2}, {"", ""});
  require_tensor<double>(kiln::zeros({}, kiln::float64), kiln::float64, {}, {0.0});
  require_tensor<float>(kiln::ones({2, 2}), kiln::float32, {2, 2}, {1, 1, 1, 1});
  require_tensor<std::int32_t>(kiln::ones({3}, kiln::int32), kiln::int32, {3}, {1, 1, 1});
  require_tensor<bool>(kiln::ones({2}, kiln::bool_), kiln::bool_, {2}, {true, true});
  require_tensor<std::int32_t>(kiln::fill({2, 2}, 9), kiln::int32, {2, 2}, {9, 9, 9, 9});
  require_tensor<double>(kiln::fill({1}, -0.5), kiln::float64, {1}, {-0.5});
  require_tensor<bool>(kiln::fill({2}, true), kiln::bool_, {2}, {true, true});
  require_tensor<std::string>(kiln::fill({2}, "ab"), kiln::string, {2}, {"ab", "ab"});
  require_tensor<float>(kiln::fill({0, 4}, 1.f), kiln::float32, {0, 4}, {});

  // Large enough for the parallel fill.
  auto big = kiln::ones({1 << 20}, kiln::int32).to_vector<std::int32_t>();
  CHECK(std::all_of(big.begin(), big.end(), [](std::int32_t v) { return v == 1; }));

  require_throws<kiln::type_error>([] { return kiln::ones({2}, kiln::string); }, {"ones", "string"});
  require_throws<kiln::value_error>([] { return kiln::zeros({kiln::none, 2}); }, {"zeros", "(None, 2)"});
  require_throws<kiln::value_error>([] { return kiln::ones(kiln::unknown_rank); }, {"ones", "<unknown>"});
  require_throws<kiln::value_error>([] { return kiln::fill({kiln::none}, 1); }, {"fill", "(None,)"});
}

TEST_CASE("eye", "[factories]") {
  require_tensor<float>(kiln::eye(3), kiln::float32, {3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  require_tensor<std::int32_t>(kiln::eye(2, 3, kiln::int32), kiln::int32, {2, 3}, {1, 0, 0, 0, 1, 0});
  require_tensor<double>(kiln::eye(3, 2, kiln::float64), kiln::float64, {3, 2}, {1, 0, 0, 1, 0, 0});
  require_tensor<bool>(kiln::eye(2, kiln::bool_), kiln::bool_, {2, 2}, {true, false, false, true});
  require_tensor<float>(kiln::eye(0), kiln::float32, {0, 0}, {});

  require_throws<kiln::invalid_argument_error>([] { return kiln::eye(-1); }, {"eye", "-1"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::eye(2, -3); }, {"eye", "2 and -3"});
  require_throws<kiln::type_error>([] { return kiln::eye(2, kiln::string); }, {"eye", "string"});
}

TEST_CASE("range", "[factories][range]") {
  require_tensor<std::int32_t>(kiln::range(5), kiln::int32, {5}, {0, 1, 2, 3, 4});
  require_tensor<std::int32_t>(kiln::range(1, 10, 3), kiln::int32, {3}, {1, 4, 7});
  require_tensor<std::int32_t>(kiln::range(10, 1, -3), kiln::int32, {3}, {10, 7, 4});
  require_tensor<std::int32_t>(kiln::range(-2, 2), kiln::int32, {4}, {-2, -1, 0, 1});
  require_tensor<std::int64_t>(kiln::range(std::int64_t{3}), kiln::int64, {3}, {0, 1, 2});
  require_tensor<float>(kiln::range(0.f, 1.f, 0.25f), kiln::float32, {4}, {0.f, 0.25f, 0.5f, 0.75f});
  require_tensor<double>(kiln::range(0.0, 1.0, 0.5), kiln::float64, {2}, {0.0, 0.5});
  require_tensor<double>(kiln::range(1.0, 0.0, -0.25), kiln::float64, {4}, {1.0, 0.75, 0.5, 0.25});
  // The widest argument type decides: int32 < int64 < float32 < float64.
  require_tensor<float>(kiln::range(0, 5, 2.5f), kiln::float32, {2}, {0.f, 2.5f});
  require_tensor<std::int64_t>(kiln::range(0, std::int64_t{4}, 2), kiln::int64, {2}, {0, 2});
  require_tensor<double>(kiln::range(1.f, 2.0), kiln::float64, {1}, {1.0});
  // Empty ranges.
  require_tensor<std::int32_t>(kiln::range(0), kiln::int32, {0}, {});
  require_tensor<std::int32_t>(kiln::range(3, 3), kiln::int32, {0}, {});
  require_tensor<double>(kiln::range(2.0, 2.0, -1.0), kiln::float64, {0}, {});
  // Bounds at the ends of the integer types, where limit - start does not fit.
  constexpr std::int32_t max32 = std::numeric_limits<std::int32_t>::max(), min32 = std::numeric_limits<std::int32_t>::min();
  require_tensor<std::int32_t>(kiln::range(max32 - 2, max32), kiln::int32, {2}, {max32 - 2, max32 - 1});
  require_tensor<std::int32_t>(kiln::range(min32, max32, max32), kiln::int32, {3}, {min32, -1, max32 - 1});
  constexpr std::int64_t min64 = std::numeric_limits<std::int64_t>::min(), max64 = std::numeric_limits<std::int64_t>::max();
  require_tensor<std::int64_t>(kiln::range(max64, min64, min64), kiln::int64, {2}, {max64, -1});
  // Large enough for the parallel fill.
  auto big = kiln::range(1 << 20).to_vector<std::int32_t>();
  CHECK(big[123457] == 123457);
  CHECK(big.back() == (1 << 20) - 1);

  require_throws<kiln::invalid_argument_error>([] { return kiln::range(0, 5, 0); }, {"range", "delta must not be 0"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::range(5, 1); }, {"range", "start 5 (int32) > limit 1 (int32)"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::range(1, 5, -1); }, {"range", "negative delta"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::range(-3); }, {"range", "start 0 (int32) > limit -3"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::range(0.0, std::nan(""), 1.0); }, {"range", "finite"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::range(0.0, 1e300, 1e-10); }, {"range", "too many"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::range(min64, max64); }, {"range", "too many"});
}

TEST_CASE("zeros_like and ones_like", "[factories]") {
  require_tensor<std::int32_t>(kiln::zeros_like(kiln::constant({{1, 2}, {3, 4}})), kiln::int32, {2, 2}, {0, 0, 0, 0});
  require_tensor<double>(kiln::ones_like(kiln::constant({1.5, 2.5})), kiln::float64, {2}, {1.0, 1.0});
  require_tensor<bool>(kiln::ones_like(kiln::constant(false)), kiln::bool_, {}, {true});
  require_tensor<std::string>(kiln::zeros_like(kiln::constant({"a"})), kiln::string, {1}, {""});
  // A symbolic tensor of a fully defined shape gives an eager constant.
  require_tensor<float>(kiln::ones_like(symbolic(kiln::float32, {2})), kiln::float32, {2}, {1.f, 1.f});

  require_throws<kiln::type_error>([] { return kiln::ones_like(kiln::constant("a")); }, {"ones_like", "string"});
  require_throws<kiln::invalid_argument_error>([] { return kiln::zeros_like(kiln::tensor()); }, {"zeros_like", "empty"});
  require_throws<kiln::value_error>([] { return kiln::zeros_like(symbolic(kiln::int32, {kiln::none, 3})); },
                                    {"zeros_like", "(None, 3)"});
}

#if KILN_HAS_THRUST
TEST_CASE("factories place their result on the requested device", "[factories][gpu]") {
  CHECK(kiln::constant(1, std::nullopt, kiln::device::gpu).device() == kiln::device::gpu);
  CHECK(kiln::zeros({2}, kiln::float32, kiln::device::gpu).device() == kiln::device::gpu);
  CHECK(kiln::eye(2, kiln::int32, kiln::device::gpu).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 0, 1});
  auto on_gpu = kiln::fill({3}, 2.5f, kiln::device::gpu);
  CHECK(kiln::ones_like(on_gpu).device() == kiln::device::gpu);
  require_throws<kiln::type_error>([] { return kiln::zeros({2}, kiln::string, kiln::device::gpu); }, {"string"});
}
#endif

TEST_CASE("Philox 4x32-10 matches the published known answers", "[factories][random]") {
  using words = std::array<std::uint32_t, 4>;
  CHECK(kiln::detail::philox4x32_10({0, 0, 0, 0}, {0, 0}) == words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(kiln::detail::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(kiln::detail::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("random::uniform is seeded, in range and uniform", "[factories][random]") {
  SECTION("seed 0 draws the first Philox block (counter 0, key 0)") {
    // float32: the top 24 bits of each word; int32: each word modulo the range.
    require_tensor<float>(kiln::random::stateless_uniform({4}, 0, 0, 1, kiln::float32), kiln::float32, {4},
                          {0x6627e8p-24f, 0xe169c5p-24f, 0xbc57acp-24f, 0x9b00dbp-24f});
    require_tensor<std::int32_t>(kiln::random::stateless_uniform({4}, 0, 0, 10, kiln::int32), kiln::int32, {4},
                                 {0x6627e8d5 % 10, 0xe169c58du % 10, 0xbc57ac4cu % 10, 0x9b00dbd8u % 10});
    // float64: the top 53 bits of each pair of words.
    require_tensor<double>(kiln::random::stateless_uniform({2}, 0, 0, 1, kiln::float64), kiln::float64, {2},
                           {double(0x6627e8d5e169c58dull >> 11) * 0x1p-53, double(0xbc57ac4c9b00dbd8ull >> 11) * 0x1p-53});
  }
  SECTION("a seed fixes the sequence of draws; each draw is new, as TensorFlow's op seeds") {
    auto a = kiln::random::uniform({1000}, 0, 1, kiln::float32, 4242).to_vector<float>();
    auto b = kiln::random::uniform({1000}, 0, 1, kiln::float32, 4242).to_vector<float>();
    CHECK(b != a);
    CHECK(kiln::random::uniform({1000}, 0, 1, kiln::float32, 4343).to_vector<float>() != a);
    CHECK(kiln::random::uniform({1000}).to_vector<float>() != kiln::random::uniform({1000}).to_vector<float>());
    // Setting the global seed starts every sequence over: the same draws again.
    kiln::random::set_seed(5);
    auto first = kiln::random::uniform({1000}, 0, 1, kiln::float32, 4242).to_vector<float>();
    auto second = kiln::random::uniform({1000}, 0, 1, kiln::float32, 4242).to_vector<float>();
    auto unseeded = kiln::random::uniform({1000}).to_vector<float>();
    kiln::random::set_seed(5);
    CHECK(kiln::random::uniform({1000}, 0, 1, kiln::float32, 4242).to_vector<float>() == first);
    CHECK(kiln::random::uniform({1000}, 0, 1, kiln::float32, 4242).to_vector<float>() == second);
    CHECK(kiln::random::uniform({1000}).to_vector<float>() == unseeded);
    CHECK(first != second);
  }
  SECTION("stateless_uniform is a function of its seed") {
    auto a = kiln::random::stateless_uniform({1000}, 42).to_vector<float>();
    CHECK(kiln::random::stateless_uniform({1000}, 42).to_vector<float>() == a);
    CHECK(kiln::random::stateless_uniform({1000}, 43).to_vector<float>() != a);
    // A longer draw with the same seed starts with the same numbers.
    auto longer = kiln::random::stateless_uniform({1001}, 42).to_vector<float>();
    CHECK(std::equal(a.begin(), a.end(), longer.begin()));
  }
  SECTION("a generator's draws differ, and its seed starts them over") {
    auto g = kiln::random::generator::from_seed(1);
    auto a = g.uniform({100}).to_vector<float>();
    auto copy = g;  // copies share the state
    auto b = copy.uniform({100}).to_vector<float>();
    CHECK(a != b);
    g.reset_from_seed(1);
    CHECK(copy.uniform({100}).to_vector<float>() == a);
    CHECK(g.uniform({100}).to_vector<float>() == b);
    CHECK(kiln::random::generator::from_seed(2).uniform({100}).to_vector<float>() != a);
    require_throws<kiln::invalid_argument_error>([&] { return g.uniform({2}, 3, 3, kiln::int32); },
                                                 {"random::uniform", "maxval 3", "minval 3"});
  }
  SECTION("the numbers do not depend on the thread count") {
    // The draw of one seed and stream; stateful draws take such streams in turn.
    int threads = kiln::config::num_threads();
    kiln::config::set_num_threads(1);
    auto one = kiln::random::stateless_uniform({1 << 18, 3}, 7, -5, 5, kiln::float64).to_vector<double>();
    kiln::config::set_num_threads(4);
    auto four = kiln::random::stateless_uniform({1 << 18, 3}, 7, -5, 5, kiln::float64).to_vector<double>();
    kiln::config::set_num_threads(threads);
    CHECK(one == four);
  }
  SECTION("floats lie in [minval, maxval) with the expected mean") {
    auto f = kiln::random::uniform({100000}, 0, 1, kiln::float32, 1).to_vector<float>();
    CHECK(std::all_of(f.begin(), f.end(), [](float v) { return v >= 0.f && v < 1.f; }));
    double mean = std::accumulate(f.begin(), f.end(), 0.0) / double(f.size());
    CHECK(std::abs(mean - 0.5) < 0.005);  // the mean's standard deviation is about 0.0009
    auto d = kiln::random::uniform({100000}, -3, -1, kiln::float64, 2).to_vector<double>();
    CHECK(std::all_of(d.begin(), d.end(), [](double v) { return v >= -3 && v < -1; }));
    CHECK(std::abs(std::accumulate(d.begin(), d.end(), 0.0) / double(d.size()) + 2) < 0.01);
    // Bounds so far apart that maxval - minval overflows.
    auto wide = kiln::random::uniform({1000}, -1e308, 1e308, kiln::float64, 3).to_vector<double>();
    CHECK(std::all_of(wide.begin(), wide.end(), [](double v) { return std::isfinite(v) && v < 1e308; }));
    auto wide32 = kiln::random::uniform({1000}, -3e38, 3e38, kiln::float32, 3).to_vector<float>();
    CHECK(std::all_of(wide32.begin(), wide32.end(), [](float v) { return std::isfinite(v) && v < 3e38f; }));
  }
  SECTION("integers lie in [minval, maxval), each value about equally often") {
    auto v = kiln::random::uniform({100000}, -1, 9, kiln::int32, 5).to_vector<std::int32_t>();
    auto [lowest, highest] = std::minmax_element(v.begin(), v.end());
    REQUIRE(*lowest == -1);
    REQUIRE(*highest == 8);
    std::array<int, 10> counts{};
    for (std::int32_t x : v) ++counts[std::size_t(x + 1)];
    for (int c : counts) CHECK(std::abs(c - 10000) < 500);  // about 5 standard deviations
    auto w = kiln::random::uniform({100000}, 1e12, 1e12 + 4, kiln::int64, 6).to_vector<std::int64_t>();
    CHECK(std::all_of(w.begin(), w.end(), [](std::int64_t x) { return x >= 1000000000000 && x < 1000000000004; }));
    CHECK(std::count(w.begin(), w.end(), 1000000000003) > 20000);
    // The full int32 range: maxval - minval does not fit in int32.
    auto full = kiln::random::uniform({1000}, -2147483648.0, 2147483647.0, kiln::int32, 8).to_vector<std::int32_t>();
    CHECK(std::count_if(full.begin(), full.end(), [](std::int32_t x) { return x < 0; }) > 400);
  }
  SECTION("errors") {
    require_throws<kiln::invalid_argument_error>([] { return kiln::random::uniform({2}, 3, 3, kiln::int32); },
                                                 {"random::uniform", "maxval 3", "minval 3"});
    require_throws<kiln::invalid_argument_error>([] { return kiln::random::uniform({2}, 1, 0.5); },
                                                 {"random::uniform", "minval 1 (float32)", "maxval 0.5 (float32)"});
    require_throws<kiln::invalid_argument_error>([] { return kiln::random::uniform({2}, 0, INFINITY, kiln::float64); },
                                                 {"random::uniform", "finite"});
    require_throws<kiln::invalid_argument_error>(
        [] { return kiln::random::uniform({2}, 0, std::nullopt, kiln::int64); }, {"random::uniform", "int64", "maxval"});
    require_throws<kiln::invalid_argument_error>([] { return kiln::random::uniform({2}, 0.5, 3, kiln::int32); },
                                                 {"minval 0.5", "int32"});
    require_throws<kiln::invalid_argument_error>([] { return kiln::random::uniform({2}, 0, 3e9, kiln::int32); },
                                                 {"maxval 3e+09", "int32"});
    require_throws<kiln::type_error>([] { return kiln::random::uniform({2}, 0, 1, kiln::bool_); },
                                     {"random::uniform", "bool"});
    require_throws<kiln::value_error>([] { return kiln::random::uniform({kiln::none}); },
                                      {"random::uniform", "(None,)"});
  }
}

TEST_CASE("the truth value of a tensor", "[truth]") {
  CHECK(static_cast<bool>(kiln::constant(true)));
  CHECK_FALSE(static_cast<bool>(kiln::constant(false)));
  CHECK(static_cast<bool>(kiln::constant(3)));
  CHECK_FALSE(static_cast<bool>(kiln::constant(std::int64_t{0})));
  CHECK(static_cast<bool>(kiln::constant(-0.5f)));
  CHECK_FALSE(static_cast<bool>(kiln::constant(-0.0)));
  CHECK(static_cast<bool>(kiln::constant(std::nan(""))));
  CHECK(static_cast<bool>(kiln::constant("a")));
  CHECK_FALSE(static_cast<bool>(kiln::constant("")));
  CHECK(static_cast<bool>(kiln::constant({{7}})));  // one element, any rank
  bool taken = false;
  if (kiln::constant(1)) taken = true;
  CHECK(taken);
#if KILN_HAS_THRUST
  CHECK(static_cast<bool>(kiln::constant(2.f).to(kiln::device::gpu)));
#endif

  require_throws<kiln::type_error>([] { return static_cast<bool>(symbolic(kiln::bool_, {})); },
                                   {"symbolic tensor as a C++ bool", "kiln::cond", "kiln::while_loop"});
  require_throws<kiln::value_error>([] { return static_cast<bool>(kiln::constant({1, 2})); },
                                    {"more than one element", "(2,)"});
  require_throws<kiln::value_error>([] { return static_cast<bool>(kiln::zeros({0})); }, {"empty", "(0,)"});
  require_throws<kiln::invalid_argument_error>([] { return static_cast<bool>(kiln::tensor()); }, {"empty"});
}

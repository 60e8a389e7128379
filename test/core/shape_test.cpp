#include <kiln/kiln.hpp>

#include <catch2/catch.hpp>

#include <sstream>
#include <vector>

namespace {
std::string printed(const kiln::shape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}
}  // namespace

TEST_CASE("shape prints as TensorFlow does", "[shape]") {
  CHECK(printed(kiln::shape{}) == "()");
  CHECK(printed(kiln::shape{2}) == "(2,)");
  CHECK(printed(kiln::shape{2, 3}) == "(2, 3)");
  CHECK(printed(kiln::shape{kiln::none, 3}) == "(None, 3)");
  CHECK(printed(kiln::shape{0}) == "(0,)");
  CHECK(printed(kiln::unknown_rank) == "<unknown>");
  CHECK(kiln::shape{4, 5}.str() == "(4, 5)");
}

TEST_CASE("shape rank and element count", "[shape]") {
  CHECK(kiln::shape{}.rank() == 0);
  CHECK(kiln::shape{}.num_elements() == 1);
  CHECK(kiln::shape{2, 3, 4}.rank() == 3);
  CHECK(kiln::shape{2, 3, 4}.num_elements() == 24);
  CHECK(kiln::shape{2, 0, 4}.num_elements() == 0);
  CHECK(kiln::shape(kiln::unknown_rank).rank() == -1);
  CHECK_FALSE(kiln::shape(kiln::unknown_rank).has_known_rank());
  CHECK(kiln::shape{3, 1}.is_fully_defined());
  CHECK_FALSE(kiln::shape{kiln::none, 1}.is_fully_defined());
  CHECK_FALSE(kiln::shape(kiln::unknown_rank).is_fully_defined());
}

TEST_CASE("shape equality compares rank and dims", "[shape]") {
  CHECK(kiln::shape{2, 3} == kiln::shape{2, 3});
  CHECK(kiln::shape{2, 3} != kiln::shape{3, 2});
  CHECK(kiln::shape{2} != kiln::shape{2, 1});
  CHECK(kiln::shape{} == kiln::shape{});
  CHECK(kiln::shape{} != kiln::shape{1});
  CHECK(kiln::shape(kiln::unknown_rank) == kiln::shape(kiln::unknown_rank));
  CHECK(kiln::shape(kiln::unknown_rank) != kiln::shape{});

  kiln::shape grown{2};
  grown.push_back(3);
  CHECK(grown == kiln::shape{2, 3});

  std::vector<std::int64_t> dims{5, 6, 7};
  CHECK(kiln::shape(std::span<const std::int64_t>(dims)) == kiln::shape{5, 6, 7});
}

TEST_CASE("shape spec accepts matching concrete shapes", "[shape]") {
  const kiln::shape spec{kiln::none, 3};
  CHECK(spec.accepts(kiln::shape{1, 3}));
  CHECK(spec.accepts(kiln::shape{100, 3}));
  CHECK_FALSE(spec.accepts(kiln::shape{1, 4}));
  CHECK_FALSE(spec.accepts(kiln::shape{3}));
  CHECK(kiln::shape{2, 3}.accepts(kiln::shape{2, 3}));
  CHECK_FALSE(kiln::shape{2, 3}.accepts(kiln::shape{3, 2}));
  CHECK(kiln::shape{}.accepts(kiln::shape{}));
  CHECK_FALSE(kiln::shape{}.accepts(kiln::shape{1}));
  CHECK(kiln::shape(kiln::unknown_rank).accepts(kiln::shape{}));
  CHECK(kiln::shape(kiln::unknown_rank).accepts(kiln::shape{4, 5, 6}));
}

TEST_CASE("shape rejects invalid dims", "[shape]") {
  CHECK_THROWS_AS(kiln::shape({2, -3}), kiln::value_error);
  CHECK_THROWS_AS(kiln::shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), kiln::value_error);
  kiln::shape full{1, 1, 1, 1, 1, 1, 1, 1};
  CHECK_THROWS_AS(full.push_back(1), kiln::value_error);
}

TEST_CASE("shape works in constant expressions", "[shape][constexpr]") {
  constexpr kiln::shape matrix{2, 3};
  STATIC_REQUIRE(matrix.rank() == 2);
  STATIC_REQUIRE(matrix[1] == 3);
  STATIC_REQUIRE(matrix.num_elements() == 6);
  STATIC_REQUIRE(matrix == kiln::shape{2, 3});
  STATIC_REQUIRE(kiln::shape{kiln::none, 3}.accepts(matrix));
  STATIC_REQUIRE_FALSE(kiln::shape{3, kiln::none}.accepts(matrix));
  STATIC_REQUIRE(kiln::shape{}.num_elements() == 1);
  STATIC_REQUIRE(kiln::row_major_strides(kiln::shape{2, 3, 4})[0] == 12);
  STATIC_REQUIRE(kiln::row_major_strides(kiln::shape{2, 3, 4})[1] == 4);
  STATIC_REQUIRE(kiln::row_major_strides(kiln::shape{2, 3, 4})[2] == 1);
}

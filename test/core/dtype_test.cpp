#include <kiln/kiln.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

TEST_CASE("dtype names are TensorFlow's", "[dtype]") {
  CHECK(kiln::name(kiln::bool_) == "bool");
  CHECK(kiln::name(kiln::int32) == "int32");
  CHECK(kiln::name(kiln::int64) == "int64");
  CHECK(kiln::name(kiln::float32) == "float32");
  CHECK(kiln::name(kiln::float64) == "float64");
  CHECK(kiln::name(kiln::string) == "string");

  std::ostringstream os;
  os << kiln::float32 << ' ' << kiln::bool_;
  CHECK(os.str() == "float32 bool");
}

TEST_CASE("C++ element types map to dtypes", "[dtype][constexpr]") {
  STATIC_REQUIRE(kiln::dtype_of<bool> == kiln::bool_);
  STATIC_REQUIRE(kiln::dtype_of<std::int32_t> == kiln::int32);
  STATIC_REQUIRE(kiln::dtype_of<std::int64_t> == kiln::int64);
  STATIC_REQUIRE(kiln::dtype_of<float> == kiln::float32);
  STATIC_REQUIRE(kiln::dtype_of<double> == kiln::float64);
  STATIC_REQUIRE(kiln::dtype_of<std::string> == kiln::string);
  STATIC_REQUIRE_FALSE(kiln::has_dtype<char>);
  STATIC_REQUIRE_FALSE(kiln::has_dtype<std::uint32_t>);
  STATIC_REQUIRE(std::is_same_v<kiln::element_t<kiln::float64>, double>);
  STATIC_REQUIRE(std::is_same_v<kiln::element_t<kiln::int32>, std::int32_t>);
  STATIC_REQUIRE(kiln::size_of(kiln::int64) == 8);
  STATIC_REQUIRE(kiln::is_floating(kiln::float32));
  STATIC_REQUIRE_FALSE(kiln::is_floating(kiln::int32));
  STATIC_REQUIRE(kiln::is_integer(kiln::int64));
  STATIC_REQUIRE(kiln::name(kiln::int64) == "int64");
}

TEST_CASE("dtype sets combine and test membership", "[dtype][constexpr]") {
  STATIC_REQUIRE(kiln::dtypes::numeric.contains(kiln::float64));
  STATIC_REQUIRE_FALSE(kiln::dtypes::numeric.contains(kiln::string));
  STATIC_REQUIRE((kiln::dtypes::floating | kiln::dtypes::integer) == kiln::dtypes::numeric);
  STATIC_REQUIRE((kiln::dtypes::floating & kiln::dtypes::integer) == kiln::dtype_set{});
}

TEST_CASE("visit_dtype calls the function with the element type", "[dtype]") {
  for (kiln::dtype t : {kiln::bool_, kiln::int32, kiln::int64, kiln::float32, kiln::float64, kiln::string}) {
    kiln::dtype seen = kiln::visit_dtype(t, []<class T>() { return kiln::dtype_of<T>; });
    CHECK(seen == t);
  }
  CHECK(kiln::visit_dtype(kiln::float64, []<class T>() { return sizeof(T); }) == 8);
}

TEST_CASE("visit_dtype rejects an invalid dtype value", "[dtype]") {
  const auto invalid = static_cast<kiln::dtype>(kiln::dtype_count);
  CHECK_THROWS_AS(kiln::visit_dtype(invalid, []<class>() { return 0; }), kiln::internal_error);
}

// The one op list (kiln/ops/op_list.hpp): its function lists name elementwise ops of
// the arity their functions take, and the kernel families cmake/kiln_library.cmake
// compiles one file each are the list's families.

#include "../support/op_check.hpp"

#include <cctype>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>

namespace op_list_test {

using namespace kiln;

#define KILN_TEST_UNARY(fn, op) static_assert(ops::elementwise<ops::op> && ops::op::arity == 1, #fn);
#define KILN_TEST_BINARY(fn, op) static_assert(ops::elementwise<ops::op> && ops::op::arity == 2, #fn);
KILN_UNARY_FUNCTIONS(KILN_TEST_UNARY)
KILN_BINARY_FUNCTIONS(KILN_TEST_BINARY)
#undef KILN_TEST_UNARY
#undef KILN_TEST_BINARY

std::string read_source(const std::string& path) {
  std::ifstream in(std::string(KILN_TEST_SOURCE_DIR) + "/../" + path);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The lower-case names of the first capture group of each match of `pattern`, split at spaces.
std::set<std::string> words_matching(const std::string& text, const std::string& pattern) {
  std::set<std::string> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    std::string words = (*it)[1].str();
    for (char& c : words) c = char(std::tolower(static_cast<unsigned char>(c)));
    const std::regex word("[a-z_]+");
    for (auto w = std::sregex_iterator(words.begin(), words.end(), word); w != std::sregex_iterator(); ++w)
      out.insert(w->str());
  }
  return out;
}

TEST_CASE("cmake/kiln_library.cmake compiles a kernel file for each op family of the op list") {
  std::set<std::string> families =
      words_matching(read_source("include/kiln/ops/op_list.hpp"), R"(#define KILN_([A-Z_]+)_OPS\(F\))");
  REQUIRE(families.erase("all") == 1);
  REQUIRE(families.size() > 1);
  const std::set<std::string> compiled =
      words_matching(read_source("cmake/kiln_library.cmake"), R"(foreach\(family IN ITEMS ([a-z_ ]+)\))");
  CHECK(compiled == families);
}

}  // namespace op_list_test

// Node names of kiln::graph, TensorFlow's: the first node of a kind gets the bare name
// (`add`), later ones `add_1`, `add_2`, ..., skipping any name given before, whatever
// gave it (a placeholder named `add_1`, a base that is itself suffixed). Checked
// against a reference that keeps every name given in a set.

#include "../support/op_check.hpp"

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

// The reference: every name given so far kept in one map, as kiln named nodes
// before its names needed no table of every name.
class reference_names {
 public:
  std::string give(const std::string& base) {
    int& count = counts_[base];
    std::string candidate = count == 0 ? base : base + "_" + std::to_string(count);
    ++count;
    while (counts_.count(candidate) && candidate != base) candidate = base + "_" + std::to_string(count++);
    if (candidate != base) counts_[candidate] = 1;
    return candidate;
  }

 private:
  std::map<std::string, int> counts_;
};

}  // namespace

TEST_CASE("graph node names are unique and suffixed in order, skipping names given before", "[graph]") {
  // Placeholders name themselves; every other node kind is named after its op.
  const std::vector<std::string> bases{"add", "add_1", "add_2", "add_10", "add_01", "add_", "x", "x_1_1", "Const", "a_0"};
  std::mt19937 draw(7);
  for (int round = 0; round < 200; ++round) {
    kiln::graph g;
    reference_names reference;
    std::set<std::string> seen;
    for (int k = 0; k < 60; ++k) {
      const std::string& base = bases[std::size_t(draw() % bases.size())];
      const int id = g.add_placeholder(base, kiln::float32, kiln::shape{});
      const std::string& name = g.node_at(id).name();
      INFO("round " << round << ", node " << k << ", base " << base);
      CHECK(seen.insert(name).second);  // unique
      CHECK(name == reference.give(base));
    }
  }
}

TEST_CASE("graph names follow TensorFlow's order for a chain of ops", "[graph]") {
  kiln::graph g;
  std::vector<std::string> names;
  for (const char* base : {"add", "add", "add_1", "add", "mul", "add_2"})
    names.push_back(g.node_at(g.add_placeholder(base, kiln::float32, kiln::shape{})).name());
  // add, add_1, then add_1 is taken so the bare add_1 becomes add_1_1; add continues
  // with add_2; the bare add_2 is then taken: add_2_1.
  CHECK(names == std::vector<std::string>{"add", "add_1", "add_1_1", "add_2", "mul", "add_2_1"});
}

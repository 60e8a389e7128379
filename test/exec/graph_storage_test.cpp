// How a kiln::graph holds its nodes: in blocks that never move (kiln::node_list), each
// node finding its inputs' names through its graph. Graphs of more nodes than a block
// holds, copied, moved and read through the node_list's random-access iterators.

#include <catch2/catch.hpp>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

// A chain of `n` adds: x, then add, add_1, ... each reading the one before and a constant.
kiln::graph add_chain(int n) {
  kiln::graph g;
  int last = g.add_placeholder("x", kiln::float32, kiln::shape{2});
  for (int i = 0; i < n; ++i) {
    const int one = g.add_constant(kiln::constant({1.f, 1.f}));
    const int inputs[] = {last, one};
    last = g.add_op(kiln::ops::add{}, inputs, kiln::float32, kiln::shape{2});
  }
  g.add_output(last);
  return g;
}

// Every op node reads the node two before it and the constant just before it, by name.
void check_chain_names(const kiln::graph& g) {
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const kiln::node& n = g.nodes()[i];
    if (n.kind() != kiln::node_kind::op) continue;
    const std::vector<std::string> expected{g.nodes()[i - 2].name(), g.nodes()[i - 1].name()};
    CHECK(n.inputs() == expected);
    REQUIRE(n.input_ids().size() == 2);
    CHECK(n.input_ids()[0] == int(i) - 2);
  }
}

}  // namespace

TEST_CASE("a graph larger than a block keeps its nodes and their inputs' names", "[graph]") {
  const int n = 3000;  // 6002 nodes: several blocks
  kiln::graph g = add_chain(n);
  REQUIRE(g.nodes().size() == std::size_t(2 * n + 2));
  CHECK(g.nodes().front().name() == "x");
  CHECK(g.nodes().back().op() == "Identity");
  CHECK(g.nodes()[2].name() == "add");
  CHECK(g.nodes()[2 * n].name() == "add_" + std::to_string(n - 1));
  check_chain_names(g);

  // The iterators are random access: the standard algorithms walk them.
  static_assert(std::random_access_iterator<kiln::node_list::iterator>);
  const auto adds = std::count_if(g.nodes().begin(), g.nodes().end(), [](const kiln::node& x) { return x.op() == "add"; });
  CHECK(adds == n);
  const auto found = std::find_if(g.nodes().begin(), g.nodes().end(), [](const kiln::node& x) { return x.name() == "add_2000"; });
  REQUIRE(found != g.nodes().end());
  CHECK(found - g.nodes().begin() == 2 * 2000 + 2);  // add_k is node 2k + 2
  CHECK(g.nodes().index_of(*found) == std::size_t(found - g.nodes().begin()));
  CHECK((g.nodes().end() - 1)->op() == "Identity");
  CHECK(g.nodes().begin()[3].name() == "Const_1");
}

TEST_CASE("a copied or moved graph's nodes read their names from it", "[graph]") {
  std::optional<kiln::graph> original(add_chain(1500));
  const kiln::graph copy = *original;
  kiln::graph moved = std::move(*original);
  original.reset();  // the graph the nodes were made in is gone
  check_chain_names(copy);
  check_chain_names(moved);
  kiln::graph assigned;
  assigned = copy;
  check_chain_names(assigned);
  // A copy grows on its own: its captured constants are not the original's.
  const int one = assigned.add_constant(kiln::constant({2.f, 2.f}));
  CHECK(assigned.nodes()[std::size_t(one)].value().data<float>()[0] == 2.f);
  CHECK(copy.nodes().size() + 1 == assigned.nodes().size());
  CHECK(copy.nodes()[1].value().data<float>()[0] == 1.f);
}

TEST_CASE("a function traced to more nodes than a block runs and saves its graph", "[graph]") {
  kiln::function f([](const kiln::tensor& x) {
    kiln::tensor y = x;
    for (int i = 0; i < 1500; ++i) y = (i % 2) ? y * 1.0f : y + 0.5f;
    return y;
  });
  const kiln::tensor out = f(kiln::ones({3}));
  CHECK(out.data<float>()[0] == Approx(1.f + 750 * 0.5f));
  const kiln::graph g = f.get_concrete_function(kiln::ones({3})).graph();
  CHECK(g.nodes().size() > 2048);
  check_chain_names(g);
}

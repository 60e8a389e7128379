// Variables, kiln::print and kiln::host_callback, eagerly and inside kiln::function:
// effects run at every call in program order, C++ side effects only while tracing,
// and variables follow the singleton rule.

#include <sstream>

#include "trace_check.hpp"

using namespace kiln;
using kiln::testing::count_ops;
using kiln::testing::require_same;
using kiln::testing::require_throws;

namespace {

/// Sends kiln::print to a string while alive.
class captured_prints {
 public:
  captured_prints() { config::set_print_stream(out_); }
  ~captured_prints() { config::set_print_stream(std::cerr); }
  captured_prints(const captured_prints&) = delete;
  captured_prints& operator=(const captured_prints&) = delete;
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

float scalar_of(const tensor& t) { return t.to_vector<float>().at(0); }

}  // namespace

TEST_CASE("variables read, assign and combine like tensors outside functions") {
  variable v(kiln::constant({1.f, 2.f}), "v");
  REQUIRE(v.dtype() == float32);
  REQUIRE(v.shape() == shape{2});
  require_same(v.read_value(), kiln::constant({1.f, 2.f}));
  tensor before = v.read_value();
  require_same(v.assign(kiln::constant({3.f, 4.f})), kiln::constant({3.f, 4.f}));
  require_same(before, kiln::constant({1.f, 2.f}));  // a read keeps the value it saw
  require_same(v.assign_add(kiln::constant({1.f, 1.f})), kiln::constant({4.f, 5.f}));
  require_same(v.assign_sub(kiln::constant({0.5f, 0.5f})), kiln::constant({3.5f, 4.5f}));
  require_same(v * 2.f, kiln::constant({7.f, 9.f}));
  require_same(1.f + v, kiln::constant({4.5f, 5.5f}));
  require_same(kiln::relu(v), kiln::constant({3.5f, 4.5f}));

  variable copy = v;  // a handle: both name the same variable
  copy.assign(kiln::constant({0.f, 0.f}));
  require_same(v.read_value(), kiln::constant({0.f, 0.f}));

  variable counter(0);
  counter.assign_add(2);
  counter.assign_sub(5);
  REQUIRE(counter.read_value().to_vector<std::int32_t>() == std::vector<std::int32_t>{-3});
}

TEST_CASE("a variable rejects values of another dtype or shape, naming both") {
  variable v(kiln::constant({1.f, 2.f}), "weights");
  require_throws<invalid_argument_error>([&] { return v.assign(kiln::constant({1, 2})); },
                                         {"'weights' float32 (2,)", "int32 (2,)"});
  require_throws<invalid_argument_error>([&] { return v.assign(kiln::constant({1.f, 2.f, 3.f})); },
                                         {"'weights' float32 (2,)", "float32 (3,)"});
  function f([&](const tensor& x) { return v.assign(x); }, {.name = "f"});
  require_throws<invalid_argument_error>([&] { return f(kiln::constant(1.f)); }, {"'weights' float32 (2,)", "float32 ()"});
  variable empty;
  REQUIRE_FALSE(empty);
  require_throws<value_error>([&] { return empty.read_value(); }, {"empty"});
}

TEST_CASE("a value whose shape is known only when the graph runs may be assigned, and is checked then") {
  // As TensorFlow: a (2,) variable takes an input_signature argument of shape (None,),
  // and the assignment fails when the graph runs with another size.
  variable v(kiln::constant({1.f, 2.f}), "weights");
  function assign([&](const tensor& x) { return v.assign(x); },
                  {.name = "assign", .input_signature = std::vector{tensor_spec({none}, float32)}});
  REQUIRE(assign(kiln::constant({3.f, 4.f})).to_vector<float>() == std::vector{3.f, 4.f});
  REQUIRE(v.read_value().to_vector<float>() == std::vector{3.f, 4.f});
  require_throws<invalid_argument_error>([&] { return assign(kiln::constant({5.f, 6.f, 7.f})); },
                                         {"in assign", "AssignVariableOp", "'weights' float32 (2,)", "float32 (3,)"});
  REQUIRE(v.read_value().to_vector<float>() == std::vector{3.f, 4.f});
  // A rank that cannot fit is refused while tracing.
  function matrix([&](const tensor& x) { return v.assign_add(x); },
                  {.name = "matrix", .input_signature = std::vector{tensor_spec({none, none}, float32)}});
  require_throws<invalid_argument_error>([&] { return matrix(kiln::ones({1, 2})); }, {"'weights' float32 (2,)", "(None, None)"});
}

TEST_CASE("captured variables are read at every call; writes run in program order") {
  variable a(1.f), b(2.f);
  // The seeds' automatic control dependencies: a = y * b; b += x * a; return a + b.
  function f(
      [&](const tensor& x, const tensor& y) {
        a.assign(y * b);
        b.assign_add(x * a);
        return a + b;
      },
      {.name = "f"});
  REQUIRE(scalar_of(f(kiln::constant(1.f), kiln::constant(2.f))) == 10.f);
  REQUIRE(scalar_of(a.read_value()) == 4.f);
  REQUIRE(scalar_of(b.read_value()) == 6.f);
  // The same graph again: a = 2 * 6 = 12, b = 6 + 12 = 18.
  REQUIRE(scalar_of(f(kiln::constant(1.f), kiln::constant(2.f))) == 30.f);
  REQUIRE(f.tracing_count() == 1);

  variable scale(2.f);
  function g([&](const tensor& x) { return x * scale; }, {.name = "g"});
  REQUIRE(scalar_of(g(kiln::constant(3.f))) == 6.f);
  scale.assign(kiln::constant(5.f));
  REQUIRE(scalar_of(g(kiln::constant(3.f))) == 15.f);
  REQUIRE(g.tracing_count() == 1);
  auto graph = g.get_concrete_function(kiln::constant(3.f)).graph();
  REQUIRE(count_ops(graph, "ReadVariableOp") == 1);
  REQUIRE(count_ops(f.get_concrete_function(kiln::constant(1.f), kiln::constant(2.f)).graph(), "AssignVariableOp") == 1);
}

TEST_CASE("a function that only writes a variable runs its write at every call") {
  variable count(0);
  function bump([&]() { count.assign_add(1); }, {.name = "bump"});
  for (int i = 0; i < 3; ++i) bump();
  REQUIRE(count.read_value().to_vector<std::int32_t>() == std::vector<std::int32_t>{3});
  REQUIRE(bump.tracing_count() == 1);
}

TEST_CASE("a variable created on the first trace and kept is created once") {
  struct counter_state {
    variable count;
  } state;
  int traces = 0;
  function count([&]() {
    ++traces;
    if (!state.count) state.count = variable(0, "count");
    return state.count.assign_add(1);
  }, {.name = "count"});
  REQUIRE(count().to_vector<std::int32_t>() == std::vector<std::int32_t>{1});
  REQUIRE(count().to_vector<std::int32_t>() == std::vector<std::int32_t>{2});
  REQUIRE(traces == 1);
}

TEST_CASE("a variable's initial value may come from the arguments of the first call") {
  struct model {
    variable v;
  } m;
  function f([&](const tensor& x) {
    if (!m.v) m.v = variable(x * 2.f, "v");
    return m.v + x;
  }, {.name = "f"});
  REQUIRE(scalar_of(f(kiln::constant(3.f))) == 9.f);  // v = 6
  REQUIRE(scalar_of(f(kiln::constant(4.f))) == 10.f);  // v stays 6
  REQUIRE(scalar_of(m.v.read_value()) == 6.f);
}

TEST_CASE("variables created and dropped, or created on a later trace, raise value_error") {
  function dropped([](const tensor& x) {
    variable v(1.f);
    return v + x;
  }, {.name = "dropped"});
  require_throws<value_error>([&] { return dropped(kiln::constant(1.f)); },
                              {"dropped", "only supports singleton variables created on the first call"});

  std::vector<variable> kept;
  function later([&](const tensor& x) {
    kept.emplace_back(x);
    return kept.back().read_value();
  }, {.name = "later"});
  require_same(later(kiln::constant(1.f)), kiln::constant(1.f));
  require_throws<value_error>([&] { return later(kiln::constant(1)); },
                              {"later", "only supports singleton variables created on the first call"});
}

TEST_CASE("a variable argument is keyed by identity") {
  variable a(1.f), b(2.f);
  int traces = 0;
  function f([&](const variable& v, const tensor& x) {
    ++traces;
    return v * x;
  }, {.name = "f"});
  REQUIRE(scalar_of(f(a, kiln::constant(3.f))) == 3.f);
  variable a_again = a;
  REQUIRE(scalar_of(f(a_again, kiln::constant(3.f))) == 3.f);
  REQUIRE(traces == 1);
  REQUIRE(scalar_of(f(b, kiln::constant(3.f))) == 6.f);
  REQUIRE(traces == 2);
}

TEST_CASE("kiln::print writes at every call, in tf.print's format; C++ output only while tracing") {
  captured_prints prints;
  int cpp_side_effects = 0;
  function f([&](const tensor& x) {
    ++cpp_side_effects;
    kiln::print("Executed with", x);
    return x + 1;
  }, {.name = "f"});
  f(kiln::constant(1));
  f(kiln::constant(2));
  f(kiln::constant({1, 2}));
  REQUIRE(cpp_side_effects == 2);
  REQUIRE(prints.text() == "Executed with 1\nExecuted with 2\nExecuted with [1 2]\n");
}

TEST_CASE("kiln::print formats strings, numbers, matrices and variables") {
  captured_prints prints;
  kiln::print("a", 2, kiln::constant({{1, 2}, {3, 4}}), kiln::constant("raw"), kiln::constant({true, false}));
  variable v(1.5f);
  kiln::print(v);
  function only_text([] { kiln::print("only text"); }, {.name = "only_text"});
  only_text();
  only_text();
  REQUIRE(prints.text() == "a 2 [[1 2]\n [3 4]] raw [1 0]\n1.5\nonly text\nonly text\n");
}

TEST_CASE("non-strict execution drops unused pure work and keeps every effect") {
  captured_prints prints;
  function f([](const tensor& x) {
    tensor unused = kiln::gather(x, kiln::constant({7}));  // out of range: would raise if it ran
    (void)unused;
    kiln::print("kept");
    return x * 2;
  }, {.name = "f"});
  require_same(f(kiln::constant({1, 2})), kiln::constant({2, 4}));
  REQUIRE(prints.text() == "kept\n");
}

TEST_CASE("kiln::host_callback runs C++ on concrete tensors at every call") {
  std::vector<tensor> seen;
  function f([&](const tensor& x) {
    kiln::host_callback([&](const tensor& value) { seen.push_back(value); }, {}, x);
    auto doubled = kiln::host_callback([](const tensor& value) { return value * 2; }, {tensor_spec(shape{}, int32)}, x);
    return doubled[0] + 1;
  }, {.name = "f"});
  REQUIRE(f(kiln::constant(1)).to_vector<std::int32_t>() == std::vector<std::int32_t>{3});
  REQUIRE(f(kiln::constant(2)).to_vector<std::int32_t>() == std::vector<std::int32_t>{5});
  REQUIRE(seen.size() == 2);
  REQUIRE(seen[1].to_vector<std::int32_t>() == std::vector<std::int32_t>{2});
  REQUIRE(f.tracing_count() == 1);

  auto pair = kiln::host_callback([](const tensor& a, const tensor& b) { return std::tuple{a + b, a * b}; },
                                  {tensor_spec(shape{}, int32), tensor_spec(shape{}, int32)}, kiln::constant(3),
                                  kiln::constant(4));
  REQUIRE(pair.size() == 2);
  REQUIRE(pair[1].to_vector<std::int32_t>() == std::vector<std::int32_t>{12});
}

TEST_CASE("a host callback whose results do not match out_specs raises invalid_argument_error") {
  auto wrong_dtype = [] {
    return kiln::host_callback([](const tensor& x) { return x; }, {tensor_spec(shape{}, float32)}, kiln::constant(1));
  };
  require_throws<invalid_argument_error>(wrong_dtype, {"host_callback", "int32 ()", "float32 ()"});
  function f([](const tensor& x) {
    return kiln::host_callback([](const tensor& v) { return kiln::stack({v, v}); }, {tensor_spec(shape{}, int32)}, x)[0];
  }, {.name = "f"});
  require_throws<invalid_argument_error>([&] { return f(kiln::constant(1)); }, {"host_callback", "(2,)", "()"});
}

namespace {
/// Turns check_numerics on while alive.
struct checked_numerics {
  checked_numerics() { debugging::enable_check_numerics(); }
  ~checked_numerics() { debugging::disable_check_numerics(); }
  checked_numerics(const checked_numerics&) = delete;
  checked_numerics& operator=(const checked_numerics&) = delete;
};

/// log(x) is -Inf at 0; multiplying by 0 then makes a NaN the check must not get to.
tensor log_times_zero(const tensor& x) { return kiln::log(x) * 0.f + 1.f; }
}  // namespace

TEST_CASE("check_numerics names the first op that makes a NaN or an Inf, eagerly and in graphs") {
  const tensor zero = kiln::constant({1.f, 0.f});
  function f(log_times_zero, {.name = "f"});
  function jit(log_times_zero, {.name = "jit", .jit_compile = true});
  // Off: the NaN flows through, as IEEE arithmetic makes it.
  REQUIRE(std::isnan(log_times_zero(zero).to_vector<float>()[1]));
  REQUIRE(std::isnan(f(zero).to_vector<float>()[1]));
  {
    checked_numerics on;
    REQUIRE(debugging::check_numerics_enabled());
    require_throws<invalid_argument_error>([&] { return log_times_zero(zero); }, {"check_numerics", "op log", "Inf"});
    require_throws<invalid_argument_error>([&] { return f(zero); }, {"check_numerics", "op log", "Inf"});
    require_throws<invalid_argument_error>([&] { return jit(zero); }, {"check_numerics", "op log", "Inf"});
    require_throws<invalid_argument_error>([&] { return kiln::constant({0.f}) / 0.f; }, {"check_numerics", "div", "NaN"});
    // Finite results, integer ops (whose division by zero has its own error) and
    // tensors without elements pass.
    require_same(f(kiln::constant({1.f, 1.f})), kiln::constant({1.f, 1.f}));
    require_same(kiln::floordiv(kiln::constant({7}), 2), kiln::constant({3}));
    REQUIRE(kiln::log(kiln::zeros({0}, float32)).size() == 0);
    // Inside loop bodies too.
    auto log_loop = [](const tensor& x) {
      return kiln::while_loop([](const tensor& v) { return v > 1.f; },
                              [](const tensor& v) { return kiln::log(v - v); }, x);
    };
    function loop(log_loop, {.name = "loop"});
    require_throws<invalid_argument_error>([&] { return loop(kiln::constant(4.f)); }, {"check_numerics", "op log", "Inf"});
  }
  REQUIRE_FALSE(debugging::check_numerics_enabled());
  REQUIRE(std::isnan(f(zero).to_vector<float>()[1]));
}

namespace {
/// What a user's code throws; kiln passes it through unchanged.
struct user_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace

TEST_CASE("an exception from a traced callable leaves the function usable; the next call traces again") {
  bool fail = true;
  variable v(kiln::constant(0.f), "v");
  function f([&](const tensor& x) {
    v.assign_add(x);
    if (fail) throw user_failure("the callable failed");
    return v.read_value() * 2.f;
  }, {.name = "f"});
  REQUIRE_THROWS_AS(f(kiln::constant(1.f)), user_failure);
  REQUIRE(scalar_of(v.read_value()) == 0.f);  // a failed trace ran nothing
  fail = false;
  REQUIRE(scalar_of(f(kiln::constant(1.f))) == 2.f);
  REQUIRE(scalar_of(f(kiln::constant(2.f))) == 6.f);
  REQUIRE(f.tracing_count() == 1);  // the failed trace left no concrete function behind
  // An error kiln raises while tracing (a shape mismatch) leaves it usable the same way.
  function g([](const tensor& x) { return x + kiln::constant({1.f, 2.f, 3.f}); }, {.name = "g"});
  REQUIRE_THROWS_AS(g(kiln::constant({1.f, 2.f})), value_error);
  REQUIRE(g(kiln::constant({1.f, 1.f, 1.f})).to_vector<float>() == std::vector<float>{2.f, 3.f, 4.f});
}

TEST_CASE("an exception from a host callback during a graph run keeps what ran before it; later runs are clean") {
  variable v(kiln::constant(0.f), "v");
  function f([&](const tensor& x) {
    v.assign_add(x);  // runs before the callback: automatic control dependencies order them
    kiln::host_callback(
        [](const tensor& value) {
          if (value.item<float>() < 0.f) throw user_failure("negative input");
        },
        {}, x);
    v.assign_add(x * 10.f);
    return v.read_value();
  }, {.name = "f"});
  REQUIRE(scalar_of(f(kiln::constant(1.f))) == 11.f);
  REQUIRE_THROWS_AS(f(kiln::constant(-1.f)), user_failure);
  REQUIRE(scalar_of(v.read_value()) == 10.f);  // the first write was committed, the second never ran
  REQUIRE(scalar_of(f(kiln::constant(2.f))) == 32.f);
  for (int i = 0; i < 3; ++i) REQUIRE_THROWS_AS(f(kiln::constant(-1.f)), user_failure);
  REQUIRE(scalar_of(v.read_value()) == 29.f);
  REQUIRE(f.tracing_count() == 1);
}

// softmax, log_softmax, reduce_logsumexp and the sparse softmax cross-entropy against
// their definitions computed here in double, eagerly and in a kiln::function, with
// large and infinite logits, and their gradients against finite differences.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include <kiln/kiln.hpp>

namespace {

using kiln::tensor;

const std::vector<double> logit_values = {1.0, -2.0, 0.5, 3.0, 1000.0, 999.0, -0.25, 4.0, 2.0};  // (3, 3)

std::vector<double> reference_log_softmax(const std::vector<double>& x, int rows, int cols) {
  std::vector<double> out(x.size());
  for (int r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int c = 0; c < cols; ++c) m = std::max(m, x[std::size_t(r * cols + c)]);
    double sum = 0;
    for (int c = 0; c < cols; ++c) sum += std::exp(x[std::size_t(r * cols + c)] - m);
    for (int c = 0; c < cols; ++c) out[std::size_t(r * cols + c)] = x[std::size_t(r * cols + c)] - m - std::log(sum);
  }
  return out;
}

void require_close(const std::vector<double>& actual, const std::vector<double>& expected, double eps) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(actual[i] == Approx(expected[i]).epsilon(eps).margin(1e-12));
}

}  // namespace

TEST_CASE("softmax, log_softmax and reduce_logsumexp follow their definitions, without overflow") {
  const tensor logits = kiln::constant(logit_values, kiln::shape{3, 3});
  const std::vector<double> log_p = reference_log_softmax(logit_values, 3, 3);
  std::vector<double> p(log_p.size()), lse(3);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = std::exp(log_p[i]);
  for (int r = 0; r < 3; ++r) lse[std::size_t(r)] = logit_values[std::size_t(r * 3)] - log_p[std::size_t(r * 3)];

  kiln::function graph([](const tensor& x) {
    return std::tuple{kiln::softmax(x), kiln::log_softmax(x), kiln::reduce_logsumexp(x, 1)};
  });
  const auto [gp, glp, glse] = graph(logits);
  for (int run = 0; run < 2; ++run) {
    const tensor sp = run ? gp : kiln::softmax(logits), lsp = run ? glp : kiln::log_softmax(logits);
    const tensor l = run ? glse : kiln::reduce_logsumexp(logits, 1);
    require_close(sp.to_vector<double>(), p, 1e-14);
    require_close(lsp.to_vector<double>(), log_p, 1e-14);
    require_close(l.to_vector<double>(), lse, 1e-14);
  }
  // Along the first axis, and over every axis with keepdims.
  const std::vector<double> column = {logit_values[1], logit_values[4], logit_values[7]};
  const std::vector<double> column_log_p = reference_log_softmax(column, 1, 3);
  const std::vector<double> along_0 = kiln::log_softmax(logits, 0).to_vector<double>();
  for (int r = 0; r < 3; ++r) CHECK(along_0[std::size_t(r * 3 + 1)] == Approx(column_log_p[std::size_t(r)]));
  const tensor all = kiln::reduce_logsumexp(logits, {}, true);
  CHECK(all.shape() == kiln::shape{1, 1});
  double total = 0;
  for (double v : logit_values) total += std::exp(v - 1000.0);
  CHECK(all.to_vector<double>()[0] == Approx(1000.0 + std::log(total)));
}

TEST_CASE("a row of -inf logits gives -inf, not NaN, as TensorFlow") {
  const double inf = std::numeric_limits<double>::infinity();
  const tensor x = kiln::constant({{-inf, -inf}, {0.0, -inf}});
  const std::vector<double> lse = kiln::reduce_logsumexp(x, 1).to_vector<double>();
  CHECK(lse[0] == -inf);
  CHECK(lse[1] == 0.0);
  CHECK(kiln::softmax(x).to_vector<double>()[2] == 1.0);
}

TEST_CASE("sparse_softmax_cross_entropy is -log softmax at the label") {
  const tensor logits = kiln::constant(logit_values, kiln::shape{3, 3});
  const std::vector<double> log_p = reference_log_softmax(logit_values, 3, 3);
  for (const kiln::dtype label_type : {kiln::int32, kiln::int64}) {
    const tensor labels = kiln::cast(kiln::constant({2, 0, 1}), label_type);
    const std::vector<double> expected = {-log_p[2], -log_p[3], -log_p[7]};
    require_close(kiln::sparse_softmax_cross_entropy(labels, logits).to_vector<double>(), expected, 1e-14);
    kiln::function loss([](const tensor& y, const tensor& x) { return kiln::sparse_softmax_cross_entropy(y, x); });
    require_close(loss(labels, logits).to_vector<double>(), expected, 1e-14);
    // A label outside [0, classes) is an error, eagerly and in the graph.
    const tensor bad = kiln::cast(kiln::constant({2, 3, 1}), label_type);
    CHECK_THROWS_AS(kiln::sparse_softmax_cross_entropy(bad, logits), kiln::invalid_argument_error);
    CHECK_THROWS_AS(loss(bad, logits), kiln::invalid_argument_error);
  }
  CHECK_THROWS_AS(kiln::sparse_softmax_cross_entropy(kiln::constant({1.f}), logits), kiln::type_error);
  CHECK_THROWS_AS(kiln::softmax(kiln::constant({1, 2})), kiln::type_error);
}

TEST_CASE("the softmax family's gradients follow their definitions") {
  const tensor logits = kiln::constant({{0.5, -1.0, 2.0}, {0.0, 0.25, -0.5}});
  const tensor labels = kiln::constant({2, 0});
  const tensor weights = kiln::constant({{1.0, -2.0, 0.5}, {3.0, 1.0, -1.0}});
  kiln::gradient_tape tape({.persistent = true});
  tape.watch(logits);
  const tensor ce = kiln::reduce_sum(kiln::sparse_softmax_cross_entropy(labels, logits));
  const tensor weighted = kiln::reduce_sum(kiln::softmax(logits) * weights);
  const tensor lse = kiln::reduce_sum(kiln::reduce_logsumexp(logits, 1));
  const std::vector<double> x = logits.to_vector<double>(), w = weights.to_vector<double>();
  std::vector<double> p(6);
  for (int r = 0; r < 2; ++r) {
    double sum = 0;
    for (int c = 0; c < 3; ++c) sum += std::exp(x[std::size_t(r * 3 + c)]);
    for (int c = 0; c < 3; ++c) p[std::size_t(r * 3 + c)] = std::exp(x[std::size_t(r * 3 + c)]) / sum;
  }
  std::vector<double> d_ce(6), d_weighted(6);
  const int label[] = {2, 0};
  for (int r = 0; r < 2; ++r) {
    double pw = 0;
    for (int c = 0; c < 3; ++c) pw += p[std::size_t(r * 3 + c)] * w[std::size_t(r * 3 + c)];
    for (int c = 0; c < 3; ++c) {
      const std::size_t i = std::size_t(r * 3 + c);
      d_ce[i] = p[i] - (c == label[r] ? 1.0 : 0.0);  // softmax minus one-hot
      d_weighted[i] = p[i] * (w[i] - pw);
    }
  }
  require_close(tape.gradient(ce, logits).to_vector<double>(), d_ce, 1e-12);
  require_close(tape.gradient(weighted, logits).to_vector<double>(), d_weighted, 1e-12);
  require_close(tape.gradient(lse, logits).to_vector<double>(), p, 1e-12);  // d logsumexp = softmax
}

// The activations against TensorFlow 2.12's values (tf.nn.gelu, tf.nn.softplus,
// tf.nn.silu, tf.keras.activations.elu, tf.keras.layers.LeakyReLU, tf.math.erf),
// printed by TensorFlow and copied here, in float32. (TensorFlow's erf and tanh are
// approximations: its gelu(-3) is 4.5e-5 off the exact -0.0040496941, its float64
// gradients up to 6e-9; the tolerances allow for that.)
TEST_CASE("the activations compute what TensorFlow 2.12 computes") {
  const tensor x = kiln::constant({-3.f, -1.f, -0.5f, 0.f, 0.5f, 1.f, 3.f, 20.f, -20.f, 1.5f});
  const auto check = [&](const tensor& got, const std::vector<double>& tf) {
    REQUIRE(got.dtype() == kiln::float32);
    const std::vector<float> v = got.to_vector<float>();
    REQUIRE(v.size() == tf.size());
    for (std::size_t i = 0; i < tf.size(); ++i) CHECK(v[i] == Approx(tf[i]).epsilon(5e-5).margin(1e-7));
  };
  kiln::function traced([](const tensor& v) {
    return std::vector<tensor>{kiln::gelu(v), kiln::gelu(v, true), kiln::softplus(v), kiln::silu(v), kiln::elu(v),
                               kiln::elu(v, 0.5), kiln::leaky_relu(v), kiln::erf(v)};
  });
  const std::vector<tensor> graph = traced(x);
  const std::vector<tensor> eager = {kiln::gelu(x), kiln::gelu(x, true), kiln::softplus(x), kiln::silu(x), kiln::elu(x),
                                     kiln::elu(x, 0.5), kiln::leaky_relu(x), kiln::erf(x)};
  const std::vector<std::vector<double>> tf = {
      {-0.004049509763717651, -0.1586552858352661, -0.1542687714099884, 0.0, 0.3457312285900116, 0.8413447141647339,
       2.995950698852539, 20.0, -0.0, 1.3997893333435059},
      {-0.0036375224590301514, -0.15880796313285828, -0.1542859971523285, 0.0, 0.3457140028476715, 0.8411920070648193,
       2.9963626861572266, 20.0, -0.0, 1.3995715379714966},
      {0.04858735576272011, 0.3132616877555847, 0.4740769863128662, 0.6931471824645996, 0.9740769267082214,
       1.31326162815094, 3.0485870838165283, 20.0, 2.06115369216775e-09, 1.7014132738113403},
      {-0.14227762818336487, -0.2689414322376251, -0.1887703388929367, 0.0, 0.3112296760082245, 0.7310585975646973,
       2.857722282409668, 20.0, -4.1223074731533416e-08, 1.2263617515563965},
      {-0.9502129554748535, -0.6321205496788025, -0.39346933364868164, 0.0, 0.5, 1.0, 3.0, 20.0, -1.0, 1.5},
      {-0.47510647773742676, -0.31606027483940125, -0.19673466682434082, 0.0, 0.5, 1.0, 3.0, 20.0, -0.5, 1.5},
      {-0.9000000357627869, -0.30000001192092896, -0.15000000596046448, 0.0, 0.5, 1.0, 3.0, 20.0, -6.0, 1.5},
      {-0.9999780058860779, -0.842700719833374, -0.5204998850822449, 0.0, 0.5204998850822449, 0.842700719833374,
       0.9999780058860779, 1.0, -1.0, 0.9661049842834473}};
  for (std::size_t k = 0; k < tf.size(); ++k) {
    INFO("activation " << k);
    check(eager[k], tf[k]);
    check(graph[k], tf[k]);
  }
  // Their gradients at float64 points, from tf.GradientTape.
  const tensor xd = kiln::constant({-2.0, -0.3, 0.0, 0.7, 2.5});
  const std::vector<std::pair<std::function<tensor(const tensor&)>, std::vector<double>>> grads = {
      // (exact gelu's from Phi(x) + x * phi(x) with Python's math.erf: TensorFlow's
      // float64 erf is 4e-8 off here)
      {[](const tensor& v) { return kiln::gelu(v); },
       {-0.08523180107819692, 0.26767223317289013, 0.5, 0.9766141011336599, 1.037611085908145}},
      {[](const tensor& v) { return kiln::gelu(v, true); },
       {-0.08609925692200995, 0.26770454842231384, 0.5, 0.9763572181304316, 1.0379515769630805}},
      {[](const tensor& v) { return kiln::softplus(v); },
       {0.11920292202211755, 0.425557483188341, 0.5, 0.6681877721681662, 0.9241418199787564}},
      {[](const tensor& v) { return kiln::silu(v); },
       {-0.09078424878489547, 0.3522199896811173, 0.5, 0.8233867834733425, 1.0994011113415267}},
      {[](const tensor& v) { return kiln::elu(v, 0.5); }, {0.06766764161830635, 0.37040911034085894, 0.5, 1.0, 1.0}},
      {[](const tensor& v) { return kiln::leaky_relu(v); }, {0.3, 0.3, 0.3, 1.0, 1.0}},
      {[](const tensor& v) { return kiln::erf(v); },
       {0.020666985354092057, 1.031260909618963, 1.1283791670955126, 0.6912748604105386, 0.00217828423035271}}};
  for (const auto& [f, expected] : grads) {
    kiln::gradient_tape tape;
    tape.watch(xd);
    const std::vector<double> g = tape.gradient(f(xd), xd).to_vector<double>();
    for (std::size_t i = 0; i < expected.size(); ++i) CHECK(g[i] == Approx(expected[i]).epsilon(1e-8).margin(1e-15));
  }
  // Integers are rejected: when the op runs, as an operand that does not fit
  // (invalid_argument_error); while tracing, as a dtype (type_error).
  CHECK_THROWS_AS(kiln::gelu(kiln::constant({1, 2})), kiln::invalid_argument_error);
  kiln::function gelu_of([](const kiln::tensor& x) { return kiln::gelu(x); });
  CHECK_THROWS_AS(gelu_of(kiln::constant({1, 2})), kiln::type_error);
}

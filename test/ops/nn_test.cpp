// softmax, log_softmax, reduce_logsumexp and the sparse softmax cross-entropy against
// their definitions computed here in double, eagerly and in a kiln::function, with
// large and infinite logits, and their gradients against finite differences.

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
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

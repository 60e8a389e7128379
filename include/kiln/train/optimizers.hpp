#pragma once
/// \file
/// Keras' optimizers: `kiln::optimizers::sgd` and `adam`, with Keras' arguments and
/// update rules. `apply_gradients(grads, vars)` updates each variable from its
/// gradient (eagerly, or as variable writes of the function being traced), creating
/// the optimizer's slot variables (momentums, Adam's moments) on first use, as Keras
/// does: inside a kiln::function traced before, that creation is the singleton-
/// variable kiln::value_error, and one function (or concrete function) per optimizer
/// is the way around it. An optimizer makes its `iterations` variable when it is
/// made, so one made inside a function must outlive the trace, as variables must. The members that run ops are templates, as op functions are,
/// so that a program compiles them only where it trains.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/ops/elementwise.hpp"
#include "kiln/ops/factories.hpp"
#include "kiln/trace/effects.hpp"
#include "kiln/trace/trace_context.hpp"

namespace kiln::optimizers {

/// Options of kiln::optimizers::sgd (Keras' `SGD`).
struct sgd_options {
  double learning_rate = 0.01;
  double momentum = 0.0;  ///< 0 for plain gradient descent; in [0, 1]
  bool nesterov = false;
};

/// Options of kiln::optimizers::adam (Keras' `Adam`).
struct adam_options {
  double learning_rate = 1e-3;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
};

namespace detail {

template <class Unused>
struct basic_optimizer_updates;

/// What every optimizer has: the step count and, per variable, its slot variables.
class optimizer_state {
  template <class>
  friend struct basic_optimizer_updates;

 public:
  /// The steps applied so far: an int64 scalar variable, as Keras' `iterations`.
  const variable& iterations() const { return iterations_; }
  /// The slot variables made so far, by variable in the order first updated (what a
  /// checkpoint saves beside `iterations`).
  KILN_LIBRARY_INLINE std::vector<variable> slot_variables() const;

 protected:
  // Constructors are templates, as op functions are: they make a variable.
  // As Keras makes `iterations` when an optimizer is made: an optimizer made while a
  // function is traced creates a variable there, so that one made at every call (a
  // local of the callable), even plain SGD, is the singleton-variable kiln::value_error.
  template <class = void>
  explicit optimizer_state(std::string name)
      : name_(std::move(name)), iterations_(kiln::constant(std::int64_t{0}), name_ + "/iterations") {}

  std::string name_;
  variable iterations_;

 private:
  std::vector<std::pair<const void*, std::vector<variable>>> slots_;
};

}  // namespace detail

class sgd;
class adam;

namespace detail {
/// The optimizers' updates (`optimizer_updates`, the one specialization): a template
/// on nothing, so that a file compiles them only where it applies gradients, and a
/// compiled kiln compiles them all with one explicit instantiation
/// (kiln/separate_compilation.hpp).
template <class Unused>
struct basic_optimizer_updates {
  static void apply(sgd& self, const std::vector<tensor>& grads, const std::vector<variable>& vars);
  static void apply(adam& self, const std::vector<tensor>& grads, const std::vector<variable>& vars);

 private:
  /// `v.assign_add(delta)` with the same bits, written as an assignment of the sum so
  /// that in a kiln::function the sum fuses into the pass that computes `delta`
  /// (an assign_add is a pass of its own over the variable).
  static void add_to(const variable& v, const tensor& delta);

  /// The (gradient, variable) pairs to update: those with a gradient, every pair
  /// checked before any variable changes. Raises kiln::invalid_argument_error for lists
  /// of different lengths or a gradient whose dtype or shape is not its variable's (a
  /// scalar gradient would otherwise broadcast over the variable, silently; Keras 2.12
  /// lets it), and kiln::value_error when no variable has a gradient, as Keras does.
  static std::vector<std::pair<tensor, variable>> pairs(const optimizer_state& self, const std::vector<tensor>& grads,
                                                         const std::vector<variable>& vars);

  /// The `count` slot variables of `v` (zeros of its dtype and shape), created on the
  /// first call for `v`. Created while tracing a function traced before, they make
  /// the call raise the singleton-variable kiln::value_error, as in TensorFlow.
  static const std::vector<variable>& slots(optimizer_state& self, const variable& v,
                                           const std::vector<std::string>& kinds);

  /// `x` as a scalar of dtype `t` (Keras casts its hyperparameters to the variable's dtype).
  static tensor scalar(double x, dtype t);
};
using optimizer_updates = basic_optimizer_updates<void>;
}  // namespace detail

/// Gradient descent with optional (Nesterov) momentum, as Keras' `SGD`:
/// `v -= lr * g`, or with momentum `m = momentum * m - lr * g; v += m`
/// (`v += momentum * m - lr * g` with Nesterov).
/// \code
/// kiln::variable w(2.f);
/// kiln::optimizers::sgd opt({.learning_rate = 0.1});
/// opt.apply_gradients({kiln::constant(1.f)}, {w});  // w is 1.9
/// \endcode
class sgd : public detail::optimizer_state {
  template <class>
  friend struct detail::basic_optimizer_updates;

 public:
  template <class = void>
  explicit sgd(sgd_options options = {}) : optimizer_state("SGD"), options_(options) {
    if (options.momentum < 0 || options.momentum > 1)
      throw invalid_argument_error("SGD: momentum must be in [0, 1], got " + std::to_string(options.momentum));
  }
  const sgd_options& options() const { return options_; }

  /// Updates each variable from its gradient (variables without one are skipped), then
  /// counts the step; inside a kiln::function, as writes of the function.
  template <class Unused = void>
  void apply_gradients(const std::vector<tensor>& grads, const std::vector<variable>& vars) {
    detail::basic_optimizer_updates<Unused>::apply(*this, grads, vars);
  }

 private:
  sgd_options options_;
};

/// Adam, as Keras' `Adam`: with step `t` (iterations + 1),
/// `m += (g - m) * (1 - beta_1)`, `u += (g² - u) * (1 - beta_2)`,
/// `v -= m * lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) / (sqrt(u) + epsilon)`.
/// \code
/// std::vector<kiln::variable> vars{kiln::variable(kiln::constant({1.f, 2.f}))};
/// kiln::optimizers::adam opt({.learning_rate = 1e-2});
/// kiln::gradient_tape tape;
/// kiln::tensor loss = kiln::reduce_sum(vars[0] * vars[0]);
/// opt.apply_gradients(tape.gradient(loss, vars), vars);
/// \endcode
class adam : public detail::optimizer_state {
  template <class>
  friend struct detail::basic_optimizer_updates;

 public:
  template <class = void>
  explicit adam(adam_options options = {}) : optimizer_state("Adam"), options_(options) {}
  const adam_options& options() const { return options_; }

  /// As sgd::apply_gradients.
  template <class Unused = void>
  void apply_gradients(const std::vector<tensor>& grads, const std::vector<variable>& vars) {
    detail::basic_optimizer_updates<Unused>::apply(*this, grads, vars);
  }

 private:
  adam_options options_;
};

#if KILN_DEFINE_LIBRARY
template <class Unused>
void detail::basic_optimizer_updates<Unused>::apply(sgd& self, const std::vector<tensor>& grads,
                                                    const std::vector<variable>& vars) {
  for (const auto& [g, v] : pairs(self, grads, vars)) {
    const tensor lr = scalar(self.options_.learning_rate, v.dtype());
    if (self.options_.momentum == 0) {
      add_to(v, -g * lr);
      continue;
    }
    const tensor momentum = scalar(self.options_.momentum, v.dtype());
    const variable& m = slots(self, v, {"momentum"})[0];
    const tensor velocity = m.assign(-g * lr + m.read_value() * momentum);
    add_to(v, self.options_.nesterov ? -g * lr + velocity * momentum : velocity);
  }
  self.iterations_.assign_add(std::int64_t{1});
}

template <class Unused>
void detail::basic_optimizer_updates<Unused>::apply(adam& self, const std::vector<tensor>& grads,
                                                    const std::vector<variable>& vars) {
  for (const auto& [g, v] : pairs(self, grads, vars)) {
    const dtype t = v.dtype();
    const tensor one = scalar(1, t), beta_1 = scalar(self.options_.beta_1, t),
                 beta_2 = scalar(self.options_.beta_2, t);
    const tensor step = kiln::cast(self.iterations_.read_value() + std::int64_t{1}, t);
    const tensor beta_1_power = kiln::pow(beta_1, step), beta_2_power = kiln::pow(beta_2, step);
    const std::vector<variable>& moments = slots(self, v, {"m", "v"});
    const tensor m_old = moments[0].read_value(), u_old = moments[1].read_value();
    // Keras subtracts the betas from 1 in double (Python floats), then casts.
    const tensor m = moments[0].assign(m_old + (g - m_old) * scalar(1 - self.options_.beta_1, t));
    const tensor u = moments[1].assign(u_old + (kiln::square(g) - u_old) * scalar(1 - self.options_.beta_2, t));
    const tensor alpha =
        scalar(self.options_.learning_rate, t) * kiln::sqrt(one - beta_2_power) / (one - beta_1_power);
    v.assign(v.read_value() - m * alpha / (kiln::sqrt(u) + scalar(self.options_.epsilon, t)));
  }
  self.iterations_.assign_add(std::int64_t{1});
}
#endif

}  // namespace kiln::optimizers

#if KILN_DEFINE_LIBRARY
namespace kiln::optimizers::detail {

KILN_LIBRARY_INLINE std::vector<variable> optimizer_state::slot_variables() const {
  std::vector<variable> out;
  for (const auto& [identity, vars] : slots_) out.insert(out.end(), vars.begin(), vars.end());
  return out;
}

template <class Unused>
void basic_optimizer_updates<Unused>::add_to(const variable& v, const tensor& delta) {
  v.assign(v.read_value() + delta);
}

template <class Unused>
auto basic_optimizer_updates<Unused>::pairs(const optimizer_state& self, const std::vector<tensor>& grads,
                                            const std::vector<variable>& vars)
    -> std::vector<std::pair<tensor, variable>> {
  if (grads.size() != vars.size())
    throw invalid_argument_error(self.name_ + ".apply_gradients: " + std::to_string(grads.size()) + " gradients for " +
                                 std::to_string(vars.size()) + " variables");
  std::vector<std::pair<tensor, variable>> out;
  for (std::size_t k = 0; k < vars.size(); ++k) {
    if (!grads[k].defined()) continue;  // Keras skips a variable without a gradient
    if (!is_floating(vars[k].dtype()))
      throw type_error(self.name_ + ".apply_gradients: variable '" + vars[k].name() + "' is " +
                       std::string(kiln::name(vars[k].dtype())) + "; optimizers update floating-point variables");
    const tensor& g = grads[k];
    // A gradient being traced may have dims known only when the graph runs.
    const bool fits =
        g.is_symbolic() ? vars[k].shape().is_compatible_with(g.shape()) : vars[k].shape().accepts(g.shape());
    if (g.dtype() != vars[k].dtype() || !fits)
      throw invalid_argument_error(self.name_ + ".apply_gradients: the gradient of variable '" + vars[k].name() +
                                   "' (" + std::string(kiln::name(vars[k].dtype())) + " " + vars[k].shape().str() +
                                   ") is " + std::string(kiln::name(g.dtype())) + " " + g.shape().str());
    out.emplace_back(grads[k], vars[k]);
  }
  if (out.empty() && !vars.empty())
    throw value_error(self.name_ + ".apply_gradients: no gradients provided for any variable");
  return out;
}

template <class Unused>
auto basic_optimizer_updates<Unused>::slots(optimizer_state& self, const variable& v,
                                            const std::vector<std::string>& kinds) -> const std::vector<variable>& {
  for (auto& [identity, vars] : self.slots_)
    if (identity == v.identity()) return vars;
  std::vector<variable> made;
  for (const std::string& kind : kinds)
    made.emplace_back(kiln::zeros(v.shape(), v.dtype()), self.name_ + "/" + v.name() + "/" + kind);
  self.slots_.emplace_back(v.identity(), std::move(made));
  return self.slots_.back().second;
}

template <class Unused>
tensor basic_optimizer_updates<Unused>::scalar(double x, dtype t) {
  return kiln::constant(x, t);
}

}  // namespace kiln::optimizers::detail
#endif  // KILN_DEFINE_LIBRARY

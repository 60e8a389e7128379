#pragma once
/// \file
/// kiln::concrete_function: one trace of a kiln::function, called with tensors. Part of
/// kiln/trace/runtime_tier.hpp.

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/core/spec.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/trace/concrete_state.hpp"
#include "kiln/trace/signature.hpp"

namespace kiln {

namespace detail {

/// Writes and reads saved functions; defined by kiln/saved_function.hpp.
template <class = void>
struct saved_function_io;

}  // namespace detail

/// One trace of a kiln::function: a graph for one input signature. Call it with
/// tensors (and, optionally, the C++ values it was traced with).
/// \code
/// kiln::function pow([](const kiln::tensor& x, int n) { return kiln::pow(x, float(n)); });
/// auto square = pow.get_concrete_function(kiln::tensor_spec(kiln::unknown_rank, kiln::float32), 2);
/// square(kiln::constant(10.f));  // 100
/// \endcode
class concrete_function {
 public:
  explicit concrete_function(std::shared_ptr<const detail::concrete_state> s) : state_(std::move(s)) {}

  /// Runs the graph; a function with one output returns it, use call_flat for several.
  /// A callable that returns nothing gives an empty (undefined) tensor.
  template <class... Args>
  tensor operator()(const Args&... args) const {
    std::vector<tensor> out = call(args...);
    if (state_->returns_void) return tensor();
    if (out.size() != 1)
      throw value_error(state_->header() + " returns " + std::to_string(out.size()) + " tensors: use call_flat");
    return out[0];
  }
  /// Runs the graph and returns every output tensor, in order.
  template <class... Args>
  std::vector<tensor> call_flat(const Args&... args) const {
    return call(args...);
  }

  /// The traced graph.
  const kiln::graph& graph() const { return state_->graph; }
  /// One spec per tensor input, named after its argument.
  const std::vector<tensor_spec>& structured_input_signature() const { return state_->inputs; }
  /// One spec per output, named after the graph value (`Identity:0`).
  std::vector<tensor_spec> structured_outputs() const { return state_->outputs; }

  friend std::ostream& operator<<(std::ostream& os, const concrete_function& f) {
    return os << "ConcreteFunction " << f.state_->signature_text();
  }
  /// The signature in TensorFlow's format, without a newline at the end, as
  /// TensorFlow's `pretty_printed_signature()`: `double(a)`, then its Args and Returns.
  /// \code
  /// kiln::function dbl([](const kiln::tensor& a) { return a + a; }, {.name = "double", .arg_names = {"a"}});
  /// std::cout << dbl.get_concrete_function(kiln::constant(1)).pretty_printed_signature();
  /// \endcode
  KILN_LIBRARY_INLINE std::string pretty_printed_signature() const;

  /// Writes this trace, its constants and its variables' values to `path`, for
  /// kiln::load in another program; needs `#include <kiln/saved_function.hpp>`.
  /// \code
  /// kiln::function f([](const kiln::tensor& x) { return x * 2; });
  /// f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)).save("f.kiln");
  /// \endcode
  template <class Io = detail::saved_function_io<>>
  void save(const std::string& path) const {
    if constexpr (requires { Io::save(*this, path); })
      Io::save(*this, path);
    else
      static_assert(sizeof(Io*) == 0, "concrete_function::save needs #include <kiln/saved_function.hpp>");
  }

 private:
  // The saved-function format (kiln/saved_function.hpp) writes the trace itself.
  template <class>
  friend struct detail::saved_function_io;
  template <class... Args>
  std::vector<tensor> call(const Args&... args) const {
    detail::pooled_call_frame frame;
    int arg = 0;
    (detail::flatten(args, frame->signature, arg++), ...);
    state_->check_call(frame->signature);
    std::vector<tensor> out;
    state_->run(frame->signature, out);
    return out;
  }
  std::shared_ptr<const detail::concrete_state> state_;
};

}  // namespace kiln

#if KILN_DEFINE_LIBRARY
namespace kiln {

KILN_LIBRARY_INLINE std::string concrete_function::pretty_printed_signature() const {
  std::string text = state_->signature_text();
  text.pop_back();
  return text;
}

}  // namespace kiln
#endif  // KILN_DEFINE_LIBRARY

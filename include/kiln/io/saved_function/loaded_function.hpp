#pragma once
/// \file
/// kiln::loaded_function: what kiln::load gives back.

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/io/saved_function/saved_function_io.hpp"

namespace kiln {

/// A function loaded from a file that kiln::save wrote: its concrete functions (one
/// per saved signature) and the variables they use, runnable with kiln::tensor
/// arguments, without the callable that was traced.
/// \code
/// kiln::loaded_function f = kiln::load("model.kiln");
/// std::cout << f.pretty_printed_concrete_signatures() << "\n";
/// kiln::tensor y = f(kiln::ones({2, 3}));
/// \endcode
class loaded_function {
 public:
  /// Runs the first concrete function whose signature accepts the arguments; one
  /// output is returned as is, use call_flat for several.
  template <class... Args>
  tensor operator()(const Args&... args) const {
    return select({&static_cast<const tensor&>(args)...})(args...);
  }
  /// Runs the first concrete function whose signature accepts the arguments and
  /// returns every output.
  template <class... Args>
  std::vector<tensor> call_flat(const Args&... args) const {
    return select({&static_cast<const tensor&>(args)...}).call_flat(args...);
  }
  /// The concrete functions, in the order they were saved.
  const std::vector<concrete_function>& concrete_functions() const { return functions_; }
  /// The signatures, in the format of kiln::function::pretty_printed_concrete_signatures.
  std::string pretty_printed_concrete_signatures() const {
    std::string s;
    for (const concrete_function& f : functions_) {
      const std::string text = detail::saved_function_io<>::state_of(f).signature_text();
      if (!s.empty()) s += "\n\n";
      s.append(text, 0, text.size() - 1);
    }
    return s;
  }
  /// The variables the functions read and write, with their current values: reading
  /// and assigning them works as on the variables of the program that saved them.
  const std::vector<kiln::variable>& variables() const { return variables_; }
  /// The variable named `name`, or kiln::value_error.
  const kiln::variable& variable(std::string_view name) const {
    for (const kiln::variable& v : variables_)
      if (v.name() == name) return v;
    throw value_error("loaded_function has no variable named '" + std::string(name) + "'");
  }

 private:
  friend struct detail::saved_function_io<>;
  const concrete_function& select(std::initializer_list<const tensor*> args) const {
    for (const concrete_function& f : functions_) {
      const auto& specs = f.structured_input_signature();
      if (specs.size() != args.size()) continue;
      bool ok = true;
      std::size_t k = 0;
      for (const tensor* t : args) ok = ok && specs[k++].accepts(t->dtype(), t->shape());
      if (ok) return f;
    }
    std::string given;
    for (const tensor* t : args)
      given += (given.empty() ? "" : ", ") + std::string(name(t->dtype())) + " " + t->shape().str();
    throw invalid_argument_error("loaded_function: no saved signature accepts (" + given + "); it has:\n" +
                                 pretty_printed_concrete_signatures());
  }
  std::vector<concrete_function> functions_;
  std::vector<kiln::variable> variables_;
};

}  // namespace kiln

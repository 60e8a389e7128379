#pragma once
/// \file
/// The switch behind `function_options::jit_compile`, apart from the native-loop
/// compiler itself (kiln/exec/jit.hpp) so that the compile-time tier, which has
/// function_options too, need not include that compiler.

#include <concepts>

namespace kiln::detail {

/// The native-loop compiler behind function_options::jit_compile, defined in
/// kiln/exec/jit.hpp (runtime tier).
template <class>
struct native_loops;

/// function_options::jit_compile: a bool that, where a program turns it on, brings in
/// the native-loop compiler. Its constructor is a template, so that a program that
/// never sets the option compiles none of that compiler (its source generation, disk
/// cache and process spawning).
class jit_switch {
 public:
  constexpr jit_switch() = default;
  template <std::same_as<bool> B>
  jit_switch(B on) : on_(on) {
    if constexpr (requires { native_loops<B>::enable(); })
      if (on) native_loops<B>::enable();
  }
  constexpr operator bool() const { return on_; }

 private:
  bool on_ = false;
};
}  // namespace kiln::detail

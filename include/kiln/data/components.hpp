#pragma once
/// \file
/// How C++ values become a dataset element's components, and how a function takes an
/// element's components as separate arguments (`fn(x, y)` for a two-component element).

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kiln/data/pipeline.hpp"
#include "kiln/ops/factories.hpp"

namespace kiln::detail {

/// The component tensors of `value`: a tensor, or a tuple, pair, array or vector of
/// them; C++ numbers become tensors of `spec`'s dtypes when a spec is given.
template <class V>
void append_components(const V& value, dataset_element& out, std::span<const tensor_spec> spec) {
  using U = std::remove_cvref_t<V>;
  if constexpr (std::is_same_v<U, tensor>) {
    out.push_back(value);
  } else if constexpr (std::is_arithmetic_v<U>) {
    const std::size_t k = out.size();
    out.push_back(k < spec.size() ? kiln::constant(value, spec[k].dtype) : kiln::constant(value));
  } else {
    static_assert(is_tuple_like<U>::value || is_vector<U>::value,
                  "a dataset element is a tensor, a C++ number, or a tuple, pair, array or vector of those");
    for_each_element(value, [&](const auto& e) { append_components(e, out, spec); });
  }
}
template <class V>
dataset_element components_of(const V& value, std::span<const tensor_spec> spec = {}) {
  dataset_element out;
  append_components(value, out, spec);
  return out;
}

/// How many element components kiln passes to a function as separate arguments.
inline constexpr std::size_t max_components = 8;
// A class rather than an alias that drops its argument: nvcc's host code loses the
// pack of `alias<I>...` when the alias does not depend on I.
template <std::size_t>
struct component_argument {
  using type = const tensor&;
};

/// Calls a function with the components of an element as separate arguments:
/// `fn(before..., components..., after...)`, for whichever component counts `fn`
/// accepts (a C++ call's arity is fixed; an element's is not until run time).
template <class Fn, class Before, class After>
struct component_call;
template <class Fn, class... Before, class... After>
struct component_call<Fn, std::tuple<Before...>, std::tuple<After...>> {
  /// Whether `fn` takes elements of `N` components.
  template <std::size_t N>
  static constexpr bool accepts = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::is_invocable_v<Fn&, const Before&..., typename component_argument<I>::type..., const After&...>;
  }(std::make_index_sequence<N>{});

  // The smallest component count `fn` takes (0 for none): it gives the result type.
  template <std::size_t N = 1>
  static constexpr std::size_t first_accepted() {
    if constexpr (N > max_components) return 0;
    else if constexpr (accepts<N>) return N;
    else return first_accepted<N + 1>();
  }
  static constexpr std::size_t arity = first_accepted();
  static_assert(arity != 0, "kiln::data: the function must take the components of a dataset element as separate "
                            "kiln::tensor arguments (at most 8), with the loop or reduce state around them");
  using result = decltype([]<std::size_t... I>(std::index_sequence<I...>) {
    return std::type_identity<std::invoke_result_t<Fn&, const Before&..., typename component_argument<I>::type..., const After&...>>{};
  }(std::make_index_sequence<arity>{}));
  using type = typename result::type;

  /// The component counts `fn` takes, as messages list them: "1", "1 or 2".
  static std::string accepted_counts() {
    std::string s;
    [&]<std::size_t... N>(std::index_sequence<N...>) {
      ((accepts<N + 1> ? (void)(s += (s.empty() ? "" : " or ") + std::to_string(N + 1)) : void()), ...);
    }(std::make_index_sequence<max_components>{});
    return s;
  }

  /// Raises kiln::value_error unless `fn` accepts `count` components, naming both.
  static void check(std::size_t count, std::string_view who) {
    bool ok = false;
    [&]<std::size_t... N>(std::index_sequence<N...>) { ((ok = ok || (count == N + 1 && accepts<N + 1>)), ...); }(
        std::make_index_sequence<max_components>{});
    if (!ok)
      throw value_error(std::string(who) + ": the function takes " + accepted_counts() +
                        " tensor(s) per element, but the dataset's elements have " + std::to_string(count));
  }

  /// `fn(before..., element[0], ..., after...)`; check() tells beforehand whether
  /// `fn` takes the element's component count.
  template <std::size_t N = 1>
  static type call(Fn& fn, std::span<const tensor> element, const Before&... before, const After&... after) {
    if constexpr (N > max_components) {
      throw internal_error("kiln::data: an element of " + std::to_string(element.size()) + " components");
    } else {
      if constexpr (accepts<N>) {
        if (element.size() == N)
          return [&]<std::size_t... I>(std::index_sequence<I...>) -> type {
            return fn(before..., element[I]..., after...);
          }(std::make_index_sequence<N>{});
      }
      return call<N + 1>(fn, element, before..., after...);
    }
  }
};

}  // namespace kiln::detail

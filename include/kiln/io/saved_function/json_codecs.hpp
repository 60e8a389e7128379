#pragma once
/// \file
/// Values as a saved function's model holds them: shapes, tensors (their elements stored
/// after the model) and the attributes of registry ops (from each op's
/// `attribute_fields`).

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/mp11/algorithm.hpp>

#include "kiln/io/saved_function/checked_reader.hpp"

#if KILN_DETAIL_SAVED_FUNCTION_CODE
namespace kiln::detail {

inline nlohmann::json shape_to_json(const shape& s) {
  if (!s.has_known_rank()) return nullptr;
  return nlohmann::json(std::vector<std::int64_t>(s.begin(), s.end()));
}

/// A tensor as the model describes it; its elements go to the end of `data` (strings
/// stay in the model), as the file stores them after the model: weights are copied
/// once, not parsed.
inline nlohmann::json tensor_to_json(const tensor& value, std::vector<std::uint8_t>& data) {
  const tensor t = value.device() == device::cpu ? value : value.to(device::cpu);
  nlohmann::json j{{"dtype", std::string(name(t.dtype()))}, {"shape", shape_to_json(t.shape())}};
  if (t.dtype() == string) {
    j["strings"] = t.to_vector<std::string>();
  } else {
    const auto* bytes = static_cast<const std::uint8_t*>(t.raw_data());
    const std::size_t count = std::size_t(t.size()) * std::size_t(size_of(t.dtype()));
    j["offset"] = data.size();
    j["bytes"] = count;
    data.insert(data.end(), bytes, bytes + count);
  }
  return j;
}

inline tensor tensor_from_json(const saved_reader& r, const nlohmann::json& j, std::span<const std::uint8_t> data) {
  const kiln::dtype type = r.dtype_of(r.at(j, "dtype"));
  const kiln::shape dims = r.shape_of(r.at(j, "shape"));
  if (!dims.is_fully_defined()) r.fail("a stored value has the partial shape " + dims.str());
  // Sizes are checked against what the file holds before anything is allocated.
  const std::int64_t elements = dims.num_elements();
  if (type == string) {
    const nlohmann::json& strings = r.array_at(j, "strings");
    if (std::int64_t(strings.size()) != elements)
      r.fail("a string value does not have its " + std::to_string(elements) + " elements");
    tensor t(type, dims);
    auto* out = static_cast<std::string*>(t.raw_data());
    for (std::size_t k = 0; k < strings.size(); ++k) out[k] = r.text(strings[k], "a string element");
    return t;
  }
  const std::size_t expected = std::size_t(elements) * std::size_t(size_of(type));
  const std::uint64_t offset = r.unsigned_at(j, "offset"), count = r.unsigned_at(j, "bytes");
  if (count != expected)
    r.fail("a " + std::string(name(type)) + " " + dims.str() + " value has " + std::to_string(count) +
           " bytes instead of " + std::to_string(expected));
  if (offset > data.size() || count > data.size() - offset)
    r.fail("a value's bytes [" + std::to_string(offset) + ", +" + std::to_string(count) + ") lie outside the file's " +
           std::to_string(data.size()) + " bytes of data");
  const std::span<const std::uint8_t> bytes = data.subspan(offset, count);
  if (type == bool_)
    for (std::uint8_t b : bytes)
      if (b > 1) r.fail("a bool value holds a byte that is neither 0 nor 1");
  tensor t(type, dims);
  if (expected) std::memcpy(t.raw_data(), bytes.data(), expected);
  return t;
}

// ---- op attributes ---------------------------------------------------------------

inline nlohmann::json attribute_to_json(const kiln::dtype& v) { return std::string(name(v)); }
inline nlohmann::json attribute_to_json(const kiln::shape& v) { return shape_to_json(v); }
inline nlohmann::json attribute_to_json(const int_list& v) { return std::vector<std::int64_t>(v.begin(), v.end()); }
inline nlohmann::json attribute_to_json(std::int64_t v) { return v; }
inline nlohmann::json attribute_to_json(bool v) { return v; }
inline nlohmann::json attribute_to_json(double v) { return v; }
inline nlohmann::json attribute_to_json(const reduction_axes& v) {
  return v.all() ? nlohmann::json(nullptr) : attribute_to_json(v.list());
}
inline nlohmann::json attribute_to_json(ops::padding v) { return v == ops::padding::same ? "same" : "valid"; }

inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, kiln::dtype& v) { v = r.dtype_of(j); }
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, kiln::shape& v) { v = r.shape_of(j); }
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, int_list& v) { v = r.ints_of(j); }
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, std::int64_t& v) {
  v = r.integer(j, "an attribute", -(std::int64_t(1) << 48), std::int64_t(1) << 48);
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, bool& v) {
  if (!j.is_boolean()) r.fail("a boolean attribute is not a boolean");
  v = j.get<bool>();
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, double& v) {
  if (!j.is_number()) r.fail("a number attribute is not a number");
  v = j.get<double>();
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, reduction_axes& v) {
  v = j.is_null() ? reduction_axes() : reduction_axes(r.ints_of(j));
}
inline void attribute_from_json(const saved_reader& r, const nlohmann::json& j, ops::padding& v) {
  const std::string p = r.text(j, "a padding");
  if (p != "same" && p != "valid") r.fail("unknown padding \"" + p + "\"");
  v = p == "same" ? ops::padding::same : ops::padding::valid;
}

template <class Op>
concept has_attribute_fields = requires {
  Op::attribute_fields();
};

template <class Op>
nlohmann::json attributes_to_json(const Op& op) {
  nlohmann::json j = nlohmann::json::object();
  if constexpr (has_attribute_fields<Op>)
    std::apply([&](const auto&... a) { ((j[std::string(a.name)] = attribute_to_json(op.*a.member)), ...); },
               Op::attribute_fields());
  return j;
}

/// Op `name` of the registry with the attributes in `j`, or raises naming the op.
inline ops::any_op op_from_json(const saved_reader& r, const std::string& name, const nlohmann::json& j) {
  std::optional<ops::any_op> found;
  boost::mp11::mp_for_each<boost::mp11::mp_transform<std::type_identity, ops::all_ops>>(
      [&]<class Op>(std::type_identity<Op>) {
        if (found || Op::name != name) return;
        Op op{};
        if constexpr (has_attribute_fields<Op>)
          std::apply([&](const auto&... a) { (attribute_from_json(r, r.at(j, a.name), op.*a.member), ...); },
                     Op::attribute_fields());
        found = ops::any_op(op);
      });
  if (!found)
    throw unavailable_error("kiln::load: " + r.path() + ": unknown op \"" + name +
                            "\" (written by a kiln with ops this one does not have)");
  return *found;
}

}  // namespace kiln::detail
#endif

#pragma once
/// \file
/// detail::saved_function_io, which writes and reads saved functions: the friend of the
/// types whose insides a saved function holds. Declared here; its writer is defined in
/// kiln/io/saved_function/writer.hpp, its reader in kiln/io/saved_function/reader.hpp,
/// or, for a program compiled against a kiln library that holds them, in the library.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/io/saved_function/format.hpp"
#include "kiln/kiln.hpp"
#if KILN_DETAIL_SAVED_FUNCTION_CODE
#include "kiln/io/saved_function/checked_reader.hpp"
#endif

namespace kiln {

class loaded_function;

namespace detail {

#if KILN_DETAIL_SAVED_FUNCTION_CODE
/// Writes and reads saved functions (the friend of the types whose insides a saved
/// function holds).
template <class>
struct saved_function_io {
  using json = nlohmann::json;

  // ---- writing (kiln/io/saved_function/writer.hpp) ----------------------------------

  struct writer;
  static json function(writer& w, const concrete_function& f);
  static void save(std::span<const concrete_function> functions, const std::filesystem::path& path);
  static void save(const concrete_function& f, const std::filesystem::path& path) { save(std::span(&f, 1), path); }

  // ---- reading (kiln/io/saved_function/reader.hpp) ----------------------------------

  static constexpr int deepest_nesting = 64;  // of conditionals and loops, against a hostile file

  struct loader;
  static std::vector<std::uint8_t> read_file(const std::string& path);
  static loaded_function load(const std::filesystem::path& file);
  static std::shared_ptr<concrete_state> concrete(const saved_reader& r, loader& l, const json& f);
  static kiln::variable variable_of(std::shared_ptr<variable_state> s) { return kiln::variable(std::move(s)); }
  static const concrete_state& state_of(const concrete_function& f) { return *f.state_; }
};

#else
/// Writes and reads saved functions: compiled in kiln's library (KILN_LIBRARY_HAS_SAVED_FUNCTIONS).
template <class>
struct saved_function_io {
  static void save(std::span<const concrete_function> functions, const std::filesystem::path& path);
  static void save(const concrete_function& f, const std::filesystem::path& path);
  static loaded_function load(const std::filesystem::path& file);
  static const concrete_state& state_of(const concrete_function& f);
};
#endif

}  // namespace detail
}  // namespace kiln

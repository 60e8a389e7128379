#pragma once
/// \file
/// Saved functions: a traced function written to a file, and loaded and run by
/// another program without its callable (docs/saved_function_format.md).
///
/// An optional part of kiln, outside kiln/kiln.hpp: it needs nlohmann/json
/// (Debian `nlohmann-json3-dev`), whose CBOR codec reads and writes the file.
///
/// \code
/// kiln::variable w(kiln::ones({3, 2}), "w"), b(kiln::zeros({2}), "b");
/// kiln::function dense([&](const kiln::tensor& x) { return kiln::relu(kiln::matmul(x, w) + b); });
/// kiln::save(dense, "dense.kiln", kiln::tensor_spec({kiln::none, 3}, kiln::float32));
/// kiln::loaded_function served = kiln::load("dense.kiln");  // in another program
/// kiln::tensor y = served(kiln::ones({2, 3}));
/// \endcode
///
/// The loader checks what it reads before using it: a file that is truncated,
/// corrupted (every file carries a checksum), written by a newer kiln, names an op this
/// kiln does not have, or holds a node whose dtype or shape its op's rules do not give,
/// raises kiln::value_error (kiln::unavailable_error for a newer format or an unknown
/// op) naming the file and the problem.

#include <filesystem>
#include <span>
#include <tuple>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/io/saved_function/format.hpp"
#include "kiln/io/saved_function/checked_reader.hpp"
#include "kiln/io/saved_function/json_codecs.hpp"
#include "kiln/io/saved_function/saved_function_io.hpp"
#include "kiln/io/saved_function/loaded_function.hpp"
#include "kiln/io/saved_function/writer.hpp"
#include "kiln/io/saved_function/reader.hpp"

namespace kiln {

/// Writes `f` (its graph, the constants it captured and the current values of the
/// variables it uses) to `path`. A graph that calls back into C++ (host_callback)
/// cannot be saved: kiln::unavailable_error says so.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::save(f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)), "f.kiln");
/// \endcode
inline void save(const concrete_function& f, const std::filesystem::path& path) {
  detail::saved_function_io<>::save(f, path);
}

/// Writes several concrete functions, which share their variables, to one file.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::save(std::vector{f.get_concrete_function(kiln::tensor_spec({2}, kiln::float32)),
///                        f.get_concrete_function(kiln::tensor_spec({}, kiln::int32))}, "f.kiln");
/// \endcode
inline void save(std::span<const concrete_function> functions, const std::filesystem::path& path) {
  detail::saved_function_io<>::save(functions, path);
}

/// Traces `f` for each signature in `signatures` (a spec or tensor for a function of
/// one argument, a std::tuple of them for several) and writes them to one file.
/// \code
/// kiln::function f([](const kiln::tensor& x) { return x * 2; });
/// kiln::save(f, "f.kiln", kiln::tensor_spec({kiln::none}, kiln::float32), kiln::tensor_spec({}, kiln::int32));
/// \endcode
template <class F, class... Signatures>
void save(function<F>& f, const std::filesystem::path& path, const Signatures&... signatures) {
  auto one = [&]<class S>(const S& s) -> concrete_function {
    if constexpr (detail::is_tuple_like<S>::value)
      return std::apply([&](const auto&... a) { return concrete_function(f.get_concrete_function(a...)); }, s);
    else
      return f.get_concrete_function(s);
  };
  const std::vector<concrete_function> functions{one(signatures)...};
  save(std::span<const concrete_function>(functions), path);
}

/// Reads a file that kiln::save wrote. The ops of its graphs must have kernels in this
/// program: a program that never calls an op itself links kiln's kernels
/// (kiln_add_library, or KILN_INSTANTIATE_KERNELS(KILN_ALL_OPS) in one source file),
/// or kiln::unavailable_error names the op.
/// \code kiln::loaded_function f = kiln::load("f.kiln"); \endcode
inline loaded_function load(const std::filesystem::path& path) { return detail::saved_function_io<>::load(path); }

}  // namespace kiln

// A compiled kiln whose library compiled the reader and writer (kiln/separate_compilation.hpp)
// defines KILN_LIBRARY_HAS_SAVED_FUNCTIONS for its users: they only declare them.
#if defined(KILN_SEPARATE_COMPILATION) && defined(KILN_LIBRARY_HAS_SAVED_FUNCTIONS)
#if defined(KILN_LIBRARY_SOURCE)
template struct kiln::detail::saved_function_io<void>;
#else
extern template struct kiln::detail::saved_function_io<void>;
#endif
#endif

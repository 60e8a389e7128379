# kiln_precompile_headers(<target> [HEADERS <header>...])
#
# Precompiles <kiln/kiln.hpp> (and the given headers, e.g. <kiln/saved_function.hpp>)
# for <target>'s source files: their include of kiln then costs a fraction of a second
# rather than parsing kiln's headers again in every file (bench/compile_times.md has the
# measured gain). Precompiling itself costs about a file's include, once per target;
# give several targets the same flags and use target_precompile_headers(<other>
# REUSE_FROM <target>) to share it.
#
#   find_package(kiln CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE kiln::kiln)
#   kiln_precompile_headers(app)
function(kiln_precompile_headers target)
  cmake_parse_arguments(arg "" "" "HEADERS" ${ARGN})
  target_precompile_headers(${target} PRIVATE <kiln/kiln.hpp> ${arg_HEADERS})
endfunction()

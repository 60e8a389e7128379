# Debian's xsimd CMake package (8.1) links its `xsimd` target to a library named `xtl`
# without looking for it, so every consumer would link a missing `-lxtl`. Provide the
# target before find_package(xsimd): the real one from xtl-dev when installed, else an
# empty stand-in (xsimd does not need xtl's headers for anything kiln uses).
# Included by kiln's own CMakeLists.txt and by the installed kilnConfig.cmake.

if(NOT TARGET xtl)
  find_package(xtl QUIET CONFIG)
endif()
if(NOT TARGET xtl)
  add_library(xtl INTERFACE IMPORTED)
endif()

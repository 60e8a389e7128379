# The API reference: `cmake --build build --target docs` runs Doxygen on include/kiln
# with docs/Doxyfile and writes build/docs/html/. Defined only where CMake finds Doxygen,
# and only when kiln is the top-level project (a target named `docs` is the project's
# own). Any Doxygen warning fails the target (the log: build/docs/warnings.log); with
# KILN_DOCS_STRICT, an undocumented public name counts as one too.
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  option(KILN_DOCS_STRICT "the docs target also fails on undocumented public names" OFF)
  if(KILN_DOCS_STRICT)
    set(kiln_docs_undocumented YES)
  else()
    set(kiln_docs_undocumented NO)
  endif()
  add_custom_target(docs
    COMMAND "${CMAKE_COMMAND}" -E make_directory "${PROJECT_BINARY_DIR}/docs"
    COMMAND "${CMAKE_COMMAND}" -E env "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
      "KILN_DOCS_OUTPUT=${PROJECT_BINARY_DIR}/docs" "KILN_DOCS_UNDOCUMENTED=${kiln_docs_undocumented}"
      "${DOXYGEN_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/docs/Doxyfile"
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    COMMENT "Writing kiln's API reference to ${PROJECT_BINARY_DIR}/docs/html"
    VERBATIM)
else()
  message(STATUS "kiln: Doxygen not found, so there is no docs target (apt-get install doxygen)")
endif()

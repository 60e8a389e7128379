# cmake -D SOURCE=<case.cpp> -D TARGET=<object library> -D BUILD_DIR=<dir> -D CONFIG=<cfg>
#       -P expect_compile_failure.cmake
# Builds TARGET; succeeds only if the build fails and its output matches every
# `// expect: <regex>` line of SOURCE.
cmake_minimum_required(VERSION 3.21)

file(STRINGS "${SOURCE}" expectations REGEX "^[ \t]*// expect: ")
list(TRANSFORM expectations REPLACE "^[ \t]*// expect: *" "")

# LC_ALL=C: plain ASCII quotes in GCC's messages, whatever the locale.
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env LC_ALL=C "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" --config "${CONFIG}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)

get_filename_component(case "${SOURCE}" NAME)
if(result EQUAL 0)
  message(FATAL_ERROR "${case} compiled, but it must not:\n${output}")
endif()
foreach(expected IN LISTS expectations)
  if(NOT output MATCHES "${expected}")
    message(FATAL_ERROR "${case} failed to compile as it should, but the output does not "
                        "match `${expected}`:\n${output}")
  endif()
  message(STATUS "${case}: compile error matches `${expected}`")
endforeach()

# cmake -D SOURCE=<case.cpp> -D TARGET=<object library> -D BUILD_DIR=<dir> -D CONFIG=<cfg>
#       -P expect_compile_failure.cmake
# Builds TARGET; succeeds only if the build fails and the compiler's diagnostic
# matches what SOURCE asks:
#   // expect: <regex>              somewhere in the diagnostic
#   // expect-first-error: <regex>  on its first line that says `error:`
#   // expect-early: <regex>        within its first 15 lines
#   // max-lines: <n>               at most n lines in all
cmake_minimum_required(VERSION 3.21)

function(expectations_of kind out)
  file(STRINGS "${SOURCE}" lines REGEX "^[ \t]*// ${kind}: ")
  list(TRANSFORM lines REPLACE "^[ \t]*// ${kind}: *" "")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
expectations_of(expect expectations)
expectations_of(expect-first-error first_error_expectations)
expectations_of(expect-early early_expectations)
expectations_of(max-lines max_lines)

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

# The compiler's diagnostic: the output without the build tool's own lines.
string(REPLACE ";" "," output_lines "${output}")
string(REPLACE "\n" ";" output_lines "${output_lines}")
set(diagnostic)
foreach(line IN LISTS output_lines)
  if(NOT line MATCHES "^(\\[|g?make|ninja|FAILED:|cd |/usr/bin/|.*Building CXX|.*Error [0-9]|$)")
    list(APPEND diagnostic "${line}")
  endif()
endforeach()
list(LENGTH diagnostic diagnostic_lines)
foreach(limit IN LISTS max_lines)
  if(diagnostic_lines GREATER limit)
    message(FATAL_ERROR "${case}: the diagnostic has ${diagnostic_lines} lines, more than ${limit}:\n${output}")
  endif()
  message(STATUS "${case}: ${diagnostic_lines} lines of diagnostic, at most ${limit}")
endforeach()
if(first_error_expectations)
  set(first_error)
  foreach(line IN LISTS diagnostic)
    if(line MATCHES "error:")
      set(first_error "${line}")
      break()
    endif()
  endforeach()
  foreach(expected IN LISTS first_error_expectations)
    if(NOT first_error MATCHES "${expected}")
      message(FATAL_ERROR "${case}: the first error line does not match `${expected}`: ${first_error}")
    endif()
    message(STATUS "${case}: the first error line matches `${expected}`")
  endforeach()
endif()
if(early_expectations)
  list(SUBLIST diagnostic 0 15 early)
  string(JOIN "\n" early "${early}")
  foreach(expected IN LISTS early_expectations)
    if(NOT early MATCHES "${expected}")
      message(FATAL_ERROR "${case}: the first 15 lines do not match `${expected}`:\n${early}")
    endif()
    message(STATUS "${case}: the first 15 lines match `${expected}`")
  endforeach()
endif()

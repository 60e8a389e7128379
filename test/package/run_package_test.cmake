# cmake -D MODE=find_package|add_subdirectory -D KILN_SOURCE_DIR=... -D KILN_BUILD_DIR=...
#       -D KILN_VERSION=... -D WORK_DIR=... -D GENERATOR=... -D CXX_COMPILER=... -D CONFIG=...
#       -D EXPECT_ONNX=ON|OFF
#       -P run_package_test.cmake
# Configures, builds and runs the consumer project beside this script against kiln:
# installed from KILN_BUILD_DIR into a fresh prefix (find_package), or KILN_SOURCE_DIR
# itself (add_subdirectory).
cmake_minimum_required(VERSION 3.21)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "`${command}` failed (${result}):\n${output}")
  endif()
  set(output "${output}" PARENT_SCOPE)
endfunction()

if(NOT CONFIG)
  set(CONFIG Release)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${CONFIG}"
                  "-DKILN_EXPECT_ONNX=${EXPECT_ONNX}")
if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" --install "${KILN_BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")
  list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND consumer_args "-DKILN_SOURCE_DIR=${KILN_SOURCE_DIR}")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

get_filename_component(consumer_source "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)
run("${CMAKE_COMMAND}" -S "${consumer_source}" -B "${WORK_DIR}/build" ${consumer_args})
message(STATUS "configure:\n${output}")

# The consumer must have used the kiln this test meant, not one found elsewhere.
set(cache_file "${WORK_DIR}/build/CMakeCache.txt")
if(MODE STREQUAL "find_package")
  file(STRINGS "${cache_file}" cache REGEX "^kiln_DIR:")
  string(FIND "${cache}" "kiln_DIR:PATH=${prefix}/" position)
  if(NOT position EQUAL 0)
    message(FATAL_ERROR "find_package found another kiln: ${cache}")
  endif()
else()
  # Not the top-level project: kiln's own tests, examples and benchmarks stay off.
  file(STRINGS "${cache_file}" cache REGEX "^KILN_BUILD_(TESTS|EXAMPLES|BENCHMARKS):BOOL=ON")
  if(cache)
    message(FATAL_ERROR "add_subdirectory turned on: ${cache}")
  endif()
endif()

run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build" --config "${CONFIG}")
find_program(consumer NAMES consumer PATHS "${WORK_DIR}/build" "${WORK_DIR}/build/${CONFIG}" NO_DEFAULT_PATH NO_CACHE)
run("${consumer}")
message(STATUS "consumer printed: ${output}")
if(NOT output STREQUAL "kiln ${KILN_VERSION}: shape (2, 3), dtype float32\n")
  message(FATAL_ERROR "unexpected output from the consumer: '${output}'")
endif()

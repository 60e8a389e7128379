# cmake -D MODE=find_package|add_subdirectory -D KILN_SOURCE_DIR=... -D KILN_BUILD_DIR=...
#       -D KILN_VERSION=... -D WORK_DIR=... -D GENERATOR=... -D CXX_COMPILER=... -D CONFIG=...
#       -D EXPECT_ONNX=ON|OFF -D LOADER=ON|OFF
#       -P run_package_test.cmake
# Configures, builds and runs the consumer project beside this script against kiln:
# installed from KILN_BUILD_DIR into a fresh prefix (find_package), or KILN_SOURCE_DIR
# itself (add_subdirectory). find_package links the compiled library (kiln::kiln), and
# with LOADER runs a program that loads a saved function of ops it never calls
# (model.kiln); it also compiles main.cpp with the flags of kiln.pc (pkg-config) and
# checks that configuring without optimization warns. add_subdirectory links
# kiln::header_only, so that the library is not compiled a second time.
cmake_minimum_required(VERSION 3.21)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "`${command}` failed (${result}):\n${output}")
  endif()
  set(output "${output}" PARENT_SCOPE)
endfunction()

function(expect_output what expected)
  if(NOT output STREQUAL expected)
    message(FATAL_ERROR "unexpected output from ${what}: '${output}', expected '${expected}'")
  endif()
  message(STATUS "${what} printed: ${output}")
endfunction()

if(NOT CONFIG)
  set(CONFIG Release)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DKILN_EXPECT_ONNX=${EXPECT_ONNX}")
set(version_line "kiln ${KILN_VERSION}: shape (2, 3), dtype float32")
if(MODE STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" --install "${KILN_BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")
  foreach(installed IN ITEMS include/kiln/kiln.hpp include/kiln/single/kiln/kiln.hpp include/kiln/single/kiln/fixed.hpp)
    if(NOT EXISTS "${prefix}/${installed}")
      message(FATAL_ERROR "the install has no ${installed}")
    endif()
  endforeach()
  list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
       "-DKILN_CONSUMER_LOADER=${LOADER}")
  set(expected "${version_line}, compiled, thrust 0\n")
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND consumer_args "-DKILN_SOURCE_DIR=${KILN_SOURCE_DIR}" -DKILN_CONSUMER_TARGET=kiln::header_only)
  set(expected "${version_line}, header-only, thrust 0\n")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

get_filename_component(consumer_source "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)
run("${CMAKE_COMMAND}" -S "${consumer_source}" -B "${WORK_DIR}/build" "-DCMAKE_BUILD_TYPE=${CONFIG}" ${consumer_args})
message(STATUS "configure:\n${output}")
# (CMake wraps a warning's lines: the words may be split by a line break and indentation.)
set(no_optimization_warning "compile[ \t\r\n]+without[ \t\r\n]+optimization")
if(output MATCHES "${no_optimization_warning}")
  message(FATAL_ERROR "an optimized configuration warned of no optimization")
endif()

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
expect_output("the consumer" "${expected}")

if(MODE STREQUAL "find_package")
  if(LOADER)
    # sqrt(matmul(reshape(conv2d(1..9 as 3x3, 2x2 ones), [1, 4]), [1, 2, 3, 4]^T) - 3):
    # the windows sum to 12, 16, 24, 28; 12 + 32 + 72 + 112 - 3 = 225.
    find_program(loader NAMES loader PATHS "${WORK_DIR}/build" "${WORK_DIR}/build/${CONFIG}" NO_DEFAULT_PATH NO_CACHE)
    run("${loader}" "${CMAKE_CURRENT_LIST_DIR}/model.kiln")
    expect_output("the loader" "15\n")
  endif()

  # Configured without optimization, the consumer is warned (once).
  run("${CMAKE_COMMAND}" -S "${consumer_source}" -B "${WORK_DIR}/build-unoptimized" -DCMAKE_BUILD_TYPE= ${consumer_args})
  string(REGEX MATCHALL "${no_optimization_warning}" warnings "${output}")
  list(LENGTH warnings count)
  if(NOT count EQUAL 1 OR NOT output MATCHES "consumer")
    message(FATAL_ERROR "configuring without optimization gave ${count} warnings, not one naming the consumer:\n${output}")
  endif()

  # pkg-config: kiln.pc's flags compile and link main.cpp against the compiled library.
  find_program(pkg_config pkg-config)
  if(pkg_config)
    set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
    file(GLOB pc_dirs "${prefix}/lib*/pkgconfig" "${prefix}/lib/*/pkgconfig")
    string(REPLACE ";" ":" pc_path "${pc_dirs}")
    set(ENV{PKG_CONFIG_PATH} "${pc_path}")
    run("${pkg_config}" --cflags --libs kiln)
    string(STRIP "${output}" flags)
    separate_arguments(flags UNIX_COMMAND "${flags}")
    run("${CXX_COMPILER}" -O1 "${consumer_source}/main.cpp" -o "${WORK_DIR}/pkg_config_consumer" ${flags})
    run("${WORK_DIR}/pkg_config_consumer")
    expect_output("the pkg-config consumer" "${version_line}, compiled, thrust 0\n")
  else()
    message(STATUS "pkg-config not found: kiln.pc not checked")
  endif()
endif()

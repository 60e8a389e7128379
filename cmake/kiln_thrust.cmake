# kiln_add_thrust(<target> [BUILD_INTERFACE])
#
# Finds Thrust and makes <target> (an INTERFACE library) use kiln's Thrust backend:
# the Thrust include dir, KILN_HAS_THRUST=1 and, for host compilers, the host device
# system THRUST_DEVICE_SYSTEM_<KILN_THRUST_DEVICE_SYSTEM>. Without Thrust (or with
# KILN_ENABLE_THRUST off) it defines KILN_NO_THRUST instead, so config.hpp does not
# pick up stray Thrust headers. BUILD_INTERFACE limits all this to the build tree, for
# the exported target whose installed config calls this function again on the
# consumer's machine (where Thrust may live elsewhere or be absent).
#
# Thrust is looked for in the CUDA toolkit's CCCL first (Thrust 3, also what nvcc uses),
# then in the default include path (Debian's libthrust-dev: Thrust 1.17, which pulls in
# libcub-dev). Set KILN_THRUST_INCLUDE_DIR to choose another copy.
#
# Read variables (cache options in kiln's build, plain variables for consumers):
#   KILN_ENABLE_THRUST         default ON
#   KILN_THRUST_DEVICE_SYSTEM  CPP (default) or OMP; only for host (non-nvcc) compiles

function(kiln_add_thrust target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "BUILD_INTERFACE" "" "")
  if(NOT DEFINED KILN_ENABLE_THRUST)
    set(KILN_ENABLE_THRUST ON)
  endif()
  if(NOT KILN_THRUST_DEVICE_SYSTEM)
    set(KILN_THRUST_DEVICE_SYSTEM CPP)
  endif()
  if(NOT KILN_THRUST_DEVICE_SYSTEM MATCHES "^(CPP|OMP)$")
    message(FATAL_ERROR "KILN_THRUST_DEVICE_SYSTEM must be CPP or OMP, not '${KILN_THRUST_DEVICE_SYSTEM}'")
  endif()

  set(definitions KILN_NO_THRUST)
  set(include_dirs)
  set(libraries)
  if(KILN_ENABLE_THRUST)
    set(cuda_roots)
    foreach(root IN ITEMS "${CUDAToolkit_ROOT}" "$ENV{CUDA_PATH}" "$ENV{CUDA_HOME}" /usr/local/cuda)
      if(root)
        list(APPEND cuda_roots "${root}/include/cccl")
      endif()
    endforeach()
    find_path(KILN_THRUST_INCLUDE_DIR thrust/version.h PATHS ${cuda_roots} NO_DEFAULT_PATH
              DOC "Directory holding thrust/version.h (CCCL or libthrust-dev)")
    find_path(KILN_THRUST_INCLUDE_DIR thrust/version.h)
  endif()

  if(KILN_ENABLE_THRUST AND KILN_THRUST_INCLUDE_DIR)
    file(STRINGS "${KILN_THRUST_INCLUDE_DIR}/thrust/version.h" version_line
         REGEX "^#define THRUST_VERSION [0-9]+")
    string(REGEX REPLACE "^#define THRUST_VERSION ([0-9]+).*" "\\1" version_number "${version_line}")
    math(EXPR major "${version_number} / 100000")
    math(EXPR minor "(${version_number} / 100) % 1000")
    math(EXPR patch "${version_number} % 100")
    set(version "${major}.${minor}.${patch}")

    set(definitions KILN_HAS_THRUST=1
        "$<$<COMPILE_LANGUAGE:CXX>:THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_${KILN_THRUST_DEVICE_SYSTEM}>")
    # The compiler's default path is searched anyway; naming it again with -isystem
    # would break libstdc++'s #include_next.
    if(NOT KILN_THRUST_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
      set(include_dirs "${KILN_THRUST_INCLUDE_DIR}")
    endif()
    if(KILN_THRUST_DEVICE_SYSTEM STREQUAL "OMP")
      find_package(OpenMP REQUIRED COMPONENTS CXX)
      set(libraries OpenMP::OpenMP_CXX)
    endif()
    message(STATUS "kiln: Thrust ${version} backend (${KILN_THRUST_INCLUDE_DIR}, host device system ${KILN_THRUST_DEVICE_SYSTEM})")
  elseif(KILN_ENABLE_THRUST)
    message(STATUS "kiln: Thrust not found; the Thrust backend is off (install libthrust-dev or the CUDA toolkit)")
  endif()

  foreach(kind IN ITEMS definitions include_dirs libraries)
    if(arg_BUILD_INTERFACE)
      list(TRANSFORM ${kind} REPLACE "^(.+)$" "$<BUILD_INTERFACE:\\1>")
    endif()
  endforeach()
  target_compile_definitions(${target} INTERFACE ${definitions})
  target_include_directories(${target} SYSTEM INTERFACE ${include_dirs})
  target_link_libraries(${target} INTERFACE ${libraries})
endfunction()

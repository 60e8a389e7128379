# kiln_add_distributed(<name> <kiln target> [IMPORTED])
#
# Adds <name>, an INTERFACE library for kiln's distributed component
# (kiln/distributed.hpp: collectives and data-parallel training): <kiln target> plus
# MPI's C++ target (MPI::MPI_CXX; Debian: libopenmpi-dev openmpi-bin). An optional part:
# when MPI is missing it adds nothing and says so in one line, and kiln::kiln is
# unaffected. Called by kiln's build (kiln::distributed) and again by the installed
# package configuration, on the consumer's machine.
#
# Programs run under an MPI launcher (`mpirun -np 4 ./train`); kiln starts MPI itself
# on first use, and a program run without a launcher is a world of one. Where the CUDA
# language is enabled and NCCL is found, CUDA sources get KILN_HAS_NCCL and libnccl.

function(kiln_add_distributed name kiln_target)
  if(NOT TARGET MPI::MPI_CXX)
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
  if(NOT TARGET MPI::MPI_CXX)
    message(STATUS "kiln: MPI not found (Debian: libopenmpi-dev openmpi-bin), so kiln::distributed, "
                   "data-parallel training, is not available")
    return()
  endif()
  add_library(${name} INTERFACE ${ARGN})
  target_link_libraries(${name} INTERFACE ${kiln_target} MPI::MPI_CXX)
  # In builds with the CUDA language, collectives on device memory go through NCCL
  # (kiln/distribute/nccl.hpp) when it sits beside the CUDA toolkit.
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if("CUDA" IN_LIST languages)
    find_library(KILN_NCCL_LIBRARY nccl HINTS "${CUDAToolkit_LIBRARY_DIR}" /usr/local/cuda/lib64)
    find_path(KILN_NCCL_INCLUDE_DIR nccl.h HINTS "${CUDAToolkit_INCLUDE_DIRS}" /usr/local/cuda/include)
    if(KILN_NCCL_LIBRARY AND KILN_NCCL_INCLUDE_DIR)
      target_compile_definitions(${name} INTERFACE "$<$<COMPILE_LANGUAGE:CUDA>:KILN_HAS_NCCL=1>")
      target_include_directories(${name} INTERFACE "${KILN_NCCL_INCLUDE_DIR}")
      target_link_libraries(${name} INTERFACE "${KILN_NCCL_LIBRARY}")
    endif()
  endif()
endfunction()

# kiln_add_weights(<name> <kiln target>)
#
# Adds <name>, an INTERFACE library for kiln's weights files and checkpoints
# (kiln/weights.hpp): <kiln target> plus HDF5's C library (Debian's libhdf5-dev). An
# optional part: when HDF5 is missing it adds nothing and says so, and kiln::kiln is
# unaffected. Called by kiln's build (kiln::weights) and again by the installed
# package configuration, on the consumer's machine. HDF5 is looked for directly
# rather than with FindHDF5, which needs the C language enabled (kiln is C++ only);
# Debian puts it under hdf5/serial.

function(kiln_add_weights name kiln_target)
  find_path(KILN_HDF5_INCLUDE_DIR hdf5.h PATH_SUFFIXES hdf5/serial)
  find_library(KILN_HDF5_LIBRARY NAMES hdf5_serial hdf5 PATH_SUFFIXES hdf5/serial)
  if(NOT KILN_HDF5_INCLUDE_DIR OR NOT KILN_HDF5_LIBRARY)
    message(STATUS "kiln: HDF5 not found (Debian: libhdf5-dev), so kiln::weights, the weights files and "
                   "checkpoints, is not available")
    return()
  endif()
  add_library(${name} INTERFACE ${ARGN})
  target_include_directories(${name} INTERFACE "${KILN_HDF5_INCLUDE_DIR}")
  target_link_libraries(${name} INTERFACE ${kiln_target} "${KILN_HDF5_LIBRARY}")
endfunction()

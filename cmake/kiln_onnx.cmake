# kiln_add_onnx(<name> <kiln target>)
#
# Adds <name>, an INTERFACE library for kiln's ONNX exporter (kiln/onnx.hpp): <kiln
# target> plus ONNX's generated protobuf classes (target onnx_proto of Debian's
# libonnx-dev, which brings protobuf). An optional part: when protobuf or ONNX's schema
# is missing it adds nothing and says so, and kiln::kiln is unaffected. Called by kiln's
# build (kiln::onnx) and again by the installed package configuration, on the
# consumer's machine.

function(kiln_add_onnx name kiln_target)
  find_package(Protobuf QUIET)
  if(Protobuf_FOUND AND NOT TARGET onnx_proto)
    find_package(ONNX CONFIG QUIET)
  endif()
  if(NOT TARGET onnx_proto)
    message(STATUS "kiln: protobuf or ONNX's schema not found (Debian: libprotobuf-dev libonnx-dev), "
                   "so kiln::onnx, the ONNX exporter, is not available")
    return()
  endif()
  add_library(${name} INTERFACE ${ARGN})
  target_link_libraries(${name} INTERFACE ${kiln_target} onnx_proto)
endfunction()

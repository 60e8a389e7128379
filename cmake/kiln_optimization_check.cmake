# Warns, once, when a target that links kiln is configured without optimization (an
# empty CMAKE_BUILD_TYPE, or Debug, with no -O1/-O2/-O3/-Os/-Ofast of its own): kiln's
# kernels and the code a program inlines from kiln's headers then run many times
# slower. The check runs after the whole project is configured (a deferred call in the
# top-level directory), over every target of every directory. Included by kiln's
# package configuration, and by kiln's own build when it is a subproject. Set
# KILN_NO_OPTIMIZATION_WARNING to silence it.

function(kiln_collect_unoptimized_targets directory out_var)
  set(found)
  get_property(targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    get_target_property(libraries ${target} LINK_LIBRARIES)
    if(NOT libraries MATCHES "kiln::(kiln|header_only|onnx|weights)")
      continue()
    endif()
    get_target_property(options ${target} COMPILE_OPTIONS)
    if(NOT options MATCHES "(^|;|:)-O([1-3sz]|fast)")
      list(APPEND found ${target})
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    kiln_collect_unoptimized_targets("${subdirectory}" more)
    list(APPEND found ${more})
  endforeach()
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()

function(kiln_check_optimization)
  get_property(is_multi_config GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(is_multi_config OR KILN_NO_OPTIMIZATION_WARNING)
    return()
  endif()
  string(TOUPPER "${CMAKE_BUILD_TYPE}" build_type)
  set(flags "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${build_type}}")
  if(flags MATCHES "(^| )-O([1-3sz]|fast)")
    return()
  endif()
  kiln_collect_unoptimized_targets("${CMAKE_SOURCE_DIR}" targets)
  if(targets)
    if(CMAKE_BUILD_TYPE)
      set(why "CMAKE_BUILD_TYPE is ${CMAKE_BUILD_TYPE}")
    else()
      set(why "CMAKE_BUILD_TYPE is empty")
    endif()
    string(REPLACE ";" ", " targets "${targets}")
    message(WARNING "kiln: targets that link kiln compile without optimization (${why}): ${targets}. "
                    "What they inline from kiln's headers then runs many times slower. "
                    "Configure with -DCMAKE_BUILD_TYPE=Release (or RelWithDebInfo), -O2 and -march=native "
                    "as kiln's figures assume (set KILN_NO_OPTIMIZATION_WARNING to silence this).")
  endif()
endfunction()

get_property(kiln_optimization_check_deferred GLOBAL PROPERTY KILN_OPTIMIZATION_CHECK_DEFERRED)
if(NOT kiln_optimization_check_deferred)
  set_property(GLOBAL PROPERTY KILN_OPTIMIZATION_CHECK_DEFERRED ON)
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL kiln_check_optimization)
endif()

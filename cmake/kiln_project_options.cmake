# kiln_dev_flags: the project's compile flags, with which kiln's library (kiln::kiln)
# and its tests, examples and benchmarks are built (kiln::dev, top-level
# CMakeLists.txt). They are deliberately not part of the exported targets (consumers
# choose their own warnings, -march and sanitizers).

add_library(kiln_dev_flags INTERFACE)
target_link_libraries(kiln_dev_flags INTERFACE kiln_header_only kiln_thrust)

set(for_cxx "$<COMPILE_LANGUAGE:CXX>")
target_compile_options(kiln_dev_flags INTERFACE
  "$<${for_cxx}:-Wall;-Wextra>"
  # GCC 12 + AVX-512 reports false maybe-uninitialized warnings inside xsimd (GCC PR105593).
  "$<$<AND:${for_cxx},$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>"
  # GCC 12's own _mm512_undefined_* (`__m512 __Y = __Y;`) also trips -Wuninitialized
  # once xsimd's exp/log are inlined into user code (same PR; fixed in GCC 13).
  "$<$<AND:${for_cxx},$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-uninitialized>"
  # Debug means -Og: the suite runs its kernels at a usable speed and still debugs well
  # (kiln itself compiles at -O0 too: test/debug_build).
  "$<$<AND:${for_cxx},$<CONFIG:Debug>>:-Og>"
  "$<$<AND:${for_cxx},$<BOOL:${KILN_NATIVE}>>:-march=native>")

if(KILN_SANITIZE)
  # float-cast-overflow is not part of GCC's `undefined` (it is of clang's): a float to
  # integer conversion out of range is undefined behaviour that the fuzzer once found.
  set(sanitizer_flags -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined,float-cast-overflow)
  # Reports need files and lines, which line tables (-g1) give; full debug info made
  # the sanitized build of the tests about a fifth slower to compile.
  target_compile_options(kiln_dev_flags INTERFACE "$<${for_cxx}:${sanitizer_flags};-g1>")
  target_link_options(kiln_dev_flags INTERFACE ${sanitizer_flags})
endif()
if(KILN_SANITIZE_THREADS)
  if(KILN_SANITIZE)
    message(FATAL_ERROR "KILN_SANITIZE (ASan) and KILN_SANITIZE_THREADS (TSan) cannot be combined: build them apart")
  endif()
  target_compile_options(kiln_dev_flags INTERFACE "$<${for_cxx}:-fsanitize=thread;-g1>")
  target_link_options(kiln_dev_flags INTERFACE -fsanitize=thread)
endif()

# kiln_optimize_for_checks(<target>): the tests and examples check results, not speed,
# so an optimized build compiles them at -O1, in about two thirds of the time -O3
# takes. The kernels they run are compiled at the build's level all the same: in
# kiln's library (separate compilation), or header-only in the benchmarks. With GCC,
# -fexpensive-optimizations keeps the bits of -O2 and up: it is what lets GCC contract
# a multiply and an add into one FMA, which xsimd 8.1's AVX-512 exp and log rely on, so
# kernels compiled into a test give the library's results to the last bit.
function(kiln_optimize_for_checks target)
  set(optimized "$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release,RelWithDebInfo>>")
  target_compile_options(${target} PRIVATE "$<${optimized}:-O1>"
                                           "$<$<AND:${optimized},$<CXX_COMPILER_ID:GNU>>:-fexpensive-optimizations>")
endfunction()

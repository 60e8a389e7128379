# cmake -D PROGRAM=<exe> -D EXPECTED=<file> -D ACTUAL=<file> [-D LAUNCHER=<command;args>]
#       -P kiln_compare_output.cmake
# Runs PROGRAM (through LAUNCHER, such as `mpirun;-np;2`, when given), saves its standard
# output to ACTUAL and fails unless the program exits with 0 and ACTUAL equals EXPECTED
# byte for byte (showing a diff when they differ).
cmake_minimum_required(VERSION 3.21)

execute_process(COMMAND ${LAUNCHER} "${PROGRAM}" OUTPUT_FILE "${ACTUAL}" RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${result}")
endif()

execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files "${EXPECTED}" "${ACTUAL}" RESULT_VARIABLE differs)
if(differs)
  find_program(diff_program diff)
  if(diff_program)
    execute_process(COMMAND "${diff_program}" -u "${EXPECTED}" "${ACTUAL}" OUTPUT_VARIABLE difference)
  else()
    file(READ "${ACTUAL}" actual_text)
    set(difference "actual output:\n${actual_text}")
  endif()
  message(FATAL_ERROR "the output of ${PROGRAM} differs from ${EXPECTED}:\n${difference}")
endif()

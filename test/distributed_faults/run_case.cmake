# cmake -D COMMAND=<mpirun;...;program;case> -D EXPECT_FAILURE=<0|1> -D MAX_SECONDS=<n>
#       -D EXPECTED=<regex> -P run_case.cmake
# Runs a fault case of fault_program.cpp under mpirun and fails unless the job ends
# (with a failing exit status when EXPECT_FAILURE) within MAX_SECONDS and its output
# (standard output and error together) matches EXPECTED.
cmake_minimum_required(VERSION 3.21)

string(TIMESTAMP start "%s" UTC)
execute_process(COMMAND ${COMMAND} OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE result
                TIMEOUT 240)
string(TIMESTAMP end "%s" UTC)
math(EXPR seconds "${end} - ${start}")
message(STATUS "the job ended with ${result} after about ${seconds} s; its output:\n${output}")

if(EXPECT_FAILURE AND result EQUAL 0)
  message(FATAL_ERROR "the job succeeded, but this fault must end it with a failure")
endif()
if(NOT EXPECT_FAILURE AND NOT result EQUAL 0)
  message(FATAL_ERROR "the job failed (${result})")
endif()
if(seconds GREATER MAX_SECONDS)
  message(FATAL_ERROR "the job took ${seconds} s, more than ${MAX_SECONDS} s")
endif()
if(NOT output MATCHES "${EXPECTED}")
  message(FATAL_ERROR "the output does not hold \"${EXPECTED}\"")
endif()

# Installs the build into a scratch prefix, builds the consumer against it with
# find_package(treeattn), and runs it; runs the installed CLI's workloads from
# outside the source and build trees. Invoked by ctest (test_package).
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()

step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
step(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${prefix}")
step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")

# The installed treeattn finds its workload records under the prefix, from any directory.
if(WITH_CLI)
  set(ENV{TREEATTN_WORKLOADS_DIR} "")
  file(MAKE_DIRECTORY "${WORK_DIR}/elsewhere")
  execute_process(COMMAND "${prefix}/bin/treeattn" demo --workload speculative --tree-size 32 --steps 3 --layers 1
                  WORKING_DIRECTORY "${WORK_DIR}/elsewhere" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the installed treeattn demo failed (${rc}):\n${out}")
  endif()
  message(STATUS "${out}")
endif()

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

# The library alone (its default component): the headers of its API, none of the tools' or of its internals.
set(library_only "${WORK_DIR}/library_only")
step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${library_only}" --component Unspecified)
foreach(header context.hpp plan.hpp tree.hpp incremental_planner.hpp cuda.hpp vulkan.hpp treeattn.h treeattn_vulkan.h config.h)
  if(NOT EXISTS "${library_only}/include/treeattn/${header}")
    message(FATAL_ERROR "the library's install lacks include/treeattn/${header}")
  endif()
endforeach()
foreach(header backend.hpp tools.hpp workloads.hpp npy.hpp tree_json.hpp scenarios.hpp cost_model_internal.hpp)
  if(EXISTS "${library_only}/include/treeattn/${header}")
    message(FATAL_ERROR "the library's install has include/treeattn/${header}, which is not its public API")
  endif()
endforeach()
step(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}" "-DCMAKE_PREFIX_PATH=${prefix}"
     "-DC_TEST_SOURCE=${C_TEST_SOURCE}")
step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")
step("${WORK_DIR}/build/c_consumer")

# A C program built with the compiler and pkg-config alone: -ltreeattn (the shared library) and -lm.
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
execute_process(COMMAND pkg-config --cflags --libs treeattn OUTPUT_VARIABLE flags RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config found no treeattn.pc under ${prefix}/lib/pkgconfig")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
step(${C_COMPILER} -std=c11 "${C_TEST_SOURCE}" ${flags} -lm -o "${WORK_DIR}/c_pkgconfig")
set(ENV{LD_LIBRARY_PATH} "${prefix}/lib")
step("${WORK_DIR}/c_pkgconfig")

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

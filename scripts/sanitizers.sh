#!/usr/bin/env bash
# The suites that need a sanitizer, each in a build of its own (incremental
# after the first run): test_threads under ThreadSanitizer (build-tsan/, CPU
# only: 10 000 calls on four threads; TREEATTN_THREAD_RUNS sets another count),
# and under AddressSanitizer and UndefinedBehaviorSanitizer, leaks included
# (build-asan/): test_host_faults and test_c_planner, and test_device_faults on
# lavapipe, which needs the Vulkan backend there: LeakSanitizer sees the host
# memory its error paths free, which the validation layer does not. Exits
# non-zero on any report.
set -euo pipefail
cd "$(dirname "$0")/.."

# -O1 with line tables, as the sanitizers' manuals advise: reports keep their
# file:line stacks, and this script from scratch takes half its time at -O2 -g
# (2-core build machine: 218 s against 437 s, tests included).
configure() {  # folder, sanitizers, Vulkan backend (AUTO/OFF)
  local optimize="-O1 -g1 -fno-omit-frame-pointer -DNDEBUG"
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$optimize" \
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="$optimize" -DTREEATTN_CUDA=OFF -DTREEATTN_VULKAN="$3" \
        -DTREEATTN_BUILD_CLI=OFF -DCMAKE_CXX_FLAGS="-fsanitize=$2" -DCMAKE_C_FLAGS="-fsanitize=$2" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$2" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=$2" >/dev/null
}

configure build-tsan thread OFF
cmake --build build-tsan --target test_threads
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" build-tsan/tests/test_threads

configure build-asan address,undefined AUTO
cmake --build build-asan --target test_host_faults test_c_planner test_device_faults
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
build-asan/tests/test_host_faults
build-asan/tests/test_c_planner
TREEATTN_VK_VALIDATION=1 build-asan/tests/test_device_faults || [ $? -eq 77 ]  # 77: no Vulkan device, said why

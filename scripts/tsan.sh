#!/usr/bin/env bash
# test_threads under ThreadSanitizer: a CPU-only build of the library and the
# test in build-tsan/ (incremental after the first run), then its 10 000 runs
# (TREEATTN_THREAD_RUNS sets another count). Exits non-zero on any race report.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTREEATTN_CUDA=OFF -DTREEATTN_VULKAN=OFF \
      -DTREEATTN_BUILD_CLI=OFF -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_C_FLAGS="-fsanitize=thread" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build build-tsan --target test_threads
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" build-tsan/tests/test_threads

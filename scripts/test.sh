#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure
# test_threads under ThreadSanitizer (CPU only); test_host_faults, test_c_planner and test_device_faults (lavapipe) under AddressSanitizer.
scripts/sanitizers.sh
# The libFuzzer targets (fuzz/), 45 seconds each, in a clang build with ASan and UBSan.
scripts/fuzz.sh 45
# The Python package (pip install ., pytest) and the Windows build (mingw-w64, the tests under wine).
scripts/test_python.sh
scripts/test_windows.sh

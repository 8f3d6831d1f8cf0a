#!/usr/bin/env bash
# The Windows build, cross-compiled with mingw-w64 (cmake/mingw-w64.cmake) into
# build-win/: the static and shared library (treeattn.dll, the C API), the CPU and
# Vulkan backends (volk loads vulkan-1.dll), and the engine, CPU and C API tests,
# run under wine. scripts/test.sh runs it after the Linux suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --windows
glslang=$(scripts/setup_glslang.sh)
cache="${TREEATTN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/treeattn}"
export WINEPREFIX="$cache/wine" WINEDEBUG=-all  # created once, on the first run
cmake -S . -B build-win -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64.cmake -DCMAKE_BUILD_TYPE=Release \
      -DTREEATTN_HOST_HEADER_DEPS=ON -DTREEATTN_CUDA=OFF -DTREEATTN_BUILD_CLI=OFF -DTREEATTN_GLSLANG="$glslang" >/dev/null
cmake --build build-win
ctest --test-dir build-win --output-on-failure

#!/usr/bin/env bash
# Configures and builds treeattn into build/ (incremental after the first run).
set -euo pipefail
cd "$(dirname "$0")/.."
# The shaders' glslang: the system one when it compiles cooperative-matrix
# shaders, else one built once from Debian 13's source (scripts/setup_glslang.sh).
glslang=$(scripts/setup_glslang.sh)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTREEATTN_GLSLANG="$glslang" >/dev/null
cmake --build build

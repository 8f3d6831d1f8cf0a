#!/usr/bin/env bash
# Configures and builds treeattn into build/ (incremental after the first run).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build

#!/usr/bin/env bash
# Provides a glslang that compiles GL_KHR_cooperative_matrix (glslang >= 14).
# Debian 12 ships glslang 12, which cannot; Debian 13's source package (15.1)
# builds here with the stock cmake and g++. It is built once per machine and
# cached outside the source tree; the script prints the compiler's path.
# A system glslang that is already new enough (LunarG SDK, newer distribution)
# is used as it is.
set -euo pipefail

version_of() { "$1" --version 2>/dev/null | sed -n "s/^Glslang Version: [0-9]*:\([0-9]*\).*/\1/p" | head -1; }

for candidate in glslang glslangValidator; do
  if command -v "$candidate" >/dev/null && [ "$(version_of "$candidate")" -ge 14 ] 2>/dev/null; then
    command -v "$candidate"
    exit 0
  fi
done

cache="${TREEATTN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/treeattn}"
compiler="$cache/glslang-15/bin/glslang"
if [ -x "$compiler" ]; then
  echo "$compiler"
  exit 0
fi

work="$cache/glslang-15-src"
rm -rf "$work" && mkdir -p "$work/apt/lists/partial" "$work/apt/sources.list.d"
# A private sources list: the system's apt configuration is left untouched.
echo "deb-src http://deb.debian.org/debian trixie main" > "$work/apt/sources.list"
apt_options=(-o "Dir::Etc::SourceList=$work/apt/sources.list"
             -o "Dir::Etc::SourceParts=$work/apt/sources.list.d"
             -o "Dir::State::Lists=$work/apt/lists" -o "APT::Sandbox::User=$(id -un)" -qq)
echo "setup: building glslang 15 from Debian 13's source (once, about 2 minutes)" >&2
# Each step feeds the next, so a failed download or build leaves no compiler to move.
if (
  cd "$work"
  apt-get "${apt_options[@]}" update
  apt-get "${apt_options[@]}" source --download-only glslang >/dev/null
  tarball=$(ls glslang_*.orig.tar.* | head -1)
  mkdir source && tar -xf "$tarball" -C source --strip-components=1
  cmake -S source -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DENABLE_OPT=OFF \
        -DGLSLANG_TESTS=OFF -DBUILD_SHARED_LIBS=OFF -DENABLE_HLSL=OFF >/dev/null
  cmake --build build --target glslang-standalone >/dev/null
  mkdir -p "$cache/glslang-15/bin"
  cp build/StandAlone/glslang "$compiler.tmp"
  mv "$compiler.tmp" "$compiler"
) >&2; then
  rm -rf "$work"
  echo "$compiler"
  exit 0
fi
rm -rf "$work"
# No network or no source package: the system compiler still builds the
# scalar shaders; CMake says that the cooperative-matrix variant is left out.
echo "setup: could not build glslang 15; using the system glslang (scalar Vulkan shaders only)" >&2
command -v glslangValidator || command -v glslang || true

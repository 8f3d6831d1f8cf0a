#!/usr/bin/env bash
# Installs the Debian 12 packages treeattn needs to build and test; with
# --windows, those of the Windows cross build (mingw-w64, wine) instead.
# Idempotent and quiet: when everything is present it only asks dpkg.
set -euo pipefail

packages=(cmake ninja-build g++ clang doctest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libvulkan-dev libvulkan-volk-dev glslang-tools mesa-vulkan-drivers vulkan-validationlayers pkg-config python3 python3-dev python3-venv)
if [ "${1:-}" = "--windows" ]; then
  packages=(g++-mingw-w64-x86-64-posix wine64)
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

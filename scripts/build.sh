#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release) after making sure the packages
# are installed. Usage: scripts/build.sh [release|asan|tsan|debug] [more cmake configure arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset "$preset" -G Ninja "${@:2}" >/dev/null
cmake --build --preset "$preset" -j "$jobs"

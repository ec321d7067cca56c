#!/usr/bin/env bash
# Configures and builds ddprun into build/ (Release, ccache when present).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DDPRUN_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"

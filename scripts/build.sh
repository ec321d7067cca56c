#!/usr/bin/env bash
# Configures and builds ddprun (Release, ccache when present).
#   scripts/build.sh [BUILD_DIR [CMAKE_ARGS...]]    default BUILD_DIR: build
# e.g. scripts/build.sh build-tsan -DDDPRUN_SANITIZE=thread -DDDPRUN_BUILD_TRAINER=OFF
# DDPRUN_TARGETS="ddprun train": those targets and what they need, not all.
# DDPRUN_BUILD_DRY_RUN=1: ninja -n, print what would be built, build nothing.
# DDPRUN_UNITY=ON: a unity build (each library's sources compiled in batches
# of 16, one parse of the shared headers a batch): a cold build for a
# program to run, the demo's; off otherwise, as an edit then recompiles one
# source and not its batch. Said on every configure, so switching is seen.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=${DDPRUN_JOBS:-$(nproc)}
source scripts/ccache-env.sh
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_UNITY_BUILD="${DDPRUN_UNITY:-OFF}" -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 "$@" >/dev/null
build=(cmake --build "$dir" -j "$jobs")
[[ -n ${DDPRUN_TARGETS:-} ]] && build+=(--target ${DDPRUN_TARGETS})
[[ ${DDPRUN_BUILD_DRY_RUN:-} == 1 ]] && build+=(-- -n)
"${build[@]}"

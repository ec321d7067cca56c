#!/usr/bin/env bash
# The main job: set up, build ddprun and train (only what the demo runs: no
# tests, benches or fuzzers), then train the MLP on the embedded digits with
# two data-parallel ranks under ddprun.
#   scripts/demo.sh [--build-only] [TRAIN_FLAGS...]
# --build-only stops after the build (tests/demo_build_test.py counts it).
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
bash scripts/setup.sh
# Warnings are not errors here even where test.sh configured build/ with
# -DDDPRUN_WERROR=ON: a unity batch warns where one source a compile does not
# (-Wsubobject-linkage), and the one-source build is where warnings are checked.
DDPRUN_UNITY=ON DDPRUN_TARGETS="ddprun train" bash scripts/build.sh build -DDDPRUN_WERROR=OFF
((build_only)) && exit 0
# One OpenMP thread per rank, said here so ddprun need not say it first.
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} exec build/bin/ddprun --nproc-per-node=2 build/bin/train "$@"

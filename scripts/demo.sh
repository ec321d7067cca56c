#!/usr/bin/env bash
# The main job: set up, build, then train the MLP on the embedded digits with
# two data-parallel ranks under ddprun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/bin/ddprun --nproc-per-node=2 build/bin/train "$@"

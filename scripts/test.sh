#!/usr/bin/env bash
# Everything on a fresh Debian bookworm machine: packages, build, whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
# Integration tests start real processes; two at a time on two cores.
ctest --output-on-failure --timeout 600 -j "${DDPRUN_TEST_JOBS:-2}"

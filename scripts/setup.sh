#!/usr/bin/env bash
# Installs the Debian packages building ddprun needs (and running `train`):
# compiler and build tools, the header and library packages CMake finds,
# LibTorch for trainer/, help2man for the man page, python3-venv for the
# wheel. Tools only the tests and benches use come from scripts/setup-test.sh.
# Idempotent: safe to run on every CI run and on a fresh bookworm machine.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libboost-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libssl-dev
  # doctest: the tests are built by default (-DBUILD_TESTING=OFF skips them).
  doctest-dev
  libtorch-dev libgloo-dev libopenblas0-pthread
  help2man python3 python3-venv
)
bash scripts/install-packages.sh "${packages[@]}"

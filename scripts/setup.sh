#!/usr/bin/env bash
# Installs every Debian package ddprun needs to build, test and benchmark.
# Idempotent: safe to run on every CI run and on a fresh bookworm machine.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libboost-dev
  libspdlog-dev libfmt-dev libcli11-dev doctest-dev nlohmann-json3-dev
  libssl-dev
  libtorch-dev libgloo-dev libopenblas0-pthread
  python3 python3-torch python3-numpy
  clang libclang-rt-14-dev
  iproute2 gdb elfutils procps
  slurmctld slurmd slurm-client munge util-linux etcd-server etcd-client openssl
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Recommends included: a fresh machine then matches the one this was tested on.
  apt-get install -y -qq "${missing[@]}"
fi

#!/usr/bin/env bash
# Installs what only the tests and benches use, on top of scripts/setup.sh:
# Debian's torch (the torch 1.13 tests), clang/libFuzzer (the store's
# fuzzers), gdb and elfutils (stacks), Slurm, munge and etcd (multi-node),
# iproute2 (network namespaces), man-db and zsh (the .deb test), tmux (a
# terminal emulator for agent.progress_bars), prometheus (with promtool:
# observe.prometheus) and chromium (headless: observe.report_chromium), the wheel's build tools in
# .venv-wheel (scripts/build-wheel.sh) and the wheel's dependency, py-spy,
# in .wheelhouse ($DDPRUN_WHEELHOUSE), from which install.wheel installs
# the wheel offline.
# scripts/test.sh runs it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  python3-torch python3-numpy
  clang libclang-rt-14-dev
  iproute2 gdb elfutils procps man-db zsh tmux
  slurmctld slurmd slurm-client munge util-linux etcd-server etcd-client openssl
  prometheus chromium
)
bash scripts/install-packages.sh "${packages[@]}"
bash scripts/build-wheel.sh --tools
wheelhouse=${DDPRUN_WHEELHOUSE:-$PWD/.wheelhouse}
if ! compgen -G "$wheelhouse/py_spy-*.whl" >/dev/null; then
  "${DDPRUN_WHEEL_VENV:-$PWD/.venv-wheel}/bin/pip" download --quiet --no-deps --only-binary=:all: \
    -d "$wheelhouse" 'py-spy>=0.4'
fi

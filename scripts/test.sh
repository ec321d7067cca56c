#!/usr/bin/env bash
# Everything on a fresh Debian bookworm machine: packages, build (warnings
# are errors), whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# What only the tests use (Slurm, etcd, clang, gdb, ...; the wheel's build tools).
bash scripts/setup-test.sh
# The newest PyPI torch in .venv-torch, for the torch2 test label (a fresh
# machine downloads ~4 GB: about 17 min measured on a loaded 2-core machine).
bash scripts/setup-torch.sh
# py-spy and pystack in .venv-pytools: Python stacks of uninstrumented jobs.
bash scripts/setup-pytools.sh
# The store's fuzzers are opt-in; CI builds them and runs each for 20 s.
bash scripts/build.sh build -DDDPRUN_WERROR=ON -DDDPRUN_FUZZ=ON
# The CUDA variant of `train` against that torch's CUDA LibTorch and NCCL
# (configure, compile, link; no GPU needed, and without one it checks that
# `train --backend nccl` refuses in one line). Measured 2026-11-30 from an
# empty build-cuda/ without ccache, -j2 on the loaded 2-core machine: 174 s
# (311 s under heavier load).
bash scripts/build-cuda.sh
# Integration tests start real processes; two at a time on two cores.
(cd build && ctest --output-on-failure --timeout 600 -j "${DDPRUN_TEST_JOBS:-2}")
# The same suite under the sanitizers, each in its own build folder; any
# report fails (scripts/test-sanitizer.sh says what each leaves out and why).
# ThreadSanitizer: everything but the trainer, in build-tsan/.
bash scripts/test-sanitizer.sh thread
# AddressSanitizer + UndefinedBehaviorSanitizer (leaks too), in build-asan/.
bash scripts/test-sanitizer.sh address

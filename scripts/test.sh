#!/usr/bin/env bash
# Everything on a fresh Debian bookworm machine: packages, build (warnings
# are errors), whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's wall time goes to the log: CI must end within 90 minutes on 2
# cores, and a slow step is found from its log alone.
start=$SECONDS
step() {
  local t=$SECONDS rc=0
  "$@" || rc=$?
  echo "test.sh: $* -> exit $rc, $((SECONDS - t)) s (total $((SECONDS - start)) s)" >&2
  return $rc
}
step bash scripts/setup.sh
# What only the tests use (Slurm, etcd, clang, gdb, ...; the wheel's build tools).
step bash scripts/setup-test.sh
# The newest PyPI torch in .venv-torch, for the torch2 test label (a fresh
# machine downloads ~4 GB: about 17 min measured on a loaded 2-core machine).
step bash scripts/setup-torch.sh
# py-spy and pystack in .venv-pytools: Python stacks of uninstrumented jobs.
step bash scripts/setup-pytools.sh
# The store's fuzzers are opt-in; CI builds them and runs each for 20 s.
step bash scripts/build.sh build -DDDPRUN_WERROR=ON -DDDPRUN_FUZZ=ON
# The demo's own build (scripts/demo.sh: ddprun and train as a unity build)
# in build-demo/: two helpers of the same name in two sources of one
# library compile one source a compile and collide in a unity batch, which
# would break the README's first command and nothing else. About 3 min
# cold on 2 cores (327 CPU s), seconds with ccache warm. As demo.sh builds:
# warnings are not errors there (a unity batch makes GCC warn of a type
# from one source's anonymous namespace used in the next source's class,
# -Wsubobject-linkage; the one-source build checks warnings).
step env DDPRUN_UNITY=ON DDPRUN_TARGETS="ddprun train" bash scripts/build.sh build-demo
# clang's thread-safety analysis of the locks' annotations
# (base/thread_annotations.h), a finding an error: the libraries that hold
# locks, every one annotated, compiled by clang++ in build-clang/ (nothing
# linked, nothing run; the trainer's, against LibTorch, are not built here;
# add a library here once it holds a lock).
step env DDPRUN_TARGETS="ddprun_base ddprun_rendezvous ddprun_agent ddprun_watchdog" \
  bash scripts/build.sh build-clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DDDPRUN_THREAD_SAFETY=ON -DDDPRUN_WERROR=ON -DDDPRUN_BUILD_TRAINER=OFF -DBUILD_TESTING=OFF
# ddprun cross-built for aarch64 (the cross toolchain, :arm64 headers and
# qemu-user on first run), ddprun alone, for the qemu-user cases in the ctest
# run below (aarch64.qemu, label aarch64, about 7 s). Measured 2026-12-06,
# -j2 on the 2-core machine shared with two other builds (load 5-7): packages
# 46 s once, the build 919 s with an empty ccache, 3 s from a fresh folder
# with it warm (CI's usual case: clones share the cache, scripts/ccache-env.sh).
step bash scripts/build-aarch64.sh
# The CUDA variant of `train` against that torch's CUDA LibTorch and NCCL
# (configure, compile, link; no GPU needed, and without one it checks that
# `train --backend nccl` refuses in one line). Measured 2026-11-30 from an
# empty build-cuda/ without ccache, -j2 on the loaded 2-core machine: 174 s
# (311 s under heavier load).
step bash scripts/build-cuda.sh
# Integration tests start real processes; two at a time on two cores.
step bash -c 'cd build && ctest --output-on-failure --timeout 600 -j "${DDPRUN_TEST_JOBS:-2}"'
# The same suite under the sanitizers, each in its own build folder; any
# report fails (scripts/test-sanitizer.sh says what each leaves out and why).
# ThreadSanitizer: everything but the trainer, in build-tsan/.
step bash scripts/test-sanitizer.sh thread
# AddressSanitizer + UndefinedBehaviorSanitizer (leaks too), in build-asan/.
step bash scripts/test-sanitizer.sh address

#!/usr/bin/env bash
# The CUDA variant of `train`: configures build-cuda/ against the CUDA
# LibTorch of the torch 2.x venv (torch.utils.cmake_prefix_path; installs it
# with scripts/setup-torch.sh when missing) and the machine's CUDA toolkit
# with NCCL ($CUDA_HOME, default /usr/local/cuda), and builds `train` with
# the NCCL backend: configure, compile, link. No GPU needed; on a machine
# without one, `train --backend nccl` exits with one line saying so.
# Only the train target: CUDA LibTorch compiles are heavy.
#   scripts/build-cuda.sh [build-dir]     (default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
venv=${DDPRUN_TORCH_VENV:-$PWD/.venv-torch}
cuda=${CUDA_HOME:-/usr/local/cuda}
[[ -x $venv/bin/python ]] || bash scripts/setup-torch.sh
prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
[[ -f $cuda/include/nccl.h ]] || { echo "build-cuda: no NCCL under $cuda (nccl.h)" >&2; exit 1; }
start=$(date +%s)
# Torch first on the prefix path, so its CUDA config wins over Debian's CPU one.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCUDAToolkit_ROOT="$cuda" \
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DDDPRUN_REQUIRE_NCCL=ON >"$build.configure.log" 2>&1 ||
  { tail -30 "$build.configure.log" >&2; exit 1; }
grep -E 'trainer:' "$build.configure.log"
cmake --build "$build" -j "${DDPRUN_JOBS:-$(nproc)}" --target train
echo "build-cuda: $build/bin/train with NCCL ($(( $(date +%s) - start )) s)"
# Without a GPU the NCCL backend must be refused in one clear line.
if ! nvidia-smi -L >/dev/null 2>&1; then
  set +e
  out=$(RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29599 timeout 120 \
        "$build/bin/train" --backend nccl --steps 1 --checkpoint-dir "$build/ckpt-check" 2>&1)
  code=$?
  set -e
  if [[ $code -ne 1 || $(printf '%s\n' "$out" | wc -l) -ne 1 || $out != *"--backend nccl: no CUDA device"* ]]; then
    printf 'build-cuda: expected one line and exit 1 from --backend nccl without a GPU, got %s:\n%s\n' \
      "$code" "$out" >&2
    exit 1
  fi
  echo "build-cuda: no GPU here; train --backend nccl says: ${out#*] }"
fi

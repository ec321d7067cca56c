#!/usr/bin/env bash
# The CUDA variant of `train`: configures build-cuda/ against the CUDA
# LibTorch of the torch 2.x venv (torch.utils.cmake_prefix_path; installs it
# with scripts/setup-torch.sh when missing) and the machine's CUDA toolkit
# ($CUDA_HOME, default /usr/local/cuda) with the wheel's NCCL, and builds `train` with
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
# TorchConfig looks for libc10 with find_library(c10 PATHS <torch>/lib), which
# searches the system first: Debian's libc10.so (1.13) won, and a binary that
# then needed it loaded both c10s and aborted in the dispatcher at start-up.
c10=$prefix/../../lib/libc10.so
# NCCL: the wheel's own (pip's nvidia-nccl), the one libtorch_cuda.so is built
# against and loads. The toolkit's can be older (2.28 here, while torch 2.x
# needs 2.30's ncclCommGrow, ncclSignal...: undefined at link) and a process
# holds only one libnccl.so.2. The toolkit's NCCL is the fallback.
nccl=$("$venv/bin/python" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
nccl_inc=$cuda/include nccl_lib=$cuda/lib64/libnccl.so
if [[ -n $nccl && -f $nccl/include/nccl.h ]]; then
  nccl_inc=$nccl/include
  nccl_lib=$(ls "$nccl"/lib/libnccl.so* 2>/dev/null | head -1 || true)
fi
[[ -f $nccl_inc/nccl.h && -f $nccl_lib ]] ||
  { echo "build-cuda: no NCCL (nccl.h and libnccl.so) in $venv or under $cuda" >&2; exit 1; }
source scripts/ccache-env.sh
start=$(date +%s)
# Torch first on the prefix path, so its CUDA config wins over Debian's CPU one.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCUDAToolkit_ROOT="$cuda" \
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DNCCL_INCLUDE_DIR="$nccl_inc" -DNCCL_LIBRARY="$nccl_lib" \
  -Dc10_LIBRARY="$(realpath "$c10")" -DDDPRUN_REQUIRE_NCCL=ON >"$build.configure.log" 2>&1 ||
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

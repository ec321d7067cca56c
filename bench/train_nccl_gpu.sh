#!/usr/bin/env bash
# On a GPU machine: build `train` against PyTorch's CUDA LibTorch and run the
# NCCL path end to end (2 ranks if 2+ GPUs, else 1), a few minutes in all.
#
#   bench/train_nccl_gpu.sh [path-to-libtorch]
#
# path-to-libtorch: an unpacked CUDA LibTorch (libtorch/share/cmake/Torch),
# or, when omitted, the torch package of `python3` (torch.utils.cmake_prefix_path).
# Needs: nvcc/CUDA toolkit with NCCL (nccl.h, libnccl.so; NCCL_HOME if not
# under the CUDA prefix), cmake, ninja, and this repository's other
# dependencies (scripts/setup.sh lists them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')}
build=$root/build-nccl-gpu
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l || true)
if [[ ${ngpu:-0} -lt 1 ]]; then
  echo "train_nccl_gpu: no GPU visible (nvidia-smi -L lists none); nothing to run" >&2
  exit 2
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCAFFE2_USE_CUDA=ON | tee "$build.configure.log" |
  grep -E 'trainer:|Torch|CUDA' || true
grep -q 'trainer: NCCL backend enabled' "$build.configure.log" || {
  echo "train_nccl_gpu: the NCCL backend was not enabled (see $build.configure.log)" >&2
  exit 1
}
cmake --build "$build" -j "$(nproc)" --target train trainer_multiprocess_tests
nproc=$(( ngpu >= 2 ? 2 : 1 ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$((29800 + RANDOM % 100))
for ((r = 0; r < nproc; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$nproc LOCAL_WORLD_SIZE=$nproc MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port timeout 300 "$build/bin/train" --backend nccl --steps 1000 \
    --log-every 200 --check-params --checkpoint-dir "$work/ckpt" >"$work/rank$r.log" 2>&1 &
done
status=0
wait || status=$?
cat "$work"/rank*.log
[[ $status -eq 0 ]] || { echo "train_nccl_gpu: NCCL run failed ($status)" >&2; exit 1; }
grep -q 'backend nccl' "$work/rank0.log" || { echo "train_nccl_gpu: rank 0 did not use NCCL" >&2; exit 1; }
# The multi-process tests, whose NCCL case now runs instead of skipping.
"$build/bin/trainer_multiprocess_tests" -tc='*nccl*'
echo "train_nccl_gpu: NCCL path ok on $nproc GPU(s)"

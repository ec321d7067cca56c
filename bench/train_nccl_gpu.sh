#!/usr/bin/env bash
# On a GPU machine: builds the CUDA variant of `train` (scripts/build-cuda.sh:
# the venv's CUDA LibTorch, /usr/local/cuda's NCCL), then runs, same model and
# batch, `train --backend nccl` and the stock PyTorch DDP reference on NCCL
# (bench/ddp_reference.py under the venv's torchrun), prints the samples/s
# ratio, and the all-reduce bus bandwidth per bucket size
# (bench/allreduce_busbw.py). 2 ranks with 2+ GPUs, else 1.
#
#   bench/train_nccl_gpu.sh          (MODEL=cnn STEPS=2000 BATCH=256 by default)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${DDPRUN_TORCH_VENV:-$root/.venv-torch}
model=${MODEL:-cnn}
steps=${STEPS:-2000}
batch=${BATCH:-256}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l || true)
if [[ ${ngpu:-0} -lt 1 ]]; then
  echo "train_nccl_gpu: no GPU visible (nvidia-smi -L lists none); nothing to run" >&2
  exit 2
fi
bash "$root/scripts/setup-torch.sh"
bash "$root/scripts/build-cuda.sh" "$root/build-cuda"
train=$root/build-cuda/bin/train
nproc=$(( ngpu >= 2 ? 2 : 1 ))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rate() { grep -o 'rank 0 steps [0-9]* samples_per_s [0-9.]*' "$1" | awk '{print $NF}'; }

"$venv/bin/torchrun" --standalone --nproc-per-node=$nproc --no-python "$train" --backend nccl \
  --model "$model" --steps "$steps" --batch "$batch" --log-every 500 --check-params \
  --checkpoint-every 0 --checkpoint-dir "$work/ckpt" >"$work/train.log" 2>&1 ||
  { cat "$work/train.log"; echo "train_nccl_gpu: train --backend nccl failed" >&2; exit 1; }
grep -q 'backend nccl' "$work/train.log" || { echo "train_nccl_gpu: rank 0 did not use NCCL" >&2; exit 1; }
"$venv/bin/torchrun" --standalone --nproc-per-node=$nproc "$root/bench/ddp_reference.py" \
  --backend nccl --model "$model" --steps "$steps" --batch "$batch" >"$work/ref.log" 2>&1 ||
  { cat "$work/ref.log"; echo "train_nccl_gpu: reference failed" >&2; exit 1; }
grep 'rank 0 steps' "$work/train.log" "$work/ref.log"
t=$(rate "$work/train.log"); r=$(rate "$work/ref.log")
printf 'model %s, batch %s/rank, %s GPU(s): train %.1f samples/s, stock DDP %.1f samples/s, ratio %.2fx\n' \
  "$model" "$batch" "$nproc" "$t" "$r" "$(echo "$t / $r" | bc -l)"
if (( nproc > 1 )); then
  "$venv/bin/torchrun" --standalone --nproc-per-node=$nproc "$root/bench/allreduce_busbw.py"
fi

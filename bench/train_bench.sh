#!/usr/bin/env bash
# train vs the stock-PyTorch DDP reference (bench/ddp_reference.py), both 2
# ranks on this machine, in one run; plus train with 1 rank. Same model
# (MODEL=mlp, 784-256-256-10, or MODEL=cnn), batch 32 per rank, lr 0.1, steps
# and data (the embedded digits). The reference runs under torch 1.13
# (Debian, bench/torchrun-1.13) and, when scripts/setup-torch.sh has made
# .venv-torch, under torch 2.x too (its torchrun).
#
#   bench/train_bench.sh [build-dir]      (STEPS=1000 REPEATS=3 MODEL=mlp by default)
#
# Prints each run's final lines and a summary with the samples/s ratios
# (median of REPEATS runs each, interleaved so load drifts hit all alike).
#
# train runs with --checkpoint-every 0 (the reference does not checkpoint;
# train's default writes and fsyncs one every 100 steps). train re-executes
# itself with OPENBLAS_CORETYPE=SkylakeX when OpenBLAS misdetects the CPU as
# Prescott (see trainer/blas_setup.h); a fourth row runs the reference with
# OPENBLAS_CORETYPE=$REF_CORETYPE (default SkylakeX; empty skips it) to show
# how much of the gap is that kernel choice.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
train=$build/bin/train
ddprun=$build/bin/ddprun
steps=${STEPS:-1000}
repeats=${REPEATS:-3}
model=${MODEL:-mlp}
torchrun113=$root/bench/torchrun-1.13
venv=${DDPRUN_TORCH_VENV:-$root/.venv-torch}
torchrun2=$venv/bin/torchrun
[[ -x $torchrun2 ]] || torchrun2=
ref_coretype=${REF_CORETYPE-SkylakeX}
data=$root/data/digits
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -x $train ]] || { echo "train_bench: $train not built" >&2; exit 2; }

export OMP_NUM_THREADS=1
port=$((29700 + RANDOM % 200))

rate() { grep -o 'rank 0 steps [0-9]* samples_per_s [0-9.]*' "$1" | awk '{print $NF}' || true; }

# run_ref <log> [coretype] [torchrun]: the torchrun's own python runs the script.
run_ref() {
  env PATH=/usr/bin:$PATH ${2:+OPENBLAS_CORETYPE=$2} "${3:-$torchrun113}" --standalone --nproc_per_node=2 \
    "$root/bench/ddp_reference.py" --model "$model" --steps "$steps" --data "$data" >"$1" 2>&1 ||
    { echo "reference run failed:"; tail -5 "$1"; }
}
run_train2() {
  if [[ -x $ddprun ]]; then
    "$ddprun" --standalone --nproc-per-node=2 --no-python "$train" --model "$model" --steps "$steps" \
      --log-every 0 --no-resume --checkpoint-every 0 --checkpoint-dir "$work/ckpt" >"$1" 2>&1
  else
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port "$train" --model "$model" --steps "$steps" --log-every 0 --no-resume \
        --checkpoint-every 0 --checkpoint-dir "$work/ckpt" >"$1.$r" 2>&1 &
    done
    wait
    cat "$1.0" "$1.1" >"$1"
    port=$((port + 1))
  fi
}
run_train1() {
  RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$train" --model "$model" --steps "$steps" \
    --log-every 0 --no-resume --checkpoint-every 0 --checkpoint-dir "$work/ckpt" >"$1" 2>&1
  port=$((port + 1))
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

: >"$work/ref" ; : >"$work/t2" ; : >"$work/t1" ; : >"$work/refk" ; : >"$work/ref2"
for i in $(seq "$repeats"); do
  run_ref "$work/ref.$i";    grep '^rank\|\]:rank' "$work/ref.$i" | sed 's/^/reference: /'; rate "$work/ref.$i" >>"$work/ref"
  if [[ -n $torchrun2 ]]; then
    run_ref "$work/ref2.$i" "" "$torchrun2"
    grep '^rank\|\]:rank' "$work/ref2.$i" | sed 's/^/reference torch 2: /'; rate "$work/ref2.$i" >>"$work/ref2"
  fi
  run_train2 "$work/t2.$i";  grep 'rank [01] steps' "$work/t2.$i" | sed 's/^/train x2:  /'; rate "$work/t2.$i" >>"$work/t2"
  run_train1 "$work/t1.$i";  grep 'rank 0 steps' "$work/t1.$i" | sed 's/^/train x1:  /'; rate "$work/t1.$i" >>"$work/t1"
  if [[ -n $ref_coretype ]]; then
    run_ref "$work/refk.$i" "$ref_coretype"
    grep '^rank\|\]:rank' "$work/refk.$i" | sed "s/^/reference $ref_coretype: /"; rate "$work/refk.$i" >>"$work/refk"
  fi
done
ref=$(median <"$work/ref"); t2=$(median <"$work/t2"); t1=$(median <"$work/t1")
echo
echo "model $model, steps $steps, batch 32/rank, median of $repeats runs, $(nproc --all) cores, $(date -u +%F)"
printf 'reference DDP, 2 ranks : %10.1f samples/s  (torch %s)\n' "$ref" "$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
if [[ -n $torchrun2 ]]; then
  ref2=$(median <"$work/ref2")
  printf 'reference DDP, 2 ranks : %10.1f samples/s  (torch %s; train 2 ranks = %.2fx this)\n' "$ref2" \
    "$("$venv/bin/python" -c 'import torch; print(torch.__version__)')" "$(echo "$(median <"$work/t2") / $ref2" | bc -l)"
fi
printf 'train,         2 ranks : %10.1f samples/s  (%.2fx reference)\n' "$t2" "$(echo "$t2 / $ref" | bc -l)"
printf 'train,         1 rank  : %10.1f samples/s  (2 ranks / 1 rank = %.2fx)\n' "$t1" "$(echo "$t2 / $t1" | bc -l)"
if [[ -n $ref_coretype ]]; then
  refk=$(median <"$work/refk")
  printf 'reference DDP, 2 ranks, OPENBLAS_CORETYPE=%s : %10.1f samples/s  (train 2 ranks = %.2fx this)\n' \
    "$ref_coretype" "$refk" "$(echo "$t2 / $refk" | bc -l)"
fi

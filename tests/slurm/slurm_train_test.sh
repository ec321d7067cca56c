#!/usr/bin/env bash
# The project's `train` under a real Slurm (tests/slurm/cluster.sh: munged,
# slurmctld, two slurmd in network namespaces), submitted with
# examples/slurm/ddprun.sbatch: one ddprun per node, no rendezvous flags,
# one gloo rank per node, checkpoints in one folder both nodes see.
#  1. the ranks form from Slurm's environment and train (checkpoints appear);
#  2. the rank on node 2 SIGKILLed (a worker crash) restarts the group on
#     both nodes, which resume from the newest checkpoint and train on;
#  3. scancel: SIGTERM reaches both ranks, rank 0 checkpoints the step they
#     stopped at, the job ends and nothing is left on the nodes;
#  4. a second job resumes from exactly that checkpoint; `scancel
#     --signal=USR1` (what --signal=USR1@90 sends before the time limit)
#     makes it checkpoint and stop the same way.
# Usage: slurm_train_test.sh DDPRUN_BIN_DIR SOURCE_DIR TRAIN_BIN|none
# Exit 77 (skipped) without root, the packages, or `train`.
set -uo pipefail
bin_dir=$1
src=$2
train=$3
if [[ $train == none || ! -x $train ]]; then
  echo "SKIP: train is not built (DDPRUN_BUILD_TRAINER=OFF or no LibTorch)"
  exit 77
fi
source "$src/tests/slurm/cluster.sh"
slurm_require
slurm_cluster_up
fail() { slurm_fail "$@"; }

ck=$T/ck
export PATH=$bin_dir:$PATH OMP_NUM_THREADS=1
export DDPRUN_NPROC=1 DDPRUN_MAX_RESTARTS=1 DDPRUN_TERM_TIMEOUT=15
# More steps than the test lets it take: scancel ends each job.
args=("$train" --backend gloo --data "$src/data/digits" --steps 10000000
      --checkpoint-every 100 --log-every 0 --checkpoint-dir "$ck")
submit() {
  on_hub sbatch --parsable -N2 -o "$T/$1.out" "$src/examples/slurm/ddprun.sbatch" "${args[@]}"
}
# Newest checkpoint's step (manifests, step-<zero-padded step>.json, are the
# commit point), 0 when none.
newest() { ls "$ck" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)\.json$/\1/p' | sort -n | tail -1 | grep . || echo 0; }
has_ckpt() { ls "$ck" | grep -q "^step-0*$1\.json$"; }
newer_than() { (( $(newest) > $1 )); }
logged() { grep -q -- "$1" "$T/$2.out" 2>/dev/null; }
# The step rank 0 logged stopping at ("stopped by SIG after step N").
# The last such line: the group restart's teardown also stops rank 0 with
# SIGTERM (earlier, at a lower step) before scancel does.
stopped_at() { sed -n "s/.*train rank 0.*stopped by $1 after step \([0-9]*\).*/\1/p" "$T/$2.out" | tail -1; }
gone() { [[ -z $(on_hub squeue -h -j "$job" 2>/dev/null) ]]; }

# --- 1. form from Slurm's environment and train
job=$(submit job1) || fail "sbatch refused the job"
echo "job $job"
wait_until 120 newer_than 0 || fail "job 1 wrote no checkpoint"
for r in 0 1; do
  grep -q "from Slurm: --nnodes=2 --node-rank=$r --rdzv-backend=c10d --rdzv-endpoint=${tag}a:[0-9]* --rdzv-id=slurm-$job.0 " "$T/job1.out" ||
    fail "no 'from Slurm' line for node $r"
done
logged "2 ranks meet through the ddprun store" job1 || fail "train did not start with 2 ranks"
logged "backend gloo, 2 ranks" job1 || fail "train did not set up gloo across the nodes"

# --- 2. a worker crash: SIGKILL the rank on node 2
first=$(newest)
exe=$(realpath "$train")
victim=
for p in $(ip netns pids "$tag-n2"); do
  [[ $(readlink "/proc/$p/exe" 2>/dev/null) == "$exe" ]] && victim=$p
done
[[ -n $victim ]] || fail "no train process on node 2: $(slurm_left_on_nodes .)"
kill -9 "$victim"
wait_until 120 logged "resuming from $ck/step-" job1 || fail "the group did not resume from a checkpoint"
logged "restarting the group (restart 1 of 1)" job1 || fail "no group restart logged"
resumed=$(sed -n "s|.*resuming from $ck/step-[0-9]*\.json (step \([0-9]*\),.*|\1|p" "$T/job1.out" | head -1)
[[ -n $resumed ]] || fail "no resumed step in the log"
(( resumed >= first )) || fail "resumed from step $resumed, older than the checkpoint of step $first"
wait_until 120 newer_than "$resumed" || fail "the restarted group did not train past step $resumed"

# --- 3. scancel: both ranks stop, rank 0 checkpoints where they stopped
on_hub scancel "$job" || fail "scancel failed"
wait_until 60 gone || fail "job 1 is still listed after scancel"
stop1=$(stopped_at SIGTERM job1)
[[ -n $stop1 ]] || fail "train did not log stopping for SIGTERM"
has_ckpt "$stop1" || fail "no checkpoint of step $stop1, where SIGTERM stopped it: $(ls "$ck")"
logged "got SIGTERM; stopping the workers" job1 || fail "ddprun did not log the SIGTERM"
left=$(slurm_left_on_nodes 'ddprun|train')
[[ -z $left ]] || fail "left running on the nodes: $left"

# --- 4. the next job resumes from that checkpoint; SIGUSR1 stops it alike
job=$(submit job2) || fail "sbatch refused the second job"
wait_until 120 logged "resuming from $ck/step-0*$stop1.json (step $stop1," job2 ||
  fail "job 2 did not resume from step $stop1"
wait_until 120 newer_than "$stop1" || fail "job 2 did not train past step $stop1"
on_hub scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 failed"
wait_until 60 gone || fail "job 2 is still listed after SIGUSR1"
stop2=$(stopped_at SIGUSR1 job2)
[[ -n $stop2 ]] || fail "train did not log stopping for SIGUSR1"
has_ckpt "$stop2" || fail "no checkpoint of step $stop2, where SIGUSR1 stopped it: $(ls "$ck")"
logged "got SIGUSR1; stopping the workers" job2 || fail "ddprun did not log the SIGUSR1"
left=$(slurm_left_on_nodes 'ddprun|train')
[[ -z $left ]] || fail "left running on the nodes: $left"
job=
echo "PASS: resumed at step $resumed after the crash, SIGTERM checkpoint at $stop1, SIGUSR1 at $stop2"

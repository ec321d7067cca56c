#!/usr/bin/env bash
# ddprun attach --slurm-step on a real Slurm step (the two-node cluster of
# tests/slurm/cluster.sh): `srun -N2 --ntasks-per-node=2` starts four Python
# tasks directly (ranks from SLURM_PROCID, no launcher), with ddprun's
# sitecustomize on their PYTHONPATH; rank 3 stops making progress. attach,
# given only JOBID.0, finds the step's four tasks, reports rank 3 with its
# Python stack from inside stuck(), kills the step's processes, and the job
# ends with nothing left on the nodes. (The nodes share this machine's pid
# namespace, so one attach sees both nodes' tasks; on a real cluster it
# watches the node it runs on.) Exit 77 without root or Slurm.
# Usage: slurm_attach_test.sh DDPRUN_BIN SOURCE_DIR
set -uo pipefail
ddprun=$1
src=$2
signal=$(kill -l RTMIN+6)  # ddprun's faulthandler signal (introspect/stacks.h)
source "$src/tests/slurm/cluster.sh"
slurm_require python3
slurm_cluster_up
fail() { slurm_fail "$@"; }

out=$T/out
mkdir -m 777 "$out" "$T/pystacks"
# Root's own: attach writes its report through SafeDir, which refuses a
# folder anyone may write that is not sticky.
mkdir -m 755 "$T/report"
cat > "$T/job.sh" <<JOB
#!/bin/bash
exec srun -N2 --ntasks-per-node=2 /usr/bin/python3 $src/tests/introspect/scripts/srun_worker.py
JOB
# The tasks are started the way a user would to get Python stacks (docs/introspect.md).
export OUT=$out STUCK_RANK=3 PYTHONPATH=$src/introspect/python \
       DDPRUN_PYSTACK_SIGNAL=$signal DDPRUN_PYSTACK_DIR=$T/pystacks
job=$(on_hub sbatch --parsable -N2 --ntasks-per-node=2 -o "$T/job.out" "$T/job.sh") || fail "sbatch refused the job"
echo "job $job"
gone() { [[ -z $(on_hub squeue -h -j "$job" 2>/dev/null) ]]; }
stuck_or_over() { [[ -f $out/stuck ]] || gone; }
wait_until 90 stuck_or_over && [[ -f $out/stuck ]] || fail "rank 3 never got stuck ($(ls "$out"))"

"$ddprun" attach --slurm-step "$job.0" --silence-timeout 2 --on-hang kill --kill-grace 10 \
  --report-dir "$T/report" > "$T/attach.out" 2>&1
rc=$?
cat "$T/attach.out"
[[ $rc == 1 ]] || fail "attach exited $rc, not 1 (a hang reported)"
grep -q "Slurm step $job.0" "$T/attach.out" || fail "attach did not name the step"
python3 - "$T/report/hang_report.json" "$(cat "$out/stuck")" <<'PY' || fail "report: $(cat "$T/report/hang_report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["rank"] == 3 and r["pid"] == int(sys.argv[2]), (r["rank"], r["pid"])
assert sorted(w["rank"] for w in r["watched"]) == [0, 1, 2, 3], r["watched"]
first = r["stacks"][0]  # the hung rank's Python stack (faulthandler), then its native one
assert first["rank"] == 3 and first["method"] == "python_faulthandler" and "in stuck" in first["text"], first
PY
# The kill ended the step's tasks: the job ends and nothing is left on the nodes.
wait_until 60 gone || fail "the job is still listed after attach killed its step"
left=$(slurm_left_on_nodes 'srun_worker')
[[ -z $left ]] || fail "left running on the nodes: $left"
job=
echo "PASS"

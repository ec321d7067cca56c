#!/usr/bin/env bash
# ddprun under a real Slurm started here: munged, slurmctld and two slurmd
# (Debian's slurm-wlm, generated config, as root), each slurmd in its own
# network namespace (10.78.<k>.0/24 through a bridge in a hub namespace,
# where slurmctld runs), host names in /etc/netns/<ns>/hosts.
# examples/slurm/ddprun.sbatch starts one ddprun per node with no
# rendezvous flags; the test checks that ranks form from Slurm's
# environment, that a worker crash restarts the group on both nodes, and
# that scancel stops every worker after its checkpoint (SIGTERM forwarded),
# leaving nothing running, and that SIGUSR1 (--signal=USR1@90) is forwarded
# the same way. Exit 77 (skipped) without root or the packages.
# Usage: slurm_test.sh DDPRUN_BIN_DIR SOURCE_DIR
set -uo pipefail
bin_dir=$1
src=$2
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root (slurmd, network namespaces)"
for c in munged slurmctld slurmd sbatch squeue scancel ip nsenter unshare python3; do
  command -v "$c" >/dev/null || skip "$c not found (scripts/setup.sh installs slurm-wlm and munge)"
done

k=$(( $$ % 200 + 20 ))           # subnet 10.78.k.0/24, unique per run
tag=dds$$
hub=$tag-hub
T=$(mktemp -d /tmp/slurm_test.XXXXXX)
chmod 755 "$T"
pids=()
fail() {
  echo "FAIL: $*"
  for f in "$T"/job.out "$T"/job2.out "$T"/ctld.log "$T"/d/*.log; do [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done
  exit 1
}
cleanup() {
  [[ -n ${job:-} ]] && scancel "$job" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$p" 2>/dev/null
  done
  # Anything still in the namespaces (a stray slurmstepd) goes with them.
  for n in 1 2; do
    for p in $(ip netns pids $tag-n$n 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for n in $hub $tag-n1 $tag-n2; do ip netns del "$n" 2>/dev/null; rm -rf "/etc/netns/$n"; done
  rm -rf "$T"
}
trap cleanup EXIT

# Bounded wait for a condition on a daemon we do not control (no event to
# wait on): check every 0.1 s until the deadline.
wait_until() {
  local secs=$1; shift
  local end=$((SECONDS + secs))
  until "$@"; do
    ((SECONDS < end)) || return 1
    sleep 0.1
  done
}

# --- network: hub (slurmctld, sbatch) + two nodes
ip netns add $hub || skip "ip netns unusable"
ip -n $hub link add br0 type bridge && ip -n $hub addr add 10.78.$k.254/24 dev br0
ip -n $hub link set br0 up && ip -n $hub link set lo up
hosts="127.0.0.1 localhost
10.78.$k.254 ${tag}c
10.78.$k.1 ${tag}a
10.78.$k.2 ${tag}b"
for n in 1 2; do
  ns=$tag-n$n
  ip netns add $ns
  ip -n $hub link add v$n type veth peer name eth0 netns $ns
  ip -n $hub link set v$n master br0 up
  ip -n $ns addr add 10.78.$k.$n/24 dev eth0
  ip -n $ns link set eth0 up && ip -n $ns link set lo up
done
for n in $hub $tag-n1 $tag-n2; do mkdir -p /etc/netns/$n && echo "$hosts" > /etc/netns/$n/hosts; done

# --- munge with a key of its own
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none && chmod 400 "$T/munge.key"
mkdir -m 700 "$T/munge"
munged --force --foreground --key-file="$T/munge.key" --socket="$T/munge/sock" \
  --pid-file="$T/munge/pid" --log-file="$T/munge/log" --seed-file="$T/munge/seed" &
pids+=($!)
wait_until 10 test -S "$T/munge/sock" || fail "munged did not start"

# --- Slurm config: two nodes, root everywhere, no cgroups or accounting
mkdir -p "$T/ctld" "$T/d/${tag}a" "$T/d/${tag}b"
echo "CgroupPlugin=cgroup/v1" > "$T/cgroup.conf"
export SLURM_CONF=$T/slurm.conf
cat > "$SLURM_CONF" <<CONF
ClusterName=ddprun
SlurmctldHost=$(hostname -s)(10.78.$k.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge/sock
CredType=cred/munge
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/d/%n
SlurmctldPidFile=$T/ctld.pid
SlurmdPidFile=$T/d/%n.pid
SlurmctldLogFile=$T/ctld.log
SlurmdLogFile=$T/d/%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=20
NodeName=${tag}a NodeAddr=10.78.$k.1 CPUs=2 State=UNKNOWN
NodeName=${tag}b NodeAddr=10.78.$k.2 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=${tag}a,${tag}b Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
ip netns exec $hub slurmctld -D -c -i &
pids+=($!)
# slurmd needs the host's cgroup mounts, which `ip netns exec` hides behind
# a fresh /sys: enter the network namespace only, and give the node its own
# /etc/hosts in a private mount namespace.
letter=(- a b)
for n in 1 2; do
  nsenter --net=/run/netns/$tag-n$n unshare --mount --propagation private \
    sh -c 'mount --bind "$1" /etc/hosts && exec slurmd -D -N "$2"' sh \
    /etc/netns/$tag-n$n/hosts "$tag${letter[n]}" &
  pids+=($!)
done
idle() { [[ $(ip netns exec $hub sinfo -h -o %t 2>/dev/null | sort -u) == idle ]]; }
wait_until 60 idle || fail "the Slurm nodes did not come up: $(ip netns exec $hub sinfo 2>&1)"

# --- the job: the example script, no rendezvous flags
out=$T/out
mkdir -m 777 "$out"
export PATH=$bin_dir:$PATH SW_OUT=$out SW_FAIL_RANK=3 DDPRUN_PYTHON=/usr/bin/python3
export DDPRUN_NPROC=2 DDPRUN_MAX_RESTARTS=1 DDPRUN_TERM_TIMEOUT=10
job=$(ip netns exec $hub sbatch --parsable -N2 -o "$T/job.out" \
        "$src/examples/slurm/ddprun.sbatch" "$src/tests/slurm/slurm_worker.py") ||
  fail "sbatch refused the job"
echo "job $job"

ranks_of() { ls "$out" | grep -c "^rank[0-3]\.r$1\$"; }
restarted() { [[ $(ranks_of 1) == 4 ]]; }
wait_until 90 restarted || fail "the group did not restart with 4 ranks ($(ls "$out"))"
[[ $(ranks_of 0) == 4 ]] || fail "round 0 had $(ranks_of 0) ranks"
for r in 0 1 2 3; do
  f=$out/rank$r.r1
  grep -q "^WORLD_SIZE=4$" "$f" || fail "$f: $(cat "$f")"
  grep -q "^GROUP_WORLD_SIZE=2$" "$f" || fail "$f: $(cat "$f")"
  grep -q "^TORCHELASTIC_RUN_ID=slurm-$job.0$" "$f" || fail "$f: run id $(cat "$f")"
  grep -q "^MASTER_ADDR=10.78.$k.[12]$" "$f" || fail "$f: master $(cat "$f")"
done
# Both nodes took part: group ranks 0 and 1, one on each Slurm node.
[[ $(cat "$out"/rank*.r1 | grep ^SLURM_NODEID= | sort -u | wc -l) == 2 ]] || fail "one Slurm node only"
grep -q "from Slurm: --nnodes=2 --node-rank=0 --rdzv-backend=c10d --rdzv-endpoint=${tag}a:" "$T/job.out" ||
  fail "no 'from Slurm' line for node 0"
grep -q "restarting the group (restart 1 of 1)" "$T/job.out" || fail "no group restart logged"

# --- scancel: SIGTERM reaches every worker, which checkpoints and exits
ip netns exec $hub scancel "$job" || fail "scancel failed"
ckpts() { [[ $(ls "$out" | grep -c '^ckpt[0-3]\.r1$') == 4 ]]; }
wait_until 60 ckpts || fail "not every worker checkpointed: $(ls "$out")"
grep -q "^signal=SIGTERM " "$out/ckpt0.r1" || fail "checkpoint: $(cat "$out/ckpt0.r1")"
gone() { [[ -z $(ip netns exec $hub squeue -h -j "$job" 2>/dev/null) ]]; }
wait_until 60 gone || fail "the job is still listed after scancel"
# Nothing of the job is left on either node: no ddprun, no worker.
for n in 1 2; do
  left=$(for p in $(ip netns pids $tag-n$n); do cat /proc/$p/cmdline 2>/dev/null | tr '\0' ' '; echo; done |
         grep -E 'ddprun|slurm_worker' || true)
  [[ -z $left ]] || fail "left running on node $n: $left"
done
grep -q "got SIGTERM; stopping the workers" "$T/job.out" || fail "ddprun did not log the SIGTERM"

# --- Slurm's early warning: SIGUSR1 (what --signal=USR1@90 sends the steps)
# reaches every worker, which checkpoints; the job ends.
out=$T/out2
mkdir -m 777 "$out"
export SW_OUT=$out SW_FAIL_RANK=
job=$(ip netns exec $hub sbatch --parsable -N2 -o "$T/job2.out" \
        "$src/examples/slurm/ddprun.sbatch" "$src/tests/slurm/slurm_worker.py") ||
  fail "sbatch refused the second job"
formed() { [[ $(ranks_of 0) == 4 ]]; }
wait_until 90 formed || fail "the second job did not form ($(ls "$out"))"
ip netns exec $hub scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 failed"
ckpts0() { [[ $(ls "$out" | grep -c '^ckpt[0-3]\.r0$') == 4 ]]; }
wait_until 60 ckpts0 || fail "not every worker checkpointed on SIGUSR1: $(ls "$out")"
grep -q "^signal=SIGUSR1 " "$out/ckpt0.r0" || fail "checkpoint: $(cat "$out/ckpt0.r0")"
wait_until 60 gone || fail "the second job is still listed after SIGUSR1"
grep -q "got SIGUSR1; stopping the workers" "$T/job2.out" || fail "ddprun did not log the SIGUSR1"
job=
echo "PASS"

# A real two-node Slurm on this machine, for tests (sourced, bash).
#
# munged, slurmctld and two slurmd from Debian's slurm-wlm with a generated
# config, as root. Each slurmd runs in its own network namespace
# (10.78.<k>.1 and .2, through a bridge in a hub namespace at .254, where
# slurmctld runs and where the clients must run: `on_hub sbatch ...`); host
# names come from /etc/netns/<ns>/hosts. Nothing outlives the test: the EXIT
# trap cancels $job, stops the daemons and deletes the namespaces with
# whatever is still in them.
#
#   source tests/slurm/cluster.sh
#   slurm_require python3        # exit 77 (skipped) without root or a command
#   slurm_cluster_up             # or slurm_fail with the daemons' logs
#   job=$(on_hub sbatch --parsable -N2 -o "$T/job.out" script args)
#   on_node 2 CMD...             # CMD in node 2's network namespace
#   slurm_left_on_nodes REGEX    # command lines left on the nodes, if any
#
# Sets T (scratch folder, removed at exit), tag, k, hub, SLURM_CONF; node n
# is host ${tag}a / ${tag}b. Bounded waits: wait_until SECS CMD...
# shellcheck shell=bash

skip() { echo "SKIP: $*"; exit 77; }

slurm_require() {
  [[ $(id -u) == 0 ]] || skip "needs root (slurmd, network namespaces)"
  local c
  for c in munged slurmctld slurmd sbatch squeue scancel sinfo ip nsenter unshare "$@"; do
    command -v "$c" >/dev/null || skip "$c not found (scripts/setup.sh installs slurm-wlm and munge)"
  done
}

k=$(( $$ % 200 + 20 ))           # subnet 10.78.k.0/24, unique per run
tag=dds$$
hub=$tag-hub
T=$(mktemp -d /tmp/slurm_test.XXXXXX)
chmod 755 "$T"
slurm_pids=()
job=

slurm_fail() {
  echo "FAIL: $*"
  local f
  for f in "$T"/*.out "$T"/ctld.log "$T"/d/*.log; do
    [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }
  done
  # Again last: a CI summary that keeps only the head and the tail of the
  # output (and the daemons' teardown noise after it) still shows why.
  echo "FAIL: $*"
  exit 1
}

slurm_cluster_down() {
  [[ -n ${job:-} ]] && ip netns exec "$hub" scancel "$job" 2>/dev/null
  local p n _
  for p in "${slurm_pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${slurm_pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$p" 2>/dev/null
  done
  # Anything still in the namespaces (a stray slurmstepd) goes with them.
  for n in 1 2; do
    for p in $(ip netns pids "$tag-n$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for n in "$hub" "$tag-n1" "$tag-n2"; do ip netns del "$n" 2>/dev/null; rm -rf "/etc/netns/$n"; done
  rm -rf "$T"
}
trap slurm_cluster_down EXIT

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

on_hub() { ip netns exec "$hub" "$@"; }
on_node() { local n=$1; shift; nsenter --net="/run/netns/$tag-n$n" "$@"; }

# Command lines (one a line) of the processes in the nodes' namespaces that
# match REGEX.
slurm_left_on_nodes() {
  local n p
  for n in 1 2; do
    for p in $(ip netns pids "$tag-n$n"); do
      tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null; echo
    done
  done | grep -E "$1" || true
}

slurm_cluster_up() {
  # --- network: hub (slurmctld, clients) + two nodes
  ip netns add "$hub" || skip "ip netns unusable"
  ip -n "$hub" link add br0 type bridge && ip -n "$hub" addr add "10.78.$k.254/24" dev br0
  ip -n "$hub" link set br0 up && ip -n "$hub" link set lo up
  local hosts="127.0.0.1 localhost
10.78.$k.254 ${tag}c
10.78.$k.1 ${tag}a
10.78.$k.2 ${tag}b"
  local n ns
  for n in 1 2; do
    ns=$tag-n$n
    ip netns add "$ns"
    ip -n "$hub" link add "v$n" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "v$n" master br0 up
    ip -n "$ns" addr add "10.78.$k.$n/24" dev eth0
    ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up
  done
  for n in "$hub" "$tag-n1" "$tag-n2"; do mkdir -p "/etc/netns/$n" && echo "$hosts" > "/etc/netns/$n/hosts"; done

  # --- munge with a key of its own
  dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none && chmod 400 "$T/munge.key"
  mkdir -m 700 "$T/munge"
  munged --force --foreground --key-file="$T/munge.key" --socket="$T/munge/sock" \
    --pid-file="$T/munge/pid" --log-file="$T/munge/log" --seed-file="$T/munge/seed" &
  slurm_pids+=($!)
  wait_until 10 test -S "$T/munge/sock" || slurm_fail "munged did not start"

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
  ip netns exec "$hub" slurmctld -D -c -i &
  slurm_pids+=($!)
  # slurmd needs the host's cgroup mounts, which `ip netns exec` hides
  # behind a fresh /sys: enter the network namespace only, and give the node
  # its own /etc/hosts in a private mount namespace.
  local letter=(- a b)
  for n in 1 2; do
    nsenter --net="/run/netns/$tag-n$n" unshare --mount --propagation private \
      sh -c 'mount --bind "$1" /etc/hosts && exec slurmd -D -N "$2"' sh \
      "/etc/netns/$tag-n$n/hosts" "$tag${letter[n]}" &
    slurm_pids+=($!)
  done
  _slurm_idle() { [[ $(on_hub sinfo -h -o %t 2>/dev/null | sort -u) == idle ]]; }
  wait_until 60 _slurm_idle || slurm_fail "the Slurm nodes did not come up: $(on_hub sinfo 2>&1)"
}

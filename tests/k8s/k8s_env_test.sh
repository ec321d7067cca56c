#!/usr/bin/env bash
# The environment Kubernetes' training operators give torchrun, unchanged,
# given to ddprun with no flags: two "pods" (network namespaces joined by a
# bridge, 10.79.<k>.0/24), each with the operator's PET_* variables and
# the headless service names resolving in its /etc/hosts (/etc/netns/<ns>).
#   TrainJob / PyTorchJob:  PET_NNODES=2, PET_NODE_RANK, PET_NPROC_PER_NODE,
#                           PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT
#   PyTorchJob elastic:     PET_NNODES=1:2, PET_RDZV_BACKEND=c10d,
#                           PET_RDZV_ENDPOINT=<job>-worker-0:29400, PET_RDZV_ID
# Each case: all 4 workers start with WORLD_SIZE=4 and meet through the
# store, both agents exit 0 once the workers are told to stop.
# Exit 77 (skipped) without root or `ip netns`.
# Usage: k8s_env_test.sh DDPRUN_BIN MN_WORKER
set -uo pipefail
ddprun=$1
worker=$2
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "ip not found"

k=$(( $$ % 200 + 20 ))
tag=ddk$$
T=$(mktemp -d /tmp/k8s_test.XXXXXX)
agents=()
cleanup() {
  for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for n in $tag-hub $tag-p0 $tag-p1; do ip netns del "$n" 2>/dev/null; rm -rf "/etc/netns/$n"; done
  rm -rf "$T"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log; do echo "--- $f"; tail -n 30 "$f"; done
  exit 1
}
wait_until() {  # bounded poll of files the workers write
  local secs=$1; shift
  local end=$((SECONDS + secs))
  until "$@"; do ((SECONDS < end)) || return 1; sleep 0.05; done
}

ip netns add $tag-hub || skip "ip netns unusable"
ip -n $tag-hub link add br0 type bridge && ip -n $tag-hub link set br0 up
for p in 0 1; do
  ns=$tag-p$p
  ip netns add $ns
  ip -n $tag-hub link add v$p type veth peer name eth0 netns $ns
  ip -n $tag-hub link set v$p master br0 up
  ip -n $ns addr add 10.79.$k.$((p + 1))/24 dev eth0
  ip -n $ns link set eth0 up && ip -n $ns link set lo up
  mkdir -p /etc/netns/$ns
  # What the cluster DNS answers for the headless service names.
  printf '127.0.0.1 localhost\n10.79.%s.1 ddp-node-0-0.ddp ddp-worker-0\n10.79.%s.2 ddp-node-0-1.ddp ddp-worker-1\n' \
    "$k" "$k" > /etc/netns/$ns/hosts
done

run_case() {  # name, then the PET_* variables of pod p as "VAR=value" (with @P for the rank)
  local name=$1; shift
  local out=$T/$name
  mkdir -p "$out"
  agents=()
  for p in 0 1; do
    local env=()
    for v in "$@"; do env+=("${v//@P/$p}"); done
    ip netns exec $tag-p$p env "${env[@]}" MN_OUT="$out" MN_NODE=p$p \
      DDPRUN_RDZV_TOKEN=k8s-secret "$ddprun" "$worker" > "$T/$name.p$p.log" 2>&1 &
    agents+=($!)
  done
  four() { [[ $(ls "$out" | grep -c '^p[01]\.r[0-9]*\.l[01]$') == 4 ]]; }
  wait_until 60 four || fail "$name: workers did not all start ($(ls "$out"))"
  for f in "$out"/p*.l*; do
    grep -q '^WORLD_SIZE=4$' "$f" || fail "$name: $f: $(cat "$f")"
    grep -q '^MET=yes$' "$f" || fail "$name: $f did not meet the others"
    grep -q '^MASTER_ADDR=10.79.'"$k"'.[12]$' "$f" || fail "$name: $f: $(cat "$f")"
  done
  touch "$out/stop"
  for i in 0 1; do
    local status=0
    # bounded: the agents' own deadlines end them; a stuck one fails here
    wait_until 60 bash -c "! kill -0 ${agents[$i]} 2>/dev/null" || fail "$name: agent $i still running"
    wait "${agents[$i]}" || status=$?
    [[ $status == 0 ]] || fail "$name: agent $i exited $status"
  done
  agents=()
  echo "$name: ok"
}

run_case trainjob PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=@P \
  PET_MASTER_ADDR=ddp-node-0-0.ddp PET_MASTER_PORT=29400
run_case elastic PET_NNODES=1:2 PET_NPROC_PER_NODE=2 PET_RDZV_BACKEND=c10d \
  PET_RDZV_ENDPOINT=ddp-worker-0:29400 PET_RDZV_ID=ddp PET_MAX_RESTARTS=3 \
  PET_RDZV_CONF=last_call_timeout=30
echo PASS

#!/usr/bin/env bash
# Rendezvous across three network namespaces joined by veth pairs to a
# bridge in a hub namespace: real separate network stacks on one machine.
#
#   netns.sh STORE_BIN NODE_BIN
#
# ns1 hosts ddprun-store (with a token) at 10.77.0.1; one rendezvous_node
# per namespace (2 workers each, rejoining after each round end as an agent
# does) must form a round of WORLD_SIZE 6 with unique ranks; a node killed
# with SIGKILL makes the others re-form at MIN nodes (WORLD_SIZE 4, group
# ranks kept); a node started later is taken in (WORLD_SIZE 6 again);
# cutting ns3's link is detected by the others within the keep-alive
# window (and by ns3 as a lost store); a wrong token is refused on both
# sides. Every namespace and process is removed on exit,
# pass or fail. Exit 77 (skipped) without root or ip netns.
set -euo pipefail
store_bin=$1
node_bin=$2

if [[ $EUID -ne 0 ]] || ! ip netns add "ddp-probe-$$" 2>/dev/null; then
  echo "SKIP: needs root and 'ip netns'"
  exit 77
fi
ip netns del "ddp-probe-$$"

id=$$
hub="ddp-hub-$id"
ns() { echo "ddp-n$1-$id"; }
work=$(mktemp -d)
pids=()
declare -A node_pid
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for i in 1 2 3; do ip netns del "$(ns "$i")" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.out "$work"/*.err; do [[ -s $f ]] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}

# Waits (bounded) until FILE contains PATTERN.
wait_for() {
  local file=$1 pattern=$2 limit=$3
  local deadline=$((SECONDS + limit))
  until grep -q -- "$pattern" "$file" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "'$pattern' did not appear in $file within $limit s"
    sleep 0.1
  done
}

ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for i in 1 2 3; do
  ip netns add "$(ns "$i")"
  ip link add "v$i-$id" type veth peer name "h$i-$id"
  ip link set "v$i-$id" netns "$(ns "$i")"
  ip link set "h$i-$id" netns "$hub"
  ip -n "$(ns "$i")" link set lo up
  ip -n "$(ns "$i")" addr add "10.77.0.$i/24" dev "v$i-$id"
  ip -n "$(ns "$i")" link set "v$i-$id" up
  ip -n "$hub" link set "h$i-$id" master br0
  ip -n "$hub" link set "h$i-$id" up
done

token="netns-secret-$RANDOM$RANDOM"
store="10.77.0.1:29470"
DDPRUN_RDZV_TOKEN=$token ip netns exec "$(ns 1)" "$store_bin" --host 10.77.0.1 --port 29470 \
  >"$work/store.out" 2>&1 &
pids+=($!)
wait_for "$work/store.out" "listening on 10.77.0.1:29470" 10

# --- three nodes form one round
for i in 1 2 3; do
  ip netns exec "$(ns "$i")" "$node_bin" --store "$store" --token "$token" --id "node$i" \
    --addr "10.77.0.$i" --min 2 --max 3 --nproc 2 --watch-ms 60000 --keep-alive-ms 500 --rounds 5 \
    >"$work/node$i.out" 2>"$work/node$i.err" &
  pids+=($!)
  node_pid[$i]=$!
done
for i in 1 2 3; do wait_for "$work/node$i.out" "round=" 30; done
ranks=$(sed -n 's/.*group_rank=\([0-9]*\).*/\1/p' "$work"/node?.out | sort | tr '\n' ' ')
[[ $ranks == "0 1 2 " ]] || fail "group ranks are '$ranks', expected 0 1 2"
bases=$(sed -n 's/.*rank_base=\([0-9]*\).*/\1/p' "$work"/node?.out | sort -n | tr '\n' ' ')
[[ $bases == "0 2 4 " ]] || fail "rank bases are '$bases', expected 0 2 4"
for i in 1 2 3; do
  grep -q "world_size=6 " "$work/node$i.out" || fail "node$i: WORLD_SIZE is not 6"
done
masters=$(sed -n 's/.*master=\(.*\)/\1/p' "$work"/node?.out | sort -u)
[[ $masters =~ ^10\.77\.0\.[123]:2960[0]$ ]] || fail "master addresses differ or are wrong: $masters"
echo "ok: 3 namespaces formed one round, WORLD_SIZE 6, ranks 0 1 2, master $masters"

# --- SIGKILL node3: the others re-form at MIN nodes, keeping their ranks
r1=$(grep -m1 round= "$work/node1.out" | sed 's/.*group_rank=\([0-9]*\).*/\1/')
r2=$(grep -m1 round= "$work/node2.out" | sed 's/.*group_rank=\([0-9]*\).*/\1/')
kill -KILL "${node_pid[3]}"
for i in 1 2; do wait_for "$work/node$i.out" "end=peer_dead reason=node node3 at 10.77.0.3" 20; done
for i in 1 2; do wait_for "$work/node$i.out" "group_world_size=2 world_size=4 " 30; done
n1=$(grep round= "$work/node1.out" | tail -1 | sed 's/.*group_rank=\([0-9]*\).*/\1/')
n2=$(grep round= "$work/node2.out" | tail -1 | sed 's/.*group_rank=\([0-9]*\).*/\1/')
if ((r1 < 2 && r2 < 2)); then
  [[ $n1 == "$r1" && $n2 == "$r2" ]] || fail "group ranks changed from $r1,$r2 to $n1,$n2"
fi
echo "ok: SIGKILL of node3 -> re-formed at MIN nodes with WORLD_SIZE 4 (ranks $r1,$r2 -> $n1,$n2)"

# --- a node started later is taken in at the next round boundary
ip netns exec "$(ns 3)" "$node_bin" --store "$store" --token "$token" --id node3b \
  --addr 10.77.0.3 --min 2 --max 3 --nproc 2 --watch-ms 60000 --keep-alive-ms 500 --rounds 5 \
  >"$work/node3b.out" 2>"$work/node3b.err" &
pids+=($!)
for i in 1 2; do wait_for "$work/node$i.out" "end=scale_up reason=scale-up: node node3b" 20; done
for f in node1 node2 node3b; do wait_for "$work/$f.out" "group_world_size=3 world_size=6 " 30; done
echo "ok: late node3b taken in (scale-up, WORLD_SIZE 6)"

# --- cut ns3's link: the others declare it dead, ns3 loses the store
start=$SECONDS
ip -n "$hub" link set "h3-$id" down
wait_for "$work/node1.out" "end=peer_dead reason=node node3b at 10.77.0.3" 20
wait_for "$work/node2.out" "end=peer_dead reason=node node3b at 10.77.0.3" 20
wait_for "$work/node3b.out" "end=store_lost reason=store at $store" 20
echo "ok: link cut detected by both peers in $((SECONDS - start)) s (keep-alive 0.5 s x 3)"

# --- a wrong token is refused on both sides
if ip netns exec "$(ns 2)" "$node_bin" --store "$store" --token wrong --id intruder \
  --addr 10.77.0.2 --min 1 --max 1 >"$work/intruder.out" 2>"$work/intruder.err"; then
  fail "a wrong token was accepted"
fi
grep -q "refused the token" "$work/intruder.err" || fail "intruder error does not say the token was refused"
wait_for "$work/store.out" "refused 10.77.0.2:[0-9]*: wrong token" 5
if grep -q "$token" "$work/store.out" "$work"/node?.out "$work"/node?.err; then
  fail "the token appears in a log"
fi
echo "ok: wrong token refused (client: '$(cat "$work/intruder.err")')"
echo "PASS"

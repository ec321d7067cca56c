#!/usr/bin/env bash
# The "Rendezvous at scale" table of docs/BENCHMARKS.md: N simulated nodes on
# ddprun-store (in process), on etcd (Debian's etcd-server, started here) and
# on torch 2.x's c10d dynamic rendezvous, one JSON line a run.
#   bash bench/rendezvous_scale.sh [build folder] [Ns for store] [Ns for etcd] [Ns for c10d]
# A c10d or etcd size is tried only while the previous one took under 5 min.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
store_ns=${2:-"64 256 1024 4096"}
etcd_ns=${3:-"64 256 1024"}
c10d_ns=${4:-"64 256 1024"}
bin=$build/bin/rendezvous_scale
py=$repo/.venv-torch/bin/python
echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $store_ns; do "$bin" --backend store --nodes "$n" || true; done

tmp=$(mktemp -d)
etcd_pid=
cleanup() { [ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
if command -v etcd >/dev/null; then
  port=$((20000 + RANDOM % 20000))
  etcd --name b --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$port" \
    --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" --initial-cluster "b=http://127.0.0.1:$((port + 1))" \
    --log-level error --logger zap >"$tmp/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  for n in $etcd_ns; do
    start=$SECONDS
    timeout 600 "$bin" --backend etcd --etcd "127.0.0.1:$port" --nodes "$n" || echo "{\"backend\": \"etcd\", \"nodes\": $n, \"error\": \"exit $?\"}"
    [ $((SECONDS - start)) -lt 300 ] || break
  done
fi
if [ -x "$py" ]; then
  for n in $c10d_ns; do
    start=$SECONDS
    timeout 600 "$py" "$repo/bench/rendezvous_scale_c10d.py" --nodes "$n" 2>/dev/null | grep '^{' ||
      echo "{\"backend\": \"c10d-torch\", \"nodes\": $n, \"error\": \"no result within 600 s\"}"
    [ $((SECONDS - start)) -lt 300 ] || break
  done
fi

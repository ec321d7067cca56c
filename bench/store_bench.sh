#!/usr/bin/env bash
# Runs store_bench (ddprun's store vs c10d::TCPStore) with a resolver that
# answers at once, in a private mount namespace when root:
#   bench/store_bench.sh BUILD_DIR [store_bench args...]
#   e.g. bench/store_bench.sh build-cuda --seconds 2 --reps 5 --barrier 256,1024,4096,16384
#
# Why: torch 2.x's TCPStore client looks up the reverse DNS name of
# 127.0.0.1 on every connect (c10d socket.cpp, for its log lines), through the
# nameserver in /etc/resolv.conf rather than /etc/hosts. This machine's
# nameserver drops bursts, so with 32 or more clients connecting at once
# most waited 5 or 10 s (the resolver's timeout), which measured the DNS
# server, not the store (256 clients: 10.3 s; 0.26 s with a resolver that
# refuses at once). A cluster's resolver answers in microseconds, so the
# fair comparison has one that answers at once: nameserver 127.0.0.1, where
# nothing listens. ddprun's client does no DNS lookup for a numeric host.
set -euo pipefail
build=${1:?usage: bench/store_bench.sh BUILD_DIR [store_bench args...]}
shift
bin=$build/bin/store_bench
[[ -x $bin ]] || { echo "store_bench.sh: $bin not built (cmake --build $build --target store_bench)" >&2; exit 2; }
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null; then
  echo "store_bench.sh: not root: TCPStore's connects go through this machine's resolver" >&2
  exec "$bin" "$@"
fi
conf=$(mktemp)
trap 'rm -f "$conf"' EXIT
echo "nameserver 127.0.0.1" >"$conf"
unshare -m sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$conf" "$bin" "$@"

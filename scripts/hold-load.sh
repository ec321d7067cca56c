#!/usr/bin/env bash
# Holds this machine's 1-minute load average near TARGET for the load runs
# of the test suite (issue 20: "run the whole suite at load 6"), whatever
# else runs beside it: every 15 s it adds a nice-0 busy loop when the load
# is below TARGET - 0.5 and ends one when it is above TARGET + 0.5. It
# samples the load to LOG (one "epoch-seconds load loops" line each 15 s)
# and stops by itself after SECONDS_MAX, or at SIGTERM/SIGINT, ending its
# loops.
#   scripts/hold-load.sh TARGET SECONDS_MAX [LOG]
# e.g. scripts/hold-load.sh 6 3600 /tmp/load.log & (cd build && ctest -j2); kill %1
set -euo pipefail
target=${1:?target load}
limit=${2:?seconds}
log=${3:-/dev/null}
loops=()
stop() {
  ((${#loops[@]})) && kill "${loops[@]}" 2>/dev/null || true
  exit 0
}
trap stop TERM INT EXIT
end=$((SECONDS + limit))
while ((SECONDS < end)); do
  read -r load _ </proc/loadavg
  if awk -v l="$load" -v t="$target" 'BEGIN { exit !(l < t - 0.5) }'; then
    (while :; do :; done) &
    loops+=($!)
  elif ((${#loops[@]})) && awk -v l="$load" -v t="$target" 'BEGIN { exit !(l > t + 0.5) }'; then
    kill "${loops[-1]}" 2>/dev/null || true
    unset 'loops[-1]'
  fi
  echo "$(date +%s) $load ${#loops[@]}" >>"$log"
  sleep 15
done

#!/usr/bin/env bash
# The demo's build, cold (no ccache), with and without the unity build, one
# after the other in one run: CPU seconds (user+sys of the build) and wall.
# CPU is the figure to compare on a shared machine; wall on a quiet one.
#   bash bench/demo_build_bench.sh [WORK_DIR]     default WORK_DIR: /tmp/demo-build-bench
# Each build: a fresh folder, `cmake --build -j 2 --target ddprun train`.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/demo-build-bench}
one() {  # NAME UNITY
  local dir=$work/$1
  rm -rf "$dir"
  local t0 t1 c0 c1
  t0=$(date +%s.%N)
  c0=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  CCACHE_DISABLE=1 cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_UNITY_BUILD="$2" -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >/dev/null
  CCACHE_DISABLE=1 cmake --build "$dir" -j 2 --target ddprun train >"$dir.log" 2>&1
  t1=$(date +%s.%N)
  c1=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)  # waited-for children's ticks
  local tck
  tck=$(getconf CLK_TCK)
  printf '%-6s compiles %3d  cpu %7.1f s  wall %7.1f s\n' "$1" \
    "$(grep -c 'Building CXX' "$dir.log")" "$(echo "($c1 - $c0) / $tck" | bc -l)" \
    "$(echo "$t1 - $t0" | bc -l)"
}
mkdir -p "$work"
one plain OFF
one unity ON

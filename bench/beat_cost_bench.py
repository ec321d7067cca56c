#!/usr/bin/python3
"""The agent's CPU per beat: 8 ranks beating every 1 ms, one ddprun or more.

Each rank (bench/beat_cost_worker.py, no torch) sends automatic beats ("ab",
what ddprun's bootstrap sends per optimizer.step()) to the agent's heartbeat
socket every --step-ms for --seconds. The agent's own CPU time (utime +
stime of the ddprun process, /proc/PID/stat, the workers not included) is
read after a warm-up and at the end; the beats sent in between are counted
by the workers. Per beat = CPU / beats. Every ddprun given runs --reps
times, interleaved, so load changes hit each alike.

Usage: /usr/bin/python3 bench/beat_cost_bench.py --ddprun NAME=PATH [--ddprun NAME=PATH ...]
       [--ranks 8] [--step-ms 1] [--seconds 10] [--reps 3]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from agent_cost import add_load_args, cpu_s  # same folder

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "beat_cost_worker.py")


def run(path, args):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, BEAT_DIR=tmp, BEAT_STEP_MS=str(args.step_ms),
                   BEAT_SECONDS=str(args.seconds), BEAT_WARMUP=str(args.warmup))
        proc = subprocess.Popen([path, f"--nproc-per-node={args.ranks}", "--max-restarts=0",
                                 sys.executable, WORKER], env=env, cwd=tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The workers write "started" once warm; the CPU window starts then.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not os.path.exists(os.path.join(tmp, "warm")):
            time.sleep(0.01)
        cpu0, t0 = cpu_s(proc.pid), time.monotonic()
        while time.monotonic() < deadline + args.seconds and not os.path.exists(os.path.join(tmp, "cold")):
            time.sleep(0.01)
        cpu1, t1 = cpu_s(proc.pid), time.monotonic()
        proc.wait(timeout=60)
        beats = 0
        for name in os.listdir(tmp):
            if name.startswith("beats_"):
                with open(os.path.join(tmp, name)) as f:
                    beats += int(f.read())
    return (cpu1 - cpu0), beats, t1 - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ddprun", action="append", required=True, help="NAME=PATH")
    add_load_args(p, step_ms=1.0, seconds=10.0, warmup=2.0)
    args = p.parse_args()
    rows = {}
    for rep in range(args.reps):
        for spec in args.ddprun:
            name, path = spec.split("=", 1)
            cpu, beats, wall = run(path, args)
            rows.setdefault(name, []).append((cpu, beats, wall))
            print(f"{name} #{rep}: agent CPU {cpu:.3f} s, {beats} beats in {wall:.1f} s "
                  f"({beats / wall:.0f}/s): {cpu / max(beats, 1) * 1e6:.2f} us a beat "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    print("| ddprun | agent CPU per beat (median, runs) | beats/s | agent CPU % |")
    print("| --- | --- | --- | --- |")
    for name, rs in rows.items():
        per = [c / max(b, 1) * 1e6 for c, b, _ in rs]
        print("| %s | %.2f us (%s) | %.0f | %.1f |" % (
            name, statistics.median(per), ", ".join("%.2f" % x for x in per),
            statistics.median(b / w for _, b, w in rs), statistics.median(100 * c / w for c, _, w in rs)))
    print(f"\n{args.ranks} ranks, a beat every {args.step_ms:g} ms each, {args.seconds:g} s measured "
          f"after {args.warmup:g} s; {args.reps} reps interleaved; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.uname().nodename}, "
          f"{os.cpu_count()} CPUs")


if __name__ == "__main__":
    sys.exit(main())

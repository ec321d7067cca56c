#!/usr/bin/python3
"""ddprun vs torchrun, side by side in one run, on 2 trivial native workers.

  (a) launch: from just before the launcher is started to the moment both
      workers have started (each records CLOCK_MONOTONIC on entry);
  (b) restart: from rank 1's crash (its timestamp just before exit 1) to the
      moment both workers of the next attempt have started;
  (c) the agent process's peak RSS (VmHWM from /proc, sampled until exit);
  and (a) for bench/bare_launch.c, a bare fork+exec of the two workers: the
      limit a launcher cannot beat.

The worker is the same compiled C program for both (torchrun gets
--no_python), so Python start-up of the workers is not measured; torchrun
runs with --standalone and --monitor_interval=0.1, its modern default.

Usage: /usr/bin/python3 bench/launch_bench.py [--ddprun build/bin/ddprun]
       [--torchrun bench/torchrun-1.13 or .venv-torch/bin/torchrun or none] [--reps 10]
       [--also LABEL=PATH ...]   another ddprun binary (the wheel's), same flags
Prints a Markdown table; medians over --reps repetitions.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build(tmp, name):
    exe = os.path.join(tmp, name)
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, name + ".c")], check=True)
    return exe


def vm_hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def run_once(cmd, mode, worker, tmp):
    ts = os.path.join(tmp, "ts")
    if os.path.exists(ts):
        os.remove(ts)
    env = dict(os.environ, BENCH_TS=ts)
    t0 = time.monotonic_ns()
    p = subprocess.Popen(cmd + [worker, mode], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    hwm = 0
    deadline = time.monotonic() + 120
    while p.poll() is None:  # sampling the agent's RSS: polling is the measurement
        v = vm_hwm_kib(p.pid)
        if v:
            hwm = max(hwm, v)
        if time.monotonic() > deadline:
            p.kill()
            p.wait()
            raise RuntimeError(f"{cmd[0]} did not finish within 120 s")
        time.sleep(0.005)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} {mode} exited {p.returncode}")
    rows = [line.split() for line in open(ts)]
    starts = {}
    crash = None
    for restart, rank, ns, what in rows:
        if what == "start":
            starts.setdefault(int(restart), []).append(int(ns))
        else:
            crash = int(ns)
    launch = (max(starts[0]) - t0) / 1e9
    restart = (max(starts[1]) - crash) / 1e9 if crash is not None else None
    return launch, restart, hwm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, "bench", "torchrun-1.13"),
                    help="'none': ddprun rows and the limit only (no ratios to torchrun)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=PATH",
                    help="another ddprun binary run with ddprun's flags, side by side")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="launch_bench_")
    try:
        worker = build(tmp, "launch_worker")
        bare = [build(tmp, "bare_launch"), "2"]
        launchers = {}
        if args.torchrun != "none":
            launchers["torchrun"] = [args.torchrun, "--standalone", "--nproc_per_node=2",
                                     "--monitor_interval=0.1", "--no_python"]
        # --restart-backoff=0: torchrun restarts without a backoff, too.
        launchers["ddprun"] = [args.ddprun, "--standalone", "--nproc-per-node=2",
                               "--restart-backoff=0"]
        launchers["ddprun (default backoff)"] = [args.ddprun, "--standalone", "--nproc-per-node=2"]
        for also in args.also:
            label, path = also.split("=", 1)
            launchers[label] = [path, "--standalone", "--nproc-per-node=2", "--restart-backoff=0"]
        res = {name: {"launch": [], "restart": [], "rss": []} for name in launchers}
        bare_launch = []
        names = [None] + list(launchers)  # None: the bare fork+exec
        for rep in range(args.reps):  # interleaved, so drift hits every launcher alike
            # Each repetition starts one later in the list: the run after
            # torchrun's (1.3 s of Python, 640 MiB) finds the caches cold,
            # and it would always be the same launcher's (ddprun's first row
            # was 0.3-0.6 ms slower than the same binary's next row).
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                if name is None:
                    bare_launch.append(run_once(bare, "launch", worker, tmp)[0])
                    continue
                cmd = launchers[name]
                launch, _, hwm = run_once(cmd, "launch", worker, tmp)
                res[name]["launch"].append(launch)
                res[name]["rss"].append(hwm)
                _, restart, hwm = run_once(cmd + ["--max-restarts=1"] if name != "torchrun"
                                           else cmd + ["--max_restarts=1"], "crash", worker, tmp)
                res[name]["restart"].append(restart)
                res[name]["rss"].append(hwm)
        med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
        t = med.get("torchrun")
        print(f"reps: {args.reps}, machine: {os.cpu_count()} CPUs, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        print("| launcher | launch → 2 workers running | crash → group restarted | agent peak RSS |")
        print("| --- | --- | --- | --- |")
        for n, m in med.items():
            ratio = "" if n == "torchrun" or not t else (
                f" (1/{t['launch'] / m['launch']:.0f})", f" (1/{t['restart'] / m['restart']:.0f})",
                f" (1/{t['rss'] / m['rss']:.0f})")
            r = ratio or ("", "", "")
            print(f"| {n} | {m['launch'] * 1e3:.1f} ms{r[0]} | {m['restart'] * 1e3:.1f} ms{r[1]} "
                  f"| {m['rss'] / 1024:.1f} MiB{r[2]} |")
        limit = statistics.median(bare_launch)
        print(f"| fork+exec (the limit: bench/bare_launch.c) | {limit * 1e3:.1f} ms | | |")
        print(f"\nddprun / fork+exec launch: {med['ddprun']['launch'] / limit:.2f}x "
              f"(default backoff: {med['ddprun (default backoff)']['launch'] / limit:.2f}x)")
        for also in args.also:
            label, d = also.split("=", 1)[0], med["ddprun"]
            a = med[label]
            print(f"\n{label} / ddprun: launch {a['launch'] / d['launch']:.2f}x, "
                  f"restart {a['restart'] / d['restart']:.2f}x, RSS {a['rss'] / d['rss']:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

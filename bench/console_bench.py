#!/usr/bin/python3
"""ddprun vs torchrun on the console path: 4 ranks each printing 100k lines
of 200 bytes as fast as they can (bench/console_worker.c, the same compiled
program for both; torchrun gets --no_python).

Reports, per launcher and console kind, the launcher process's own CPU time
(user + system of every thread, from /proc/<pid>/stat, sampled until it
exits: the workers' CPU is not in it), the wall time, and the lines the
console received. Console kinds: "pipe" (the bench reads ddprun's stdout
through a pipe) and "pty" (ddprun's stdout is a pseudo-terminal the bench
reads: ddprun gives each worker a pty of its own; torchrun's workers write
to that terminal directly).

Usage: /usr/bin/python3 bench/console_bench.py [--ddprun build/bin/ddprun]
       [--reps 3] [--lines 100000]
torchrun is Debian's torch.distributed.run under /usr/bin/python3, through
bench/torchrun-1.13 (which repairs its Std parsing on Python 3.11).
Prints a Markdown table; medians over --reps.
"""
import argparse
import os
import pty
import selectors
import statistics
import subprocess
import sys
import tempfile
import time

import agent_cost  # same folder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cpu_s(pid):
    """agent_cost.cpu_s, or None once the process is gone."""
    try:
        return agent_cost.cpu_s(pid)
    except (OSError, IndexError):
        return None


def run_once(cmd, console):
    """Runs `cmd` with its stdout on `console`; returns (cpu_s, wall_s, lines)."""
    if console == "pty":
        master, slave = pty.openpty()
        out_r, out_w = master, slave
    else:
        out_r, out_w = os.pipe()
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=out_w, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    os.close(out_w)
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ)
    lines = 0
    cpu = 0.0
    deadline = time.monotonic() + 300
    while True:
        c = cpu_s(p.pid)  # sampled while it runs: the last sample before exit
        if c is not None and p.poll() is None:
            cpu = c
        if sel.select(timeout=0.01):
            try:
                data = os.read(out_r, 1 << 20)
            except OSError:  # EIO: the pty's last writer is gone
                data = b""
            if not data:
                break
            lines += data.count(b"\n")
        if time.monotonic() > deadline:
            p.kill()
            break
    p.wait()
    wall = time.monotonic() - t0
    os.close(out_r)
    return cpu, wall, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build/bin/ddprun"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lines", type=int, default=100000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        worker = os.path.join(tmp, "console_worker")
        subprocess.run(["cc", "-O2", "-o", worker, os.path.join(HERE, "console_worker.c")],
                       check=True)
        launchers = {
            "ddprun": [args.ddprun, "--nproc-per-node=4", worker, str(args.lines)],
            "torchrun": ["/usr/bin/python3", os.path.join(HERE, "torchrun-1.13"), "--standalone",
                         "--nproc_per_node=4", "--monitor_interval=0.1", "--no_python", worker,
                         str(args.lines)],
        }
        print(f"4 ranks x {args.lines} lines of 200 bytes; reps: {args.reps}, machine: "
              f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
        print()
        print("| console | launcher | agent CPU s | wall s | lines shown |")
        print("|---|---|---|---|---|")
        results = {}
        for console in ("pipe", "pty"):
            for name, cmd in launchers.items():
                runs = [run_once(cmd, console) for _ in range(args.reps)]
                cpu = statistics.median(r[0] for r in runs)
                wall = statistics.median(r[1] for r in runs)
                shown = min(r[2] for r in runs)
                results[(console, name)] = cpu
                print(f"| {console} | {name} | {cpu:.2f} | {wall:.2f} | {shown} |")
                sys.stdout.flush()
        print()
        for console in ("pipe", "pty"):
            d, t = results[(console, "ddprun")], results[(console, "torchrun")]
            ratio = f"{t / d:.1f}x" if d > 0 else "n/a"
            print(f"{console}: torchrun's agent CPU / ddprun's = {ratio}")


if __name__ == "__main__":
    main()

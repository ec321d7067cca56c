#!/usr/bin/python3
"""The agent's cost of --metrics-port: CPU and resident memory of the ddprun
process with the exporter off, and on with a scrape every --scrape-s
seconds, side by side.

Each run: --ranks ranks beat every --step-ms (tests/observe/workers/
steady_worker.py, no torch) for --seconds after a warm-up; the agent's CPU
time (utime + stime of the ddprun process, /proc/PID/stat, workers not
included) is read at the start and the end of that window, its VmRSS and
VmHWM (/proc/PID/status) at the end. "on" scrapes /metrics from this
process (urllib) at the given period; each scrape's body size and time are
kept. Off and on alternate --reps times, so load changes hit both alike.

Usage: /usr/bin/python3 bench/metrics_cost_bench.py DDPRUN [--ranks 8]
       [--step-ms 10] [--seconds 30] [--scrape-s 1] [--reps 3]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from agent_cost import add_load_args, cpu_s  # same folder

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "tests", "observe", "workers", "steady_worker.py")


def memory_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    return tuple(int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) for k in ("VmRSS", "VmHWM"))


def metrics_url(proc, deadline_s=60):
    """The URL ddprun logs ("metrics at http://..."), read from its stderr."""
    until = time.monotonic() + deadline_s
    for line in proc.stderr:
        m = re.search(r"metrics at (http://\S+)", line)
        if m:
            return m.group(1)
        if time.monotonic() > until:
            break
    raise SystemExit("ddprun never said where its metrics are")


def run(ddprun, args, exporter):
    with tempfile.TemporaryDirectory() as tmp:
        stop = os.path.join(tmp, "stop")
        cmd = [ddprun, f"--nproc-per-node={args.ranks}", f"--log-dir={tmp}/logs"]
        if exporter:
            cmd.append("--metrics-port=0")
        cmd += ["/usr/bin/python3", WORKER, "--until", stop, "--step-seconds", str(args.step_ms / 1000)]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE if exporter else subprocess.DEVNULL, text=True)
        url = metrics_url(proc) if exporter else None
        if exporter:  # keep draining stderr so the agent's console never stalls
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        time.sleep(args.warmup)  # the workers' start-up is not the exporter's cost
        scrapes = []
        done = threading.Event()

        def scrape():
            while not done.wait(args.scrape_s):
                t = time.monotonic()
                with urllib.request.urlopen(url, timeout=10) as r:
                    size = len(r.read())
                scrapes.append((time.monotonic() - t, size))

        scraper = threading.Thread(target=scrape, daemon=True) if exporter else None
        cpu0 = cpu_s(proc.pid)
        if scraper:
            scraper.start()
        time.sleep(args.seconds)  # the measured window itself
        cpu1 = cpu_s(proc.pid)
        rss, hwm = memory_kib(proc.pid)
        done.set()
        if scraper:
            scraper.join(30)
        open(stop, "w").close()
        proc.wait(timeout=60)
    return cpu1 - cpu0, rss, hwm, scrapes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ddprun")
    add_load_args(p, step_ms=10, seconds=30, warmup=3)
    p.add_argument("--scrape-s", type=float, default=1)
    args = p.parse_args()
    results = {False: [], True: []}
    for _ in range(args.reps):
        for exporter in (False, True):
            results[exporter].append(run(args.ddprun, args, exporter))
    print(f"{args.ranks} ranks, a beat every {args.step_ms:g} ms, {args.seconds:g} s windows, "
          f"{args.reps} runs each, scrape every {args.scrape_s:g} s when on")
    for exporter in (False, True):
        rows = results[exporter]
        cpu = [r[0] / args.seconds * 100 for r in rows]
        rss = [r[1] / 1024 for r in rows]
        hwm = [r[2] / 1024 for r in rows]
        line = (f"exporter {'on ' if exporter else 'off'}: agent CPU {statistics.median(cpu):.2f}% "
                f"(runs {', '.join(f'{c:.2f}' for c in cpu)}), RSS {statistics.median(rss):.1f} MiB, "
                f"peak {statistics.median(hwm):.1f} MiB")
        scrapes = [s for r in rows for s in r[3]]
        if scrapes:
            times = sorted(s[0] * 1000 for s in scrapes)
            line += (f"; {len(scrapes)} scrapes, {scrapes[-1][1]} bytes, median "
                     f"{statistics.median(times):.2f} ms, max {times[-1]:.2f} ms")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

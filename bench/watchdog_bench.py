#!/usr/bin/python3
"""Hang detection and recovery: ddprun vs torchrun, side by side in one run.

Scenario: 2 workers beat every 10 ms; in attempt 0 rank 1 stops beating
after 20 beats while staying alive (blocked forever), rank 0 keeps going.
Each worker records CLOCK_MONOTONIC on entry, rank 1 its last beat's send
time (bench/watchdog_bench_worker.{cc,py}).

ddprun (--heartbeat-timeout=T --max-restarts=1):
  due        = rank 1's last beat + T
  detection  = hang_report.json's detected_monotonic_s - due
  restart    = last replacement worker's entry - detection time, of which
               "stacks" is the capture (eu-stack for native, SIGABRT+faulthandler
               is part of the teardown for Python) and the report
  recovered  = last replacement worker's entry - due
torchrun (same workers, --max_restarts=1): never notices; the bench waits
--anchor-wait seconds after the deadline, checks that no replacement worker
started, and kills it.

Usage: /usr/bin/python3 bench/watchdog_bench.py [--ddprun build/bin/ddprun]
       [--torchrun bench/torchrun-1.13 or .venv-torch/bin/torchrun] [--reps 5]
Prints a Markdown table (medians, with the worst case in brackets).
"""
import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYDIR = os.path.join(ROOT, "watchdog", "python")


def build_worker(tmp):
    exe = os.path.join(tmp, "watchdog_bench_worker")
    subprocess.run(["c++", "-O2", "-std=c++17", "-I", ROOT, "-o", exe,
                    os.path.join(HERE, "watchdog_bench_worker.cc")], check=True)
    return exe


def read_ns(d, name):
    with open(os.path.join(d, name)) as f:
        return int(f.read())


def worker_cmd(kind, exe):
    if kind == "native":
        return [exe]
    return [os.path.join(HERE, "watchdog_bench_worker.py")]


def run_ddprun(ddprun, kind, exe, timeout_s, backoff, tmp):
    d = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, BENCH_DIR=d, DDPRUN_PYTHON="/usr/bin/python3")
    cmd = [ddprun, "--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=b",
           f"--heartbeat-timeout={timeout_s}", "--heartbeat-grace=30",
           f"--log-dir={d}/logs"]
    if backoff is not None:
        cmd.append(f"--restart-backoff={backoff}")
    p = subprocess.run(cmd + worker_cmd(kind, exe), env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60 + timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"ddprun exited {p.returncode} (logs in {d})")
    # ddprun gives each run its own folder: <rdzv-id>_<random>.
    run = glob.glob(os.path.join(d, "logs", "b_*"))[0]
    with open(os.path.join(run, "attempt_0", "hang_report.json")) as f:
        rep = json.load(f)
    due = read_ns(d, "lastbeat") / 1e9 + timeout_s
    detected = rep["detected_monotonic_s"]
    # events.jsonl's hang_detected line is written once stacks are captured.
    with open(os.path.join(run, "events.jsonl")) as f:
        captured = [json.loads(l) for l in f if '"hang_detected"' in l][0]["monotonic_s"]
    restarted = max(read_ns(d, "start_1_0"), read_ns(d, "start_1_1")) / 1e9
    return {"detect_ms": (detected - due) * 1e3,
            "agent_detect_ms": rep["detected_after_due_ms"],
            "restart_ms": (restarted - detected) * 1e3,
            "capture_ms": (captured - detected) * 1e3,
            "recovered_ms": (restarted - due) * 1e3}


def run_torchrun(torchrun, kind, exe, timeout_s, wait_s, tmp):
    d = tempfile.mkdtemp(dir=tmp)
    env = dict(os.environ, BENCH_DIR=d, PYTHONPATH=PYDIR)
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
           "--monitor_interval=0.1"]
    if kind == "native":
        cmd.append("--no_python")
    p = subprocess.Popen(cmd + worker_cmd(kind, exe), env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        lastbeat = os.path.join(d, "lastbeat")
        limit = time.monotonic() + 60
        while not os.path.exists(lastbeat):  # the bench's own bounded wait
            if time.monotonic() > limit or p.poll() is not None:
                raise RuntimeError("torchrun's workers never reached the hang")
            time.sleep(0.01)
        due = read_ns(d, "lastbeat") / 1e9 + timeout_s
        time.sleep(max(0.0, due + wait_s - time.monotonic()))
        hung_s = time.monotonic() - due
        recovered = any(n.startswith("start_1_") for n in os.listdir(d))
        still_running = p.poll() is None
        return {"hung_s": hung_s, "recovered": recovered, "running": still_running}
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                pass
        p.wait()


def fmt(values, key):
    v = [r[key] for r in values]
    return f"{statistics.median(v):.1f} ms [{max(v):.1f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, "bench", "torchrun-1.13"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeouts", default="0.5,1,2")
    ap.add_argument("--anchor-wait", type=float, default=20.0,
                    help="seconds torchrun is left hung past the deadline")
    args = ap.parse_args()
    timeouts = [float(t) for t in args.timeouts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_worker(tmp)
        print("| launcher | worker | timeout | backoff | beat due → detected | detected → "
              "replacements running | due → replacements running |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for kind in ("native", "python"):
            for t in timeouts:
                for backoff in (None, 0) if t == timeouts[0] else (None,):
                    rows = [run_ddprun(args.ddprun, kind, exe, t, backoff, tmp)
                            for _ in range(args.reps)]
                    b = "0.1 s (default)" if backoff is None else f"{backoff} s"
                    print(f"| ddprun | {kind} | {t:g} s | {b} | {fmt(rows, 'detect_ms')} "
                          f"(agent's own clock: {fmt(rows, 'agent_detect_ms')}) | "
                          f"{fmt(rows, 'restart_ms')} (stacks: {fmt(rows, 'capture_ms')}) | "
                          f"{fmt(rows, 'recovered_ms')} |",
                          flush=True)
            t = timeouts[0]
            r = run_torchrun(args.torchrun, kind, exe, t, args.anchor_wait, tmp)
            state = "still running, hung" if r["running"] else "exited"
            print(f"| torchrun | {kind} | (none) | — | never: {state} {r['hung_s']:.1f} s after "
                  f"the beat was due (bench deadline) | {'a replacement started' if r['recovered'] else 'no replacement started'} | ∞ |",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())

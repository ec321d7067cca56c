#!/usr/bin/python3
"""Freeze detection: ddprun vs NVRx 0.7's ft_launcher, one set of workloads.

Workloads (bench/freeze_bench_worker.py, 2 ranks, gloo, CPU, 50 ms steps):
  steady           300 steps
  jittery          300 steps of 15..150 ms
  checkpoint       rank 0 alone saves (torch.save) every 10 steps, 30x a step
  eval             every 100 steps a no_grad eval pass, 20x a step
  eval_rank0       at step 100 rank 0 alone evaluates 25 s, rank 1 in a barrier
  phase_change     from step 100 steps 50x longer (10 of them)
  loader_sleep     a DataLoader worker sleeps 20 s once (step 100)
  hang_step        rank 1 stops inside step 150
  hang_checkpoint  rank 0's torch.save of step 150 never returns
  hang_spin        rank 1 spins in a Python loop at step 150
  hang_mismatch    at step 150 rank 0 all_reduces, rank 1 broadcasts

ddprun runs the script unmodified (its bootstrap beats on optimizer steps,
forward passes and torch.save sections), once per --ddprun-flags given (each
a column: by default no flags, i.e. learned timeouts with their 60 s floor,
and --hang-timeout-floor=5, NVRx's 5 s workload_check_interval). ft_launcher
runs it with NVRx's documented instrumentation: "step" and "checkpoint"
sections of RankMonitorClient, timeouts calculated
(calculate_and_set_section_timeouts) after 40 steps, initial timeouts 600 s.

Each launcher runs each workload --reps times. Per run: false hang (a
healthy workload that the launcher ended, or that reported a hang, or a
hang workload reported before its hang began), detection latency (the first output line saying so minus
the moment the hang began, written by the worker) and end latency (the
launcher's exit minus that moment).

Usage: /usr/bin/python3 bench/freeze_bench.py --ddprun build/bin/ddprun
       --nvrx-venv VENV [--ddprun-flags=FLAGS ...] [--reps 2] [--only ddprun|nvrx]
       [--workloads a,b] [--deadline 240]
VENV: a Python with torch 2.x and NVRx 0.7 (bench/freeze_bench_nvrx.sh makes
one). Prints a Markdown table.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "freeze_bench_worker.py")
WORKLOADS = ["steady", "jittery", "checkpoint", "eval", "eval_rank0", "phase_change",
             "loader_sleep", "hang_step", "hang_checkpoint", "hang_spin", "hang_mismatch"]
# The rank that stopped, where one rank differs (hang_mismatch: none does).
CULPRIT = {"hang_step": 1, "hang_checkpoint": 0, "hang_spin": 1}
NAMED = re.compile(r"freeze: rank (\d+) is the culprit")
# What each launcher prints when it decides a rank is hung: ddprun's one
# warning (watchdog/agent_hook.cc, tests/watchdog/freeze_test.cc) or, for
# native ranks, the line before their stack capture; NVRx's rank monitor's
# section, out-of-section and heartbeat warnings (rank_monitor_server.py).
DETECTED = {
    "ddprun": re.compile(r"freeze: rank \d+ is the culprit|Hang detected in attempt|"
                         r"capturing the stacks of \d+ hung rank"),
    "nvrx": re.compile(r"has been open for .* Timeout is|Was out of section for .* Timeout is|"
                       r"Did not get (initial|subsequent) heartbeat"),
}


def command(launcher, args):
    if launcher.startswith("ddprun"):
        # The interpreter comes from $PYTHON_EXEC (run()), as under torchrun.
        flags = launcher[len("ddprun"):].split()
        return [args.ddprun, "--nproc-per-node=2", "--max-restarts=0"] + flags + [WORKER]
    return [os.path.join(args.nvrx_venv, "bin", "ft_launcher"), "--standalone",
            "--nproc-per-node=2", "--max-restarts=0",
            "--ft-rank-section-timeouts=step:600,checkpoint:600",
            "--ft-rank-out-of-section-timeout=600", WORKER]


def run(launcher, workload, rep, args):
    python = os.path.join(args.nvrx_venv, "bin", "python")
    with tempfile.TemporaryDirectory() as tmp:
        mark = os.path.join(tmp, "hang_began")
        env = dict(os.environ, FREEZE_WORKLOAD=workload, FREEZE_MARK=mark,
                   FREEZE_CLIENT="nvrx" if launcher == "nvrx" else "none")
        env["PATH"] = os.path.join(args.nvrx_venv, "bin") + ":" + env.get("PATH", "")
        env["PYTHON_EXEC"] = python
        start = time.time()
        kind = "nvrx" if launcher == "nvrx" else "ddprun"
        proc = subprocess.Popen(command(launcher, args), env=env, cwd=tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        detected = []
        named = []
        log = []

        def read():
            for line in proc.stdout:
                log.append(line)
                if not detected and DETECTED[kind].search(line):
                    detected.append(time.time())
                m = NAMED.search(line)
                if m and not named:
                    named.append(int(m.group(1)))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=args.deadline)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = proc.wait()
            rc = "timeout"
        end = time.time()
        reader.join(timeout=10)
        began = None
        if os.path.exists(mark):
            with open(mark) as f:
                began = float(f.read())
        if args.keep_logs:
            name = "%s_%s_%d.log" % (re.sub(r"[^\w=.-]+", "_", launcher), workload, rep)
            with open(os.path.join(args.keep_logs, name), "w") as f:
                f.writelines(log)
    hang = workload.startswith("hang")
    row = {"rc": rc, "wall": end - start}
    if hang:
        row["detect"] = detected[0] - began if detected and began else None
        # A line naming a hang before the hang began is a false hang.
        row["early"] = bool(detected) and (began is None or detected[0] < began)
        row["end"] = end - began if began and rc != "timeout" else None
        if workload in CULPRIT and kind == "ddprun":
            row["culprit_ok"] = bool(named) and named[0] == CULPRIT[workload]
    else:
        row["false_hang"] = bool(detected) or rc != 0
    return row


def fmt(rows, hang):
    """One cell: every rep of one launcher on one workload."""
    if not hang:
        bad = [r for r in rows if r["false_hang"]]
        if bad:
            return "**%d/%d false hang** (rc %s)" % (len(bad), len(rows),
                                                     ", ".join(str(r["rc"]) for r in bad))
        return "ok %d/%d (%s s)" % (len(rows), len(rows),
                                    " / ".join("%.0f" % r["wall"] for r in rows))
    cells = []
    for r in rows:
        if r["early"]:
            cells.append("**false hang before the hang** (rc %s)" % r["rc"])
        elif r["detect"] is None:
            cells.append("not detected (rc %s)" % r["rc"])
        else:
            end = "%.1f" % r["end"] if r["end"] is not None else "never"
            named = {True: ", culprit right", False: ", **culprit wrong**"}.get(r.get("culprit_ok"), "")
            cells.append("%.1f s [%s%s]" % (r["detect"], end, named))
    return " / ".join(cells)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ddprun", default=os.path.join(os.path.dirname(HERE), "build", "bin", "ddprun"))
    p.add_argument("--ddprun-flags", action="append",
                   help="one ddprun column per use (default: '' and --hang-timeout-floor=5)")
    p.add_argument("--nvrx-venv", required=True)
    p.add_argument("--only", choices=["ddprun", "nvrx"])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--deadline", type=float, default=240.0)
    p.add_argument("--keep-logs")
    args = p.parse_args()
    flags = args.ddprun_flags if args.ddprun_flags is not None else [""]
    ddpruns = [("ddprun " + f).strip() for f in flags]
    launchers = ddpruns if args.only == "ddprun" else ["nvrx"] if args.only else ddpruns + ["nvrx"]
    workloads = args.workloads.split(",")
    results = {}
    start = time.time()
    # Reps outermost, launchers innermost: load changes during the run hit
    # every launcher alike.
    for rep in range(args.reps):
        for w in workloads:
            for l in launchers:
                row = run(l, w, rep, args)
                results.setdefault((l, w), []).append(row)
                print("%s %s #%d: %s (load %.1f)" % (l, w, rep, row, os.getloadavg()[0]),
                      file=sys.stderr, flush=True)
    names = [l + " (learned, floor 60 s)" if l == "ddprun" else l for l in launchers]
    print("| workload | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(launchers))
    for w in workloads:
        cells = [fmt(results[(l, w)], w.startswith("hang")) for l in launchers]
        print("| %s | %s |" % (w, " | ".join(cells)))
    print("\nhealthy rows: runs without a false hang, in brackets each run's wall time; hang rows: "
          "each run's detection latency (first line naming the hang minus the moment it began), "
          "in brackets the launcher's exit; %d reps; %s, %s, %.0f s in all, load average now %.1f" % (
              args.reps, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.uname().nodename,
              time.time() - start, os.getloadavg()[0]))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Freeze detection: ddprun vs NVRx 0.7's ft_launcher, one set of workloads.

Workloads (bench/freeze_bench_worker.py, 2 ranks, gloo, CPU, 50 ms steps):
  steady           300 steps
  jittery          300 steps of 15..150 ms
  checkpoint       rank 0 alone saves (torch.save) every 10 steps, 30x a step
  eval             every 100 steps a no_grad eval pass, 20x a step
  hang_step        rank 1 stops inside step 150
  hang_checkpoint  rank 0's torch.save of step 150 never returns

ddprun runs the script unmodified (its bootstrap beats on optimizer steps,
forward passes and torch.save sections) with --ddprun-flags. ft_launcher runs
it with NVRx's documented instrumentation: "step" and "checkpoint" sections
of RankMonitorClient, timeouts calculated (calculate_and_set_section_timeouts)
after 40 steps, initial timeouts 600 s.

Per run: false hang (a healthy workload that the launcher ended, or that
reported a hang), detection latency (the first output line saying so minus
the moment the hang began, written by the worker) and end latency (the
launcher's exit minus that moment).

Usage: /usr/bin/python3 bench/freeze_bench.py --ddprun build/bin/ddprun
       --nvrx-venv VENV [--only ddprun|nvrx] [--workloads a,b] [--deadline 240]
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
WORKLOADS = ["steady", "jittery", "checkpoint", "eval", "hang_step", "hang_checkpoint"]
# What each launcher prints when it decides a rank is hung.
DETECTED = {
    "ddprun": re.compile(r"hang detected|freeze: rank|froze|hung", re.I),
    "nvrx": re.compile(r"has been open for .* Timeout is|out-of-section .* timeout|"
                       r"heartbeat timeout|hang detected", re.I),
}


def command(launcher, args):
    if launcher == "ddprun":
        # The interpreter comes from $PYTHON_EXEC (run()), as under torchrun.
        return [args.ddprun, "--nproc-per-node=2", "--max-restarts=0"] + args.ddprun_flags.split() + [
            WORKER]
    return [os.path.join(args.nvrx_venv, "bin", "ft_launcher"), "--standalone",
            "--nproc-per-node=2", "--max-restarts=0",
            "--ft-rank-section-timeouts=step:600,checkpoint:600",
            "--ft-rank-out-of-section-timeout=600", WORKER]


def run(launcher, workload, args):
    python = os.path.join(args.nvrx_venv, "bin", "python")
    with tempfile.TemporaryDirectory() as tmp:
        mark = os.path.join(tmp, "hang_began")
        env = dict(os.environ, FREEZE_WORKLOAD=workload, FREEZE_MARK=mark,
                   FREEZE_CLIENT="nvrx" if launcher == "nvrx" else "none")
        env["PATH"] = os.path.join(args.nvrx_venv, "bin") + ":" + env.get("PATH", "")
        env["PYTHON_EXEC"] = python
        start = time.time()
        proc = subprocess.Popen(command(launcher, args), env=env, cwd=tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        detected = []
        log = []

        def read():
            for line in proc.stdout:
                log.append(line)
                if not detected and DETECTED[launcher].search(line):
                    detected.append(time.time())

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
            with open(os.path.join(args.keep_logs, "%s_%s.log" % (launcher, workload)), "w") as f:
                f.writelines(log)
    hang = workload.startswith("hang")
    row = {"rc": rc, "wall": end - start}
    if hang:
        row["detect"] = detected[0] - began if detected and began else None
        row["end"] = end - began if began and rc != "timeout" else None
    else:
        row["false_hang"] = bool(detected) or rc != 0
    return row


def fmt(row, hang):
    if not hang:
        return "**false hang** (rc %s)" % row["rc"] if row["false_hang"] else "ok (%.0f s)" % row["wall"]
    if row["detect"] is None:
        return "not detected (rc %s)" % row["rc"]
    end = "%.1f s" % row["end"] if row["end"] is not None else "never"
    return "%.1f s (ended %s)" % (row["detect"], end)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ddprun", default=os.path.join(os.path.dirname(HERE), "build", "bin", "ddprun"))
    p.add_argument("--ddprun-flags", default="--hang-timeout-floor=2")
    p.add_argument("--nvrx-venv", required=True)
    p.add_argument("--only", choices=["ddprun", "nvrx"])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--deadline", type=float, default=240.0)
    p.add_argument("--keep-logs")
    args = p.parse_args()
    launchers = [args.only] if args.only else ["ddprun", "nvrx"]
    workloads = args.workloads.split(",")
    results = {}
    for w in workloads:
        for l in launchers:
            results[(l, w)] = run(l, w, args)
            print("%s %s: %s" % (l, w, results[(l, w)]), file=sys.stderr, flush=True)
    print("| workload | " + " | ".join(launchers) + " |")
    print("| --- |" + " --- |" * len(launchers))
    for w in workloads:
        cells = [fmt(results[(l, w)], w.startswith("hang")) for l in launchers]
        print("| %s | %s |" % (w, " | ".join(cells)))
    print("\nhang rows: detection latency (first line naming the hang minus the moment it "
          "began), in brackets the launcher's exit; %s, %s" % (
              time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.uname().nodename))


if __name__ == "__main__":
    sys.exit(main())

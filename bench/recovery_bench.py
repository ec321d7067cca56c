#!/usr/bin/python3
"""One rank dies in the middle of a step: how many steps are lost, and how
long until every rank steps again? Rank-scoped recovery against group
restarts (ddprun's, torchrun's), same workload, in one run.

The workload is `train` on the synthetic data (2 ranks, --backend gloo:
torchrun's workers get no shm, and one backend for all keeps the figures
comparable), a checkpoint every --checkpoint-every steps (100), rank
--kill-rank SIGKILLing itself in the middle of step K (after its first
gradient bucket's all-reduce started: the step is in flight). K is drawn
from --seed for each repetition and is the same for every launcher in it.

  failure → stepping: from the killed rank's last line (`--kill-at-step`,
      printed just before SIGKILL; spdlog's wall clock, ms) to rank 0's line
      for the first step it completes after the failure (--log-every 1).
  steps lost: committed steps before the failure (K-1) minus the step
      training went on from (the state a survivor gave, or the checkpoint's).
  checkpoints read: `resumed from` lines after the failure.

Launchers:
  ddprun --restart-scope=rank --standby-workers=1
                                 the same, the replacement a pre-started standby
                                 (model built, waiting on its channel)
  ddprun --restart-scope=rank    survivors keep their state (docs/RECOVERY.md)
  ddprun --restart-scope=group   today's default: everyone restarts from disk
  torchrun 1.13 (Debian's, bench/torchrun-1.13 --no_python), --max_restarts 1:
      `train` links Debian's LibTorch 1.13, whose TCPStore client cannot
      talk to torch 2.x's libuv store, so under torch 2.x's torchrun it
      never gets past the rendezvous. The Python example's recovery under
      torch 2.x is tests/examples (examples.rank_recovery).
  torchrun 2.x (.venv-torch's, --max-restarts 1) with --train2, the same
      `train` built against that torch's own LibTorch (build-cuda/bin/train,
      scripts/build-cuda.sh; on CPU here, --backend gloo), beside ddprun's
      rows with that binary: its TCPStore client is torch 2.x's.

Usage: /usr/bin/python3 bench/recovery_bench.py [--ddprun build/bin/ddprun]
         [--train build/bin/train] [--torchrun bench/torchrun-1.13]
         [--torchrun2 .venv-torch/bin/torchrun] [--train2 build-cuda/bin/train]
         [--reps 5] [--steps 400] [--seed 1]
Prints a Markdown table (medians over --reps) and one JSON line per run,
then, for the rank-scoped rows, where the time goes (medians, from train's
own lines): the failure to a survivor abandoning its step, to the
replacement's first line as a rank (the standby's `standby 1 is rank`, a
spawned replacement's first line), to the last rank's `generation 1
formed`, to the first step.
"""
import argparse
import datetime
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

LINE = re.compile(r"^(?:.*?)\[(\d\d):(\d\d):(\d\d)\.(\d{3})\] \[train rank (\d+)\] \[\w+\] (.*)$")


def seconds_of(m):
    h, mi, s, ms = (int(m.group(i)) for i in range(1, 5))
    return h * 3600 + mi * 60 + s + ms / 1000.0


def phases(out):
    """Milliseconds from the failure to: a survivor abandoning its step, the
    replacement's first line as a rank, the last `generation G formed`, the
    first step after it; None where a line is missing."""
    t_fail = t_abandon = t_replacement = t_formed = t_step = None
    victim = None
    for raw in out.splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        rank, text, t = int(m.group(5)), m.group(6), seconds_of(m)
        if t_fail is None:
            if "--kill-at-step" in text:
                t_fail, victim = t, rank
            continue
        if t_abandon is None and "abandoned in generation" in text:
            t_abandon = t
        elif t_replacement is None and rank == victim and "abandoned" not in text:
            t_replacement = t  # the standby's "is rank", or a spawned one's first line
        elif re.search(r"generation \d+ formed; state from rank", text):
            t_formed = t
        elif rank == 0 and t_formed is not None and t_step is None and re.match(r"step \d+/", text):
            t_step = t
    if t_fail is None:
        return None
    ms = lambda t: None if t is None else round((t - t_fail) * 1000 if t >= t_fail
                                                 else (t + 86400 - t_fail) * 1000)
    return {"abandoned": ms(t_abandon), "replacement": ms(t_replacement),
            "formed": ms(t_formed), "stepping": ms(t_step)}


def parse(out, kill_step):
    """(failure → stepping in s, steps lost, checkpoints read after the failure).

    After the failure line, training goes on once a recovery line appeared
    (`resuming from ... (step C` of a group restart, or `generation G formed;
    ... at step K` of a rank-scoped one); the first step rank 0 completes
    after that is the moment every rank steps again (a step is an
    all-reduce: no rank completes one alone). Step lines between the
    failure and the recovery line are rank 0's last steps before it noticed.
    """
    t_fail = None
    went_on_from = None
    first_after = None
    reads = 0
    for raw in out.splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        rank, text = int(m.group(5)), m.group(6)
        t = seconds_of(m)
        if t_fail is None:
            if "--kill-at-step" in text:
                t_fail = t
            continue
        r = re.search(r"resuming from .*\(step (\d+)", text)
        if r:
            reads += 1
            went_on_from = int(r.group(1)) if went_on_from is None else went_on_from
            continue
        g = re.search(r"generation \d+ formed; state from rank \d+ at step (\d+)", text)
        if g:
            went_on_from = int(g.group(1)) if went_on_from is None else went_on_from
            continue
        s = re.match(r"step (\d+)/\d+ ", text)
        if rank == 0 and s and went_on_from is not None and first_after is None:
            first_after = t
    if t_fail is None or first_after is None:
        raise RuntimeError("no failure line, recovery line or step after it:\n" + out[-3000:])
    if first_after < t_fail:  # past midnight
        first_after += 86400
    lost = max(0, (kill_step - 1) - went_on_from)
    return first_after - t_fail, lost, reads


def run(cmd, env, timeout=300):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build/bin/ddprun"))
    ap.add_argument("--train", default=os.path.join(ROOT, "build/bin/train"))
    ap.add_argument("--torchrun", default=os.path.join(HERE, "torchrun-1.13"))
    ap.add_argument("--torchrun2", default=os.path.join(ROOT, ".venv-torch/bin/torchrun"))
    ap.add_argument("--train2", default=os.path.join(ROOT, "build-cuda/bin/train"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # (row, how it is launched, the train binary)
    launchers = [("ddprun --restart-scope=rank --standby-workers=1", "standby", a.train),
                 ("ddprun --restart-scope=rank", "rank", a.train),
                 ("ddprun --restart-scope=group", "group", a.train)]
    if os.access(a.torchrun, os.X_OK):
        launchers.append(("torchrun 1.13", "torchrun", a.train))
    if os.access(a.torchrun2, os.X_OK) and os.access(a.train2, os.X_OK):
        two = " (train on LibTorch 2.x)"
        launchers += [("ddprun --restart-scope=rank --standby-workers=1" + two, "standby", a.train2),
                      ("ddprun --restart-scope=group" + two, "group", a.train2),
                      ("torchrun 2.x" + two, "torchrun2", a.train2)]
    results = {name: [] for name, _, _ in launchers}
    breakdown = {name: [] for name, kind, _ in launchers if kind in ("standby", "rank")}
    for rep in range(a.reps):
        # Past the first checkpoint, away from the next: the group restarts
        # lose what they lose in the field on average (about half a period).
        k = rng.randint(a.checkpoint_every + 5, a.steps - 5)
        for name, kind, train_bin in launchers:
            with tempfile.TemporaryDirectory(prefix="recovery_bench.") as tmp:
                train = [train_bin, "--synthetic", "--backend", "gloo", "--steps", str(a.steps),
                         "--log-every", "1", "--checkpoint-every", str(a.checkpoint_every),
                         "--checkpoint-dir", os.path.join(tmp, "ckpt"), "--kill-at-step",
                         str(k), "--kill-rank", str(a.kill_rank)]
                env = dict(os.environ)
                if kind == "torchrun":
                    cmd = [a.torchrun, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                           "--monitor_interval=0.1", "--no_python"] + train
                    env["PATH"] = "/usr/bin:" + env.get("PATH", "")  # Debian's python3, torch 1.13
                elif kind == "torchrun2":
                    cmd = [a.torchrun2, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
                           "--monitor-interval=0.1", "--no-python"] + train
                elif kind == "standby":
                    cmd = [a.ddprun, "--nproc-per-node=2", "--max-restarts=1",
                           "--restart-scope=rank", "--standby-workers=1"] + train
                else:
                    cmd = [a.ddprun, "--nproc-per-node=2", "--max-restarts=1",
                           f"--restart-scope={kind}"] + train
                out = run(cmd, env)
                secs, lost, reads = parse(out, k)
                results[name].append((secs, lost, reads))
                ph = phases(out) if name in breakdown else None
                if ph:
                    breakdown[name].append(ph)
                print(json.dumps({"launcher": name, "rep": rep, "kill_step": k,
                                  "failure_to_stepping_s": round(secs, 4), "steps_lost": lost,
                                  "checkpoints_read": reads, "phases_ms": ph}),
                      file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    print(f"\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} cores, load {load:.1f}, {a.reps} reps, 2 ranks gloo, "
          f"{a.steps} steps, checkpoint every {a.checkpoint_every}\n")
    print("| launcher | failure → all ranks stepping (median) | steps lost (median, max) "
          "| checkpoints read |")
    print("|---|---|---|---|")
    for name, _, _ in launchers:
        rows = results[name]
        secs = statistics.median(r[0] for r in rows)
        lost = [r[1] for r in rows]
        print(f"| {name} | {secs * 1000:.0f} ms | {statistics.median(lost):.0f}, {max(lost)} "
              f"| {sum(r[2] for r in rows)} |")
    print("\nWhere the time goes (ms after the failure, medians):\n")
    print("| launcher | survivor abandons its step | replacement's first line as a rank "
          "| last rank formed the generation | first step |")
    print("|---|---|---|---|---|")
    for name, rows in breakdown.items():
        def med(key):
            vals = [r[key] for r in rows if r[key] is not None]
            return f"{statistics.median(vals):.0f}" if vals else "-"
        print(f"| {name} | {med('abandoned')} | {med('replacement')} | {med('formed')} "
              f"| {med('stepping')} |")


if __name__ == "__main__":
    main()

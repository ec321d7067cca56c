"""examples/rank_recovery.py under the build tree's ddprun with
--restart-scope=rank, 2 CPU/gloo ranks, torch 2.x (ctest examples.rank_recovery).

    rank_recovery_test.py <ddprun> <examples folder> <python folder> <venv python> <work>

Runs the example four times: uninterrupted, then with rank 1 SIGKILLing
itself at step 10, rank 0 at step 25 (--kill-rank/--kill-step, in
generation 0 only), and rank 1 hanging at step 30 (--hang: asleep before the
all_reduce, found by ddprun's watchdog, --hang-timeout-floor=3), then rank 1
killed at step 10 with a pre-started standby (--standby-workers=1) taking its
slot; last, rank 1 failing at step 10 with an error of its own (--raise),
which must end it with that error, not be taken for a peer failure. Each failed run must recover without a group restart
(ddprun says generation 1 formed; every rank ends in generation 1, the
replacement joined at the step in flight) and end with final parameters
bit-identical to the uninterrupted run's. The driver is Debian's
/usr/bin/python3, stdlib only; the workers run the venv's python (exit 77,
skipped, without it). Every run has a deadline.
"""
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
STEPS = 40
DEADLINE_S = 300


def run(ddprun, examples, py, work, name, extra, flags=()):
    out_file = os.path.join(work, name + ".params")
    log_dir = os.path.join(work, name)
    shutil.rmtree(log_dir, ignore_errors=True)  # a rerun's: one run's events.jsonl
    argv = [ddprun, "--restart-scope=rank", "--max-restarts=1", "--nproc-per-node=2",
            "--log-dir=" + log_dir, "--rdzv-id=" + name, *flags,
            os.path.join(examples, "rank_recovery.py"), "--steps", str(STEPS), "--out", out_file,
            *extra]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S,
                           env=dict(os.environ, DDPRUN_PYTHON=py), cwd=work)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"FAILED: {name} still running after {DEADLINE_S} s")
    print(f"--- {name}: exit {r.returncode}", r.stdout[-3000:], r.stderr[-3000:], sep="\n")
    if r.returncode != 0:
        raise SystemExit(f"FAILED: {name}: ddprun exited {r.returncode}")
    with open(out_file, "rb") as f:
        return r.stdout, r.stderr, f.read()


def standby_problems(out, log_dir, victim):
    """The standby, not a spawned process, became `victim`: its own line, and
    events.jsonl's one rank_assigned (the standby's pid) and no rank_replaced."""
    problems = []
    if f"standby 1 is rank {victim}, generation 1" not in out:
        problems.append(f"the standby did not become rank {victim} in generation 1")
    events = []
    for folder, _, files in os.walk(log_dir):  # <log dir>/<run id>/
        if "events.jsonl" in files:
            with open(os.path.join(folder, "events.jsonl")) as f:
                events += [json.loads(line) for line in f if line.strip()]
    assigned = [e for e in events if e.get("event") == "rank_assigned"]
    if len(assigned) != 1 or assigned[0].get("ranks") != [victim]:
        problems.append(f"events.jsonl: {len(assigned)} rank_assigned for rank {victim}, expected 1")
    if any(e.get("event") == "rank_replaced" for e in events):
        problems.append("a replacement was spawned although a standby was there")
    return problems


def main():
    ddprun, examples, python_dir, py, work = sys.argv[1:6]
    if not os.access(py, os.X_OK) or subprocess.run([py, "-c", "import torch"],
                                                     capture_output=True, timeout=300).returncode:
        print(f"SKIP: {py} cannot `import torch` (scripts/setup-torch.sh)")
        return SKIP
    os.makedirs(work, exist_ok=True)
    os.environ["PYTHONPATH"] = python_dir  # `from ddprun import recovery` from pkg/python
    done = rf"rank (\d) done {STEPS} steps, generation (\d), parameters identical on 2 ranks: True"
    out, _, reference = run(ddprun, examples, py, work, "uninterrupted", [])
    if sorted(re.findall(done, out)) != [("0", "0"), ("1", "0")]:
        raise SystemExit("FAILED: the uninterrupted run did not end in generation 0 on 2 ranks")
    # (victim, step, hang, standby): a hang is found by the default (learned)
    # detector, its floor lowered from 60 s; the replacement's setup keeps
    # the survivors' deadlines waiting. With a standby (--standby-workers=1,
    # ddprun_recovery.wait_assigned) the slot goes to the pre-started process.
    cases = ((1, 10, False, False), (0, 25, False, False), (1, 30, True, False),
             (1, 10, False, True))
    for victim, step, hang, standby in cases:
        name = ("standby_" if standby else "") + \
            f"{'hang' if hang else 'kill'}_rank{victim}_step{step}"
        out, err, params = run(ddprun, examples, py, work, name,
                               ["--kill-rank", str(victim), "--kill-step", str(step)] +
                               (["--hang"] if hang else []),
                               (["--hang-timeout-floor=3"] if hang else []) +
                               (["--standby-workers=1"] if standby else []))
        problems = []
        if sorted(re.findall(done, out)) != [("0", "1"), ("1", "1")]:
            problems.append("not every rank ended in generation 1")
        if f"rank {victim} replacement joined generation 1 at step {step}" not in out:
            problems.append(f"no replacement of rank {victim} joined at step {step}")
        if hang and f"rank {victim} (local rank {victim}, " not in err:
            problems.append(f"ddprun did not blame rank {victim}'s hang")
        if "generation 1 formed" not in err:
            problems.append("ddprun did not say generation 1 formed")
        if "gives up" in err:
            problems.append("ddprun fell back to a group restart")
        if standby:
            problems += standby_problems(out, os.path.join(work, name), victim)
        if params != reference:
            problems.append("final parameters differ from the uninterrupted run's")
        if problems:
            raise SystemExit(f"FAILED: {name}: " + "; ".join(problems))
        print(f"ok: {name}: recovered in place, parameters bit-identical")
    # An error of the rank's own (--raise) is no peer failure: the rank must
    # not wait to recover from it, but end with it, and ddprun replaces it.
    name = "raise_rank1_step10"
    out, err, params = run(ddprun, examples, py, work, name,
                           ["--kill-rank", "1", "--kill-step", "10", "--raise"])
    problems = []
    if "--raise: rank 1 fails on its own at step 10" not in out + err:
        problems.append("rank 1's own error is not in the output")
    if "rank 1 abandoned step" in out:
        problems.append("rank 1 took its own error for a peer failure")
    if "rank 1 replacement joined generation 1 at step 10" not in out:
        problems.append("no replacement of rank 1 joined at step 10")
    if params != reference:
        problems.append("final parameters differ from the uninterrupted run's")
    if problems:
        raise SystemExit(f"FAILED: {name}: " + "; ".join(problems))
    print(f"ok: {name}: the rank ended with its own error and was replaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())

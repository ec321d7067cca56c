#!/usr/bin/env python3
"""What ddprun's automatic-beat bootstrap costs a user's model, against
torchrun: bench/freeze_tax_worker.py (an unmodified 2-rank gloo DDP script)
under each launcher, interleaved round by round so drift hits both alike.

    python3 bench/freeze_tax_bench.py [--rounds 8] [--iters 300] [--ddprun build/bin/ddprun]
        [--torch-venv .venv-torch]

Prints, per model (deep: 200 modules; wide: large kernels), the median over
rounds of each launcher's median step and forward-only times, the ratio
ddprun/torchrun, and the noise: the spread (max/min) of torchrun's own
rounds. Wall clock and the main thread's CPU time, both.

Then, per model, --ab-runs runs under ddprun alone in which the worker
alternates blocks of passes with the bootstrap's hooks and without (it
takes them out and puts them back: bench/freeze_tax_worker.py --ab-blocks):
the hooks' cost measured in one process, free of the noise between runs
that a 2-core VM puts on the launcher comparison. Interpreter: the torch
2.x venv's python runs the workers under both.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


MEASURES = ("step", "forward", "step_cpu", "forward_cpu")


def result_fields(cmd, env, key):
    """The words of rank 0's result line, from `key` on (after ddprun's
    "[default0]:" prefix); exits naming the command when there is none."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        at = line.find(key + " ")
        if at >= 0:
            return line[at:].split()
    sys.exit(f"{cmd[0]} failed (exit {out.returncode}): {out.stderr[-2000:]}")


def run(cmd, env):
    f = result_fields(cmd, env, "step_ms")
    return [float(f[i]) for i in (1, 3, 5, 7)]


def run_ab(cmd, env):
    """One in-process A/B run: {measure: value} from the worker's ab_ line."""
    f = result_fields(cmd, env, "ab_hooks")
    return {f[i]: (f[i + 1] if f[i].endswith("quartiles") else float(f[i + 1]))
            for i in range(0, len(f), 2)}


def report(model, got):
    for i, what in enumerate(MEASURES):
        d = statistics.median(r[i] for r in got["ddprun"])
        t = statistics.median(r[i] for r in got["torchrun"])
        # Each round ran both launchers back to back: the ratio within a
        # round cancels the drift between rounds, and its quartiles are the
        # run's noise on the ratio itself.
        paired = [a[i] / b[i] for a, b in zip(got["ddprun"], got["torchrun"])]
        q = statistics.quantiles(paired, n=4)
        own = [r[i] for r in got["torchrun"]]
        print(f"{model:5s} {what:12s} ddprun {d:8.3f} ms  torchrun {t:8.3f} ms  "
              f"ratio {d / t:.3f}  paired {statistics.median(paired):.3f} "
              f"(quartiles {q[0]:.3f}-{q[2]:.3f})  torchrun's own spread "
              f"{max(own) / min(own):.3f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--ddprun", default=os.path.join(ROOT, "build/bin/ddprun"))
    p.add_argument("--torch-venv", default=os.path.join(ROOT, ".venv-torch"))
    p.add_argument("--ab-runs", type=int, default=3,
                   help="runs under ddprun of the in-process A/B (hooks on/off) per model")
    p.add_argument("--ab-blocks", type=int, default=30)
    a = p.parse_args()
    py = os.path.join(a.torch_venv, "bin/python")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=py)
    worker = os.path.join(HERE, "freeze_tax_worker.py")
    launchers = {
        "ddprun": lambda m: [a.ddprun, "--nproc-per-node=2", py, worker,
                             "--model", m, "--iters", str(a.iters)],
        "torchrun": lambda m: [py, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", worker, "--model", m,
                               "--iters", str(a.iters)],
    }
    for model in ("deep", "wide"):
        got = {k: [] for k in launchers}
        for _ in range(a.rounds):
            for name, cmd in launchers.items():
                got[name].append(run(cmd(model), env))
        report(model, got)
        ab = [run_ab([a.ddprun, "--nproc-per-node=2", py, worker, "--model", model,
                      "--ab-blocks", str(a.ab_blocks)], env) for _ in range(a.ab_runs)]
        for key in ("step", "forward", "optimizer_step"):
            ratios = [r[f"{key}_ratio"] for r in ab]
            added = [r[f"{key}_added_us"] for r in ab]
            print(f"{model:5s} A/B {key:15s} hooks on/off {statistics.median(ratios):.4f} "
                  f"(runs {' '.join(f'{x:.4f}' for x in ratios)}), added "
                  f"{statistics.median(added):+.2f} us (quartiles of one run's pairs: "
                  f"{ab[0][key + '_quartiles']})", flush=True)


if __name__ == "__main__":
    main()

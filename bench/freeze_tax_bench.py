#!/usr/bin/env python3
"""What ddprun's automatic-beat bootstrap costs a user's model, against
torchrun: bench/freeze_tax_worker.py (an unmodified 2-rank gloo DDP script)
under each launcher, interleaved round by round so drift hits both alike.

    python3 bench/freeze_tax_bench.py [--rounds 8] [--ddprun build/bin/ddprun]
        [--torch-venv .venv-torch]

Prints, per model (deep: 200 modules; wide: large kernels), the median over
rounds of each launcher's median step and forward-only times, the ratio
ddprun/torchrun, and the noise: the spread (max/min) of torchrun's own
rounds. Interpreter: the torch 2.x venv's python runs the workers under both.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        at = line.find("step_ms ")  # after ddprun's "[default0]:" prefix
        if at >= 0:
            f = line[at:].split()
            return float(f[1]), float(f[3])
    sys.exit(f"{cmd[0]} failed (exit {out.returncode}): {out.stderr[-2000:]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--ddprun", default=os.path.join(ROOT, "build/bin/ddprun"))
    p.add_argument("--torch-venv", default=os.path.join(ROOT, ".venv-torch"))
    a = p.parse_args()
    py = os.path.join(a.torch_venv, "bin/python")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=py)
    worker = os.path.join(HERE, "freeze_tax_worker.py")
    launchers = {
        "ddprun": lambda m: [a.ddprun, "--nproc-per-node=2", py, worker,
                             "--model", m],
        "torchrun": lambda m: [py, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", worker, "--model", m],
    }
    for model in ("deep", "wide"):
        got = {k: [] for k in launchers}
        for _ in range(a.rounds):
            for name, cmd in launchers.items():
                got[name].append(run(cmd(model), env))
        med = {k: [statistics.median(r[i] for r in v) for i in (0, 1)] for k, v in got.items()}
        for i, what in enumerate(("step", "forward")):
            t = [r[i] for r in got["torchrun"]]
            print(f"{model:5s} {what:8s} ddprun {med['ddprun'][i]:.3f} ms  torchrun "
                  f"{med['torchrun'][i]:.3f} ms  ratio {med['ddprun'][i] / med['torchrun'][i]:.3f}"
                  f"  (torchrun's rounds spread {max(t) / min(t):.3f})", flush=True)


if __name__ == "__main__":
    main()

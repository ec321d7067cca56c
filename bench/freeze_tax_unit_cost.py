"""The bootstrap's work per call, measured one call at a time under ddprun:
what a hooked module call costs over an unhooked one (ddprun's forward hook
and the slow path of Module._call_impl it takes), and what the optimizer
step hook costs (its beat: one datagram). Each figure is the main thread's
CPU time, the best of 5 runs of 50,000 calls; the bound on a model's pass is
then a sum (2 hooked modules a pass: DDP's wrapper and the module inside),
free of the noise that comparing two launchers' runs carries.

    ddprun --nproc-per-node=1 .venv-torch/bin/python bench/freeze_tax_unit_cost.py
"""
import time

import torch
import ddprun_autobeat  # put on the path by ddprun's bootstrap

torch.set_num_threads(1)
N = 50000


def best_us(fn):
    runs = []
    for _ in range(5):
        c = time.thread_time_ns()
        for _ in range(N):
            fn()
        runs.append((time.thread_time_ns() - c) / N / 1e3)
    return min(runs)


m = torch.nn.Identity()
x = torch.zeros(1)
plain = best_us(lambda: m(x))
handle = m.register_forward_hook(ddprun_autobeat._on_forward)
hooked = best_us(lambda: m(x))
handle.remove()
plain = min(plain, best_us(lambda: m(x)))
step_hook = best_us(ddprun_autobeat._on_step)
print(f"hooked_module_call_us {hooked - plain:.3f} step_hook_us {step_hook:.3f}", flush=True)

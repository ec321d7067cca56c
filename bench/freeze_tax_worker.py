"""An unmodified DDP script (gloo, CPU) timing its own training steps and
forward-only passes; run by bench/freeze_tax_bench.py under ddprun and under
torchrun. Each pass is timed twice: wall clock, and the main thread's CPU
time (CLOCK_THREAD_CPUTIME_ID), which a busy machine's preemption does not
inflate: what the bootstrap adds is Python run on this thread, so its CPU
time shows it with far less noise than the wall clock on a shared 2-core VM. --model deep: 100 Linear(64, 64)+ReLU pairs (200 modules, small
kernels: per-module-call overhead shows); --model wide: 4 Linear(1024, 1024)
(large kernels). Rank 0 prints one line: step_ms MS forward_ms MS step_cpu_ms MS
forward_cpu_ms MS, each the median of --iters timed repetitions after a
warm-up.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("deep", "wide"), default="deep")
p.add_argument("--iters", type=int, default=300)
p.add_argument("--ab-blocks", type=int, default=0,
               help="instead: alternate blocks of passes with ddprun's hooks and without, "
                    "in this one process (under ddprun), and print their ratio")
args = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
if args.model == "deep":
    layers = []
    for _ in range(100):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    width, batch = 64, 32
else:
    layers = [torch.nn.Linear(1024, 1024) for _ in range(4)]
    width, batch = 1024, 64
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
model.train()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(batch, width)


def step():
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


def forward():
    with torch.no_grad():
        model(x)


def median_ms(fn):
    for _ in range(20):
        fn()
    wall, cpu = [], []
    for _ in range(args.iters):
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        cpu.append((time.thread_time_ns() - c) / 1e6)
        wall.append((time.perf_counter_ns() - t) / 1e6)
    return statistics.median(wall), statistics.median(cpu)


def ddprun_hooks():
    """The hooks ddprun's bootstrap put in this process: forward hooks on the
    model's modules and the optimizers' global step hooks whose function is
    ddprun_autobeat's. Each entry: (dict, key, hook), to take out and put back."""
    found = []
    dicts = []
    for m in model.modules():
        dicts += [m._forward_hooks, m._forward_pre_hooks]
    import torch.optim.optimizer as optimizer_module
    for name in ("_global_optimizer_post_hooks", "_global_optimizer_pre_hooks"):
        dicts.append(getattr(optimizer_module, name, {}))
    for d in dicts:
        for k, h in list(d.items()):
            if getattr(h, "__module__", "") == "ddprun_autobeat":
                found.append((d, k, h))
    return found


def ab(fn, blocks, per_block=50):
    """Median pass time with ddprun's hooks over the median without, blocks
    alternated in this process so drift and the machine's load hit both."""
    hooks = ddprun_hooks()
    on, off = [], []
    for b in range(2 * blocks):
        with_hooks = b % 2 == 0
        for d, k, h in hooks:
            if with_hooks:
                d[k] = h
            else:
                d.pop(k, None)
        for _ in range(5):
            fn()
        cpu = []
        for _ in range(per_block):
            c = time.thread_time_ns()
            fn()
            cpu.append(time.thread_time_ns() - c)
        (on if with_hooks else off).append(statistics.median(cpu))
    for d, k, h in hooks:
        d[k] = h
    pairs = sorted(a / b for a, b in zip(on, off))
    added_us = (statistics.median(on) - statistics.median(off)) / 1e3
    return len(hooks), statistics.median(on) / statistics.median(off), pairs, added_us


if args.ab_blocks:
    # The step's own noise (the other rank, the all-reduce) is far larger
    # than a hook call, so the step's share is also measured in its parts:
    # the forward pass (the forward hooks) and optimizer.step() alone (the
    # step hook), where the hooks run.
    results = {}
    for name, fn in (("step", step), ("forward", forward), ("optimizer_step", opt.step)):
        results[name] = ab(fn, args.ab_blocks)
        dist.barrier()
    if dist.get_rank() == 0:
        q = lambda v: f"{v[len(v) // 4]:.4f}-{v[3 * len(v) // 4]:.4f}"
        print(f"ab_hooks {results['step'][0]} " + " ".join(
            f"{k}_ratio {r[1]:.4f} {k}_quartiles {q(r[2])} {k}_added_us {r[3]:.2f}"
            for k, r in results.items()), flush=True)
    dist.destroy_process_group()
    raise SystemExit(0)

s, s_cpu = median_ms(step)
dist.barrier()
f, f_cpu = median_ms(forward)
if dist.get_rank() == 0:
    print(f"step_ms {s:.4f} forward_ms {f:.4f} step_cpu_ms {s_cpu:.4f} forward_cpu_ms {f_cpu:.4f}",
          flush=True)
dist.destroy_process_group()

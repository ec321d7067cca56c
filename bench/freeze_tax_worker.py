"""An unmodified DDP script (gloo, CPU) timing its own training steps and
forward-only passes; run by bench/freeze_tax_bench.py under ddprun and under
torchrun. --model deep: 100 Linear(64, 64)+ReLU pairs (200 modules, small
kernels: per-module-call overhead shows); --model wide: 4 Linear(1024, 1024)
(large kernels). Rank 0 prints one line: step_ms FWD_MS forward_ms FWD_MS,
each the median of --iters timed repetitions after a warm-up.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("deep", "wide"), default="deep")
p.add_argument("--iters", type=int, default=300)
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
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


s = median_ms(step)
dist.barrier()
f = median_ms(forward)
if dist.get_rank() == 0:
    print(f"step_ms {s:.4f} forward_ms {f:.4f}", flush=True)
dist.destroy_process_group()

"""A plain torch DDP script that checkpoints and resumes, as users write them
(init_process_group("gloo") from torchrun's environment, rank 0 saving with
torch.save every --every steps, every rank resuming from the newest).

Every rank trains on the same fixed batch, so the averaged gradient, and
with it the result, does not depend on how many ranks there are: a job that
lost a node and resumed with fewer ranks ends where one process training
alone ends (--reference). Prints "final <sum of parameters>".

    ddp_resume.py CKPT_DIR [--steps N] [--every K] [--step-ms MS] [--reference]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 10, generator=g), torch.randn(32, 5, generator=g)


def newest(folder):
    steps = [int(n[5:-3]) for n in os.listdir(folder) if n.startswith("step-") and n.endswith(".pt")]
    return max(steps, default=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--step-ms", type=int, default=20)
    ap.add_argument("--reference", action="store_true")
    a = ap.parse_args()
    model, opt = model_and_opt()
    x, y = batch()
    if a.reference:
        for _ in range(a.steps):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        print(f"final {sum(p.sum().item() for p in model.parameters()):.6f}", flush=True)
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    start = newest(a.ckpt)
    if start:
        state = torch.load(os.path.join(a.ckpt, f"step-{start:08d}.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        print(f"rank {rank}/{dist.get_world_size()} resuming at step {start}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)
    for step in range(start + 1, a.steps + 1):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if rank == 0 and step % a.every == 0:
            tmp = os.path.join(a.ckpt, f"tmp-{os.getpid()}.pt")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp)
            os.replace(tmp, os.path.join(a.ckpt, f"step-{step:08d}.pt"))
        time.sleep(a.step_ms / 1000)
    if rank == 0:
        print(f"final {sum(p.sum().item() for p in model.parameters()):.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

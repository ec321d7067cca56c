#!/usr/bin/env python3
"""Reference data-parallel training in stock PyTorch (torch.nn.parallel.DDP).

The yardstick for `train` (trainer/): the same task, models, batch and flags,
written the way most users train today. Any torchrun-compatible launcher
starts it, e.g.

    torchrun --standalone --nproc_per_node=2 bench/ddp_reference.py --steps 300
    build/bin/ddprun --nproc-per-node=2 bench/ddp_reference.py --model cnn

It runs on whichever interpreter starts it: Debian's /usr/bin/python3 (torch
1.13) or the torch 2.x venv of scripts/setup-torch.sh. Models (as train's
--model): mlp, 784-HIDDEN-HIDDEN-10 with ReLU; cnn, conv 1->16 5x5 pad 2,
ReLU, max-pool 2, conv 16->32 5x5 pad 2, ReLU, max-pool 2, linear 1568-HIDDEN,
ReLU, linear HIDDEN-10. --lr-scale linear multiplies --lr by the world size.
Backend: --backend auto is nccl when CUDA is present, else gloo. Data: the
digits set in data/digits (idx format), or random inputs with --synthetic.
One line a rank at the end, the same as train's:
    rank 0 steps 300 samples_per_s 12345.6 final_loss 0.1234 test_acc 0.9500
"""
import argparse
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load_idx(prefix):
    with open(prefix + "-images-idx3-ubyte", "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 2051:
            sys.exit(f"{prefix}-images-idx3-ubyte: bad magic {magic}")
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(n, rows * cols)
    with open(prefix + "-labels-idx1-ubyte", "rb") as f:
        magic, n2 = struct.unpack(">II", f.read(8))
        if magic != 2049 or n2 != n:
            sys.exit(f"{prefix}-labels-idx1-ubyte: bad magic {magic} or count {n2} != {n}")
        y = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    # Same arithmetic as train: x / 255.0 in float64, then float32.
    return (x.double() / 255.0).float(), y.long()


def make_model(name, hidden):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                         nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-scale", choices=["none", "linear"], default="none")
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--data", default=os.path.join(HERE, "..", "data", "digits"))
    p.add_argument("--synthetic", action="store_true")
    a = p.parse_args()

    backend = a.backend if a.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and not torch.cuda.is_available():
        sys.exit("ddp_reference: --backend nccl: no CUDA device")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = backend == "nccl"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(a.seed)

    if a.synthetic:
        x, y = torch.randn(4096, 784), torch.randint(0, 10, (4096,))
        xt, yt = x[:512], y[:512]
    else:
        x, y = load_idx(os.path.join(a.data, "train"))
        xt, yt = load_idx(os.path.join(a.data, "t10k"))
    x, y = x.to(dev), y.to(dev)

    model = make_model(a.model, a.hidden).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    lr = a.lr * (world if a.lr_scale == "linear" else 1)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=a.momentum)

    g = torch.Generator().manual_seed(a.seed + 1)
    loss = torch.tensor(float("nan"))
    warmup = min(10, a.steps)
    t0 = time.perf_counter()
    for step in range(a.steps):
        if step == warmup:  # leave warm-up out of the rate
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        perm = torch.randperm(len(y), generator=g)[: a.batch * world]
        idx = perm[rank * a.batch:(rank + 1) * a.batch].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    timed = a.steps - warmup
    rate = timed * a.batch * world / dt if timed > 0 and dt > 0 else 0.0
    with torch.no_grad():
        acc = (model(xt.to(dev)).argmax(1).cpu() == yt).float().mean().item()
    print(f"rank {rank} steps {a.steps} samples_per_s {rate:.1f} "
          f"final_loss {loss.item():.4f} test_acc {acc:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

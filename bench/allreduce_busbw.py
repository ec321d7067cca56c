#!/usr/bin/env python3
"""All-reduce bus bandwidth per bucket size on NCCL (nccl-tests' definition:
busbw = bytes / time x 2(n-1)/n), through torch.distributed on the same NCCL
library `train` links. Run under a launcher on a GPU machine:

    .venv-torch/bin/torchrun --standalone --nproc-per-node=2 bench/allreduce_busbw.py
"""
import os
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    for mib in (1, 4, 16, 25, 64, 256):
        t = torch.ones(mib * (1 << 20) // 4, device="cuda")
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / reps
        busbw = t.numel() * 4 / dt * 2 * (world - 1) / world / 1e9
        if rank == 0:
            print(f"allreduce {mib:4d} MiB  {dt * 1e3:8.3f} ms  busbw {busbw:7.2f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

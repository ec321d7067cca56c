#!/usr/bin/python3
"""The smallest useful ddprun worker: join the process group through env://
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE come from ddprun, exactly as
from torchrun), all-reduce one number, print it.

    build/bin/ddprun --nproc-per-node=2 examples/hello_ddp.py

A script ending in .py runs as `python3 -u`; set DDPRUN_PYTHON to choose the
interpreter (e.g. DDPRUN_PYTHON=/usr/bin/python3 for Debian's python3-torch).
"""
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")  # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"rank {rank}/{world} (local {os.environ['LOCAL_RANK']}, restart {restart}): "
          f"sum of 1..{world} = {int(t.item())}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Joins the job's process group through env:// with gloo, all-reduces the
ranks and prints the sum and MASTER_PORT: proof that an unmodified PyTorch
worker runs under ddprun."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {int(t.item())} port {os.environ['MASTER_PORT']}")
dist.destroy_process_group()

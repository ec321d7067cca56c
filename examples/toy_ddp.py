"""PyTorch's ToyModel (Linear 10-10, ReLU, Linear 10-5) under DDP on gloo,
beating through the wheel's `ddprun` package (docs/GETTING_STARTED.md).

    pip install dist/ddprun-*.whl          # where torch 2.x lives
    ddprun --nproc-per-node=2 examples/toy_ddp.py ok

CI runs both modes with the wheel's ddprun (tests/install/wheel_test.py).
Modes (argv[1]):

  ok     40 steps, a checkpoint section at step 20 on rank 0, exit 0
  hang   rank 1 stops at step 10 (alive, asleep); rank 0 then waits in
         the next step's all-reduce: ddprun must detect it
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import ddprun
import ddprun_heartbeat  # the old name still works, and is the same module

assert ddprun.beat is ddprun_heartbeat.beat


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(ToyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        if mode == "hang" and rank == 1 and step == 10:
            time.sleep(3600)  # ddprun ends it
        opt.zero_grad()
        model(torch.randn(20, 10)).sum().backward()
        opt.step()
        ddprun.beat(step)
        if step == 20 and rank == 0:
            with ddprun.section("checkpoint"):
                torch.save(model.state_dict(), os.devnull)
    dist.barrier()
    print(f"rank {rank} done torch {torch.__version__} ddprun {ddprun.__version__}", flush=True)
    dist.destroy_process_group()
    # torch 2.x: DDP's gloo worker threads outlive destroy_process_group(),
    # and one freeing tensors while the interpreter finalizes aborts a run
    # that succeeded (pytorch/pytorch #179291; examples/from_horovod.py).
    # Nothing is left to finalize: end now, the output flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

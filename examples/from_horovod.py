"""A Horovod training loop moved to DDP under ddprun, line by line
(docs/GETTING_STARTED.md, "From Horovod": the table maps each call).

    horovodrun -np 2 python train.py        # before
    ddprun --nproc-per-node=2 examples/from_horovod.py   # after

Each `hvd.` call it replaces is in the comment beside it. CPU/gloo unless
CUDA is there. CI runs it (tests/examples, examples.from_horovod) and it
exits 1 unless every rank ends with the same parameters.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # hvd.init()
    rank = int(os.environ["RANK"])                        # hvd.rank()
    world = int(os.environ["WORLD_SIZE"])                 # hvd.size()
    local_rank = int(os.environ["LOCAL_RANK"])            # hvd.local_rank()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)                     # torch.cuda.set_device(hvd.local_rank())

    torch.manual_seed(rank)  # deliberately different initial weights per rank ...
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)).to(device)
    # ... which DDP replaces by rank 0's when it is built:
    # hvd.broadcast_parameters(model.state_dict(), root_rank=0) is not needed.
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    # hvd.DistributedOptimizer(opt, named_parameters=...): a plain optimizer,
    # DDP all-reduces the gradients during backward(). lr scaled by the world size.
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * world, momentum=0.9)
    # hvd.broadcast_optimizer_state(opt, root_rank=0), for a resumed run:
    state = [opt.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(state, src=0)
    opt.load_state_dict(state[0])

    g = torch.Generator().manual_seed(0)  # the same data set on every rank; the sampler shards it
    data = TensorDataset(torch.randn(256, 10, generator=g), torch.randn(256, 5, generator=g))
    sampler = DistributedSampler(data)  # num_replicas=hvd.size(), rank=hvd.rank(): from the process group
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
            opt.step()

    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)  # hvd.allgather
    same = all(torch.equal(every[0], f) for f in every)
    print(f"rank {rank}/{world} local_rank {local_rank}: parameters identical on every rank: {same}", flush=True)
    dist.destroy_process_group()
    # torch 2.x: DDP keeps the gloo process group, and its worker threads,
    # alive past destroy_process_group(). A worker thread that frees the
    # last all_gather's tensors after the interpreter began to finalize
    # needs the GIL, is ended by CPython, and aborts a run that succeeded
    # ("terminate called without an active exception": pytorch/pytorch
    # #179291; 3 runs in 80 on a busy machine). Nothing is left to finalize
    # here, so the process ends now, its output flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if same else 1)


if __name__ == "__main__":
    main()

"""Transfer learning under DDP: fine-tune torchvision's resnet18 on 2 ranks
(docs/GETTING_STARTED.md, "A transfer-learning fine-tune").

    ddprun --nproc-per-node=2 examples/resnet18_finetune.py

A real fine-tune starts from `weights=ResNet18_Weights.DEFAULT` and an
ImageFolder; here nothing is downloaded, so the backbone is randomly
initialised (`weights=None`) and the data is torchvision's FakeData: the
code path is the same. The backbone is frozen and only a new 10-class head
trains; DDP all-reduces the head's gradients only (frozen parameters are
not in its buckets). CPU/gloo unless CUDA is there. CI runs it
(tests/examples, examples.resnet18_finetune).

Options: --steps N (default 6), --image-size S (default 64), --batch B (default 4).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader, DistributedSampler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = torchvision.models.resnet18(weights=None)
    for param in model.parameters():
        param.requires_grad = False  # freeze the backbone
    model.fc = nn.Linear(model.fc.in_features, 10)  # the new head: the only trained part
    model = nn.parallel.DistributedDataParallel(model.to(device), device_ids=[local_rank] if cuda else None)

    data = torchvision.datasets.FakeData(size=args.steps * args.batch * world,
                                         image_size=(3, args.image_size, args.image_size), num_classes=10,
                                         transform=torchvision.transforms.ToTensor())
    sampler = DistributedSampler(data, shuffle=True, seed=0)  # each rank its own shard
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    opt = torch.optim.SGD((p for p in model.parameters() if p.requires_grad), lr=0.01 * world, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    model.train()
    sampler.set_epoch(0)
    for step, (images, labels) in enumerate(loader):
        opt.zero_grad()
        loss = loss_fn(model(images.to(device)), labels.to(device))
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    # Every rank holds the same head after the all-reduced steps: checked here,
    # because that is what DDP promises and what the test asserts.
    head = torch.cat([model.module.fc.weight.detach().flatten(), model.module.fc.bias.detach()]).cpu()
    heads = [torch.empty_like(head) for _ in range(world)]
    dist.all_gather(heads, head)
    same = all(torch.equal(heads[0], h) for h in heads)
    print(f"rank {rank} fine-tuned {step + 1} steps, heads identical on {world} ranks: {same}", flush=True)
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

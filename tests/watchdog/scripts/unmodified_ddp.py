"""An unmodified gloo DDP training script: no ddprun import, no beats of its
own. ddprun's bootstrap alone must see its progress (optimizer steps,
forward passes, torch.save). Modes (argv[1]):

  hang      rank 1 enters a collective nobody joins at step 50 (rank 0
            waits for it in the next step's gradient all-reduce)
  restart   as hang in attempt 0; in attempt 1 rank 1 does so at step 3
  healthy   320 steps; every 100 steps rank 0 alone saves a checkpoint
            that takes 30 steps' time (the others wait in the next
            all-reduce), every 150 steps all ranks run a 20-step-long
            evaluation pass (forward passes only)
  setup     a 20 s setup (imports, data) before the first step, 30 steps
  stall     rank 1 stalls 8 s at step 30, then the job finishes (60 steps)
  sleep     rank 1 falls asleep outside any collective at step 30 (rank 0
            waits for it in the next gradient all-reduce)
  spin      rank 1 spins in a Python loop outside any collective at step 30
            (rank 0 waits for it in the next gradient all-reduce)
  child_io  at step 30 rank 1 waits 8 s for a child process that writes a
            file all along (multiprocessing), then the job finishes (60 steps)
  xnode     40 steps; at step 25 rank 0 alone saves a checkpoint that takes
            75 steps' time (15 s, 5 x a step timeout of 3 s), the others
            wait in the next all-reduce (tests/multinode: one rank a node)

STEP_S is one step's time (simulated data loading before each forward).
"""
import io
import os
import sys
import time

import torch
import torch.distributed as dist

STEP_S = 0.2
mode = sys.argv[1]
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class SlowFile(io.BytesIO):
    """A checkpoint destination as slow as a busy network file system."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def write(self, b):
        if self.seconds:
            time.sleep(self.seconds)
            self.seconds = 0
        return super().write(b)


def write_for(seconds):
    # A child busy with I/O (a preprocessing step, a shard download): its
    # rank is slow, not hung.
    end = time.monotonic() + seconds
    with open(f"child_io.{os.getpid()}", "wb") as f:
        while time.monotonic() < end:
            f.write(b"x" * 4096)
            f.flush()
            time.sleep(0.01)
    os._exit(0)


def main():
    if mode == "setup":
        time.sleep(20.0)
    dist.init_process_group("gloo")
    side = dist.new_group([0, 1])  # every rank creates it; only rank 1 will use it
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = {"healthy": 320, "setup": 30, "stall": 60, "xnode": 40, "child_io": 60}.get(mode, 10**9)
    hang_at = 50 if mode == "hang" or (mode == "restart" and attempt == 0) else (
        3 if mode == "restart" else -1)
    for step in range(1, steps + 1):
        if rank == 1 and step == hang_at:
            print(f"rank 1 enters a collective nobody joins at step {step}", flush=True)
            dist.all_reduce(torch.zeros(1), group=side)  # never returns
        if mode == "stall" and rank == 1 and step == 30:
            time.sleep(8.0)
        if mode == "sleep" and rank == 1 and step == 30:
            print("rank 1 falls asleep at step 30", flush=True)
            time.sleep(3600)
        if mode == "spin" and rank == 1 and step == 30:
            print("rank 1 spins at step 30", flush=True)
            x = 0
            while True:
                x += 1
        if mode == "child_io" and rank == 1 and step == 30:
            import multiprocessing
            child = multiprocessing.get_context("fork").Process(target=write_for, args=(8.0,))
            child.start()
            child.join()
        time.sleep(STEP_S)  # data loading
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mode == "healthy" and step % 100 == 0 and rank == 0:
            torch.save(model.state_dict(), SlowFile(30 * STEP_S))
        if mode == "xnode" and step == 25 and rank == 0:
            print(f"rank 0 saves a checkpoint at step {step}", flush=True)
            torch.save(model.state_dict(), SlowFile(75 * STEP_S))
            print("rank 0 saved its checkpoint", flush=True)
        if mode == "healthy" and step % 150 == 0:
            with torch.no_grad():
                for _ in range(20):
                    time.sleep(STEP_S)
                    model.module(torch.randn(4, 8))
        if step % 50 == 0:
            print(f"rank {rank} step {step}", flush=True)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
    # torch 2.x (the torch2 label runs this too): DDP's gloo threads outlive
    # destroy_process_group(), and one freeing tensors while the interpreter
    # finalizes aborts a run that succeeded (pytorch/pytorch #179291). End
    # now, the output flushed; nothing is left to finalize.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


main()

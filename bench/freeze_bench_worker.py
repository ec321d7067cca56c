"""One rank of bench/freeze_bench.py's workloads (2 ranks, gloo, CPU).

Env: FREEZE_WORKLOAD = steady | jittery | checkpoint | eval | eval_rank0 |
phase_change | loader_sleep | hang_step | hang_checkpoint | hang_spin |
hang_mismatch; FREEZE_STEPS; FREEZE_STEP_S (a step's length);
FREEZE_MARK (a file: the moment a hang starts, time.time(), is written
there); FREEZE_CLIENT = none (ddprun: the unmodified script) | nvrx
(NVRx 0.7's RankMonitorClient sections, its documented use: "step" and
"checkpoint" sections, timeouts calculated after FREEZE_CALC_AFTER steps).

Every FREEZE_CKPT_EVERY steps rank 0 alone saves a torch.save checkpoint 30x
as long as a step (the others wait for it in the next all-reduce); every
FREEZE_EVAL_EVERY steps every rank runs a no_grad evaluation pass 20x as
long. A hang never returns: in a step (rank 1, before its all-reduce) or
inside rank 0's torch.save; rank 1 spinning in a Python loop; rank 0 in
an all_reduce while rank 1 broadcasts (a mismatched collective).
Healthy, beside the periodic ones: eval_rank0, at step 100 rank 0 alone
evaluates for 25 s while the other waits in dist.barrier(); phase_change,
from step 100 every step is 50x longer (10 of them); loader_sleep, the
batches come from a DataLoader with one worker process, which sleeps 20 s
once (at step 100).
"""
import io
import os
import random
import time

import torch
import torch.distributed as dist

workload = os.environ["FREEZE_WORKLOAD"]
steps = int(os.environ.get("FREEZE_STEPS", "300"))
step_s = float(os.environ.get("FREEZE_STEP_S", "0.05"))
ckpt_every = int(os.environ.get("FREEZE_CKPT_EVERY", "10"))
eval_every = int(os.environ.get("FREEZE_EVAL_EVERY", "100"))
hang_at = int(os.environ.get("FREEZE_HANG_AT", "150"))
calc_after = int(os.environ.get("FREEZE_CALC_AFTER", "40"))
use_nvrx = os.environ.get("FREEZE_CLIENT", "none") == "nvrx"

dist.init_process_group("gloo")
rank = dist.get_rank()
random.seed(rank)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

client = None
if use_nvrx:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()


def section(name):
    class _S:
        def __enter__(self):
            if client:
                client.start_section(name)

        def __exit__(self, *exc):
            if client:
                client.end_section(name)

    return _S()


def mark_hang():
    with open(os.environ["FREEZE_MARK"], "w") as f:
        f.write("%.6f\n" % time.time())


class SlowFile(io.RawIOBase):
    """A file whose writes take `seconds` in all (or never end)."""

    def __init__(self, seconds, hang=False):
        self.seconds, self.hang = seconds, hang

    def writable(self):
        return True

    def write(self, b):
        if self.hang:
            mark_hang()
            while True:
                time.sleep(3600)
        time.sleep(self.seconds)
        self.seconds = 0
        return len(b)


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.005, max(0.0, end - time.monotonic())))


class Batches(torch.utils.data.Dataset):
    def __len__(self):
        return steps

    def __getitem__(self, i):
        if i == 100:
            time.sleep(20.0)
        return torch.randn(4, 16)


if workload == "loader_sleep":
    batches = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=1))
if workload == "phase_change":
    steps = min(steps, 110)


def spin_forever():
    mark_hang()
    x = 0
    while True:
        x += 1


for step in range(1, steps + 1):
    length = step_s * (random.uniform(0.3, 3.0) if workload == "jittery" else 1.0)
    if workload == "phase_change" and step > 100:
        length = 50 * step_s
    with section("step"):
        if workload == "hang_spin" and rank == 1 and step == hang_at:
            spin_forever()
        if workload == "hang_mismatch" and step == hang_at:
            mark_hang()
            if rank == 0:
                dist.all_reduce(torch.ones(1))
            else:
                dist.broadcast(torch.ones(1 << 20), src=1)
        if workload == "loader_sleep":
            next(batches)
        if workload == "hang_step" and rank == 1 and step == hang_at:
            mark_hang()
            while True:
                time.sleep(3600)
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        busy(length)
        t = torch.ones(1)
        dist.all_reduce(t)
        opt.step()
    if workload in ("checkpoint", "hang_checkpoint") and step % ckpt_every == 0 and rank == 0:
        hang = workload == "hang_checkpoint" and step >= hang_at
        with section("checkpoint"):
            torch.save(model.state_dict(), SlowFile(30 * step_s, hang=hang))
    if workload == "eval_rank0" and step == 100:
        if rank == 0:
            end = time.monotonic() + 25.0
            with torch.no_grad():
                while time.monotonic() < end:
                    model(torch.randn(4, 16))
                    time.sleep(0.005)
        dist.barrier()
    if workload == "eval" and step % eval_every == 0:
        end = time.monotonic() + 20 * step_s
        with torch.no_grad():
            while time.monotonic() < end:
                model(torch.randn(4, 16))
                time.sleep(0.005)
    if client and step == calc_after:
        # Sections not seen yet keep their initial timeout.
        seen = ["step", "checkpoint"] if workload in ("checkpoint", "hang_checkpoint") else ["step"]
        client.calculate_and_set_section_timeouts(selected_sections=seen, skip_if_not_ready=True)
dist.barrier()
if client:
    client.shutdown_workload_monitoring()
dist.destroy_process_group()

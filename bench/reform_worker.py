"""Worker of bench/reform_bench.py, the same script under ddprun and torchrun.

Joins a gloo process group (MASTER_ADDR/MASTER_PORT, as DDP does), appends
"<restart> <rank> <CLOCK_MONOTONIC ns> start" to $BENCH_TS once the group is
up, then all-reduces a small tensor every 10 ms until a rank sees $BENCH_STOP
(the tensor says so: all ranks leave at the same step).
A peer's death breaks the collective: the worker exits 1, as a DDP job does.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
line = f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']} {time.monotonic_ns()} start\n"
fd = os.open(os.environ["BENCH_TS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
# Each step all-reduces whether this rank has seen the stop file: every rank
# then leaves at the same step (a rank that left on its own look would leave
# the others in a collective it no longer joins, until gloo's timeout).
stop = torch.zeros(1)
deadline = time.monotonic() + 120
while True:
    if time.monotonic() > deadline:
        sys.exit(3)
    stop[0] = float(os.path.exists(os.environ["BENCH_STOP"]))
    try:
        dist.all_reduce(stop)
    except Exception:  # a peer is gone
        sys.exit(1)
    if stop[0] > 0:
        break
    time.sleep(0.01)

"""Ranks under a torchrun that has no ddprun instrumentation (no
sitecustomize, no faulthandler): rank 1 hangs in hang_in_python() (line
checked by the attach test), rank 0 waits for it in all_reduce."""
import os
import time

import torch
import torch.distributed as dist


def hang_in_python():
    print("rank 1 stuck", flush=True)
    time.sleep(3600)  # the attach test looks for this line


def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        hang_in_python()
    print("rank 0 in all_reduce", flush=True)
    dist.all_reduce(torch.ones(4))


assert "DDPRUN_PYSTACK_SIGNAL" not in os.environ  # uninstrumented, as the test means
main()

# Attempt 0: rank 1 leaves after three steps while rank 0 blocks forever in
# dist.barrier(). Gloo notices a closed socket, so rank 1 first forks a child
# that keeps its connections open, as a leftover data-loader process or a
# wedged NCCL communicator would. Later attempts finish.
import os
import time

import ddprun_heartbeat as hb
import torch.distributed as dist

first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    hb.beat(step)
    dist.barrier()
if first and rank == 1:
    if os.fork() == 0:
        time.sleep(3600)  # holds rank 1's sockets; the teardown kills it
        os._exit(0)
    print("rank 1 leaves early", flush=True)
    # os._exit, not sys.exit: torch 2.x's interpreter teardown takes seconds
    # on a loaded machine, longer than this test's 2 s heartbeat timeout.
    os._exit(0)
hb.beat(3)


def wait_for_peer_in_barrier():
    dist.barrier()


if first:
    wait_for_peer_in_barrier()
# No destroy_process_group(): after the last beat the worker must be gone
# within the 2 s heartbeat timeout, and gloo's teardown took longer than that
# on a loaded machine (the second attempt was then blamed for a hang).
print("done", flush=True)
os._exit(0)  # as above: the beats stop here, the teardown must not count

"""Two ranks for the test that attach and the agent blame the same one. Run
with RANK and DDPRUN_HEARTBEAT_SOCKET set (by ddprun, or by the test under
attach) and ddprun's heartbeat module importable. Once the socket is bound,
rank 0 beats step 5 and stops beating; after that rank 1 beats step 4 and
stops: rank 0's deadline passes first, rank 1 is behind. Both then burn CPU,
so only the missing beats show a hang. argv[1]: a folder for the hand-over.

The hand-over is a FIFO that rank 1 blocks on, not a file it polls for: on
a loaded machine a polling rank 1 once beat more than the 1 s deadline
after rank 0, so it had no step yet when rank 0's deadline passed and
could not be blamed (a clean-clone CI run failed so)."""
import os
import sys
import time

import ddprun_heartbeat

rank = int(os.environ["RANK"])
sock = os.environ["DDPRUN_HEARTBEAT_SOCKET"]
handover = os.path.join(sys.argv[1], "rank0_beat")


def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: {path} did not appear within 60 s")
        time.sleep(0.01)


if rank == 1:
    os.mkfifo(handover)  # before the socket: rank 0 waits for both
wait_for(sock)  # beats sent before it is bound are dropped
if rank == 0:
    wait_for(handover)  # rank 1 is up and about to block on it
    ddprun_heartbeat.beat(5)
    with open(handover, "w") as fifo:  # wakes rank 1 at once
        fifo.write("beat")
else:
    with open(handover) as fifo:  # blocks until rank 0 has beaten
        fifo.read()
    ddprun_heartbeat.beat(4)
print(f"rank {rank} beat", flush=True)


def spin_without_beating():
    while True:
        pass


spin_without_beating()

"""Worker of tests/slurm/slurm_test.sh (stdlib only, run by ddprun with
$DDPRUN_PYTHON). Writes its environment to $SW_OUT/rank<R>.r<restart>,
then takes a "step" every 20 ms, counting in $SW_OUT/steps<R>.r<restart>.
On SIGTERM or SIGUSR1 it writes $SW_OUT/ckpt<R>.r<restart> (the signal and
the step: the checkpoint) and exits 0. With SW_FAIL_RANK=R, rank R exits 5
in restart 0 once every rank's record of restart 0 exists (a crash that
restarts the group).
"""
import os
import signal
import socket
import sys
import time

out = os.environ["SW_OUT"]
rank = os.environ["RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
tag = f"{rank}.r{restart}"
step = 0


def write(name, text):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))


def checkpoint(sig, _frame):
    write(f"ckpt{tag}", f"signal={signal.Signals(sig).name} step={step}\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, checkpoint)
signal.signal(signal.SIGUSR1, checkpoint)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "SLURM_NODEID"]
write(f"rank{tag}", "".join(f"{k}={os.environ.get(k, '')}\n" for k in keys) +
      f"HOST={socket.gethostname()}\n")
if os.environ.get("SW_FAIL_RANK") == rank and restart == "0":
    # Crash once every rank of the round has started (deadline 60 s).
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(out, f"rank{r}.r0")) for r in range(world)):
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.01)
    sys.exit(5)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    step += 1
    time.sleep(0.02)
sys.exit(3)

"""A worker run as `python -I` (PYTHONPATH, and so ddprun's sitecustomize,
ignored): prints "ready" and sleeps in wait_isolated() until the file given
as its argument exists; `ddprun stacks` must find it there through py-spy."""
import os
import sys
import time


def wait_isolated(until):
    print("ready", flush=True)
    while not os.path.exists(until):
        time.sleep(0.05)  # the test looks for this function


wait_isolated(sys.argv[1])

"""A worker for the introspect tests: beats a step every STEP_SECONDS
(per rank: --slow-rank R --slow-factor F makes rank R that many times slower)
until the file given by --until exists, sleeping in time.sleep in between so
`ddprun stacks` finds it there. Prints "ready <rank>" once it has beaten."""
import argparse
import os
import sys
import time

import ddprun_heartbeat


def wait_here(until, delay, rank):
    """The whole beat loop, so that every traceback taken after "ready" has
    this frame (tests look for it), mostly in its time.sleep."""
    step = 0
    while not os.path.exists(until):
        ddprun_heartbeat.beat(step)
        if step == 1:
            print("ready", rank, flush=True)
        step += 1
        time.sleep(delay)
    return step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--until", required=True)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.0)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    delay = a.step_seconds * (a.slow_factor if rank == a.slow_rank else 1.0)
    step = wait_here(a.until, delay, rank)
    print("done", rank, step, flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""A worker for the report test: in the first attempt rank 1 beats a few
steps and then sleeps without beating (a hang; the watchdog blames it),
while rank 0 keeps beating; every later attempt runs --steps steps on each
rank, then, with --until, beats on slowly until that file exists (the test
looks at the running job first), and exits 0. Plain python3, no torch."""
import argparse
import os
import time

import ddprun_heartbeat


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--until", default=None)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for step in range(a.steps if not first else 10**9):
        ddprun_heartbeat.beat(step)
        if first and rank == 1 and step == 5:
            while True:
                time.sleep(3600)  # asleep outside any collective: the culprit
        time.sleep(a.step_seconds)
    step = a.steps
    while a.until and not os.path.exists(a.until):
        ddprun_heartbeat.beat(step)
        time.sleep(0.2)
    print("done", rank, flush=True)


if __name__ == "__main__":
    main()

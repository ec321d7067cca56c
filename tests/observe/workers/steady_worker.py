"""A worker for the observe tests: beats a step every --step-seconds until
the file --until exists, then exits 0. Plain python3, no torch: ddprun puts
ddprun_heartbeat on the workers' PYTHONPATH."""
import argparse
import os
import time

import ddprun_heartbeat


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--until", required=True)
    p.add_argument("--step-seconds", type=float, default=0.05)
    a = p.parse_args()
    step = 0
    while not os.path.exists(a.until):
        ddprun_heartbeat.beat(step)
        step += 1
        time.sleep(a.step_seconds)


if __name__ == "__main__":
    main()

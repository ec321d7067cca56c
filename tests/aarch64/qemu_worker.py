"""The workers of qemu_test.py: host programs (Debian's /usr/bin/python3)
started by the aarch64 ddprun under qemu-user. Usage: qemu_worker.py MODE
  env          prints its rank environment and exits 0
  crash-first  attempt 0: rank 1 exits 3, rank 0 waits to be stopped;
               attempt 1: both exit 0
  stop-beats   beats every 50 ms; rank 1 stops after step 5 and sleeps
  go-silent    prints every 50 ms; rank 1 falls silent after line 5
"""
import os
import sys
import time

RANK = int(os.environ["RANK"])
RESTART = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
# Every mode ends by itself well after qemu_test.py's deadlines.
LIFETIME_S = 120


def say(text):
    print(f"{text} rank={RANK} restart={RESTART}", flush=True)


def main(mode):
    if mode == "env":
        keys = ("LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        say("env " + " ".join(f"{k}={os.environ.get(k, '-')}" for k in keys))
        return 0
    if mode == "crash-first":
        say("start")
        if RESTART == "0":
            if RANK == 1:
                return 3
            time.sleep(LIFETIME_S)
        return 0
    if mode == "stop-beats":
        import ddprun_heartbeat  # on PYTHONPATH under ddprun
        end = time.monotonic() + LIFETIME_S
        step = 0
        while time.monotonic() < end:
            if RANK != 1 or step <= 5:
                ddprun_heartbeat.beat(step)
            step += 1
            time.sleep(0.05)
        return 0
    if mode == "go-silent":
        end = time.monotonic() + LIFETIME_S
        line = 0
        while time.monotonic() < end:
            if RANK != 1 or line <= 5:
                say(f"line {line}")
            line += 1
            time.sleep(0.05)
        return 0
    print(f"qemu_worker.py: unknown mode {mode}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

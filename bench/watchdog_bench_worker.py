# Python twin of watchdog_bench_worker.cc (same files, same schedule); the
# hung rank is a Python process, so ddprun captures its traceback with
# faulthandler (SIGABRT) instead of gdb.
import os
import time

import ddprun_heartbeat as hb

start = time.monotonic_ns()
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
rank = os.environ.get("RANK", "0")
bench_dir = os.environ["BENCH_DIR"]


def record(name, ns):
    tmp = os.path.join(bench_dir, "." + name)
    with open(tmp, "w") as f:
        f.write("%d\n" % ns)
    os.rename(tmp, os.path.join(bench_dir, name))


def blocked_forever():
    while True:
        time.sleep(3600)


record("start_%s_%s" % (attempt, rank), start)
i = 0
while True:
    hb.beat(i)
    if attempt != "0" and i == 4:
        break
    if attempt == "0" and rank == "1" and i == 19:
        record("lastbeat", time.monotonic_ns())
        blocked_forever()
    time.sleep(0.01)
    i += 1

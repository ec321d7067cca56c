"""How long each way of reading a live Python process's stacks pauses it.

A target interpreter spins on time.monotonic() and prints every gap between
two readings longer than 1 ms (start and end, CLOCK_MONOTONIC, shared with
this process). Each method is run N times against it; a run's pause is the
longest gap that overlaps the method's own start..end. The baseline is the
same measure over windows where nothing is run (scheduler noise).

Methods: faulthandler on a signal (what ddprun's sitecustomize registers,
introspect/stacks.h), `py-spy dump --pid`, `pystack remote`, `eu-stack -p`
(native frames, for comparison). Tools are looked up on PATH, then in
.venv-pytools/bin (scripts/setup-pytools.sh); a missing one is skipped.

    /usr/bin/python3 bench/pystack_pause_bench.py [N]
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TARGET = r"""
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGRTMIN + 6, file=open(sys.argv[1], "a"), all_threads=True)
def deep(n):
    if n == 0:
        last = time.monotonic()
        print("ready", flush=True)
        while True:
            now = time.monotonic()
            if now - last > 0.001:
                print(f"{last:.6f} {now:.6f}", flush=True)
            last = now
    deep(n - 1)
deep(20)  # some frames to walk
"""

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.join(HERE, "..", ".venv-pytools", "bin")


def find(tool):
    return shutil.which(tool) or shutil.which(tool, path=VENV_BIN)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    tmp = tempfile.mkdtemp()
    dump = os.path.join(tmp, "faulthandler.txt")
    target = subprocess.Popen([sys.executable, "-c", TARGET, dump], stdout=subprocess.PIPE, text=True)
    gaps = []
    assert target.stdout.readline().strip() == "ready"

    def read():
        for line in target.stdout:
            a, b = line.split()
            gaps.append((float(a), float(b)))

    threading.Thread(target=read, daemon=True).start()
    methods = {"baseline (nothing run)": lambda: time.sleep(0.02)}
    methods["faulthandler signal"] = lambda: (os.kill(target.pid, signal.SIGRTMIN + 6), time.sleep(0.02))
    for name, argv in (("py-spy dump", ["dump", "--pid"]), ("pystack remote", ["remote"]),
                       ("eu-stack (native)", ["-p"])):
        tool = find(name.split()[0])
        if tool:
            methods[name] = (lambda t=tool, a=argv: subprocess.run(
                [t, *a, str(target.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                check=True, timeout=30))
    print(f"{runs} runs each; pause = longest gap of the target inside the run (ms); "
          f"run = the method's own wall time (ms)")
    for name, run in methods.items():
        pauses, walls = [], []
        for _ in range(runs):
            time.sleep(0.1)
            start = time.monotonic()
            run()
            end = time.monotonic()
            time.sleep(0.05)  # the target's report of the gap arrives
            inside = [b - a for a, b in gaps if b > start and a < end]
            pauses.append(max(inside, default=0.0) * 1000)
            walls.append((end - start) * 1000)
        print(f"{name:24} pause median {statistics.median(pauses):7.1f} max {max(pauses):7.1f}   "
              f"run median {statistics.median(walls):7.1f}")
    target.kill()
    target.wait()


main()

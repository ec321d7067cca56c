"""A torchrun agent pointed at a ddprun rendezvous store (issue 21): ddprun's
store says in one line that it is a ddprun store, not a c10d TCPStore, and
torchrun fails within its own read timeout instead of waiting.

Interpreter: the torch 2.x venv's python (torch2 label), which also runs its
torchrun. Usage: torchrun_agent_test.py DDPRUN_STORE_BIN
"""
import os
import re
import subprocess
import select
import sys
import time

MARK = "this is a ddprun store: a c10d TCPStore client"


def main():
    store_bin = sys.argv[1]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.access(torchrun, os.X_OK):
        print("no torchrun beside", sys.executable)
        return 77
    store = subprocess.Popen([store_bin, "--host", "127.0.0.1", "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        port, seen = None, b""
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            ready, _, _ = select.select([store.stdout], [], [], deadline - time.monotonic())
            chunk = os.read(store.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                break
            seen += chunk
            m = re.search(rb"listening on 127\.0\.0\.1:(\d+)", seen)
            port = int(m.group(1)) if m else None
        assert port, "ddprun-store did not start: " + seen.decode(errors="replace")
        run = subprocess.run(
            [torchrun, "--nnodes=1", "--rdzv-backend=c10d",
             "--rdzv-endpoint=127.0.0.1:%d" % port,
             "--rdzv-conf=is_host=false,read_timeout=5", "--no-python", "/bin/true"],
            capture_output=True, text=True, timeout=120)
    finally:
        store.terminate()
        rest, _ = store.communicate(timeout=30)
    log = (seen + rest).decode(errors="replace")
    print(log)
    print("torchrun rc", run.returncode)
    assert run.returncode != 0, run.stderr
    # torch's client cannot show the server's text: its ping reads a number.
    assert "RendezvousConnectionError" in run.stderr, run.stderr[-2000:]
    lines = [l for l in log.splitlines() if MARK in l]
    assert len(lines) == 1, log
    assert "bad frame" not in log, log
    return 0


if __name__ == "__main__":
    sys.exit(main())

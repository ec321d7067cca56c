"""c10d's TCPStore server alone in a process, for bench/store_attack_bench.

Run with the interpreter whose torch is measured (torch 2.x from a venv:
its libuv server; Debian's /usr/bin/python3: torch 1.13's). Prints
"listening on 127.0.0.1:PORT (torch VERSION, BACKEND)" and serves until
SIGTERM (exit 0). The descriptor limit is raised to the hard limit, as
ddprun-store raises its own, so both face a connection flood alike.
"""
import datetime
import resource
import signal
import sys

import torch
import torch.distributed as dist


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    timeout = datetime.timedelta(hours=1)
    try:
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout,
                              wait_for_workers=False, use_libuv=True)
        backend = "libuv"
    except TypeError:  # torch 1.x: no use_libuv, one server backend
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout,
                              wait_for_workers=False)
        backend = "classic"
    print(f"listening on 127.0.0.1:{store.port} (torch {torch.__version__}, "
          f"{backend})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()

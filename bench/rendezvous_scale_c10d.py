"""torch's c10d dynamic rendezvous at scale: the anchor of bench/rendezvous_scale.

N simulated nodes, one Python thread and one TCPStore client each, run
torch's own DynamicRendezvousHandler on C10dRendezvousBackend (what
`torchrun --rdzv-backend=c10d` runs), against one TCPStore server (libuv,
torch 2.x's default). Same output as rendezvous_scale: one JSON object.
Requests and payload bytes are counted at the Store interface, as the C++
bench counts them. Re-formation: node 0 stops heartbeating (its agent died);
the others ask for the next round, as torchrun's agents do when their
workers fail, with torch's default keep-alive (5 s x 3) and last call.

    .venv-torch/bin/python bench/rendezvous_scale_c10d.py --nodes 64 [--no-reform]
"""
import argparse
import datetime
import json
import socket
import sys
import threading
import time

import torch.distributed as dist
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)


class CountingStore(dist.Store):
    """Forwards to a TCPStore client, counting requests and payload bytes."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.requests = 0
        self.bytes = 0

    def _count(self, *parts):
        self.requests += 1
        self.bytes += sum(len(p) for p in parts)

    def set(self, key, value):
        self._count(key, value)
        return self.inner.set(key, value)

    def get(self, key):
        self._count(key)
        v = self.inner.get(key)
        self.bytes += len(v)
        return v

    def add(self, key, value):
        self._count(key)
        self.bytes += 8
        return self.inner.add(key, value)

    def compare_set(self, key, expected, desired):
        self._count(key, expected, desired)
        v = self.inner.compare_set(key, expected, desired)
        self.bytes += len(v)
        return v

    def wait(self, keys, timeout=None):
        self._count(*keys)
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        self._count(*keys)
        return self.inner.check(keys)

    def delete_key(self, key):
        self._count(key)
        return self.inner.delete_key(key)

    def num_keys(self):
        self._count()
        return self.inner.num_keys()

    def set_timeout(self, timeout):
        return self.inner.set_timeout(timeout)

    @property
    def timeout(self):
        return self.inner.timeout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--no-reform", action="store_true")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    n = args.nodes
    reform = not args.no_reform
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=args.timeout))
    port = server.port
    timeout = RendezvousTimeout(join=datetime.timedelta(seconds=args.timeout))
    stores = [None] * n
    handlers = [None] * n
    formed = [0.0] * n
    reformed = [0.0] * n
    formation_counts = [(0, 0)] * n
    errors = []
    start_gate = threading.Barrier(n + 1)
    formed_gate = threading.Barrier(n + 1)
    death = threading.Event()

    def node(i):
        try:
            inner = dist.TCPStore("127.0.0.1", port, is_master=False,
                                  timeout=datetime.timedelta(seconds=args.timeout))
            store = CountingStore(inner)
            stores[i] = store
            backend = C10dRendezvousBackend(store, "scale")
            h = DynamicRendezvousHandler.from_backend(
                run_id="scale", store=store, backend=backend,
                min_nodes=n - 1 if reform else n, max_nodes=n,
                local_addr="127.0.0.1", timeout=timeout)
            handlers[i] = h
            start_gate.wait(args.timeout)
            h.next_rendezvous()
            formed[i] = time.monotonic()
            formation_counts[i] = (store.requests, store.bytes)
            formed_gate.wait(args.timeout)
            if not reform:
                return
            if i == 0:
                h._stop_heartbeats()  # its agent died: no more heartbeats, no goodbye
                return
            death.wait(args.timeout)
            h.next_rendezvous()  # its workers failed: the next round
            reformed[i] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - the first failure is the result
            errors.append("node%d: %s: %s" % (i, type(e).__name__, e))
            for gate in (start_gate, formed_gate):
                gate.abort()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    try:
        start_gate.wait(args.timeout)
        t0 = time.monotonic()
        formed_gate.wait(args.timeout * 2)
        t_death = time.monotonic()
        death.set()
    except threading.BrokenBarrierError:
        t0 = t_death = time.monotonic()
    deadline = time.monotonic() + args.timeout * 2
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    out = {"backend": "c10d-torch", "nodes": n}
    if any(f for f in formed):
        out["formation_s"] = round(max(formed) - t0, 4)
        out["requests_per_node"] = round(sum(c[0] for c in formation_counts) / n, 2)
        out["max_requests"] = max(c[0] for c in formation_counts)
        out["bytes_per_node"] = int(sum(c[1] for c in formation_counts) / n)
    if reform and all(reformed[1:]):
        out["reformation_s"] = round(max(reformed[1:]) - t_death, 4)
        rq = [stores[i].requests - formation_counts[i][0] for i in range(1, n)]
        rb = [stores[i].bytes - formation_counts[i][1] for i in range(1, n)]
        out["reform_requests_per_node"] = round(sum(rq) / (n - 1), 2)
        out["reform_max_requests"] = max(rq)
        out["reform_bytes_per_node"] = int(sum(rb) / (n - 1))
    if errors:
        out["error"] = errors[0]
    elif any(t.is_alive() for t in threads):
        out["error"] = "not formed within %g s" % (args.timeout * 2)
    print(json.dumps(out), flush=True)
    for h in handlers:
        if h is not None:
            try:
                h._stop_heartbeats()
            except Exception:  # noqa: BLE001
                pass
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())

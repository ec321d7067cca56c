"""Two agents on loopback form one 2-node job (ddprun's TCP store, 2 ranks
each) with --metrics-port=0: each exports its own node's ranks, under their
global ranks (the two nodes' series never collide and cover ranks 0-3),
says ddprun_nodes 2, and names its node in ddprun_job_info.

Run by ctest: nodes_metrics_test.py <ddprun>. Stdlib only; the workers are
Debian's /usr/bin/python3. ~1 s.
"""
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Job, fetch, free_port, poll  # noqa: E402

DEADLINE_S = 120


def node_view(text):
    """(node label, ranks with a step, ddprun_nodes) from one exposition."""
    node = re.search(r'^ddprun_job_info\{[^}]*node="(\d+)"', text, re.M)
    ranks = sorted(int(r) for r in re.findall(r'^ddprun_worker_step\{rank="(\d+)"\}', text, re.M))
    nodes = re.search(r"^ddprun_nodes (\S+)$", text, re.M)
    return (node.group(1) if node else None, ranks, nodes.group(1) if nodes else None)


def main():
    ddprun = sys.argv[1]
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                          "steady_worker.py")
    with tempfile.TemporaryDirectory(prefix="ddprun-nodes-metrics-") as tmp:
        stop = os.path.join(tmp, "stop")
        endpoint = f"127.0.0.1:{free_port()}"
        jobs = []
        for n in range(2):
            registry = os.path.join(tmp, f"registry{n}")
            os.mkdir(registry, 0o700)
            env = dict(os.environ, DDPRUN_RDZV_TOKEN="metrics-secret", DDPRUN_REGISTRY_DIR=registry)
            jobs.append(Job([ddprun, "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                             f"--rdzv-endpoint={endpoint}", f"--rdzv-id=metrics-{os.getpid()}",
                             "--metrics-port=0", f"--log-dir={tmp}/logs{n}",
                             "/usr/bin/python3", worker, "--until", stop], env=env))
        views = [None, None]
        try:
            for n, job in enumerate(jobs):
                m = job.wait_line(r"metrics at (http://\S+)", DEADLINE_S)
                if not m:
                    print(f"FAILED: agent {n} never said where its metrics are:\n" + job.stderr())
                    return 1
                url = m.group(1)

                def both_ranks(url=url, n=n):
                    text = fetch(url)
                    if not text:
                        return None
                    views[n] = node_view(text)
                    return len(views[n][1]) == 2 and views[n][2] == "2" and views[n][0] is not None

                if not poll(both_ranks, DEADLINE_S):
                    print(f"FAILED: agent {n}'s metrics never showed its node's two ranks: "
                          f"{views[n]}\n{fetch(url)}")
                    return 1
        finally:
            open(stop, "w").close()
            statuses = [job.finish(DEADLINE_S) for job in jobs]
        nodes = sorted(v[0] for v in views)
        ranks = sorted(views[0][1] + views[1][1])
        if nodes != ["0", "1"] or ranks != [0, 1, 2, 3]:
            print(f"FAILED: nodes {nodes} (expected 0 and 1), ranks {ranks} (expected 0-3)")
            return 1
        if statuses != [0, 0]:
            print(f"FAILED: the agents ended with {statuses}:\n" + jobs[0].stderr() + "\n" +
                  jobs[1].stderr())
            return 1
    print(f"ok: each node exports its own ranks: {views[0]}, {views[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

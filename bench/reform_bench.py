#!/usr/bin/python3
"""A node dies: how long until the survivors run again? ddprun vs torchrun.

Three network namespaces (bench/multinode_bench.py's network), one agent per
namespace with --nnodes=2:3 and 2 workers each (bench/reform_worker.py, a
gloo all-reduce loop: a peer's death fails the collective, as in DDP). Once
all six workers run, every process of node 3 is SIGKILLed at once (the agent
and its workers: a node lost). Measured: from the kill to the moment all four
survivors' workers of the new round have their process group up.

Both launchers get the same settings: last_call_timeout=1, the c10d
backend, term timeout 2 s. ddprun: keep-alive 0.5 s x 3 (not what ends the
round here: the store sees node 3's connection close). torchrun: Debian's
1.13 (/usr/bin/python3 -m torch.distributed.run through bench/torchrun-1.13,
which repairs its Python 3.11 crash), monitor interval 0.1 s;
its survivors re-form when their workers' collective fails.

Needs root and `ip netns`. Usage:
  /usr/bin/python3 bench/reform_bench.py [--ddprun build/bin/ddprun] [--reps 3]
Prints a Markdown table; medians over --reps interleaved repetitions.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import multinode_bench as mb  # same folder: the network and the records

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"  # Debian's, with torch 1.13


def kill_node(i):
    """SIGKILLs every process in namespace i at once (the node is lost)."""
    pids = subprocess.run(["ip", "netns", "pids", mb.ns(i)], capture_output=True,
                          text=True).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except ProcessLookupError:
            pass


def name_hosts(nodes=mb.NODES):
    """Node i is host n<i> (its own UTS namespace, see as_node) and every
    namespace resolves n1..n3 to their addresses (/etc/netns, which `ip netns
    exec` mounts over /etc/hosts), as on real nodes: torchrun 1.13 gives the
    workers its host name as MASTER_ADDR."""
    names = "".join(f"10.77.0.{j} n{j}\n" for j in range(1, nodes + 1))
    for i in range(1, nodes + 1):
        os.makedirs(f"/etc/netns/{mb.ns(i)}", exist_ok=True)
        with open(f"/etc/netns/{mb.ns(i)}/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n" + names)


def as_node(i, argv):
    """argv run as host n<i> (unshare and sh exec: the pid stays the agent's)."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', f"n{i}"] + argv


def unname_hosts(nodes=mb.NODES):
    for i in range(1, nodes + 1):
        shutil.rmtree(f"/etc/netns/{mb.ns(i)}", ignore_errors=True)


def reform_once(cmds, tmp):
    ts = os.path.join(tmp, "ts")
    stop = os.path.join(tmp, "stop")
    for f in (ts, stop):
        if os.path.exists(f):
            os.remove(f)
    os.environ.update(BENCH_STOP=stop, GLOO_SOCKET_IFNAME="eth0", DDPRUN_PYTHON=PY,
                      OMP_NUM_THREADS="1")
    procs = mb.start_agents(cmds, ts, range(1, mb.NODES + 1))
    deadline = time.monotonic() + 180

    def wait_for(pred, what):
        while not pred():  # waiting on the workers' records
            if time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                    p.wait()
                raise RuntimeError(what + "\n" + mb.logs(tmp))
            time.sleep(0.002)

    wait_for(lambda: len(mb.starts(ts).get(0, [])) >= 2 * mb.NODES, "round 0 did not form")
    t_kill = time.monotonic_ns()
    kill_node(3)
    procs[2].wait()
    wait_for(lambda: len(mb.starts(ts).get(1, [])) >= 4, "the survivors did not re-form")
    t = (max(mb.starts(ts)[1]) - t_kill) / 1e9
    open(stop, "w").close()
    mb.wait_all(procs[:2], tmp)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("reform_bench: needs root (ip netns)")
        return 1
    tmp = tempfile.mkdtemp(prefix="reform_bench_")
    worker = os.path.join(HERE, "reform_worker.py")
    ddprun = os.path.abspath(args.ddprun)
    ep = f"10.77.0.1:{mb.PORT}"
    launchers = {
        "torchrun 1.13 (c10d)": lambda rep: lambda i: as_node(i, [
            PY, os.path.join(HERE, "torchrun-1.13"), "--nnodes=2:3", "--nproc_per_node=2",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={ep}", f"--rdzv_id=t{rep}",
            f"--rdzv_conf=is_host={1 if i == 1 else 0},last_call_timeout=1",
            "--max_restarts=1", "--monitor_interval=0.1", worker]),
        "ddprun (c10d)": lambda rep: lambda i: as_node(i, [
            ddprun, "--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={ep}", f"--rdzv-id=d{rep}",
            "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=3,"
            "last_call_timeout=1,join_timeout=60",
            "--max-restarts=1", "--term-timeout=2", worker]),
    }
    res = {n: [] for n in launchers}
    try:
        mb.make_net()
        name_hosts()
        for rep in range(args.reps):
            for name, make in launchers.items():
                # torchrun's store host is node 1; node 3 (killed) hosts nothing.
                res[name].append(reform_once(make(rep), tmp))
    finally:
        mb.drop_net()
        unname_hosts()
        shutil.rmtree(tmp, ignore_errors=True)
    t = statistics.median(res["torchrun 1.13 (c10d)"])
    print(f"reps: {args.reps}, machine: {os.cpu_count()} CPUs, 3 namespaces x 2 workers, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| launcher | node 3 SIGKILLed → 4 survivors' workers in their new group (median, min) |")
    print("| --- | --- |")
    for name, v in res.items():
        m = statistics.median(v)
        ratio = "" if name.startswith("torchrun") else f" (1/{t / m:.1f})"
        print(f"| {name} | {m * 1e3:.0f} ms, {min(v) * 1e3:.0f} ms{ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

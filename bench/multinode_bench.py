#!/usr/bin/python3
"""ddprun vs torchrun across three network namespaces, side by side in one run.

Three namespaces joined by veth pairs to a bridge in a fourth (10.77.0.0/24,
inside namespaces this script creates and always deletes), one agent per
namespace, 2 trivial native workers each (bench/launch_worker.c), both
launchers with the c10d backend and --nnodes=3 (so no last-call wait):

  (a) form: from just before the three agents are started to the moment all
      six workers have started (each records CLOCK_MONOTONIC on entry);
  (b) the store-hosting agent's peak RSS (VmHWM from /proc, sampled);
  (c) ddprun only: from SIGKILL of one agent to both survivors' re-formed
      workers running (--nnodes=2:3, keep_alive_interval=0.5, max_attempt 3,
      last_call_timeout=0.5; the store sees the agent's connection close).
      torchrun's agents do not notice a dead peer while these workers run:
      bench/reform_bench.py compares the two with workers that fail.

Needs root and `ip netns`. Usage:
  /usr/bin/python3 bench/multinode_bench.py [--ddprun build/bin/ddprun]
      [--torchrun bench/torchrun-1.13 or .venv-torch/bin/torchrun] [--reps 5]
Prints a Markdown table; medians over --reps repetitions.
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

from launch_bench import vm_hwm_kib  # same folder: the script's own

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TAG = f"ddmb-{os.getpid()}"
NODES = 3
PORT = 29400


def ip(*args):
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


def ns(i):
    return f"{TAG}-n{i}"


def make_net(nodes=NODES, hub_addr=None):
    """Namespaces n1..n<nodes> at 10.77.0.<i>; hub_addr (e.g. 10.77.0.254)
    puts the hub itself on the network, for a server the nodes share."""
    ip("netns", "add", f"{TAG}-hub")
    ip("-n", f"{TAG}-hub", "link", "add", "br0", "type", "bridge")
    ip("-n", f"{TAG}-hub", "link", "set", "br0", "up")
    if hub_addr:
        ip("-n", f"{TAG}-hub", "addr", "add", f"{hub_addr}/24", "dev", "br0")
        ip("-n", f"{TAG}-hub", "link", "set", "lo", "up")
    for i in range(1, nodes + 1):
        ip("netns", "add", ns(i))
        ip("-n", f"{TAG}-hub", "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
           "netns", ns(i))
        ip("-n", f"{TAG}-hub", "link", "set", f"v{i}", "master", "br0", "up")
        ip("-n", ns(i), "addr", "add", f"10.77.0.{i}/24", "dev", "eth0")
        ip("-n", ns(i), "link", "set", "eth0", "up")
        ip("-n", ns(i), "link", "set", "lo", "up")


def drop_net(nodes=NODES):
    for name in [f"{TAG}-hub"] + [ns(i) for i in range(1, nodes + 1)]:
        subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)


def starts(ts):
    out = {}
    if not os.path.exists(ts):
        return out
    for line in open(ts):
        restart, rank, t, what = line.split()
        if what == "start":
            out.setdefault(int(restart), []).append(int(t))
    return out


def start_agents(cmds, ts, nodes):
    env = dict(os.environ, BENCH_TS=ts, DDPRUN_RDZV_TOKEN="bench-token")
    procs = []
    for i in nodes:
        # ip netns exec execs the agent: the pid is the agent's.
        log = open(os.path.join(os.path.dirname(ts), f"agent{i}.log"), "w")
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns(i)] + cmds(i), env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def logs(tmp):
    out = ""
    i = 1
    while os.path.exists(os.path.join(tmp, f"agent{i}.log")):
        out += f"--- agent {i}\n" + open(os.path.join(tmp, f"agent{i}.log")).read()
        i += 1
    return out


def wait_all(procs, tmp, deadline_s=120, sample=None):
    deadline = time.monotonic() + deadline_s
    hwm = 0
    while any(p.poll() is None for p in procs):  # sampling RSS: polling is the measurement
        if sample is not None:
            hwm = max(hwm, vm_hwm_kib(sample.pid) or 0)
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
                p.wait()
            raise RuntimeError("agents did not finish within the deadline\n" + logs(tmp))
        time.sleep(0.005)
    for p in procs:
        if p.returncode != 0:
            raise RuntimeError(f"an agent exited {p.returncode}\n" + logs(tmp))
    return hwm


def form_once(cmds, tmp):
    ts = os.path.join(tmp, "ts")
    if os.path.exists(ts):
        os.remove(ts)
    t0 = time.monotonic_ns()
    procs = start_agents(cmds, ts, range(1, NODES + 1))
    hwm = wait_all(procs, tmp, sample=procs[0])
    s = starts(ts)[0]
    if len(s) != 2 * NODES:
        raise RuntimeError(f"{len(s)} workers started, expected {2 * NODES}")
    return (max(s) - t0) / 1e9, hwm


def reform_once(ddprun, worker, tmp, rep):
    """ddprun: SIGKILL node 3's agent; time until both survivors' new workers run."""
    ts = os.path.join(tmp, "ts")
    if os.path.exists(ts):
        os.remove(ts)
    stop = os.path.join(tmp, "stop")
    if os.path.exists(stop):
        os.remove(stop)
    conf = ("keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=0.5,"
            "join_timeout=30")
    cmds = lambda i: [ddprun, "--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=10.77.0.1:{PORT}", f"--rdzv-id=re{rep}",
                      f"--rdzv-conf={conf}", "--max-restarts=1", "--term-timeout=2",
                      worker, "wait"]
    env_stop = dict(BENCH_STOP=stop)
    os.environ.update(env_stop)
    procs = start_agents(cmds, ts, range(1, NODES + 1))
    deadline = time.monotonic() + 60
    while len(starts(ts).get(0, [])) < 2 * NODES:  # waiting on the workers' records
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
                p.wait()
            raise RuntimeError("round 0 did not form\n" + logs(tmp))
        time.sleep(0.002)
    t_kill = time.monotonic_ns()
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait()
    while len(starts(ts).get(1, [])) < 4:
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
                p.wait()
            raise RuntimeError("the survivors did not re-form\n" + logs(tmp))
        time.sleep(0.002)
    t = (max(starts(ts)[1]) - t_kill) / 1e9
    open(stop, "w").close()
    wait_all(procs[:2], tmp)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, "bench", "torchrun-1.13"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--reform-only", action="store_true", help="only (c), ddprun")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("multinode_bench: needs root (ip netns)")
        return 1
    tmp = tempfile.mkdtemp(prefix="multinode_bench_")
    try:
        worker = os.path.join(tmp, "worker")
        subprocess.run(["cc", "-O2", "-o", worker,
                        os.path.join(HERE, "multinode_worker.c")], check=True)
        make_net()
        ddprun = os.path.abspath(args.ddprun)
        launchers = {
            "torchrun": lambda rep: lambda i: [
                args.torchrun, "--nnodes=3", "--nproc_per_node=2", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=10.77.0.1:{PORT}", f"--rdzv_id=t{rep}",
                f"--rdzv_conf=is_host={1 if i == 1 else 0}", "--monitor_interval=0.1",
                "--no_python", worker, "launch"],
            "ddprun": lambda rep: lambda i: [
                ddprun, "--nnodes=3", "--nproc-per-node=2", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=10.77.0.1:{PORT}", f"--rdzv-id=d{rep}", worker, "launch"],
        }
        res = {n: {"form": [], "rss": []} for n in launchers}
        reform = []
        for rep in range(args.reps):  # interleaved, so drift hits both alike
            if args.reform_only:
                reform.append(reform_once(ddprun, worker, tmp, rep))
                continue
            for name, make in launchers.items():
                form, hwm = form_once(make(rep), tmp)
                res[name]["form"].append(form)
                res[name]["rss"].append(hwm)
            reform.append(reform_once(ddprun, worker, tmp, rep))
        if args.reform_only:
            print(f"re-form: median {statistics.median(reform) * 1e3:.0f} ms")
            return 0
        med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
        t, d = med["torchrun"], med["ddprun"]
        print(f"reps: {args.reps}, machine: {os.cpu_count()} CPUs, 3 namespaces x 2 workers, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        print("| launcher | 3 agents started → 6 workers running | store host's peak RSS |")
        print("| --- | --- | --- |")
        print(f"| torchrun (c10d) | {t['form'] * 1e3:.0f} ms | {t['rss'] / 1024:.1f} MiB |")
        print(f"| ddprun (c10d) | {d['form'] * 1e3:.0f} ms (1/{t['form'] / d['form']:.0f}) "
              f"| {d['rss'] / 1024:.1f} MiB (1/{t['rss'] / d['rss']:.0f}) |")
        print(f"\nddprun, SIGKILL of one agent → survivors' workers re-formed and running "
              f"(keep-alive 0.5 s x 3, last call 0.5 s): median "
              f"{statistics.median(reform) * 1e3:.0f} ms (min {min(reform) * 1e3:.0f} ms)")
    finally:
        drop_net()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

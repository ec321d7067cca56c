#!/usr/bin/python3
"""Formation time of 2, 4 and 8 agents, one per network namespace, side by
side in one run: ddprun and torchrun 2.x, each on its own store and on etcd.

The network is bench/multinode_bench.py's (veth pairs to a bridge in a hub
namespace, node i at 10.77.0.i, host name n<i> as bench/reform_bench.py
sets it); the hub itself is 10.77.0.254, where one etcd server runs (Debian's
etcd 3.4, v2 API on: torch's etcd backends speak v2 through python-etcd).
Every agent gets --nnodes=N (no last-call wait) and one worker,
bench/multinode_worker.c "launch", which records CLOCK_MONOTONIC on entry
and exits. Measured: from just before the N agents are started to the
moment all N workers have started. Rows, interleaved within each repetition:

  torchrun 2.x (c10d)    the venv's torchrun; node 1 hosts the store (is_host)
  torchrun 2.x (etcd-v2) the etcd server; needs python-etcd in the venv
  torchrun 2.x (etcd)    the same, torchrun's older etcd rendezvous
  ddprun (c10d)          ddprun's store, hosted by node 1's agent
  ddprun (etcd)          the etcd server; run when this ddprun accepts
                         --rdzv-backend=etcd, else reported as not run
  (torchrun's floor)     N interpreters of the venv, started the same way,
                         each recording the moment it has imported
                         torch.distributed.run: what torchrun's rows spend
                         before any rendezvous

A row that cannot run says why. Needs root, `ip netns` and etcd. Usage:
  /usr/bin/python3 bench/formation_bench.py [--ddprun build/bin/ddprun]
      [--torchrun .venv-torch/bin/torchrun] [--sizes 2,4,8] [--reps 5] [--rows A,B]
Prints a Markdown table: medians (and min) over --reps, ratio to torchrun's
c10d row of the same size.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import multinode_bench as mb  # same folder: the network and the records
import reform_bench as rb     # host names for the namespaces

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HUB = "10.77.0.254"
ETCD = f"{HUB}:2379"


def start_etcd(tmp):
    """etcd in the hub namespace; returns the process once it serves."""
    log = open(os.path.join(tmp, "etcd.log"), "w")
    p = subprocess.Popen(
        ["ip", "netns", "exec", f"{mb.TAG}-hub", "etcd", "--enable-v2",
         "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls", f"http://{ETCD}",
         "--advertise-client-urls", f"http://{ETCD}",
         "--listen-peer-urls", "http://127.0.0.1:2380",
         "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
         "--initial-cluster", "default=http://127.0.0.1:2380"],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 30
    while subprocess.run(["ip", "netns", "exec", f"{mb.TAG}-hub", "etcdctl",
                          f"--endpoints=http://{ETCD}", "endpoint", "health"],
                         capture_output=True).returncode != 0:
        if p.poll() is not None or time.monotonic() > deadline:
            stop(p)
            raise RuntimeError("etcd did not start:\n" + open(os.path.join(tmp, "etcd.log")).read())
        time.sleep(0.1)  # etcd gives no readiness event we can wait on
    return p


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ddprun_has_etcd(ddprun):
    """Whether this ddprun's command line accepts --rdzv-backend=etcd (it
    refuses it at parse time, exit 2, where the backend is not built in)."""
    try:
        r = subprocess.run([ddprun, "--nnodes=2", "--rdzv-backend=etcd",
                            "--rdzv-endpoint=127.0.0.1:9", "--rdzv-conf=join_timeout=1",
                            "/bin/true"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return True  # it took the flag and is trying to reach port 9 (killed by run)
    return "not supported" not in (r.stdout + r.stderr)


def form_once(cmds, n, tmp):
    ts = os.path.join(tmp, "ts")
    for f in os.listdir(tmp):
        if f.startswith("agent") or f == "ts":
            os.remove(os.path.join(tmp, f))
    t0 = time.monotonic_ns()
    procs = mb.start_agents(cmds, ts, range(1, n + 1))
    mb.wait_all(procs, tmp, deadline_s=180)
    s = mb.starts(ts).get(0, [])
    if len(s) != n:
        raise RuntimeError(f"{len(s)} workers started, expected {n}\n" + mb.logs(tmp))
    return (max(s) - t0) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, ".venv-torch", "bin", "torchrun"))
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rows", help="only these rows, comma-separated (e.g. "
                    "'torchrun 2.x (c10d),ddprun (c10d),ddprun (etcd)'); default all")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("formation_bench: needs root (ip netns)")
        return 1
    sizes = [int(x) for x in args.sizes.split(",")]
    top = max(sizes)
    ddprun = os.path.abspath(args.ddprun)
    torchrun = os.path.abspath(args.torchrun)
    venv_py = os.path.join(os.path.dirname(torchrun), "python")
    skipped = {}
    if not os.path.exists(torchrun):
        skipped["torchrun 2.x (c10d)"] = f"{torchrun} missing (scripts/setup-torch.sh)"
    if subprocess.run([venv_py, "-c", "import etcd"], capture_output=True).returncode != 0:
        for name in ("torchrun 2.x (etcd-v2)", "torchrun 2.x (etcd)"):
            skipped[name] = f"python-etcd does not import in {venv_py}"
    if not ddprun_has_etcd(ddprun):
        skipped["ddprun (etcd)"] = "this ddprun refuses --rdzv-backend=etcd (not built in yet)"
    tmp = tempfile.mkdtemp(prefix="formation_bench_")
    worker = os.path.join(tmp, "worker")
    subprocess.run(["cc", "-O2", "-o", worker, os.path.join(HERE, "multinode_worker.c")],
                   check=True)
    ep = f"10.77.0.1:{mb.PORT}"
    node = rb.as_node
    rows = {
        "torchrun 2.x (c10d)": lambda n, rid: lambda i: node(i, [
            torchrun, f"--nnodes={n}", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={ep}", f"--rdzv_id={rid}",
            f"--rdzv_conf=is_host={1 if i == 1 else 0}", "--monitor_interval=0.1",
            "--no_python", worker, "launch"]),
        "torchrun 2.x (etcd-v2)": lambda n, rid: lambda i: node(i, [
            torchrun, f"--nnodes={n}", "--nproc_per_node=1", "--rdzv_backend=etcd-v2",
            f"--rdzv_endpoint={ETCD}", f"--rdzv_id={rid}", "--monitor_interval=0.1",
            "--no_python", worker, "launch"]),
        "torchrun 2.x (etcd)": lambda n, rid: lambda i: node(i, [
            torchrun, f"--nnodes={n}", "--nproc_per_node=1", "--rdzv_backend=etcd",
            f"--rdzv_endpoint={ETCD}", f"--rdzv_id={rid}", "--monitor_interval=0.1",
            "--no_python", worker, "launch"]),
        "ddprun (c10d)": lambda n, rid: lambda i: node(i, [
            ddprun, f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={ep}", f"--rdzv-id={rid}", worker, "launch"]),
        # No token: on etcd it would be etcd's password (our etcd has no auth).
        "ddprun (etcd)": lambda n, rid: lambda i: node(i, [
            "env", "-u", "DDPRUN_RDZV_TOKEN", ddprun, f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=etcd",
            f"--rdzv-endpoint={ETCD}", f"--rdzv-id={rid}", worker, "launch"]),
        # One O_APPEND write of a worker's record once the import is done.
        "(torchrun's floor: import only)": lambda n, rid: lambda i: node(i, [
            venv_py, "-c", "import os, time, torch.distributed.run; "
            "os.write(os.open(os.environ['BENCH_TS'], os.O_WRONLY | os.O_APPEND | os.O_CREAT), "
            "b'0 0 %d start\\n' % time.monotonic_ns())"]),
    }
    if args.rows:
        keep = [r.strip() for r in args.rows.split(",")]
        unknown = [r for r in keep if r not in rows]
        if unknown:
            print(f"formation_bench: --rows: unknown {unknown}; rows: {list(rows)}")
            shutil.rmtree(tmp, ignore_errors=True)
            return 2
        rows = {name: make for name, make in rows.items() if name in keep}
    res = {(name, n): [] for name in rows for n in sizes}
    etcd = None
    load = os.getloadavg()
    started = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    try:
        mb.make_net(top, hub_addr=HUB)
        rb.name_hosts(top)
        etcd = start_etcd(tmp)
        for rep in range(args.reps):  # interleaved, so drift hits every row alike
            for n in sizes:
                for k, (name, make) in enumerate(rows.items()):
                    if name in skipped:
                        continue
                    res[(name, n)].append(form_once(make(n, f"r{rep}n{n}k{k}"), n, tmp))
    finally:
        if etcd is not None:
            stop(etcd)
        mb.drop_net(top)
        rb.unname_hosts(top)
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    print(f"reps: {args.reps}, machine: {os.cpu_count()} CPUs, one agent and one worker per "
          f"namespace, started {started}, ended "
          f"{time.strftime('%H:%M UTC', time.gmtime())}, load average (1 min) {load[0]:.1f} "
          f"before, {load_after[0]:.1f} after\n")
    print("| agents started → every worker running (median, min) | "
          + " | ".join(f"{n} agents" for n in sizes) + " |")
    print("| --- |" + " --- |" * len(sizes))
    for name in rows:
        if name in skipped:
            print(f"| {name} | " + " | ".join("not run" for _ in sizes) + " |")
            continue
        cells = []
        for n in sizes:
            v = res[(name, n)]
            m = statistics.median(v)
            cell = f"{m * 1e3:.0f} ms, {min(v) * 1e3:.0f}"
            if name.startswith("ddprun") and res.get(("torchrun 2.x (c10d)", n)):
                t = statistics.median(res[("torchrun 2.x (c10d)", n)])
                cell += f" (1/{t / m:.1f})" if m < t else f" ({m / t:.1f}x)"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name, why in skipped.items():
        if name in rows:
            print(f"\n{name}: not run: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

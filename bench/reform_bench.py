#!/usr/bin/python3
"""A node dies: how long until the survivors run again? ddprun vs torchrun
2.x, each on its own store and on etcd, side by side in one run.

Three network namespaces (bench/multinode_bench.py's network; the hub is
10.77.0.254 and runs one etcd server, as in bench/formation_bench.py), one
agent per namespace with --nnodes=1:3 and 2 workers each
(bench/reform_worker.py, a gloo all-reduce loop run by the venv's python
under both launchers: a peer's death fails the collective, as in DDP). Once
all six workers run, every process of one node is SIGKILLed at once (the
agent and its workers: a node lost). Measured: from the kill to the moment
all four survivors' workers of the new round have their process group up.

  --kill other (default)  node 3, which hosts nothing
  --kill host             node 1, which hosts the c10d store (is_host for
                          torchrun, the endpoint's address for ddprun); on
                          etcd node 1 is just a node. A row whose survivors
                          do not re-form within --deadline seconds says what
                          happened (the agents' exit statuses).

Rows, interleaved within each repetition:

  ddprun (c10d)           node 1's agent hosts the store
  ddprun (etcd)           the hub's etcd (where this ddprun accepts
                          --rdzv-backend=etcd, else reported as not run)
  torchrun 2.x (c10d)     the venv's torchrun, node 1 is_host
  torchrun 2.x (etcd-v2)  the hub's etcd; needs python-etcd in the venv
  torchrun 2.x (...; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
                          the same two with torchrun's opt-out of sharing
                          one TCPStore with the workers across rounds: with
                          the sharing (its default) a re-formed round's gloo
                          workers can read the last round's addresses

A row that did not re-form in its first repetition is not repeated (each
such run costs --deadline) unless --repeat-failed.

Every setting is the launchers' default (last_call_timeout 30 s for both,
keep-alive 5 s x 3) except --max-restarts=3 and torchrun's
--monitor_interval=0.1. ddprun's workers get the venv's python
(DDPRUN_PYTHON).

--old reruns the 2026-11-30 case instead: --nnodes=2:3, last_call_timeout=1,
c10d only, torchrun 1.13 (Debian's, through bench/torchrun-1.13) and
/usr/bin/python3 workers, ddprun with keep-alive 0.5 s x 3 and
--term-timeout=2.

Needs root, `ip netns` and etcd. The namespaces, the processes in them and
etcd are removed however the run ends (an exception, Ctrl-C, SIGTERM).
Usage:
  /usr/bin/python3 bench/reform_bench.py [--ddprun build/bin/ddprun]
      [--torchrun .venv-torch/bin/torchrun] [--reps 3] [--kill other|host]
      [--deadline 90] [--rows A,B] [--old]
Prints a Markdown table: median and min over --reps, and per backend the
ratio of torchrun's median to ddprun's.
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
SYS_PY = "/usr/bin/python3"  # Debian's, with torch 1.13 (--old)
NO_SHARE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def kill_node(i):
    """SIGKILLs every process in namespace i at once (the node is lost)."""
    return kill_ns(mb.ns(i))


def kill_ns(name):
    """SIGKILLs every process in network namespace `name`; returns how many."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                          text=True).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def sweep(nodes=mb.NODES):
    """Kills whatever is left in the nodes' namespaces (a run's stragglers:
    orphaned workers, agents past the deadline) until nothing is."""
    for _ in range(50):
        if not sum(kill_node(i) for i in range(1, nodes + 1)):
            return
        time.sleep(0.1)


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


class NotReformed(Exception):
    """A run that did not get to a re-formed round; the message says what
    happened (the agents' logs go to failed.log)."""


def reformed(s, n):
    """The first restart round (>= 1) with n workers up: its last start, or None."""
    for k in sorted(r for r in s if r >= 1):
        if len(s[k]) >= n:
            return max(s[k])
    return None


def reform_once(cmds, tmp, victim, deadline_s, python, notes, label):
    """One run: form, SIGKILL node `victim`, time the survivors' re-forming.
    Returns seconds, or raises NotReformed."""
    for f in os.listdir(tmp):
        if f.startswith("agent") or f in ("ts", "stop"):
            os.remove(os.path.join(tmp, f))
    ts = os.path.join(tmp, "ts")
    stop = os.path.join(tmp, "stop")
    os.environ.update(BENCH_STOP=stop, GLOO_SOCKET_IFNAME="eth0", DDPRUN_PYTHON=python,
                      OMP_NUM_THREADS="1")
    nodes = range(1, mb.NODES + 1)
    procs = mb.start_agents(cmds, ts, nodes)
    survivors = [p for i, p in zip(nodes, procs) if i != victim]
    names = [f"n{i}" for i in nodes if i != victim]
    try:
        deadline = time.monotonic() + 180
        while len(mb.starts(ts).get(0, [])) < 2 * mb.NODES:  # waiting on the workers' records
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise NotReformed("round 0 did not form (before any kill): exit statuses "
                                  + ", ".join(f"n{i} {p.poll()}" for i, p in zip(nodes, procs)))
            time.sleep(0.002)
        t_kill = time.monotonic_ns()
        kill_node(victim)
        procs[victim - 1].wait()
        deadline = time.monotonic() + deadline_s
        want = 2 * len(survivors)
        while (t := reformed(mb.starts(ts), want)) is None:
            ended = [p.poll() for p in survivors]
            if all(rc is not None for rc in ended):
                after = (time.monotonic_ns() - t_kill) / 1e9
                raise NotReformed(
                    f"did not re-form (the job ended {after:.0f} s after the kill: exit "
                    "statuses " + ", ".join(f"{n} {rc}" for n, rc in zip(names, ended)) + ")")
            if time.monotonic() > deadline:
                raise NotReformed(
                    f"did not re-form within {deadline_s:.0f} s (agents still running: "
                    + ", ".join(n for n, rc in zip(names, ended) if rc is None) + "; ended: "
                    + (", ".join(f"{n} {rc}" for n, rc in zip(names, ended) if rc is not None)
                       or "none") + ")")
            time.sleep(0.002)
        # The survivors' workers leave together; their agents should end 0.
        open(stop, "w").close()
        end = time.monotonic() + 60
        while any(p.poll() is None for p in survivors) and time.monotonic() < end:
            time.sleep(0.05)
        bad = [f"{n} {p.poll()}" for n, p in zip(names, survivors) if p.poll() != 0]
        if bad:
            notes.append(f"{label}: after the re-formed round was stopped, agents did not "
                         "end 0 within 60 s: " + ", ".join(bad) + " (None: still running, killed)")
            with open(os.path.join(tmp, "failed.log"), "a") as f:
                f.write(f"=== {label} (did not end 0)\n" + mb.logs(tmp))
        return (t - t_kill) / 1e9
    except NotReformed:
        with open(os.path.join(tmp, "failed.log"), "a") as f:
            f.write(f"=== {label} (did not re-form)\n" + mb.logs(tmp))
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        sweep()


def rows_new(ddprun, torchrun, etcd_ep):
    ep = f"10.77.0.1:{mb.PORT}"
    nn = "--nnodes=1:3"
    rows = {
        "ddprun (c10d)": lambda rid: lambda i: as_node(i, [
            ddprun, nn, "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={ep}", f"--rdzv-id={rid}", "--max-restarts=3",
            os.path.join(HERE, "reform_worker.py")]),
        # No token: on etcd it would be etcd's password (our etcd has no auth).
        "ddprun (etcd)": lambda rid: lambda i: as_node(i, [
            "env", "-u", "DDPRUN_RDZV_TOKEN", ddprun, nn, "--nproc-per-node=2",
            "--rdzv-backend=etcd", f"--rdzv-endpoint={etcd_ep}", f"--rdzv-id={rid}",
            "--max-restarts=3", os.path.join(HERE, "reform_worker.py")]),
        "torchrun 2.x (c10d)": lambda rid: lambda i: as_node(i, [
            torchrun, nn, "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={ep}", f"--rdzv_id={rid}",
            f"--rdzv_conf=is_host={1 if i == 1 else 0}", "--max_restarts=3",
            "--monitor_interval=0.1", os.path.join(HERE, "reform_worker.py")]),
        "torchrun 2.x (etcd-v2)": lambda rid: lambda i: as_node(i, [
            torchrun, nn, "--nproc_per_node=2", "--rdzv_backend=etcd-v2",
            f"--rdzv_endpoint={etcd_ep}", f"--rdzv_id={rid}", "--max_restarts=3",
            "--monitor_interval=0.1", os.path.join(HERE, "reform_worker.py")]),
    }
    # torchrun 2.x shares one TCPStore with the workers for every round (made
    # by the first round's rank 0, no per-attempt prefix): a re-formed
    # round's gloo workers can read the last round's addresses and fail
    # ("connection refused"). Its opt-out gives each round a fresh store.
    for backend in ("c10d", "etcd-v2"):
        rows[f"torchrun 2.x ({backend}; {NO_SHARE}=1)"] = (
            lambda make: lambda rid: lambda i: ["env", f"{NO_SHARE}=1"] + make(rid)(i))(
                rows[f"torchrun 2.x ({backend})"])
    return rows


def rows_old(ddprun):
    """The 2026-11-30 table's case (--old)."""
    ep = f"10.77.0.1:{mb.PORT}"
    worker = os.path.join(HERE, "reform_worker.py")
    return {
        "torchrun 1.13 (c10d)": lambda rid: lambda i: as_node(i, [
            SYS_PY, os.path.join(HERE, "torchrun-1.13"), "--nnodes=2:3", "--nproc_per_node=2",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={ep}", f"--rdzv_id={rid}",
            f"--rdzv_conf=is_host={1 if i == 1 else 0},last_call_timeout=1",
            "--max_restarts=1", "--monitor_interval=0.1", worker]),
        "ddprun (c10d)": lambda rid: lambda i: as_node(i, [
            ddprun, "--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={ep}", f"--rdzv-id={rid}",
            "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=3,"
            "last_call_timeout=1,join_timeout=60",
            "--max-restarts=1", "--term-timeout=2", worker]),
    }


def on_sigterm(signum, frame):
    raise KeyboardInterrupt  # unwinds through main's cleanup, as Ctrl-C does


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, ".venv-torch", "bin", "torchrun"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kill", choices=("other", "host"), default="other",
                    help="node 3 (default) or node 1, the c10d store's host")
    ap.add_argument("--deadline", type=float, default=90,
                    help="seconds after the kill for the survivors to re-form")
    ap.add_argument("--repeat-failed", action="store_true",
                    help="repeat a row that did not re-form in its first repetition "
                    "(by default it is run once: a failure costs --deadline)")
    ap.add_argument("--rows", help="only these rows, comma-separated; default all")
    ap.add_argument("--old", action="store_true",
                    help="the 2026-11-30 case: --nnodes=2:3, last_call_timeout=1, torchrun 1.13")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("reform_bench: needs root (ip netns)")
        return 1
    import formation_bench as fb  # etcd in the hub; imported here (it imports us)

    ddprun = os.path.abspath(args.ddprun)
    torchrun = os.path.abspath(args.torchrun)
    venv_py = os.path.join(os.path.dirname(torchrun), "python")
    skipped = {}
    if args.old:
        rows, python, use_etcd = rows_old(ddprun), SYS_PY, False
    else:
        rows, python, use_etcd = rows_new(ddprun, torchrun, fb.ETCD), venv_py, True
        if not os.path.exists(torchrun):
            for name in rows:
                if name.startswith("torchrun"):
                    skipped[name] = f"{torchrun} missing (scripts/setup-torch.sh)"
        elif subprocess.run([venv_py, "-c", "import etcd"],
                            capture_output=True).returncode != 0:
            for name in rows:
                if name.startswith("torchrun 2.x (etcd-v2"):
                    skipped[name] = f"python-etcd does not import in {venv_py}"
        if shutil.which("etcd") is None:
            for name in rows:
                if "etcd" in name:
                    skipped[name] = "no etcd on this machine (Debian's etcd-server)"
        elif not fb.ddprun_has_etcd(ddprun):
            skipped["ddprun (etcd)"] = "this ddprun refuses --rdzv-backend=etcd"
    if args.rows:
        keep = [r.strip() for r in args.rows.split(",")]
        unknown = [r for r in keep if r not in rows]
        if unknown:
            print(f"reform_bench: --rows: unknown {unknown}; rows: {list(rows)}")
            return 2
        rows = {name: make for name, make in rows.items() if name in keep}
    use_etcd = use_etcd and any(("etcd" in n and n not in skipped) for n in rows)
    victim = 1 if args.kill == "host" else mb.NODES
    res = {name: [] for name in rows}
    fails = {name: [] for name in rows}
    notes = []
    tmp = tempfile.mkdtemp(prefix="reform_bench_")
    etcd = None
    load = open("/proc/loadavg").read().split()[:3]
    started = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    signal.signal(signal.SIGTERM, on_sigterm)
    # Ctrl-C too where the shell started us with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        mb.make_net(hub_addr=fb.HUB)
        name_hosts()
        if use_etcd:
            etcd = fb.start_etcd(tmp)
        for rep in range(args.reps):  # interleaved, so drift hits every row alike
            for k, (name, make) in enumerate(rows.items()):
                if name in skipped:
                    continue
                rid = f"r{rep}k{k}{args.kill[0]}{os.getpid()}"
                try:
                    if fails[name] and not res[name] and not args.repeat_failed:
                        continue  # did not re-form in its first repetition
                    t = reform_once(make(rid), tmp, victim, args.deadline, python, notes,
                                    f"rep {rep} {name}")
                    res[name].append(t)
                    print(f"rep {rep} {name}: {t * 1e3:.0f} ms", file=sys.stderr, flush=True)
                except NotReformed as e:
                    fails[name].append(str(e))
                    print(f"rep {rep} {name}: {e}", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip this
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sweep()
        if etcd is not None:
            fb.stop(etcd)
        kill_ns(f"{mb.TAG}-hub")  # etcd, had stop() not ended it
        mb.drop_net()
        unname_hosts()
        if os.path.exists(os.path.join(tmp, "failed.log")):
            keep_log = f"/tmp/reform_bench_failed_{os.getpid()}.log"
            shutil.copy(os.path.join(tmp, "failed.log"), keep_log)
            print(f"agents' logs of the runs that did not re-form: {keep_log}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    load_after = open("/proc/loadavg").read().split()[:3]
    what = {"other": "node 3 (hosts nothing) SIGKILLed", "host": "node 1 (the c10d store's host) SIGKILLed"}[args.kill]
    print(f"reps: {args.reps}, machine: {os.cpu_count()} CPUs, 3 namespaces x 2 workers, "
          f"{'--nnodes=2:3 (--old)' if args.old else '--nnodes=1:3'}, kill: {args.kill}, "
          f"started {started}, ended {time.strftime('%H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(load)} before, {' '.join(load_after)} after\n")
    print(f"| launcher | {what} → 4 survivors' workers in their new group (median, min) "
          "| torchrun / ddprun, same backend (medians) |")
    print("| --- | --- | --- |")
    med = {n: statistics.median(v) for n, v in res.items() if v}
    for name in rows:
        if name in skipped:
            print(f"| {name} | not run: {skipped[name]} | |")
            continue
        v = res[name]
        cell = f"{med[name] * 1e3:.0f} ms, {min(v) * 1e3:.0f} ms" if v else ""
        if fails[name]:
            tried = len(fails[name]) + len(v)
            failed = f"{len(fails[name])} of {tried} run(s) {fails[name][0]}"
            cell = f"{cell}; {failed}" if cell else failed
        ratio = ""
        if name.startswith("torchrun") and name in med:
            # the ddprun row of the same backend: c10d with c10d, etcd-v2 with etcd
            peer = "ddprun (c10d)" if "(c10d" in name else "ddprun (etcd)"
            if peer in med:
                ratio = f"{med[name] / med[peer]:.1f} (vs {peer})"
        print(f"| {name} | {cell} | {ratio} |")
    for n in sorted(set(notes)):
        print(f"\nnote: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

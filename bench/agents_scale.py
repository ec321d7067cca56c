#!/usr/bin/python3
"""N real ddprun agents on 127.0.0.1, one trivial worker each: how long a job
of N nodes takes to form, and where that time goes (issue 24).

Every agent is build/bin/ddprun with --nnodes=N --nproc-per-node=1
--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT; agent 0 is started first
with is_host=true (it hosts the store), the others with is_host=false, as on
N machines where only the host owns the endpoint's address. The worker is
bench/multinode_worker.c: it appends its CLOCK_MONOTONIC on entry to
$BENCH_TS, then ("fifo", the default) stays until the bench closes its end
of the FIFO $BENCH_STOP once every worker has started, as a training job's
workers would, or ("launch") exits at once, so early agents run their exit
barrier while later ones still form. All on loopback: no network namespaces.

Measured from t0, just before the first agent is started:
  formation_s   the last worker running (every worker of the job started)
  started_s     the last agent exec'd (its Popen returned: fork + exec done)
Each agent's phases, from $DDPRUN_PHASE_TRACE (one line a phase, written by
agents that have the trace points; an older ddprun writes none and only the
columns it can give are filled):
  main          ddprun's main() entered
  store         the store reachable (host: serving; others: the probe's
                connection greeted and authenticated)
  connected     the rendezvous' connections made
  join          the join of round 0 begins (the agent's set-up done)
  round         the round held (group rank known)
  watching      its keep-alive armed and running
  spawning      the attempt starts its worker
  spawned       the worker forked and exec'd and the hooks told (an older
                ddprun: events.jsonl's "rendezvous" event, written then)
  worker        the worker's own first instruction ($BENCH_TS)
For each phase: when the last agent reached it (max, seconds from t0) and
the median. `rdzv_tail_s` = last round - last join: what the rendezvous
costs once every node has asked (the protocol's own share; the rest is
start-up). Per-agent medians of the gaps (main -> join: connections; join
-> round: waiting for the others; round -> worker: spawn).
CPU: user + sys of every agent and its worker (wait4's rusage), in all and
for the store's host alone; the whole run, through the exit hand-shake.
With "fifo" workers, exit_s: from the FIFO's close to the last agent gone
(the workers' exits, the exit barrier, the hand-shake). store_warnings: the
store host's warnings (refused connections: every agent connects from
127.0.0.1, and the store takes at most 64 unauthenticated connections from
one address), shown and held back, from agent 0's output.

Usage: /usr/bin/python3 bench/agents_scale.py [--ddprun build/bin/ddprun]
           [--sizes 16,64,128,256] [--reps 1] [--port 29700] [--label NAME]
           [--worker fifo|launch] [--tmp DIR] [--keep]
Prints one JSON object per run (raises RLIMIT_NOFILE to its hard limit, and
says so in the first line).
"""
import argparse
import json
import os
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEADLINE_S = 300


def build_worker(tmp):
    exe = os.path.join(tmp, "worker")
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "multinode_worker.c")],
                   check=True)
    return exe


def read_trace(path):
    """{pid: {phase: ns}} and {pid: group rank} from the agents' trace lines
    "<pid> <ns> <phase> [rank=<r>]"."""
    phases, ranks = {}, {}
    if not os.path.exists(path):
        return phases, ranks
    for line in open(path):
        f = line.split()
        if len(f) < 3:
            continue
        pid, ns, phase = int(f[0]), int(f[1]), f[2]
        phases.setdefault(pid, {}).setdefault(phase, ns)
        for extra in f[3:]:
            if extra.startswith("rank="):
                ranks[pid] = int(extra[5:])
    return phases, ranks


def spawned_events(logdirs):
    """{group rank: ns} from each agent's events.jsonl 'rendezvous' event."""
    out = {}
    for d in logdirs:
        for root, _, files in os.walk(d):
            if "events.jsonl" not in files:
                continue
            for line in open(os.path.join(root, "events.jsonl")):
                e = json.loads(line)
                if e.get("event") == "rendezvous" and e.get("attempt") == 0:
                    out[e["group_rank"]] = int(e["monotonic_s"] * 1e9)
    return out


def fs_of(path):
    """'<path> (<fstype>)' from /proc/self/mounts: the agents' files' cost
    depends on it (an ext4 without a journal scans recently deleted inodes
    on every create)."""
    best, fstype = "", "?"
    for line in open("/proc/self/mounts"):
        f = line.split()
        if (path + "/").startswith(f[1].rstrip("/") + "/") and len(f[1]) >= len(best):
            best, fstype = f[1], f[2]
    return f"{path} ({fstype})"


def wait_workers(ts, n, procs, deadline):
    """Until $BENCH_TS holds n lines. The workers give no other signal, so
    this looks at its size every 5 ms (a stat: no CPU to speak of); an agent
    that exits first ends the wait."""
    while time.monotonic() < deadline:
        try:
            with open(ts) as f:
                if sum(1 for _ in f) >= n:
                    return
        except FileNotFoundError:
            pass
        if any(p.poll() is not None for p in procs):
            return
        time.sleep(0.005)
    raise TimeoutError(f"not every worker started within {DEADLINE_S} s")


def reap(procs, deadline):
    """Waits for every agent (pidfds, no polling); returns {pid: (status,
    user+sys s)}. Past the deadline: SIGTERM, 10 s, SIGKILL, and raises."""
    fds = {os.pidfd_open(p.pid): p for p in procs}
    done = {}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        while len(done) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(procs) - len(done)} agents still running after "
                                   f"{DEADLINE_S} s")
            for fd, _ in poller.poll(left * 1000):
                p = fds[fd]
                _, status, ru = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)  # Popen must not reap it again
                done[p.pid] = (p.returncode, ru.ru_utime + ru.ru_stime)
                poller.unregister(fd)
    except BaseException:
        for p in procs:
            if p.pid not in done and p.returncode is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        for p in procs:
            if p.pid not in done and p.returncode is None:
                try:
                    p.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return done


def run_once(ddprun, n, port, worker, mode, tmp, run_id):
    d = os.path.join(tmp, run_id)
    os.makedirs(d)
    ts, trace, stop = os.path.join(d, "ts"), os.path.join(d, "trace"), os.path.join(d, "stop")
    os.mkfifo(stop)
    hold = os.open(stop, os.O_RDWR)  # the workers' open never blocks; closing it ends them
    env = dict(os.environ, BENCH_TS=ts, BENCH_STOP=stop, DDPRUN_PHASE_TRACE=trace,
               DDPRUN_RDZV_TOKEN="bench-token")
    # The agents' private folders, registry and logs: all below d, so the
    # filesystem measured is the one --tmp names, whatever the caller's.
    env.update(XDG_RUNTIME_DIR=d, TMPDIR=d, DDPRUN_REGISTRY_DIR=os.path.join(d, "agents"))
    logdirs = [os.path.join(d, f"logs{i}") for i in range(n)]
    procs, started = [], []
    load = os.getloadavg()[0]
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic_ns()
    try:
        for i in range(n):
            out = open(os.path.join(d, f"agent{i}.out"), "w")
            procs.append(subprocess.Popen(
                [ddprun, f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
                 f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}",
                 f"--log-dir={logdirs[i]}", worker, mode],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            out.close()
            started.append(time.monotonic_ns())  # Popen returns once exec succeeded
        if mode == "fifo":
            wait_workers(ts, n, procs, time.monotonic() + DEADLINE_S)
    finally:
        t_stop = time.monotonic_ns()
        os.close(hold)
        done = reap(procs, time.monotonic() + DEADLINE_S)
        t_exit = time.monotonic_ns()
    bad = [i for i, p in enumerate(procs) if done[p.pid][0] != 0]
    if bad:
        i = bad[0]
        raise RuntimeError(f"agent {i} of {n} exited {done[procs[i].pid][0]}:\n"
                           + open(os.path.join(d, f"agent{i}.out")).read()[-3000:])
    warnings = 0
    for line in open(os.path.join(d, "agent0.out")):
        if "ddprun: store: " in line:
            held = line.split("store: ")[1].split(" more warnings like")
            warnings += int(held[0]) if len(held) == 2 and held[0].isdigit() else 1
    workers = {}
    for line in open(ts):
        _, rank, t, what = line.split()
        workers[int(rank)] = int(t)
    if len(workers) != n:
        raise RuntimeError(f"{len(workers)} workers started, expected {n}")
    phases, ranks = read_trace(trace)
    spawned = spawned_events(logdirs)
    pid_of_rank = {r: pid for pid, r in ranks.items()}
    for r, t in spawned.items():  # an older ddprun marks no "spawned"
        if r in pid_of_rank:
            phases[pid_of_rank[r]].setdefault("spawned", t)
    spawned = {r: phases[pid]["spawned"] for r, pid in pid_of_rank.items()
               if "spawned" in phases[pid]} or spawned

    def s(ns):
        return round((ns - t0) / 1e9, 4)

    def col(values):
        values = sorted(values)
        if len(values) < n:
            return None
        return {"last_s": s(values[-1]), "median_s": s(statistics.median(values))}

    per = {ph: [p[ph] for p in phases.values() if ph in p]
           for ph in ("main", "store", "connected", "join", "round", "watching", "spawning")}
    split = {"started": col(started), **{ph: col(v) for ph, v in per.items()},
             "spawned": col(spawned.values()), "worker": col(workers.values())}

    def gaps(a, b):
        g = [p[b] - p[a] for p in phases.values() if a in p and b in p]
        return round(statistics.median(g) / 1e9, 4) if len(g) == n else None

    worker_gap = [workers[r] - phases[pid]["round"] for pid, r in ranks.items()
                  if "round" in phases[pid] and r in workers]
    exec_main = [phases[p.pid]["main"] - t for p, t in zip(procs, started)
                 if "main" in phases.get(p.pid, {})]
    cpu = [done[p.pid][1] for p in procs]
    rdzv_tail = (split["round"]["last_s"] - split["join"]["last_s"]
                 if split["round"] and split["join"] else None)
    return {
        "n": n, "ddprun": ddprun, "version": subprocess.run(
            [ddprun, "--version"], capture_output=True, text=True).stdout.strip(),
        "date": date,
        "load_1min_before": round(load, 2), "load_1min_after": round(os.getloadavg()[0], 2),
        "formation_s": s(max(workers.values())),
        "started_s": s(max(started)),
        "rdzv_tail_s": round(rdzv_tail, 4) if rdzv_tail is not None else None,
        "worker_mode": mode, "tmp": fs_of(tmp),
        "exit_s": round((t_exit - t_stop) / 1e9, 4) if mode == "fifo" else None,
        "split": split,
        "agent_median_gaps_s": {
            "exec_to_main": (round(statistics.median(exec_main) / 1e9, 4)
                             if len(exec_main) == n else None),
            "main_to_store": gaps("main", "store"),
            "store_to_connected": gaps("store", "connected"),
            "connected_to_join": gaps("connected", "join"),
            "join_to_round": gaps("join", "round"),
            "round_to_watching": gaps("round", "watching"),
            "watching_to_spawning": gaps("watching", "spawning"),
            "spawning_to_spawned": gaps("spawning", "spawned"),
            "round_to_worker": (round(statistics.median(worker_gap) / 1e9, 4)
                                if len(worker_gap) == n else None)},
        "store_warnings": warnings,
        "cpu_s": {"agents_total": round(sum(cpu), 3), "host": round(cpu[0], 3),
                  "per_agent_median": round(statistics.median(cpu), 4)},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    ap.add_argument("--sizes", default="16,64,128,256")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--port", type=int, default=29700, help="first store port; +1 a run")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    ap.add_argument("--worker", choices=("fifo", "launch"), default="fifo",
                    help="fifo: workers run until every one has started; launch: exit at once")
    ap.add_argument("--tmp", help="the folder below which the bench makes its own: the "
                    "agents' XDG_RUNTIME_DIR, TMPDIR, registry and --log-dir (default: $TMPDIR "
                    "or /tmp; /dev/shm: a tmpfs)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sizes = [int(x) for x in args.sizes.split(",")]
    ddprun = os.path.abspath(args.ddprun)
    tmp = tempfile.mkdtemp(prefix="agents_scale_", dir=args.tmp)
    print(json.dumps({"note": f"RLIMIT_NOFILE raised from {soft} to {hard}", "cpus":
                      os.cpu_count(), "tmp": tmp if args.keep else None}), flush=True)
    try:
        worker = build_worker(tmp)
        port = args.port
        for rep in range(args.reps):
            for n in sizes:
                r = run_once(ddprun, n, port, worker, args.worker, tmp, f"as{rep}n{n}")
                r["label"], r["rep"] = args.label, rep
                print(json.dumps(r), flush=True)
                port += 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real Prometheus (Debian's prometheus) scrapes a running 2-rank job's
--metrics-port every second; the series are read back through its HTTP API
(one ddprun_worker_step series per rank, the job's counters, the agent's
own CPU), and `promtool check metrics` lints the exposition. A second job
asking for the same port ends with status 1 before its worker starts.

Run by ctest: prometheus_test.py <ddprun> <artifacts folder>. Exit 77
(skipped) without prometheus or promtool (scripts/setup-test.sh). The
exposition goes to <artifacts>/metrics.txt. Waits are polls against
deadlines (Prometheus stores a scrape when it does); ~10 s, mostly
Prometheus starting.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Job, ensure_dir, free_port, poll, worker  # noqa: E402

DEADLINE_S = 120


def fetch(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


def query(prom_port, expr):
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = fetch(url)
    if body is None:
        return None
    reply = json.loads(body)
    return reply["data"]["result"] if reply.get("status") == "success" else None


def start_prometheus(tmp, target):
    """Prometheus on a free port; a port taken between the pick and the
    bind is another try."""
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: ddprun\n    static_configs:\n"
                f"      - targets: ['{target}']\n")
    for attempt in range(3):
        port = free_port()
        log = open(os.path.join(tmp, f"prometheus{attempt}.log"), "w")
        proc = subprocess.Popen(
            [shutil.which("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(tmp, f'tsdb{attempt}')}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        ready = poll(lambda: proc.poll() is not None or
                     fetch(f"http://127.0.0.1:{port}/-/ready", 2) is not None, 60)
        if ready and proc.poll() is None:
            return proc, port
        proc.kill()
        proc.wait()
    raise SystemExit("FAILED: prometheus did not start (see prometheus*.log in " + tmp + ")")


def check_series(prom_port):
    """The problems with what Prometheus stored; [] once all is there."""
    problems = []
    steps = query(prom_port, "ddprun_worker_step") or []
    ranks = sorted(s["metric"].get("rank") for s in steps)
    if ranks != ["0", "1"]:
        problems.append(f"ddprun_worker_step: ranks {ranks}, expected ['0', '1']")
    for expr, want in [("ddprun_nodes", 1), ('up{job="ddprun"}', 1), ("ddprun_restarts_total", 0),
                       ("ddprun_hangs_total", 0)]:
        got = query(prom_port, expr) or []
        if len(got) != 1 or float(got[0]["value"][1]) != want:
            problems.append(f"{expr}: {got}, expected one series of value {want}")
    for expr in ["ddprun_worker_steps_per_second", "ddprun_worker_cpu_seconds_total",
                 "ddprun_worker_resident_memory_bytes", "ddprun_hang_culprit_total"]:
        got = query(prom_port, expr) or []
        if len(got) != 2:
            problems.append(f"{expr}: {len(got)} series, expected one per rank")
    if not query(prom_port, "process_cpu_seconds_total"):
        problems.append("process_cpu_seconds_total (the agent's): missing")
    return problems


def check_port_in_use(ddprun, tmp, port):
    """A second job asking for the same port ends with status 1 before any
    worker starts, naming the port; None when it does."""
    marker = os.path.join(tmp, "second-job-started")
    second = subprocess.run([ddprun, f"--metrics-port={port}", f"--log-dir={tmp}/logs2",
                             "/usr/bin/python3", "-c", f"open({marker!r}, 'w')"],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if second.returncode != 1 or f"port {port}" not in second.stderr or os.path.exists(marker):
        return (f"a second job on the same port: status {second.returncode}, worker started: "
                f"{os.path.exists(marker)}, stderr:\n{second.stderr}")
    return None


def main():
    ddprun, artifacts = sys.argv[1], ensure_dir(sys.argv[2])
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        print("SKIP: prometheus/promtool are not installed (scripts/setup-test.sh)")
        return 77
    worker_py = worker("steady_worker.py")
    with tempfile.TemporaryDirectory(prefix="ddprun-prom-") as tmp:
        stop = os.path.join(tmp, "stop")
        job = Job([ddprun, "--nproc-per-node=2", "--metrics-port=0", f"--log-dir={tmp}/logs",
                   "/usr/bin/python3", worker_py, "--until", stop])
        prom = None
        try:
            m = job.wait_line(r"metrics at (http://127\.0\.0\.1:(\d+)/metrics)", DEADLINE_S)
            if not m:
                print("FAILED: ddprun never said where its metrics are:\n" + job.stderr())
                return 1
            url, port = m.group(1), m.group(2)
            # Both ranks have beaten: their step series exist.
            text = poll(lambda: (lambda t: t if t and t.count("ddprun_worker_step{") == 2 else None)(
                fetch(url)), DEADLINE_S)
            if not text:
                print("FAILED: the exposition never had both ranks' steps:\n" + str(fetch(url)))
                return 1
            path = os.path.join(artifacts, "metrics.txt")
            with open(path, "w") as f:
                f.write(text)
            lint = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                                  capture_output=True, timeout=60)
            if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
                print(f"FAILED: promtool check metrics (status {lint.returncode}):\n"
                      f"{lint.stdout}{lint.stderr}")
                return 1
            problem = check_port_in_use(ddprun, tmp, port)
            if problem:
                print("FAILED: " + problem)
                return 1
            prom, prom_port = start_prometheus(tmp, f"127.0.0.1:{port}")
            problems = []

            def stored():
                problems[:] = check_series(prom_port)
                return not problems

            if not poll(stored, DEADLINE_S, 0.5):
                print("FAILED: what Prometheus stored:\n" + "\n".join(problems))
                return 1
        finally:
            open(stop, "w").close()
            status = job.finish(60)
            if prom:
                prom.send_signal(signal.SIGTERM)
                try:
                    prom.wait(30)
                except subprocess.TimeoutExpired:
                    prom.kill()
                    prom.wait()
        if status != 0:
            print(f"FAILED: the job ended with status {status}:\n" + job.stderr())
            return 1
    print("ok: Prometheus scraped both ranks' series; promtool check metrics is clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())

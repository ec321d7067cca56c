"""`ddprun report` of a real run with a hang and a restart, opened in
headless Chromium (Debian's chromium): rank 1 stops beating in attempt 0,
the watchdog blames it (--heartbeat-timeout), the group restarts and
attempt 1 runs to the end. The DOM Chromium rendered must name rank 1 as
the culprit, count 1 restart and hold one timeline per rank; its
screenshot is saved as <artifacts>/report.png (docs/observability.png is
one). While attempt 1 still runs, the job's metrics count the hang, the
restart and the culprit, and a report of the running job says "running".
Bad input: a folder without events.jsonl is one line naming it, exit
status 1.

Run by ctest: report_chromium_test.py <ddprun> <artifacts folder>. Exit 77
(skipped) without chromium (scripts/setup-test.sh). ~15 s: the job waits
out its heartbeat timeout, Chromium starts twice.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Job, ensure_dir, fetch, poll, worker  # noqa: E402

DEADLINE_S = 180


def chromium():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def browse(browser, profile, extra, page):
    # Root in a container needs --no-sandbox; a profile of its own keeps
    # runs apart; nothing is fetched (the page is self-contained).
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}", "--window-size=1280,1200"] + extra + ["file://" + page]
    return subprocess.run(args, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def check_dom(dom):
    problems = []
    culprit = re.search(r'id="culprit" data-rank="(-?\d+)"', dom)
    if not culprit or culprit.group(1) != "1":
        problems.append(f"culprit: {culprit.group(0) if culprit else 'no #culprit'}, expected rank 1")
    restarts = re.search(r'id="restarts">(\d+)<', dom)
    if not restarts or restarts.group(1) != "1":
        problems.append(f"restarts: {restarts.group(1) if restarts else 'no #restarts'}, expected 1")
    timelines = sorted(re.findall(r'class="timeline[^"]*" data-rank="(\d+)"', dom))
    if timelines != ["0", "1"]:
        problems.append(f"timelines for ranks {timelines}, expected ['0', '1']")
    if dom.count("<polyline") < 3:  # rank 0 in two attempts, rank 1 in at least one
        problems.append("fewer than 3 step lines in the timelines")
    return problems


def check_running(job, tmp, ddprun):
    """While attempt 1 runs: the metrics count the hang, its culprit and
    the restart, and the report of the running job says so. [] when right."""
    m = job.wait_line(r"metrics at (http://\S+)", DEADLINE_S)
    if not m:
        return ["ddprun never said where its metrics are"]
    url = m.group(1)
    text = poll(lambda: (lambda t: t if t and "\nddprun_restarts_total 1\n" in t else None)(
        fetch(url)), DEADLINE_S)
    if not text:
        return [f"the metrics never counted the restart:\n{fetch(url)}"]
    problems = [f"metrics: no line {want!r}" for want in
                ["\nddprun_hangs_total 1\n", '\nddprun_hang_culprit_total{rank="1"} 1\n',
                 '\nddprun_hang_culprit_total{rank="0"} 0\n', "\nddprun_last_hang_culprit_rank 1\n",
                 "\nddprun_attempt 1\n"] if want not in text]
    runs = glob.glob(os.path.join(tmp, "logs", "*", "events.jsonl"))
    page = os.path.join(tmp, "running.html")
    made = subprocess.run([ddprun, "report", os.path.dirname(runs[0]) if runs else tmp, "-o", page],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        return problems + [f"report of the running job: status {made.returncode}: {made.stderr}"]
    with open(page) as f:
        if 'id="status">running<' not in f.read():
            problems.append("the running job's report does not say running")
    return problems


def main():
    ddprun, artifacts = sys.argv[1], ensure_dir(sys.argv[2])
    browser = chromium()
    if not browser:
        print("SKIP: chromium is not installed (scripts/setup-test.sh)")
        return 77
    worker_py = worker("hang_then_finish.py")
    with tempfile.TemporaryDirectory(prefix="ddprun-report-") as tmp:
        go_on = os.path.join(tmp, "go-on")
        job = Job([ddprun, "--nproc-per-node=2", "--max-restarts=1", "--heartbeat-timeout=3",
                   "--progress-interval=1", f"--log-dir={tmp}/logs", "--metrics-port=0",
                   "/usr/bin/python3", worker_py, "--steps", "60", "--until", go_on])
        try:
            problems = check_running(job, tmp, ddprun)
        finally:
            open(go_on, "w").close()
        status = job.finish(DEADLINE_S)
        if problems:
            print("FAILED: while attempt 1 ran:\n" + "\n".join(problems))
            return 1
        if status != 0:
            print(f"FAILED: the job ended with status {status} (expected a hang, a restart, then 0):\n"
                  + job.stderr())
            return 1
        runs = glob.glob(os.path.join(tmp, "logs", "*", "events.jsonl"))
        if len(runs) != 1:
            print(f"FAILED: expected one run folder, found {runs}")
            return 1
        run_dir = os.path.dirname(runs[0])
        shutil.copy(runs[0], os.path.join(artifacts, "events.jsonl"))
        page = os.path.join(artifacts, "report.html")
        made = subprocess.run([ddprun, "report", run_dir, "-o", page], capture_output=True,
                              text=True, timeout=60)
        if made.returncode != 0:
            print(f"FAILED: ddprun report: status {made.returncode}: {made.stderr}")
            return 1
        bad = subprocess.run([ddprun, "report", tmp, "-o", os.path.join(tmp, "x.html")],
                             capture_output=True, text=True, timeout=60)
        if bad.returncode != 1 or bad.stderr.count("\n") != 1 or "events.jsonl" not in bad.stderr:
            print(f"FAILED: a folder without events.jsonl: status {bad.returncode}, "
                  f"stderr {bad.stderr!r} (expected 1 and one line naming events.jsonl)")
            return 1
        profile = os.path.join(tmp, "chromium")
        dom = browse(browser, profile, ["--dump-dom"], page)
        if dom.returncode != 0:
            print(f"FAILED: chromium --dump-dom: status {dom.returncode}\n{dom.stderr[-2000:]}")
            return 1
        with open(os.path.join(artifacts, "report.dom.html"), "w") as f:
            f.write(dom.stdout)
        problems = check_dom(dom.stdout)
        if problems:
            print("FAILED: the rendered page:\n" + "\n".join(problems))
            return 1
        shot = os.path.join(artifacts, "report.png")
        if os.path.exists(shot):
            os.remove(shot)
        taken = browse(browser, profile, [f"--screenshot={shot}"], page)
        with open(shot, "rb") if os.path.exists(shot) else open(os.devnull, "rb") as f:
            head = f.read(8)
        if taken.returncode != 0 or head != b"\x89PNG\r\n\x1a\n":
            print(f"FAILED: chromium --screenshot: status {taken.returncode}, "
                  f"no PNG at {shot}\n{taken.stderr[-2000:]}")
            return 1
    print(f"ok: the report names rank 1 as the culprit, 1 restart, 2 timelines; screenshot {shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

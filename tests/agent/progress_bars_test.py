"""Two ranks' progress bars on a real terminal: tmux (a terminal emulator)
runs ddprun in an 80x30 window; rank 0 also logs lines between its bar's
updates (console_worker.py bars). The screen, history included, must end
with exactly one line per rank's bar showing its final value, cut to the
width, with no stale characters, no "[...] " marker, and nothing wrapped.

Run by ctest with /usr/bin/python3 (the workers are plain python3 from
PATH, no torch): progress_bars_test.py <ddprun>. Exit 77 (skipped) without
tmux (scripts/setup-test.sh installs it). Mostly waits for the job (~2 s).
"""
import os
import shutil
import subprocess
import sys
import time

COLS, ROWS, STEPS = 80, 30, 40
DEADLINE_S = 120


def main():
    ddprun = sys.argv[1]
    tmux = shutil.which("tmux")
    if not tmux:
        print("SKIP: tmux is not installed (scripts/setup-test.sh)")
        return 77
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers",
                          "console_worker.py")
    server = f"ddprun-bars-{os.getpid()}"
    base = [tmux, "-L", server, "-f", "/dev/null"]
    job = (f"{ddprun} --nproc-per-node=2 {worker} bars {STEPS}; "
           f"echo DONE-$?; exec sleep {DEADLINE_S}")
    subprocess.run(base + ["new-session", "-d", "-s", "t", "-x", str(COLS), "-y", str(ROWS),
                           job], check=True)
    try:
        screen = ""
        until = time.monotonic() + DEADLINE_S
        # No event tells that the pane has printed a line: poll the screen.
        while time.monotonic() < until:
            screen = subprocess.run(base + ["capture-pane", "-p", "-S", "-", "-t", "t"],
                                    check=True, capture_output=True, text=True).stdout
            if "DONE-" in screen:
                break
            time.sleep(0.05)
        return check(screen)
    finally:
        subprocess.run(base + ["kill-server"], check=False)


def check(screen):
    print(screen)
    failures = []
    if "DONE-0" not in screen:
        failures.append("the job did not end with status 0 before the deadline")
    lines = screen.splitlines()
    for rank in (0, 1):
        bar = [l for l in lines if f"]:bar rank={rank} " in l]
        want = (f"[default{rank}]:bar rank={rank} {STEPS}/{STEPS} |{'#' * STEPS}| xxxxx")
        if bar != [want]:
            failures.append(f"rank {rank}: bar lines {bar!r}, want exactly [{want!r}]")
    logs = [l for l in lines if l.startswith("[default0]:log rank=0 step=")]
    if len(logs) != STEPS // 3 + 1:
        failures.append(f"{len(logs)} log lines of rank 0, want {STEPS // 3 + 1}")
    for l in lines:
        # A wrapped line continues with the bar's tail; a marked one shows [...].
        if l.startswith("x") or "[...]" in l or len(l) >= COLS:
            failures.append(f"wrapped, marked or too wide: {l!r}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers of the observe tests' Python side: running ddprun with its
stderr read on a thread, polling a condition against a deadline, a free
loopback port. Stdlib only."""
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request


class Job:
    """ddprun ARGS, its stderr collected line by line on a thread (a pipe
    nobody reads would stall the agent's console writer)."""

    def __init__(self, args, env=None):
        self.lines = []
        self._cv = threading.Condition()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.lines.append(None)  # EOF
            self._cv.notify_all()

    def wait_line(self, pattern, deadline_s):
        """The first match of `pattern` in a stderr line, or None at the
        deadline or when ddprun's stderr ends."""
        rx = re.compile(pattern)
        until = time.monotonic() + deadline_s
        with self._cv:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if line is None:
                        return None
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = until - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)

    def stderr(self):
        with self._cv:
            return "\n".join(l for l in self.lines if l is not None)

    def finish(self, deadline_s):
        try:
            return self.proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def poll(check, deadline_s, interval_s=0.2):
    """check() until it returns something true, or None at the deadline.
    Polling a state the test cannot be told about (a scrape stored), never
    a fixed sleep standing for it."""
    until = time.monotonic() + deadline_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= until:
            return None
        time.sleep(interval_s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_dir(path):
    os.makedirs(path, exist_ok=True)
    return path


def fetch(url):
    """The body at url, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    except OSError:
        return None


def worker(name):
    """The path of tests/observe/workers/<name>."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", name)

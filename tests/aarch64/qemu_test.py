"""The aarch64 ddprun under qemu-user (ctest aarch64.qemu, label aarch64).

scripts/build-aarch64.sh cross-builds ddprun into build-aarch64/; this runs
that binary with qemu-aarch64 on the x86-64 machine (libc6:arm64's loader;
not -L /usr/aarch64-linux-gnu: scripts/aarch64-linux-gnu.cmake says why)
and checks what a user sees first: --version, a two-worker launch with
torchrun's environment, a crashed worker's group restarted, and a
hung worker found (heartbeats stopped; output stopped), each within a
deadline. The workers are host programs (/usr/bin/python3,
qemu_worker.py): qemu-user hands ddprun's execve to the kernel, so only
the agent is emulated, which is what is under test.

What does not work under qemu-user, and why (README "aarch64"):
  - native stacks from eu-stack or gdb: ddprun starts helper programs with
    clone() and no exit signal (base/subprocess.cc), which qemu-user
    refuses (EINVAL, "custom termination signals"); stack capture falls
    back to the kernel's /proc view. A Python worker's own stacks
    (faulthandler, checked here) need no helper;
  - the stdin forwarder's "which rank waits in read(0)": ddprun compares
    /proc/<pid>/syscall with aarch64's SYS_read (63), and an x86-64 worker
    reports x86-64's (0). On an aarch64 machine both are aarch64's.
Skipped (77) when the cross-built ddprun or qemu-aarch64 is missing.

Usage: qemu_test.py SOURCE_DIR [DDPRUN]   (default SOURCE_DIR/build-aarch64/bin/ddprun)
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "install"))
from common import Failed, finish, run_main  # noqa: E402

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "qemu_worker.py")
# The loader the aarch64 binaries name, from libc6:arm64.
AARCH64_LOADER = "/lib/ld-linux-aarch64.so.1"
EM_AARCH64 = 183  # ELF e_machine


def elf_machine(path):
    with open(path, "rb") as f:
        header = f.read(20)
    if header[:4] != b"\x7fELF":
        return None
    return int.from_bytes(header[18:20], "little")


class Runner:
    def __init__(self, qemu, ddprun, work):
        self.qemu, self.ddprun, self.work = qemu, ddprun, work

    def run(self, args, deadline_s):
        """ddprun ARGS under qemu, to its end within deadline_s: (status, stdout, stderr, seconds).
        Its own session, so a deadline kills qemu and whatever it started."""
        env = dict(os.environ, DDPRUN_PYTHON="/usr/bin/python3", PYTHONDONTWRITEBYTECODE="1")
        argv = [self.qemu, self.ddprun] + args
        start = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=self.work, start_new_session=True)
        try:
            out, err = p.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise Failed(f"ddprun {' '.join(args)}: still running after its {deadline_s} s deadline\n"
                         f"stdout:\n{out[-2000:]}\nstderr:\n{err[-2000:]}")
        return p.returncode, out, err, time.monotonic() - start


def expect(errors, case, cond, what, out, err):
    if not cond:
        errors.append(f"{case}: {what}\n--- stdout:\n{out[-2000:]}\n--- stderr:\n{err[-2000:]}")


def case_version(r, src, errors):
    version = re.search(r"project\(ddprun VERSION ([0-9.]+)", open(os.path.join(src, "CMakeLists.txt")).read())[1]
    status, out, err, secs = r.run(["--version"], 60)
    expect(errors, "--version", status == 0 and out.startswith(f"ddprun {version} "),
           f"exit {status}, want 0 and 'ddprun {version} ...'", out, err)
    return f"--version {secs:.2f} s"


def case_launch(r, errors):
    status, out, err, secs = r.run(["--nproc-per-node=2", WORKER, "env"], 120)
    expect(errors, "launch", status == 0, f"exit {status}, want 0", out, err)
    for rank in (0, 1):
        want = f"LOCAL_RANK={rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR="
        line = [l for l in out.splitlines() if f"env " in l and f"rank={rank} " in l]
        expect(errors, "launch", len(line) == 1 and want in line[0],
               f"rank {rank}: want one 'env' line with {want}", out, err)
    return f"two workers {secs:.2f} s"


def case_restart(r, errors):
    status, out, err, secs = r.run(["--nproc-per-node=2", "--max-restarts=1", "--term-timeout=5",
                                    WORKER, "crash-first"], 120)
    expect(errors, "restart", status == 0, f"exit {status}, want 0", out, err)
    for rank in (0, 1):
        for restart in (0, 1):
            expect(errors, "restart", f"start rank={rank} restart={restart}" in out,
                   f"no 'start rank={rank} restart={restart}'", out, err)
    expect(errors, "restart", "failed with exit code 3; restarting the group (restart 1 of 1)" in err,
           "no restart line naming exit code 3", out, err)
    return f"crash restart {secs:.2f} s"


def case_hang(r, flags, mode, kind, errors):
    logs = os.path.join(r.work, f"logs-{mode}")
    # --stack-capture=none: no live stack dump. qemu-user renumbers the
    # real-time signals of the emulated ddprun, so the stack signal it sends
    # (SIGRTMIN+6) reaches these host-architecture workers as another one,
    # which kills them; on real aarch64 both sides agree. faulthandler's
    # SIGABRT at teardown (a standard signal, not renumbered) still gives
    # the Python stacks.
    status, out, err, secs = r.run(["--nproc-per-node=2", f"--log-dir={logs}",
                                    "--heartbeat-grace=30", "--stack-capture=none"] + flags +
                                   [WORKER, mode], 120)
    case = f"hang ({mode})"
    expect(errors, case, status == 124, f"exit {status}, want 124", out, err)
    expect(errors, case, "freeze: rank 1 is the culprit" in err, "no 'freeze: rank 1 is the culprit'", out, err)
    expect(errors, case, f"rank 1 (pid " in err and kind in err, f"no hang line for rank 1 naming {kind}", out, err)
    expect(errors, case, "Stacks: rank 1 (python_faulthandler)" in err, "no Python stacks of rank 1", out, err)
    reports = [os.path.join(d, "hang_report.txt") for d, _, files in os.walk(logs) if "hang_report.txt" in files]
    expect(errors, case, len(reports) == 1, f"want one hang_report.txt under {logs}, got {reports}", out, err)
    return f"{mode} {secs:.2f} s"


def main():
    src = os.path.abspath(sys.argv[1])
    ddprun = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(src, "build-aarch64/bin/ddprun"))
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not os.path.exists(ddprun):
        print(f"skipped: no {ddprun} (scripts/build-aarch64.sh builds it)")
        return 77
    if not qemu or not os.path.exists(AARCH64_LOADER):
        print(f"skipped: no qemu-aarch64 or no {AARCH64_LOADER} (scripts/build-aarch64.sh --packages)")
        return 77
    if elf_machine(ddprun) != EM_AARCH64:
        raise Failed(f"{ddprun} is not an aarch64 ELF (e_machine {elf_machine(ddprun)})")
    errors, timings = [], []
    with tempfile.TemporaryDirectory(prefix="ddprun-qemu-") as work:
        r = Runner(qemu, ddprun, work)
        timings.append(case_version(r, src, errors))
        timings.append(case_launch(r, errors))
        timings.append(case_restart(r, errors))
        timings.append(case_hang(r, ["--heartbeat-timeout=2"], "stop-beats", "heartbeat_timeout", errors))
        timings.append(case_hang(r, ["--silence-timeout=2"], "go-silent", "silence", errors))
    finish(errors, f"{ddprun} under {qemu}: " + ", ".join(timings))


if __name__ == "__main__":
    run_main(main)

"""examples/rank_recovery.py recovering from a SIGKILLed rank, with this test
playing ddprun's agent (docs/RECOVERY.md): no ddprun binary involved.

    rank_recovery_harness_test.py <examples folder> <python path> <venv python> <work> [scenario...]

The driver is Debian's /usr/bin/python3, stdlib only; the store helper and
the ranks run the torch 2.x venv's python (exit 77, skipped, without it).
Per run, as the agent does:
  - a helper process hosts a torch TCPStore (TORCHELASTIC_USE_AGENT_STORE);
  - the ranks start with torchrun's environment and one end of an AF_UNIX
    SOCK_SEQPACKET socket pair each as DDPRUN_RECOVERY_FD;
  - a failure (SCENARIOS): the test SIGKILLs rank 1 of 2 once it reported
    reaching step 7; rank 0 of 2 SIGKILLs itself at step 13 (--kill-rank);
    the test SIGSTOPs rank 2 of 3 at step 9 (a hang: its peers wait on live
    sockets, and must abandon the all_reduce on `failed` alone before the
    test SIGKILLs it);
  - then: the victim reaped, `event=failed generation=1 ...` to the
    survivors, the replacement started with DDPRUN_GENERATION=1, `ready`,
    `joined` awaited from every rank, `recovered`.
Checks: each recovered run's final parameters are bit-identical to an
uninterrupted run's on as many ranks (which runs without the channel: the
module's no-op path), and every rank says its peers hold the same. Every
wait has a deadline; nothing sleeps. Extra arguments: scenario names to run.
"""
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

SKIP = 77
STEPS = 30
DEADLINE_S = 240  # one run: torch's import on 2 busy cores, then 30 tiny steps
STORE_HELPER = (
    "import sys, torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
    "print(s.port, flush=True)\n"
    "sys.stdin.read()  # until the test closes it\n")


class Failed(Exception):
    pass


def read_line(stream, deadline, what):
    """One line from a pipe, by `deadline` (a monotonic time)."""
    buf = b""
    fd = stream.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise Failed(f"no line from {what} within the deadline")
        chunk = os.read(fd, 1)
        if not chunk:
            raise Failed(f"{what} closed its output: {buf!r}")
        buf += chunk
    return buf.decode()


class Job:
    """One run: the store helper, the ranks, and their channels (our ends)."""

    def __init__(self, py, script, work, name, args, world, channel):
        self.py, self.script, self.args, self.channel = py, script, args, channel
        self.world = world
        self.work = os.path.join(work, name)
        os.makedirs(self.work, exist_ok=True)
        self.out = os.path.join(self.work, "params.bin")
        self.deadline = time.monotonic() + DEADLINE_S
        self.store = subprocess.Popen([py, "-c", STORE_HELPER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE)
        self.port = int(read_line(self.store.stdout, self.deadline, "the store helper"))
        self.ranks = {}  # rank -> Popen
        self.chans = {}  # rank -> our end of its channel
        self.logs = []

    def start(self, rank, generation=0, extra=()):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world),
                   LOCAL_WORLD_SIZE=str(self.world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(self.port), TORCHELASTIC_RESTART_COUNT="0",
                   TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1")
        pass_fds = ()
        if self.channel:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            env.update(DDPRUN_RESTART_SCOPE="rank", DDPRUN_RECOVERY_FD=str(theirs.fileno()),
                       DDPRUN_GENERATION=str(generation))
            pass_fds = (theirs.fileno(),)
        log = open(os.path.join(self.work, f"rank{rank}.g{generation}.log"), "w+")
        self.logs.append(log)
        argv = [self.py, self.script, "--steps", str(STEPS), "--out", self.out, "--progress",
                *self.args, *extra]
        self.ranks[rank] = subprocess.Popen(argv, env=env, pass_fds=pass_fds,
                                            stdout=subprocess.PIPE, stderr=log)
        if self.channel:
            theirs.close()
            self.chans[rank] = ours
        return self.ranks[rank]

    def send(self, rank, packet):
        self.chans[rank].send(packet.encode())

    def expect_joined(self, ranks, generation):
        """Waits for `joined` on each rank's channel; other packets fail."""
        waiting = {self.chans[r]: r for r in ranks}
        while waiting:
            left = self.deadline - time.monotonic()
            ready = select.select(list(waiting), [], [], max(0, left))[0] if left > 0 else []
            if not ready:
                raise Failed(f"no event=joined from rank(s) {sorted(waiting.values())}")
            for sock in ready:
                r = waiting.pop(sock)
                packet = sock.recv(512).decode()
                want = f"event=joined generation={generation} rank={r}"
                if packet != want:
                    raise Failed(f"rank {r} sent {packet!r}, not {want!r}")

    def wait_exit(self, rank):
        p = self.ranks[rank]
        try:
            return p.wait(timeout=max(0.1, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Failed(f"rank {rank} (pid {p.pid}) still running at the deadline")

    def finish(self):
        """Every rank's stdout after it exited 0; the parameters' bytes."""
        lines = []
        for rank, p in sorted(self.ranks.items()):
            out = p.stdout.read().decode()  # the rank exited: EOF comes at once
            lines.append(out)
            if p.returncode != 0:
                raise Failed(f"rank {rank} exited {p.returncode}: {out}{self.stderr()}")
        with open(self.out, "rb") as f:
            return "".join(lines), f.read()

    def stderr(self):
        text = ""
        for log in self.logs:
            log.seek(0)
            text += log.read()[-2000:]
        return text

    def close(self):
        for p in self.ranks.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        self.store.stdin.close()
        self.store.wait(timeout=30)
        for s in self.chans.values():
            s.close()


def uninterrupted(py, script, work, world):
    job = Job(py, script, work, f"reference_{world}", [], world, channel=False)
    try:
        for r in range(world):
            job.start(r)
        for r in range(world):
            job.wait_exit(r)
        return job.finish()
    finally:
        job.close()


def recovered(py, script, work, name, world, victim, how, at):
    """One run where `victim` fails at step `at`; the test plays the agent.

    how: "kill" (the test SIGKILLs it once it reports step `at`), "self"
    (--kill-rank: it SIGKILLs itself before that step's all_reduce), "hang"
    (the test SIGSTOPs it at step `at`: its peers wait in the all_reduce on
    a live socket, which gloo would wait out to the group's timeout; they
    must abandon it on `failed` alone, before the hung rank is SIGKILLed)."""
    extra = ["--kill-rank", str(victim), "--kill-step", str(at)] if how == "self" else []
    job = Job(py, script, work, name, extra, world, channel=True)
    survivors = [r for r in range(world) if r != victim]
    try:
        for r in range(world):
            job.start(r)
        p = job.ranks[victim]
        if how in ("kill", "hang"):
            wait_for(p, job, rf"rank \d step {at}\n")
            os.kill(p.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        if how == "hang":
            # As the agent: `failed` at once, then the hung rank SIGKILLed.
            for r in survivors:
                job.send(r, f"event=failed generation=1 ranks={victim} cause=hang")
            for r in survivors:
                wait_for(job.ranks[r], job, rf"rank {r} abandoned step \d+: PeerFailed\n")
            os.kill(p.pid, signal.SIGKILL)
        code = job.wait_exit(victim)
        if code != -signal.SIGKILL:
            raise Failed(f"rank {victim} exited {code}, not by SIGKILL")
        if how != "hang":
            # As the agent: `failed` once the worker's exit was reaped.
            for r in survivors:
                job.send(r, f"event=failed generation=1 ranks={victim} cause=exit")
        job.chans.pop(victim).close()
        job.start(victim, generation=1)
        for r in survivors:
            job.send(r, f"event=ready generation=1 ranks={victim}")
        job.expect_joined(range(world), 1)
        for r in range(world):
            job.send(r, f"event=recovered generation=1 ranks={victim}")
        for r in range(world):
            job.wait_exit(r)
        return job.finish()
    finally:
        job.close()


def wait_for(p, job, pattern):
    """Reads the rank's stdout lines until one matches `pattern`."""
    while not re.match(pattern, read_line(p.stdout, job.deadline, f"rank pid {p.pid}")):
        pass


# name, world size, victim, how, step
SCENARIOS = [
    ("kill_rank1_of_2", 2, 1, "kill", 7),
    ("self_kill_rank0_of_2", 2, 0, "self", 13),
    ("hang_rank2_of_3", 3, 2, "hang", 9),
]


def main():
    examples, python_dir, py, work = sys.argv[1:5]
    if not os.access(py, os.X_OK) or subprocess.run([py, "-c", "import torch"],
                                                     capture_output=True, timeout=300).returncode:
        print(f"SKIP: {py} cannot `import torch` (scripts/setup-torch.sh)")
        return SKIP
    only = sys.argv[5:]  # scenario names, to run a few
    # `import ddprun` (pkg/python) and `import ddprun_recovery` (its folder).
    os.environ["PYTHONPATH"] = python_dir
    script = os.path.join(examples, "rank_recovery.py")
    references = {}
    try:
        for name, world, victim, how, at in SCENARIOS:
            if only and name not in only:
                continue
            done = rf"rank (\d) done {STEPS} steps, generation (\d), parameters identical on " \
                   rf"{world} ranks: True"
            if world not in references:
                out, references[world] = uninterrupted(py, script, work, world)
                if sorted(re.findall(done, out)) != [(str(r), "0") for r in range(world)]:
                    raise Failed(f"uninterrupted run on {world} ranks: {out}")
                print(f"uninterrupted on {world} ranks: {len(references[world])} bytes of "
                      "parameters")
            out, params = recovered(py, script, work, name, world, victim, how, at)
            if sorted(re.findall(done, out)) != [(str(r), "1") for r in range(world)]:
                raise Failed(f"{name}: {out}")
            if f"rank {victim} replacement joined generation 1" not in out or \
                    "recovered into generation 1" not in out:
                raise Failed(f"{name}: no recovery said: {out}")
            if params != references[world]:
                raise Failed(f"{name}: final parameters differ from the uninterrupted run's")
            said = [line for line in out.splitlines() if not re.match(r"rank \d step", line)]
            print(f"ok: {name}: recovered, parameters bit-identical", *said, sep="\n  ")
    except Failed as e:
        print(f"FAILED: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

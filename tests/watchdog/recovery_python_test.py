"""watchdog/python/ddprun_recovery.py without torch (ctest watchdog.recovery_python;
Debian's /usr/bin/python3, standard library only).

Each case runs in a fresh interpreter (the module reads its environment
once), as a worker would:
  - outside ddprun, and with --restart-scope=group, it is a no-op: nothing
    of torch imported, enabled() False, generation() 0, poll() and
    wait_failed() None at once, send_joined() False, recover() re-raises;
  - its packet parser reaches the C++ parser's verdict on every case of
    tests/base/recovery_wire_cases.txt;
  - under rank scope, on a real SOCK_SEQPACKET pair: failed/ready/recovered/
    fallback read as docs/RECOVERY.md says, stale and malformed packets
    ignored, joined sent in base/recovery_wire.h's form, wait_failed()'s
    deadline kept;
  - exit(): sys.exit's status and teardown when no group was abandoned;
    after one, the same status, stdout flushed, atexit handlers skipped.

Usage: recovery_python_test.py WATCHDOG_PYTHON_DIR
"""
import codecs
import os
import socket
import subprocess
import sys
import textwrap
import time

DEADLINE_S = 30

NOOP = """
import sys, time
import ddprun_recovery as rec
assert not rec.enabled(), "enabled outside rank scope"
assert rec.generation() == 0 and not rec.is_replacement()
assert rec.poll() is None and rec.send_joined() is False
t = time.monotonic()
assert rec.wait_failed(20) is None
assert time.monotonic() - t < 1, "wait_failed waited although nothing can come"
err = RuntimeError("gloo: connection closed by peer")
try:
    rec.recover(None, None, {"step": 3}, err)
    raise SystemExit("recover() did not re-raise")
except RuntimeError as e:
    assert e is err
assert "torch" not in sys.modules, "importing ddprun_recovery imported torch"
print("noop ok")
"""

CHANNEL = """
import os, socket, sys, time
import ddprun_recovery as rec
fd = int(os.environ["DDPRUN_RECOVERY_FD"])
assert rec.enabled() and rec.generation() == GEN and rec.is_replacement() == (GEN > 0)
say = socket.socket(fileno=int(sys.argv[1]))  # our line back to the test: what we saw
def report(text):
    say.send(text.encode())
assert rec.poll() is None
t = time.monotonic()
assert rec.wait_failed(0.2) is None
assert 0.15 < time.monotonic() - t < 5, "wait_failed's deadline not kept"
report("waiting")
f = rec.wait_failed(20)  # the test sends ready, junk, a stale failed, then generation GEN+1
report(f"failed {f.generation} {f.ranks} {f.cause}")
assert rec.send_joined(f.generation)
f2 = rec.wait_failed(20)  # a later failure supersedes
report(f"failed {f2.generation} {f2.ranks} {f2.cause}")
assert rec.send_joined(f2.generation) and rec.generation() == f2.generation  # joined: not pending
try:
    rec.wait_failed(20)
    report("no fallback")
except rec.RecoveryFallback as e:
    report(f"fallback {e}")
assert "torch" not in sys.modules
"""


EXIT = """
import atexit, sys
import ddprun_recovery as rec
atexit.register(lambda: print("teardown ran"))
if sys.argv[1] == "abandoned":
    rec._abandoned.append((object(), None))  # as recover() leaves a broken group
print("last line", end="")  # still in stdout's buffer (a pipe) at exit()
rec.exit(5)
"""


def run(code, env, pass_fds=(), args=()):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                            pass_fds=pass_fds, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def base_env(folder):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDPRUN_", "TORCHELASTIC_", "PYTHON"))}
    env["PYTHONPATH"] = folder
    env["RANK"] = "1"
    return env


def recv(sock, deadline):
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(512).decode()
    except socket.timeout:
        raise AssertionError("no packet before the deadline")


def case_noop(folder, errors):
    for label, extra in (("outside ddprun", {}),
                         ("group scope", {"DDPRUN_RESTART_SCOPE": "group"}),
                         ("rank scope without a channel", {"DDPRUN_RESTART_SCOPE": "rank"}),
                         ("a channel but group scope", {"DDPRUN_RECOVERY_FD": "0"})):
        p = run(NOOP, dict(base_env(folder), **extra))
        out, _ = p.communicate(timeout=DEADLINE_S)
        if p.returncode != 0 or "noop ok" not in out:
            errors.append(f"{label}: not a no-op: {out.strip()}")


def case_channel(folder, errors, gen):
    agent, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(base_env(folder), DDPRUN_RESTART_SCOPE="rank",
               DDPRUN_RECOVERY_FD=str(worker.fileno()), DDPRUN_GENERATION=str(gen))
    p = run(CHANNEL.replace("GEN", str(gen)), env, (worker.fileno(), theirs.fileno()),
            [str(theirs.fileno())])
    worker.close()
    theirs.close()
    deadline = time.monotonic() + DEADLINE_S
    try:
        assert recv(mine, deadline) == "waiting"
        for packet in (f"event=ready generation={gen} ranks=0",  # informational
                       "no-event-here", "event=failed generation=x ranks=0",  # malformed
                       f"event=failed generation={gen} ranks=0 cause=exit",  # stale
                       f"event=failed generation={gen + 1} ranks=0,2 cause=hang extra=field"):
            agent.send(packet.encode())
        got = recv(mine, deadline)
        assert got == f"failed {gen + 1} [0, 2] hang", got
        joined = recv(agent, deadline)
        assert joined == f"event=joined generation={gen + 1} rank=1", joined
        agent.send(f"event=recovered generation={gen + 1} ranks=0".encode())
        agent.send(f"event=failed generation={gen + 2} ranks=3 cause=exit\n".encode())
        got = recv(mine, deadline)
        assert got == f"failed {gen + 2} [3] exit", got
        joined = recv(agent, deadline)
        assert joined == f"event=joined generation={gen + 2} rank=1", joined
        agent.send(b"event=fallback reason=second_failure")
        got = recv(mine, deadline)
        assert got.startswith("fallback") and "second_failure" in got, got
    except AssertionError as e:
        p.kill()
        out, _ = p.communicate(timeout=DEADLINE_S)
        errors.append(f"generation {gen}: {e}; the worker said: {out.strip()}")
        return
    out, _ = p.communicate(timeout=DEADLINE_S)
    if p.returncode != 0:
        errors.append(f"generation {gen}: the worker exited {p.returncode}: {out.strip()}")


CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../base/recovery_wire_cases.txt")


def case_exit(folder, errors):
    for label, teardown in (("clean", True), ("abandoned", False)):
        p = run(EXIT, base_env(folder), args=(label,))
        out, _ = p.communicate(timeout=DEADLINE_S)
        if p.returncode != 5 or not out.startswith("last line"):
            errors.append(f"exit(5) {label}: status {p.returncode}, output {out!r}")
        if ("teardown ran" in out) != teardown:
            errors.append(f"exit(5) {label}: atexit handlers {'skipped' if teardown else 'ran'}: {out!r}")


def case_wire_verdicts(folder, errors):
    """_parse() reaches base/recovery_wire.h's verdict on every packet of
    the shared cases file (tests/base/recovery_wire_test.cc reads it too)."""
    sys.path.insert(0, folder)
    sys.dont_write_bytecode = True  # nothing written into the source tree
    import ddprun_recovery
    count = 0
    with open(CASES) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            verdict, _, text = line.partition(" ")
            packet = codecs.decode(text, "unicode_escape").encode("latin-1")
            accepted = ddprun_recovery._parse(packet) is not None
            if accepted != (verdict == "accept"):
                errors.append(f"_parse({packet!r}): {'accepted' if accepted else 'rejected'}, "
                              f"the C++ parser {verdict}s it")
            count += 1
    if count < 30:
        errors.append(f"{CASES}: only {count} cases read")


def main():
    folder = os.path.abspath(sys.argv[1])
    errors = []
    case_noop(folder, errors)
    case_channel(folder, errors, 0)
    case_channel(folder, errors, 4)
    case_wire_verdicts(folder, errors)
    case_exit(folder, errors)
    for e in errors:
        print("FAILED:", e)
    if not errors:
        print("ok: ddprun_recovery is a no-op outside rank scope and reads the channel as "
              "docs/RECOVERY.md says")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""A worker that speaks the recovery channel (docs/RECOVERY.md), for
tests/agent/restart_scope_test.cc. Plain python3, standard library only.

Every rank prints one line at start:
  start rank=R local=L world=W pid=P gen=G restart=C fd=F
and one line per packet it reads from DDPRUN_RECOVERY_FD:
  got rank=R pid=P <the packet>

Flags (a failure or hang happens in the first attempt only, restart 0):
  --fail R:G:CODE   rank R exits with CODE when it starts in generation G
  --hang R:G        rank R stops beating and blocks: at once in generation
                    0, after the generation formed in a later one
  --recoveries N    survivors exit 0 once generation N formed
  --beat            beat every 20 ms on DDPRUN_HEARTBEAT_SOCKET ("hb R step")
  --ignore-channel  never read the channel (a program that does not take part)

A survivor answers `ready` with `joined`; a replacement sends `joined` at
start. Both exit 0 at `recovered` for generation N. At `fallback` a worker
blocks until the group teardown's SIGTERM ends it. In a later attempt
(restart > 0) every rank exits 0 at once. Every wait has a deadline (60 s,
then exit 9).
"""
import argparse
import os
import select
import signal
import socket
import sys
import time

DEADLINE_S = 60


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def block_forever():
    # SIGTERM's default action ends us (the group teardown); a hang is
    # SIGKILLed. Bounded all the same.
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        signal.pause() if hasattr(signal, "pause") else time.sleep(1)
    sys.exit(9)


def fields(packet):
    out = {}
    for f in packet.split():
        k, _, v = f.partition("=")
        out[k] = v
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fail", action="append", default=[])
    p.add_argument("--hang", action="append", default=[])
    p.add_argument("--recoveries", type=int, default=1)
    p.add_argument("--beat", action="store_true")
    p.add_argument("--ignore-channel", action="store_true")
    a = p.parse_args()

    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    gen = int(os.environ.get("DDPRUN_GENERATION", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fd_text = os.environ.get("DDPRUN_RECOVERY_FD", "none")
    say(f"start rank={rank} local={local} world={world} pid={os.getpid()} gen={gen} "
        f"restart={restart} fd={fd_text}")
    if restart > 0:
        return 0
    for spec in a.fail:
        r, g, code = (int(x) for x in spec.split(":"))
        if r == rank and g == gen:
            say(f"failing rank={rank} gen={gen} code={code}")
            return code
    if fd_text == "none":
        # Group scope: a survivor waits to be stopped, as one blocked in a
        # collective with the dead rank would.
        block_forever()
    hang_at = None  # a process hangs in the generation it starts in
    for spec in a.hang:
        r, g = (int(x) for x in spec.split(":"))
        if r == rank and g == gen:
            hang_at = g

    chan = socket.socket(fileno=int(fd_text))  # AF_UNIX SOCK_SEQPACKET, as inherited
    hb = None
    if a.beat and os.environ.get("DDPRUN_HEARTBEAT_SOCKET"):
        hb = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        hb.connect(os.environ["DDPRUN_HEARTBEAT_SOCKET"])
    step = 0

    def beat():
        nonlocal step
        if hb is not None:
            step += 1
            try:
                hb.send(f"hb {rank} {step}\n".encode(), socket.MSG_DONTWAIT)
            except OSError:
                pass

    def join(g):
        chan.send(f"event=joined generation={g} rank={rank}".encode())

    if gen > 0 and not a.ignore_channel:
        join(gen)
    formed = gen if gen == 0 else -1  # the generation last seen formed
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if hang_at is not None and hang_at == formed:
            # A few beats first, so the watchdog has seen this rank progress.
            for _ in range(5):
                beat()
                time.sleep(0.02)
            say(f"hanging rank={rank} gen={formed} pid={os.getpid()}")
            block_forever()
        beat()
        if a.ignore_channel:
            time.sleep(0.02)
            continue
        ready, _, _ = select.select([chan], [], [], 0.02)
        if not ready:
            continue
        packet = chan.recv(512).decode()
        if not packet:
            say(f"channel closed rank={rank}")
            return 8
        say(f"got rank={rank} pid={os.getpid()} {packet}")
        m = fields(packet)
        if m.get("event") == "ready":
            join(int(m["generation"]))
        elif m.get("event") == "recovered":
            formed = int(m["generation"])
            if formed >= a.recoveries and hang_at != formed:
                return 0
        elif m.get("event") == "fallback":
            block_forever()
    say(f"deadline passed rank={rank}")
    return 9


if __name__ == "__main__":
    sys.exit(main())

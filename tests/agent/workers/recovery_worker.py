"""A worker that speaks the recovery channel (docs/RECOVERY.md), for
tests/agent/restart_scope_test.cc. Plain python3, standard library only.

A standby (--standby-workers: DDPRUN_STANDBY=N, no RANK) prints
  standby number=N pid=P rank=R|unset local=L|unset
then waits on the channel for event=assign and prints
  assigned number=N pid=P rank=R local=L gen=G
and goes on as that generation's replacement (it sends `joined`).

Every rank prints one line at start:
  start rank=R local=L world=W pid=P gen=G restart=C fd=F fds=D[,D...]|none
(fds: the descriptors it inherited above 2)
and one line per packet it reads from DDPRUN_RECOVERY_FD:
  got rank=R pid=P <the packet>

Flags (a failure or hang happens in the first attempt only, restart 0):
  --fail R:G:CODE   rank R exits with CODE when it starts in generation G
  --hang R:G        rank R stops beating and blocks: at once in generation
                    0, after the generation formed in a later one
  --recoveries N    survivors exit 0 once generation N formed (0: at once)
  --beat            beat every 20 ms on DDPRUN_HEARTBEAT_SOCKET ("hb R step")
  --ignore-channel  never read the channel (a program that does not take part)
  --standby-fail N:CODE   standby N exits with CODE at once, before it reads
                    its channel
  --mark DIR        a standby creates DIR/standby<N> once it waits
  --fail-when R:PATH:CODE  rank R, in generation 0, waits until PATH exists,
                    then exits with CODE

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


def wait_for(ready):
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if ready():
            return True
        time.sleep(0.02)
    return False


def standby(a):
    """A standby's life until event=assign: (rank, local rank, generation),
    or the exit status."""
    number = int(os.environ["DDPRUN_STANDBY"])
    say(f"standby number={number} pid={os.getpid()} rank={os.environ.get('RANK', 'unset')} "
        f"local={os.environ.get('LOCAL_RANK', 'unset')}")
    for spec in a.standby_fail:
        n, code = (int(x) for x in spec.split(":"))
        if n == number:
            return code
    chan = socket.socket(fileno=int(os.environ["DDPRUN_RECOVERY_FD"]))
    if a.mark:
        open(os.path.join(a.mark, f"standby{number}"), "w").close()
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        ready, _, _ = select.select([chan], [], [], 1.0)
        if not ready:
            continue
        packet = chan.recv(512).decode()
        if not packet:
            return 0  # the agent is done with us
        m = fields(packet)
        if m.get("event") == "assign":
            say(f"assigned number={number} pid={os.getpid()} rank={m['rank']} "
                f"local={m['local_rank']} gen={m['generation']}")
            chan.detach()  # main() opens it again
            return int(m["rank"]), int(m["local_rank"]), int(m["generation"])
    return 9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fail", action="append", default=[])
    p.add_argument("--hang", action="append", default=[])
    p.add_argument("--recoveries", type=int, default=1)
    p.add_argument("--beat", action="store_true")
    p.add_argument("--ignore-channel", action="store_true")
    p.add_argument("--standby-fail", action="append", default=[])
    p.add_argument("--mark")
    p.add_argument("--fail-when", action="append", default=[])
    a = p.parse_args()

    if os.environ.get("DDPRUN_STANDBY"):
        assigned = standby(a)
        if not isinstance(assigned, tuple):
            return assigned
        rank, local, gen = assigned
    else:
        rank = int(os.environ["RANK"])
        local = int(os.environ["LOCAL_RANK"])
        gen = int(os.environ.get("DDPRUN_GENERATION", "0"))
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fd_text = os.environ.get("DDPRUN_RECOVERY_FD", "none")
    # Descriptors inherited past 2 (listdir's own is gone once it returns).
    fds = sorted(int(f) for f in os.listdir("/proc/self/fd") if int(f) > 2)
    fds = [f for f in fds if os.path.exists(f"/proc/self/fd/{f}")]
    say(f"start rank={rank} local={local} world={world} pid={os.getpid()} gen={gen} "
        f"restart={restart} fd={fd_text} fds={','.join(map(str, fds)) or 'none'}")
    if restart > 0:
        return 0
    for spec in a.fail:
        r, g, code = (int(x) for x in spec.split(":"))
        if r == rank and g == gen:
            say(f"failing rank={rank} gen={gen} code={code}")
            return code
    for spec in a.fail_when:
        r, path, code = spec.split(":")
        if int(r) == rank and gen == 0:
            if not wait_for(lambda: os.path.exists(path)):
                say(f"deadline passed rank={rank}")
                return 9
            say(f"failing rank={rank} gen={gen} code={code}")
            return int(code)
    if a.recoveries == 0:
        return 0
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

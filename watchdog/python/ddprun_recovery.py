"""Rank-scoped recovery for Python scripts (ddprun --restart-scope=rank).

When a rank dies or hangs, ddprun replaces only that rank; the survivors keep
their processes and their state, re-form the process group with the
replacement under a new generation, and one survivor sends it the model, the
optimizer state and the position (docs/RECOVERY.md, "Python"). This module
is the script's half of it. It is opt-in: importing it changes nothing, and
it imports torch only when a helper needs it.

The whole loop (examples/rank_recovery.py runs it):

    import ddprun_recovery as recovery        # or: from ddprun import recovery

    class GroupBroken(Exception):              # the step's collective failed
        pass

    model, opt = build(seed=0)                 # the same on every rank
    if recovery.is_standby():                  # --standby-workers: no rank yet
        recovery.wait_assigned()               # ddprun gives it a failed rank's slot
    recovery.init_process_group("gloo")        # generation 0, or a replacement's
    progress = {"step": 0}                     # everything that says what comes next
    if recovery.is_replacement():              # started by ddprun for generation G
        progress = recovery.recover(model, opt, None)
    while progress["step"] < steps:
        try:
            loss = model(batch(progress["step"])).sum()   # data chosen by step
            opt.zero_grad()
            loss.backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            ddprun_heartbeat.beat(progress["step"])  # at the collective: who hung
            try:
                recovery.all_reduce(grads)     # raises PeerFailed, or gloo's error
            except (recovery.PeerFailed, RuntimeError) as error:
                raise GroupBroken() from error # the collective's failure only
            ...copy grads / world back into p.grad...
            opt.step()
            progress["step"] += 1              # committed
        except GroupBroken as broken:          # a rank's own error ends the rank
            progress = recovery.recover(model, opt, progress, broken.__cause__)
            # the loop redoes the step that was in flight
    recovery.exit(0)                           # not sys.exit: see exit()

recover() abandons the broken process group, forms generation G's through
the agent's store (PrefixStore "ddprun/recovery/r<restart>/g<G>/" over
TCPStore(MASTER_ADDR, MASTER_PORT)), picks the lowest rank with the highest
committed step, broadcasts model, optimizer and progress from it, and sends
`event=joined generation=G rank=R`. It re-raises `error` when recovery is not
enabled, so outside ddprun the loop above fails as it would without it.

Rules for the script:
  - a step is committed only after its collective finished on this rank:
    update progress["step"] after opt.step(), never before;
  - everything that decides the next step (data position, RNG state) goes in
    progress (a dict of tensors, numbers, strings), not in other variables;
  - a tensor given to an abandoned collective may still be written by
    gloo's thread: build a fresh one for each step (torch.cat does);
  - models wrapped in DistributedDataParallel hold the old group: build the
    wrapper again after recover() (its collectives run inside backward(),
    out of all_reduce()'s reach; gloo's error on a dead peer still ends them).

A standby (ddprun --standby-workers=N; DDPRUN_STANDBY set, no RANK) builds
what needs no rank, then calls wait_assigned() before anything that needs a
rank (the process group, a GPU from LOCAL_RANK): it returns once ddprun made
it the replacement of a failed rank, with RANK, LOCAL_RANK and ROLE_RANK set
and is_replacement() true, so the script goes on as a replacement ddprun
started would. A script that never calls it cannot be a standby (it fails
without RANK, and ddprun stops starting standbys once they keep failing).

Outside ddprun, or with --restart-scope=group (DDPRUN_RECOVERY_FD unset):
enabled() is False, is_standby() False, poll() and wait_failed() return None at once,
generation() is 0, send_joined() returns False, init_process_group() is
torch's own and all_reduce() torch's blocking one.

Not thread-safe: call it from the training thread only. The channel's
descriptor is owned here once read (socket.socket(fileno=...)).
"""

import datetime
import os
import select
import socket
import sys
import time

__all__ = [
    "Failure", "PeerFailed", "RecoveryFallback", "enabled", "generation", "is_replacement",
    "is_standby", "wait_assigned", "restart_count", "poll", "wait_failed", "send_joined",
    "init_process_group", "all_reduce",
    "pick_source", "broadcast_state", "recover", "exit", "DEFAULT_TIMEOUT_S",
]

# base/recovery_wire.h's kMaxPacketBytes.
_MAX_PACKET_BYTES = 512
# ddprun's --recovery-timeout default: how long a new generation may take to
# form (the replacement's interpreter and torch import included).
DEFAULT_TIMEOUT_S = 300.0
# Process groups abandoned with a collective in flight: their gloo threads may
# still be blocked, and the last reference going would join them on this
# thread. They end with the dead peer's sockets or their own timeout.
_abandoned = []


class Failure:
    """`event=failed`: `ranks` (global ranks) failed in generation-1; the
    survivors form `generation`. `cause` is "exit" or "hang"."""

    __slots__ = ("generation", "ranks", "cause")

    def __init__(self, generation, ranks, cause):
        self.generation = generation
        self.ranks = ranks
        self.cause = cause

    def __repr__(self):
        return f"Failure(generation={self.generation}, ranks={self.ranks}, cause={self.cause!r})"


class PeerFailed(RuntimeError):
    """A collective was abandoned because ddprun said a peer failed."""

    def __init__(self, failure):
        super().__init__(f"rank(s) {','.join(map(str, failure.ranks))} failed ({failure.cause}); "
                         f"generation {failure.generation} follows")
        self.failure = failure


class RecoveryFallback(RuntimeError):
    """ddprun gave up rank-scoped recovery (`event=fallback`): the whole group
    restarts; nothing is left to recover into."""


_MAX_RANK = 1 << 24
_MAX_GENERATION = 1 << 30
# Known numeric keys and their largest value.
_NUMBERS = {"generation": _MAX_GENERATION, "rank": _MAX_RANK - 1, "local_rank": _MAX_RANK - 1}
# The fields each known event needs.
_NEEDS = {"failed": ("generation", "ranks"), "ready": ("generation", "ranks"),
          "recovered": ("generation", "ranks"), "joined": ("generation", "rank"),
          "assign": ("generation", "rank", "local_rank")}


def _parse(packet):
    """base/recovery_wire.h's parse(), rule for rule (tests/base/
    recovery_wire_cases.txt holds both to the same verdicts): a dict of
    fields, numbers as ints and ranks a list, or None if rejected."""
    if len(packet) > _MAX_PACKET_BYTES:
        return None
    if packet.endswith(b"\n"):
        packet = packet[:-1]
    if any(b < 0x20 or b > 0x7e for b in packet):
        return None
    fields = {}
    for field in packet.decode("ascii").split(" "):
        if not field:
            continue
        key, eq, value = field.partition("=")
        if not eq or not key:
            return None
        if key in _NUMBERS:
            value = _number(value, _NUMBERS[key])
        elif key == "ranks":
            value = [_number(r, _MAX_RANK - 1) for r in value.split(",")]
            value = None if None in value else value
        elif key == "event" and not value:
            value = None
        if value is None:
            return None
        fields[key] = value
    if "event" not in fields or any(k not in fields for k in _NEEDS.get(fields["event"], ())):
        return None
    return fields


def _number(text, largest):
    if not (0 < len(text) <= 12) or any(c not in "0123456789" for c in text):
        return None
    value = int(text)
    return value if value <= largest else None


class _Channel:
    """The worker's end of the recovery channel and what was read from it."""

    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)  # AF_UNIX SOCK_SEQPACKET, inherited
        self.sock.setblocking(False)
        self.current = _env_int("DDPRUN_GENERATION", 0)  # the generation formed or forming
        self.failed = None  # the newest Failure for a generation past `current`
        self.fallback = None  # reason, once the agent gave up
        # A standby's `event=assign`: (rank, local_rank, generation); None before.
        self.standby = "DDPRUN_STANDBY" in os.environ
        self.assigned = None
        self.closed = False  # EOF: the agent is gone

    def drain(self):
        """Reads every packet waiting; never blocks."""
        while not self.closed:
            try:
                packet = self.sock.recv(_MAX_PACKET_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            if not packet:
                self.closed = True
                return
            self._take(_parse(packet))

    def _take(self, m):
        if m is None:
            return
        if m["event"] == "fallback":
            self.fallback = m.get("reason") or "unknown"
        elif m["event"] == "failed":
            g, ranks = m["generation"], m["ranks"]
            newest = self.failed.generation if self.failed else self.current
            if g > newest:
                self.failed = Failure(g, ranks, m.get("cause", ""))
        elif m["event"] == "assign" and self.standby and self.assigned is None:
            self.assigned = (m["rank"], m["local_rank"], m["generation"])
        # ready, recovered: informational; unknown events: ignored.

    def wait_readable(self, fds, timeout):
        """Waits until the channel or one of `fds` is readable, or `timeout`
        (seconds) passes; returns the readable fds among `fds`."""
        watched = list(fds) if self.closed else [self.sock] + list(fds)
        try:
            ready, _, _ = select.select(watched, [], [], max(0.0, timeout))
        except InterruptedError:
            return []
        if self.sock in ready:
            self.drain()
        return [f for f in ready if f is not self.sock]


_channel = None  # _Channel once opened; False where not enabled


def _env_int(name, default):
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def _get():
    global _channel
    if _channel is None:
        _channel = False
        fd = _env_int("DDPRUN_RECOVERY_FD", -1)
        if os.environ.get("DDPRUN_RESTART_SCOPE", "") == "rank" and fd >= 0:
            try:
                _channel = _Channel(fd)
            except OSError:
                _channel = False
    return _channel or None


def enabled():
    """True under `ddprun --restart-scope=rank` (the channel is there)."""
    return _get() is not None


def generation():
    """The generation this process is in: 0, or G for generation G's
    replacement (DDPRUN_GENERATION), then each generation recover() formed."""
    ch = _get()
    return ch.current if ch else 0


def is_replacement():
    """True in a process ddprun started to replace a failed rank."""
    return enabled() and _env_int("DDPRUN_GENERATION", 0) > 0


def is_standby():
    """True in a standby ddprun pre-started (--standby-workers) that has not
    been assigned a rank yet: call wait_assigned() before anything that
    needs one."""
    ch = _get()
    return bool(ch and ch.standby and ch.assigned is None)


def wait_assigned(timeout=None):
    """In a standby: waits until ddprun gives it a failed rank's slot
    (`event=assign generation=G rank=R local_rank=L`), up to `timeout`
    seconds (None: for as long as ddprun keeps it; it SIGKILLs standbys at
    the job's end). Then this process is that rank's replacement:
    os.environ's RANK, LOCAL_RANK and ROLE_RANK are R, L, R, generation() is
    G and is_replacement() is True. Returns (R, L, G). Raises RuntimeError
    outside a standby or when the agent closed the channel, TimeoutError when
    `timeout` passed."""
    ch = _get()
    if ch is None or not ch.standby:
        raise RuntimeError("ddprun_recovery.wait_assigned(): not a standby (needs ddprun "
                           "--restart-scope=rank --standby-workers=N)")
    deadline = None if timeout is None else time.monotonic() + timeout
    while ch.assigned is None:
        ch.drain()
        if ch.assigned is not None:
            break
        if ch.closed:
            raise RuntimeError("ddprun closed the recovery channel before this standby was "
                               "assigned a rank")
        left = 3600.0 if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no event=assign from ddprun within {timeout:g} s")
        ch.wait_readable([], left)
    rank, local_rank, gen = ch.assigned
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), ROLE_RANK=str(rank),
                      DDPRUN_GENERATION=str(gen))
    ch.current = gen
    # ddprun_heartbeat keeps the rank it read first (the standby's none):
    # its beats must carry the new one.
    hb = sys.modules.get("ddprun_heartbeat")
    if hb is not None and hasattr(hb, "_forget"):
        hb._forget()
    return rank, local_rank, gen


def restart_count():
    """The group restart this attempt is (TORCHELASTIC_RESTART_COUNT)."""
    return _env_int("TORCHELASTIC_RESTART_COUNT", 0)


def _check_fallback(ch):
    if ch.fallback is not None:
        raise RecoveryFallback(f"ddprun gave up rank-scoped recovery ({ch.fallback}); "
                               "the group restarts")


def poll():
    """The pending `event=failed` (a Failure) or None; never blocks. Raises
    RecoveryFallback once ddprun gave up."""
    ch = _get()
    if ch is None:
        return None
    ch.drain()
    _check_fallback(ch)
    return ch.failed


def wait_failed(timeout):
    """Waits up to `timeout` seconds for `event=failed`: the Failure, or None
    when the deadline passed (at once when not enabled)."""
    ch = _get()
    if ch is None:
        return None
    deadline = time.monotonic() + timeout
    while True:
        found = poll()
        left = deadline - time.monotonic()
        if found is not None or left <= 0 or ch.closed:
            return found
        ch.wait_readable([], left)


def send_joined(gen=None):
    """Tells ddprun this rank's group for `gen` (default: the current
    generation) formed and its state is synchronised; from here `gen` is
    this rank's generation and a failure up to it is no longer pending.
    False if not sent (not enabled, or the agent is gone)."""
    ch = _get()
    if ch is None:
        return False
    g = ch.current if gen is None else gen
    # Joined G: this rank is in G, and a failure up to G is dealt with.
    ch.current = max(ch.current, g)
    if ch.failed is not None and ch.failed.generation <= g:
        ch.failed = None
    rank = _env_int("RANK", 0)
    try:
        ch.sock.send(f"event=joined generation={g} rank={rank}".encode("ascii"))
        return True
    except OSError:
        return False


def _timedelta(timeout):
    return datetime.timedelta(seconds=timeout)


def init_process_group(backend="gloo", timeout=DEFAULT_TIMEOUT_S, gen=None):
    """Forms the default process group for generation `gen` (default: this
    process's generation) with RANK and WORLD_SIZE, through
    PrefixStore("ddprun/recovery/r<restart>/g<G>/", TCPStore(MASTER_ADDR,
    MASTER_PORT, is_master=False)): the agent's store, which outlives every
    rank. `timeout` (seconds) bounds the forming and each collective. When
    not enabled: torch's init_process_group(backend, timeout=timeout)."""
    import torch.distributed as dist
    if not enabled():
        dist.init_process_group(backend, timeout=_timedelta(timeout))
        return
    g = generation() if gen is None else gen
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=_timedelta(timeout))
    store = dist.PrefixStore(f"ddprun/recovery/r{restart_count()}/g{g}/", base)
    dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=_timedelta(timeout))
    _get().current = g


def all_reduce(tensor, op=None, timeout=DEFAULT_TIMEOUT_S):
    """dist.all_reduce(tensor, op) that ddprun's `event=failed` interrupts.

    Raises PeerFailed as soon as the agent reports a failure, even when this
    rank waits on a survivor (which gloo would wait out to its timeout); the
    collective is then abandoned (`tensor` may still be written: do not use
    it again). gloo's own error on a dead peer comes through as its
    RuntimeError. TimeoutError after `timeout` seconds. When not enabled:
    the blocking dist.all_reduce."""
    import torch.distributed as dist
    op = dist.ReduceOp.SUM if op is None else op
    ch = _get()
    if ch is None:
        dist.all_reduce(tensor, op=op)
        return
    failed = poll()
    if failed is not None:
        raise PeerFailed(failed)
    work = dist.all_reduce(tensor, op=op, async_op=True)
    # The waiter writes one byte when the collective ends; waiting on that
    # pipe and the channel together is one select(), not a poll loop. The
    # waiter owns the write end: it may write after this call returned.
    r, w = os.pipe()
    try:
        _Waiter.wait_for(work, w)
        deadline = time.monotonic() + timeout
        while True:
            if ch.wait_readable([r], deadline - time.monotonic()):
                work.wait()  # completed: returns, or raises gloo's error
                return
            failed = poll()
            if failed is not None:
                _abandoned.append((dist.group.WORLD, work))
                _Waiter.retire()
                raise PeerFailed(failed)
            if time.monotonic() >= deadline:
                _Waiter.retire()
                raise TimeoutError(f"all_reduce on rank {dist.get_rank()} did not finish within "
                                   f"{timeout:g} s and ddprun reported no failure")
    finally:
        os.close(r)


class _Waiter:
    """Waits for one collective at a time on a daemon thread of its own and
    writes a byte to that collective's pipe once it ended.

    Not the future's done callback: torch runs that on a gloo thread, which
    takes the GIL, and an abandoned collective ending while the interpreter
    finalizes (a peer exiting after this process's last line ends it) took
    the GIL of a dying interpreter: SIGSEGV at exit, seen under load
    (examples.rank_recovery_harness). A daemon Python thread whose wait ends
    then just exits (CPython's rule for daemon threads at finalization). A
    waiter left blocked on an abandoned collective is retired; the next
    collective gets a new one."""

    _current = None

    def __init__(self):
        import queue
        import threading
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="ddprun-recovery-wait", daemon=True).start()

    @classmethod
    def wait_for(cls, work, w):
        if cls._current is None:
            cls._current = cls()
        cls._current.jobs.put((work, w))

    @classmethod
    def retire(cls):
        cls._current = None

    def _serve(self):
        while True:
            work, w = self.jobs.get()
            try:
                work.wait()
            except Exception:  # gloo's error: the caller's own wait() raises it
                pass
            try:
                os.write(w, b"x")
            except OSError:
                pass  # abandoned: the read end is closed (EPIPE)
            finally:
                os.close(w)


def pick_source(committed_step):
    """The lowest rank holding the highest committed step (two all_reduces):
    (source rank, that step). A replacement passes -1."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([committed_step], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    best = int(t.item())
    mine = dist.get_rank() if committed_step == best else dist.get_world_size()
    t = torch.tensor([mine], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item()), best


def broadcast_state(state, src):
    """`state` (a state_dict-like tree of tensors, numbers, strings) from rank
    `src` to every rank, bit for bit: torch.save's bytes, one broadcast of
    the length, one of the bytes. Returns src's state (this rank's own on
    src; `state` may be None elsewhere)."""
    import io
    import torch
    import torch.distributed as dist
    if dist.get_rank() == src:
        buf = io.BytesIO()
        torch.save(state, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src)
    if dist.get_rank() != src:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src)
    if dist.get_rank() == src:
        return state
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def _abandon_group():
    import torch.distributed as dist
    if dist.is_initialized():
        # Kept referenced: a gloo thread may still block in the abandoned
        # collective (see _abandoned); destroy only unregisters it then.
        _abandoned.append((dist.group.WORLD, None))
        # torch's own: ddprun_autobeat's wrapper would open a "teardown"
        # heartbeat section that only the process's end closes.
        destroy = getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)
        destroy()


def exit(status=0):
    """Ends the process with `status` (an int), as sys.exit would, unless
    this process abandoned a process group in a recovery: its gloo threads
    may still run, and the interpreter's teardown and the C++ static
    destructors after it, under them, abort the process ("terminate called
    without an active exception", seen under load in
    examples.rank_recovery_harness). Then it flushes stdout and stderr and
    leaves with os._exit, skipping atexit handlers, as ddprun's `train` does
    with std::_Exit."""
    if not _abandoned:
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more to keep
    os._exit(status if isinstance(status, int) else 1)


def recover(model, optimizer, progress, error=None, timeout=DEFAULT_TIMEOUT_S):
    """The recovery after `error` (PeerFailed, or gloo's RuntimeError on a
    dead peer), or a replacement's start (progress None): forms the next
    generation, synchronises model, optimizer and progress from the lowest
    rank with the highest progress["step"], sends `joined`, and returns the
    progress to go on from (redo the step that was in flight).

    gloo's error may come before ddprun's notification: it is waited for up
    to `timeout` seconds, and `error` is re-raised if none comes (or when
    not enabled). Raises RecoveryFallback when ddprun gave up; a second
    failure during the recovery makes it give up."""
    ch = _get()
    if ch is None:
        if error is not None:
            raise error
        raise RuntimeError("ddprun_recovery.recover(): not enabled (needs ddprun "
                           "--restart-scope=rank)")
    if progress is not None:
        failure = error.failure if isinstance(error, PeerFailed) else wait_failed(timeout)
        if failure is None:
            _check_fallback(ch)
            if error is not None:
                raise error
            raise TimeoutError(f"no event=failed from ddprun within {timeout:g} s")
        _abandon_group()
        ch.failed = None
        init_process_group(timeout=timeout, gen=failure.generation)
    # A replacement's group is formed already (init_process_group at start).
    step = -1 if progress is None else int(progress["step"])
    src, _best = pick_source(step)
    state = None
    import torch.distributed as dist
    if dist.get_rank() == src:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "progress": progress}
    state = broadcast_state(state, src)
    if dist.get_rank() != src:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    send_joined()
    return dict(state["progress"])

"""Heartbeat client for workers launched by ddprun (no dependencies).

    import ddprun_heartbeat
    ddprun_heartbeat.beat(step)                  # progress, optionally the step
    with ddprun_heartbeat.section("checkpoint"): # a known slow phase
        save()

Each call is one non-blocking sendto() on an AF_UNIX datagram socket to the
path in DDPRUN_HEARTBEAT_SOCKET (format: watchdog/heartbeat_wire.h; the
variable names are base/contract.h's, and test base.contract checks them).
Outside ddprun (variable unset) every call is a no-op. Nothing here blocks or
raises: if the agent's buffer is full or the agent is gone, the datagram is
dropped.

ddprun's bootstrap (ddprun_autobeat.py) beats automatically on every
optimizer.step() of an unmodified PyTorch program; the first explicit beat()
stops those automatic beats, so a program that beats itself is judged by its
own beats only ("explicit takes precedence").

Sections: a name is 1..32 of [A-Za-z0-9_.-]; other characters become "_" and
longer names are cut, so a section is never lost to a typo in its name.
Sections of the same name nest: only the outermost start and end are sent
(a torch.save inside `section("checkpoint")` is one checkpoint, not two).
"""

import os
import socket
import threading
import time

__all__ = ["beat", "enabled", "section", "start_section", "end_section"]

# heartbeat_wire.h's limits.
_MAX_SECTION_BYTES = 32
_FORWARD_MIN_INTERVAL_S = 0.100  # kForwardMinIntervalMs
_SECTION_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")

_lock = threading.Lock()
_state = None  # (sock, path, rank) once initialised; (None, "", 0) if disabled
_explicit = False  # set by the first beat(): automatic beats stop
_next_forward = 0.0  # monotonic time before which "fw" is not sent
_open_sections = {}  # name -> nesting depth, guarded by _lock


def _init():
    global _state
    with _lock:
        if _state is not None:
            return _state
        path = os.environ.get("DDPRUN_HEARTBEAT_SOCKET", "")
        # A standby (--standby-workers) has no rank until ddprun assigns it
        # one: silent until then (ddprun_recovery.wait_assigned calls
        # _forget(), and the next beat reads RANK).
        if "DDPRUN_STANDBY" in os.environ and "RANK" not in os.environ:
            path = ""
        sock = None
        rank = 0
        try:
            rank = int(os.environ.get("RANK", "0"))
            if rank < 0:
                rank = 0
        except ValueError:
            rank = 0
        if path:
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
            except OSError:
                sock = None
        if sock is not None:
            # Connected once, a send skips the path lookup every sendto()
            # does: a third of a beat's cost on the worker's thread, paid
            # every optimizer step. Not there yet: sendto() each time.
            try:
                sock.connect(path)
                path = None
            except OSError:
                pass
        # A forked child shares the socket: datagram sends stay atomic.
        _state = (sock, path, rank)
        return _state


def _forget():
    """Drops what _init() read, so the next beat reads RANK again: a
    standby (ddprun_recovery.wait_assigned) gets its rank after starting."""
    global _state
    with _lock:
        if _state is not None and _state[0] is not None:
            _state[0].close()
        _state = None


def _send(fmt, arg):
    """Sends fmt % (rank, arg) (or % rank when arg is None); drops it on error."""
    sock, path, rank = _state if _state is not None else _init()
    if sock is None:
        return
    try:
        data = fmt % ((rank,) if arg is None else (rank, arg))
        if path is None:
            sock.send(data)
        else:
            sock.sendto(data, path)
    except (OSError, TypeError, ValueError):
        pass  # buffer full, agent gone: drop it, never block the worker


def enabled():
    """True when running under ddprun with a heartbeat socket."""
    return _init()[0] is not None


def _step_value(step):
    try:
        step = int(step)
    except (TypeError, ValueError, OverflowError):
        return -1
    # Wider than any real step would not fit the datagram: "no step".
    return step if 0 <= step < 10**18 else -1


def beat(step=-1):
    """Sends one heartbeat, optionally carrying the training step.

    From the first call on, ddprun's automatic optimizer-step beats stop."""
    global _explicit
    _explicit = True
    _send(b"hb %d %d\n", _step_value(step))


def _auto_beat(step):
    """ddprun_autobeat's beat per optimizer.step(); silent once beat() was called."""
    if _explicit:
        return
    _send(b"ab %d %d\n", _step_value(step))


def _forward():
    """Progress seen in a forward pass; at most one per _FORWARD_MIN_INTERVAL_S."""
    global _next_forward
    now = time.monotonic()
    if now < _next_forward:
        return
    _next_forward = now + _FORWARD_MIN_INTERVAL_S
    _send(b"fw %d\n", None)


def _section_name(name):
    try:
        text = str(name)
    except Exception:
        text = ""
    text = "".join(c if c in _SECTION_CHARS else "_" for c in text[:_MAX_SECTION_BYTES])
    return text or "section"


def start_section(name):
    """Marks the start of a known slow phase ("checkpoint", "eval", ...)."""
    try:
        key = _section_name(name)
        with _lock:
            depth = _open_sections.get(key, 0)
            _open_sections[key] = depth + 1
        if depth == 0:
            _send(b"ss %d %s\n", key.encode("ascii"))
    except Exception:
        pass


def end_section(name):
    """Marks its end; an end without a start is ignored."""
    try:
        key = _section_name(name)
        with _lock:
            depth = _open_sections.get(key, 0)
            if depth == 0:
                return
            if depth == 1:
                del _open_sections[key]
            else:
                _open_sections[key] = depth - 1
        if depth == 1:
            _send(b"se %d %s\n", key.encode("ascii"))
    except Exception:
        pass


class section:
    """``with section("checkpoint"):`` -- the section ends even on an exception."""

    __slots__ = ("_name",)

    def __init__(self, name):
        self._name = name

    def __enter__(self):
        start_section(self._name)
        return self

    def __exit__(self, *exc):
        end_section(self._name)
        return False

"""Heartbeat client for workers launched by ddprun (no dependencies).

    import ddprun_heartbeat
    ddprun_heartbeat.beat(step)

Each beat is one non-blocking sendto() of ``hb <rank> <step>\\n`` on an
AF_UNIX datagram socket to the path in DDPRUN_HEARTBEAT_SOCKET (format:
watchdog/heartbeat_wire.h; the variable names are base/contract.h's, and
test base.contract checks them). Outside ddprun (variable unset) beat() is a
no-op. A beat never blocks and never raises: if the agent's buffer is full or
the agent is gone, the beat is dropped.
"""

import os
import socket
import threading

__all__ = ["beat", "enabled"]

_lock = threading.Lock()
_state = None  # (sock, path, rank) once initialised; (None, None, 0) if disabled


def _init():
    global _state
    with _lock:
        if _state is not None:
            return _state
        path = os.environ.get("DDPRUN_HEARTBEAT_SOCKET", "")
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
        _state = (sock, path, rank)
        # A forked child must not share the parent's lazily-made socket state
        # in a confusing way; datagram sockets are fine to share, so keep it.
        return _state


def enabled():
    """True when running under ddprun with a heartbeat socket."""
    return _init()[0] is not None


def beat(step=-1):
    """Send one heartbeat, optionally carrying the training step."""
    sock, path, rank = _state if _state is not None else _init()
    if sock is None:
        return
    try:
        step = int(step)
    except (TypeError, ValueError):
        step = -1
    if step < 0:
        step = -1
    try:
        sock.sendto(b"hb %d %d\n" % (rank, step), path)
    except OSError:
        pass  # buffer full, agent gone: drop the beat, never block the worker

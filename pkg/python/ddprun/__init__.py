"""ddprun's Python side, from the wheel (`pip install ddprun`).

    import ddprun
    ddprun.beat(step)                      # progress, optionally the step
    with ddprun.section("checkpoint"):     # a known slow phase
        save()

The same functions as `import ddprun_heartbeat` (which keeps working, and is
the one module both names share: an explicit beat through either stops the
automatic ones). Outside ddprun every call is a no-op.

`from ddprun import recovery` is rank-scoped recovery (--restart-scope=rank,
docs/RECOVERY.md "Python"): opt-in, not imported here.

The `ddprun` command itself is the C++ binary the wheel puts in the
environment's bin folder, not a Python wrapper.
"""

import os
import sysconfig

from ddprun_heartbeat import beat, enabled, end_section, section, start_section

__all__ = ["beat", "enabled", "section", "start_section", "end_section", "bootstrap_dir",
           "executable", "__version__"]

# The wheel's data folder is the environment's root (sys.prefix): bin/ddprun
# and share/ddprun/ lie there, as in a `cmake --install` prefix.
_ROOT = sysconfig.get_path("data")


def bootstrap_dir():
    """The folder ddprun puts first on workers' PYTHONPATH (ddprun_autobeat:
    automatic beats on optimizer.step() of an unmodified script). Put it on
    PYTHONPATH yourself to get them in a job ddprun did not start."""
    return os.path.join(_ROOT, "share", "ddprun", "python")


def executable():
    """The path of this environment's ddprun binary."""
    return os.path.join(sysconfig.get_path("scripts"), "ddprun")


def _version():
    try:
        from importlib.metadata import version
        return version("ddprun")
    except Exception:  # not installed from the wheel (a source checkout)
        return "unknown"


__version__ = _version()

"""ddprun's bootstrap for Python workers: stacks on demand and automatic
heartbeats.

ddprun puts this folder first on its workers' PYTHONPATH, with the heartbeat
client's folder (watchdog/python) beside it. When DDPRUN_PYSTACK_SIGNAL and
DDPRUN_PYSTACK_DIR are set, faulthandler is registered on that signal (all
threads, appending to $DDPRUN_PYSTACK_DIR/pystack_<pid>.txt), so
`ddprun stacks` and `ddprun attach` read the worker's Python stacks without
stopping it. When DDPRUN_HEARTBEAT_SOCKET is set, ddprun_autobeat's import
hook is installed: optimizer steps, forward passes and checkpoints of an
unmodified PyTorch program are heartbeats (it never imports torch itself).
Otherwise nothing happens. Then the sitecustomize this file shadows (Debian
ships one) is run, so nothing is lost. The names are base/contract.h's (test
base.contract checks them).
"""
import os
import sys


def _ddprun_register():
    sig = os.environ.get("DDPRUN_PYSTACK_SIGNAL")
    folder = os.environ.get("DDPRUN_PYSTACK_DIR")
    if not sig or not folder:
        return
    try:
        import faulthandler
        out = open(os.path.join(folder, "pystack_%d.txt" % os.getpid()), "a")
        faulthandler.register(int(sig), file=out, all_threads=True, chain=False)
        # faulthandler keeps only the descriptor: the file must stay open.
        sys._ddprun_pystack_file = out
    except Exception:  # never break the worker's start
        pass


def _ddprun_autobeat():
    if not os.environ.get("DDPRUN_HEARTBEAT_SOCKET"):
        return
    try:
        import ddprun_autobeat
        ddprun_autobeat.install()
    except Exception:  # no heartbeat folder on the path: no automatic beats
        pass


def _ddprun_chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            try:
                import importlib.util
                spec = importlib.util.spec_from_file_location("_ddprun_shadowed_sitecustomize",
                                                              candidate)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except Exception:
                pass
            return


_ddprun_register()
_ddprun_autobeat()
_ddprun_chain()

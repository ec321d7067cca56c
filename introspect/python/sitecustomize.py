"""ddprun's bootstrap for Python workers: stacks on demand and automatic
heartbeats.

ddprun puts this folder first on its workers' PYTHONPATH, with the heartbeat
client's folder (watchdog/python) beside it. When DDPRUN_PYSTACK_SIGNAL and
DDPRUN_PYSTACK_DIR are set, faulthandler is registered on that signal (all
threads, appending to $DDPRUN_PYSTACK_DIR/pystack_<pid>.txt), so
`ddprun stacks` and `ddprun attach` read the worker's Python stacks without
stopping it, and the next signal answers the watchdog's bytecode probe.
When DDPRUN_HEARTBEAT_SOCKET is set, ddprun_autobeat's import
hook is installed: optimizer steps, forward passes and checkpoints of an
unmodified PyTorch program are heartbeats (it never imports torch itself).
Otherwise nothing happens. Then the sitecustomize this file shadows (the
user's on PYTHONPATH, or Debian's) is run and becomes the module
`import sitecustomize` returns, so nothing is lost or shadowed. The names are base/contract.h's (test
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
        _ddprun_register_probe(int(sig) + 1, out.fileno())
    except Exception:  # never break the worker's start
        pass


def _ddprun_register_probe(sig, fd):
    # The bytecode probe (watchdog/live_stack.h): Python runs this handler
    # only between two bytecodes of the main thread, so an answer says the
    # rank runs Python, and where; a long native call answers after it.
    # Never taken from a handler the program set; syscalls it interrupts
    # restart (SA_RESTART), as native code may not retry on EINTR.
    import signal
    if signal.getsignal(sig) != signal.SIG_DFL:
        return

    def answer(signum, frame):
        try:
            code = frame.f_code
            where = "%d %s %s" % (frame.f_lineno, code.co_name, code.co_filename)
            os.write(fd, ("ddprun-probe %s\n" % where).encode("utf-8", "replace"))
        except Exception:
            pass

    signal.signal(sig, answer)
    signal.siginterrupt(sig, False)


def _ddprun_autobeat():
    if not os.environ.get("DDPRUN_HEARTBEAT_SOCKET"):
        return
    try:
        import ddprun_autobeat
        ddprun_autobeat.install()
    except Exception:  # no heartbeat folder on the path: no automatic beats
        pass


def _ddprun_chain():
    # The next sitecustomize on sys.path (the user's on PYTHONPATH, else
    # Debian's) runs under its own name and replaces this module in
    # sys.modules, so `import sitecustomize` returns it as without ddprun
    # (importlib keeps what a module put in sys.modules while loading). Its
    # errors propagate to site.py, which reports them as it would have.
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            import importlib.util
            spec = importlib.util.spec_from_file_location("sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            sys.modules["_ddprun_sitecustomize"] = sys.modules[__name__]
            sys.modules["sitecustomize"] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules["sitecustomize"] = sys.modules["_ddprun_sitecustomize"]
                raise
            return


_ddprun_register()
_ddprun_autobeat()
_ddprun_chain()

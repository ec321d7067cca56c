"""Automatic heartbeats from unmodified PyTorch programs (ddprun's bootstrap).

ddprun's sitecustomize calls install() in every Python worker when
DDPRUN_HEARTBEAT_SOCKET is set. install() only puts a finder on
sys.meta_path: it imports neither torch nor the heartbeat client, so a
program that never imports torch pays one set lookup per import. When torch
itself imports the modules below, the finder lets them load as usual and then
patches them, once:

  torch.optim.optimizer      one "ab" beat per optimizer.step(), step = this
                             process's count (torch >= 2.0: the global step
                             post-hook; torch 1.13 has none, so its
                             Optimizer._optimizer_step_code, which the
                             profiling wrapper every subclass's step gets
                             calls after each step, is wrapped instead)
  torch.nn.modules.module    "fw", rate-limited, from a forward hook on the
                             outermost modules only: the one the program
                             calls first, and each one it calls train(),
                             eval(), to() or cuda() on (not the children
                             those recurse into); at most _WATCHED_MAX
  torch.nn.parallel.distributed, torch._dynamo.eval_frame
                             likewise on each DistributedDataParallel and
                             each torch.compile wrapper (OptimizedModule),
                             and on the model each wraps
  torch.jit._recursive       scripting and tracing see no ddprun hook
  torch.serialization        save/load inside a "checkpoint" section
  torch.distributed.checkpoint.state_dict_saver / _loader
                             save/load/save_state_dict/load_state_dict/
                             async_save inside a "checkpoint" section
  torch.distributed.distributed_c10d
                             destroy_process_group, and interpreter exit
                             after it was imported, open a "teardown"
                             section that the process's end closes: no step
                             comes after the last one, and a barrier,
                             destroy_process_group and torch's exit can
                             take longer than a learned step timeout

Why not a global module hook: with any global hook installed, every module
call leaves PyTorch's fast path (Module._call_impl) and runs Python; a hook
on the outermost module costs one Python call a pass and leaves the children
on the fast path. Pickling (torch.save of a whole module, copy.deepcopy) and
TorchScript leave the hook out, so a saved model loads where ddprun is not.

Every hook is guarded: a failure in ddprun's code never reaches the user's
program. Only the worker's own process beats: DataLoader workers and other
multiprocessing children (which inherit the variable) stay silent, or a
dataset's torch.load would open checkpoint sections on the rank.
"""

import os
import sys
import time

_WATCHED = frozenset((
    "torch.optim.optimizer",
    "torch.nn.modules.module",
    "torch.nn.parallel.distributed",
    "torch._dynamo.eval_frame",
    "torch.jit._recursive",
    "torch.serialization",
    "torch.distributed.checkpoint.state_dict_saver",
    "torch.distributed.checkpoint.state_dict_loader",
    "torch.distributed.distributed_c10d",
))
_CHECKPOINT = "checkpoint"
_TEARDOWN = "teardown"
# heartbeat_wire.h's kForwardMinIntervalMs, checked here first: the forward
# hook runs once a pass, so its usual path is one clock read.
_FORWARD_MIN_INTERVAL_S = 0.100
_WRAPPED = "__ddprun_wrapped__"
# Modules with ddprun's forward hook at most: each costs one Python call per
# pass of its own; a program that moves many small modules one by one
# (criterion.to(device), ...) does not grow that without bound.
_WATCHED_MAX = 8

_main_pid = None  # the worker's pid, set by install()
_steps = 0  # optimizer.step() calls in this process
_is_compiling = None  # torch's "inside a torch.compile trace" test, once known
_next_forward = 0.0  # monotonic time before which the forward hook is silent
_monotonic = time.monotonic
_hooked = None  # WeakKeyDictionary: module -> its hook's handle, once torch loads
_first_call = []  # the handle of the global pre-hook that finds the first module called
_outer_call = [0]  # depth of train()/to()/cuda() calls: only the outermost is hooked


def _in_worker():
    """True in the process ddprun started, not in its multiprocessing children."""
    if os.getpid() != _main_pid:
        return False
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is None or mp.parent_process() is None
    except Exception:
        return True


def _heartbeat():
    import ddprun_heartbeat  # on the same PYTHONPATH folder; loaded on first use
    return ddprun_heartbeat


def _on_step(*_args, **_kwargs):
    global _steps
    try:
        if _in_worker():
            _steps += 1
            _heartbeat()._auto_beat(_steps)
    except Exception:
        pass


def _compiling():
    # Under torch.compile the hook is traced: is_compiling() is then True and
    # the send is left out of the graph instead of breaking it.
    global _is_compiling
    if _is_compiling is None:
        torch = sys.modules.get("torch")
        compiler = getattr(torch, "compiler", None)
        fn = getattr(compiler, "is_compiling", None)
        if fn is None:
            fn = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
        if fn is None and torch is not None and hasattr(torch, "__version__"):
            fn = bool  # torch without a compiler (1.13): never compiling
        if fn is None:
            return True  # torch still importing: decide on a later call
        _is_compiling = fn
    return _is_compiling()


def _on_forward(_module, _inputs, _output):
    global _next_forward
    try:
        if _compiling():
            return None
        now = _monotonic()
        if now < _next_forward:
            return None
        _next_forward = now + _FORWARD_MIN_INTERVAL_S
        if _in_worker():
            _heartbeat()._forward()
    except Exception:
        pass
    return None


def _patch_optimizer(mod):
    register = getattr(mod, "register_optimizer_step_post_hook", None)
    if register is not None:
        register(_on_step)
        return
    cls = getattr(mod, "Optimizer", None)
    code = getattr(cls, "_optimizer_step_code", None)
    if code is None or getattr(code, _WRAPPED, False):
        return

    def _optimizer_step_code(self):
        code(self)
        _on_step()

    setattr(_optimizer_step_code, _WRAPPED, True)
    cls._optimizer_step_code = _optimizer_step_code


def _watch(module):
    """Puts the forward hook on `module`. Its children stay unhooked: their
    calls run inside its pass."""
    global _hooked
    try:
        if not _in_worker():
            return
        if _hooked is None:
            import weakref
            _hooked = weakref.WeakKeyDictionary()
        if module in _hooked:
            return
        if len(_hooked) < _WATCHED_MAX:
            _hooked[module] = module.register_forward_hook(_on_forward)
        while _first_call:  # a module is watched: no global hook is needed
            _first_call.pop().remove()
    except Exception:
        pass


def _watching(fn):
    """fn (Module.train, to, cuda) that then watches the module it was called
    on, when the call is the program's and not train()'s recursion."""
    import functools

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        outer = _outer_call[0] == 0
        _outer_call[0] += 1
        try:
            return fn(self, *args, **kwargs)
        finally:
            _outer_call[0] -= 1
            if outer:
                _watch(self)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _without_hook(getstate):
    """__getstate__ that leaves ddprun's hook out of the pickled module."""
    def __getstate__(self):
        state = getstate(self) if getstate is not None else self.__dict__.copy()
        try:
            hooks = state.get("_forward_hooks")
            if hooks and any(h is _on_forward for h in hooks.values()):
                state = dict(state)
                state["_forward_hooks"] = type(hooks)(
                    (k, h) for k, h in hooks.items() if h is not _on_forward)
        except Exception:
            pass
        return state

    setattr(__getstate__, _WRAPPED, True)
    return __getstate__


def _patch_module(mod):
    cls = getattr(mod, "Module", None)
    if cls is None or getattr(cls.train, _WRAPPED, False):
        return
    for name in ("train", "to", "cuda"):
        fn = cls.__dict__.get(name)
        if callable(fn):
            setattr(cls, name, _watching(fn))
    cls.__getstate__ = _without_hook(cls.__dict__.get("__getstate__"))
    # The first module the program calls, when it calls none of train(),
    # to() or cuda() before: a global pre-hook, taken off at that first call
    # or as soon as any module is watched.
    register = getattr(mod, "register_module_forward_pre_hook", None)
    if register is None:
        return

    def _on_first_call(module, _inputs):
        try:
            while _first_call:
                _first_call.pop().remove()
            _watch(module)
        except Exception:
            pass
        return None

    _first_call.append(register(_on_first_call))
    # torch.compile(module) warns about any global hook, and the user did not
    # add this one: that warning is not shown.
    import warnings
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are "
                            r"global hooks", category=UserWarning)


def _watch_instances(class_name):
    """A patch that watches every instance of mod.class_name once built: the
    wrappers that are the outermost module by construction."""
    def patch(mod):
        cls = getattr(mod, class_name, None)
        init = getattr(cls, "__init__", None)
        if init is None or getattr(init, _WRAPPED, False):
            return
        import functools

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            _watch(self)
            # The wrapped model too: an evaluation often calls it directly
            # (ddp.module(x)), outside the wrapper. Two calls a pass, not 200.
            inner = getattr(self, "module", None)
            if inner is None:
                inner = getattr(self, "_orig_mod", None)
            if inner is not None:
                _watch(inner)

        setattr(__init__, _WRAPPED, True)
        cls.__init__ = __init__
        if "__getstate__" in cls.__dict__:  # DDP's copies its __dict__ without Module's
            cls.__getstate__ = _without_hook(cls.__dict__["__getstate__"])
    return patch


def _patch_jit(mod):
    """TorchScript compiles a module's forward hooks: ddprun's is taken off
    the module tree while torch.jit.script or trace builds its ScriptModule."""
    create = getattr(mod, "create_script_module", None)
    if create is None or getattr(create, _WRAPPED, False):
        return
    import functools

    @functools.wraps(create)
    def create_script_module(nn_module, *args, **kwargs):
        off = []
        try:
            for m in nn_module.modules():
                handle = _hooked.pop(m, None) if _hooked is not None else None
                if handle is not None:
                    handle.remove()
                    off.append(m)
        except Exception:
            pass
        try:
            return create(nn_module, *args, **kwargs)
        finally:
            for m in off:
                _watch(m)

    setattr(create_script_module, _WRAPPED, True)
    mod.create_script_module = create_script_module


def _in_section(fn):
    """fn wrapped in a "checkpoint" section that ends even when fn raises."""
    if getattr(fn, _WRAPPED, False):
        return fn
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        opened = False
        try:
            if _in_worker():
                _heartbeat().start_section(_CHECKPOINT)
                opened = True
        except Exception:
            pass
        try:
            return fn(*args, **kwargs)
        finally:
            if opened:
                try:
                    _heartbeat().end_section(_CHECKPOINT)
                except Exception:
                    pass

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _patch_functions(names):
    def patch(mod):
        for name in names:
            fn = getattr(mod, name, None)
            if callable(fn):
                setattr(mod, name, _in_section(fn))
    return patch


def _start_teardown():
    try:
        if _in_worker():
            _heartbeat().start_section(_TEARDOWN)
    except Exception:
        pass


def _patch_c10d(mod):
    fn = getattr(mod, "destroy_process_group", None)
    if callable(fn) and not getattr(fn, _WRAPPED, False):
        import functools

        @functools.wraps(fn)
        def destroy_process_group(*args, **kwargs):
            _start_teardown()
            return fn(*args, **kwargs)

        setattr(destroy_process_group, _WRAPPED, True)
        mod.destroy_process_group = destroy_process_group
    # Registered now, so it runs after the handlers the program registers
    # later (atexit is last in, first out), still before the interpreter's
    # own slow finalization.
    import atexit
    atexit.register(_start_teardown)


_PATCHES = {
    "torch.optim.optimizer": _patch_optimizer,
    "torch.nn.modules.module": _patch_module,
    "torch.nn.parallel.distributed": _watch_instances("DistributedDataParallel"),
    # torch.compile's wrapper: its hook runs outside the compiled graph.
    "torch._dynamo.eval_frame": _watch_instances("OptimizedModule"),
    "torch.jit._recursive": _patch_jit,
    "torch.serialization": _patch_functions(("save", "load")),
    "torch.distributed.checkpoint.state_dict_saver":
        _patch_functions(("save", "save_state_dict", "async_save")),
    "torch.distributed.checkpoint.state_dict_loader":
        _patch_functions(("load", "load_state_dict")),
    "torch.distributed.distributed_c10d": _patch_c10d,
}


def _patch(name, mod):
    try:
        _PATCHES[name](mod)
    except Exception:
        pass


class _PatchingLoader:
    """Runs the real loader, then the patch. The module keeps the real loader
    as __loader__/__spec__.loader (inspect, importlib.resources look there)."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        try:
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        _patch(self._name, module)


class _Finder:
    """A sys.meta_path finder that answers only for _WATCHED names, by asking
    the finders after it and wrapping the loader they return."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or isinstance(finder, _Finder):
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is None:
                    continue
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        except Exception:
            pass
        return None  # let the import system search as if we were not here


def install():
    """Starts watching for torch's modules; patches those already imported."""
    global _main_pid
    if _main_pid is not None:
        return
    _main_pid = os.getpid()
    sys.meta_path.insert(0, _Finder())
    for name in sorted(_WATCHED):
        mod = sys.modules.get(name)
        if mod is not None:
            _patch(name, mod)

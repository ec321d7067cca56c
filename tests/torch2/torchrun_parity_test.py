"""ddprun against the torchrun of the torch it runs under (the torch2 label:
the venv of scripts/setup-torch.sh). Self-updating: the flags come from that
torchrun's own parser, so a torch release with a new flag fails this test
until ddprun accepts it.

  python torchrun_parity_test.py flags <ddprun>
      Every torchrun flag, in every spelling, with its default or each of its
      choices (else a sample value), is accepted by ddprun: it does not end in
      a usage error (exit 2, "see ddprun --help"). The flags in REFUSED are
      refused on purpose, with a clear reason naming the flag.
  python torchrun_parity_test.py env <ddprun> <workdir>
      The same job (2 workers, --standalone, a script that writes its
      environment) under torchrun and ddprun: the same variables with the
      same meanings; every difference is listed in ENV_DIFFERENCES with its
      reason (docs/TORCHRUN_2.md).
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Flags ddprun refuses on purpose; the usage error must contain the reason.
REFUSED = {
    "--logs-specs": "Python entry point",
    "--print-completion": "not available",
    "--duplicate-stdout-filters": "not supported by ddprun yet",
    "--duplicate-stderr-filters": "not supported by ddprun yet",
}

# Worker variables that differ on purpose (docs/TORCHRUN_2.md):
# name -> (present under torchrun, present under ddprun, why).
ENV_DIFFERENCES = {
    "DDPRUN_STORE_ADDR": (False, True, "ddprun's store for its own components"),
    "DDPRUN_STORE_PREFIX": (False, True, "ddprun's store key prefix"),
    "DDPRUN_STORE_TOKEN": (False, True, "ddprun's store token, when one is set"),
    "DDPRUN_RDZV_TOKEN": (False, True, "ddprun's store token, when one is set"),
    "DDPRUN_HEARTBEAT_SOCKET": (False, True, "the hang watchdog's heartbeat socket"),
    "DDPRUN_LOG_DIR": (False, True, "the attempt's log folder"),
    "PYTHONFAULTHANDLER": (False, True, "freeze detection is on by default: faulthandler prints a "
                           "hung rank's traceback into the hang report (unless the user set it)"),
    "DDPRUN_RUNTIME_DIR": (False, True, "ddprun's runtime folder"),
    "DDPRUN_PYSTACK_DIR": (False, True, "where `ddprun stacks` collects Python tracebacks"),
    "DDPRUN_PYSTACK_SIGNAL": (False, True, "the faulthandler signal `ddprun stacks` sends"),
    "NCCL_ASYNC_ERROR_HANDLING": (False, True, "the pre-2.2 name of TORCH_NCCL_ASYNC_ERROR_HANDLING, "
                                  "kept for torch 1.x workers"),
    "PYTHONPATH": (False, True, "ddprun prepends the folder of its ddprun_heartbeat module"),
    "TORCHELASTIC_TIMER_FILE": (None, None, "set when a watchdog timer server runs"),
    "TORCHELASTIC_HEALTH_CHECK_PORT": (None, None, "torchrun's optional health check"),
    "TORCH_WORKER_WATCHDOG_FILE": (None, None, "torchrun's optional worker watchdog"),
}
# Variables whose values legitimately differ between two launches.
PER_JOB = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "DDPRUN_STORE_ADDR",
           "DDPRUN_STORE_PREFIX", "DDPRUN_HEARTBEAT_SOCKET", "DDPRUN_LOG_DIR", "DDPRUN_RUNTIME_DIR",
           "DDPRUN_PYSTACK_DIR", "PYTHONPATH"}
# Same variable, a different value on purpose: name -> (torchrun's, ddprun's, why).
VALUE_DIFFERENCES = {
    "MASTER_ADDR": ("localhost", "127.0.0.1", "both loopback with --standalone; ddprun gives the address"),
}


_log_dir = None


def sample_log_dir():
    """One log folder for every --log-dir sample, removed at exit (one per
    call left hundreds of folders in /tmp)."""
    global _log_dir
    if _log_dir is None:
        _log_dir = tempfile.mkdtemp(prefix="ddprun-parity-")
        atexit.register(shutil.rmtree, _log_dir, True)
    return _log_dir


def sample_value(action):
    dest = action.dest
    if dest == "log_dir":
        return [sample_log_dir()]
    samples = {"local_addr": "127.0.0.1",
               "logs_specs": "default", "shutdown_timeout": "5", "master_port": "29500",
               "event_log_handler": "null", "rdzv_conf": "join_timeout=60"}
    if dest in samples:
        return [samples[dest]]
    if action.choices:
        return [str(c) for c in action.choices]
    if action.default not in (None, ""):
        return [str(action.default)]
    return ["1"]


def check_flags(ddprun):
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    failures, checked = [], 0
    for action in parser._actions:
        if not action.option_strings or "-h" in action.option_strings:
            continue
        values = [None] if action.nargs == 0 else sample_value(action)
        for spelling in action.option_strings:
            for value in values:
                argv = [ddprun, spelling] + ([] if value is None else [value]) + ["/bin/true"]
                if spelling not in ("--nproc-per-node", "--nproc_per_node"):
                    argv[1:1] = ["--nproc-per-node=1"]
                r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                   stdin=subprocess.DEVNULL)
                checked += 1
                usage = r.returncode == 2 and "see ddprun --help" in r.stderr
                canonical = action.option_strings[-1] if action.option_strings[-1].startswith("--") \
                    else action.option_strings[0]
                canonical = canonical.replace("_", "-")
                reason = REFUSED.get(canonical)
                if reason is not None:
                    if not (usage and reason in r.stderr and canonical.lstrip("-") in
                            r.stderr.replace("_", "-")):
                        failures.append(f"{' '.join(argv[1:])}: expected a refusal naming the flag "
                                        f"and '{reason}', got exit {r.returncode}: {r.stderr.strip()}")
                elif usage:
                    failures.append(f"{' '.join(argv[1:])}: refused: {r.stderr.strip()}")
    print(f"torchrun flags checked: {checked} invocations")
    for f in failures:
        print("FAIL", f)
    return not failures


DUMP = r'''
import json, os, sys
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(dict(os.environ), f)
'''


def run_job(argv, out, script):
    os.makedirs(out, exist_ok=True)
    r = subprocess.run(argv + [script, out], capture_output=True, text=True, timeout=180,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return [json.load(open(os.path.join(out, f"rank{i}.json"))) for i in range(2)]


def check_env(ddprun, workdir):
    os.makedirs(workdir, exist_ok=True)
    script = os.path.join(workdir, "dump_env.py")
    with open(script, "w") as f:
        f.write(DUMP)
    os.environ.pop("OMP_NUM_THREADS", None)
    os.environ.update(PYTHON_EXEC=sys.executable, DDPRUN_PYTHON=sys.executable)
    base = dict(os.environ)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    theirs = run_job([torchrun, "--standalone", "--nproc-per-node=2"], os.path.join(workdir, "t"), script)
    ours = run_job([ddprun, "--standalone", "--nproc-per-node=2"], os.path.join(workdir, "d"), script)
    ok = True
    for rank in range(2):
        t = {k: v for k, v in theirs[rank].items() if base.get(k) != v}
        d = {k: v for k, v in ours[rank].items() if base.get(k) != v}
        for key in sorted(set(t) | set(d)):
            if key in ENV_DIFFERENCES:
                in_t, in_d, why = ENV_DIFFERENCES[key]
                if (in_t is not None and (key in t) != in_t) or (in_d is not None and (key in d) != in_d):
                    print(f"FAIL rank {rank} {key}: documented as torchrun={in_t} ddprun={in_d} ({why}), "
                          f"seen torchrun={key in t} ddprun={key in d}")
                    ok = False
                continue
            if key not in t or key not in d:
                print(f"FAIL rank {rank} {key}: only under {'torchrun' if key in t else 'ddprun'} "
                      f"= {t.get(key, d.get(key))!r}")
                ok = False
            elif key in VALUE_DIFFERENCES:
                want = VALUE_DIFFERENCES[key][:2]
                if (t[key], d[key]) != want:
                    print(f"FAIL rank {rank} {key}: documented as torchrun {want[0]!r} ddprun "
                          f"{want[1]!r}, seen {t[key]!r} and {d[key]!r}")
                    ok = False
            elif key not in PER_JOB and t[key] != d[key]:
                print(f"FAIL rank {rank} {key}: torchrun {t[key]!r} ddprun {d[key]!r}")
                ok = False
        print(f"rank {rank}: torchrun sets {len(t)} variables, ddprun {len(d)}; same meaning: "
              f"{sorted(k for k in t if k in d)}")
    # Same meanings for the per-job ones: a port, a run id, an error file per rank.
    for name, env_ in (("torchrun", theirs), ("ddprun", ours)):
        for rank in range(2):
            e = env_[rank]
            if not e["MASTER_PORT"].isdigit() or e["MASTER_ADDR"] == "":
                print(f"FAIL {name} rank {rank}: MASTER_ADDR/PORT {e['MASTER_ADDR']}:{e['MASTER_PORT']}")
                ok = False
            if e["TORCHELASTIC_RUN_ID"] != env_[0]["TORCHELASTIC_RUN_ID"]:
                print(f"FAIL {name}: ranks disagree on TORCHELASTIC_RUN_ID")
                ok = False
        if env_[0]["TORCHELASTIC_ERROR_FILE"] == env_[1]["TORCHELASTIC_ERROR_FILE"]:
            print(f"FAIL {name}: both ranks share one TORCHELASTIC_ERROR_FILE")
            ok = False
    return ok


def main():
    import torch
    print(f"torch {torch.__version__} from {sys.executable}")
    mode, ddprun = sys.argv[1], sys.argv[2]
    if mode == "flags":
        ok = check_flags(ddprun)
    else:
        ok = check_env(ddprun, sys.argv[3])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

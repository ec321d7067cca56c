"""What the benches of the agent's own cost share (beat_cost_bench.py,
metrics_cost_bench.py, console_bench.py): the agent's CPU time read from
/proc, and the load flags of the two that put ranks beating on it, so both
measure the same window the same way.

Imported as a sibling: python3 puts a script's own folder first on
sys.path, so `python3 bench/x.py` finds this module from any directory.
"""
import os

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """utime + stime of process `pid` in seconds (/proc/PID/stat; the time
    of its children, the workers, is not in it)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def add_load_args(parser, step_ms, seconds, warmup):
    """--ranks beating every --step-ms, measured for --seconds after
    --warmup, --reps times; the defaults of the pace are each bench's own."""
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--step-ms", type=float, default=step_ms)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--warmup", type=float, default=warmup)
    parser.add_argument("--reps", type=int, default=3)

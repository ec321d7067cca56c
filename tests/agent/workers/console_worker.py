# A worker for the console and terminal tests (plain python3, no torch).
#
#   flood          say "flooding" on stderr, print numbered lines on stdout
#                  until SIGTERM, then print "stopping" and hang (the agent's
#                  grace period ends it)
#   tty            print what isatty() says of fd 0, 1, 2 and the width
#   progress N     N '\r' progress updates 300 ms apart, each stamped with
#                  the CLOCK_MONOTONIC ns of its write; then a newline
#   input          input("name? "), then print "got <name>"
#   pdb            breakpoint(), then print "after breakpoint"
#   input-rank1 [D]  rank 1 only: input("name? "), print "got <name>"
#   pdb-rank1 [D]    rank 1 only: breakpoint(); then "after read" (both);
#                    the others exit 0, with D once rank 1 is done
#   sleep          print "ready pid=<pid>", then sleep until killed
#   pdb-local      rank 1 only (rank 0 exits 0): print "ready pid=<pid>", then
#                  breakpoint() with a local zebra_count = 4242 (Tab completes
#                  it), then "after read"
#   pdb-both       every rank: breakpoint() with a local who = "rank<rank>",
#                  then "after read <rank>"
#   edit           import readline, then input("edit? "), print "got [<line>]"
#   bars N         a '\r' progress bar 0..N on stderr (tqdm's way), its tail
#                  long and short in turn (stale characters would show);
#                  rank 0 also logs a line on stdout every third update
#   emit           write emit_bytes() to stdout in pieces that split lines
#   import-error D every rank fails importing no_such_module_<rank>; rank 0
#                  first, the others once rank 0 has marked folder D
#   import-error-late D  the same behind a wrapper (rank 0's parent is its
#                  worker): the others work on (spin) until the agent has
#                  reaped rank 0's worker, then 50 ms more, then fail
import os
import signal
import sys
import time



def emit_bytes():
    """JSON lines and what a line handler would touch: an empty line, a '\\r',
    tabs, bytes that are not UTF-8, a long line, no newline at the end."""
    lines = [b'{"rank": %d, "i": %d, "s": "a\tb"}\n' % (int(rank), i) for i in range(50)]
    return b"".join(lines) + b"\n\r{\"bar\": 1}\r\n\xff\xfe\n" + b"x" * 70000 + b"\n{\"end\": true}"


mode = sys.argv[1]
rank = os.environ.get("RANK", "?")

if mode == "flood":
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    sys.stderr.write(f"flooding rank={rank}\n")
    sys.stderr.flush()
    i = 0
    while not stop:
        os.write(1, f"rank={rank} line={i} {'x' * 80}\n".encode())
        i += 1
    sys.stderr.write(f"stopping rank={rank}\n")
    sys.stderr.flush()
    while True:
        time.sleep(60)
elif mode == "tty":
    cols = os.get_terminal_size(1).columns if os.isatty(1) else -1
    print(f"tty in={int(os.isatty(0))} out={int(os.isatty(1))} err={int(os.isatty(2))} "
          f"cols={cols}", flush=True)
elif mode == "progress":
    for i in range(int(sys.argv[2])):
        os.write(1, f"\rprogress {i} t={time.monotonic_ns()} ".encode())
        time.sleep(0.3)
    os.write(1, b"\n")
elif mode == "input":
    name = input("name? ")
    print(f"got {name}", flush=True)
elif mode == "pdb":
    breakpoint()
    print("after breakpoint", flush=True)
elif mode == "emit":
    data = emit_bytes()
    for i in range(0, len(data), 997):  # pieces end mid-line
        os.write(1, data[i:i + 997])
elif mode == "import-error-late":
    # The agent's failure drain starts when it reaps rank 0's worker (this
    # process's parent, a wrapper): the others are still busy then, and a
    # drain that looked only at their wrappers (asleep in wait()) would stop
    # them before their tracebacks. Spinning, as a rank still working runs.
    import importlib
    mark = os.path.join(sys.argv[2], "rank0-worker")
    if rank == "0":
        with open(mark + ".tmp", "w") as f:
            f.write(str(os.getppid()))
        os.rename(mark + ".tmp", mark)
    else:
        while not os.path.exists(mark):
            pass
        worker0 = int(open(mark).read())
        while True:
            try:
                os.kill(worker0, 0)  # a zombie still answers: not reaped yet
            except ProcessLookupError:
                break
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
    importlib.import_module(f"no_such_module_{rank}")
elif mode == "import-error":
    import importlib
    mark = os.path.join(sys.argv[2], "rank0-failing")
    if rank == "0":
        open(mark, "w").close()
    else:
        # The slower rank: after rank 0. It spins rather than sleeps, as a
        # rank still importing runs: a sleeping poll loop looks idle to the
        # agent's failure drain (state S, no CPU time over its sample,
        # which a loaded machine's late wake-ups made likely), and an idle
        # rank is stopped at once (agent.output failed so at load 14).
        while not os.path.exists(mark):
            pass
    importlib.import_module(f"no_such_module_{rank}")
elif mode == "bars":
    n = int(sys.argv[2])
    for i in range(n + 1):
        tail = "x" * (30 if i % 2 else 5)
        sys.stderr.write(f"\rbar rank={rank} {i}/{n} |{'#' * i}{'.' * (n - i)}| {tail}")
        sys.stderr.flush()
        if rank == "0" and i % 3 == 0:
            print(f"log rank=0 step={i}", flush=True)
        time.sleep(0.005)
    sys.stderr.write("\n")
elif mode in ("input-rank1", "pdb-rank1"):
    # With a folder D: rank 0 stays until rank 1 has read (D/rank1-done).
    done = os.path.join(sys.argv[2], "rank1-done") if len(sys.argv) > 2 else None
    if rank == "1":
        if mode == "input-rank1":
            print(f"got {input('name? ')}", flush=True)
        else:
            breakpoint()
        print("after read", flush=True)
        if done:
            open(done, "w").close()
    elif done:
        while not os.path.exists(done):
            time.sleep(0.01)
elif mode == "pdb-local":
    if rank == "1":
        print(f"ready pid={os.getpid()}", flush=True)
        zebra_count = 4242
        breakpoint()
        print("after read", flush=True)
elif mode == "pdb-both":
    who = f"rank{rank}"
    breakpoint()
    print(f"after read {rank}", flush=True)
elif mode == "edit":
    import readline  # noqa: F401  (input() edits with readline now)
    print(f"got [{input('edit? ')}]", flush=True)
elif mode == "sleep":
    print(f"ready pid={os.getpid()}", flush=True)
    while True:
        time.sleep(60)
else:
    sys.exit(64)

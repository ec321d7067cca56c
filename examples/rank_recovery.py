"""Recovery without rollback from Python (docs/RECOVERY.md, "Python"): a tiny
model on gloo that survives a rank's death without reading a checkpoint.

    ddprun --restart-scope=rank --max-restarts=1 --nproc-per-node=2 \\
        examples/rank_recovery.py --steps 40 --kill-rank 1 --kill-step 10

Deterministic: one seed for the model, every batch a function of (step,
rank), gradients averaged by one flat all_reduce. When a peer dies, the
survivors abandon the step in flight, ddprun starts a replacement, and
ddprun_recovery re-forms the group and sends the replacement the model, the
momentum and the step from a survivor; the step in flight is then redone.
The final parameters are bit-identical to those of a run without the
failure. Each rank prints, at the end:

    rank R done 40 steps, generation G, parameters identical on W ranks: True

--kill-rank R --kill-step K: rank R SIGKILLs itself at step K, after its
backward and before the all_reduce (its peers are then waiting in it), in
generation 0 only: its replacement goes on; with --hang it sleeps there
instead, for ddprun's watchdog to find (--heartbeat-timeout); with --raise it
fails there with an error of its own (as an out-of-memory error would),
which recovery does not catch: the rank ends with it at once, and ddprun
replaces it as it would a killed one. --progress: a line per step.
--out FILE: rank 0 writes the
final parameters there (float32, raw bytes), for a test to compare.
With --standby-workers=1 a pre-started standby (model built, torch
imported) takes the failed rank's slot instead of a process started then.
Outside ddprun (torchrun, or ddprun without --restart-scope=rank) it trains
the same way and a failure ends the run, as it would without the module.
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    from ddprun import beat, recovery  # the wheel's package
except ImportError:  # ddprun's PYTHONPATH folder
    import ddprun_recovery as recovery
    from ddprun_heartbeat import beat


def build(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt


def batch(seed, step, rank):
    # The data order is the step's: a replacement that resumes at step S
    # draws what the dead rank would have drawn.
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x[:, :4].sin() * 2.0


class GroupBroken(Exception):
    """The step's collective failed: a peer died or hung, which recover()
    repairs. Any other error (an out-of-memory error, a bug) is this rank's
    own: no peer failure will be reported for it, so it ends the rank."""


def train_step(model, opt, step, x, y, fault):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])  # fresh each step
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        time.sleep(600)  # ddprun's watchdog SIGKILLs it long before
        sys.exit(3)
    if fault == "raise":
        raise ValueError(f"--raise: rank {dist.get_rank()} fails on its own at step {step}")
    # At the collective: a rank hung before it is then a step behind the
    # ranks waiting in it, which is how ddprun's watchdog tells which one
    # to replace (with equal steps it would blame the oldest beat).
    beat(step)
    try:
        recovery.all_reduce(grads, timeout=60)
    except (recovery.PeerFailed, RuntimeError) as error:  # gloo's error on a dead peer
        raise GroupBroken() from error
    grads /= dist.get_world_size()
    offset = 0
    for p in model.parameters():
        p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    opt.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--hang", action="store_true",
                    help="--kill-rank stops at --kill-step instead (alive, asleep)")
    ap.add_argument("--raise", dest="raise_", action="store_true",
                    help="--kill-rank fails at --kill-step with an error of its own instead")
    ap.add_argument("--out", default="")
    ap.add_argument("--progress", action="store_true", help="print 'rank R step S' per step")
    a = ap.parse_args()

    model, opt = build(a.seed)
    if recovery.is_standby():
        # --standby-workers: built what needs no rank, now wait for a slot.
        rank, _, gen = recovery.wait_assigned()
        print(f"standby {os.environ['DDPRUN_STANDBY']} is rank {rank}, generation {gen}",
              flush=True)
    # The collective timeout bounds what ddprun's notification does not
    # interrupt (the state broadcast; a DDP backward).
    recovery.init_process_group("gloo", timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    progress = {"step": 0}
    if recovery.is_replacement():
        progress = recovery.recover(model, opt, None, timeout=60)
        print(f"rank {rank} replacement joined generation {recovery.generation()} "
              f"at step {progress['step']}", flush=True)
    while progress["step"] < a.steps:
        step = progress["step"]
        if a.progress:
            print(f"rank {rank} step {step}", flush=True)
        fault = None
        if rank == a.kill_rank and step == a.kill_step and recovery.generation() == 0:
            fault = "hang" if a.hang else "raise" if a.raise_ else "kill"
        try:
            train_step(model, opt, step, *batch(a.seed, step, rank), fault)
            progress["step"] = step + 1  # committed: the all_reduce finished here
        except GroupBroken as broken:
            error = broken.__cause__
            began = time.monotonic()
            print(f"rank {rank} abandoned step {step}: {type(error).__name__}", flush=True)
            progress = recovery.recover(model, opt, progress, error, timeout=60)
            print(f"rank {rank} recovered into generation {recovery.generation()} at step "
                  f"{progress['step']} in "
                  f"{(time.monotonic() - began) * 1000:.0f} ms", flush=True)

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    mine = flat.clone()
    dist.broadcast(flat, 0)
    same = torch.equal(flat, mine)
    agree = torch.tensor([1 if same else 0])
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    print(f"rank {rank} done {progress['step']} steps, generation {recovery.generation()}, "
          f"parameters identical on {world} ranks: {bool(agree.item())}", flush=True)
    if rank == 0 and a.out:
        with open(a.out + ".tmp", "wb") as f:
            f.write(mine.numpy().tobytes())
        os.replace(a.out + ".tmp", a.out)
    dist.destroy_process_group()
    return 0 if agree.item() else 1


if __name__ == "__main__":
    # After a recovery the abandoned group's gloo threads may still run:
    # exit() leaves without the interpreter's teardown then.
    recovery.exit(main())

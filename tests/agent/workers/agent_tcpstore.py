"""Every rank joins the agent's c10d TCPStore at MASTER_ADDR:MASTER_PORT as a
client (`is_master=False` on every rank, what TORCHELASTIC_USE_AGENT_STORE=True
promises under torchrun 2.x), uses set/get/add/wait/compare_set and env://
gloo (which joins the same store), fails once on purpose (rank 1, attempt 0)
and, restarted at the same MASTER_PORT, finds the store empty again: torchrun
2.x's agent starts each round with a new TCPStore, and torch 2.x's env:// adds
no per-attempt prefix, so attempt 0's gloo addresses must be gone. Works with
torch 1.13 and 2.x. Prints "rank R agent store ok ..." on the last attempt."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=60))
a = f"a{attempt}"
store.set(f"{a}/rank{rank}", str(rank))
store.wait([f"{a}/rank{r}" for r in range(world)])
values = [store.get(f"{a}/rank{r}").decode() for r in range(world)]
store.add(f"{a}/sum", rank + 1)
store.add(f"{a}/arrived", 1)
# Exactly one rank's compare_set finds the key absent and writes its rank.
store.compare_set(f"{a}/leader", "", str(rank))
leader = store.get(f"{a}/leader").decode()
assert leader in {str(r) for r in range(world)}, leader

store.wait([f"{a}/arrived"])
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
total = int(t.item())
dist.barrier()
dist.destroy_process_group()

if attempt == 0:
    store.set(f"old/{rank}", "from attempt 0")
    store.wait([f"old/{r}" for r in range(world)])
    if rank == 1:
        sys.exit(3)  # the group restarts
    store.wait(["never"], datetime.timedelta(seconds=120))  # stopped by the agent first

# compare_set writes only where the key is absent (1.13's TCPStore has no check()).
for old in [f"old/{rank}", f"a0/rank{rank}"]:
    found = store.compare_set(old, "", "absent").decode()
    assert found == "absent", f"attempt 0's key {old} is still in the store: {found}"
if int(torch.__version__.split(".")[0]) >= 2:
    # torch 2.x cancels a timed-out wait (CANCEL_WAIT); the store stays usable.
    try:
        store.wait([f"{a}/absent"], datetime.timedelta(milliseconds=200))
        raise SystemExit("wait on an absent key returned")
    except RuntimeError:  # DistStoreError derives from it
        pass
    assert store.get(f"{a}/rank0").decode() == "0"
print(f"rank {rank} agent store ok attempt {attempt} values {','.join(values)} "
      f"allreduce {total}", flush=True)

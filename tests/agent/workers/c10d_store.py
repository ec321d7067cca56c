"""Each rank opens a c10d TCPStore itself at MASTER_ADDR:MASTER_PORT, hosting
it on rank 0 only when TORCHELASTIC_USE_AGENT_STORE says the agent does not
(ddprun says True, as torchrun 2.x: every rank is then a client), sets a key
and reads every rank's: proof that scripts using c10d stores directly and
reading the variable run under ddprun. Prints "rank R store ok 0,1,...". """
import datetime
import os

import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
host_store = os.environ["TORCHELASTIC_USE_AGENT_STORE"] != "True"
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      host_store and rank == 0, timeout=datetime.timedelta(seconds=60))
store.set(f"rank{rank}", str(rank))
values = [store.get(f"rank{r}").decode() for r in range(world)]  # get waits for the key
store.set(f"done{rank}", "1")
print(f"rank {rank} store ok {','.join(values)}", flush=True)
if host_store and rank == 0:  # the host stays until every rank has read
    store.wait([f"done{r}" for r in range(world)])

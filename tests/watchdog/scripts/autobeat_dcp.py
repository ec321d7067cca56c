# An unmodified script that saves and loads with torch.distributed.checkpoint
# (single process, no process group), then takes one optimizer step.
import tempfile

import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    import torch.distributed.checkpoint as dcp
    save, load = dcp.save, dcp.load
except (ImportError, AttributeError):  # torch 1.13 has neither
    save = load = None
if save is not None:
    with tempfile.TemporaryDirectory() as d:
        save({"model": model.state_dict()}, checkpoint_id=d)
        state = {"model": model.state_dict()}
        load(state, checkpoint_id=d)
opt.zero_grad()
model(torch.randn(2, 4)).sum().backward()
opt.step()

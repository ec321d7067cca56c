# An unmodified script with a 200-module model (100 Linear+ReLU pairs), run
# under ddprun's bootstrap: after it moves the model, trains it, evaluates it
# and wraps it as a one-process gloo DDP, it prints what ddprun left on the
# module call path, counted, not timed. Then pickling and TorchScript must not
# see ddprun's hook. Run by tests/watchdog/autobeat_test.cc.
import copy
import io
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist

from torch.nn.modules import module as torch_module

layers = []
for _ in range(100):
    layers += [torch.nn.Linear(4, 4), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers)
criterion = torch.nn.MSELoss()
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def hooked(m):
    return [n for n, sub in m.named_modules() if sub._forward_hooks or sub._forward_pre_hooks]


def global_hooks():
    return len(torch_module._global_forward_hooks) + len(torch_module._global_forward_pre_hooks)


model.to("cpu")
model.train()
for _ in range(3):
    opt.zero_grad()
    criterion(model(torch.randn(2, 4)), torch.zeros(2, 4)).backward()
    opt.step()
model.eval()
with torch.no_grad():
    model(torch.randn(2, 4))
counts = {"global": global_hooks(), "hooked": hooked(model),
          "children_hooked": sum(1 for m in list(model.modules())[1:] if m._forward_hooks)}

# Pickled whole (torch.save of the module, deepcopy): no ddprun hook inside.
buf = io.BytesIO()
torch.save(model, buf)
try:  # torch 2.x loads weights only unless told; 1.13 has no such argument
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
except TypeError:
    loaded = torch.load(io.BytesIO(buf.getvalue()))
counts["pickled_hooks"] = len(loaded._forward_hooks)
counts["deepcopy_hooks"] = len(copy.deepcopy(model)._forward_hooks)
counts["pickle_names_ddprun"] = b"ddprun" in buf.getvalue()
# TorchScript compiles hooks; ddprun's is not TorchScript and must be left out.
scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4)).eval())
counts["scripted"] = scripted(torch.zeros(1, 4)).shape[1]
counts["traced"] = torch.jit.trace(model, torch.zeros(1, 4))(torch.zeros(1, 4)).shape[1]
counts["hooked_after_jit"] = hooked(model)

# DDP: the wrapper and the model it wraps (called directly in evaluations).
with tempfile.TemporaryDirectory() as d:
    dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "pg"),
                            rank=0, world_size=1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.randn(2, 4)).sum().backward()
    counts["ddp_hooked"] = hooked(ddp)
    counts["ddp_global"] = global_hooks()
    dist.destroy_process_group()
json.dump(counts, sys.stdout)
print(flush=True)

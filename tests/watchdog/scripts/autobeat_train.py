# An unmodified PyTorch script (no ddprun import): 5 training steps, an
# evaluation loop without optimizer steps, checkpoints (torch.save, torch.load,
# a torch.save that fails), a DataLoader worker process that saves too, then a
# 6th step. Run by tests/watchdog/autobeat_test.cc under DDPRUN_HEARTBEAT_SOCKET.
import io
import os
import tempfile
import time

import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train_step():
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()

class SavingDataset(torch.utils.data.Dataset):
    # Runs in a DataLoader worker: its torch.save must not open a section.
    def __len__(self):
        return 2

    def __getitem__(self, i):
        torch.save(torch.zeros(1), io.BytesIO())
        return torch.zeros(1)

for _ in range(5):
    train_step()
for _ in torch.utils.data.DataLoader(SavingDataset(), num_workers=1):
    pass
# Evaluation: forward passes only, long enough for the forward rate limit
# (kForwardMinIntervalMs) to pass at least twice.
start = time.monotonic()
iterations = 0
with torch.no_grad():
    while time.monotonic() - start < 0.5 or iterations < 10:
        model(torch.randn(4, 8))
        iterations += 1
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "model.pt")
    torch.save(model.state_dict(), path)
    model.load_state_dict(torch.load(path))
    try:
        torch.save(model.state_dict(), os.path.join(d, "missing", "model.pt"))
    except Exception:
        pass
train_step()

# A PyTorch script that beats itself after two steps: from then on ddprun's
# automatic optimizer-step beats stop ("explicit takes precedence").
import torch

import ddprun_heartbeat

model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters())
for step in range(4):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    if step >= 1:
        ddprun_heartbeat.beat(100 + step)

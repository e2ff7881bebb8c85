"""Clean: a curriculum whose batches grow every step. Each step's batch and outputs are dropped
at the next step: live memory rises with the batch shape, but nothing outlives a step."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(STEPS):
    rows = B * (step + 1)  # longer (here: more) samples as training goes on
    x, y = torch.randn(rows, IN), torch.randn(rows, OUT)
    out = model(x)
    loss = F.mse_loss(out, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

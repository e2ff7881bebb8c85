"""Leak: the previous step's loss (with its autograd graph) is kept in `last_loss`."""

import torch
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(B, IN), torch.randn(B, OUT)

last_loss = None
for step in range(STEPS):
    loss = ((model(x) - y) ** 2).mean()  # LEAK
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if last_loss is not None and loss > last_loss:
        print("loss went up at step", step)
    last_loss = loss

"""Clean: two losses on one graph; `retain_graph=True` is needed for the second backward."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(B, IN), torch.randn(B, OUT)

for _ in range(STEPS):
    out = model(x)
    loss_a = F.mse_loss(out, y)
    loss_b = out.abs().mean()
    loss_a.backward(retain_graph=True)
    loss_b.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

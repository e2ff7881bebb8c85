"""Anti-pattern: `retain_graph=True` in every step, though no second backward follows."""

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
    loss = F.mse_loss(out, y)
    loss.backward(retain_graph=True)  # LEAK
    opt.step()
    opt.zero_grad(set_to_none=True)

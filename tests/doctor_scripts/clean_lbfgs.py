"""Clean: LBFGS with a closure. Its curvature history (in optimizer.state, up to history_size
pairs of flat vectors) grows for the first steps: optimizer state, not a leak."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
x, y = torch.randn(B, IN), torch.randn(B, OUT)

for _ in range(STEPS):

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)

"""Clean: training with AdamW, and an evaluation under `torch.no_grad()` every two steps."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(B, IN), torch.randn(B, OUT)

opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def evaluate() -> float:
    model.eval()
    preds = []
    with torch.no_grad():
        for _ in range(2):
            preds.append(model(torch.randn(B, IN)))
    model.train()
    return torch.cat(preds).mean().item()


for step in range(STEPS):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % 2 == 1:
        print("eval", evaluate())

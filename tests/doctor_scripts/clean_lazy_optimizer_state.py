"""Clean: multi-task training round-robin over heads with AdamW. A head's optimizer state (two
moments) is made at its first step, so the state grows for STEPS steps: expected, not a leak."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
trunk = nn.Linear(IN, H)
heads = nn.ModuleList(nn.Linear(H, OUT) for _ in range(STEPS))
opt = torch.optim.AdamW([*trunk.parameters(), *heads.parameters()], lr=1e-3)

for step in range(STEPS):
    x, y = torch.randn(B, IN), torch.randn(B, OUT)
    out = heads[step % len(heads)](torch.relu(trunk(x)))  # a new head each step
    loss = F.mse_loss(out, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

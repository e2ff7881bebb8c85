"""Leak: the model's outputs are kept in a list with their autograd graphs."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(IN, H), nn.Linear(H, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


torch.manual_seed(0)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(B, IN), torch.randn(B, OUT)

outputs = []
for _ in range(STEPS):
    out = model(x)  # LEAK
    loss = F.mse_loss(out, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    outputs.append(out)

"""Clean: a GAN in the DCGAN tutorial's order. The generator's output is made before the
discriminator's step (the first optimizer to step, so the step boundary) and used after it by
the generator's loss: a graph from before a boundary that fell mid-step, not a chain."""

import torch
import torch.nn.functional as F
from torch import nn

B, IN, H, OUT, STEPS = 4, 16, 32, 8, 6  # fp32: out is B*OUT*4 = 128 B, hidden B*H*4 = 512 B
torch.manual_seed(0)
gen = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
disc = nn.Sequential(nn.Linear(OUT, H), nn.ReLU(), nn.Linear(H, 1))
opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
real_label, fake_label = torch.ones(B, 1), torch.zeros(B, 1)

for _ in range(STEPS):
    real = torch.randn(B, OUT)
    fake = gen(torch.randn(B, IN))
    d_loss = F.binary_cross_entropy_with_logits(disc(real), real_label)
    d_loss = d_loss + F.binary_cross_entropy_with_logits(disc(fake.detach()), fake_label)
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = F.binary_cross_entropy_with_logits(disc(fake), real_label)  # alive to next step
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()

"""Train a small CNN on synthetic 64x64 images with memfit's plan.

    python examples/small_cnn.py --gpu rtx-4060 --steps 3

memfit reads the model and its inputs from this file (`small_cnn.py:build:make_batch`), the
form `memfit estimate` and `memfit plan` take for any model of your own.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _common import parse_args, plan_apply_train
from torch import nn

import memfit

SIZE, CLASSES = 64, 10


def build() -> nn.Module:
    def block(i: int, o: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    return nn.Sequential(
        block(3, 32), block(32, 32), nn.MaxPool2d(2),
        block(32, 64), block(64, 64), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES),
    )  # fmt: skip


def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, SIZE, SIZE), torch.randint(0, CLASSES, (n,))


def loss_fn(out: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(out, batch[1])


if __name__ == "__main__":
    args = parse_args(__doc__ or "")
    plan_apply_train(
        source=f"{Path(__file__).resolve()}:build:make_batch", build=build,
        make_batch=make_batch, goal=memfit.Goal(global_batch=32, optimizer="adamw"),
        gpu=args.gpu, steps=args.steps, loss_fn=loss_fn,
    )  # fmt: skip

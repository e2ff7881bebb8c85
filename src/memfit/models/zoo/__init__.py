"""Models memfit builds itself, without transformers or torchvision.

``ZOO`` maps an architecture name (the ``"arch"`` field of a catalog entry's config)
to a constructor taking ``num_classes``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from memfit.models.zoo.resnet import ResNet, resnet18, resnet50

ZOO: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
}

__all__ = ["ZOO", "ResNet", "resnet18", "resnet50"]

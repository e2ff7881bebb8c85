"""Frozen parameters: no gradient and no optimizer state under the named module prefixes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memfit.errors import BadInputError
from memfit.techniques.registry import Build, handler


@dataclass(frozen=True, kw_only=True)
class FreezeConfig:
    """Freeze the parameters under these module-name prefixes (no gradient, no state)."""

    prefixes: tuple[str, ...]

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return "frozen: " + ", ".join(self.prefixes)


def freeze(model: torch.nn.Module, prefixes: tuple[str, ...], name: str) -> None:
    """No gradient for the parameters under these module-name prefixes (in place)."""
    matched = False
    for pname, p in model.named_parameters():
        if any(pname == f or pname.startswith(f + ".") for f in prefixes):
            p.requires_grad_(False)
            matched = True
    if not matched:
        raise BadInputError(
            f"Freeze prefixes {list(prefixes)!r} match no parameter of {name!r}. Give "
            "module-name prefixes from model.named_parameters(), e.g. 'model.embed_tokens'."
        )


@handler
def _freeze(config: FreezeConfig, build: Build) -> None:
    freeze(build.model, config.prefixes, type(build.model).__name__)
    build.applied.append(config.label)

"""Gradient accumulation: each batch split into micro-batches, one optimizer step per batch."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import BadInputError
from memfit.techniques.registry import Build, handler


@dataclass(frozen=True, kw_only=True)
class AccumulationConfig:
    """Split each batch into `steps` micro-batches; the optimizer steps once per batch.

    The loss of each micro-batch is weighted by its share of the samples, so the gradient equals
    that of the whole batch (for a mean-reduced loss). Gradients are synchronised across ranks
    on the last micro-batch only (DDP `no_sync`, FSDP2 `set_requires_gradient_sync`).
    """

    steps: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise BadInputError(
                f"Gradient accumulation steps must be a positive integer, got {self.steps!r}."
            )

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return f"grad-accum x{self.steps}" if self.steps > 1 else ""


@handler
def _accumulate(config: AccumulationConfig, build: Build) -> None:
    build.grad_accum = config.steps
    if config.steps > 1:
        build.applied.append(config.label)
        build.left_to_caller.append(
            f"gradient accumulation: setup.step splits each batch into {config.steps} "
            "micro-batches; another trainer needs its own setting (HF Trainer: "
            f"gradient_accumulation_steps={config.steps})."
        )

"""Shapes the search need not trace: their weights and gradients alone exceed the GPU.

A shape's device memory at any micro-batch and in any placement is at least what its step
holds throughout (memfit.estimator.resident: the weights, and the gradients beside them when
the optimizer steps). When that floor is above the fit limit, tracing the shape can only say
"does not fit", so the search counts it as failed without a trace, and it rules out every
heavier shape as a failed trace would. A 7B plan on a 24 GB card skips six traces so.

Which parameters receive a gradient comes from a trace the search already holds of a shape
whose parameters train alike (same LoRA, quantization, tied embeddings, distillation); before
one exists the floor is the weights alone. The search keeps its results whole: a shape it
would have shown as the baseline is never skipped, and when nothing fits at all the skipped
shapes are traced after all (`Floors.skipped`), so the closest miss is the same.
"""

from __future__ import annotations

from typing import Any

from memfit.estimator.resident import got_gradient, resident_floor_bytes
from memfit.models.sources import ModelSpec
from memfit.planner.shapes import Shape
from memfit.workload import Workload


class Floors:
    """The search's floors, one model build per kind of shape (see the module docstring)."""

    def __init__(self, spec: ModelSpec, limit_bytes: int) -> None:
        self.spec, self.limit = spec, limit_bytes
        self._bytes: dict[Any, int | None] = {}
        #: (shape, micro-batch, placements) skipped, for the search to trace if nothing fits.
        self.skipped: list[tuple[Shape, int, list[tuple[bool, bool]]]] = []

    def above(
        self, shape: Shape, w: Workload, places: list[tuple[bool, bool]], traced: dict[Any, Any]
    ) -> bool:
        """Whether `shape` (its workload `w` at its first micro-batch) cannot fit: its floor,
        less the input embedding where a placement may move it, exceeds the limit."""
        movable = any(e for _, e in places) and not shape.tied
        got = _gradients_of(shape, traced)
        key = (shape, movable, got)
        if key not in self._bytes:
            self._bytes[key] = resident_floor_bytes(self.spec, w, got, embedding_movable=movable)
        floor = self._bytes[key]
        return floor is not None and floor > self.limit


def _gradients_of(shape: Shape, traced: dict[Any, Any]) -> tuple[bool, ...] | None:
    """Which trainable parameters receive a gradient, from a traced shape whose parameters
    train alike, or None."""
    for (s, _), (tr, _, _) in traced.items():
        alike = (s.lora, s.quantize, s.tied, s.distill) == (
            shape.lora, shape.quantize, shape.tied, shape.distill
        )  # fmt: skip
        if alike and not s.in_backward and not s.fsdp_offload:
            got = got_gradient(tr)
            if got is not None:
                return tuple(got)
    return None

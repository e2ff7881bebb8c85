"""Shapes the search need not trace: their weights and gradients alone exceed the GPU.

A shape's device memory at any micro-batch and in any placement is at least what its step
holds throughout (memfit.estimator.trace.resident: the weights, and the gradients beside them when
the optimizer steps). When that floor is above the fit limit, tracing the shape can only say
"does not fit", so the search counts it as failed without a trace, and it rules out every
heavier shape as a failed trace would. A 7B plan on a 24 GB card skips six traces so.

Which parameters receive a gradient comes from a trace the search already holds of a shape
whose parameters train alike (same LoRA, quantization, tied embeddings, distillation, chunked
loss); before one exists the floor is the weights alone. The search keeps its results whole:
a shape it would have shown as the baseline is never skipped, and when nothing fits at all the
skipped shapes are traced after all, at the micro-batches the search would have traced
(`Floors.trace_skipped`), so the closest miss is the same.

One difference remains: a light shape that the tracer cannot run (a TraceError during its
step) rules out nothing heavier in the search without floors; skipped for its floor, it
counts as failed, and its heavier shapes (which cannot fit either: their floors are at least
its) are not estimated, so a plan that then shows no baseline or another closest miss is
possible. A refusal at build time (the floor builds the same model) is not skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from memfit.estimator import got_gradient, resident_floor_bytes
from memfit.models.sources import ModelSpec
from memfit.planner.shapes import Shape
from memfit.workload import Workload


class Skipped(NamedTuple):
    """A shape the search did not trace: the micro-batches it would have evaluated (its probe,
    or its largest and smallest) and where its candidates would have stood in the list."""

    shape: Shape
    micro: list[int]
    places: list[tuple[bool, bool]]
    at: int


class Floors:
    """The search's floors, one model build per kind of shape (see the module docstring)."""

    def __init__(self, spec: ModelSpec, limit_bytes: int) -> None:
        self.spec, self.limit = spec, limit_bytes
        self._bytes: dict[Any, int | None] = {}
        self.skipped: list[Skipped] = []

    def above(
        self, shape: Shape, w: Workload, places: list[tuple[bool, bool]], traced: dict[Any, Any],
        *, every_gradient: bool = False,
    ) -> bool:  # fmt: skip
        """Whether `shape` (its workload `w` at its first micro-batch) cannot fit: its floor,
        less the input embedding where a placement may move it, exceeds the limit. With
        `every_gradient`, whether it may be found so once a trace tells which parameters
        receive a gradient (the floor if all of them do)."""
        movable = any(e for _, e in places) and not shape.tie_embeddings
        got = None if every_gradient else _gradients_of(shape, traced)
        key = (shape, movable, got, every_gradient)
        if key not in self._bytes:
            self._bytes[key] = resident_floor_bytes(self.spec, w, got, embedding_movable=movable,
                                                    every_gradient=every_gradient)  # fmt: skip
        floor = self._bytes[key]
        return floor is not None and floor > self.limit

    def trace_skipped(self, evaluate: Callable[..., Any], candidates: list[Any]) -> None:
        """Evaluate the skipped shapes after all (`evaluate(shape, mb, places)` appends to
        `candidates`), each candidate moved to where the search would have placed it: when
        nothing fits, the closest miss is then the one the search finds without floors."""
        shift = 0
        for skipped in self.skipped:
            start = len(candidates)
            for mb in skipped.micro:
                evaluate(skipped.shape, mb, skipped.places)
            made = candidates[start:]
            del candidates[start:]
            candidates[skipped.at + shift : skipped.at + shift] = made
            shift += len(made)


def _gradients_of(shape: Shape, traced: dict[Any, Any]) -> tuple[bool, ...] | None:
    """Which trainable parameters receive a gradient, from a traced shape whose parameters
    train alike, or None."""
    for (s, _), (tr, _, _) in traced.items():
        alike = (s.lora, s.quantize, s.tie_embeddings, s.distill, s.chunked_loss) == (
            shape.lora, shape.quantize, shape.tie_embeddings, shape.distill, shape.chunked_loss
        )  # fmt: skip
        if alike and not s.optimizer_in_backward and not s.fsdp_cpu_offload:
            got = got_gradient(tr)
            if got is not None:
                return tuple(got)
    return None

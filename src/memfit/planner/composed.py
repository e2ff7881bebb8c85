"""The planner's traces: predicted across micro-batches, or composed across optimizers, once
checked.

A shape traced at two micro-batches of 2 or more is predicted at the others (memfit.estimator.
predict.MicroBatchLine: the first prediction is traced for real and compared; a line that
differed is traced from then on). A shape that accumulates and one that does not (the per-GPU
batch in one micro-batch) are separate lines.

A plan tries several optimizers on each (precision, checkpointing, LoRA, ...) configuration,
at several micro-batches; their forward and backward are the same. For a shape whose
micro-batch has been traced with another optimizer, the trace is composed
(memfit.estimator.compose: the other trace's forward and backward, this optimizer's phase
from an optimizer-only trace), but only once a composition of the same shape has equalled
its real trace: the first micro-batch of each shape is traced for real; at the next one, the
composition at the first is checked against that real trace (a shape evaluated once costs no
check), and the next ones are composed if it matched and traced for real if not.

The recommendation is traced again for real, with the replay checked, as `memfit estimate`
does (search._confirm).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from memfit.estimator import (
    MicroBatchLine,
    composable,
    composed_trace_spec,
    composition_matches,
    trace_spec,
)
from memfit.models.sources import ModelSpec
from memfit.planner.shapes import Shape
from memfit.workload import Workload


class Composer:
    """Traces for the search, composed where a check allows (see the module docstring)."""

    def __init__(self, spec: ModelSpec, capability: tuple[int, int] | None) -> None:
        self.spec, self.capability = spec, capability
        #: Shape -> whether its composition equalled its real trace.
        self.checked: dict[Shape, bool] = {}
        self.composed = 0  # traces composed instead of traced
        self.real: list[tuple[Shape, int]] = []  # (shape, micro-batch) traced for real
        #: (shape, accumulating) -> the shape's micro-batches (memfit.estimator.predict).
        self.lines: dict[tuple[Shape, bool], MicroBatchLine] = {}
        self.predicted: set[tuple[Shape, int]] = set()  # predicted instead of traced
        #: During `trace`: its `traced` and `workload_of` (not kept after it returns).
        self._asking: tuple[dict[tuple[Shape, int], Any], Callable[[Shape, int], Workload]] | None
        self._asking = None

    def trace(
        self,
        shape: Shape,
        mb: int,
        w: Workload,
        traced: dict[tuple[Shape, int], Any],
        workload_of: Callable[[Shape, int], Workload],
    ) -> Any:
        """`trace_spec(spec, w, capability, verify=False)` of `shape` at micro-batch `mb`
        (`w`): predicted from two micro-batches of the shape, or composed from a `traced`
        shape of another optimizer, where a check allows."""
        accumulating = w.grad_accum > 1  # two traced micro-batches, else one: another line
        line = self.lines.get((shape, accumulating))
        if line is None:
            # Through `self._asking`, not this call's arguments: a composer shared by plans
            # on several GPUs (memfit.planner.gpus.ranking) keeps no plan's search alive.
            line = self.lines[(shape, accumulating)] = MicroBatchLine(
                lambda m: self._exact_now(shape, m)
            )
        # What the search holds already (prefetched, or traced by an earlier plan).
        for (s, m), known in traced.items():
            if (
                s == shape
                and m not in line.real
                and (s, m) not in self.predicted
                and (workload_of(s, m).grad_accum > 1) == accumulating
            ):
                line.real[m] = known
        self._asking = (traced, workload_of)
        try:
            out = line.at(mb)
        finally:
            self._asking = None
        if mb in line.predicted:
            self.predicted.add((shape, mb))
        return out

    def _exact_now(self, shape: Shape, mb: int) -> Any:
        assert self._asking is not None, "only within Composer.trace"
        traced, workload_of = self._asking
        return self._exact(shape, mb, workload_of(shape, mb), traced, workload_of)

    def _exact(
        self,
        shape: Shape,
        mb: int,
        w: Workload,
        traced: dict[tuple[Shape, int], Any],
        workload_of: Callable[[Shape, int], Workload],
    ) -> Any:
        """The trace of `shape` at `mb`, real or composed (exact once checked)."""
        donors = _donors(shape, mb, traced)
        if not donors or composable(self.spec, w) is None:
            return self._real(shape, mb, w)
        if shape not in self.checked:
            # Checked at a micro-batch already traced for real, with a donor there too: a
            # shape evaluated at one micro-batch only costs no check.
            earlier = [m for s, m in self.real if s == shape and _donors(shape, m, traced)]
            if not earlier:
                return self._real(shape, mb, w)
            m0 = earlier[0]
            self.checked[shape] = composition_matches(
                self.spec,
                workload_of(shape, m0),
                workload_of(_donors(shape, m0, traced)[0], m0),
                self.capability,
            )
        if self.checked[shape]:
            composed = composed_trace_spec(self.spec, w, workload_of(donors[0], mb),
                                           self.capability)  # fmt: skip
            if composed is not None:
                self.composed += 1
                return composed
        return self._real(shape, mb, w)

    def _real(self, shape: Shape, mb: int, w: Workload) -> Any:
        self.real.append((shape, mb))
        return trace_spec(self.spec, w, self.capability, verify=False)


def _donors(shape: Shape, mb: int, traced: dict[tuple[Shape, int], Any]) -> list[Shape]:
    """The traced shapes at micro-batch `mb` that differ from `shape` in the optimizer only."""
    return [
        s for s, m in traced
        if m == mb and s != shape and dataclasses.replace(s, optimizer=shape.optimizer) == shape
    ]  # fmt: skip

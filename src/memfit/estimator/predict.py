"""A step at another micro-batch size, predicted from two traced ones (issue 17).

From a micro-batch of 2 on, a training step allocates and frees the same storages in the same
order whatever the micro-batch: only their sizes change, and each grows exactly linearly
with it (an activation of B x S x H elements; a parameter, gradient or optimizer state not at
all). Micro-batch 1 differs (a clone of the labels disappears), and so does a step that
accumulates from one that does not (one traced micro-batch instead of two), so neither is
ever a source or a target. FLOPs grow linearly too (every matmul and attention is per
sample).

`predict_micro_batch` builds the trace at micro-batch `m` from traces at `a` and `b`: the same
events, each storage's bytes on the line through its two sizes. It refuses (PredictMismatch)
whatever the line cannot give exactly: two streams that differ in anything but sizes, a size
or a FLOP count that would not be a whole number, or fall below zero. Its callers use a
prediction only once a prediction of the same configuration has equalled its real trace
(MicroBatchLine); the planner's recommendation is traced for real.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from memfit.estimator.trace.step_runner import Trace
from memfit.events import StorageRecord


class PredictMismatch(Exception):
    """The two traces do not give the third exactly."""


#: The smallest micro-batch a prediction starts from or reaches (see the module docstring).
SMALLEST = 2


def predict_micro_batch(a: Trace, mb_a: int, b: Trace, mb_b: int, mb: int) -> Trace:
    """The trace at micro-batch `mb` on the line through `a` (at `mb_a`) and `b` (at `mb_b`)."""
    if min(mb_a, mb_b, mb) < SMALLEST or mb_a == mb_b:
        raise PredictMismatch(
            f"micro-batches {mb_a}, {mb_b} -> {mb}: two different sources of {SMALLEST} or more"
        )
    if a.events != b.events:
        raise PredictMismatch("the two steps allocate different storages")
    if a.records.keys() != b.records.keys():
        raise PredictMismatch("the two steps hold different storages")
    for field in ("parameter_count", "trainable_parameter_count", "block_paths",
                  "attention_backends", "grad_sids", "module_types"):  # fmt: skip
        if getattr(a, field) != getattr(b, field):
            raise PredictMismatch(f"the two steps differ in {field}")
    if a.flops.keys() != b.flops.keys():
        raise PredictMismatch("the two steps count FLOPs in different places")

    def line(x: int, y: int, what: str) -> int:
        rise = (y - x) * (mb - mb_a)
        if rise % (mb_b - mb_a):
            raise PredictMismatch(f"{what} is not a whole number at micro-batch {mb}")
        value = x + rise // (mb_b - mb_a)
        if value < 0:
            raise PredictMismatch(f"{what} falls below zero at micro-batch {mb}")
        return value

    records: dict[int, StorageRecord] = {}
    for sid, ra in a.records.items():
        rb = b.records[sid]
        if dataclasses.replace(ra, nbytes=0) != dataclasses.replace(rb, nbytes=0):
            raise PredictMismatch(f"storage {sid} differs in more than its size")
        nbytes = (
            ra.nbytes if ra.nbytes == rb.nbytes else line(ra.nbytes, rb.nbytes, f"storage {sid}")
        )
        records[sid] = dataclasses.replace(ra, nbytes=nbytes)
    flops = {k: line(f, b.flops[k], f"FLOPs of {k}") for k, f in a.flops.items()}
    return dataclasses.replace(b, records=records, events=list(b.events), flops=flops)


#: A trace as `memfit.estimator.estimation.trace_spec` returns it: (trace, blocks, replayed).
Traced = tuple[Trace, int, bool]


def same_trace(a: Traced, b: Traced) -> bool:
    """Whether two traces are the same step: events, storages, FLOPs, blocks and replay."""
    (ta, na, ra), (tb, nb, rb) = a, b
    return (
        (na, ra) == (nb, rb)
        and ta.events == tb.events
        and ta.records == tb.records
        and ta.flops == tb.flops
    )


class MicroBatchLine:
    """The traces of one configuration at the micro-batches a search asks for: traced for real
    until two micro-batches of `SMALLEST` or more are, then predicted, once the first
    prediction has equalled the real trace of its micro-batch (traced to check it). A line
    whose check failed, or that a prediction refuses, is traced for real from then on.

    `trace(mb)` traces micro-batch `mb` for real (or as exactly: a composed trace); every
    configuration on one line must share the accumulation (one traced micro-batch or two).
    """

    def __init__(self, trace: Callable[[int], Traced]) -> None:
        self._trace = trace
        self.real: dict[int, Traced] = {}
        self.predicted: dict[int, Traced] = {}
        #: None until a prediction was checked; then whether it equalled the real trace.
        self.checked: bool | None = None

    def at(self, mb: int) -> Traced:
        if mb in self.real:
            return self.real[mb]
        if mb in self.predicted:
            return self.predicted[mb]
        guess = self._predict(mb) if self.checked is not False else None
        if guess is None:
            return self._real(mb)
        if self.checked is None:
            real = self._real(mb)
            self.checked = same_trace(guess, real)
            return real
        self.predicted[mb] = guess
        return guess

    def confirm(self, mb: int) -> bool:
        """Trace a predicted micro-batch for real (a search's answer); whether the prediction
        equalled it. If not, nothing is predicted on this line any more."""
        guess = self.predicted.pop(mb, None)
        real = self._real(mb)
        if guess is not None and not same_trace(guess, real):
            self.checked = False
            self.predicted.clear()
            return False
        return True

    def _real(self, mb: int) -> Traced:
        self.real[mb] = self._trace(mb)
        return self.real[mb]

    def _predict(self, mb: int) -> Traced | None:
        sources = sorted((m for m in self.real if m >= SMALLEST), key=lambda m: (abs(m - mb), m))
        if mb < SMALLEST or len(sources) < 2:
            return None
        (a, na, ra), (b, nb, rb) = self.real[sources[0]], self.real[sources[1]]
        if (na, ra) != (nb, rb):
            return None
        try:
            return predict_micro_batch(a, sources[0], b, sources[1], mb), na, ra
        except PredictMismatch:
            return None

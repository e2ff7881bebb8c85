"""Another optimizer on a traced step: the forward and backward of one trace, the optimizer
phase of an optimizer-only trace (issue 17).

A training step's forward and backward do not depend on the optimizer: the same storages are
allocated and freed in the same order whatever steps afterwards (the optimizer's state is
only alive beside them). So a step with optimizer B is the traced step with optimizer A, its
optimizer phases replaced by those of a trace of B that skips the forward and backward
(`run_trace(..., grad_origins=...)`: each gradient made directly, as AccumulateGrad leaves
it, filed under the module the traced backward filed it under). The parameters are the same
storages in both (same model, registered in the same order); each gradient is matched by its
parameter (`Trace.grad_sids`); what the optimizer allocates is renamed past the base trace's
storages.

`compose_optimizer` refuses (ComposeMismatch) whatever it cannot splice exactly: different
parameters, an optimizer phase that frees what it did not allocate, a storage of the
optimizer phase touched outside it, an optimizer phase not in one piece. Its callers use a
composed trace only after a composition of the same configuration has been checked against a
real trace (memfit.planner.composed); the planner's recommendation is traced for real.
"""

from __future__ import annotations

import dataclasses

from memfit.estimator.estimation import (
    _expanded,
    _profile_key,
    _short_trace,
    replayable_blocks,
    trace_key,
)
from memfit.estimator.trace.block_replay import TRACED_BLOCKS, ReplayMismatch
from memfit.estimator.trace.cache import cached_trace
from memfit.estimator.trace.step_runner import Trace, run_trace
from memfit.events import ALLOC, Event
from memfit.models.sources import ModelSpec
from memfit.profile import MemoryProfile
from memfit.workload import Workload

OPTIMIZER = "optimizer"


class ComposeMismatch(Exception):
    """The two traces cannot be spliced exactly."""


def compose_optimizer(base: Trace, optimizer_only: Trace) -> Trace:
    """`base` with its optimizer phases replaced by those of `optimizer_only`."""
    setup = {s: r for s, r in base.records.items() if r.phase == "setup"}
    if setup != {s: r for s, r in optimizer_only.records.items() if r.phase == "setup"}:
        raise ComposeMismatch("the two traces hold different parameters")
    if base.grad_sids.keys() != optimizer_only.grad_sids.keys():
        raise ComposeMismatch("different steps")
    mine = _optimizer_storages(base)
    theirs = _optimizer_storages(optimizer_only)
    rename = {s: s for s in setup}  # the parameters keep their ids
    for step, grads in optimizer_only.grad_sids.items():
        if len(grads) != len(base.grad_sids[step]):
            raise ComposeMismatch("different trainable parameters")
        for g, b in zip(grads, base.grad_sids[step], strict=True):
            if (g is None) != (b is None):
                raise ComposeMismatch("a gradient missing in one trace")
            if g is not None and b is not None:
                rename[g] = b
    first_new = max(base.records, default=-1) + 1
    rename.update({s: first_new + i for i, s in enumerate(sorted(theirs))})

    blocks = {step: _block(optimizer_only.events, step) for step in base.grad_sids}
    for step, (start, end) in blocks.items():
        for ev in optimizer_only.events[start:end]:
            if ev.sid not in rename:
                raise ComposeMismatch(
                    f"the optimizer phase of step {step} touches storage {ev.sid}"
                )
    at = {step: _block(base.events, step)[0] for step in blocks}  # where each phase goes
    where = {i: step for step, i in at.items()}
    events: list[Event] = []
    for i in range(len(base.events) + 1):
        if i in where:
            start, end = blocks[where[i]]
            events.extend(e._replace(sid=rename[e.sid]) for e in optimizer_only.events[start:end])
        if i < len(base.events) and base.events[i].phase != OPTIMIZER:
            events.append(base.events[i])

    records = {s: r for s, r in base.records.items() if s not in mine}
    for s in theirs:
        records[rename[s]] = dataclasses.replace(optimizer_only.records[s], sid=rename[s])
    flops = {k: f for k, f in base.flops.items() if k[1] != OPTIMIZER}
    flops.update({k: f for k, f in optimizer_only.flops.items() if k[1] == OPTIMIZER})
    return _renumbered(dataclasses.replace(base, records=records, events=events, flops=flops))


def _renumbered(tr: Trace) -> Trace:
    """`tr` with its storages numbered in the order they are allocated, as the tracker numbers
    a real trace's (the replay pairs and orders storages by their ids)."""
    order = {ev.sid: None for ev in tr.events if ev.kind == ALLOC}
    order.update(dict.fromkeys(tr.records))  # a record without an event keeps a number too
    new = {sid: i for i, sid in enumerate(order)}
    return dataclasses.replace(
        tr,
        records={new[s]: dataclasses.replace(r, sid=new[s]) for s, r in tr.records.items()},
        events=[ev._replace(sid=new[ev.sid]) for ev in tr.events],
        grad_sids={
            step: [None if s is None else new[s] for s in sids]
            for step, sids in tr.grad_sids.items()
        },
    )


def grad_origins(tr: Trace) -> dict[int, list[tuple[str, int] | None]]:
    """Step -> (module, block) each gradient of `tr` was filed under, for the optimizer-only
    trace (step_runner.run_trace's `grad_origins`)."""
    return {
        step: [None if s is None else (tr.records[s].module, tr.records[s].owner) for s in sids]
        for step, sids in tr.grad_sids.items()
    }


def _optimizer_storages(tr: Trace) -> set[int]:
    """Storages allocated in an optimizer phase; refused when the phase frees anything else
    or one of them is freed outside it."""
    mine = {ev.sid for ev in tr.events if ev.phase == OPTIMIZER and ev.kind == ALLOC}
    for ev in tr.events:
        inside = ev.phase == OPTIMIZER
        if inside and ev.sid not in mine:
            raise ComposeMismatch("an optimizer phase frees a storage made before it")
        if not inside and ev.sid in mine:
            raise ComposeMismatch("a storage of the optimizer phase is freed outside it")
    for step in {ev.step for ev in tr.events if ev.phase == OPTIMIZER}:
        _block(tr.events, step)  # in one piece
    return mine


def _block(events: list[Event], step: int) -> tuple[int, int]:
    """[start, end) of step `step`'s optimizer phase; empty at the first zero_grad event
    when the phase has no events."""
    idx = [i for i, ev in enumerate(events) if ev.phase == OPTIMIZER and ev.step == step]
    if idx:
        if idx[-1] - idx[0] + 1 != len(idx):
            raise ComposeMismatch(f"the optimizer phase of step {step} is not in one piece")
        return idx[0], idx[-1] + 1
    after = _first(events, step)
    return after, after


def _first(events: list[Event], step: int) -> int:
    for i, ev in enumerate(events):
        if ev.step == step and ev.phase == "zero_grad":
            return i
    raise ComposeMismatch(f"step {step} has neither an optimizer nor a zero_grad event")


def composable(spec: ModelSpec, w: Workload) -> int | None:
    """The model's block count when `w`'s step may be composed (a replayed training step whose
    optimizer steps after the backward, on one GPU), else None."""
    if not w.training or w.optimizer == "none" or w.optimizer_in_backward:
        return None
    if w.gpus > 1 or w.fsdp_cpu_offload:  # FSDP2 sets the gradients; DDP adds its buckets
        return None
    return replayable_blocks(spec, w)


def composed_trace(
    spec: ModelSpec, w: Workload, donor: Workload, capability: tuple[int, int] | None
) -> tuple[Trace, Trace] | None:
    """`w`'s `TRACED_BLOCKS`-block trace composed from that of `donor` (`w` with another
    optimizer) and an optimizer-only trace of `w`, with the donor's trace; None when it
    cannot be composed. Both short traces are cached (memfit.estimator.trace.cache)."""
    if composable(spec, w) is None or composable(spec, donor) is None:
        return None
    base = _short_trace(spec, donor, capability, TRACED_BLOCKS)
    if len(base.block_paths) != TRACED_BLOCKS:
        return None
    origins = grad_origins(base)
    # No forward, no batch: the optimizer-only trace of every micro-batch size is the same.
    alone = optimizer_only_workload(w)
    key = trace_key(spec, alone, capability, "optimizer-only", TRACED_BLOCKS, origins)
    only = cached_trace(key, lambda: (run_trace(spec, alone, capability, num_layers=TRACED_BLOCKS,
                                                grad_origins=origins), 0, False))[0]  # fmt: skip
    try:
        return compose_optimizer(base, only), base
    except ComposeMismatch:
        return None


def optimizer_only_workload(w: Workload) -> Workload:
    """`w` as its optimizer-only trace sees it: the micro-batch and the accumulation do not
    reach it (gradients are made, not computed), so one trace serves every micro-batch."""
    return w.with_(batch_size=1, grad_accum=1)


def composed_trace_spec(
    spec: ModelSpec, w: Workload, donor: Workload, capability: tuple[int, int] | None
) -> tuple[Trace, int, bool] | None:
    """As `trace_spec(spec, w, capability, verify=False)`, composed (`composed_trace`) and
    replayed to all blocks; None when it cannot be. Use it only for a configuration whose
    composition `composition_matches` a real trace."""
    n = composable(spec, w)
    composed = composed_trace(spec, w, donor, capability) if n is not None else None
    if n is None or composed is None:
        return None
    try:
        return _expanded(composed[0], n), n, True
    except ReplayMismatch:
        return None


def composition_matches(
    spec: ModelSpec, w: Workload, donor: Workload, capability: tuple[int, int] | None
) -> bool:
    """Whether `w` composed from `donor` equals `w`'s real trace: the same live-bytes
    timeline event for event, breakdown, bytes per module, per-phase peaks and FLOPs (the
    replay check's test, memfit.estimator.estimation._profile_key)."""
    composed = composed_trace(spec, w, donor, capability)
    if composed is None:
        return False
    real = _short_trace(spec, w, capability, TRACED_BLOCKS)
    a = MemoryProfile.from_events(composed[0].records, composed[0].events)
    b = MemoryProfile.from_events(real.records, real.events)
    return _profile_key(a) == _profile_key(b) and composed[0].flops == real.flops

"""Allocations a CUDA kernel makes and frees inside one aten op, which a trace on fake CPU
tensors cannot see: they go through the caching allocator, so they can reach the peak and
force new segments. Each kind names its sizes from the op's arguments:

- cuDNN convolution workspaces (memfit.estimator.trace.cudnn_workspace);
- cuBLAS operand copies (memfit.estimator.trace.cublas_operands).

This module places them in the tracker's stream: right after the output the op allocated
first, as allocations freed before the op returns.
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.events import ALLOC, FREE, Event, StorageRecord


def after_alloc_of(tracker: Any, t: Any) -> int:
    """The index in ``tracker.events`` right after the allocation of ``t``'s storage (the
    end of the stream when ``t`` is not a tracked tensor of this op)."""
    events = tracker.events
    sid = tracker.sid_of(t) if isinstance(t, torch.Tensor) else None
    if sid is not None:
        for i in range(len(events) - 1, -1, -1):
            ev = events[i]
            if ev.sid == sid and ev.kind == ALLOC:
                return i + 1
    return len(events)


def new_records(tracker: Any, name: str, sizes: list[int], category: str) -> list[int]:
    """Records of ``sizes`` bytes made by op ``name`` in the tracker's current context, in
    order; their ids. Written to the tracker directly: no tensor of them reaches Python, so
    no storage finalizer could see them."""
    module, owner = tracker.context()
    sids = []
    for nbytes in sizes:
        sid = tracker.ledger.new_id()
        tracker.records[sid] = StorageRecord(
            sid, nbytes, category, tracker.phase, tracker.step, name, module, owner,
            tracker._region,
        )  # fmt: skip
        sids.append(sid)
    return sids


def insert_events(tracker: Any, at: int, sids: list[int], *, together: bool) -> None:
    """Insert the allocation and the free of each record in ``sids`` at event index ``at``.
    ``together``: all are allocated, then all freed (operands prepared for one kernel);
    otherwise each is freed before the next is allocated (one call after another)."""

    def ev(kind: int, sid: int) -> Event:
        r = tracker.records[sid]
        return Event(kind, sid, r.phase, r.step, r.op, r.module, r.owner)

    if together:
        new = [ev(ALLOC, s) for s in sids] + [ev(FREE, s) for s in sids]
    else:
        new = [e for s in sids for e in (ev(ALLOC, s), ev(FREE, s))]
    tracker.events[at:at] = new

"""DistributedDataParallel's gradient buckets, added to a traced step (`Workload.ddp`).

Each DDP process runs the whole step, as on one GPU, and its Reducer keeps the gradients of
the trainable parameters a second time, in flat buckets that NCCL all-reduces (with
`gradient_as_bucket_view=False`, PyTorch's default, the gradients stay tensors of their own
and are copied in and out of the buckets). What PyTorch allocates (torch/nn/parallel/
distributed.py, `_BucketConfig.compute_bucket_size_limits`, and the C++ Reducer):

- At construction, with `find_unused_parameters=False` (the default) the bucket limit is
  `sys.maxsize`: one bucket per dtype holding every trainable parameter, allocated flat
  (`at::empty`) and kept.
- At the second iteration's forward the Reducer rebuilds its buckets in the order the
  gradients became ready in the first backward: the old ones are freed and new ones
  allocated, closed as soon as they reach their limit (1 MiB for the first,
  `_DEFAULT_FIRST_BUCKET_BYTES`, then 25 MiB, `bucket_cap_mb`).

So the buckets are placed in the traced stream: at the end of setup one bucket of all the
trainable gradients' bytes, and at the start of step 1 the rebuilt ones, sized from the
gradients in the order the traced backward of step 0 allocated them. A probe of
`DistributedDataParallel` on gloo (tests/estimator/test_ddp.py) checks these allocations
against PyTorch's own.

Not modelled: a model whose trainable parameters mix dtypes (PyTorch keeps one bucket set per
dtype; memfit sizes them as one, which only moves bucket boundaries), the flat copies of
`_sync_module_states` at construction (before the first step, beside the parameters only),
the per-forward buffer broadcast (model buffers, small in transformers' models),
`gradient_as_bucket_view=True` and other `bucket_cap_mb` values.
"""

from __future__ import annotations

import dataclasses

from memfit.estimator.trace.step_runner import Trace
from memfit.events import ALLOC, FREE, Category, Event, StorageRecord

#: torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first rebuilt bucket's limit.
FIRST_BUCKET_BYTES = 1024 * 1024
#: DistributedDataParallel's default bucket_cap_mb (25 MiB): every later bucket's limit.
BUCKET_BYTES = 25 * 1024 * 1024
#: The op name of the buckets' events (no aten op allocates them in the trace).
BUCKET_OP = "<ddp_bucket>"


def rebuilt_buckets(grad_bytes: list[int]) -> list[int]:
    """Bucket sizes for gradients of `grad_bytes` in ready order: each bucket closes when it
    reaches its limit (FIRST_BUCKET_BYTES, then BUCKET_BYTES), the last one holds the rest."""
    out: list[int] = []
    size = 0
    for nbytes in grad_bytes:
        size += nbytes
        if size >= (FIRST_BUCKET_BYTES if not out else BUCKET_BYTES):
            out.append(size)
            size = 0
    if size:
        out.append(size)
    return out


def with_ddp_buckets(tr: Trace) -> Trace:
    """`tr` (a traced training step, all its blocks) with DDP's gradient buckets."""
    backward = [ev.sid for ev in tr.events
                if ev.kind == ALLOC and ev.step == 0 and ev.phase == "backward"
                and tr.records[ev.sid].category == Category.GRADIENTS]  # fmt: skip
    grads = [tr.records[s].nbytes for s in dict.fromkeys(backward)]
    if not grads:
        return tr
    records = dict(tr.records)
    next_sid = max(records) + 1

    def bucket(nbytes: int, phase: str, step: int) -> Event:
        nonlocal next_sid
        sid, next_sid = next_sid, next_sid + 1
        records[sid] = StorageRecord(sid, nbytes, Category.GRADIENTS, phase, step, BUCKET_OP,
                                     "", -1, 0)  # fmt: skip
        return Event(ALLOC, sid, phase, step, BUCKET_OP, "", -1)

    events = list(tr.events)
    at = next(i for i, ev in enumerate(events) if ev.phase != "setup")
    first = bucket(sum(grads), "setup", 0)
    events.insert(at, first)
    later = next((i for i, ev in enumerate(events) if ev.step == 1), None)
    if later is not None:  # the Reducer rebuilds at the second iteration's forward
        phase = events[later].phase
        freed = Event(FREE, first.sid, phase, 1, BUCKET_OP, "", -1)
        rebuilt = [freed] + [bucket(b, phase, 1) for b in rebuilt_buckets(grads)]
        events[later:later] = rebuilt
    return dataclasses.replace(tr, records=records, events=events)

"""The autograd engine's gradient accumulation as it runs on real tensors: in place.

When two gradients flow into the same input of a node (a weight used twice: tied input and
output embeddings), the engine sums them in the node's input buffer
(torch/csrc/autograd/input_buffer.cpp ``accumulate``, torch 2.x):

    if GradMode is enabled:                                       old_var + var
    elif can_accumulate_inplace(old_var) and not isTensorSubclassLike(var):
                                                                  old_var.add_(var)
    else:                                                         old_var + var

``can_accumulate_inplace`` asks for a plain tensor, non-overlapping and dense, holding the last
reference to itself and to its storage. On a CUDA run the gradient that arrived first is such a
tensor when a backward formula made it fresh, so the second one is added into it and no new
block is allocated. Under memfit's trace every tensor is "subclass-like" (``isTensorSubclassLike``
is true for a FakeTensor and whenever a TorchDispatchMode is active), so the engine always takes
the last branch: a new gradient-sized block, then the old one freed. For GPT-2's tied 154 MB
fp32 embedding that is one 148 MiB segment more than the H200 reserved (issue 31).

This module finds those accumulations while tracing (``AccumulationWatch.hook``, called after
every op) and folds them afterwards (``fold``), so that the stream has what the real engine
allocates. The fold is applied only where the trace can tell that the real engine would add in
place: the sum becomes a parameter's ``.grad`` (the AccumulateGrad node's buffer), and the first
gradient is not a view (a view shares its storage with its base: ``storage().use_count() > 1``,
as for the transposed weight gradient of an fp32 ``F.linear``; then the real engine allocates
too). Checked on real CPU tensors, which take the same ``accumulate`` (tests).

Not folded, though the real engine may add in place: sums into non-leaf buffers (residual
streams), where whether the first gradient is still shared (a pass-through node such as
AddBackward hands one tensor to two edges) is not visible on fake tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from memfit.events import ALLOC, FREE, Category, Event, StorageRecord

_ADD = "add.Tensor"


@dataclass
class AccumulationWatch:
    """The engine's out-of-place sums seen in a trace: (first gradient's sid, sum's sid)."""

    pairs: list[tuple[int, int]] = field(default_factory=list)

    def hook(self, tracker: Any, name: str, args: Any, out: Any) -> None:
        """A tracker post-op hook: note an ``add.Tensor`` that the engine ran to accumulate
        (inside a backward node, grad mode off, two same-shaped gradients) whose first operand
        the real engine could have added into (not a view; non-overlapping and dense)."""
        if name != _ADD or tracker.phase != "backward" or torch.is_grad_enabled():
            return
        if torch._C._current_autograd_node() is None or len(args) < 2:
            return
        old, new = args[0], args[1]
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return
        if old.shape != new.shape or old.dtype != new.dtype or not isinstance(out, torch.Tensor):
            return
        if old._base is not None or not _non_overlapping_and_dense(old):
            return
        old_sid, out_sid = tracker.sid_of(old), tracker.sid_of(out)
        if old_sid is not None and out_sid is not None and old_sid != out_sid:
            self.pairs.append((old_sid, out_sid))


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """TensorImpl's ``is_non_overlapping_and_dense`` (c10 ``compute_non_overlapping_and_dense``):
    the strides, sorted, are those of some contiguous order of the sizes."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True)
                               if sz != 1):  # fmt: skip
        if stride != expected:
            return False
        expected *= size
    return True


def fold(
    records: dict[int, StorageRecord],
    events: list[Event],
    pairs: list[tuple[int, int]],
    grad_sids: dict[int, list[int | None]],
) -> None:
    """Rewrite the trace, in place, so that each noted sum that became a parameter's gradient
    is the first gradient's block added into: the sum's allocation and the first gradient's
    free (both inside the accumulating op) go, and the sum's later events are the first
    gradient's. The record keeps where it was allocated and takes the sum's role (category,
    module, owner)."""
    for old_sid, out_sid in pairs:
        out = records.get(out_sid)
        old = records.get(old_sid)
        if out is None or old is None or out.category != Category.GRADIENTS:
            continue
        at = next((i for i, ev in enumerate(events) if ev.sid == out_sid and ev.kind == ALLOC))
        freed = next(
            (i for i in range(at + 1, len(events))
             if events[i].sid == old_sid and events[i].kind == FREE),
            None,
        )  # fmt: skip
        if freed is None:  # the first gradient outlived the sum: not the engine's buffer
            continue
        del events[freed]
        del events[at]
        for i in range(at, len(events)):
            if events[i].sid == out_sid:
                events[i] = events[i]._replace(sid=old_sid)
        old.category, old.module, old.owner = out.category, out.module, out.owner
        old.host, old.paged = out.host, out.paged
        del records[out_sid]
        for sids in grad_sids.values():
            for k, s in enumerate(sids):
                if s == out_sid:
                    sids[k] = old_sid

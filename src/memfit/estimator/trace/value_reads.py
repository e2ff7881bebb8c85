"""Value reads in forward that a fake trace can answer exactly, because the value is certain.

transformers before 5.18 decides LayerDrop (BART, mBART, Marian, Pegasus, Whisper, ...) with
`torch.rand([]) < self.layerdrop` in every training step, even when layerdrop is 0 (5.18 first
checks `layerdrop > 0`). A fake tensor has no value, so the comparison could not be read; but a
uniform sample in [0, 1) is never below a bound <= 0, so the answer is False, as on the device.
Anything else stays an error: a value that can decide shapes is not guessed.
"""

from __future__ import annotations

from typing import Any

import torch

#: Ops whose output is a uniform sample in [0, 1).
UNIFORM_OPS = frozenset({"rand.default", "rand_like.default"})


def note_certain_value(tracker: Any, func: Any, args: Any, out: Any) -> None:
    """After an op: remember an output whose value is certain (`rand < bound <= 0`)."""
    if func is not torch.ops.aten.lt.Scalar or not isinstance(args[1], (int, float)):
        return
    sid = tracker.sid_of(args[0])
    if sid is None or tracker.records[sid].op not in UNIFORM_OPS or args[1] > 0:
        return
    out_sid = tracker.sid_of(out)
    if out_sid is not None:
        tracker.certain_values[out_sid] = False


def certain_value(tracker: Any, func: Any, args: Any) -> bool | None:
    """The value `_local_scalar_dense` reads, when it is certain; else None."""
    if func is not torch.ops.aten._local_scalar_dense.default:
        return None
    sid = tracker.sid_of(args[0])
    return None if sid is None else tracker.certain_values.get(sid)

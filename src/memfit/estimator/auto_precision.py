"""`precision="auto"`: the dtype the checkpoint is stored in, as transformers 5 loads a model
(`from_pretrained(..., dtype="auto")`, its default) and vLLM serves one (`--dtype auto`).

The dtype is the config's `dtype` (transformers 5), else its older name `torch_dtype`: the field
`save_pretrained` writes and `from_pretrained(dtype="auto")` reads. A model built outside memfit
(a module passed in, or a `file.py:build` factory) has no checkpoint to ask: its own floating
parameters say (the dtype holding most of them). Each dtype maps to the precision that runs a
model loaded in it:

| dtype | precision |
|---|---|
| bfloat16 | bf16-true |
| float16 | fp16-true |
| float32, or none given | fp32 (transformers' default when the config names none) |

Any other dtype (a float8 checkpoint) is refused with the fix. "auto" applies to inference and
generation only (a Workload in training refuses it): a training recipe is a choice, not a
property of the checkpoint. It is resolved once, before anything is traced (`resolve_precision`),
so nothing downstream sees "auto".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.checkpoint import DTYPE_KEY
from memfit.models.sources import ModelSpec
from memfit.precision import pure_precision_of_dtype
from memfit.workload import AUTO_PRECISION, PRECISIONS, Workload

#: The precision that runs a model loaded in each dtype (by transformers' dtype names).


def checkpoint_dtype(spec: ModelSpec, attention: str = "sdpa") -> tuple[str | None, str]:
    """(the dtype name, e.g. "bfloat16", or None when none is given; where it was read)."""
    entry = spec.extra.get("entry")
    if entry is not None:
        config = dict(entry.config)
        for key in ("dtype", "torch_dtype"):
            value = config.get(key)
            if value is not None:
                return _name(value), f"config {key}"
        read = spec.extra.get(DTYPE_KEY)  # a checkpoint folder's safetensors headers
        if read is not None:
            return read[0], f"the config names none, so transformers reads {read[1]}"
        return None, "the config names no dtype"
    model = spec.build(None, attention)
    counts: Counter[torch.dtype] = Counter()
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] += p.numel()
    if not counts:
        return None, "the model has no floating-point parameters"
    return _name(counts.most_common(1)[0][0]), "the model's parameters"


def resolve_precision(spec: ModelSpec, w: Workload) -> tuple[ModelSpec, Workload]:
    """`w` with precision="auto" replaced by the checkpoint's precision, and `spec` with a note
    saying so; both unchanged for any other precision.

    Example:
        >>> spec = resolve_model("llama-3.1-8b")
        >>> spec, w = resolve_precision(spec, Workload(mode="generate", precision="auto"))
    """
    if w.precision != AUTO_PRECISION:
        return spec, w
    dtype, where = checkpoint_dtype(spec, w.attention)
    try:
        precision = pure_precision_of_dtype(dtype or "float32").name
    except BadInputError:
        precision = None
    if precision is None:
        raise BadInputError(
            f"precision='auto': {spec.name!r} is stored in {dtype} ({where}), which no memfit "
            f"precision runs as it is. Give the precision, one of {', '.join(PRECISIONS)}."
        )
    if dtype is None:
        note = f"precision 'auto' is fp32: {where}, and transformers then loads float32."
    else:
        note = f"precision 'auto' is {precision}: the checkpoint's dtype ({dtype}, {where})."
    return replace(spec, notes=[*spec.notes, note]), w.with_(precision=precision)


def _name(dtype: Any) -> str:
    """A dtype as transformers names it in a config: torch.bfloat16 or "torch.bfloat16" ->
    "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def check_resolved(w: Workload) -> None:
    """Before tracing: "auto" must have been resolved (it has no dtype of its own)."""
    if w.precision == AUTO_PRECISION:
        raise BadInputError(
            "precision='auto' names the checkpoint's dtype, which only the model says: "
            "memfit.estimate, max_seq, max_batch and serving_capacity resolve it "
            "(memfit.estimator.auto_precision.resolve_precision). Give the precision, e.g. "
            "precision='bf16-true'."
        )

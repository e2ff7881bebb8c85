"""FLOPs of aten ops, counted with PyTorch's own formulas (torch.utils.flop_counter), as the
tracker sees the ops run (memfit.estimator.trace.tracker keeps them by step, phase and block).

FLOPs are an estimate, never an assertion (DESIGN.md, "Never break the run"): grouped-query
attention is counted as if K and V were expanded to the query's heads on every torch, and a
formula that raises leaves its op uncounted (`counted_flops`), said once in a warning.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

#: PyTorch's FLOP formulas per op (the ones FlopCounterMode uses): matmuls, convolutions,
#: attention kernels; elementwise ops count as zero, as in FlopCounterMode.
_FLOP_FORMULAS = flop_registry

#: The attention ops with a FLOP formula whose K/V may have fewer heads than Q (grouped-query
#: attention: `F.scaled_dot_product_attention(..., enable_gqa=True)`, which transformers passes
#: when there is no mask), as (index of the query among the arguments, dimension of the heads):
#: (B, H, S, D) for the `_scaled_dot_product_*` ops, (B, S, H, D) or nested (T, H, D) for the
#: kernels below them; backward ops take the output's gradient first. torch <= 2.11's formulas
#: assert equal heads (torch/utils/flop_counter.py `sdpa_flop_count`); 2.12 counts grouped K/V
#: as expanded to Q's heads, which is what the kernels compute. See `count_flops`.
_ATTENTION_LAYOUTS: dict[Any, tuple[int, int]] = {
    packet: layout
    for name, layout in (
        ("_scaled_dot_product_flash_attention", (0, -3)),
        ("_scaled_dot_product_efficient_attention", (0, -3)),
        ("_scaled_dot_product_cudnn_attention", (0, -3)),
        ("_scaled_dot_product_flash_attention_backward", (1, -3)),
        ("_scaled_dot_product_efficient_attention_backward", (1, -3)),
        ("_scaled_dot_product_cudnn_attention_backward", (1, -3)),
        ("_flash_attention_forward", (0, -2)),
        ("_efficient_attention_forward", (0, -2)),
        ("_flash_attention_backward", (1, -2)),
        ("_efficient_attention_backward", (1, -2)),
    )
    if (packet := getattr(torch.ops.aten, name, None)) is not None
}

#: Ops whose FLOP formula raised in this process: reported once each (`counted_flops`).
_UNCOUNTED_REPORTED: set[str] = set()


def _grouped_kv_expanded(args: tuple[Any, ...], query: int, heads_dim: int) -> tuple[Any, ...]:
    """`args` of an attention op with K and V (after the query at index `query`) replaced by
    meta tensors with Q's number of heads when they have fewer (grouped-query attention): no
    memory, and every formula reads them as it reads tensors (`.shape`; torch 2.15's raw-kernel
    formulas also `.transpose` them)."""
    if len(args) < query + 3:
        return args
    q, k, v = args[query : query + 3]
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dim() >= -heads_dim for t in tensors):
        return args
    heads = q.shape[heads_dim]
    if k.shape[heads_dim] == heads and v.shape[heads_dim] == heads:
        return args
    out = list(args)
    for i, t in ((query + 1, k), (query + 2, v)):
        shape = list(t.shape)
        shape[heads_dim] = heads
        out[i] = torch.empty(shape, dtype=t.dtype, device="meta")
    return tuple(out)


def count_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """FLOPs of one aten op by PyTorch's own formulas (torch.utils.flop_counter); 0 for an op
    without one (elementwise ops). Grouped-query attention counts as if K and V were expanded
    to the query's heads, on every torch (see `_ATTENTION_LAYOUTS`). May raise what a formula
    raises; `Tracker` leaves such an op uncounted."""
    packet = getattr(func, "overloadpacket", None)
    formula = _FLOP_FORMULAS.get(packet) if packet is not None else None
    if formula is None:
        return 0
    layout = _ATTENTION_LAYOUTS.get(packet)
    if layout is not None:
        args = _grouped_kv_expanded(args, *layout)
    return int(formula(*args, **kwargs, out_val=out) or 0)


def counted_flops(
    func: Any, name: str, args: Any, kwargs: dict[str, Any], out: Any, uncounted: dict[str, str]
) -> int:
    """`count_flops`, or 0 when the formula raises: the op's FLOPs are then left uncounted,
    with why on `uncounted` (op name -> reason, the first time), and a warning once per op and
    process. The user's shapes are right; a formula that rejects them is PyTorch's bug
    (torch <= 2.11 on grouped K/V, before memfit expands them)."""
    try:
        return count_flops(func, args, kwargs, out)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        uncounted.setdefault(name, why)
        if name not in _UNCOUNTED_REPORTED:
            _UNCOUNTED_REPORTED.add(name)
            warnings.warn(
                f"memfit: PyTorch's FLOP formula for {name} raised ({why}); the FLOPs of that "
                "op are left uncounted (memory is not affected).",
                RuntimeWarning,
                stacklevel=2,
            )
        return 0

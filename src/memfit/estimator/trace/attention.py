"""Which scaled-dot-product-attention kernel CUDA would run, and running that kernel on fake CPU.

On CUDA, `F.scaled_dot_product_attention` picks a backend in priority order flash ->
memory-efficient -> math (torch/csrc/.../sdp_utils.cpp, `select_sdp_backend`). The choice decides
memory: flash and memory-efficient keep only the output and a (B, H, S) fp32 log-sum-exp for
backward; math materialises the (B, H, S, S) attention matrix and saves it. On CPU, PyTorch would
pick its own CPU flash kernel, so the tracer must not let the CPU choice stand. `choose_backend`
applies CUDA's rules for the target GPU and `run_sdpa` calls the aten op of that backend, whose
fake (meta) kernel gives exactly the tensors CUDA allocates.

Rules modelled (PyTorch 2.5-2.13, `check_*` functions of sdp_utils.cpp):
- flash: fp16/bf16 only; compute capability >= 8.0; head dim <= 256; no explicit attn_mask
  (is_causal is fine); q/k/v head dims equal.
- flash on sm86/sm89 (check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89): not for
  training with head dim in (192, 224], nor above 224 with dropout.
- memory-efficient: fp32/fp16 on every supported GPU, bf16 only from sm80
  (less_than_sm80_mem_efficient_dtypes / greater_than_or_equal_sm80_mem_efficient_dtypes);
  compute capability >= 5.0; supports an attn_mask; head dim a multiple of 8 for 16-bit inputs
  and of 4 for fp32 (PyTorch accepts any fp32 head dim before sm80; requiring 4 errs towards
  math, the larger estimate).
- math: always possible.
- grouped-query attention (`enable_gqa=True`, fewer key/value heads than query heads, as
  transformers' sdpa_attention_forward passes when there is no attention mask):
  `check_batch_size_and_num_heads_dense<true /*supports GQA*/>` in can_use_flash_attention, so
  flash takes the grouped K/V as they are (and saves them at their own size);
  can_use_mem_efficient_attention has `<false /*supports_grouped_query_attention*/>`, so such a
  call goes on to math, which repeats K/V (`_scaled_dot_product_attention_math`, enable_gqa).
Not modelled: the cuDNN backend (off by default in these releases' priority order for training),
nested tensors, and `torch.nn.attention.sdpa_kernel` overrides made inside user code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

FLASH = "flash"
EFFICIENT = "efficient"
MATH = "math"

#: sdp_utils.cpp check_flash_attention_hardware_support: sm80 and newer.
FLASH_MIN_CAPABILITY = (8, 0)
#: sdp_utils.cpp check_mem_efficient_hardware_support: sm50 and newer.
EFFICIENT_MIN_CAPABILITY = (5, 0)
#: sdp_utils.cpp check_head_dim_size_flash: flash supports head dims up to 256.
FLASH_MAX_HEAD_DIM = 256
#: sdp_utils.cpp check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89.
SM86_89 = ((8, 6), (8, 9))


@dataclass(frozen=True)
class AttentionCall:
    """The facts about one SDPA call that decide the backend."""

    dtype: torch.dtype
    head_dim: int
    value_head_dim: int
    has_mask: bool
    dropout_p: float
    requires_grad: bool = False
    #: enable_gqa with fewer key/value heads than query heads.
    grouped: bool = False


def choose_backend(call: AttentionCall, capability: tuple[int, int] | None) -> str:
    """The backend CUDA would pick for `call` on a GPU of this compute capability.

    With no GPU named (capability None), an Ampere-class GPU (8.0) is assumed, the common case
    for training; the report states the GPU it assumed.
    """
    cap = capability if capability is not None else (8, 0)
    low = call.dtype in (torch.float16, torch.bfloat16)
    same_dims = call.head_dim == call.value_head_dim
    d = call.head_dim
    sm86_89_limit = (
        cap in SM86_89
        and call.requires_grad
        and (192 < d <= 224 or (d > 224 and call.dropout_p > 0.0))
    )
    if (
        low
        and cap >= FLASH_MIN_CAPABILITY
        and d <= FLASH_MAX_HEAD_DIM
        and not call.has_mask
        and same_dims
        and not sm86_89_limit
    ):
        return FLASH
    align = 8 if low else 4
    efficient_dtypes = (torch.float16, torch.float32) + ((torch.bfloat16,) if cap >= (8, 0) else ())
    if (
        cap >= EFFICIENT_MIN_CAPABILITY
        and not call.grouped
        and call.dtype in efficient_dtypes
        and call.head_dim % align == 0
        and call.value_head_dim % align == 0
    ):
        return EFFICIENT
    return MATH


def attention_class(capability: tuple[int, int] | None) -> tuple[int, int]:
    """A compute capability for which `choose_backend` picks what it picks for `capability`,
    whatever the call: it reads only the thresholds above (5.0, 8.0, and sm86/sm89).

    The kernel choice is the only thing in a trace that depends on the GPU, so GPUs of one
    class share their traces (the trace cache keys on the class: memfit.estimator.estimation.
    trace_key). A new use of the capability while tracing must refine this class."""
    cap = capability if capability is not None else FLASH_MIN_CAPABILITY
    if cap < EFFICIENT_MIN_CAPABILITY:
        return (0, 0)
    if cap < FLASH_MIN_CAPABILITY:
        return EFFICIENT_MIN_CAPABILITY
    return SM86_89[0] if cap in SM86_89 else FLASH_MIN_CAPABILITY


def run_sdpa(
    backend: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Run SDPA with the given backend's aten op; shapes as F.scaled_dot_product_attention.

    What the CUDA composite does before the kernel is done here too (attention.cpp
    `scaled_dot_product_attention`): a boolean mask becomes an additive mask of the query's
    dtype (`additive_mask`), and the memory-efficient kernel's mask is padded when its strides
    are not aligned (`efficient_mask`).
    """
    if enable_gqa and key.shape[-3] != query.shape[-3] and backend != FLASH:
        # Only flash takes grouped K/V (module docstring); math repeats them.
        groups = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    if backend == FLASH:
        out = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
        return out
    bias = additive_mask(attn_mask, query.dtype)
    if backend == EFFICIENT:
        needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
        if bias is not None:
            bias = efficient_mask(bias)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale
        )[0]
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, bias, dropout_p, is_causal, scale=scale, enable_gqa=False
    )[0]


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as CUDA's SDPA converts it, else the mask as it is.

    attention.cpp `convert_boolean_attn_mask` (torch 2.8-2.13, for every backend but cuDNN):
    `at::where(mask, scalar_tensor(0.0, dtype), scalar_tensor(-inf, dtype))`: one tensor of the
    mask's shape in the query's dtype (2 bytes an element for 16-bit queries) and two 0-dim
    scalars, freed after the `where`; the boolean mask is not negated or copied.
    """
    if mask is None or mask.dtype != torch.bool:
        return mask
    neg_inf = torch.scalar_tensor(-math.inf, dtype=dtype, device=mask.device)
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    out = torch.where(mask, zero, neg_inf)
    del neg_inf, zero
    return out


#: attention.cpp `preprocess_mask`: `mem_eff_alignment = 8`; a mask whose strides (all but the
#: last) are not multiples of it, or whose last stride is not 1, is padded (`pad_bias`).
EFFICIENT_MASK_ALIGNMENT = 8


def efficient_mask(bias: torch.Tensor) -> torch.Tensor:
    """The additive mask the memory-efficient kernel gets (attention.cpp `preprocess_mask`):
    unaligned, padded by `alignment - last % alignment` columns and sliced back (a new tensor;
    the unaligned one is released when no one else holds it), then broadcast by `expand`
    (a view)."""
    align = EFFICIENT_MASK_ALIGNMENT
    strides = bias.stride()
    aligned = all(s % align == 0 for s in strides[:-1]) and strides[-1] == 1
    if aligned:
        return bias
    last = bias.shape[-1]
    padded = torch.nn.functional.pad(bias, (0, align - last % align))
    return padded[..., :last]


def describe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[AttentionCall, dict]:
    """Normalise the arguments of an F.scaled_dot_product_attention call."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound: dict[str, Any] = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    bound.setdefault("attn_mask", None)
    bound.setdefault("dropout_p", 0.0)
    bound.setdefault("is_causal", False)
    bound.setdefault("scale", None)
    bound.setdefault("enable_gqa", False)
    q, v = bound["query"], bound["value"]
    call = AttentionCall(
        dtype=q.dtype,
        head_dim=q.shape[-1],
        value_head_dim=v.shape[-1],
        has_mask=bound["attn_mask"] is not None,
        dropout_p=float(bound["dropout_p"]),
        requires_grad=torch.is_grad_enabled()
        and any(bound[k].requires_grad for k in ("query", "key", "value")),
        grouped=bool(bound["enable_gqa"]) and bound["key"].shape[-3] != q.shape[-3],
    )
    return call, bound

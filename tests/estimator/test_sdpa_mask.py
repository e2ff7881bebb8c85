"""A boolean SDPA mask as CUDA converts it (attention.cpp `convert_boolean_attn_mask`) and as the
memory-efficient kernel gets it (`preprocess_mask`), byte for byte.

CUDA's composite turns a boolean mask into an additive mask of the query's dtype with one
`where(mask, 0, -inf)` (two 0-dim scalars, freed after it); memfit used to build it as
`zeros_like(mask).masked_fill(~mask, -inf)`, which also held a negated copy and a second
full-size tensor (5 bytes an element at its peak for 16-bit queries, against CUDA's 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.cuda.allocator_config import cuda_block_size
from memfit.estimator.trace.attention import EFFICIENT, MATH, additive_mask, efficient_mask
from memfit.estimator.trace.cuda_emulation import CudaEmulation
from memfit.events import ALLOC
from tests.estimator.test_cuda_emulation import Recorder

A100 = (8, 0)
B, H, L, D = 1, 2, 64, 8


class _Allocations(TorchDispatchMode):
    """The (op, bytes) of every tensor a real CPU call allocates, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t._base is None:
                self.made.append((str(func.name()).removeprefix("aten::"), t.nbytes))
        return out


def _call(S: int, capability=A100, dtype=torch.bfloat16) -> tuple[list[str], Recorder, int]:
    """One SDPA call with a boolean (B, 1, L, S) mask under the emulation; the backend, the
    recorder and the index of the call's first event."""
    backends: list[str] = []
    rec = Recorder(CudaEmulation(dtype=None, capability=capability, on_attention=backends.append))
    q = rec.tensor(B, H, L, D, dtype=dtype)
    k, v = rec.tensor(B, H, S, D, dtype=dtype), rec.tensor(B, H, S, D, dtype=dtype)
    with rec.fake:
        mask = torch.ones(B, 1, L, S, dtype=torch.bool)
    with rec:
        start = len(rec.tracker.events)
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return backends, rec, start


def test_conversion_is_the_installed_torchs_own() -> None:
    # The installed torch's composite converts the mask before any backend (its math path runs
    # on CPU): the same ops and bytes as memfit's conversion, whatever the torch version.
    mask = torch.ones(B, 1, L, L, dtype=torch.bool)
    q = torch.zeros(B, H, L, D, dtype=torch.bfloat16)
    log = _Allocations()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), log:
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    torch_conversion = log.made[:3]
    log = _Allocations()
    with log:
        out = additive_mask(mask, torch.bfloat16)
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == mask.shape
    assert log.made == torch_conversion
    # By hand: two bf16 scalars (-inf, 0), then one bf16 (B, 1, L, L) = 64 * 64 * 2 bytes.
    assert sorted(log.made) == [("scalar_tensor", 2), ("scalar_tensor", 2), ("where.self", 8192)]


def test_efficient_kernel_with_aligned_mask_holds_one_converted_copy() -> None:
    backends, rec, start = _call(S=L)
    assert backends == [EFFICIENT]
    made = rec.allocs(start)
    # The conversion: -inf and 0 scalars (512-byte blocks), the bf16 mask (64 * 64 * 2 = 8192);
    # then the kernel: output (1, 2, 64, 8) bf16 = 2048, an empty logsumexp (no grad), the
    # philox seed and offset (8 bytes each).
    assert made == [
        ("scalar_tensor.default", 2),
        ("scalar_tensor.default", 2),
        ("where.self", 8192),
        ("_scaled_dot_product_efficient_attention.default", 2048),
        ("_scaled_dot_product_efficient_attention.default", 0),
        ("_scaled_dot_product_efficient_attention.default", 8),
        ("_scaled_dot_product_efficient_attention.default", 8),
    ]
    # The scalars are freed before the kernel runs: at most the mask and the kernel's
    # outputs are alive, 8192 + 2048 + 512 + 512 bytes (the empty logsumexp takes no block).
    assert _peak(rec, start) == 8192 + 2048 + 512 + 512
    # (The old conversion held ~mask (4096), zeros_like (8192) and masked_fill's copy (8192).)


def test_efficient_kernel_pads_an_unaligned_mask() -> None:
    # S = 60: the converted (1, 1, 64, 60) mask has row stride 60, not a multiple of 8, so
    # preprocess_mask pads it to 64 columns (pad_bias: 8 - 60 % 8 = 4) and slices it back.
    backends, rec, start = _call(S=60)
    assert backends == [EFFICIENT]
    made = rec.allocs(start)
    assert made[:4] == [
        ("scalar_tensor.default", 2),
        ("scalar_tensor.default", 2),
        ("where.self", 64 * 60 * 2),  # 7680
        ("constant_pad_nd.default", 64 * 64 * 2),  # 8192
    ]
    # The unpadded copy is released once padded: peak = 7680 + 8192 during the pad, then
    # 8192 + the kernel's 2048 + 512 + 512.
    assert _peak(rec, start) == 7680 + 8192


def test_math_kernel_gets_the_converted_mask() -> None:
    # A T4 (sm75) runs bf16 through math; the mask is converted there too (2 bytes an element),
    # as attention.cpp converts it for every backend but cuDNN.
    backends, rec, start = _call(S=L, capability=(7, 5))
    assert backends == [MATH]
    assert rec.allocs(start)[:3] == [
        ("scalar_tensor.default", 2),
        ("scalar_tensor.default", 2),
        ("where.self", 8192),
    ]


def test_additive_and_aligned_masks_pass_through() -> None:
    m = torch.zeros(B, 1, L, L, dtype=torch.bfloat16)
    assert additive_mask(m, torch.bfloat16) is m and additive_mask(None, torch.float16) is None
    assert efficient_mask(m) is m  # strides (4096, 4096, 64, 1): all multiples of 8


def _peak(rec: Recorder, start: int) -> int:
    live: dict[int, int] = {}
    peak = 0
    for ev in rec.tracker.events[start:]:
        if ev[0] == ALLOC:
            live[ev[1]] = cuda_block_size(rec.tracker.records[ev[1]].nbytes)
        else:
            live.pop(ev[1], None)
        peak = max(peak, sum(live.values()))
    return peak

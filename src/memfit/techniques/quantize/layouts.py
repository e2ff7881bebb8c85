"""The storages a quantized linear weight occupies, as each library lays it out.

One function per method returns the list of `QuantStorage`s (name, shape, dtype) that the real
library creates for a weight of `out_features x in_features`; `nbytes` sums them. These are the
figures the estimate reports as parameters, and tests compare them byte for byte with real
layers (tests/techniques/test_quantize.py).

Sources (bitsandbytes 0.50, torchao 0.18):
- bitsandbytes 4-bit (`functional.quantize_4bit`, `nn.Params4bit._quantize`): the packed data
  is `((n*k + 1) // 2, 1)` of `quant_storage` (uint8: two 4-bit codes per byte); `absmax` one
  float32 per block of `blocksize` (64 by default, `Params4bit.__new__`); `code` the 16-entry
  float32 table (`get_4bit_type`, a new tensor per layer). With double quantization
  (`compress_statistics=True`) `absmax` is itself quantized by `quantize_blockwise(absmax -
  offset, blocksize=256)`: uint8 absmax, a float32 scalar `offset` (`absmax.mean()`), and a
  nested state2 with float32 absmax per 256 blocks and a 256-entry float32 `code`
  (`code.to(A.device, copy=True)`: a copy per layer).
- bitsandbytes LLM.int8 (`nn.Int8Params._quantize`, `functional.int8_vectorwise_quant`): `CB`
  int8 `(n, k)` (the parameter's data) and `SCB` float32 `(n,)` row scales.
- torchao `Int8WeightOnlyConfig` (version 2, `Int8Tensor.from_hp`, PerRow): `qdata` int8
  `(n, k)`, `scale` float32 `(n, 1)`, `zero_point` int8 `(n, 1)`.
- torchao `Int4WeightOnlyConfig` (version 2, plain packing, `Int4Tensor.from_hp`): `qdata`
  `(n, k // 2)` int8 (`pack_int4`), `scale` and `zero_point` `(k // group_size, n)` in the
  weight's dtype.
- torchao `Float8WeightOnlyConfig` (version 2, `Float8Tensor.from_hp`, PerRow): `qdata`
  float8_e4m3fn `(n, k)`, `scale` float32 `(n, 1)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: bitsandbytes' default 4-bit block size (`nn.Params4bit.__new__`: `blocksize = 64`).
BNB_4BIT_BLOCKSIZE = 64
#: Block sizes `functional.quantize_4bit` accepts.
BNB_4BIT_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Block size of the nested (double) quantization of absmax (`quantize_4bit`:
#: `quantize_blockwise(_absmax - offset, blocksize=256)`).
BNB_NESTED_BLOCKSIZE = 256
#: Entries of a 4-bit code table (`get_4bit_type`: `assert data.numel() == 16`) and of the
#: 8-bit dynamic map of the nested state (`create_dynamic_map`, 256 values).
BNB_4BIT_CODE_ENTRIES = 16
BNB_DYNAMIC_CODE_ENTRIES = 256
#: torchao `Int4WeightOnlyConfig.group_size` default.
TORCHAO_INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class QuantStorage:
    """One tensor the library allocates for a quantized weight."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def bnb_4bit(
    n: int, k: int, *, blocksize: int = BNB_4BIT_BLOCKSIZE, double_quant: bool,
    quant_storage: torch.dtype = torch.uint8,
) -> list[QuantStorage]:  # fmt: skip
    """bitsandbytes NF4 / FP4 (`Params4bit` + `QuantState`)."""
    numel = n * k
    packed_bytes = (numel + 1) // 2
    blocks = -(-numel // blocksize)
    out = [QuantStorage("data", (packed_bytes // quant_storage.itemsize, 1), quant_storage)]
    code = QuantStorage("code", (BNB_4BIT_CODE_ENTRIES,), torch.float32)
    if not double_quant:
        return [*out, QuantStorage("absmax", (blocks,), torch.float32), code]
    nested_blocks = -(-blocks // BNB_NESTED_BLOCKSIZE)
    return [
        *out,
        QuantStorage("absmax", (blocks,), torch.uint8),
        code,
        QuantStorage("offset", (), torch.float32),
        QuantStorage("state2.absmax", (nested_blocks,), torch.float32),
        QuantStorage("state2.code", (BNB_DYNAMIC_CODE_ENTRIES,), torch.float32),
    ]


def bnb_int8(n: int, k: int) -> list[QuantStorage]:
    """bitsandbytes LLM.int8 (`Int8Params`: CB and SCB)."""
    return [QuantStorage("CB", (n, k), torch.int8), QuantStorage("SCB", (n,), torch.float32)]


def torchao_int8_wo(n: int, k: int) -> list[QuantStorage]:
    """torchao Int8Tensor, per-row weight-only."""
    return [
        QuantStorage("qdata", (n, k), torch.int8),
        QuantStorage("scale", (n, 1), torch.float32),
        QuantStorage("zero_point", (n, 1), torch.int8),
    ]


def torchao_int4_wo(
    n: int, k: int, *, group_size: int = TORCHAO_INT4_GROUP_SIZE, dtype: torch.dtype
) -> list[QuantStorage]:
    """torchao Int4Tensor, plain packing, groupwise weight-only."""
    groups = k // group_size
    return [
        QuantStorage("qdata", (n, k // 2), torch.int8),
        QuantStorage("scale", (groups, n), dtype),
        QuantStorage("zero_point", (groups, n), dtype),
    ]


def torchao_fp8_wo(n: int, k: int) -> list[QuantStorage]:
    """torchao Float8Tensor, per-row weight-only."""
    return [
        QuantStorage("qdata", (n, k), torch.float8_e4m3fn),
        QuantStorage("scale", (n, 1), torch.float32),
    ]


def nbytes(storages: list[QuantStorage]) -> int:
    """Bytes of all the storages of one weight (before the allocator's rounding)."""
    return sum(s.nbytes for s in storages)

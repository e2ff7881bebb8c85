"""The tensors each pre-quantized format stores for one layer, under the checkpoint's own names,
as memfit.techniques.quantize.layouts does for the methods memfit quantizes itself (same
`QuantStorage`; bitsandbytes-serialized layers use its `bnb_4bit` / `bnb_int8`).

Sources (the expected names, dtypes and shapes each loader allocates):
- MXFP4, GPT-OSS experts (transformers/integrations/mxfp4.py: `Mxfp4GptOssExperts`,
  `convert_moe_packed_tensors`, and the checkpoint names of quantizer_mxfp4.py
  `serialized_names`): `{proj}_blocks` uint8 (E, N, K // 32, 16), two FP4 values per byte,
  and `{proj}_scales` uint8 (E, N, K // 32), one E8M0 exponent per 32 values; gate_up_proj has
  N = 2 * intermediate, K = hidden; down_proj N = hidden, K = intermediate. The biases are
  float32 (`Mxfp4GptOssExperts.__init__`: `dtype=torch.float32`).
- AWQ, GEMM format (AutoAWQ `WQLinear_GEMM`, gptqmodel's AWQ GEMM kernel that transformers'
  integrations/awq.py selects with `register_buffers=True`): `qweight` int32
  (K, N * bits // 32), `qzeros` int32 (K // G, N * bits // 32), `scales` float16 (K // G, N).
- GPTQ (optimum/gptqmodel `QuantLinear` buffers, the "gptq" checkpoint format): `qweight` int32
  (K * bits // 32, N), `qzeros` int32 (K // G, N * bits // 32), `scales` float16 (K // G, N),
  `g_idx` int32 (K,).
- FP8 fine-grained (integrations/finegrained_fp8.py `FP8Linear`): `weight` float8_e4m3fn (N, K),
  `weight_scale_inv` float32 (ceil(N / bn), ceil(K / bk)) (float8_e8m0fnu with scale_fmt
  "ue8m0"), or a float32 scalar without blocks; `activation_scale` float32 scalar when the
  activation scheme is static.
- FP8 fbgemm (integrations/fbgemm_fp8.py `FbgemmFp8Linear`): `weight` float8_e4m3fn (N, K),
  `weight_scale` float32 (N, 1), the non-persistent buffer `input_scale_ub` float32 (1,), and a
  float32 bias.
- compressed-tensors (compressors/naive_quantized and pack_quantized, scales from
  quantization/lifecycle/initialize.py `_initialize_scale_zero_point`): float-/int-/naive-
  quantized store `weight` (N, K) in float8_e4m3fn (8-bit float) or int8; pack-quantized stores
  `weight_packed` int32 (N, ceil(K * bits / 32)) and `weight_shape` int64 (2,); `weight_scale`
  in the weight's dtype, (1,) per tensor, (N, 1) per channel, (N, ceil(K / G)) per group,
  (ceil(N / bn), ceil(K / bk)) per block; a static input adds `input_scale` (1,).
G is the group size (K when -1). Here N is out_features and K in_features.
"""

from __future__ import annotations

import torch

from memfit.techniques.prequantized.config import MXFP4_BLOCK, PrequantizedConfig
from memfit.techniques.quantize.layouts import QuantStorage

__all__ = ["GPTQ_AWQ_SCALE_DTYPE", "ct_storages", "linear_storages", "mxfp4_expert_storages"]

#: AWQ / GPTQ scales are stored in float16 by both formats (`scales` buffers).
GPTQ_AWQ_SCALE_DTYPE = torch.float16
#: Bits of the int32 words AWQ and GPTQ pack their values into.
PACK_WORD_BITS = 32


def _groups(k: int, group_size: int) -> int:
    return 1 if group_size == -1 else -(-k // group_size)


def linear_storages(config: PrequantizedConfig, n: int, k: int) -> list[QuantStorage]:
    """The stored tensors of an `n x k` linear layer of `config`'s format (bias not included:
    it stays the model's own parameter, in the dtype the loader gives it)."""
    m = config.method
    if m in ("awq", "gptq"):
        assert config.bits is not None and config.group_size is not None
        per_word = PACK_WORD_BITS // config.bits
        g = _groups(k, config.group_size)
        zeros = QuantStorage("qzeros", (g, n // per_word), torch.int32)
        scales = QuantStorage("scales", (g, n), GPTQ_AWQ_SCALE_DTYPE)
        if m == "awq":
            return [QuantStorage("qweight", (k, n // per_word), torch.int32), zeros, scales]
        return [QuantStorage("qweight", (k // per_word, n), torch.int32), zeros, scales,
                QuantStorage("g_idx", (k,), torch.int32)]  # fmt: skip
    if m == "fp8":
        weight = QuantStorage("weight", (n, k), torch.float8_e4m3fn)
        block = config.weight_block_size
        shape = () if block is None else (-(-n // block[0]), -(-k // block[1]))
        scale = torch.float8_e8m0fnu if config.ue8m0_scales and block else torch.float32
        out = [weight, QuantStorage("weight_scale_inv", shape, scale)]
        if config.static_activation:
            out.append(QuantStorage("activation_scale", (), torch.float32))
        return out
    if m == "fbgemm_fp8":
        return [
            QuantStorage("weight", (n, k), torch.float8_e4m3fn),
            QuantStorage("weight_scale", (n, 1), torch.float32),
            QuantStorage("input_scale_ub", (1,), torch.float32),
        ]
    raise AssertionError(f"no linear layout for {m}")


def ct_storages(config: PrequantizedConfig, n: int, k: int, dtype: torch.dtype,
                decompressed: bool = False) -> list[QuantStorage]:  # fmt: skip
    """A compressed-tensors linear layer as stored (or, `decompressed`, as it is after
    compressed-tensors decompresses it on the first forward: a dense `weight` of `dtype` in
    place of the compressed one, the scales and `weight_shape` kept)."""
    ct = config.ct
    assert ct is not None
    if ct.strategy == "tensor":
        scale: tuple[int, ...] = (1,)
    elif ct.strategy == "channel":
        scale = (n, 1)
    elif ct.strategy == "group":
        scale = (n, -(-k // int(ct.group_size or k)))
    else:
        assert ct.block is not None
        scale = (-(-n // ct.block[0]), -(-k // ct.block[1]))
    packed = ct.format == "pack-quantized"
    if decompressed:
        out = [QuantStorage("weight", (n, k), dtype)]
    elif packed:
        out = [QuantStorage("weight_packed", (n, -(-k * ct.bits // PACK_WORD_BITS)), torch.int32)]
    else:
        stored = torch.float8_e4m3fn if ct.type == "float" else torch.int8
        out = [QuantStorage("weight", (n, k), stored)]
    out.append(QuantStorage("weight_scale", scale, dtype))
    if packed:
        out.append(QuantStorage("weight_shape", (2,), torch.int64))
    if ct.static_input:
        out.append(QuantStorage("input_scale", (1,), dtype))
    return out


def mxfp4_expert_storages(experts: int, hidden: int, intermediate: int) -> list[QuantStorage]:
    """The packed storages of one GPT-OSS experts module (biases not included)."""
    out = []
    for proj, n, k in (("gate_up_proj", 2 * intermediate, hidden),
                       ("down_proj", hidden, intermediate)):  # fmt: skip
        blocks = k // MXFP4_BLOCK
        out.append(QuantStorage(f"{proj}_blocks", (experts, n, blocks, MXFP4_BLOCK // 2),
                                torch.uint8))  # fmt: skip
        out.append(QuantStorage(f"{proj}_scales", (experts, n, blocks), torch.uint8))
    return out

"""A checkpoint's `quantization_config`, read as the installed transformers reads it, and the
forward transformers runs for it on the target GPU.

`read_quantization_config(raw, origin)` parses the config with transformers' own
`AutoQuantizationConfig.from_dict` (so a method the installed transformers does not know is
refused with its own list of methods), then keeps the fields that size the storage. Methods
memfit models: "mxfp4" (GPT-OSS experts), "awq" and "gptq" (4-/8-bit packed int32 with
group-wise scales), "fp8" (transformers' fine-grained FP8, block scales), "fbgemm_fp8"
(per-row scales), and bitsandbytes-serialized 4-bit / 8-bit (memfit's own bitsandbytes
layouts, memfit.techniques.quantize.config). Any other method transformers knows is refused by name.

`forward_path(config, capability)` is the rule each quantizer applies when it validates the
environment (transformers 5.17-5.24, unchanged across the range):
- mxfp4 (quantizer_mxfp4.py `validate_environment`): a pre-quantized checkpoint on a CUDA GPU
  below compute capability 7.5 is dequantized to bf16 (`self.quantization_config.dequantize =
  True`), as it is without Triton >= 3.4.0 or the `kernels` package; at 7.5 and above the
  experts keep their packed blocks and run the Triton `matmul_ogs` kernels.
- fp8 (quantizer_finegrained_fp8.py): below 8.9 the model is dequantized to bf16.
- fbgemm_fp8 (quantizer_fbgemm_fp8.py): below 9.0 transformers raises ValueError: refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import BadInputError

__all__ = [
    "MODELLED",
    "ForwardPath",
    "PrequantizedConfig",
    "forward_path",
    "read_quantization_config",
]

#: transformers' quant_method keys memfit models (AUTO_QUANTIZER_MAPPING's keys).
MODELLED = ("mxfp4", "awq", "gptq", "fp8", "fbgemm_fp8", "compressed-tensors",
            "bitsandbytes_4bit", "bitsandbytes_8bit")  # fmt: skip
#: compressed-tensors formats memfit models (CompressionFormat values).
CT_FORMATS = ("float-quantized", "naive-quantized", "int-quantized", "pack-quantized")
#: compressed-tensors strategies of a weight scale memfit models
#: (quantization/lifecycle/initialize.py `_initialize_scale_zero_point`).
CT_STRATEGIES = ("tensor", "channel", "group", "block")
#: quantizer_mxfp4.py: `is_device_supported_mxfp4 = compute_capability >= (7, 5)`.
MXFP4_MIN_CAPABILITY = (7, 5)
#: quantizer_finegrained_fp8.py: `if (major < 8) or (major == 8 and minor < 9)`: dequantize.
FP8_MIN_CAPABILITY = (8, 9)
#: quantizer_fbgemm_fp8.py: `if major < 9: raise ValueError(...)`.
FBGEMM_FP8_MIN_CAPABILITY = (9, 0)
#: MXFP4 packs 32 values per scale (`*_scales` is (..., K // 32)) and two values per byte
#: (`*_blocks` is (..., K // 32, 16)): transformers/integrations/mxfp4.py,
#: `convert_moe_packed_tensors`.
MXFP4_BLOCK = 32


@dataclass(frozen=True, kw_only=True)
class PrequantizedConfig:
    """The storage-shaping fields of a checkpoint's quantization_config.

    Attributes:
        method: transformers' quantizer key ("mxfp4", "awq", "gptq", "fp8", "fbgemm_fp8",
            "bitsandbytes_4bit", "bitsandbytes_8bit").
        bits: weight bits of awq / gptq (4 or 8).
        group_size: awq / gptq group size; -1 means one group of the whole input dimension.
        desc_act: gptq act-order (adds nothing to storage: g_idx is stored either way).
        weight_block_size: fp8 (block_n, block_k), or None for one per-tensor scale.
        static_activation: fp8 with activation_scheme "static" (an activation_scale per layer).
        ue8m0_scales: fp8 with scale_fmt "ue8m0" (float8_e8m0fnu block scales, FP8Linear).
        skip: `modules_to_not_convert` (bitsandbytes: `llm_int8_skip_modules`); None when the
            config gives none (transformers then adds its default skips).
        ct: for compressed-tensors, its one weight scheme; `skip` is then its `ignore` list.
        bnb: for bitsandbytes, memfit's QuantizeConfig method ("nf4", "nf4-dq", "fp4", "int8")
            and compute dtype.
        raw: the config as read, for the trace cache key.
    """

    method: str
    bits: int | None = None
    group_size: int | None = None
    desc_act: bool = False
    weight_block_size: tuple[int, int] | None = None
    static_activation: bool = False
    ue8m0_scales: bool = False
    skip: tuple[str, ...] | None = None
    bnb: tuple[str, str | None] | None = None
    ct: CtScheme | None = None
    raw: str = field(default="{}", repr=False)

    @property
    def label(self) -> str:
        if self.method in ("awq", "gptq"):
            return f"{self.method.upper()} {self.bits}-bit, group {self.group_size}"
        if self.method == "fp8":
            block = (
                "per-tensor"
                if self.weight_block_size is None
                else (f"blocks {self.weight_block_size[0]}x{self.weight_block_size[1]}")
            )
            return f"FP8 (fine-grained, {block})"
        if self.method == "fbgemm_fp8":
            return "FP8 (fbgemm, per-row)"
        if self.bnb is not None:
            return f"bitsandbytes {self.bnb[0]}"
        if self.ct is not None:
            ct = self.ct
            return f"compressed-tensors {ct.format} ({ct.type}{ct.bits}, {ct.strategy})"
        return self.method.upper()


@dataclass(frozen=True)
class CtScheme:
    """One compressed-tensors config group's weights (symmetric, targets "Linear")."""

    format: str
    bits: int
    type: str  # "int" or "float"
    strategy: str
    group_size: int | None = None
    block: tuple[int, int] | None = None
    static_input: bool = False  # a static per-tensor input scale (`input_scale`)


@dataclass(frozen=True)
class ForwardPath:
    """What transformers runs on the target GPU: the packed kernel or dequantized weights."""

    kernel: bool
    why: str


def read_quantization_config(raw: Any, origin: str) -> PrequantizedConfig:
    """The config's quantization_config as transformers parses it; BadInputError for a method
    transformers cannot load, or one memfit does not model (both named)."""
    if not isinstance(raw, dict) or "quant_method" not in raw:
        raise BadInputError(
            f"{origin}: quantization_config must be an object with a 'quant_method', got "
            f"{raw!r}. Fix the config, or remove quantization_config to estimate the model "
            "unquantized."
        )
    method = str(raw["quant_method"])
    key = method
    if method == "bitsandbytes":
        key = "bitsandbytes_4bit" if raw.get("load_in_4bit") else "bitsandbytes_8bit"
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING

    if key not in AUTO_QUANTIZER_MAPPING:
        import transformers

        raise BadInputError(
            f"{origin}: quant_method {method!r} is not a method transformers "
            f"{transformers.__version__} can load (it knows: "
            f"{', '.join(sorted(AUTO_QUANTIZER_MAPPING))}). Upgrade transformers, or fix "
            "quant_method."
        )
    if key not in MODELLED:
        raise BadInputError(
            f"{origin}: quant_method {method!r} is a method transformers loads, but memfit does "
            f"not model its storage (memfit models: {', '.join(MODELLED)}). Remove "
            "quantization_config to estimate the unquantized model, or pass --precision for "
            "its dtype."
        )
    parsed = _parse(dict(raw), origin)
    text = json.dumps(raw, sort_keys=True, default=str)
    skip = _skip(parsed, key)
    if key in ("awq", "gptq"):
        bits, group = int(parsed.bits), int(parsed.group_size)
        if bits not in (4, 8):
            raise BadInputError(
                f"{origin}: {method} with bits={bits}: memfit models 4- and 8-bit packing "
                "(int32 words of 32 // bits values). Use bits 4 or 8."
            )
        return PrequantizedConfig(method=key, bits=bits, group_size=group,
                                  desc_act=bool(getattr(parsed, "desc_act", False)), skip=skip,
                                  raw=text)  # fmt: skip
    if key == "fp8":
        block = parsed.weight_block_size
        static = str(raw.get("activation_scheme", "dynamic")) == "static"
        ue8m0 = str(getattr(parsed, "scale_fmt", "float")) == "ue8m0"
        return PrequantizedConfig(method=key, skip=skip, static_activation=static, raw=text,
                                  ue8m0_scales=ue8m0,
                                  weight_block_size=None if block is None else
                                  (int(block[0]), int(block[1])))  # fmt: skip
    if key.startswith("bitsandbytes"):
        return PrequantizedConfig(method=key, skip=skip, bnb=_bnb(parsed, key), raw=text)
    if key == "compressed-tensors":
        ignore = tuple(raw.get("ignore") or ())
        return PrequantizedConfig(method=key, skip=ignore, ct=_ct_scheme(raw, origin), raw=text)
    return PrequantizedConfig(method=key, skip=skip, raw=text)


def _parse(raw: dict[str, Any], origin: str) -> Any:
    from transformers.quantizers.auto import AutoQuantizationConfig

    try:
        return AutoQuantizationConfig.from_dict(raw)
    except (ValueError, TypeError, ImportError) as e:
        raise BadInputError(f"{origin}: transformers refuses its quantization_config: {e}") from e


def _ct_scheme(raw: dict[str, Any], origin: str) -> CtScheme:
    """The one weight scheme of a compressed-tensors config memfit models: one config group
    targeting "Linear", symmetric, no act-order, in one of CT_FORMATS."""
    groups = raw.get("config_groups") or {}
    if raw.get("sparsity_config") or len(groups) != 1:
        raise BadInputError(
            f"{origin}: compressed-tensors with {len(groups)} config groups"
            f"{' and sparsity' if raw.get('sparsity_config') else ''}: memfit models one "
            "quantization group on every Linear. Remove quantization_config to estimate the "
            "16-bit model."
        )
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    fmt = str(group.get("format") or raw.get("format"))
    problems = []
    if list(group.get("targets") or []) != ["Linear"]:
        problems.append(f"targets {group.get('targets')!r} (memfit: ['Linear'])")
    if fmt not in CT_FORMATS:
        problems.append(f"format {fmt!r} (memfit: {', '.join(CT_FORMATS)})")
    if weights.get("strategy") not in CT_STRATEGIES:
        problems.append(f"weight strategy {weights.get('strategy')!r}")
    if not weights.get("symmetric", True) or weights.get("actorder"):
        problems.append("asymmetric or act-order weights (zero points, g_idx)")
    if problems:
        raise BadInputError(
            f"{origin}: compressed-tensors with {'; '.join(problems)}: memfit does not model "
            "this scheme's storage. Remove quantization_config to estimate the 16-bit model."
        )
    inputs = group.get("input_activations") or {}
    block = weights.get("block_structure")
    return CtScheme(
        format=fmt, bits=int(weights["num_bits"]), type=str(weights.get("type", "int")),
        strategy=str(weights["strategy"]), group_size=weights.get("group_size"),
        block=None if block is None else (int(block[0]), int(block[1])),
        static_input=bool(inputs) and not inputs.get("dynamic", False),
    )  # fmt: skip


def _skip(parsed: Any, key: str) -> tuple[str, ...] | None:
    names = getattr(parsed, "llm_int8_skip_modules" if key.startswith("bits") else
                    "modules_to_not_convert", None)  # fmt: skip
    return None if names is None else tuple(names)


def _bnb(parsed: Any, key: str) -> tuple[str, str | None]:
    if key == "bitsandbytes_8bit":
        return "int8", None
    storage = str(getattr(parsed, "bnb_4bit_quant_storage", "uint8")).removeprefix("torch.")
    if storage != "uint8":
        raise BadInputError(
            f"bnb_4bit_quant_storage {storage!r} (FSDP-QLoRA's packing): memfit models "
            "bitsandbytes' uint8 storage. Save the checkpoint with the default quant_storage."
        )
    quant = str(parsed.bnb_4bit_quant_type)
    method = "nf4-dq" if quant == "nf4" and parsed.bnb_4bit_use_double_quant else quant
    compute = parsed.bnb_4bit_compute_dtype
    return method, None if compute is None else str(compute).removeprefix("torch.")


def forward_path(config: PrequantizedConfig, capability: tuple[int, int] | None) -> ForwardPath:
    """The kernel or dequantized path transformers takes on a GPU of `capability` (None: no
    GPU named, the kernel path of a capable GPU is assumed and said)."""
    m = config.method
    cc = (
        "no GPU named"
        if capability is None
        else f"compute capability {capability[0]}.{capability[1]}"
    )
    if m == "mxfp4":
        if capability is not None and capability < MXFP4_MIN_CAPABILITY:
            return ForwardPath(
                False,
                (
                    f"{cc} is below the 7.5 transformers' Mxfp4HfQuantizer requires "
                    "(quantizer_mxfp4.py validate_environment): it dequantizes the experts to bf16"
                ),
            )
        return ForwardPath(
            True,
            (
                f"{cc}: the experts keep their MXFP4 blocks and run the Triton matmul_ogs kernels "
                "(capability >= 7.5; transformers also needs triton >= 3.4.0 and the `kernels` "
                "package on that machine, else it dequantizes to bf16 as below 7.5)"
            ),
        )
    if m == "fp8":
        if capability is not None and capability < FP8_MIN_CAPABILITY:
            return ForwardPath(
                False,
                (
                    f"{cc} is below the 8.9 transformers' FineGrainedFP8HfQuantizer requires "
                    "(quantizer_finegrained_fp8.py): it dequantizes the weights to bf16"
                ),
            )
        return ForwardPath(
            True,
            f"{cc}: FP8 weights with per-token FP8 activations (Triton "
            "w8a8 block matmul, or DeepGEMM on 9.0+)",
        )
    if m == "fbgemm_fp8":
        if capability is not None and capability < FBGEMM_FP8_MIN_CAPABILITY:
            raise BadInputError(
                f"fbgemm_fp8 on a GPU of {cc}: transformers' FbgemmFp8HfQuantizer raises "
                "'FP8 quantized models is only supported on GPUs with compute capability >= "
                "9.0' (quantizer_fbgemm_fp8.py). Choose an H100-class GPU (--gpu h100-sxm)."
            )
        return ForwardPath(True, f"{cc}: fbgemm's f8f8bf16_rowwise with per-row FP8 inputs")
    if m == "compressed-tensors":
        return ForwardPath(
            False,
            (
                "transformers (CompressedTensorsConfig use_optimized_inference=False, its default; "
                "quantizer_compressed_tensors.py) leaves the weights compressed at load and lets "
                "compressed-tensors decompress every layer on the first forward pass, so the "
                "model runs with dense weights in its dtype (the scales stay)"
            ),
        )
    if m in ("awq", "gptq"):
        return ForwardPath(
            True,
            (
                f"{cc}: packed {config.bits}-bit weights; memfit assumes the dequantize-then-"
                "matmul path from 1024 rows (a float16 copy of one layer's weight at a time) "
                "and the fused kernel below"
            ),
        )
    return ForwardPath(
        True, f"{cc}: bitsandbytes' CUDA kernels (memfit.techniques.quantize.config)"
    )

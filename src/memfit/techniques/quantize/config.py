"""Quantized base weights: bitsandbytes 4-bit (NF4, NF4 with double quantization, FP4) and
LLM.int8, torchao weight-only int8 / int4 and float8; with LoRA on top, QLoRA.

`QuantizeConfig(method=...)` is applied to a real model by `apply_` (bitsandbytes' `Linear4bit`
/ `Linear8bitLt` swapped in and quantized, or torchao's `quantize_`), and traced by the estimator
through stand-in modules holding storages of the same layout (`quantize_trace`). Which linear
layers are quantized follows transformers' own rule for both libraries
(`HfQuantizer.get_modules_to_not_convert`: `get_keys_to_not_convert` keeps the output
embedding (`lm_head`), tied weights and the last parameter's module in full precision, plus the
model's `_keep_in_fp32_modules`); a model that is not a transformers model has every linear
layer quantized. `prepare_kbit_casts` is peft's `prepare_model_for_kbit_training` cast.

Example:
    >>> from memfit.techniques import QuantizeConfig
    >>> setup = memfit.apply_(model, [QuantizeConfig(method="nf4-dq"), LoraConfig(rank=16)])
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.techniques.quantize import layouts
from memfit.techniques.registry import Build, handler
from memfit.workload import QUANTIZE, check_choice

#: Which library each method uses.
LIBRARY = {
    "nf4": "bitsandbytes",
    "nf4-dq": "bitsandbytes",
    "fp4": "bitsandbytes",
    "int8": "bitsandbytes",
    "int8-wo": "torchao",
    "int4-wo": "torchao",
    "fp8": "torchao",
}
#: transformers' `BitsAndBytesConfig(llm_int8_threshold=6.0)` default outlier threshold.
BNB_INT8_THRESHOLD = 6.0
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


#: The quantization as reports name it.
_LABELS = {
    "nf4": "NF4",
    "nf4-dq": "NF4 double-quantized",
    "fp4": "FP4",
    "int8": "LLM.int8",
    "int8-wo": "int8 weight-only",
    "int4-wo": "int4 weight-only",
    "fp8": "float8",
}


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    """Quantized base weights (frozen) on the model's linear layers.

    Attributes:
        method: one of workload.QUANTIZE: "nf4", "nf4-dq" (double quantization), "fp4" and
            "int8" (LLM.int8) through bitsandbytes; "int8-wo", "int4-wo" and "fp8" (weight-only)
            through torchao.
        compute_dtype: bitsandbytes 4-bit `bnb_4bit_compute_dtype` ("bfloat16", "float16",
            "float32"); None: bitsandbytes' own rule (`Linear4bit.set_compute_type`: the dtype
            of the first input when it is float32 or bfloat16).
        blocksize: bitsandbytes 4-bit block size (64, `Params4bit`'s default).
        group_size: torchao int4 group size (128, `Int4WeightOnlyConfig`'s default).
        skip: more module names kept in full precision (`llm_int8_skip_modules`).
        prepare_kbit: after quantizing, apply peft's `prepare_model_for_kbit_training` casts
            (16-bit parameters that are not quantized to float32); its gradient checkpointing
            is memfit's own checkpointing option.
    """

    method: str = "nf4"
    compute_dtype: str | None = None
    blocksize: int = layouts.BNB_4BIT_BLOCKSIZE
    group_size: int = layouts.TORCHAO_INT4_GROUP_SIZE
    skip: tuple[str, ...] = ()
    prepare_kbit: bool = False

    def __post_init__(self) -> None:
        check_choice("quantize", self.method, QUANTIZE)
        if self.compute_dtype is not None:
            check_choice("compute_dtype", self.compute_dtype, tuple(_DTYPES))
        if self.blocksize not in layouts.BNB_4BIT_BLOCKSIZES:
            raise BadInputError(
                f"blocksize {self.blocksize!r} is not one bitsandbytes accepts "
                f"({', '.join(map(str, layouts.BNB_4BIT_BLOCKSIZES))}). Use blocksize=64."
            )
        if not isinstance(self.group_size, int) or self.group_size <= 0 or self.group_size % 2:
            raise BadInputError(
                f"group_size must be a positive even integer, got {self.group_size!r}. "
                "Use group_size=128."
            )
        object.__setattr__(self, "skip", tuple(self.skip))

    @property
    def label(self) -> str:
        """How reports name the technique: "NF4 base weights (bitsandbytes)"."""
        return f"{_LABELS[self.method]} base weights ({self.library})"

    @property
    def library(self) -> str:
        return LIBRARY[self.method]

    def storages(self, n: int, k: int, weight_dtype: torch.dtype) -> list[Any]:
        """The storages the library creates for an `n x k` weight of `weight_dtype`."""
        m = self.method
        if m in ("nf4", "nf4-dq", "fp4"):
            return layouts.bnb_4bit(n, k, blocksize=self.blocksize, double_quant=m == "nf4-dq")
        if m == "int8":
            return layouts.bnb_int8(n, k)
        if m == "int8-wo":
            return layouts.torchao_int8_wo(n, k)
        if m == "int4-wo":
            return layouts.torchao_int4_wo(n, k, group_size=self.group_size, dtype=weight_dtype)
        return layouts.torchao_fp8_wo(n, k)


def check_layer(config: QuantizeConfig, name: str, n: int, k: int) -> None:
    """A layer shape the library cannot quantize is an error, naming the layer."""
    if config.method == "int4-wo" and k % config.group_size:
        raise BadInputError(
            f"int4-wo: layer {name!r} has in_features={k}, not a multiple of group_size="
            f"{config.group_size} (torchao Int4Tensor groups the input dimension). Use a "
            "group_size that divides it, or another method."
        )


def kept_in_full_precision(model: torch.nn.Module, config: QuantizeConfig) -> list[str]:
    """Module-name patterns not quantized: transformers' rule for a transformers model
    (`HfQuantizer.get_modules_to_not_convert(model, None, model._keep_in_fp32_modules)`, the
    same call for its bitsandbytes and torchao quantizers), else none; plus `config.skip`."""
    inner = hf_model(model)
    names: list[str] = []
    if inner is not None:
        from transformers.quantizers.base import HfQuantizer

        names = HfQuantizer.get_modules_to_not_convert(
            inner, None, getattr(inner, "_keep_in_fp32_modules", None)
        )
    return sorted(set(names) | set(config.skip))


def hf_model(model: torch.nn.Module) -> Any:
    """The transformers model inside `model` (itself, or under a peft wrapper), or None."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    for m in model.modules():
        if isinstance(m, PreTrainedModel):
            return m
    return None


def should_convert(name: str, patterns: list[str]) -> bool:
    """transformers' `quantizers_utils.should_convert_module`: a pattern matches from the start
    up to a module boundary, as a regex with that boundary, or as a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(re.match(rf"(?:{p}){boundary}", name) or name.endswith(p) for p in patterns)


def quantizable(module: torch.nn.Module, config: QuantizeConfig) -> bool:
    """bitsandbytes (transformers' `replace_with_bnb_linear`): exactly nn.Linear, or GPT-2's
    Conv1D; torchao (`TorchAoHfQuantizer.param_needs_quantization`): any nn.Linear."""
    if config.library == "torchao":
        return isinstance(module, torch.nn.Linear)
    return type(module) is torch.nn.Linear or type(module).__name__ == "Conv1D"


def targets(model: torch.nn.Module, config: QuantizeConfig) -> tuple[list[str], list[str]]:
    """(names of the modules to quantize, patterns kept in full precision). Names are relative
    to the transformers model when there is one (its prefix in `model` stripped for matching)."""
    inner = hf_model(model)
    prefix = ""
    if inner is not None and inner is not model:
        prefix = next(n for n, m in model.named_modules() if m is inner) + "."
    keep = kept_in_full_precision(model, config)
    chosen = []
    for name, mod in model.named_modules():
        if not quantizable(mod, config) or ".lora_" in name:  # not peft's adapters
            continue
        rel = name[len(prefix) :] if name.startswith(prefix) else name
        rel = rel.replace(".base_layer", "")  # a peft LoRA wrapper's base layer
        if should_convert(rel, keep):
            chosen.append(name)
    return chosen, keep


def prepare_kbit_casts(model: torch.nn.Module, config: QuantizeConfig) -> list[str]:
    """peft's `prepare_model_for_kbit_training` casts (peft/utils/other.py): every fp16/bf16
    parameter that is not a 4-bit weight goes to float32 (the quantized int8/uint8 storages
    are not floating and stay). Not for torchao: peft skips the casts for a torchao model.
    Its `use_gradient_checkpointing` is memfit's separate checkpointing option. Returns the
    names cast."""
    if config.library == "torchao":
        raise BadInputError(
            f"prepare_kbit with quantize={config.method!r}: peft's "
            "prepare_model_for_kbit_training casts nothing on a torchao model "
            "(is_torchao_quantized). Drop prepare_kbit, or use a bitsandbytes method (nf4)."
        )
    cast = []
    for name, p in model.named_parameters():
        if p.dtype in (torch.float16, torch.bfloat16) and type(p).__name__ != "Params4bit":
            p.data = p.data.to(torch.float32)
            cast.append(name)
    return cast


def lora_in_fp32(model: torch.nn.Module, config: QuantizeConfig) -> None:
    """peft keeps LoRA adapters on a bitsandbytes base weight (stored as uint8 / int8) in
    float32: `_move_adapter_to_device_of_base_layer` casts adapters only to a floating base
    dtype, and `get_peft_model(autocast_adapter_dtype=True)` upcasts 16-bit adapters. A torchao
    weight reports its original dtype, so adapters follow it."""
    if config.library != "bitsandbytes":
        return
    for name, p in model.named_parameters():
        if ".lora_" in name and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)


@handler
def _quantize(config: QuantizeConfig, build: Build) -> None:
    from memfit.techniques.quantize.real import quantize_in_place

    names, kept = targets(build.model, config)
    quantize_in_place(build.model, config, build.device, names)
    lora_in_fp32(build.model, config)
    if config.prepare_kbit:
        prepare_kbit_casts(build.model, config)
    build.applied.append(config.label)
    if kept:
        build.left_to_caller.append(
            f"{config.label}: kept in full precision (transformers' rule): {', '.join(kept)}."
        )

"""A model already quantized by bitsandbytes, read back for the estimate: each `Linear4bit` /
`Linear8bitLt` of the real model stands as memfit's `QuantizedLinear` (quantize_trace) of the
same layout, built on the meta device from what the layer itself says.

What is read, per layer (bitsandbytes 0.4x-0.50, `nn/modules.py`):
- 4-bit: `weight.quant_type` ("nf4" / "fp4"), `weight.compress_statistics` (double
  quantization), `weight.blocksize`, the original dtype (`weight.quant_state.dtype` once
  quantized, else the weight's own dtype: bitsandbytes quantizes when the layer moves to the
  GPU), and the compute dtype when the layer fixed it (`compute_type_is_set`; else the first
  input's dtype decides, as `set_compute_type` does at the first call);
- 8-bit: `state.has_fp16_weights` and `state.threshold`.
peft's LoRA layers around them are the model's own and run as they are (peft's 4-bit LoRA
layer makes its "defensive" clone of the base output itself), so a stand-in makes no clone.

Refused, naming the layer: fp4 with double quantization, a `quant_storage` other than uint8
(FSDP-QLoRA's bf16 storage), 8-bit layers with fp16 (trainable) weights or no outlier threshold.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.techniques.quantize.config import QuantizeConfig
from memfit.techniques.quantize.trace import QuantizedLinear

__all__ = ["bnb_kind", "quantized_stand_ins"]


def bnb_kind(module: torch.nn.Module) -> str | None:
    """The kind of a bitsandbytes quantized linear layer (or a subclass of one, such
    as `LinearNF4`): "4bit" or "8bit"; else None. peft's LoRA wrappers are not (their base
    layers are)."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("bitsandbytes"):
            if cls.__name__ == "Linear4bit":
                return "4bit"
            if cls.__name__ == "Linear8bitLt":
                return "8bit"
    return None


def _config_4bit(name: str, module: Any) -> tuple[QuantizeConfig, torch.dtype]:
    w = module.weight
    quant_type = getattr(w, "quant_type", "fp4")
    double = bool(getattr(w, "compress_statistics", False))
    state = getattr(w, "quant_state", None)
    if state is not None:
        double = bool(getattr(state, "nested", double))
    storage = getattr(module, "quant_storage", torch.uint8)
    if storage != torch.uint8:
        raise BadInputError(
            f"Layer {name!r} stores its 4-bit weight as {storage} (bnb_4bit_quant_storage, as "
            "FSDP-QLoRA sets it): memfit models bitsandbytes' uint8 storage. Load the model with "
            "the default quant_storage to estimate it."
        )
    if quant_type == "fp4" and double:
        raise BadInputError(
            f"Layer {name!r} is FP4 with double quantization, which memfit does not model "
            "(it models NF4, NF4 double-quantized and FP4). Use "
            "BitsAndBytesConfig(bnb_4bit_quant_type='nf4')."
        )
    method = "nf4-dq" if double else quant_type
    dtype = state.dtype if state is not None else w.dtype
    compute = module.compute_dtype if getattr(module, "compute_type_is_set", False) else None
    config = QuantizeConfig(
        method=method,
        compute_dtype=str(compute).removeprefix("torch.") if compute is not None else None,
        blocksize=int(getattr(w, "blocksize", 64)),
    )
    return config, dtype


def _config_8bit(name: str, module: Any) -> tuple[QuantizeConfig, torch.dtype]:
    state = module.state
    if state.has_fp16_weights:
        raise BadInputError(
            f"Layer {name!r} is a bitsandbytes Linear8bitLt with has_fp16_weights=True (its "
            "weight trains in fp16): memfit models frozen int8 weights (LLM.int8 as "
            "transformers loads it). Load with has_fp16_weights=False."
        )
    if not state.threshold > 0:
        raise BadInputError(
            f"Layer {name!r} runs LLM.int8 with threshold={state.threshold!r}: memfit models "
            "the outlier decomposition (llm_int8_threshold > 0, transformers' default 6.0)."
        )
    return QuantizeConfig(method="int8"), torch.float16


def quantized_stand_ins(
    model: torch.nn.Module, memo: dict[int, Any]
) -> tuple[dict[int, torch.nn.Module], list[str]]:
    """({id of each bitsandbytes layer: its stand-in on meta}, notes). `memo` maps each real
    parameter to its meta copy (the stand-in keeps the layer's meta bias). Put the stand-ins in
    a deepcopy memo and the copy holds them where the layers were."""
    out: dict[int, torch.nn.Module] = {}
    kinds: dict[str, list[str]] = {}
    for name, mod in model.named_modules():
        kind = bnb_kind(mod)
        if kind is None or id(mod) in out:
            continue
        config, dtype = (_config_4bit if kind == "4bit" else _config_8bit)(name, mod)
        bias = memo.get(id(mod.bias)) if mod.bias is not None else None
        with torch.device("meta"):
            new = QuantizedLinear(config, mod.out_features, mod.in_features, dtype, bias,
                                  lora_clone=False)  # fmt: skip
        new.train(mod.training)
        out[id(mod)] = new
        short = re.sub(r"\.base_layer$", "", name).rsplit(".", 1)[-1]
        kinds.setdefault(config.label, []).append(short)
    notes = [
        f"{label}, read from the model: {len(names)} linear layers "
        f"({', '.join(sorted(set(names)))})."
        for label, names in kinds.items()
    ]
    return out, notes

"""`apply_`'s quantization of a real model, in place: bitsandbytes' `Linear4bit` /
`Linear8bitLt` swapped in for the chosen linear layers and quantized by moving them to the
device (as transformers' `replace_with_bnb_linear` and weight loading do), or torchao's
`quantize_` with a filter on the same layers.
"""

from __future__ import annotations

from typing import Any

import torch

_BNB_4BIT = {"nf4": ("nf4", False), "nf4-dq": ("nf4", True), "fp4": ("fp4", False)}


def quantize_in_place(model: torch.nn.Module, config: Any, device: torch.device,
                      names: list[str]) -> None:  # fmt: skip
    """Quantize the linear layers `names` of `model` (a `QuantizeConfig`'s `targets`) on
    `device`. A layer already quantized is not among them (idempotent)."""
    if config.library == "torchao":
        _torchao(model, config, set(names))
        return
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        raise ImportError(
            "quantize with bitsandbytes: install it with `pip install bitsandbytes`."
        ) from e
    for name in names:
        old: Any = model.get_submodule(name)
        w = old.weight.data
        if type(old).__name__ == "Conv1D":  # GPT-2 stores (in, out)
            w = w.t().contiguous()
        n, k = w.shape
        has_bias = old.bias is not None
        if config.method == "int8":
            new: torch.nn.Module = bnb.nn.Linear8bitLt(
                k, n, has_bias, has_fp16_weights=False, threshold=6.0, device="meta"
            )
            new.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
        else:
            qt, dq = _BNB_4BIT[config.method]
            compute = getattr(torch, config.compute_dtype) if config.compute_dtype else None
            new = bnb.nn.Linear4bit(k, n, has_bias, compute, compress_statistics=dq,
                                    quant_type=qt, device="meta")  # fmt: skip
            new.weight = bnb.nn.Params4bit(
                w, requires_grad=False, blocksize=config.blocksize, compress_statistics=dq,
                quant_type=qt, module=new,
            )  # fmt: skip
        if has_bias:
            new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
        new.train(old.training)
        new = new.to(device)  # bitsandbytes quantizes when the weight moves to a device
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)


def _torchao(model: torch.nn.Module, config: Any, names: set[str]) -> None:
    try:
        from torchao.quantization import (
            Float8WeightOnlyConfig,
            Int4WeightOnlyConfig,
            Int8WeightOnlyConfig,
            quantize_,
        )
        from torchao.utils import TorchAOBaseTensor
    except ImportError as e:
        raise ImportError("quantize with torchao: install it with `pip install torchao`.") from e
    cfg = {
        "int8-wo": lambda: Int8WeightOnlyConfig(),
        "int4-wo": lambda: Int4WeightOnlyConfig(group_size=config.group_size),
        "fp8": lambda: Float8WeightOnlyConfig(),
    }[config.method]()

    def chosen(m: torch.nn.Module, fqn: str) -> bool:
        return fqn in names and not isinstance(m.weight, TorchAOBaseTensor)

    quantize_(model, cfg, filter_fn=chosen)

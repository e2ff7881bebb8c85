"""Save a model changed by `apply_` so that the unmodified model loads it.

- Tied or shared tensors are stored once (safetensors refuses to store shared storage twice);
  the names left out are written in the file's metadata as `{left_out: kept}`.
- LoRA adapters (peft) are merged: `W + scale * B @ A` is stored under the base layer's
  original name, and no adapter tensor is stored.
- Checkpointing and the embedding-on-CPU hooks change no parameter name.

Example:
    >>> setup.save("model.safetensors")
    >>> memfit.load_weights(fresh_model, "model.safetensors")
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.errors import BadInputError


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with LoRA merged and adapter tensors dropped."""
    state = model.state_dict()
    lora_layers = _lora_layers(model)
    if not lora_layers:
        return state
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = t
    for path, layer in lora_layers.items():
        key = f"{path}.weight"
        merged = layer.get_base_layer().weight.detach().clone()
        if getattr(layer, "disable_adapters", False):
            out[key] = merged  # adapters switched off: the model runs the base weight
            continue
        already = set(getattr(layer, "merged_adapters", ()))  # peft's merge() added these
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A and adapter not in already:
                merged += layer.get_delta_weight(adapter).to(merged.dtype)
        out[key] = merged
    return out


def save_weights(model: torch.nn.Module, path: str) -> None:
    """Write `model`'s weights (LoRA merged, shared tensors once) to a safetensors file."""
    from safetensors.torch import save_file

    state = merged_state_dict(model)
    state, is_writer = _gathered(model, state)
    if not is_writer:
        return
    kept: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.device.type != "meta" and ident in kept:
            aliases[key] = kept[ident]
            continue
        kept[ident] = key
        tensors[key] = t.detach().to("cpu").contiguous()
    save_file(tensors, path, metadata=aliases or None)


def _gathered(
    model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], bool]:
    """Under FSDP2 the state dict holds shards (DTensors): gather the full tensors to the CPU of
    rank 0, which alone writes the file."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(t, DTensor) for t in state.values()):
        return state, True
    import torch.distributed as dist

    full = {k: (t.full_tensor() if isinstance(t, DTensor) else t).cpu() for k, t in state.items()}
    return full, dist.get_rank() == 0


def load_weights(model: torch.nn.Module, path: str) -> None:
    """Load a file written by `save_weights` into `model` (strict: every key must match)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    if not isinstance(model, torch.nn.Module):
        raise BadInputError(f"load_weights needs an nn.Module, got {type(model).__name__}.")
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            aliases = f.metadata() or {}
    except SafetensorError as e:
        raise BadInputError(
            f"{path} is not a safetensors file ({e}); load a file written by setup.save or "
            "memfit's save_weights."
        ) from e
    expected = model.state_dict()
    for left_out, kept_name in aliases.items():
        if left_out in expected and left_out not in tensors:
            tensors[left_out] = tensors[kept_name]
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise BadInputError(
            f"{path} does not match {type(model).__name__}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}. Load it into the architecture it was saved from."
        )
    model.load_state_dict(tensors, strict=True)


def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    found = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    for n, m in found.items():
        if not hasattr(m, "get_base_layer"):
            raise BadInputError(f"Cannot merge the LoRA layer {n!r}: unknown peft layout.")
    return found

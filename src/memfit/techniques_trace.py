"""Techniques applied to the model before tracing: LoRA, frozen parameters, checkpointing.

These change the model the same way `memfit.apply_` will change the user's model, so that the
estimate measures what the user will run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from memfit.errors import BadInputError
from memfit.sources import ModelSpec
from memfit.workload import Workload


def prepare_model(model: torch.nn.Module, w: Workload, spec: ModelSpec) -> torch.nn.Module:
    """Freeze what the workload freezes and add LoRA adapters (through peft)."""
    if w.tie_embeddings:  # first, as apply_ does: freezing a tied name freezes the matrix
        tie_embeddings(model, spec.name)
    if w.freeze:
        freeze(model, w.freeze, spec.name)
    if w.lora is not None:
        model = _add_lora(model, w, spec)
    return model


def freeze(model: torch.nn.Module, prefixes: tuple[str, ...], name: str) -> None:
    """No gradient for the parameters under these module-name prefixes (in place)."""
    matched = False
    for pname, p in model.named_parameters():
        if any(pname == f or pname.startswith(f + ".") for f in prefixes):
            p.requires_grad_(False)
            matched = True
    if not matched:
        raise BadInputError(
            f"Freeze prefixes {list(prefixes)!r} match no parameter of {name!r}. Give "
            "module-name prefixes from model.named_parameters(), e.g. 'model.embed_tokens'."
        )


def tie_embeddings(model: torch.nn.Module, name: str) -> None:
    """Make the output projection share the input embedding's weight (in place)."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    inp = get_in() if callable(get_in) else None
    out = get_out() if callable(get_out) else None
    if inp is None or out is None:
        raise BadInputError(
            f"--tie-embeddings needs a model with input and output embeddings; {name!r} has "
            "no output embedding (an encoder or a vision model)."
        )
    if inp.weight.shape != out.weight.shape:
        raise BadInputError(
            f"Cannot tie the embeddings of {name!r}: input {tuple(inp.weight.shape)} and output "
            f"{tuple(out.weight.shape)} differ in shape."
        )
    out.weight = inp.weight


def shared_outside(model: torch.nn.Module, module: torch.nn.Module) -> str | None:
    """The name of a parameter outside `module` that is one of `module`'s parameters (tied
    embeddings: the output projection's weight is the input embedding's), or None."""
    inside = set(map(id, module.modules()))
    table = {id(p) for p in module.parameters()}
    for name, mod in model.named_modules():
        if id(mod) in inside:
            continue
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in table:
                return f"{name}.{pname}" if name else pname
    return None


def embedding_tied_to(model: torch.nn.Module) -> str | None:
    """Where the input embedding's weight is shared outside it (e.g. "lm_head.weight")."""
    get_in = getattr(model, "get_input_embeddings", None)
    inp = get_in() if callable(get_in) else None
    return shared_outside(model, inp) if isinstance(inp, torch.nn.Module) else None


def input_embedding_path(model: torch.nn.Module) -> str | None:
    """Module path of the input embedding (HF get_input_embeddings), or None."""
    get_in = getattr(model, "get_input_embeddings", None)
    inp = get_in() if callable(get_in) else None
    if inp is None:
        return None
    for name, mod in model.named_modules():
        if mod is inp:
            return name
    return None


def default_lora_targets(model: torch.nn.Module) -> list[str]:
    """Names (last path component) of the linear layers inside repeated blocks."""
    from memfit.trace import find_repeated_blocks

    blocks = find_repeated_blocks(model)
    if not blocks:
        raise BadInputError(
            "LoRA without --lora-targets needs a stack of repeated blocks to find the linear "
            "layers; name them instead, e.g. --lora-targets q_proj,v_proj."
        )
    first = model.get_submodule(blocks[0])
    # nn.Linear, and transformers' Conv1D (GPT-2's projections), which peft adapts too.
    names = {
        n.rsplit(".", 1)[-1]
        for n, m in first.named_modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    }
    return sorted(names)


def _add_lora(model: torch.nn.Module, w: Workload, spec: ModelSpec) -> torch.nn.Module:
    assert w.lora is not None
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError(
            "LoRA estimates use peft: install it with `pip install memfit[lora]`."
        ) from e
    targets = list(w.lora.targets) or default_lora_targets(model)
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in targets if t not in present and not any(
        n.endswith("." + t) for n, _ in model.named_modules())]  # fmt: skip
    if missing:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if n and not any(True for _ in m.children()) and hasattr(m, "weight")
            }
        )
        raise BadInputError(
            f"LoRA target(s) {', '.join(repr(m) for m in missing)} match no module of "
            f"{spec.name!r}. Its layers with weights are named: {', '.join(linear)}."
        )
    cfg = LoraConfig(
        r=w.lora.rank,
        lora_alpha=w.lora.alpha,  # type: ignore[arg-type]  # peft annotates int; floats work
        target_modules=targets,
        lora_dropout=0.0,
    )
    return get_peft_model(model, cfg)


#: Called as f(block_path, entering) when a checkpointed block's forward starts and ends, in
#: the original forward and in its recomputation during backward. The tracker listens, to
#: attribute recomputed memory to the block and to run the CUDA emulation there too.
region_listeners: list[Callable[[str, bool], None]] = []


def checkpoint_blocks(
    model: torch.nn.Module,
    block_paths: list[str],
    *,
    save_ops: tuple[str, ...] | None = None,
) -> int:
    """Wrap each block's forward in non-reentrant activation checkpointing (in place).

    With `save_ops` (aten op names), checkpointing is selective: the outputs of those ops are
    saved and the rest is recomputed (create_selective_checkpoint_contexts).
    Wrapping twice is a no-op: the wrapped forward is marked. Returns the blocks wrapped now.
    """
    wrapped_now = 0
    for path in block_paths:
        block = model.get_submodule(path)
        if getattr(block.forward, "_memfit_checkpointed", False):
            if getattr(block.forward, "_memfit_save_ops", None) != save_ops:
                raise BadInputError(
                    f"Block {path!r} is already checkpointed with another policy; start from "
                    "the unwrapped model to change full/selective checkpointing."
                )
            continue
        # A partial over the block (not a closure over its bound forward): a deep copy of the
        # model (memfit.estimate copies a module it is given) then wraps the copied block.
        wrapped = functools.partial(
            _checkpointed_forward, block, path, block.__dict__.get("forward"), save_ops
        )
        wrapped._memfit_checkpointed = True  # type: ignore[attr-defined]
        wrapped._memfit_save_ops = save_ops  # type: ignore[attr-defined]
        block.forward = wrapped
        wrapped_now += 1
    return wrapped_now


def _checkpointed_forward(
    block: torch.nn.Module,
    path: str,
    inner: Callable[..., Any] | None,
    save_ops: tuple[str, ...] | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """The block's own forward (or the instance override it had), under checkpoint when
    gradients are on; region listeners hear where the block starts and ends."""
    fwd = inner if inner is not None else functools.partial(type(block).forward, block)
    if not torch.is_grad_enabled():
        return fwd(*args, **kwargs)

    def run(*a: Any, **kw: Any) -> Any:
        for f in region_listeners:
            f(path, True)
        try:
            return fwd(*a, **kw)
        finally:
            for f in region_listeners:
                f(path, False)

    extra: dict[str, Any] = {}
    if save_ops is not None:
        extra["context_fn"] = _selective_context(save_ops)
    return checkpoint(run, *args, use_reentrant=False, **extra, **kwargs)


def _selective_context(save_ops: tuple[str, ...]) -> Callable[[], Any]:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    names = frozenset(save_ops)

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        packet = getattr(op, "overloadpacket", None)
        name = getattr(packet, "__name__", str(op))
        return CheckpointPolicy.MUST_SAVE if name in names else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)

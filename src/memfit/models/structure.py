"""The structure of a model that techniques and the tracer rely on: its stack of repeated blocks,
its input embedding and what shares it, the linear layers LoRA adapts by default."""

from __future__ import annotations

import torch

from memfit.errors import BadInputError


def find_repeated_blocks(model: torch.nn.Module) -> list[str]:
    """Paths of the largest stack of identical blocks (same class, same parameter shapes).

    Looks at every nn.ModuleList / nn.Sequential; returns the children of the one holding the
    most parameters in a run of at least two identical children.
    """
    best: list[str] = []
    best_params = 0
    for name, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)) or len(mod) < 2:
            continue
        children = list(mod.named_children())
        sig0 = _signature(children[0][1])
        if not sig0[1] or any(_signature(c) != sig0 for _, c in children[1:]):
            continue
        n_params = sum(p.numel() for _, c in children for p in c.parameters())
        if n_params > best_params:
            prefix = name + "." if name else ""
            best = [prefix + child_name for child_name, _ in children]
            best_params = n_params
    return best


def _signature(module: torch.nn.Module) -> tuple[type, tuple]:
    shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters())
    return type(module), shapes


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
    blocks = find_repeated_blocks(model)
    if not blocks:
        raise BadInputError(
            "LoRA without targets needs a stack of repeated blocks to find the linear layers; "
            "name them instead, e.g. LoraConfig(rank=8, targets='q_proj,v_proj') "
            "(--lora-targets q_proj,v_proj)."
        )
    first = model.get_submodule(blocks[0])
    # nn.Linear, and transformers' Conv1D (GPT-2's projections), which peft adapts too.
    names = {
        n.rsplit(".", 1)[-1]
        for n, m in first.named_modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    }
    return sorted(names)

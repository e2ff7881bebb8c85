"""The input embedding table kept on the CPU: the lookup runs there, its output moves to the
model's device, and its gradient and optimizer state stay on the CPU. `move_model` places the
whole model (apply_ calls it once the parameters are final).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.models.structure import shared_outside
from memfit.techniques.registry import Build, handler

_ON_CPU_MARK = "_memfit_embedding_on_cpu"


@dataclass(frozen=True, kw_only=True)
class EmbeddingOnCpuConfig:
    """Keep the input embedding table on the CPU: the lookup runs there, its output is moved
    to the model's device, and its gradient and optimizer state stay on the CPU.

    Attributes:
        module: path of the embedding; None takes `model.get_input_embeddings()`.
    """

    module: str | None = None

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return "embedding on CPU"


def move_model(
    model: torch.nn.Module, device: torch.device, *, embedding: EmbeddingOnCpuConfig | None
) -> None:
    """Move the model to `device`, keeping the input embedding on the CPU if asked.

    Parameters keep their identity (tied weights stay tied): `.data` is moved.
    """
    emb = _embedding_module(model, embedding) if embedding is not None else None
    on_cpu = set(map(id, emb.modules())) if emb is not None else set()
    if emb is not None:
        shared = shared_outside(model, emb)
        if shared is not None:
            raise BadInputError(tied_embedding_message(shared))
    for mod in model.modules():
        here = torch.device("cpu") if id(mod) in on_cpu else device
        for p in mod._parameters.values():
            if p is not None and p.device != here:
                p.data = p.data.to(here)
        for n, b in mod._buffers.items():
            if b is not None and b.device != here:
                mod._buffers[n] = b.to(here)
    if emb is not None and not getattr(emb, _ON_CPU_MARK, False):
        emb.register_forward_pre_hook(_inputs_to_cpu)
        emb.register_forward_hook(_output_to(device))
        setattr(emb, _ON_CPU_MARK, True)


def tied_embedding_message(shared: str) -> str:
    return (
        f"The input embedding's weight is also {shared} (tied embeddings): it cannot stay on "
        "the CPU while the output projection runs on the GPU. Untie them, or keep the "
        "embedding on the GPU."
    )


def _embedding_module(model: torch.nn.Module, cfg: EmbeddingOnCpuConfig) -> torch.nn.Module:
    if cfg.module is not None:
        try:
            return model.get_submodule(cfg.module)
        except AttributeError as e:
            raise BadInputError(
                f"EmbeddingOnCpuConfig(module={cfg.module!r}) is not a module of "
                f"{type(model).__name__}; name one from model.named_modules()."
            ) from e
    get_in = getattr(model, "get_input_embeddings", None)
    emb = get_in() if callable(get_in) else None
    if emb is None:
        raise BadInputError(
            f"{type(model).__name__} has no get_input_embeddings(); name the embedding: "
            "EmbeddingOnCpuConfig(module='embed')."
        )
    return emb


def _inputs_to_cpu(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.to("cpu") if isinstance(a, torch.Tensor) else a for a in args)


def _output_to(device: torch.device) -> Any:
    """A forward hook that moves the embedding's output to `device` (autograd moves the
    gradient back to the CPU table in backward)."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return output.to(device)
        return output

    return hook


@handler
def _embedding_on_cpu(config: EmbeddingOnCpuConfig, build: Build) -> None:
    # Placement itself is done by _place, before the modules are wrapped.
    build.applied.append(config.label)

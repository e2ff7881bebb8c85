"""Activation checkpointing: non-reentrant `torch.utils.checkpoint` around repeated blocks
(every block, the first k, or named ones), full or selective (keep matmul and attention
outputs, recompute the rest).

The tracer wraps the traced model with the same `checkpoint_blocks`, so what is estimated is
what `apply_` applies; `region_listeners` lets the tracker hear where a checkpointed block's
forward (and its recomputation in backward) starts and ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from memfit.errors import BadInputError
from memfit.models.structure import find_repeated_blocks
from memfit.techniques.registry import Build, handler
from memfit.workload import check_choice

#: Ops whose outputs selective checkpointing keeps by default: the matmuls and attention kernels,
#: the expensive ops to recompute (the policy torchtitan uses for "selective op" checkpointing).
#: Everything else (activations, norms, elementwise) is recomputed in backward.
DEFAULT_SAVE_OPS = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


CHECKPOINT_POLICIES = ("full", "selective")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Non-reentrant activation checkpointing on repeated blocks.

    Attributes:
        blocks: module paths to wrap; None finds the repeated blocks (the largest
            nn.ModuleList / nn.Sequential of identical modules: HF decoder layers, encoder
            layers, ResNet stages' blocks ...).
        first: wrap only the first k of those blocks (the planner's least-recompute choice);
            None wraps all.
        policy: "full" recomputes the whole block in backward; "selective" keeps the outputs of
            `save_ops` (matmuls, attention) and recomputes the rest
            (torch.utils.checkpoint.create_selective_checkpoint_contexts).
        save_ops: aten op names whose outputs the selective policy saves.
    """

    blocks: tuple[str, ...] | None = None
    first: int | None = None
    policy: str = "full"
    save_ops: tuple[str, ...] = DEFAULT_SAVE_OPS

    def __post_init__(self) -> None:
        check_choice("checkpoint policy", self.policy, CHECKPOINT_POLICIES)
        if self.first is not None and (isinstance(self.first, bool) or self.first < 0):
            raise BadInputError(f"CheckpointConfig.first must be >= 0, got {self.first!r}.")

    @property
    def label(self) -> str:
        """How reports name the technique."""
        if self.blocks is not None:
            what = f"checkpointing {len(self.blocks)} named blocks"
        elif self.first is None:
            what = "checkpointing every block"
        else:
            what = f"checkpointing the first {self.first} blocks"
        return what + (" (selective)" if self.policy == "selective" else "")


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


def checkpoint_model(model: torch.nn.Module, config: CheckpointConfig) -> int:
    """Wrap the chosen blocks in non-reentrant checkpointing; returns how many are wrapped
    (including ones wrapped by an earlier call)."""
    detected = find_repeated_blocks(model)
    if config.blocks is not None:
        blocks = list(config.blocks)
        names = dict(model.named_modules())
        unknown = [b for b in blocks if b not in names]
        if unknown:
            hint = (
                f"Its repeated blocks are {detected[0]} ... {detected[-1]}."
                if detected
                else "It has no stack of repeated blocks; name modules from model.named_modules()."
            )
            raise BadInputError(
                f"Checkpoint block(s) {unknown[:3]!r} do not exist in "
                f"{type(model).__name__} (a plan made for another architecture?). {hint}"
            )
    else:
        if not detected:
            raise BadInputError(
                f"{type(model).__name__} has no stack of repeated blocks (an nn.ModuleList or "
                "nn.Sequential of identical modules) to checkpoint. Name the modules: "
                "CheckpointConfig(blocks=('encoder.0', 'encoder.1'))."
            )
        blocks = detected
    if config.first is not None:
        if config.first > len(blocks):
            raise BadInputError(
                f"CheckpointConfig(first={config.first}) but the model has {len(blocks)} blocks."
            )
        blocks = blocks[: config.first]
    save_ops = config.save_ops if config.policy == "selective" else None
    checkpoint_blocks(model, blocks, save_ops=save_ops)
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "use_cache"):
        cfg.use_cache = False  # a KV cache is useless in training and defeats checkpointing
    return len(blocks)


@handler
def _checkpoint(config: CheckpointConfig, build: Build) -> None:
    n = checkpoint_model(build.model, config)
    build.applied.append(f"checkpointing ({config.policy}) on {n} block{'s' if n != 1 else ''}")

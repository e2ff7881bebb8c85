"""The optimizer as a technique: its config, its `apply_` handler, and the trace's builder.

What each optimizer keeps and how it is built (torch's foreach implementation for the trace, as
CUDA picks it; layouts of bitsandbytes' and torchao's packed states) is its row in
memfit.optimizers; this module reads it. `host_state_keys` says which state entries CUDA keeps
on the host, so that the tracer does not count them as GPU memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.events import Category
from memfit.optimizers import (
    DEFAULT_LR,
    DEFAULT_OPTIMIZER,
    NO_OPTIMIZER,
    OPTIMIZERS,
    build,
    host_state_keys,
    is_paged_state,
    spec_of,
)
from memfit.precision import precision_of
from memfit.techniques.offload.cpu_optimizer import CpuOffloadOptimizer
from memfit.techniques.registry import Build, handler
from memfit.workload import check_choice

__all__ = [
    "OptimizerConfig",
    "build_optimizer",
    "host_state_keys",
    "is_paged_state",
    "make_optimizer",
    "mark_state",
    "optimizer_for_trace",
    "paged_state_note",
]


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer, by memfit name (a row of memfit.optimizers), with its learning rate.

    Rows of another library (bitsandbytes, torchao, schedulefree) need it installed. With
    `offload`, the state and the update live on the CPU
    (memfit.techniques.offload.cpu_optimizer.CpuOffloadOptimizer).
    """

    name: str = DEFAULT_OPTIMIZER
    lr: float = DEFAULT_LR
    weight_decay: float = 0.0
    offload: bool = False

    def __post_init__(self) -> None:
        check_choice("optimizer", self.name, OPTIMIZERS)
        if self.name == NO_OPTIMIZER:
            raise BadInputError(
                "OptimizerConfig(name='none') builds nothing; leave the config out instead."
            )
        if not self.lr > 0:
            raise BadInputError(f"Learning rate must be > 0, got {self.lr!r}.")
        if self.offload and spec_of(self.name).paged:
            raise BadInputError(
                f"OptimizerConfig(name={self.name!r}, offload=True): a paged optimizer keeps its "
                "state in CUDA unified memory that pages to the host by itself; on the CPU it "
                "is an ordinary optimizer. Drop offload, or use "
                f"name={DEFAULT_OPTIMIZER!r} with offload."
            )

    @property
    def label(self) -> str:
        """How reports name the technique: only the offload (reports show the optimizer)."""
        return "optimizer state on CPU" if self.offload else ""


def paged_state_note(records: dict[int, Any]) -> str | None:
    """What an estimate says about paged optimizer state (StorageRecord.paged), or None.

    bitsandbytes allocates it with cudaMallocManaged (functional.py `get_paged`), outside
    PyTorch's caching allocator: the allocator figures leave it out. The driver keeps it on the
    GPU while it fits beside the allocator's memory and evicts it to host RAM under pressure,
    so it never causes an out-of-memory; evicted, each step's update pages it in (and out
    again): up to its size each way over PCIe.
    """
    paged = sum(r.nbytes for r in records.values() if r.paged)
    if not paged:
        return None
    from memfit.units import format_bytes

    size = format_bytes(paged)
    return (
        f"Paged optimizer state: {size} in CUDA unified memory (bitsandbytes' paged "
        "optimizer), outside PyTorch's allocator and not in the device figures: on the GPU "
        "while it fits beside them, paged to host RAM under memory pressure (never an "
        f"out-of-memory). Evicted, each step pages up to {size} in and {size} out over PCIe."
    )


def mark_state(
    tracker: Any,
    optimizer: torch.optim.Optimizer,
    host_keys: frozenset[str],
    params: Iterable[Any] | None = None,
) -> None:
    """Mark `optimizer`'s state tensors (of `params`, else all) as optimizer state in the
    tracer: the entries CUDA keeps on the host (`host_state_keys`) as host, paged ones as
    paged."""
    states = optimizer.state.values() if params is None else [optimizer.state[p] for p in params]
    for state in states:
        for key, v in state.items():
            if isinstance(v, torch.Tensor):
                paged = is_paged_state(optimizer, v)
                tracker.mark(v, Category.OPTIMIZER_STATE, host=key in host_keys, paged=paged)


def build_optimizer(
    params: list[Any], config: OptimizerConfig, *, for_trace: bool
) -> torch.optim.Optimizer:
    """The optimizer `config` names over `params`.

    With `for_trace`, it is laid out as CUDA runs it by default (`OptimizerSpec.trace`: the
    foreach implementation asked for explicitly, since a CPU trace would otherwise run the
    per-tensor loop; layouts of packed states). Otherwise it is the real optimizer
    (`OptimizerSpec.real`), with torch's own implementation choice.
    """
    if not params:
        raise BadInputError(
            "No parameter requires grad, so there is nothing to optimize. Unfreeze some "
            "parameters, add LoRA (--lora-rank), or use --optimizer none / --mode inference."
        )
    return build(
        config.name, params, lr=config.lr, weight_decay=config.weight_decay, for_trace=for_trace
    )


def make_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer over the trainable parameters (each once, tied ones included once)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BadInputError(
            "No parameter of the model requires grad, so there is nothing to optimize. "
            "Unfreeze some parameters or add LoRA."
        )
    if config.offload:
        return CpuOffloadOptimizer(params, lambda ps: build_optimizer(ps, config, for_trace=False))
    return build_optimizer(params, config, for_trace=False)


@handler
def _optimizer_handler(config: OptimizerConfig, build: Build) -> None:
    recipe = precision_of(build.precision)
    if recipe.pure and recipe.fp16 and not spec_of(config.name).fp16_true_safe:
        raise BadInputError(
            f"fp16-true with {config.name} ({spec_of(config.name).title}) diverges: its state "
            "and update run in fp16, where its small epsilon (1e-8 and below is 0) or its "
            "update's range do not fit, and nothing scales the loss, so the first steps give "
            "NaN. Use fp16-mixed (fp32 weights, GradScaler), or bf16-true on a GPU with bf16."
        )
    build.optimizer = make_optimizer(build.model, config)
    build.optimizer_config = config
    build.applied.append(
        f"optimizer {config.name}, lr {config.lr:g}" + (" on CPU" if config.offload else "")
    )
    if (note := spec_of(config.name).apply_note) is not None:
        build.left_to_caller.append(f"{config.name}: {note}.")
    build.left_to_caller.append(
        "the optimizer step: setup.step runs it; another trainer takes setup.optimizer "
        "(HF Trainer: optimizers=(setup.optimizer, None))."
    )


def optimizer_for_trace(name: str, params: list[Any]) -> torch.optim.Optimizer | None:
    """The optimizer a workload names (`Workload.optimizer`), laid out as CUDA runs it by
    default; None for "none"."""
    if name == NO_OPTIMIZER:
        return None
    return build_optimizer(params, OptimizerConfig(name=name), for_trace=True)

"""Every technique, once: `TechniqueSpec` rows in `TECHNIQUES`, in the one order `apply_` applies
them and the trace prepares the model in.

A row holds the technique's config type (whose module holds its validation, docstring and
`@handler` for `apply_`), the config a `Workload` implies (`from_workload`), the trace hook that
does to the fake model what `apply_` will do to the real one, the stage that hook runs in, and
where reports list it. The estimator's `_traced_model` is a loop over the rows' hooks;
`configs_from_workload` and `apply_`'s order are read from the rows. Adding a technique is a
module with its config and handler, and one row here (tests/techniques/test_table.py).

Stages of the trace, in order:
- "model": on the model as built, before its tensors are made fake (tie, freeze, LoRA);
- "storage": after the fake materialization and the precision cast (quantized linears);
- "wrap": forward wrappers and sharding, once the repeated blocks are known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from memfit.errors import BadInputError
from memfit.optimizers import NO_OPTIMIZER
from memfit.techniques.accumulation import AccumulationConfig
from memfit.techniques.checkpointing import CheckpointConfig, checkpoint_blocks
from memfit.techniques.chunked_loss import ChunkedLossConfig, chunk_loss_for_trace
from memfit.techniques.distillation.config import DistillationConfig, config_from_workload
from memfit.techniques.distillation.trace import for_trace as distillation_for_trace
from memfit.techniques.freeze import FreezeConfig, freeze
from memfit.techniques.lora import add_lora_for_trace
from memfit.techniques.offload.activations import ActivationOffloadConfig, offload_for_trace
from memfit.techniques.offload.embedding_on_cpu import EmbeddingOnCpuConfig
from memfit.techniques.optimizer import DEFAULT_LR, OptimizerConfig
from memfit.techniques.optimizer_in_backward import OptimizerInBackwardConfig
from memfit.techniques.parallel.data_parallel import DDPConfig
from memfit.techniques.parallel.fsdp import FSDPConfig, fsdp_config_of, shard_model
from memfit.techniques.precision import PrecisionConfig
from memfit.techniques.quantize.config import QuantizeConfig
from memfit.techniques.quantize.trace import prepare_quantized
from memfit.techniques.tie_embeddings import TieEmbeddingsConfig, tie_embeddings
from memfit.workload import LoraConfig, Workload

STAGES = ("model", "storage", "wrap")


@dataclass
class TraceContext:
    """What trace hooks read beside the model and the workload, and what they leave for the
    step: the model's source, the fake mode, the device mesh (FSDP2), the repeated blocks (known
    from the "wrap" stage on), `materialize(model, dtype, copy)` for models a hook builds (a
    teacher), and the notes and teacher they produce."""

    spec: Any
    fake_mode: Any
    mesh: Any = None
    materialize: Callable[[torch.nn.Module, torch.dtype, bool], torch.nn.Module] | None = None
    blocks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    teacher: Any = None


Hook = Callable[[torch.nn.Module, Workload, TraceContext], torch.nn.Module | None]


@dataclass(frozen=True)
class TechniqueSpec:
    """One technique. `from_workload(w, lr)` is the config `w` implies, or None; `trace` (run in
    `stage`) returns the model when it replaces it; `report` orders reports' technique lists."""

    config: type
    from_workload: Callable[[Workload, float], Any]
    report: int
    trace: Hook | None = None
    stage: str = "wrap"


# ----------------------------------------------------------------------------- trace hooks


def _tie(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    tie_embeddings(model, ctx.spec.name)


def _freeze(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    freeze(model, w.freeze, ctx.spec.name)


def _lora(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> torch.nn.Module:
    assert w.lora is not None
    return add_lora_for_trace(model, w.lora, ctx.spec.name)


def _quantize(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    ctx.notes += prepare_quantized(model, w, ctx.fake_mode)  # which layers stayed unquantized


def _checkpoint(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    if not ctx.blocks:
        raise BadInputError(
            f"checkpointing='blocks' needs a stack of repeated blocks, and {ctx.spec.name!r} has "
            "none (no nn.ModuleList/nn.Sequential of identical modules)."
        )
    first = w.checkpoint_first
    checkpoint_blocks(model, ctx.blocks if first is None else ctx.blocks[:first])


def _shard(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    if ctx.mesh is not None:
        with ctx.fake_mode:
            shard_model(model, fsdp_config_of(w), mesh=ctx.mesh, pin_memory=False)


def _chunk(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    chunk_loss_for_trace(model, w)


def _distill(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    assert ctx.materialize is not None
    ctx.teacher = distillation_for_trace(model, w, ctx.fake_mode, ctx.materialize)


def _offload(model: torch.nn.Module, w: Workload, ctx: TraceContext) -> None:
    offload_for_trace(model, w)


# ----------------------------------------------------------------------------- the table


def _optimizer(w: Workload, lr: float) -> OptimizerConfig | None:
    if not w.training or w.optimizer == NO_OPTIMIZER:
        return None
    return OptimizerConfig(name=w.optimizer, lr=lr, offload=w.offload_optimizer)


def _in_backward(w: Workload, lr: float) -> OptimizerInBackwardConfig | None:
    # Steps the OptimizerConfig above, inside backward.
    return OptimizerInBackwardConfig() if w.optimizer_in_backward and _optimizer(w, lr) else None


def _chunked(w: Workload) -> ChunkedLossConfig | None:
    return None if w.chunked_loss is None else ChunkedLossConfig(chunks=w.chunked_loss)


def _quantized(w: Workload) -> QuantizeConfig | None:
    if w.quantize is None:
        return None
    return QuantizeConfig(method=w.quantize, prepare_kbit=w.prepare_kbit)


def _if(flag: bool, make: Callable[[], Any]) -> Any:
    return make() if flag else None


#: In the order `apply_` applies them and the trace prepares the model (within each stage).
TECHNIQUES: tuple[TechniqueSpec, ...] = (
    # Before freezing: freezing a tied name freezes the shared matrix.
    TechniqueSpec(TieEmbeddingsConfig, lambda w, lr: _if(w.tie_embeddings, TieEmbeddingsConfig),
                  report=8, trace=_tie, stage="model"),
    TechniqueSpec(FreezeConfig, lambda w, lr: _if(bool(w.freeze), lambda: FreezeConfig(
                  prefixes=w.freeze)), report=4, trace=_freeze, stage="model"),
    TechniqueSpec(LoraConfig, lambda w, lr: w.lora, report=3, trace=_lora, stage="model"),
    # Before precision: autocast wraps the chunked forward and the student's forward.
    TechniqueSpec(ChunkedLossConfig, lambda w, lr: _chunked(w), report=12, trace=_chunk),
    TechniqueSpec(DistillationConfig, lambda w, lr: config_from_workload(w), report=13,
                  trace=_distill),
    TechniqueSpec(PrecisionConfig, lambda w, lr: _if(w.precision != "fp32", lambda:
                  PrecisionConfig(precision=w.precision)), report=14),
    # On the device, after the cast (the quantization dtype), as traced.
    TechniqueSpec(QuantizeConfig, lambda w, lr: _quantized(w), report=2, trace=_quantize,
                  stage="storage"),
    TechniqueSpec(EmbeddingOnCpuConfig, lambda w, lr: _if(w.embedding_on_cpu,
                  EmbeddingOnCpuConfig), report=7),
    TechniqueSpec(CheckpointConfig, lambda w, lr: _if(w.checkpointing != "off", lambda:
                  CheckpointConfig(first=w.checkpoint_first)), report=1, trace=_checkpoint),
    # FSDP2's CPU offload shards over one GPU too.
    TechniqueSpec(FSDPConfig, lambda w, lr: _if(w.fsdp, lambda: fsdp_config_of(w)), report=9,
                  trace=_shard),
    # The outermost forward wrapper: all of forward is offloaded.
    TechniqueSpec(ActivationOffloadConfig, lambda w, lr: _if(bool(w.offload_activations),
                  lambda: ActivationOffloadConfig(variant=str(w.offload_activations))),
                  report=11, trace=_offload),
    TechniqueSpec(DDPConfig, lambda w, lr: _if(w.ddp, lambda: DDPConfig(world_size=w.gpus)),
                  report=10),  # wraps the final model
    TechniqueSpec(AccumulationConfig, lambda w, lr: _if(w.grad_accum > 1, lambda:
                  AccumulationConfig(steps=w.grad_accum)), report=0),
    TechniqueSpec(OptimizerConfig, _optimizer, report=5),
    TechniqueSpec(OptimizerInBackwardConfig, _in_backward, report=6),
)  # fmt: skip

#: The config types, in the order `apply_` applies them.
ORDER: tuple[type, ...] = tuple(t.config for t in TECHNIQUES)


def configs_of(w: Workload, *, lr: float = DEFAULT_LR) -> list[Any]:
    """The technique configs that turn a model into the step `w` describes, in the order
    reports list them (`apply_` runs them in `ORDER`)."""
    if w.offload_optimizer and (not w.training or w.optimizer == NO_OPTIMIZER):
        raise BadInputError("offload_optimizer needs a training workload with an optimizer.")
    rows = sorted(TECHNIQUES, key=lambda t: t.report)
    return [c for t in rows if (c := t.from_workload(w, lr)) is not None]


def prepare_for_trace(
    model: torch.nn.Module, w: Workload, ctx: TraceContext, stage: str
) -> torch.nn.Module:
    """Run the trace hooks of `stage` for the techniques `w` uses, in the table's order."""
    for t in TECHNIQUES:
        if t.stage != stage or t.trace is None or t.from_workload(w, DEFAULT_LR) is None:
            continue
        replaced = t.trace(model, w, ctx)
        if replaced is not None:
            model = replaced
    return model

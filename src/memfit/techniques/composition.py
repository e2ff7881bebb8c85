"""What a `Workload` means in technique configs: `configs_from_workload` (what `apply_` applies
for an estimate or a plan) and `prepare_model` (what the tracer does to the model before
tracing: tie, freeze, LoRA, as `apply_` will).
"""

from __future__ import annotations

import torch

from memfit.errors import BadInputError
from memfit.models.sources import ModelSpec
from memfit.techniques.accumulation import AccumulationConfig
from memfit.techniques.checkpointing import CheckpointConfig
from memfit.techniques.chunked_loss import ChunkedLossConfig
from memfit.techniques.distillation.config import DistillationConfig, config_from_workload
from memfit.techniques.freeze import FreezeConfig, freeze
from memfit.techniques.lora import add_lora_for_trace
from memfit.techniques.offload.activations import ActivationOffloadConfig
from memfit.techniques.offload.embedding_on_cpu import EmbeddingOnCpuConfig
from memfit.techniques.optimizer import DEFAULT_LR, OptimizerConfig
from memfit.techniques.optimizer_in_backward import OptimizerInBackwardConfig
from memfit.techniques.parallel.data_parallel import DDPConfig
from memfit.techniques.parallel.fsdp import FSDPConfig, fsdp_config_of
from memfit.techniques.precision import PrecisionConfig
from memfit.techniques.quantize.config import QuantizeConfig
from memfit.techniques.tie_embeddings import TieEmbeddingsConfig, tie_embeddings
from memfit.workload import LoraConfig, Workload

TechniqueConfig = (
    CheckpointConfig
    | PrecisionConfig
    | AccumulationConfig
    | OptimizerConfig
    | OptimizerInBackwardConfig
    | FreezeConfig
    | EmbeddingOnCpuConfig
    | TieEmbeddingsConfig
    | FSDPConfig
    | DDPConfig
    | LoraConfig
    | QuantizeConfig
    | ActivationOffloadConfig
    | ChunkedLossConfig
    | DistillationConfig
)


def configs_from_workload(w: Workload, *, lr: float = DEFAULT_LR) -> list[TechniqueConfig]:
    """The technique configs that turn a model into the step `w` describes, in the order
    reports list them (`apply_` runs them in its own order)."""
    if w.offload_optimizer and (not w.training or w.optimizer == "none"):
        raise BadInputError("offload_optimizer needs a training workload with an optimizer.")
    out: list[TechniqueConfig] = []
    if w.grad_accum > 1:
        out.append(AccumulationConfig(steps=w.grad_accum))
    if w.checkpointing != "off":
        out.append(CheckpointConfig(first=w.checkpoint_first))
    if w.quantize is not None:
        out.append(QuantizeConfig(method=w.quantize, prepare_kbit=w.prepare_kbit))
    if w.lora is not None:
        out.append(w.lora)
    if w.freeze:
        out.append(FreezeConfig(prefixes=w.freeze))
    if w.training and w.optimizer != "none":
        out.append(OptimizerConfig(name=w.optimizer, lr=lr, offload=w.offload_optimizer))
        if w.optimizer_in_backward:  # steps the OptimizerConfig above, inside backward
            out.append(OptimizerInBackwardConfig())
    if w.embedding_on_cpu:
        out.append(EmbeddingOnCpuConfig())
    if w.tie_embeddings:
        out.append(TieEmbeddingsConfig())
    if w.fsdp:  # FSDP2's CPU offload shards over one GPU too
        out.append(fsdp_config_of(w))
    if w.ddp:
        out.append(DDPConfig(world_size=w.gpus))
    if w.offload_activations:
        out.append(ActivationOffloadConfig(variant=str(w.offload_activations)))
    if w.chunked_loss is not None:
        out.append(ChunkedLossConfig(chunks=w.chunked_loss))
    distill = config_from_workload(w)
    if distill is not None:
        out.append(distill)
    if w.precision != "fp32":
        out.append(PrecisionConfig(precision=w.precision))
    return out


def labels(w: Workload) -> list[str]:
    """The memory techniques `w` uses, as reports name them (each config's `label`; the
    precision and the optimizer are reported on their own)."""
    return [c.label for c in configs_from_workload(w) if c.label]


def prepare_model(model: torch.nn.Module, w: Workload, spec: ModelSpec) -> torch.nn.Module:
    """Freeze what the workload freezes and add LoRA adapters (through peft)."""
    if w.tie_embeddings:  # first, as apply_ does: freezing a tied name freezes the matrix
        tie_embeddings(model, spec.name)
    if w.freeze:
        freeze(model, w.freeze, spec.name)
    if w.lora is not None:
        model = add_lora_for_trace(model, w.lora, spec.name)
    return model

"""What a `Workload` means in technique configs: `configs_from_workload` (what `apply_` applies
for an estimate or a plan) and `prepare_model` (what the tracer does to the model before
tracing: tie, freeze, LoRA, as `apply_` will).
"""

from __future__ import annotations

import torch

from memfit.models.sources import ModelSpec
from memfit.techniques.accumulation import AccumulationConfig
from memfit.techniques.checkpointing import CheckpointConfig
from memfit.techniques.chunked_loss import ChunkedLossConfig
from memfit.techniques.distillation.config import DistillationConfig
from memfit.techniques.freeze import FreezeConfig
from memfit.techniques.offload.activations import ActivationOffloadConfig
from memfit.techniques.offload.embedding_on_cpu import EmbeddingOnCpuConfig
from memfit.techniques.optimizer import DEFAULT_LR, OptimizerConfig
from memfit.techniques.optimizer_in_backward import OptimizerInBackwardConfig
from memfit.techniques.parallel.data_parallel import DDPConfig
from memfit.techniques.parallel.fsdp import FSDPConfig
from memfit.techniques.precision import PrecisionConfig
from memfit.techniques.quantize.config import QuantizeConfig
from memfit.techniques.table import TraceContext, configs_of, prepare_for_trace
from memfit.techniques.tie_embeddings import TieEmbeddingsConfig
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
    reports list them (`apply_` runs them in its own order): the technique table's rows."""
    return configs_of(w, lr=lr)


def labels(w: Workload) -> list[str]:
    """The memory techniques `w` uses, as reports name them (each config's `label`; the
    precision and the optimizer are reported on their own)."""
    return [c.label for c in configs_from_workload(w) if c.label]


def prepare_model(model: torch.nn.Module, w: Workload, spec: ModelSpec) -> torch.nn.Module:
    """Tie, freeze and add LoRA adapters (through peft) as the workload says: the technique
    table's "model" stage, for a model memfit does not trace (benchmarks/gpu_validation.py's
    real step builds its model this way)."""
    return prepare_for_trace(model, w, TraceContext(spec=spec, fake_mode=None), "model")

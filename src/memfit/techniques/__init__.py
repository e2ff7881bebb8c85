"""Memory techniques: one module per technique holding its frozen config, the handler that
applies it to a real model (registered beside it, see `registry`), and its trace-time
preparation; `apply_` dispatches configs to handlers and returns a `TrainSetup`; weights I/O.

Example:
    >>> import memfit
    >>> from memfit.techniques import CheckpointConfig, PrecisionConfig, OptimizerConfig
    >>> setup = memfit.apply_(model, [CheckpointConfig(), PrecisionConfig(precision="bf16-mixed"),
    ...                               OptimizerConfig(name="adamw", lr=1e-4)])

May import: `memfit.models`, `memfit.cuda` and the top level.
"""

from memfit.techniques.accumulation import AccumulationConfig
from memfit.techniques.checkpointing import CheckpointConfig
from memfit.techniques.chunked_loss import ChunkedLossConfig
from memfit.techniques.composition import TechniqueConfig, configs_from_workload, labels
from memfit.techniques.distillation.config import DistillationConfig
from memfit.techniques.freeze import FreezeConfig
from memfit.techniques.offload.activations import ActivationOffloadConfig
from memfit.techniques.offload.embedding_on_cpu import EmbeddingOnCpuConfig
from memfit.techniques.optimizer import OptimizerConfig
from memfit.techniques.optimizer_in_backward import OptimizerInBackwardConfig
from memfit.techniques.parallel.data_parallel import DDPConfig
from memfit.techniques.parallel.fsdp import FSDPConfig
from memfit.techniques.precision import PrecisionConfig
from memfit.techniques.quantize.config import QuantizeConfig
from memfit.techniques.tie_embeddings import TieEmbeddingsConfig
from memfit.workload import LoraConfig

__all__ = [
    "AccumulationConfig",
    "ActivationOffloadConfig",
    "CheckpointConfig",
    "ChunkedLossConfig",
    "DDPConfig",
    "DistillationConfig",
    "EmbeddingOnCpuConfig",
    "FSDPConfig",
    "FreezeConfig",
    "LoraConfig",
    "OptimizerConfig",
    "OptimizerInBackwardConfig",
    "PrecisionConfig",
    "QuantizeConfig",
    "TechniqueConfig",
    "TieEmbeddingsConfig",
    "configs_from_workload",
    "labels",
]
